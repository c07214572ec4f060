//! The node machine: everything one member of the mesh decides, sans-IO, in the style of
//! quinn-proto's `Connection` and raft-rs's `RawNode`: the executor owns all I/O and time, and
//! the machine only answers inputs with effects and frames to send, so that the simulator and
//! the real backend drive the very same decisions.
//!
//! A [`Node`] owns the mesh [`Member`], the `G` per-shard rings of the running all-reduce
//! ([`ShardRings`]) and the door of collective frames ([`Inbox`]), the DiLoCo [`OuterState`]
//! (real `f32` values, or lengths only with virtual numerics), live recovery (the joiner's
//! [`StateAssembly`](crate::node::state::StateAssembly) and
//! [`ReplayLog`](crate::node::state::ReplayLog), the sender's piece plan) and the step
//! accounting ([`StepAcct`]). What the node is doing is one enum, [`Work`].
//!
//! This module holds the types, the contract below and the dispatch of the inputs; the work
//! behind them lives in its submodules: `steps` (the DiLoCo step cycle: compute, outer jobs,
//! barrier, commit or skip), `rings` (driving the rings of an all-reduce attempt), `rows` (the
//! row and step accounting) and `recovery` (live recovery, on the sender's and the joiner's
//! side).
//!
//! # The contract
//!
//! The executor (the simulator's host, the real worker) owns the sockets, the clock, the compute
//! and the fault injection. It calls, with its clock's `now`:
//!
//! - inputs: [`join`](Node::join) once, then [`handle_frame`](Node::handle_frame) for every
//!   frame, [`peer_unreachable`](Node::peer_unreachable) when the transport loses a peer,
//!   [`handle_timeout`](Node::handle_timeout) at [`poll_timeout`](Node::poll_timeout) (an early
//!   call is a harmless no-op), [`leave`](Node::leave), and the completions of the effects it
//!   started: [`computed`](Node::computed), [`outer_done`](Node::outer_done),
//!   [`state_prepared`](Node::state_prepared), [`state_verified`](Node::state_verified);
//!   [`suspend`](Node::suspend) / [`resume`](Node::resume) when its application side stops and
//!   goes on while its heartbeats do not (a hung kernel);
//! - then, AFTER EVERY INPUT, drains [`poll_effect`](Node::poll_effect) (carry out, in order)
//!   and [`poll_transmit`](Node::poll_transmit) (send, in order) until both are empty, and
//!   sleeps until the next frame, completion or [`poll_timeout`](Node::poll_timeout).
//!
//! ```text
//! node.join(now)?;
//! loop {
//!     while let Some(e) = node.poll_effect() { executor carries out e (maybe completing it now) }
//!     while let Some((to, frame)) = node.poll_transmit() { executor sends it }
//!     select! { frame => node.handle_frame(now, from, frame),
//!               node.poll_timeout() => node.handle_timeout(now),
//!               inner steps done => node.computed(now, result), ... }
//! }
//! ```
//!
//! # Overlapped and streaming DiLoCo
//!
//! With [`NodeConfig::schedule`] in an overlapping [`Mode`](crate::diloco::Mode), the machine
//! starts the next round's inner steps itself as it arrives at a round's barrier (its member
//! asks for them only after the commit), so the all-reduce runs beside them; the member's later
//! `Compute` finds them under way, or done and waiting. The end of a round's inner steps waits
//! for the previous round's commit, then one [`OuterJob`] merges that round's fragment and
//! syncs this round's ([`OuterState::overlap_round`]). Rows tile the node's time: a row ends
//! where the next round's inner steps begin, and is written at its own all-reduce's commit,
//! with the weights after it; while the inner steps run, the mesh's phases do not change the
//! row's span, and when they are done and wait, the row enters the span of what they wait for.
//!
//! O(model) work never runs inside the machine's inputs on the sender's or the committer's
//! path: applying the outer step, the pseudo-gradient, encoding and verifying a state are jobs
//! ([`Effect::Outer`], [`Effect::PrepareState`], [`Effect::VerifyState`]) that the executor runs
//! where its event loop does not wait (a blocking thread) or completes after a modelled cost;
//! heartbeats and frames go on meanwhile. While the outer state is lent to a job, membership
//! actions other than sends wait.
//!
//! Size: the [`Node`] itself, its 64-line map above and the dispatch of every input; ring
//! driving, recovery, rows and effects are modules of their own.

