//! The software of one node's turmoil host: the mesh [`Member`], simulated compute, the ring
//! all-reduces of each outer step (one per GPU shard), DiLoCo's outer step with real numerics,
//! live recovery, and the node's rows of `outer_steps.csv`.
//!
//! The node is an event loop over three sources: frames (and unreachable peers) from its
//! [`SimTransport`], its next deadline (the member's timers, the end of its inner steps), and its
//! control block (hang, resume, leave). After every event it drains the member's actions and
//! executes them. While an all-reduce runs, [`Node::reduce`] owns the ring machines (they borrow
//! the buffer being reduced) and runs the same loop.
//!
//! A hung node keeps its member's heartbeats going and nothing else: its compute stops, its
//! rings neither send nor receive, and every other action waits until it resumes. An evicted node
//! (heartbeat timeout, missed barrier) or cut off from the coordinator (its member stops with
//! `CoordinatorLost`) starts a new member with a new incarnation after a heartbeat interval and
//! joins again, as a supervisor would restart it; a node that left or was shut down stops.

use crate::clock;
use crate::ctx::RunCtx;
use crate::net::{NetCounters, SimTransport};
use crate::numerics::{self, Synthetic};
use loco_core::diloco::OuterState;
use loco_core::mesh::{
    AllReduceStart, LeaveReason, Member, MemberAction, StopReason, padded_frame,
};
use loco_core::metrics::EventKind;
use loco_core::node::acct::{RowIdentity, Span, StepAcct};
use loco_core::node::digest::weights_digest;
use loco_core::node::rings::{Admission, Inbox, ShardRings, Values};
use loco_core::node::state::EarlyPieces;
use loco_core::transport::{Frame, Header, Phase, TransportError};
use loco_core::{Epoch, NodeId, Time};
use recovery::Fetch;
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::Duration;

mod recovery;

enum Event {
    Net(Result<(NodeId, Frame), TransportError>),
    Timer,
    Control,
}

/// What an action asks of the loop that executed it.
enum Flow {
    Continue,
    Start(AllReduceStart),
    Abort { epoch: Epoch, op: u64 },
    End(End),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    /// Evicted: join again with a new member.
    Rejoin,
    /// Stopped for good.
    Exit,
}

struct Computing {
    step: u64,
    remaining: Duration,
    /// When the current stint of computing began (None while hung).
    since: Option<Time>,
}

/// A commit's O(model) work (`[sim] outer_cost` per parameter), under way: the member keeps
/// beating, every other action waits for its end, and the row closes then.
struct OuterWork {
    hash: String,
    /// Left to do, and since when (None while hung), as in [`Computing`].
    left: Computing,
}

/// One node's host software. See the module documentation.
pub(crate) struct Node {
    run: Rc<RunCtx>,
    id: NodeId,
    gpus: u16,
    inc: u64,
    session: u64,
    net: SimTransport,
    counters: NetCounters,
    member: Member,
    deferred: VecDeque<MemberAction>,
    held_frames: VecDeque<(NodeId, Frame)>,
    /// Collective frames on their way to the rings: stale ones counted, early ones held.
    inbox: Inbox,
    computing: Option<Computing>,
    outer_work: Option<OuterWork>,
    acct: Option<StepAcct>,
    /// The node holds valid outer weights (a founding member, or the state arrived).
    synced: bool,
    /// The state arrived but the coordinator has not been told (non-blocking: at the next
    /// compute, so that the pseudo-gradient it counts starts from the right weights).
    report_sync: bool,
    /// Admitted but not yet told whether by formation (compute at once) or as a joiner.
    just_admitted: bool,
    /// The outer step whose pseudo-gradient this node holds, computed from valid weights.
    grad_step: Option<u64>,
    /// The result of the last finished all-reduce, awaiting its commit.
    result: Option<(Epoch, u64, Vec<f32>)>,
    fetch: Option<Fetch>,
    /// State pieces that arrived before the `FetchState` they belong to.
    early: EarlyPieces,
    /// The outer state. With virtual numerics it has no parameters and only counts the outer
    /// steps applied (the `outer_step` of the state this node sends).
    outer: OuterState,
    /// The synthetic model, with real numerics.
    model: Option<Synthetic>,
}

