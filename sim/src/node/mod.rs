//! The software of one node's turmoil host: an executor of core's node machine
//! ([`loco_core::node::machine::Node`]), which decides everything a member of the mesh does.
//!
//! The host is a loop over three sources: frames (and unreachable peers) from its
//! [`SimTransport`], its next deadline (the machine's timers, the end of its inner steps), and
//! its control block (hang, resume, leave). It feeds each to the machine, then carries out the
//! machine's effects and sends its transmits. What stays here is the simulator's own: how long
//! the inner steps take and what they do ([`numerics`]), the hang and the crashes armed for a
//! phase (fault injection), the recorder, and the restart of an evicted node.
//!
//! A hung node keeps its member's heartbeats going and nothing else ([`Process::suspend`]):
//! its compute stops, its rings neither send nor receive. The lifecycle (a new membership after
//! an eviction or a lost coordinator, the end of the process, the stop rows) is core's
//! [`Process`], as in every executor.

use crate::clock;
use crate::ctx::RunCtx;
use crate::net::SimTransport;
use crate::numerics::{self, Synthetic};
use loco_core::mesh::LeaveReason;
use loco_core::node::config::ExecutorSide;
use loco_core::node::machine::{
    Check, Effect, NodeConfig, NodeEvent, Numerics, OuterJob, OuterKind, PreparedState,
    VerifyResult,
};
use loco_core::node::process::{Output, Process, Stopped, fault_phase};
use loco_core::scenario::FaultPhase;
use loco_core::transport::{Frame, Header, TransportError};
use loco_core::{NodeId, Time};
use std::rc::Rc;
use std::time::Duration;

/// One input of a node host.
pub(crate) enum Event {
    /// A frame, or the news that a peer cannot be reached.
    Net(Result<(NodeId, Frame), TransportError>),
    /// Its next deadline ([`Node::next_wake`]) came.
    Timer,
    /// The driver changed its control block (hang, resume, leave).
    Control,
    /// The event executor's model of the all-reduce `(epoch, op)` says it is done here.
    Modelled {
        /// Its epoch.
        epoch: loco_core::Epoch,
        /// Its op.
        op: u64,
    },
}

/// A network that takes a host's frames without turmoil (the event executor's), named by what
/// the host needs of it, so that the host does not depend on the executor.
pub(crate) trait Wire {
    /// Queues `frame` for `to`; its flow gets no bandwidth before `ready`.
    fn enqueue_ready(&mut self, to: NodeId, frame: Frame, ready: Time);
    /// This host's member started the modelled all-reduce `m`.
    fn model(&mut self, m: loco_core::node::machine::ModelledAllReduce);
}

/// Where a host's frames go: turmoil's transport, or the event executor's network.
pub(crate) enum Port {
    /// turmoil TCP plus the bandwidth model.
    Turmoil(SimTransport),
    /// The event executor's network.
    Events(Box<dyn Wire>),
}

impl Port {
    /// Queues `frame` for `to`; its flow gets no bandwidth before `ready`.
    pub(crate) fn enqueue_ready(&mut self, to: NodeId, frame: Frame, ready: Time) {
        match self {
            Port::Turmoil(t) => t.enqueue_ready(to, frame, ready),
            Port::Events(e) => e.enqueue_ready(to, frame, ready),
        }
    }

    /// Queues `frame` for `to` at once.
    pub(crate) fn enqueue(&mut self, to: NodeId, frame: Frame) {
        self.enqueue_ready(to, frame, Time::ZERO);
    }

    /// The next frame from turmoil (never, on the event executor: it hands frames in).
    pub(crate) async fn next(&mut self) -> Result<(NodeId, Frame), TransportError> {
        match self {
            Port::Turmoil(t) => t.next().await,
            Port::Events(_) => std::future::pending().await,
        }
    }
}

/// Work of the node's under way: the inner steps, or an O(model) or O(state) job whose time is
/// charged (the outer step's, a state's preparation or verification).
struct Computing {
    /// The outer step it belongs to (for recovery work: the node's when it began).
    step: u64,
    remaining: Duration,
    /// When the current stint of computing began (None while hung).
    since: Option<Time>,
}

impl Computing {
    /// When it is done, unless paused (hung).
    fn due(&self) -> Option<Time> {
        self.since.map(|t| t + self.remaining)
    }