mod effect;
mod recovery;
mod report;
mod rings;
mod rows;
mod steps;

pub use effect::{
    Effect, ModelledAllReduce, OuterJob, OuterKind, PreparedState, Snapshot, StateJob, VerifyResult,
};
pub use recovery::is_fault;
pub use report::{Check, NodeEvent, Violation};

use recovery::{Fetch, Serving};
use rows::Closing;
use steps::{Ahead, Computed, Returned};

use crate::codec::CodecKind;
use crate::digest::WeightsDigest;
use crate::diloco::{OuterConfig, OuterState, Schedule};
use crate::ids::{Epoch, NodeId};
use crate::mesh::{JoinMode, LeaveReason, Member, MemberAction, MeshConfig, MeshError, StopReason};
use crate::node::acct::{RowIdentity, Span, StepAcct};
use crate::node::rings::{Inbox, RingCounters, ShardRings};
use crate::node::state::{EarlyPieces, PartDigests, Verified};
use crate::time::Time;
use crate::transport::{Frame, Header, StateAsk, padded_frame};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

/// The values the node trains.
#[derive(Clone, Debug, PartialEq)]
pub enum Numerics {
    /// Real `f32` parameters, starting from these initial outer weights (every founding member
    /// starts from the same).
    Real {
        /// The initial weights.
        initial: Vec<f32>,
    },
    /// Lengths only: a model of `params` parameters whose values are never held.
    Virtual {
        /// Parameters of the model.
        params: u64,
    },
}

/// How a sender cuts the parts of a state it sends into pieces.
#[derive(Clone, Debug, PartialEq)]
pub enum StatePieces {
    /// [`PieceRule::Clamped`](crate::node::state::PieceRule::Clamped): pieces of a bounded size.
    Clamped,
    /// [`PieceRule::Count`](crate::node::state::PieceRule::Count) of
    /// `joiner shards x state_senders` pieces (as many parallel flows as the joiner has GPUs per
    /// sender), with real values none above [`PIECE_MAX`](crate::node::state::PIECE_MAX) bytes;
    /// joiners not listed have one shard. The one rule of [`NodeConfig::for_node`].
    PerJoinerShard {
        /// Shards (GPUs) of each node.
        shards: BTreeMap<NodeId, u16>,
    },
}

/// Everything a [`Node`] is made from.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// This node.
    pub id: NodeId,
    /// The mesh settings.
    pub mesh: MeshConfig,
    /// Local rings (GPU shards) per all-reduce.
    pub shards: u16,
    /// The all-reduce's codec.
    pub codec: CodecKind,
    /// The rings' pipelining unit in values, when set.
    pub segment: Option<usize>,
    /// The outer optimiser.
    pub outer: OuterConfig,
    /// Real values or lengths only.
    pub numerics: Numerics,
    /// Inner steps per outer step (`H`; per round in streaming mode, `H / P`).
    pub inner_steps: u64,
    /// The DiLoCo mode and the fragment each round synchronises (its fragments must tile the
    /// model's parameters).
    pub schedule: Schedule,
    /// Tokens one inner step processes (for the rows).
    pub batch_tokens: u64,
    /// Ask for a checkpoint after every this many outer steps (`None`: never).
    pub checkpoint_every: Option<u64>,
    /// How state pieces are cut.
    pub state_pieces: StatePieces,
    /// Largest own part (inner optimiser state) a joiner accepts, in bytes.
    pub own_max: u64,
    /// Who writes this node's rows.
    pub row: RowIdentity,
    /// Mesh probe padding is virtual (the simulator) or real zero bytes.
    pub virtual_padding: bool,
    /// The executor models the time of a virtual all-reduce itself (the simulator's event
    /// executor at thousands of nodes): the rings send no frame; the machine asks with
    /// [`Effect::ModelledAllReduce`] and the executor answers with
    /// [`allreduce_modelled`](Node::allreduce_modelled) (or [`peer_unreachable`](Node::peer_unreachable)).
    /// Real values always travel.
    pub modelled_collectives: bool,
}