impl Node {
    /// Starts the node's process (binds its endpoint). Called by the host factory.
    pub(crate) async fn start(run: Rc<RunCtx>, id: NodeId) -> std::io::Result<Node> {
        let ctl = run.node(id);
        let inc = ctl.incarnation.get();
        let gpus = u16::try_from(ctl.spec.gpus.max(1)).unwrap_or(u16::MAX);
        let net = SimTransport::bind(id, run.net.clone()).await?;
        let counters = net.counters();
        let member = Member::new(id, inc << 16, run.mesh.clone(), gpus);
        let cfg = numerics::outer_config(&run.scenario);
        let real = run.real.as_ref().and_then(|r| {
            match OuterState::new(cfg, r.initial.clone(), Vec::new()) {
                Ok(outer) => Some((outer, Synthetic::new(run.seed, id.0, r.initial.clone()))),
                Err(e) => {
                    tracing::warn!(target: "loco_sim", "{id}: no real numerics: {e}");
                    None
                }
            }
        });
        let (outer, model) = match real {
            Some((outer, model)) => (outer, Some(model)),
            // No parameters: bucket 0..0 tiles them, so this cannot fail.
            None => {
                (OuterState::new(cfg, Vec::new(), Vec::new()).map_err(std::io::Error::other)?, None)
            }
        };
        Ok(Node {
            run,
            id,
            gpus,
            inc,
            session: 0,
            net,
            counters,
            member,
            deferred: VecDeque::new(),
            held_frames: VecDeque::new(),
            inbox: Inbox::default(),
            computing: None,
            outer_work: None,
            acct: None,
            synced: false,
            report_sync: false,
            just_admitted: false,
            grad_step: None,
            result: None,
            fetch: None,
            early: EarlyPieces::default(),
            outer,
            model,
        })
    }

    fn now() -> Time {
        clock::now()
    }

    fn hung(&self) -> bool {
        self.run.node(self.id).hung.get()
    }

    /// An armed crash for `phase` strikes: the node freezes (it sends and computes nothing more)
    /// and the driver kills it at its next tick.
    fn strike(&self, phase: loco_core::scenario::FaultPhase) -> bool {
        let ctl = self.run.node(self.id);
        if ctl.armed.get() != Some(phase) || ctl.struck.get() {
            return false;
        }
        ctl.struck.set(true);
        ctl.hung.set(true);
        true
    }

    /// Runs the process until it stops for good.
    pub(crate) async fn run(mut self) -> turmoil::Result {
        loop {
            let now = Self::now();
            if let Err(e) = self.member.join(now) {
                tracing::warn!(target: "loco_sim", "{}: join refused: {e}", self.id);
            }
            let end = self.session().await;
            self.run.node(self.id).member.set(false);
            if end == End::Exit || self.run.node(self.id).leave.get() {
                break;
            }
            // Evicted, or the coordinator went silent: as a supervisor would, restart the member
            // (once the node works again) after a heartbeat interval and join afresh.
            while self.hung() {
                self.run.node(self.id).wake.notified().await;
            }
            tokio::time::sleep(self.run.mesh.heartbeat_interval).await;
            self.session += 1;
            self.reset_for_rejoin();
        }
        // Let the writer tasks put the last frames (the deathrattle) on the wire.
        tokio::time::sleep(Duration::from_millis(50)).await;
        self.run.net.set_down(self.id, true);
        Ok(())
    }

    fn reset_for_rejoin(&mut self) {
        self.member =
            Member::new(self.id, (self.inc << 16) | self.session, self.run.mesh.clone(), self.gpus);
        self.deferred.clear();
        self.held_frames.clear();
        self.inbox = Inbox::default();
        self.computing = None;
        self.outer_work = None;
        self.acct = None;
        self.synced = false;
        self.report_sync = false;
        self.just_admitted = false;
        self.grad_step = None;
        self.result = None;
        self.fetch = None;
        self.early.clear();
    }