    /// Whether it is done at `now`.
    fn done(&self, now: Time) -> bool {
        self.due().is_some_and(|t| now >= t)
    }
}

/// One node's host software. See the module documentation.
pub(crate) struct Node {
    run: Rc<RunCtx>,
    id: NodeId,
    net: Port,
    process: Process,
    computing: Option<Computing>,
    /// A commit's O(model) work under way (`[sim] outer_cost` per parameter): the job, already
    /// run, goes back to the machine when its time is up.
    outer: Option<(OuterJob, Computing)>,
    /// States prepared for joiners (`[sim] state_prepare_cost` per byte), in order: each goes
    /// back to the machine, which sends its pieces, when its time is up.
    preparing: Vec<(PreparedState, Computing)>,
    /// A state verified (`[sim] state_receive_cost` per byte from the fetch's start): the result
    /// goes back to the machine when its time is up.
    verifying: Option<(VerifyResult, Computing)>,
    /// When this node's fetch of a state began (its `RecoveryStart`; a reassignment keeps it).
    fetch_start: Option<Time>,
    /// The synthetic model, with real numerics.
    model: Option<Synthetic>,
    /// When the codec work (`[sim] encode_cost`, `decode_cost`) on the collective frames sent so
    /// far is done: the node does one such piece of work at a time, as a real worker's event
    /// loop does, and each frame's flow gets no bandwidth before its work is done.
    cpu_free: Time,
}

impl Node {
    /// Starts the node's process (binds its endpoint). Called by the host factory.
    pub(crate) async fn start(run: Rc<RunCtx>, id: NodeId) -> std::io::Result<Node> {
        let net = SimTransport::bind(id, run.net.clone()).await?;
        Node::with_port(run, id, Port::Turmoil(net))
    }

    /// A node's process whose frames go through `net`.
    pub(crate) fn with_port(run: Rc<RunCtx>, id: NodeId, net: Port) -> std::io::Result<Node> {
        let inc = run.node(id).incarnation.get();
        let cfg = node_config(&run, id, run.real.as_ref().map(|r| r.initial.clone()))?;
        let (process, model) = match Process::new(cfg, inc) {
            Ok(p) => {
                let model =
                    run.real.as_ref().map(|r| Synthetic::new(run.seed, id.0, r.initial.clone()));
                (p, model)
            }
            Err(e) => {
                tracing::warn!(target: "loco_sim", "{id}: no real numerics: {e}");
                let p = Process::new(node_config(&run, id, None)?, inc)
                    .map_err(std::io::Error::other)?;
                (p, None)
            }
        };
        Ok(Node {
            run,
            id,
            net,
            process,
            computing: None,
            outer: None,
            preparing: Vec::new(),
            verifying: None,
            fetch_start: None,
            model,
            cpu_free: Time::ZERO,
        })
    }

    /// Everything under way whose time is charged: a hang pauses it all.
    fn busy(&mut self) -> impl Iterator<Item = &mut Computing> {
        self.computing
            .iter_mut()
            .chain(self.outer.iter_mut().map(|(_, c)| c))
            .chain(self.preparing.iter_mut().map(|(_, c)| c))
            .chain(self.verifying.iter_mut().map(|(_, c)| c))
    }

    /// Drops the work under way (the member stopped).
    fn drop_work(&mut self) {
        self.computing = None;
        self.outer = None;
        self.preparing.clear();
        self.verifying = None;
        self.fetch_start = None;
    }

    /// Deferred work of `cost` begun at `now`: running unless the node is hung.
    fn deferred(&self, now: Time, cost: Duration) -> Computing {
        let step = self.process.node().outer_step().unwrap_or(0);
        Computing { step, remaining: cost, since: (!self.hung()).then_some(now) }
    }

    fn now() -> Time {
        clock::now()
    }

    /// Whether the node is hung now.
    pub(crate) fn hung(&self) -> bool {
        self.run.node(self.id).hung.get()
    }