/// What the node is doing: the one phase of the machine.
#[derive(Debug)]
pub enum Work {
    /// Not computing, reducing or holding a result: before admission, a joiner waiting for its
    /// first release, or a node whose attempt was aborted waiting for the retry.
    Idle,
    /// The executor runs the inner steps of `outer_step`.
    Computing {
        /// The step.
        outer_step: u64,
    },
    /// The outer state is lent to an [`OuterJob`]; `then` says what follows its return.
    Outer {
        /// What to do when it comes back.
        then: AfterOuter,
    },
    /// Arrived at the barrier: waiting for the release.
    Barrier,
    /// Running the rings of one attempt.
    Reducing(Box<Reducing>),
    /// The attempt finished here: its result waits for the commit.
    Reduced {
        /// The collective's epoch.
        epoch: Epoch,
        /// Its op.
        op: u64,
        /// The average (empty with virtual numerics).
        average: Option<Vec<f32>>,
        /// What this node's codec sent of its contribution (error feedback).
        sent: Option<crate::diloco::SentContribution>,
    },
    /// The member stopped.
    Stopped,
}

/// What follows an [`OuterJob`]'s return.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterOuter {
    /// Arrive at the barrier of `outer_step`.
    Barrier {
        /// The step computed.
        outer_step: u64,
    },
    /// Close the row of the committed step and ask for a due checkpoint.
    Commit {
        /// The epoch of the all-reduce.
        epoch: Epoch,
        /// The step.
        outer_step: u64,
    },
    /// Close the row of the skipped step.
    Skip {
        /// The epoch.
        epoch: Epoch,
        /// The step.
        outer_step: u64,
        /// Attempts made.
        attempts: u32,
    },
}

/// The rings of the running attempt.
pub struct Reducing {
    rings: ShardRings,
    /// This node reported the attempt failed.
    failed: bool,
    /// The executor models this attempt's time ([`NodeConfig::modelled_collectives`]).
    modelled: bool,
    /// The executor said it is done while the node was suspended.
    modelled_done: bool,
    /// The L2 norm of this node's own contribution, taken before the rings start where the
    /// guard is on and the values are real (`None` for weight 0).
    own_norm: Option<f64>,
    /// When the ring neighbour that sends to this node was last heard from (the release, a
    /// frame of this attempt from it, or the end of a hang here): past
    /// [`MeshConfig::progress_timeout`](crate::mesh::MeshConfig::progress_timeout) after it, the
    /// attempt failed here, naming that neighbour.
    heard: Time,
}

impl std::fmt::Debug for Reducing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reducing")
            .field("collective", &self.rings.collective())
            .field("failed", &self.failed)
            .finish()
    }
}

/// One node's machine. See the module documentation.
pub struct Node {
    cfg: NodeConfig,
    member: Member,
    work: Work,
    /// `None` while lent to an [`OuterJob`].
    outer: Option<OuterState>,
    real: bool,
    inbox: Inbox,
    /// Collective frames that arrived while suspended, fed at the next chance.
    held: VecDeque<(NodeId, Frame)>,
    /// Membership actions waiting (while suspended or while the outer state is lent).
    deferred: VecDeque<MemberAction>,
    acct: Option<StepAcct>,
    synced: bool,
    report_sync: bool,
    just_admitted: bool,
    grad_step: Option<u64>,
    fetch: Option<Fetch>,
    /// The transfers this node sends, by joiner (the latest assignment of each).
    serving: BTreeMap<NodeId, Serving>,
    /// Asks for pieces that came while the outer state was lent: answered on its return.
    asked: VecDeque<(NodeId, StateAsk)>,
    /// The pieces' digests of the last snapshot of the replicated part prepared (ahead, after
    /// an outer step, or for a joiner), by snapshot.
    digest_cache: Option<(effect::SnapshotKey, Arc<PartDigests>)>,
    /// The executor's inner parameters are the outer weights (no [`Effect::SetParams`] is
    /// needed before the next compute).
    params_current: bool,
    /// A copy of the pseudo-gradient made by its job: the next all-reduce's input.
    ring_input: Option<Vec<f32>>,
    /// Overlap and streaming modes: the inner steps under way (or done, waiting for the member).
    ahead: Option<Ahead>,
    /// When the all-reduce of the step under way was first released.
    released_at: Option<Time>,
    /// Overlap modes: the row of the round whose all-reduce runs.
    closing: Option<Closing>,
    /// The digest of the outer weights after the last commit (overlap rows close before it).
    last_digest: Option<WeightsDigest>,
    /// Whether the outer state is a whole replicated state (the initial weights, a resumed
    /// checkpoint, or the state of a synced member), told to the mesh when joining
    /// ([`crate::mesh::Held`]); not once admitted until synced, nor while receiving a state.
    holds: bool,
    /// The digest of the outer weights after the commit that brought them to that step.
    held_digest: Option<(u64, WeightsDigest)>,
    /// The outer steps this process knows were finished (committed or skipped) in the run, in
    /// any of its memberships.
    finished: u64,
    /// A verified state that came back while the outer state was lent: taken on its return.
    verified: Option<Verified>,
    early: EarlyPieces,
    suspended: bool,
    /// The loss of the coordinator was written (once per silence, across restarts: cleared when
    /// the coordinator is heard again).
    lost_logged: bool,
    bytes_sent: u64,
    transmits: VecDeque<(NodeId, Frame)>,
    effects: VecDeque<Effect>,
}