    /// One membership, from join to stop.
    async fn session(&mut self) -> End {
        loop {
            while let Some(a) = self.next_action() {
                match self.act(a) {
                    Flow::Continue => {}
                    Flow::End(e) => return e,
                    Flow::Abort { epoch, op } => {
                        if self.result.as_ref().is_some_and(|(e, o, _)| *e == epoch && *o == op) {
                            self.result = None;
                        }
                    }
                    Flow::Start(mut start) => loop {
                        match self.reduce(start).await {
                            Flow::Start(next) => start = next,
                            Flow::End(e) => return e,
                            Flow::Continue | Flow::Abort { .. } => break,
                        }
                    },
                }
            }
            let ev = self.next_event().await;
            self.on_event(ev);
        }
    }

    /// The next action to execute: deferred ones first; while hung or busy with a commit's
    /// outer work only sends go out.
    fn next_action(&mut self) -> Option<MemberAction> {
        if self.hung() || self.outer_work.is_some() {
            while let Some(a) = self.member.poll_action() {
                match a {
                    MemberAction::Send { to, msg, padding } => self.send_mesh(to, msg, padding),
                    other => self.deferred.push_back(other),
                }
            }
            return None;
        }
        self.deferred.pop_front().or_else(|| self.member.poll_action())
    }

    fn send_mesh(&mut self, to: NodeId, msg: loco_core::mesh::MeshMsg, padding: u64) {
        self.run.frames.set(self.run.frames.get() + 1);
        self.net.enqueue(to, padded_frame(msg, padding, true));
    }

    async fn next_event(&mut self) -> Event {
        let mut wake = self.member.poll_timeout().unwrap_or(Time::MAX);
        let busy =
            self.computing.as_ref().into_iter().chain(self.outer_work.as_ref().map(|w| &w.left));
        for c in busy {
            if let Computing { remaining, since: Some(since), .. } = c {
                wake = wake.min(*since + *remaining);
            }
        }
        let ctl = self.run.clone();
        let wake_ctl = &ctl.node(self.id).wake;
        tokio::select! {
            biased;
            () = wake_ctl.notified() => Event::Control,
            r = self.net.next() => Event::Net(r),
            () = clock::sleep_until(wake) => Event::Timer,
        }
    }

    /// Handles an event outside an all-reduce.
    fn on_event(&mut self, ev: Event) {
        match ev {
            Event::Control => self.on_control(),
            Event::Timer => self.on_timer(),
            Event::Net(Ok((from, frame))) => match frame.header {
                Header::Mesh(msg) => self.member.handle_message(Self::now(), from, msg),
                Header::State(h) => self.on_state_part(from, h, frame.body),
                Header::Collective(h) => {
                    let frame = Frame { header: Header::Collective(h), body: frame.body };
                    if self.hung() {
                        self.held_frames.push_back((from, frame));
                    } else if let Admission::Stale =
                        self.inbox.admit(self.member.epoch(), None, from, frame)
                    {
                        self.run.rec.borrow_mut().stale(1);
                    }
                    // A frame of a collective not started here yet is held for it; one of a
                    // finished or aborted collective is dropped when the next one starts.
                }
            },
            Event::Net(Err(_)) => {}
        }
    }

    fn on_control(&mut self) {
        let now = Self::now();
        let ctl = self.run.node(self.id);
        if ctl.leave.get() && !self.member.is_stopped() {
            self.member.leave(now, LeaveReason::Graceful);
        }
        let hung = ctl.hung.get();
        if let Some(c) = &mut self.computing {
            pause_or_resume(c, hung, now, self.acct.as_mut(), Span::Compute);
        }
        if let Some(w) = &mut self.outer_work {
            pause_or_resume(&mut w.left, hung, now, self.acct.as_mut(), Span::Outer);
        }
    }

    fn on_timer(&mut self) {
        let now = Self::now();
        self.member.handle_timeout(now);
        let finished = match &self.computing {
            Some(Computing { remaining, since: Some(since), .. }) => now >= *since + *remaining,
            _ => false,
        };
        if finished {
            self.finish_compute(now);
        }
        if self
            .outer_work
            .as_ref()
            .is_some_and(|w| w.left.since.is_some_and(|s| now >= s + w.left.remaining))
        {
            self.finish_outer_work(now);
        }
    }