    /// An armed crash for `phase` strikes: the node freezes (it sends and computes nothing more)
    /// and the driver kills it at its next tick.
    fn strike(&mut self, phase: FaultPhase, outer_step: Option<u64>) {
        let ctl = self.run.node(self.id);
        let due = |(p, from): (FaultPhase, u64)| p == phase && outer_step.unwrap_or(0) >= from;
        if !ctl.armed.get().is_some_and(due) || ctl.struck.get() {
            return;
        }
        ctl.struck.set(true);
        ctl.hung.set(true);
        for c in self.busy() {
            c.since = None;
        }
        self.process.suspend(Self::now());
    }

    /// Runs the process until it ends.
    pub(crate) async fn run(mut self) -> turmoil::Result {
        self.begin();
        while !self.drain() {
            let ev = self.next_event().await;
            self.input(ev);
        }
        self.run.net.set_down(self.id, true);
        Ok(())
    }

    /// Starts the process's first membership.
    pub(crate) fn begin(&mut self) {
        if let Err(e) = self.process.start(Self::now()) {
            tracing::warn!(target: "loco_sim", "{}: join refused: {e}", self.id);
        }
    }

    /// Feeds one input to the machine, and the completions it makes due; [`drain`](Self::drain)
    /// carries out what follows.
    pub(crate) fn input(&mut self, ev: Event) {
        let now = match ev {
            Event::Control => {
                self.on_control();
                return;
            }
            Event::Timer => {
                let now = Self::now();
                self.process.handle_timeout(now);
                now
            }
            Event::Net(Ok((from, frame))) => {
                self.process.handle_frame(Self::now(), from, frame);
                return;
            }
            Event::Net(Err(TransportError::Unreachable(peer))) => {
                self.process.peer_unreachable(Self::now(), peer);
                return;
            }
            Event::Net(Err(_)) => return,
            Event::Modelled { epoch, op } => {
                self.process.allreduce_modelled(Self::now(), epoch, op);
                return;
            }
        };
        if self.computing.as_ref().is_some_and(|c| c.done(now)) {
            self.finish_compute(now);
        }
        if self.outer.as_ref().is_some_and(|(_, c)| c.done(now))
            && let Some((job, _)) = self.outer.take()
        {
            self.process.node_mut().outer_done(now, job);
        }
        // Prepared states in the order they were asked for (the same seed, the same bytes).
        let mut i = 0;
        while i < self.preparing.len() {
            if self.preparing[i].1.done(now) {
                let (p, _) = self.preparing.remove(i);
                self.process.node_mut().state_prepared(now, p);
            } else {
                i += 1;
            }
        }
        if self.verifying.as_ref().is_some_and(|(_, c)| c.done(now))
            && let Some((r, _)) = self.verifying.take()
        {
            self.process.node_mut().state_verified(now, r);
        }
    }

    /// Carries out the process's outputs until it has none; true when the process ended.
    pub(crate) fn drain(&mut self) -> bool {
        let now = Self::now();
        while let Some(out) = self.process.poll(now) {
            match out {
                Output::Effect(e) => self.effect(e),
                Output::Transmit(to, frame) => self.transmit(to, frame),
                Output::Stopped(s) => self.stopped(now, s),
                Output::Restarted { .. } => {}
                Output::Exit => return true,
            }
        }
        false
    }

    /// The membership stopped: its work is dropped, and its row written.
    fn stopped(&mut self, now: Time, s: Stopped) {
        self.run.node(self.id).member.set(false);
        self.drop_work();
        if let Some(row) = s.row {
            self.run.event(now, row.kind, Some(self.id), row.epoch, row.detail);
        }
    }

    fn transmit(&mut self, to: NodeId, frame: Frame) {
        let phase = fault_phase(&frame.header);
        self.run.frames.set(self.run.frames.get() + 1);
        let work = match &frame.header {
            Header::Collective(h) if to != self.id => {
                let codec = self.run.scenario.diloco().codec;
                let values = codec.values_in(frame.body.len());
                self.run.scenario.sim().frame_work(codec, h.phase, h.step, values)
            }
            _ => Duration::ZERO,
        };
        if work.is_zero() {
            self.net.enqueue(to, frame);
        } else {
            // The codec's CPU time: the frame leaves when the work that made it is done.
            let ready = Self::now().max(self.cpu_free) + work;
            self.cpu_free = ready;
            self.net.enqueue_ready(to, frame, ready);
        }
        if let Some(p) = phase {
            self.strike(p, self.process.node().outer_step());
        }
    }