impl Node {
    /// A node that has not joined yet; `incarnation` must differ between restarts of one id.
    pub fn new(cfg: NodeConfig, incarnation: u64) -> Result<Node, crate::diloco::DilocoError> {
        let (initial, real) = match &cfg.numerics {
            Numerics::Real { initial } => (initial.clone(), true),
            Numerics::Virtual { .. } => (Vec::new(), false),
        };
        let outer = OuterState::new(cfg.outer, initial, Vec::new())?;
        let member = Member::new(cfg.id, incarnation, cfg.mesh.clone(), cfg.shards);
        Ok(Node {
            member,
            work: Work::Idle,
            outer: Some(outer),
            real,
            inbox: Inbox::default(),
            held: VecDeque::new(),
            deferred: VecDeque::new(),
            acct: None,
            synced: false,
            report_sync: false,
            just_admitted: false,
            grad_step: None,
            fetch: None,
            serving: BTreeMap::new(),
            asked: VecDeque::new(),
            digest_cache: None,
            params_current: true,
            ring_input: None,
            ahead: None,
            released_at: None,
            closing: None,
            last_digest: None,
            holds: true,
            held_digest: None,
            finished: 0,
            verified: None,
            early: EarlyPieces::default(),
            suspended: false,
            lost_logged: false,
            bytes_sent: 0,
            transmits: VecDeque::new(),
            effects: VecDeque::new(),
            cfg,
        })
    }

    /// Starts over after a [`Effect::Stop`] with `rejoin` (as a supervisor restarts the
    /// process): a new member of `incarnation`, nothing of the old membership kept but the
    /// outer state (which is not valid until a new state arrives). Call [`join`](Self::join)
    /// next.
    pub fn restart(&mut self, incarnation: u64) {
        self.member = Member::new(self.cfg.id, incarnation, self.cfg.mesh.clone(), self.cfg.shards);
        self.work = Work::Idle;
        self.inbox = Inbox::default();
        self.held.clear();
        self.deferred.clear();
        self.acct = None;
        self.synced = false;
        self.report_sync = false;
        self.just_admitted = false;
        self.grad_step = None;
        if let Some(mut f) = self.fetch.take()
            && let (Some(b), Some(o)) = (f.assembly.reclaim(), self.outer.as_mut())
        {
            o.put_buffers(b);
        }
        self.serving.clear();
        self.asked.clear();
        self.digest_cache = None;
        self.params_current = false;
        self.ring_input = None;
        self.ahead = None;
        self.released_at = None;
        self.closing = None;
        self.verified = None;
        self.early.clear();
        self.transmits.clear();
        self.suspended = false;
    }

    /// Starts from `outer` instead of the initial weights (a process resumed from a
    /// checkpoint): call before the first [`join`](Self::join). Its length must be the model's.
    pub fn resume_from(&mut self, outer: OuterState) -> Result<(), crate::diloco::DilocoError> {
        let expected = self.params_len();
        if self.real && outer.len() != expected {
            return Err(crate::diloco::DilocoError::Length {
                what: "resumed outer state",
                expected,
                got: outer.len(),
            });
        }
        self.outer = Some(outer);
        self.params_current = false;
        self.holds = true;
        self.held_digest = None;
        self.finished = self.finished.max(self.outer.as_ref().map_or(0, OuterState::steps));
        Ok(())
    }