    fn finish_compute(&mut self, now: Time) {
        let Some(c) = self.computing.take() else { return };
        let h = self.run.scenario.diloco().inner_steps;
        let mut loss = None;
        if let Some(m) = &mut self.model {
            loss = Some(m.inner_steps(self.inc, c.step, h));
            if self.grad_step == Some(c.step) {
                let _ = self.outer.compute_pseudo_gradient(&m.inner);
            } else {
                self.outer.pseudo_gradient_mut().fill(0.0);
            }
        }
        if let Some(a) = &mut self.acct {
            a.trained(h.saturating_mul(self.run.scenario.diloco().batch_tokens), loss);
            a.enter(Span::Barrier, now);
        }
        if let Err(e) = self.member.barrier_arrive(now, c.step) {
            tracing::debug!(target: "loco_sim", "{}: barrier refused: {e}", self.id);
        }
    }

    fn compute_duration(&self, step: u64) -> Duration {
        let spec = &self.run.node(self.id).spec;
        numerics::outer_step_compute(
            self.run.seed,
            self.id.0,
            (self.inc << 16) | self.session,
            step,
            self.run.scenario.diloco().inner_steps,
            spec.step_time,
            spec.step_jitter,
        )
    }

    fn open_row(&mut self, step: u64, now: Time) {
        if self.acct.as_ref().is_some_and(|a| a.step() == step) {
            return;
        }
        let epoch = self.member.epoch().unwrap_or_default();
        self.acct = Some(StepAcct::open(step, now, epoch, self.counters.bytes_sent.get()));
    }

    fn close_row(&mut self, step: u64, now: Time, hash: String) {
        let Some(a) = self.acct.take() else { return };
        if a.step() != step {
            return;
        }
        let who = RowIdentity {
            node: self.run.node(self.id).spec.name.clone(),
            node_id: self.id.0,
            offset_s: 0.0,
        };
        let row = a.close(now, self.counters.bytes_sent.get(), &who, hash);
        self.run.rec.borrow_mut().row(row);
    }

    /// Executes one member action outside an all-reduce.
    fn act(&mut self, a: MemberAction) -> Flow {
        let now = Self::now();
        match a {
            MemberAction::Send { to, msg, padding } => self.send_mesh(to, msg, padding),
            MemberAction::Admitted { epoch, outer_step } => {
                let ctl = self.run.node(self.id);
                ctl.member.set(true);
                self.run.rec.borrow_mut().coordinator_found(self.id);
                let kind = loco_core::node::events::admission_kind(epoch);
                self.run.event(
                    now,
                    kind,
                    Some(self.id),
                    Some(epoch),
                    format!("admitted at outer step {outer_step}"),
                );
                self.just_admitted = true;
                self.open_row(outer_step, now);
            }
            MemberAction::EpochChanged { epoch, members } => {
                self.run.rec.borrow_mut().member_view(self.id, epoch, &members, "view");
            }
            MemberAction::Compute { epoch, outer_step } => {
                self.start_compute(epoch, outer_step, now)
            }
            MemberAction::FetchState { epoch, senders } => {
                self.just_admitted = false;
                self.fetch_state(epoch, senders);
            }
            MemberAction::SendState { epoch, to, senders } => self.send_state(epoch, to, &senders),
            MemberAction::StartAllReduce(s) => {
                self.just_admitted = false;
                return Flow::Start(s);
            }
            MemberAction::AbortAllReduce { epoch, op } => return Flow::Abort { epoch, op },
            MemberAction::Commit { epoch, outer_step } => self.commit(epoch, outer_step, now),
            MemberAction::SkipStep { epoch, outer_step, attempts } => {
                self.result = None;
                self.outer.skip_outer_step();
                if let Some(m) = &mut self.model {
                    m.inner = self.outer.outer().to_vec();
                }
                match &mut self.fetch {
                    Some(f) => f.log(outer_step, None),
                    None => self.early.clear(),
                }
                let hash = self.hash();
                if let Some(a) = &mut self.acct {
                    a.set_epoch(epoch);
                    a.set_retries(attempts.saturating_sub(1));
                }
                self.close_row(outer_step, now, hash);
            }
            MemberAction::Stop(reason) => return Flow::End(self.on_stop(reason, now)),
        }
        Flow::Continue
    }