    /// Carries out one effect.
    fn effect(&mut self, e: Effect) {
        let now = Self::now();
        match e {
            Effect::Compute { outer_step, .. } => {
                let remaining = self.compute_duration(outer_step);
                self.computing = Some(Computing { step: outer_step, remaining, since: Some(now) });
                self.strike(FaultPhase::Compute, Some(outer_step));
                if self.hung()
                    && let Some(c) = &mut self.computing
                {
                    c.since = None;
                }
            }
            Effect::SetParams(w) => {
                if let Some(m) = &mut self.model {
                    m.inner = w;
                }
            }
            Effect::Outer(job) => {
                let mut job = *job;
                // The outer step's O(model) work: a commit takes `[sim] outer_cost` per
                // parameter of the node's time (the cost measured by `loco bench outer` covers
                // the pseudo-gradient too, so that job and a skip are free). The machine holds every action but sends meanwhile, as a real worker
                // does while the job runs on a blocking thread; a hang pauses it.
                job.run();
                // In overlap modes the end of a round (merge and sync, which the next round
                // waits for) costs as much again, and the commit runs beside the inner steps.
                let overlaps = self.run.scenario.diloco().mode.overlaps();
                let full = self.run.scenario.sim().outer_time(self.run.params);
                let cost = match job.kind() {
                    OuterKind::Commit => full.mul_f64(job.cost_share()),
                    OuterKind::PseudoGradient if overlaps => full.mul_f64(job.cost_share()),
                    OuterKind::PseudoGradient | OuterKind::Skip => Duration::ZERO,
                };
                if cost.is_zero() {
                    self.process.node_mut().outer_done(now, job);
                } else {
                    let since = (!self.hung()).then_some(now);
                    let step = job.outer_step();
                    self.outer = Some((job, Computing { step, remaining: cost, since }));
                }
            }
            Effect::PrepareState(job) => {
                // The synthetic model has no inner optimiser state: the own part is empty. The
                // snapshot and digest take `[sim] state_prepare_cost` per byte of the parts
                // prepared before the first piece leaves (a hang pauses it, as the outer work).
                let p = job.prepare(None);
                let cost = self.run.scenario.sim().state_prepare_time(p.bytes());
                if cost.is_zero() {
                    self.process.node_mut().state_prepared(now, p);
                } else {
                    let c = self.deferred(now, cost);
                    self.preparing.push((p, c));
                }
            }
            Effect::VerifyState { received, params } => {
                // The joiner writes and hashes the pieces as they arrive, at
                // `[sim] state_receive_cost` per byte of the state: it holds a verified state no
                // sooner than the fetch's start plus that, a slow link hiding the cost.
                let bytes = received.bytes();
                let r = received.verify(params);
                let start = self.fetch_start.unwrap_or(now);
                let wait = (start + self.run.scenario.sim().state_receive_time(bytes)) - now;
                if wait.is_zero() {
                    self.process.node_mut().state_verified(now, r);
                } else {
                    let c = self.deferred(now, wait);
                    self.verifying = Some((r, c));
                }
            }
            Effect::Checkpoint { outer_step, .. } => {
                // Where the real backend hands a due checkpoint to its writer (the simulator
                // writes none).
                self.strike(FaultPhase::Checkpoint, Some(outer_step));
            }
            Effect::ModelledAllReduce(m) => match &mut self.net {
                Port::Events(e) => e.model(m),
                // Modelled collectives are the event executor's alone (the driver refuses
                // them on turmoil before the run starts).
                Port::Turmoil(_) => {
                    tracing::warn!(target: "loco_sim", "{}: a modelled all-reduce on turmoil", self.id);
                }
            },
            Effect::Row(row) => self.run.rec.borrow_mut().row(row),
            Effect::Event(ev) => self.event(now, ev),
            Effect::Check(c) => self.check(c),
            // The process carries out the stop ([`Output::Stopped`]).
            Effect::Stop { .. } => {}
        }
    }