    /// The training state this node holds, as its `Join` tells the mesh: `None` unless the
    /// outer state is a whole replicated one and is not lent to a job.
    pub fn held(&self) -> Option<crate::mesh::Held> {
        let o = self.outer.as_ref().filter(|_| self.holds)?;
        let outer_step = o.steps();
        let digest = self.held_digest.filter(|(s, _)| *s == outer_step).map(|(_, d)| d);
        Some(crate::mesh::Held { outer_step, digest })
    }

    /// Tells the member which state this node holds and the steps it knows finished.
    fn tell_held(&mut self) {
        let held = self.held();
        let finished = self.finished.max(held.map_or(0, |h| h.outer_step));
        self.member.set_held(held, finished);
    }

    /// Asks to join the mesh (once per incarnation).
    pub fn join(&mut self, now: Time) -> Result<(), MeshError> {
        self.tell_held();
        let r = self.member.join(now);
        self.pump(now);
        r
    }

    /// This node.
    pub fn id(&self) -> NodeId {
        self.cfg.id
    }

    /// Its settings.
    pub fn config(&self) -> &NodeConfig {
        &self.cfg
    }

    /// The mesh member.
    pub fn member(&self) -> &Member {
        &self.member
    }

    /// What it is doing.
    pub fn work(&self) -> &Work {
        &self.work
    }

    /// The outer step it works on: that of its open row (`None` before admission and between
    /// a commit and the next step's compute).
    pub fn outer_step(&self) -> Option<u64> {
        self.acct.as_ref().map(StepAcct::step)
    }

    /// How far a state transfer under way is: bytes of the replicated part received, of how
    /// many (`None` when no transfer is under way).
    pub fn recovery_progress(&self) -> Option<(u64, u64)> {
        let f = self.fetch.as_ref()?;
        Some((f.assembly.shared_held(), f.assembly.expect().shared_len))
    }

    /// The outer state, unless lent to a job.
    pub fn outer(&self) -> Option<&OuterState> {
        self.outer.as_ref()
    }

    /// Whether it holds the mesh's training state (a founding member, or the state arrived).
    pub fn is_synced(&self) -> bool {
        self.synced
    }

    /// Whether a state transfer to it is under way.
    pub fn is_fetching(&self) -> bool {
        self.fetch.is_some()
    }

    /// Whether it is suspended ([`suspend`](Self::suspend)).
    pub fn is_suspended(&self) -> bool {
        self.suspended
    }

    /// Wire bytes of every frame handed out by [`poll_transmit`](Self::poll_transmit).
    pub fn bytes_sent(&self) -> u64 {
        self.bytes_sent
    }

    /// What its collective frames came to.
    pub fn ring_counters(&self) -> RingCounters {
        self.inbox.counters()
    }

    /// The next frame to send. While suspended, only membership frames come out.
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<(NodeId, Frame)> {
        let i = if self.suspended {
            self.transmits.iter().position(|(_, f)| matches!(f.header, Header::Mesh(_)))?
        } else {
            0
        };
        let t = self.transmits.remove(i)?;
        self.bytes_sent += t.1.wire_len();
        Some(t)
    }

    /// The next effect to carry out.
    #[must_use]
    pub fn poll_effect(&mut self) -> Option<Effect> {
        self.effects.pop_front()
    }