    fn on_stop(&mut self, reason: StopReason, now: Time) -> End {
        self.computing = None;
        match reason {
            StopReason::Evicted(_) => End::Rejoin,
            StopReason::CoordinatorLost { .. } => {
                // Logged once per loss: the supervisor restarts the node, which keeps trying to
                // join (a partition heals; a dead coordinator never answers).
                if self.run.rec.borrow_mut().coordinator_lost(self.id) {
                    self.run.event(
                        now,
                        EventKind::CoordinatorLost,
                        Some(self.id),
                        self.member.epoch(),
                        reason.to_string(),
                    );
                }
                End::Rejoin
            }
            StopReason::Left(_) | StopReason::Shutdown | StopReason::NoSyncedMember { .. } => {
                End::Exit
            }
        }
    }

    fn start_compute(&mut self, epoch: Epoch, step: u64, now: Time) {
        if self.just_admitted {
            // Admitted by the formation of a mesh: every founding member starts from the same
            // initial weights.
            self.just_admitted = false;
            self.synced = true;
        }
        if self.report_sync {
            self.report_sync = false;
            if let Err(e) = self.member.report_sync_done(now) {
                tracing::debug!(target: "loco_sim", "{}: sync report refused: {e}", self.id);
            }
        }
        self.grad_step = self.synced.then_some(step);
        if let Some(m) = &mut self.model {
            m.inner = self.outer.outer().to_vec();
        }
        self.open_row(step, now);
        let remaining = self.compute_duration(step);
        self.strike(loco_core::scenario::FaultPhase::Compute);
        let since = (!self.hung()).then_some(now);
        if let Some(a) = &mut self.acct {
            a.set_epoch(epoch);
            if since.is_some() {
                a.enter(Span::Compute, now);
            }
        }
        self.computing = Some(Computing { step, remaining, since });
    }

    fn hash(&self) -> String {
        match &self.model {
            Some(_) if self.synced => weights_digest(self.outer.outer()),
            _ => String::new(),
        }
    }

    fn commit(&mut self, epoch: Epoch, step: u64, now: Time) {
        let result = self.result.take();
        let ok = result.as_ref().is_some_and(|(e, _, _)| *e == epoch);
        if !ok {
            let msg = format!(
                "{} was told to commit outer step {step} of epoch {epoch} without a finished all-reduce",
                self.run.rec.borrow().name(self.id)
            );
            self.run.rec.borrow_mut().violation(msg);
        }
        // With virtual numerics the result and the outer state are empty: the step is counted.
        let avg = result.map(|(_, _, avg)| avg).filter(|avg| avg.len() == self.outer.len());
        match &avg {
            Some(avg) => {
                self.outer.pseudo_gradient_mut().copy_from_slice(avg);
                self.outer.apply_outer_step();
            }
            // A violation (recorded above): the count of steps stays right.
            None => self.outer.skip_outer_step(),
        }
        if let Some(m) = &mut self.model {
            m.inner = self.outer.outer().to_vec();
        }
        match &mut self.fetch {
            Some(f) => f.log(step, avg),
            None => self.early.clear(),
        }
        let hash = self.hash();
        if !hash.is_empty() {
            self.run.rec.borrow_mut().weights_after(self.id, step, &hash);
        }
        if let Some(a) = &mut self.acct {
            a.set_epoch(epoch);
        }
        // The O(model) work just done takes params x outer_cost of the node's time; the member
        // keeps answering meanwhile (a real worker does it on a blocking thread).
        let remaining = self.run.scenario.sim().outer_time(self.run.params);
        if remaining.is_zero() {
            self.close_row(step, now, hash);
            self.after_commit(step);
            return;
        }
        let since = (!self.hung()).then_some(now);
        if let (Some(a), Some(_)) = (&mut self.acct, since) {
            a.enter(Span::Outer, now);
        }
        self.outer_work = Some(OuterWork { hash, left: Computing { step, remaining, since } });
    }