    fn event(&mut self, now: Time, ev: NodeEvent) {
        match &ev {
            NodeEvent::Admitted { .. } => self.run.node(self.id).member.set(true),
            // The node machine writes it once per silence.
            NodeEvent::CoordinatorLost { .. } => {
                self.run.rec.borrow_mut().coordinator_lost(self.id)
            }
            // The start of a fetch (not a reassignment of its senders) starts the joiner's
            // clock for `[sim] state_receive_cost`.
            NodeEvent::RecoveryStart { kept_bytes: None, .. } => self.fetch_start = Some(now),
            NodeEvent::RecoveryDone { .. } => self.fetch_start = None,
            NodeEvent::RecoveryStart { .. } | NodeEvent::Withheld { .. } => {}
        }
        let detail = {
            let rec = self.run.rec.borrow();
            ev.detail(&|n| rec.name(n))
        };
        self.run.event(now, ev.kind(), Some(self.id), ev.epoch(), detail);
    }

    fn check(&mut self, c: Check) {
        self.run.rec.borrow_mut().check(self.id, &c);
    }

    /// When the node next has something to do without an input: the machine's timer or the
    /// end of work under way (`Time::MAX` for never).
    pub(crate) fn next_wake(&mut self) -> Time {
        let mut wake = self.process.poll_timeout().unwrap_or(Time::MAX);
        for c in self.busy() {
            if let Some(due) = c.due() {
                wake = wake.min(due);
            }
        }
        wake
    }

    async fn next_event(&mut self) -> Event {
        let wake = self.next_wake();
        let ctl = self.run.clone();
        let wake_ctl = &ctl.node(self.id).wake;
        tokio::select! {
            biased;
            () = wake_ctl.notified() => Event::Control,
            r = self.net.next() => Event::Net(r),
            () = clock::sleep_until(wake) => Event::Timer,
        }
    }

    /// The driver changed the control block: leave, hang or resume.
    fn on_control(&mut self) {
        let now = Self::now();
        let ctl = self.run.node(self.id);
        if ctl.leave.get() {
            self.process.leave(now, LeaveReason::Graceful);
        }
        let hung = ctl.hung.get();
        for c in self.busy() {
            match (hung, c.since) {
                (true, Some(since)) => {
                    c.remaining = c.remaining.saturating_sub(now - since);
                    c.since = None;
                }
                (false, None) => c.since = Some(now),
                _ => {}
            }
        }
        if hung {
            self.process.suspend(now);
        } else {
            self.process.resume(now);
        }
    }

    fn finish_compute(&mut self, now: Time) {
        let Some(c) = self.computing.take() else { return };
        let h = self.run.scenario.diloco().round_steps();
        let (inner, loss) = match &mut self.model {
            Some(m) => {
                let loss = m.inner_steps(self.process.base_incarnation(), c.step, h);
                (Some(m.inner.clone()), Some(loss))
            }
            None => (None, None),
        };
        self.process.node_mut().computed(now, c.step, inner, loss);
    }

    fn compute_duration(&self, step: u64) -> Duration {
        let spec = &self.run.node(self.id).spec;
        numerics::StepDraw {
            seed: self.run.seed,
            node: self.id.0,
            incarnation: self.process.incarnation(),
            outer_step: step,
            inner_steps: self.run.scenario.diloco().round_steps(),
            step_time: spec.step_time,
            jitter: spec.step_jitter,
        }
        .total()
    }
}

/// The machine's settings for node `id` of the run (`initial`: real numerics).
fn node_config(run: &RunCtx, id: NodeId, initial: Option<Vec<f32>>) -> std::io::Result<NodeConfig> {
    let numerics = match initial {
        Some(initial) => Numerics::Real { initial },
        None => Numerics::Virtual { params: run.params },
    };
    let side = executor_side(&run.scenario, numerics, run.modelled_collectives);
    NodeConfig::for_node(&run.scenario, id, side).map_err(std::io::Error::other)
}

/// What a simulated host tells [`NodeConfig::for_node`] besides the scenario: the values it
/// trains, and whether the event executor models its all-reduces.
pub fn executor_side(
    s: &loco_core::scenario::Scenario,
    numerics: Numerics,
    modelled_collectives: bool,
) -> ExecutorSide {
    ExecutorSide {
        numerics,
        // The synthetic model and virtual lengths have no layers: fragments cut anywhere.
        layers: Vec::new(),
        // The synthetic model has no inner optimiser state.
        own_max: 0,
        offset_s: 0.0,
        checkpoints: s.real().checkpoint_dir.is_some(),
        virtual_padding: true,
        modelled_collectives,
    }
}