    /// When [`handle_timeout`](Self::handle_timeout) must be called next, if ever.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Time> {
        let ask = self.fetch.as_ref().and_then(|f| f.ask_at);
        [self.member.poll_timeout(), ask, self.progress_deadline()].into_iter().flatten().min()
    }

    /// The member's deadlines passed (early calls are no-ops).
    pub fn handle_timeout(&mut self, now: Time) {
        self.member.handle_timeout(now);
        if self.fetch.as_ref().and_then(|f| f.ask_at).is_some_and(|t| t <= now) {
            self.ask_missing(now);
        }
        if self.progress_deadline().is_some_and(|t| t <= now) {
            self.stalled(now);
        }
        self.pump(now);
    }

    /// A frame from `from` arrived. Frames that do not fit are counted or dropped, never a
    /// panic.
    pub fn handle_frame(&mut self, now: Time, from: NodeId, frame: Frame) {
        match frame.header {
            Header::Mesh(msg) => {
                self.member.handle_message(now, from, msg);
                // Heard again (it was paused, or cut off): a later silence is a new loss.
                if !self.member.waiting_for_coordinator() {
                    self.lost_logged = false;
                }
            }
            Header::State(h) => self.on_state_part(now, from, h, frame.body),
            Header::StateAsk(ask) => self.on_ask(from, ask),
            Header::Collective(_) => {
                if self.suspended {
                    self.held.push_back((from, frame));
                } else {
                    self.feed(now, from, frame);
                    self.drive_rings(now);
                }
            }
        }
        self.pump(now);
    }

    /// The transport lost `peer`: when it is a ring neighbour of the running attempt, the
    /// attempt failed here.
    pub fn peer_unreachable(&mut self, now: Time, peer: NodeId) {
        if let Work::Reducing(r) = &mut self.work {
            let (left, right) = r.rings.neighbours();
            if !r.failed && (peer == left || peer == right) && r.rings.start().ring.len() > 1 {
                r.failed = true;
                let (epoch, op) = r.rings.collective();
                let received = r.rings.stats().frames_received;
                let _ = self.member.report_allreduce_failed(now, epoch, op, None, received);
            }
        }
        self.pump(now);
    }

    /// The executor's model of the running attempt `(epoch, op)` says it is done here
    /// ([`NodeConfig::modelled_collectives`]): the rings finish as if their frames had moved.
    /// Any other attempt's answer is stale and ignored.
    pub fn allreduce_modelled(&mut self, now: Time, epoch: Epoch, op: u64) {
        if let Work::Reducing(r) = &mut self.work
            && r.modelled
            && r.rings.collective() == (epoch, op)
        {
            r.modelled_done = true;
        }
        self.drive_rings(now);
        self.pump(now);
    }

    /// Leaves the mesh (a deathrattle to the coordinator).
    pub fn leave(&mut self, now: Time, reason: LeaveReason) {
        if !self.member.is_stopped() {
            self.member.leave(now, reason);
        }
        self.pump(now);
    }

    /// The application side stopped (a hung kernel): the member's heartbeats and the state
    /// pieces go on; collective frames are held, the rings send nothing, and every other
    /// membership action waits for [`resume`](Self::resume). The executor stops its compute.
    pub fn suspend(&mut self, now: Time) {
        if self.suspended {
            return;
        }
        self.suspended = true;
        // The executor pauses the work it runs for the machine: its time is idle meanwhile.
        if (matches!(self.work, Work::Computing { .. } | Work::Outer { .. })
            || self.computing_ahead())
            && let Some(a) = &mut self.acct
        {
            a.leave(now);
        }
    }

    /// The application side goes on after [`suspend`](Self::suspend).
    pub fn resume(&mut self, now: Time) {
        if !self.suspended {
            return;
        }
        self.suspended = false;
        let span = match self.work {
            _ if self.computing_ahead() => Some(Span::Compute),
            Work::Computing { .. } => Some(Span::Compute),
            Work::Outer { .. } => Some(Span::Outer),
            _ => None,
        };
        if let (Some(span), Some(a)) = (span, &mut self.acct) {
            a.enter(span, now);
        }
        if let Work::Reducing(r) = &mut self.work {
            // The neighbour's silence while this node hung is not held against it.
            r.heard = now;
            self.drive_rings(now);
        }
        self.pump(now);
    }

    /// The inner steps of `outer_step` are done: `inner` holds the inner weights after them
    /// (real numerics), `loss` the loss at their end. The machine computes the pseudo-gradient
    /// ([`Effect::Outer`]) and then arrives at the barrier.
    pub fn computed(
        &mut self,
        now: Time,
        outer_step: u64,
        inner: Option<Vec<f32>>,
        loss: Option<f64>,
    ) {
        let tokens = self.cfg.inner_steps.saturating_mul(self.cfg.batch_tokens);
        self.computed_tokens(now, outer_step, inner, loss, None, tokens);
    }

    /// [`computed`](Self::computed) with the tokens the inner steps processed as counted by
    /// the executor (a trainer whose batches are not `batch_tokens` each), and the held-out loss
    /// of the weights they started from when the executor evaluated them (the row's
    /// `eval_loss`).
    pub fn computed_tokens(
        &mut self,
        now: Time,
        outer_step: u64,
        inner: Option<Vec<f32>>,
        loss: Option<f64>,
        eval_loss: Option<f64>,
        tokens: u64,
    ) {
        let done = Computed { inner, loss, eval_loss, tokens };
        if !matches!(self.work, Work::Computing { outer_step: s } if s == outer_step) {
            // Overlap: the round's inner steps are done before the member asks for them (the
            // previous round's commit has not come): the result waits, and so does the node.
            if let Some(a) = self.ahead.as_mut().filter(|a| a.outer_step == outer_step)
                && a.result.is_none()
            {
                a.result = Some(done);
                self.wait_span(now);
            }
            return;
        }
        self.round_done(now, outer_step, done);
        self.pump(now);
    }

    /// An [`OuterJob`] comes back (run or not: it is run here if the executor did not).
    pub fn outer_done(&mut self, now: Time, mut job: OuterJob) {
        job.run();
        let then = match self.work {
            Work::Outer { then } => then,
            // A stop while the job was out: only the state comes back.
            _ => {
                self.outer = Some(job.outer);
                return;
            }
        };
        let back = Returned {
            average: job.values.take(),
            valid: job.valid,
            nonfinite: job.nonfinite,
            of: job.outer.len(),
            digest: job.digest.take(),
            copy: job.copy.take(),
            snapshot: job.snapshot.take(),
        };
        self.outer = Some(job.outer);
        match then {
            AfterOuter::Barrier { outer_step } => self.arrive(now, outer_step, back),
            AfterOuter::Commit { epoch, outer_step } => {
                self.committed(now, epoch, outer_step, back)
            }
            AfterOuter::Skip { epoch, outer_step, attempts } => {
                self.skipped(now, epoch, outer_step, attempts, back)
            }
        }
        // A state that completed, or was verified, while the outer state was away.
        if let Some(v) = self.verified.take() {
            self.install(now, v);
        }
        self.take_state(now);
        self.pump(now);
    }

    /// A state prepared by [`StateJob::prepare`] comes back: its pieces are queued (none for a
    /// job ahead of any joiner). The replicated part's digests are kept for the next job of the
    /// same snapshot.
    pub fn state_prepared(&mut self, _now: Time, p: PreparedState) {
        if let Some((key, d)) = p.shared_digests() {
            // A job ahead that finished after the next outer step is of no more use.
            if !p.is_ahead() || self.snapshot_key().is_none_or(|k| k == key) {
                self.digest_cache = Some((key, d));
            }
        }
        let to = p.to();
        self.transmits.extend(p.frames().map(|f| (to, f)));
    }

    /// The verification asked by [`Effect::VerifyState`] is done.
    pub fn state_verified(&mut self, now: Time, result: VerifyResult) {
        let Some(f) = &mut self.fetch else { return };
        f.verifying = false;
        match result {
            Ok(v) => self.install(now, v),
            Err(failed) => {
                self.violation(Violation::StateRejected(failed.clone()));
                let forged = matches!(
                    &failed.shared,
                    Err(r) if matches!(r.fault, crate::node::state::PartFault::NotVouched { .. })
                );
                if let (true, Some(f)) = (forged, &self.fetch) {
                    let (epoch, senders) = (f.assembly.epoch(), f.assembly.senders().to_vec());
                    self.member.report_state_refused(epoch, senders);
                }
                if let Some(f) = &mut self.fetch {
                    if f.assembly.retry(*failed) {
                        self.take_state(now);
                    } else {
                        // The copies that were wrong are dropped: asked for again at once.
                        self.ask_missing(now);
                    }
                }
            }
        }
        self.pump(now);
    }

    // ----- internals shared by the submodules -----

    fn params(&self) -> u64 {
        match &self.cfg.numerics {
            Numerics::Real { initial } => initial.len() as u64,
            Numerics::Virtual { params } => *params,
        }
    }

    /// [`params`](Self::params) as a length (saturating).
    fn params_len(&self) -> usize {
        usize::try_from(self.params()).unwrap_or(usize::MAX)
    }

    fn blocking(&self) -> bool {
        self.cfg.mesh.join_mode == JoinMode::Blocking
    }

    fn violation(&mut self, v: Violation) {
        self.effects.push_back(Effect::Check(Check::Violation(v)));
    }

    /// Drains the member: sends go out at once; other actions wait while suspended or while
    /// the outer state is lent.
    fn pump(&mut self, now: Time) {
        // A state that came back from a job or was received changes what a queued join says.
        self.tell_held();
        loop {
            if self.suspended || self.outer.is_none() {
                while let Some(a) = self.member.poll_action() {
                    match a {
                        MemberAction::Send { to, msg, padding } => self.send_mesh(to, msg, padding),
                        other => self.deferred.push_back(other),
                    }
                }
                return;
            }
            self.answer_asks();
            let Some(a) = self.deferred.pop_front().or_else(|| self.member.poll_action()) else {
                return;
            };
            self.act(a, now);
            if matches!(self.work, Work::Stopped) {
                // Nothing of this membership is carried out after its stop.
                self.deferred.clear();
                while self.member.poll_action().is_some() {}
                return;
            }
        }
    }

    fn send_mesh(&mut self, to: NodeId, msg: crate::mesh::MeshMsg, padding: u64) {
        let frame = padded_frame(msg, padding, self.cfg.virtual_padding);
        self.transmits.push_back((to, frame));
    }

    fn act(&mut self, a: MemberAction, now: Time) {
        match a {
            MemberAction::Send { to, msg, padding } => self.send_mesh(to, msg, padding),
            MemberAction::Admitted { epoch, outer_step } => {
                self.lost_logged = false;
                // Not a replica of the mesh's state until it founds the mesh or receives it.
                self.holds = false;
                self.effects.push_back(Effect::Event(NodeEvent::Admitted { epoch, outer_step }));
                self.just_admitted = true;
                self.open_row(outer_step, now);
            }
            MemberAction::EpochChanged { epoch, members } => {
                self.effects.push_back(Effect::Check(Check::View { epoch, members, what: "view" }));
            }
            MemberAction::Compute { epoch, outer_step } => {
                self.start_compute(epoch, outer_step, now)
            }
            MemberAction::FetchState { epoch, senders, vouched } => {
                self.just_admitted = false;
                self.fetch_state(epoch, senders, vouched, now);
            }
            MemberAction::SendState { epoch, to, senders } => self.send_state(epoch, to, &senders),
            MemberAction::StartAllReduce(s) => {
                self.just_admitted = false;
                self.start_allreduce(s, now);
            }
            MemberAction::AbortAllReduce { epoch, op } => self.abort_allreduce(epoch, op),
            MemberAction::Commit { epoch, outer_step } => {
                self.finished = self.finished.max(outer_step.saturating_add(1));
                self.commit(epoch, outer_step, now)
            }
            MemberAction::SkipStep { epoch, outer_step, attempts } => {
                self.finished = self.finished.max(outer_step.saturating_add(1));
                self.skip(epoch, outer_step, attempts, now)
            }
            MemberAction::CoordinatorSilent { silent_for, last_committed, waits } => {
                if !self.lost_logged {
                    self.lost_logged = true;
                    let epoch = self.member.epoch();
                    let ev =
                        NodeEvent::CoordinatorLost { epoch, silent_for, last_committed, waits };
                    self.effects.push_back(Effect::Event(ev));
                }
            }
            MemberAction::Stop(reason) => self.on_stop(reason),
        }
    }

    fn on_stop(&mut self, reason: StopReason) {
        self.work = Work::Stopped;
        let rejoin = match &reason {
            StopReason::Evicted(_) => true,
            // The member said so when the coordinator fell silent (`CoordinatorSilent`).
            StopReason::CoordinatorLost { .. } => true,
            StopReason::Left(_)
            | StopReason::Shutdown
            | StopReason::UpdatesRefused { .. }
            | StopReason::NoSyncedMember { .. } => false,
        };
        self.effects.push_back(Effect::Stop { reason, rejoin });
    }
}