    /// The commit's outer work is done: its row closes, and the actions held meanwhile go on.
    fn finish_outer_work(&mut self, now: Time) {
        let Some(w) = self.outer_work.take() else { return };
        self.close_row(w.left.step, now, w.hash);
        self.after_commit(w.left.step);
    }

    fn after_commit(&mut self, step: u64) {
        // Where the real backend hands a due checkpoint to its writer (the simulator writes none).
        let real = self.run.scenario.real();
        if real.checkpoint_dir.is_some() && (step + 1).is_multiple_of(real.checkpoint_every) {
            self.strike(loco_core::scenario::FaultPhase::Checkpoint);
        }
    }

    /// Runs one all-reduce attempt until its rings finish (the result is kept for the commit),
    /// or an action interrupts it (a retry, an abort, a stop).
    async fn reduce(&mut self, start: AllReduceStart) -> Flow {
        let now = Self::now();
        self.result = None;
        self.check_release(&start);
        if let Some(a) = &mut self.acct {
            a.enter(Span::AllReduce, now);
            let world = u32::try_from(start.ring.len()).unwrap_or(u32::MAX);
            a.ring(start.epoch, world, f64::from(start.weight.get()), start.attempt);
        }
        let values = match &self.model {
            Some(_) => Values::Real(self.outer.pseudo_gradient().to_vec()),
            None => Values::Virtual(usize::try_from(self.run.params).unwrap_or(usize::MAX)),
        };
        let codec = self.run.scenario.diloco().codec;
        let (epoch, op) = (start.epoch, start.op);
        let mut rings = match ShardRings::new(start, self.id, codec, values, self.run.segment_elems)
        {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(target: "loco_sim", "{}: cannot start the all-reduce: {}", self.id, e.source);
                let _ = self.member.report_allreduce_failed(now, epoch, op);
                return Flow::Continue;
            }
        };
        // Frames that arrived before this node's release (a neighbour started first).
        let early = self.inbox.take_for((epoch, op));
        self.held_frames.extend(early);
        match self.drive(&mut rings).await {
            Flow::Continue => {
                self.result = Some((epoch, op, rings.into_values().unwrap_or_default()));
                Flow::Continue
            }
            other => other,
        }
    }

    /// The loop of an all-reduce: returns `Continue` when the rings are done (and reported),
    /// or the interrupting flow.
    async fn drive(&mut self, rings: &mut ShardRings) -> Flow {
        let mut failed = false;
        loop {
            if !self.hung() {
                while let Some((from, f)) = self.held_frames.pop_front() {
                    if let Some(flow) = self.feed(rings, from, f, &mut failed) {
                        return flow;
                    }
                }
                while let Some((to, f)) = rings.poll_send() {
                    let phase = match &f.header {
                        Header::Collective(h) if h.phase == Phase::AllGather => {
                            loco_core::scenario::FaultPhase::AllGather
                        }
                        _ => loco_core::scenario::FaultPhase::ReduceScatter,
                    };
                    self.run.frames.set(self.run.frames.get() + 1);
                    self.net.enqueue(to, f);
                    if self.strike(phase) {
                        break;
                    }
                }
                if !self.hung() && !failed && rings.is_done() {
                    self.finish_rings(rings);
                    return Flow::Continue;
                }
            }
            while let Some(a) = self.next_action() {
                match self.act(a) {
                    Flow::Continue => {}
                    Flow::Abort { epoch, op } if (epoch, op) != rings.collective() => {}
                    other => return other,
                }
            }
            match self.next_event().await {
                Event::Net(Ok((from, frame))) if matches!(frame.header, Header::Collective(_)) => {
                    if self.hung() {
                        self.held_frames.push_back((from, frame));
                    } else if let Some(flow) = self.feed(rings, from, frame, &mut failed) {
                        return flow;
                    }
                }
                Event::Net(Err(TransportError::Unreachable(peer))) => {
                    let (left, right) = rings.neighbours();
                    if !failed && (peer == left || peer == right) && rings.start().ring.len() > 1 {
                        failed = true;
                        let (epoch, op) = rings.collective();
                        let _ = self.member.report_allreduce_failed(Self::now(), epoch, op);
                    }
                }
                ev => self.on_event(ev),
            }
        }
    }

    /// Feeds a collective frame to the rings (through the inbox: stale frames are counted, frames
    /// of a later collective held). `Some(flow)` ends the all-reduce.
    fn feed(
        &mut self,
        rings: &mut ShardRings,
        from: NodeId,
        f: Frame,
        failed: &mut bool,
    ) -> Option<Flow> {
        let running = Some(rings.collective());
        let f = match self.inbox.admit(self.member.epoch(), running, from, f) {
            Admission::Feed(f) => f,
            Admission::Stale => {
                self.run.rec.borrow_mut().stale(1);
                return None;
            }
            Admission::Held | Admission::Refused | Admission::Dropped => return None,
        };
        if let Err(e) = rings.handle_frame(from, &f) {
            let (epoch, op) = rings.collective();
            let msg = format!(
                "{}: all-reduce of {epoch} op {op} refused a frame from {}: {e}",
                self.run.rec.borrow().name(self.id),
                self.run.rec.borrow().name(from)
            );
            self.run.rec.borrow_mut().violation(msg);
            if !*failed {
                *failed = true;
                let _ = self.member.report_allreduce_failed(Self::now(), epoch, op);
            }
        }
        None
    }

    fn finish_rings(&mut self, rings: &ShardRings) {
        let s = rings.start();
        if s.ring.len() > 1 {
            let what = format!("outer step {} attempt {} ({})", s.outer_step, s.attempt, s.epoch);
            self.run.rec.borrow_mut().allreduce_weights(
                self.id,
                &what,
                rings.weight_sums(),
                f64::from(s.total_weight),
            );
        }
        if let Err(e) = self.member.report_allreduce_done(Self::now(), s.epoch, s.op) {
            tracing::debug!(target: "loco_sim", "{}: done refused: {e}", self.id);
        }
    }

    /// Checks the release against what this node knows: the ring is the epoch's membership, and
    /// its weight is 1 exactly when it holds a pseudo-gradient for the step.
    fn check_release(&mut self, s: &AllReduceStart) {
        let mut rec = self.run.rec.borrow_mut();
        rec.member_view(self.id, s.epoch, &s.ring, "release");
        let has = self.grad_step == Some(s.outer_step);
        let w = s.weight.get();
        if (w == 1.0) != has || (w != 0.0 && w != 1.0) {
            let msg = format!(
                "{} contributes weight {w} to outer step {} attempt {} but {} a pseudo-gradient for it: \
                 a contribution would be {}",
                rec.name(self.id),
                s.outer_step,
                s.attempt,
                if has { "holds" } else { "does not hold" },
                if has { "lost" } else { "counted without being computed" }
            );
            rec.violation(msg);
        }
    }
}

/// A hang pauses `c` (its time so far is spent, the row's span left) and a resume goes on with
/// it (the row back in `span`).
fn pause_or_resume(
    c: &mut Computing,
    hung: bool,
    now: Time,
    acct: Option<&mut StepAcct>,
    span: Span,
) {
    match (hung, c.since) {
        (true, Some(since)) => {
            c.remaining = c.remaining.saturating_sub(now - since);
            c.since = None;
            if let Some(a) = acct {
                a.leave(now);
            }
        }
        (false, None) => {
            c.since = Some(now);
            if let Some(a) = acct {
                a.enter(span, now);
            }
        }
        _ => {}
    }
}

fn names(run: &RunCtx, ids: &[NodeId]) -> String {
    let rec = run.rec.borrow();
    ids.iter().map(|i| rec.name(*i)).collect::<Vec<_>>().join(" ")
}
