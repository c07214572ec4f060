//! The node machine: everything one member of the mesh decides, sans-IO, in the style of
//! quinn-proto's `Connection` and raft-rs's `RawNode` (STYLE.md items 1 and 8).
//!
//! A [`Node`] owns the mesh [`Member`], the `G` per-shard rings of the running all-reduce
//! ([`ShardRings`]) and the door of collective frames ([`Inbox`]), the DiLoCo [`OuterState`]
//! (real `f32` values, or lengths only with virtual numerics), live recovery (the joiner's
//! [`StateAssembly`] and [`ReplayLog`], the sender's piece plan) and the step accounting
//! ([`StepAcct`]). What the node is doing is one enum, [`Work`].
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

mod effect;

use effect::RoundJob;
pub use effect::{
    Check, Effect, ModelledAllReduce, NodeEvent, OuterJob, OuterKind, PreparedState, Snapshot,
    StateJob, VerifyResult, Violation,
};

use crate::codec::CodecKind;
use crate::diloco::{OuterConfig, OuterState, Schedule};
use crate::ids::{Epoch, NodeId};
use crate::mesh::{
    AllReduceStart, JoinMode, LeaveReason, Member, MemberAction, MemberPhase, MeshConfig,
    MeshError, StopReason,
};
use crate::node::acct::{RowIdentity, Span, StepAcct};
use crate::node::rings::{Admission, Inbox, RingCounters, ShardRings, Values};
use crate::node::state::{
    EarlyPieces, Expect, PartDigests, PieceRule, Progress, Refused, ReplayLog, Share, SharedState,
    StateAssembly, Verified, share_of, virtual_part_lens,
};
use crate::time::Time;
use crate::transport::{
    Body, Frame, HEADER_WIRE_BYTES, Header, StateAsk, StateHeader, padded_frame,
};
use bytes::Bytes;
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
    /// [`PieceRule::Clamped`]: pieces of a bounded size.
    Clamped,
    /// [`PieceRule::Count`] of `joiner shards x state_senders` pieces (as many parallel flows as
    /// the joiner has GPUs per sender); joiners not listed have one shard.
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
}

impl std::fmt::Debug for Reducing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reducing")
            .field("collective", &self.rings.collective())
            .field("failed", &self.failed)
            .finish()
    }
}

/// A state transfer being received.
#[derive(Debug)]
struct Fetch {
    assembly: StateAssembly,
    /// Results committed here while the state is on the way (non-blocking), replayed onto it.
    log: ReplayLog,
    /// A complete copy is with the executor for verification.
    verifying: bool,
    /// When to ask the senders for the pieces still missing: set by each piece stored (no
    /// piece for `state_resend_after`), cleared while nothing is missing.
    ask_at: Option<Time>,
    /// Asks sent so far (at most [`MAX_ASKS`]).
    asks: u32,
}

/// The most times a joiner asks its senders for missing pieces in one fetch, and a sender
/// answers one joiner's asks in one assignment; past it `sync_timeout` decides.
const MAX_ASKS: u32 = 8;

/// The inner steps of a round in overlap and streaming modes, started by the machine (as the
/// node arrives at the previous round's barrier, or when the member asks for a first round).
#[derive(Debug)]
struct Ahead {
    outer_step: u64,
    /// They started from weights of the mesh's state (a synced node).
    valid: bool,
    /// Their result, when it came before the member asked for the step (the previous commit
    /// had not come yet).
    result: Option<Computed>,
}

/// What inner steps returned.
#[derive(Debug)]
struct Computed {
    inner: Option<Vec<f32>>,
    loss: Option<f64>,
    tokens: u64,
}

/// Overlap modes: the row of a round whose time ended (the next round computes) and whose
/// all-reduce has not committed yet: written at its commit, with the weights after it.
#[derive(Debug)]
struct Closing {
    acct: StepAcct,
    end: Time,
    bytes: u64,
}

/// A transfer this node sends (its joiner may ask for pieces again).
struct Serving {
    epoch: Epoch,
    senders: Vec<NodeId>,
    asks: u32,
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
    last_digest: String,
    /// A verified state that came back while the outer state was lent: taken on its return.
    verified: Option<Verified>,
    early: EarlyPieces,
    suspended: bool,
    /// The loss of the coordinator was written (once per loss, across restarts).
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
            last_digest: String::new(),
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
        if let Some(mut f) = self.fetch.take() {
            if let (Some(b), Some(o)) = (f.assembly.reclaim(), self.outer.as_mut()) {
                o.put_buffers(b);
            }
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
        Ok(())
    }

    /// Asks to join the mesh (once per incarnation).
    pub fn join(&mut self, now: Time) -> Result<(), MeshError> {
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
        match (self.member.poll_timeout(), ask) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The member's deadlines passed (early calls are no-ops).
    pub fn handle_timeout(&mut self, now: Time) {
        self.member.handle_timeout(now);
        if self.fetch.as_ref().and_then(|f| f.ask_at).is_some_and(|t| t <= now) {
            self.ask_missing(now);
        }
        self.pump(now);
    }

    /// A frame from `from` arrived. Frames that do not fit are counted or dropped, never a
    /// panic.
    pub fn handle_frame(&mut self, now: Time, from: NodeId, frame: Frame) {
        match frame.header {
            Header::Mesh(msg) => self.member.handle_message(now, from, msg),
            Header::State(h) => self.on_state_part(now, from, h, frame.body),
            Header::StateAsk(ask) => {
                self.asked.push_back((from, ask));
                self.answer_asks();
            }
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
                let _ = self.member.report_allreduce_failed(now, epoch, op);
            }
        }
        self.pump(now);
    }

    /// The executor's model of the running attempt `(epoch, op)` says it is done here
    /// ([`NodeConfig::modelled_collectives`]): the rings finish as if their frames had moved.
    /// Any other attempt's answer is stale and ignored.
    pub fn allreduce_modelled(&mut self, now: Time, epoch: Epoch, op: u64) {
        if let Work::Reducing(r) = &mut self.work {
            if r.modelled && r.rings.collective() == (epoch, op) {
                r.modelled_done = true;
            }
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
        if matches!(self.work, Work::Computing { .. } | Work::Outer { .. })
            || self.computing_ahead()
        {
            if let Some(a) = &mut self.acct {
                a.leave(now);
            }
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
        if matches!(self.work, Work::Reducing(_)) {
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
        self.computed_tokens(now, outer_step, inner, loss, tokens);
    }

    /// [`computed`](Self::computed) with the tokens the inner steps processed as counted by
    /// the executor (a trainer whose batches are not `batch_tokens` each).
    pub fn computed_tokens(
        &mut self,
        now: Time,
        outer_step: u64,
        inner: Option<Vec<f32>>,
        loss: Option<f64>,
        tokens: u64,
    ) {
        let done = Computed { inner, loss, tokens };
        if !matches!(self.work, Work::Computing { outer_step: s } if s == outer_step) {
            // Overlap: the round's inner steps are done before the member asks for them (the
            // previous round's commit has not come): the result waits, and so does the node.
            if let Some(a) = self.ahead.as_mut().filter(|a| a.outer_step == outer_step) {
                if a.result.is_none() {
                    a.result = Some(done);
                    self.wait_span(now);
                }
            }
            return;
        }
        self.round_done(now, outer_step, done);
        self.pump(now);
    }

    /// The inner steps of `outer_step`, the step the node computes, are done: the
    /// pseudo-gradient's job (with the merge of the previous fragment in overlap modes).
    fn round_done(&mut self, now: Time, outer_step: u64, done: Computed) {
        // The inner loop moved: the next compute starts from parameters set again.
        self.params_current = false;
        if let Some(a) = &mut self.acct {
            a.trained(done.tokens, done.loss);
        }
        let valid = match self.ahead.take() {
            Some(a) if a.outer_step == outer_step => a.valid,
            _ => self.grad_step == Some(outer_step),
        };
        let round = self.round_job(outer_step, true);
        match self.lend(OuterKind::PseudoGradient, outer_step, now) {
            Some(mut job) => {
                job.values = done.inner;
                job.valid = valid;
                job.round = round;
                self.work = Work::Outer { then: AfterOuter::Barrier { outer_step } };
                self.effects.push_back(Effect::Outer(job));
            }
            None => self.work = Work::Idle,
        }
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
        let average = job.values.take();
        let valid = job.valid;
        let nonfinite = job.nonfinite;
        let of = job.outer.len();
        let digest = job.digest.take();
        let copy = job.copy.take();
        let snapshot = job.snapshot.take();
        self.outer = Some(job.outer);
        match then {
            AfterOuter::Barrier { outer_step } => {
                self.ring_input = copy;
                self.work = Work::Barrier;
                if self.overlaps() {
                    // The next round computes while this one's all-reduce runs.
                    self.grad_step = (valid && self.synced).then_some(outer_step);
                    self.start_ahead(now, outer_step + 1, average);
                } else {
                    self.enter(Span::Barrier, now);
                }
                if nonfinite > 0 {
                    // A diverged inner loop: averaging it would spread NaN (fp32, fp16) or hide
                    // it (uint8, int8-block). The node asks for weight 0 and takes the average.
                    self.member.withhold(outer_step);
                    let epoch = self.member.epoch();
                    let ev = NodeEvent::Withheld { epoch, outer_step, values: nonfinite, of };
                    self.effects.push_back(Effect::Event(ev));
                }
                if let Err(e) = self.member.barrier_arrive(now, outer_step) {
                    tracing::debug!(target: "loco_core", "{}: barrier refused: {e}", self.cfg.id);
                }
            }
            AfterOuter::Commit { epoch, outer_step } => {
                self.work = Work::Idle;
                let fragment = self.cfg.schedule.fragment(outer_step);
                let hash = digest.unwrap_or_default();
                if !hash.is_empty() {
                    let c = Check::WeightsAfter { outer_step, hash: hash.clone() };
                    self.effects.push_back(Effect::Check(c));
                }
                self.last_digest.clone_from(&hash);
                if let Some(a) = self.step_row(outer_step) {
                    a.set_epoch(epoch);
                }
                if self.overlaps() {
                    // The inner weights are this node's trajectory: the merge at the end of the
                    // round under way takes the update. The round's row, whose time ended at its
                    // barrier, is written now with the weights after its step.
                    let avg = average.filter(|a| a.len() == fragment.len());
                    self.log_fragment(outer_step, fragment.start, avg);
                    self.emit_closing(outer_step, hash);
                } else {
                    self.set_params_from(copy);
                    let len = self.outer.as_ref().map(|o| o.len());
                    self.log_result(outer_step, average.filter(|a| Some(a.len()) == len));
                    self.close_row(outer_step, now, hash);
                }
                if self.checkpoint_due(outer_step) {
                    self.effects.push_back(Effect::Checkpoint { outer_step, snapshot });
                }
                self.digest_ahead();
            }
            AfterOuter::Skip { epoch, outer_step, attempts } => {
                self.work = Work::Idle;
                self.released_at = None;
                self.log_result(outer_step, None);
                if let Some(a) = self.step_row(outer_step) {
                    a.set_epoch(epoch);
                    a.set_retries(attempts.saturating_sub(1));
                }
                if self.overlaps() {
                    let hash = self.last_digest.clone();
                    self.emit_closing(outer_step, hash);
                } else {
                    self.set_params_from(copy);
                    self.close_row(outer_step, now, digest.unwrap_or_default());
                }
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

    /// Which snapshot the outer state is (`None` while it is lent to a job).
    fn snapshot_key(&self) -> Option<effect::SnapshotKey> {
        let o = self.outer.as_ref()?;
        Some((o.steps(), o.outer().as_ptr() as usize, o.momentum().as_ptr() as usize))
    }

    /// Digests the replicated part's pieces ahead of any joiner (off the event loop, while the
    /// inner steps run), so that a sender's first piece leaves at once when one comes.
    fn digest_ahead(&mut self) {
        if !self.synced {
            return;
        }
        let (Some(key), Some(outer)) = (self.snapshot_key(), &self.outer) else { return };
        if self.digest_cache.as_ref().is_some_and(|(k, _)| *k == key) {
            return;
        }
        let me = self.cfg.id;
        let job = StateJob {
            epoch: self.member.epoch().unwrap_or_default(),
            to: me,
            share: Share { index: 0, of: 1, sends_own: false },
            rule: self.state_rule(me),
            outer_step: outer.steps(),
            shared: self.real.then(|| SharedState::from_outer(outer)),
            virtual_lens: virtual_part_lens(self.params()),
            only: None,
            key: Some(key),
            known: None,
            ahead: true,
        };
        self.effects.push_back(Effect::PrepareState(job));
    }

    /// The verification asked by [`Effect::VerifyState`] is done.
    pub fn state_verified(&mut self, now: Time, result: VerifyResult) {
        let Some(f) = &mut self.fetch else { return };
        f.verifying = false;
        match result {
            Ok(v) => self.install(now, v),
            Err(failed) => {
                self.violation(Violation::StateRejected(failed.clone()));
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

    // ----- internals -----

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

    fn lend(&mut self, kind: OuterKind, outer_step: u64, now: Time) -> Option<OuterJob> {
        let outer = self.outer.take()?;
        self.enter(Span::Outer, now);
        let mut job = OuterJob::new(outer, kind, outer_step, self.params());
        job.want_digest = self.real && self.synced && kind != OuterKind::PseudoGradient;
        // Overlap modes set no parameters after a commit or a skip: no copy of the weights.
        job.want_copy = self.real && (kind == OuterKind::PseudoGradient || !self.overlaps());
        job.want_snapshot =
            self.real && kind == OuterKind::Commit && self.checkpoint_due(outer_step);
        Some(job)
    }

    /// Whether the commit of `outer_step` is followed by a checkpoint.
    fn checkpoint_due(&self, outer_step: u64) -> bool {
        self.cfg.checkpoint_every.is_some_and(|k| (outer_step + 1).is_multiple_of(k.max(1)))
    }

    fn set_params(&mut self) {
        if let (true, Some(o)) = (self.real, &self.outer) {
            self.effects.push_back(Effect::SetParams(o.outer().to_vec()));
        }
        self.params_current = true;
    }

    /// [`set_params`](Self::set_params) with the copy of the outer weights a job made.
    fn set_params_from(&mut self, copy: Option<Vec<f32>>) {
        let len = self.outer.as_ref().map(OuterState::len);
        match copy {
            Some(w) if self.real && Some(w.len()) == len => {
                self.effects.push_back(Effect::SetParams(w));
                self.params_current = true;
            }
            _ => self.set_params(),
        }
    }

    fn log_result(&mut self, outer_step: u64, avg: Option<Vec<f32>>) {
        match &mut self.fetch {
            Some(f) => f.log.push(outer_step, avg),
            None => self.early.clear(),
        }
    }

    /// [`log_result`](Self::log_result) of a fragment's average from `offset` on.
    fn log_fragment(&mut self, outer_step: u64, offset: usize, avg: Option<Vec<f32>>) {
        match &mut self.fetch {
            Some(f) => f.log.push_fragment(outer_step, offset, avg),
            None => self.early.clear(),
        }
    }

    /// Overlap modes: the round job of `step` (with the merge of the fragment before it for a
    /// round's end); `None` in sync mode.
    fn round_job(&self, step: u64, merge: bool) -> Option<RoundJob> {
        let s = &self.cfg.schedule;
        self.overlaps().then(|| RoundJob {
            merge: if merge { s.merged(step) } else { None },
            fragment: s.fragment(step),
            mix: s.mix,
        })
    }

    /// Whether the inner steps go on while the all-reduce runs (overlap, streaming).
    fn overlaps(&self) -> bool {
        self.cfg.schedule.mode.overlaps()
    }

    /// Whether the inner steps of a round are running (overlap modes): the row stays in its
    /// compute span whatever the mesh does meanwhile.
    fn computing_ahead(&self) -> bool {
        self.ahead.as_ref().is_some_and(|a| a.result.is_none())
    }

    /// The node starts `span` in its row, unless its inner steps run beside it.
    fn enter(&mut self, span: Span, now: Time) {
        if span != Span::Compute && self.computing_ahead() {
            return;
        }
        if let Some(a) = &mut self.acct {
            a.enter(span, now);
        }
    }

    /// Overlap modes: the inner steps are done and the node waits; its row enters the span of
    /// what it waits for.
    fn wait_span(&mut self, now: Time) {
        let span = match self.work {
            Work::Barrier => Some(Span::Barrier),
            Work::Reducing(_) | Work::Reduced { .. } => Some(Span::AllReduce),
            Work::Outer { .. } => Some(Span::Outer),
            Work::Idle | Work::Computing { .. } | Work::Stopped => None,
        };
        if let Some(a) = &mut self.acct {
            match span {
                Some(s) if !self.suspended => a.enter(s, now),
                _ => a.leave(now),
            }
        }
    }

    /// Overlap modes: the inner steps of `step` start now, from `params` (the merged weights of
    /// the round that ended; `None`: as set), before the member asks for them. The row of the
    /// round that ended closes here and `step`'s opens: rows tile the node's time.
    fn start_ahead(&mut self, now: Time, step: u64, params: Option<Vec<f32>>) {
        let len = self.outer.as_ref().map(OuterState::len);
        match params {
            Some(p) if self.real && Some(p.len()) == len => {
                self.effects.push_back(Effect::SetParams(p));
            }
            _ => self.set_params(),
        }
        // The inner weights are a local trajectory, not the global weights.
        self.params_current = false;
        if let Some(mut a) = self.acct.take() {
            // The round's time ends here; its row waits for its all-reduce's commit.
            if let Some(c) = self.closing.take() {
                let hash = self.last_digest.clone();
                let row = c.acct.close(c.end, c.bytes, &self.cfg.row, hash);
                self.effects.push_back(Effect::Row(row));
            }
            a.leave(now);
            self.closing = Some(Closing { acct: a, end: now, bytes: self.bytes_queued() });
        }
        self.open_row(step, now);
        self.ahead = Some(Ahead { outer_step: step, valid: self.synced, result: None });
        if !self.suspended {
            self.enter(Span::Compute, now);
        }
        let epoch = self.member.epoch().unwrap_or_default();
        let inner_steps = self.cfg.inner_steps;
        self.effects.push_back(Effect::Compute { epoch, outer_step: step, inner_steps });
    }

    /// The row that accounts `step`'s all-reduce: the open one, or in overlap modes the row
    /// of a round waiting for its commit.
    fn step_row(&mut self, step: u64) -> Option<&mut StepAcct> {
        if self.closing.as_ref().is_some_and(|c| c.acct.step() == step) {
            return self.closing.as_mut().map(|c| &mut c.acct);
        }
        self.acct.as_mut().filter(|a| a.step() == step)
    }

    /// Writes the row of `step` parked by [`start_ahead`](Self::start_ahead), with `hash`.
    fn emit_closing(&mut self, step: u64, hash: String) {
        if self.closing.as_ref().is_none_or(|c| c.acct.step() != step) {
            return;
        }
        if let Some(c) = self.closing.take() {
            let row = c.acct.close(c.end, c.bytes, &self.cfg.row, hash);
            self.effects.push_back(Effect::Row(row));
        }
    }

    fn open_row(&mut self, step: u64, now: Time) {
        if self.acct.as_ref().is_some_and(|a| a.step() == step) {
            return;
        }
        if self.overlaps() {
            // A row left open by a round whose commit never came here (a fresh start).
            if let Some(prev) = self.outer_step() {
                let hash = self.last_digest.clone();
                self.close_row(prev, now, hash);
            }
        }
        let epoch = self.member.epoch().unwrap_or_default();
        self.acct = Some(StepAcct::open(step, now, epoch, self.bytes_queued()));
    }

    /// Bytes sent so far, counting the frames queued (they go out at this instant).
    fn bytes_queued(&self) -> u64 {
        self.bytes_sent
    }

    fn close_row(&mut self, step: u64, now: Time, hash: String) {
        let Some(a) = self.acct.take() else { return };
        if a.step() != step {
            return;
        }
        let row = a.close(now, self.bytes_queued(), &self.cfg.row, hash);
        self.effects.push_back(Effect::Row(row));
    }

    /// Drains the member: sends go out at once; other actions wait while suspended or while
    /// the outer state is lent.
    fn pump(&mut self, now: Time) {
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
            MemberAction::FetchState { epoch, senders } => {
                self.just_admitted = false;
                self.fetch_state(epoch, senders, now);
            }
            MemberAction::SendState { epoch, to, senders } => self.send_state(epoch, to, &senders),
            MemberAction::StartAllReduce(s) => {
                self.just_admitted = false;
                self.start_allreduce(s, now);
            }
            MemberAction::AbortAllReduce { epoch, op } => {
                let running = match &self.work {
                    Work::Reducing(r) => Some(r.rings.collective()),
                    Work::Reduced { epoch, op, .. } => Some((*epoch, *op)),
                    _ => None,
                };
                if running == Some((epoch, op)) {
                    self.work = Work::Idle;
                }
                self.inbox.abort(epoch, op);
            }
            MemberAction::Commit { epoch, outer_step } => self.commit(epoch, outer_step, now),
            MemberAction::SkipStep { epoch, outer_step, attempts } => {
                if let Some(mut job) = self.lend(OuterKind::Skip, outer_step, now) {
                    job.round = self.round_job(outer_step, false);
                    self.work =
                        Work::Outer { then: AfterOuter::Skip { epoch, outer_step, attempts } };
                    self.effects.push_back(Effect::Outer(job));
                }
            }
            MemberAction::Stop(reason) => self.on_stop(reason),
        }
    }

    fn on_stop(&mut self, reason: StopReason) {
        self.work = Work::Stopped;
        let rejoin = match &reason {
            StopReason::Evicted(_) => true,
            StopReason::CoordinatorLost { .. } => {
                if !self.lost_logged {
                    self.lost_logged = true;
                    let ev = NodeEvent::CoordinatorLost {
                        epoch: self.member.epoch(),
                        reason: reason.clone(),
                    };
                    self.effects.push_back(Effect::Event(ev));
                }
                true
            }
            StopReason::Left(_) | StopReason::Shutdown | StopReason::NoSyncedMember { .. } => false,
        };
        self.effects.push_back(Effect::Stop { reason, rejoin });
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
                tracing::debug!(target: "loco_core", "{}: sync report refused: {e}", self.cfg.id);
            }
        }
        if self.overlaps() {
            if let Some(a) = self.ahead.as_mut().filter(|a| a.outer_step == step) {
                // Running since the barrier of the step before (or done already).
                let result = a.result.take();
                if let Some(acct) = &mut self.acct {
                    acct.set_epoch(epoch);
                }
                self.work = Work::Computing { outer_step: step };
                if let Some(done) = result {
                    self.round_done(now, step, done);
                }
                return;
            }
            // A fresh start (a founding member, a joiner, a node whose round was lost): the
            // local trajectory starts at the global weights.
            if let (true, Some(o)) = (self.real, self.outer.as_mut()) {
                o.anchor_here();
            }
            self.ahead = Some(Ahead { outer_step: step, valid: self.synced, result: None });
        }
        self.grad_step = self.synced.then_some(step);
        if !self.params_current {
            self.set_params();
        }
        self.open_row(step, now);
        if let Some(a) = &mut self.acct {
            a.set_epoch(epoch);
        }
        if !self.suspended {
            self.enter(Span::Compute, now);
        }
        self.work = Work::Computing { outer_step: step };
        let inner_steps = self.cfg.inner_steps;
        self.effects.push_back(Effect::Compute { epoch, outer_step: step, inner_steps });
    }

    fn commit(&mut self, epoch: Epoch, step: u64, now: Time) {
        let result = match std::mem::replace(&mut self.work, Work::Idle) {
            Work::Reduced { epoch: e, average, .. } if e == epoch => Some(average),
            _ => None,
        };
        if result.is_none() {
            self.violation(Violation::CommitWithoutResult { outer_step: step, epoch });
        }
        // The all-reduce from its first release to this commit, whether the node waited for
        // it or (overlap modes) computed beside it; not for the empty all-reduce of a round
        // between two syncs (`sync_delay` shorter than a round), which carries no values.
        let empty = self.cfg.schedule.fragment(step).is_empty();
        if let Some(t0) = self.released_at.take().filter(|_| !empty) {
            if let Some(a) = self.step_row(step) {
                a.set_allreduce_wall(now.saturating_since(t0));
            }
        }
        let Some(mut job) = self.lend(OuterKind::Commit, step, now) else { return };
        job.values = result.flatten();
        job.round = self.round_job(step, false);
        self.work = Work::Outer { then: AfterOuter::Commit { epoch, outer_step: step } };
        self.effects.push_back(Effect::Outer(job));
    }

    fn start_allreduce(&mut self, start: AllReduceStart, now: Time) {
        self.work = Work::Idle;
        self.check_release(&start);
        self.enter(Span::AllReduce, now);
        if let Some(a) = self.step_row(start.outer_step) {
            let world = u32::try_from(start.ring.len()).unwrap_or(u32::MAX);
            a.ring(start.epoch, world, f64::from(start.weight.get()), start.attempt);
        }
        self.released_at.get_or_insert(now);
        let input = self.ring_input.take();
        // The values this round reduces: every value (one fragment), or its fragment.
        let fragment = self.cfg.schedule.fragment(start.outer_step);
        let values = match (&self.outer, self.real) {
            // The copy the pseudo-gradient's job made (a retry copies again).
            (Some(o), true) => match input {
                Some(g) if g.len() == fragment.len() => Values::Real(g),
                _ => Values::Real(
                    o.pseudo_gradient()
                        .get(fragment.clone())
                        .map(<[f32]>::to_vec)
                        .unwrap_or_default(),
                ),
            },
            _ => Values::Virtual(fragment.len()),
        };
        let (epoch, op) = (start.epoch, start.op);
        let rings = match ShardRings::new(
            start,
            self.cfg.id,
            self.cfg.codec,
            values,
            self.cfg.segment,
        ) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(target: "loco_core", "{}: cannot start the all-reduce: {}", self.cfg.id, e.source);
                let _ = self.member.report_allreduce_failed(now, epoch, op);
                return;
            }
        };
        let modelled =
            self.cfg.modelled_collectives && !rings.is_real() && rings.start().ring.len() > 1;
        if modelled {
            let m = ModelledAllReduce { start: rings.start().clone(), shards: rings.plan() };
            self.effects.push_back(Effect::ModelledAllReduce(m));
        }
        let r = Reducing { rings, failed: false, modelled, modelled_done: false };
        self.work = Work::Reducing(Box::new(r));
        // Frames that arrived before this node's release (a neighbour started first).
        let early = self.inbox.take_for((epoch, op));
        self.held.extend(early);
        self.drive_rings(now);
    }

    /// Feeds the held frames, drains the rings' sends and finishes the attempt when it is done.
    fn drive_rings(&mut self, now: Time) {
        if self.suspended || !matches!(self.work, Work::Reducing(_)) {
            return;
        }
        while let Some((from, f)) = self.held.pop_front() {
            self.feed(now, from, f);
            if !matches!(self.work, Work::Reducing(_)) {
                return;
            }
        }
        let Work::Reducing(r) = &mut self.work else { return };
        if r.modelled {
            if r.modelled_done && !r.failed && r.rings.complete_virtual() {
                let s = r.rings.stats();
                self.bytes_sent += s.body_bytes_sent + s.frames_sent * HEADER_WIRE_BYTES;
            }
        } else {
            while let Some(t) = r.rings.poll_send() {
                self.transmits.push_back(t);
            }
        }
        if r.failed || !r.rings.is_done() {
            return;
        }
        let Work::Reducing(r) = std::mem::replace(&mut self.work, Work::Idle) else { return };
        let s = r.rings.start().clone();
        if s.ring.len() > 1 {
            let what = format!("outer step {} attempt {} ({})", s.outer_step, s.attempt, s.epoch);
            let c = Check::AllReduceWeights {
                what,
                sums: r.rings.weight_sums().to_vec(),
                total: f64::from(s.total_weight),
            };
            self.effects.push_back(Effect::Check(c));
        }
        if let Err(e) = self.member.report_allreduce_done(now, s.epoch, s.op) {
            tracing::debug!(target: "loco_core", "{}: done refused: {e}", self.cfg.id);
        }
        // Virtual values reduce to an empty average (the step is counted all the same).
        let average = Some(r.rings.into_values().unwrap_or_default());
        self.work = Work::Reduced { epoch: s.epoch, op: s.op, average };
    }

    /// One collective frame through the inbox into the running rings.
    fn feed(&mut self, now: Time, from: NodeId, f: Frame) {
        let running = match &self.work {
            Work::Reducing(r) => Some(r.rings.collective()),
            _ => None,
        };
        let f = match self.inbox.admit(self.member.epoch(), running, from, f) {
            Admission::Feed(f) => f,
            Admission::Stale => {
                self.effects.push_back(Effect::Check(Check::StaleFrame));
                return;
            }
            Admission::Held | Admission::Refused | Admission::Dropped => return,
        };
        let Work::Reducing(r) = &mut self.work else { return };
        if let Err(e) = r.rings.handle_frame(from, &f) {
            let (epoch, op) = r.rings.collective();
            let first = !r.failed;
            r.failed = true;
            self.violation(Violation::RingRefused { epoch, op, from, error: e.to_string() });
            if first {
                let _ = self.member.report_allreduce_failed(now, epoch, op);
            }
        }
    }

    /// Checks the release against what this node knows: the ring is the epoch's membership (for
    /// the executor's check), and its weight is 1 exactly when it holds a pseudo-gradient.
    fn check_release(&mut self, s: &AllReduceStart) {
        let c = Check::View { epoch: s.epoch, members: s.ring.clone(), what: "release" };
        self.effects.push_back(Effect::Check(c));
        let holds =
            self.grad_step == Some(s.outer_step) && self.member.withheld() != Some(s.outer_step);
        let w = s.weight.get();
        if (w == 1.0) != holds || (w != 0.0 && w != 1.0) {
            let v = Violation::WrongWeight {
                weight: w,
                outer_step: s.outer_step,
                attempt: s.attempt,
                holds,
            };
            self.violation(v);
        }
    }

    // ----- live recovery -----

    fn state_rule(&self, to: NodeId) -> PieceRule {
        match &self.cfg.state_pieces {
            StatePieces::Clamped => PieceRule::Clamped,
            StatePieces::PerJoinerShard { shards } => {
                let g = u64::from(shards.get(&to).copied().unwrap_or(1).max(1));
                PieceRule::Count(g.saturating_mul(self.cfg.mesh.state_senders.max(1) as u64))
            }
        }
    }

    /// Sends this node's share of its state to a joiner (see [`share_of`]): in blocking mode the
    /// senders share out the replicated part's pieces; in non-blocking mode each sends a whole
    /// copy of its latest state. The first sender also sends the own part.
    fn send_state(&mut self, epoch: Epoch, to: NodeId, senders: &[NodeId]) {
        self.serving.insert(to, Serving { epoch, senders: senders.to_vec(), asks: 0 });
        self.prepare_state(epoch, to, senders, None);
    }

    /// Answers the joiners' asks for pieces (once the outer state is here to snapshot): a
    /// joiner this node sends to, under the assignment it sends under, within [`MAX_ASKS`]
    /// and [`StateAsk::MAX_RANGES`]; other asks are dropped.
    fn answer_asks(&mut self) {
        while self.outer.is_some() {
            let Some((from, ask)) = self.asked.pop_front() else { return };
            let me = self.cfg.id;
            let Some(s) = self.serving.get_mut(&from) else {
                tracing::debug!(target: "loco_core", "{me}: dropped an ask from {from}, which it does not send to");
                continue;
            };
            let (n, bad) = (ask.ranges.len(), ask.epoch != s.epoch);
            if bad || n == 0 || n > StateAsk::MAX_RANGES || s.asks >= MAX_ASKS {
                tracing::debug!(target: "loco_core", "{me}: dropped an ask from {from} ({n} ranges, epoch {}, asks {})", ask.epoch, s.asks);
                continue;
            }
            s.asks += 1;
            let senders = s.senders.clone();
            tracing::info!(target: "loco_core", "{me}: {from} asks again for {n} range(s) of its state");
            self.prepare_state(ask.epoch, from, &senders, Some(ask.ranges));
        }
    }

    /// Prepares this node's share of its state for `to` (only the pieces overlapping `only`).
    fn prepare_state(
        &mut self,
        epoch: Epoch,
        to: NodeId,
        senders: &[NodeId],
        only: Option<Vec<(u32, u64, u64)>>,
    ) {
        let Some(share) = share_of(senders, self.cfg.id, self.blocking()) else {
            tracing::debug!(target: "loco_core", "{}: not among the senders to {to}", self.cfg.id);
            return;
        };
        let (Some(key), Some(outer)) = (self.snapshot_key(), &self.outer) else { return };
        let known = self.digest_cache.as_ref().filter(|(k, _)| *k == key).map(|(_, d)| d.clone());
        let job = StateJob {
            epoch,
            to,
            share,
            rule: self.state_rule(to),
            outer_step: outer.steps(),
            shared: self.real.then(|| SharedState::from_outer(outer)),
            virtual_lens: virtual_part_lens(self.params()),
            only,
            key: Some(key),
            known,
            ahead: false,
        };
        self.effects.push_back(Effect::PrepareState(job));
    }

    /// `FetchState`: a new fetch (the pieces that came before it are fed), or new senders for
    /// the one under way (one died: every piece already held is kept).
    fn fetch_state(&mut self, epoch: Epoch, senders: Vec<NodeId>, now: Time) {
        let (kept, refused) = match &mut self.fetch {
            Some(f) => {
                let r = f.assembly.reassign(epoch, senders.clone());
                (Some(r.kept_bytes), r.fed.refused)
            }
            None => {
                let expect = match self.real {
                    true => Expect::real(self.params_len(), self.cfg.own_max),
                    false => Expect::virtual_params(self.params()),
                };
                let mut assembly =
                    StateAssembly::new(epoch, senders.clone(), self.blocking(), expect);
                // A blocking joiner computes nothing until the state is here, which replaces
                // its outer state: the state is written into that state's buffers, not into
                // memory allocated for it (given back should the fetch end without it).
                if self.real && self.blocking() && !self.synced {
                    if let Some([o, m]) = self.outer.as_mut().and_then(OuterState::take_buffers) {
                        assembly.lend(o, m);
                    }
                }
                let fed = assembly.feed(&mut self.early);
                self.fetch = Some(Fetch {
                    assembly,
                    log: ReplayLog::default(),
                    verifying: false,
                    ask_at: None,
                    asks: 0,
                });
                (None, fed.refused)
            }
        };
        let ev = NodeEvent::RecoveryStart { epoch, senders, kept_bytes: kept };
        self.effects.push_back(Effect::Event(ev));
        for r in refused {
            self.refused(None, r);
        }
        if matches!(self.member.phase(), MemberPhase::Syncing { .. }) {
            if let Some(a) = &mut self.acct {
                a.enter(Span::Recovery, now);
            }
        }
        self.take_state(now);
    }

    /// A state piece: into the fetch's assembly, or held until the `FetchState` (the
    /// coordinator tells the senders and this node separately).
    fn on_state_part(&mut self, now: Time, from: NodeId, h: StateHeader, body: Body) {
        let Some(f) = &mut self.fetch else {
            if !self.synced {
                if let Err(r) = self.early.hold(from, h, body) {
                    tracing::debug!(target: "loco_core", "{}: early state piece dropped: {r}", self.cfg.id);
                }
            }
            return;
        };
        match f.assembly.put(from, &h, &body) {
            Ok(p) => {
                if matches!(p, Progress::Stored { .. }) {
                    f.ask_at = Some(now + self.cfg.mesh.state_resend_after);
                }
                if p.is_complete() {
                    f.ask_at = None;
                    self.take_state(now);
                }
            }
            Err(r) => {
                // A piece damaged on its way is asked for again at once, from its senders.
                if let Refused::PieceDigest { part, offset, len } = r {
                    self.ask(now, vec![(part, offset, offset.saturating_add(len))]);
                }
                self.refused(Some(from), r);
            }
        }
    }

    /// Asks the current senders for the pieces the fetch lacks (each sends those of its
    /// share), and again after twice the wait, up to [`MAX_ASKS`] times.
    fn ask_missing(&mut self, now: Time) {
        let Some(f) = &mut self.fetch else { return };
        f.ask_at = None;
        let ranges = f.assembly.missing();
        self.ask(now, ranges);
    }

    /// Asks the current senders for `ranges` (each sends the pieces of its share that overlap
    /// them), and for what is missing again after twice the wait, up to [`MAX_ASKS`] times.
    fn ask(&mut self, now: Time, ranges: Vec<(u32, u64, u64)>) {
        let Some(f) = &mut self.fetch else { return };
        if ranges.is_empty() || f.verifying || f.asks >= MAX_ASKS {
            return;
        }
        f.asks += 1;
        let wait = self.cfg.mesh.state_resend_after.saturating_mul(1 << f.asks.min(16));
        f.ask_at = Some(now + wait);
        let (epoch, senders) = (f.assembly.epoch(), f.assembly.senders().to_vec());
        tracing::info!(target: "loco_core", "{}: asks {senders:?} again for {} range(s) of its state", self.cfg.id, ranges.len());
        for s in senders {
            let ask = StateAsk { epoch, ranges: ranges.clone() };
            let frame = Frame { header: Header::StateAsk(ask), body: Body::Bytes(Bytes::new()) };
            self.transmits.push_back((s, frame));
        }
    }

    /// A piece refused: a violation when a sender or the grid is at fault, else a late piece.
    fn refused(&mut self, from: Option<NodeId>, r: Refused) {
        if !is_fault(&r) {
            tracing::debug!(target: "loco_core", "{}: state piece refused: {r}", self.cfg.id);
            return;
        }
        self.violation(Violation::PieceRefused { from, refused: r });
    }

    /// Hands a complete state to the executor for verification (one at a time).
    fn take_state(&mut self, _now: Time) {
        if self.outer.is_none() {
            return; // taken when the outer state is back
        }
        // The model's count: the outer state's buffers may be lent to the fetch.
        let params = self.params_len();
        let Some(f) = &mut self.fetch else { return };
        if f.verifying {
            return;
        }
        let Some(received) = f.assembly.take_complete() else { return };
        f.verifying = true;
        self.effects.push_back(Effect::VerifyState { received, params });
    }

    /// Takes a verified state: the outer state from it, the steps committed here meanwhile
    /// replayed onto it (non-blocking mode), this step's pseudo-gradient carried over.
    fn install(&mut self, now: Time, v: Verified) {
        let Some(f) = self.fetch.take() else { return };
        let Some(current) = self.outer.as_mut() else {
            self.fetch = Some(f);
            self.verified = Some(v);
            return;
        };
        self.early.clear();
        self.digest_cache = None;
        let cfg = current.config();
        let restored = match (v.shared, self.real) {
            (Some(s), true) => s.into_outer(cfg, Vec::new()).map_err(|e| e.to_string()),
            (None, false) => {
                OuterState::restore(cfg, Vec::new(), Vec::new(), Vec::new(), v.outer_step)
                    .map_err(|e| e.to_string())
            }
            (Some(_), false) => Err("bytes where virtual numerics expect none".to_owned()),
            (None, true) => Err("no bytes where real numerics expect them".to_owned()),
        };
        let replayed = restored.and_then(|mut outer| {
            let n = f.log.replay_onto(&mut outer).map_err(|e| e.to_string())?;
            Ok((outer, n))
        });
        let (mut outer, replayed) = match replayed {
            Ok(x) => x,
            Err(error) => {
                self.violation(Violation::StateUnusable { outer_step: v.outer_step, error });
                return;
            }
        };
        // The pseudo-gradient of the step under way carries over to the received state.
        let g = current.take_pseudo_gradient();
        if g.len() == outer.len() {
            let _ = outer.put_pseudo_gradient(g);
        }
        let weights = self.real.then(|| crate::node::digest::weights_digest(outer.outer()));
        *current = outer;
        self.set_params();
        self.synced = true;
        self.digest_ahead();
        let ev = NodeEvent::RecoveryDone {
            epoch: f.assembly.epoch(),
            bytes: v.bytes,
            from: v.own_from,
            outer_step: v.outer_step,
            weights,
            replayed,
        };
        self.effects.push_back(Effect::Event(ev));
        if matches!(self.member.phase(), MemberPhase::Syncing { .. }) {
            if let Some(a) = &mut self.acct {
                a.enter(Span::Barrier, now);
            }
            if let Err(e) = self.member.report_sync_done(now) {
                tracing::debug!(target: "loco_core", "{}: sync report refused: {e}", self.cfg.id);
            }
        } else {
            self.report_sync = true;
        }
    }
}

/// Whether a refusal means that a sender (or the piece grid) is wrong, rather than a piece that
/// was merely overtaken: a late piece of a dropped sender, of an older copy or an older fetch.
pub fn is_fault(r: &Refused) -> bool {
    !matches!(
        r,
        Refused::NotAssigned { .. }
            | Refused::OldEpoch { .. }
            | Refused::StaleDigest { .. }
            | Refused::HoldingFull { .. }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::state::{PART_SHARED, encoded_len};

    #[test]
    fn only_faults_of_a_sender_or_the_grid_are_violations() {
        assert!(!is_fault(&Refused::NotAssigned { from: NodeId(1), part: 0 }));
        assert!(!is_fault(&Refused::StaleDigest { part: 0, got: 1, held: 2 }));
        assert!(!is_fault(&Refused::OldEpoch { got: Epoch(1), first: Epoch(2) }));
        assert!(is_fault(&Refused::Overlap { part: 0, offset: 0, len: 1 }));
        assert!(is_fault(&Refused::UnexpectedBytes));
    }

    fn node(id: u32) -> Node {
        let cfg = NodeConfig {
            id: NodeId(id),
            mesh: MeshConfig::default(),
            shards: 1,
            codec: CodecKind::Fp32,
            segment: None,
            outer: OuterConfig::default(),
            numerics: Numerics::Real { initial: vec![0.5; 1000] },
            inner_steps: 10,
            schedule: Schedule::sync(1000),
            batch_tokens: 100,
            checkpoint_every: None,
            state_pieces: StatePieces::Clamped,
            own_max: 0,
            row: RowIdentity { node: format!("n{id}"), node_id: id, offset_s: 0.0 },
            virtual_padding: false,
            modelled_collectives: false,
        };
        Node::new(cfg, 1).unwrap()
    }

    fn ask(n: &mut Node, from: u32, epoch: u64, ranges: Vec<(u32, u64, u64)>) -> Vec<StateJob> {
        let header = Header::StateAsk(StateAsk { epoch: Epoch(epoch), ranges });
        n.handle_frame(Time::ZERO, NodeId(from), Frame { header, body: Body::Bytes(Bytes::new()) });
        std::iter::from_fn(|| n.poll_effect())
            .filter_map(|e| match e {
                Effect::PrepareState(job) => Some(job),
                _ => None,
            })
            .collect()
    }

    /// A joiner's ask is answered only by a node that sends to it, under that assignment,
    /// within the bounds on ranges and asks, and only with the pieces asked for.
    #[test]
    fn asks_are_answered_only_for_a_joiner_served_and_within_bounds() {
        let mut n = node(1);
        let whole = vec![(PART_SHARED, 0, u64::MAX)];
        assert!(ask(&mut n, 7, 3, whole.clone()).is_empty(), "it sends to nobody");
        n.send_state(Epoch(3), NodeId(7), &[NodeId(1), NodeId(2)]);
        assert!(matches!(n.poll_effect(), Some(Effect::PrepareState(j)) if j.only.is_none()));
        assert!(ask(&mut n, 8, 3, whole.clone()).is_empty(), "another joiner");
        assert!(ask(&mut n, 7, 4, whole.clone()).is_empty(), "another assignment");
        assert!(ask(&mut n, 7, 3, Vec::new()).is_empty(), "no range");
        let many = vec![(PART_SHARED, 0, 1); StateAsk::MAX_RANGES + 1];
        assert!(ask(&mut n, 7, 3, many).is_empty(), "too many ranges");
        let some = vec![(PART_SHARED, 100, 200)];
        for _ in 0..MAX_ASKS {
            let jobs = ask(&mut n, 7, 3, some.clone());
            assert_eq!(jobs.len(), 1);
            assert_eq!(jobs[0].only.as_deref(), Some(some.as_slice()));
            assert_eq!((jobs[0].to(), jobs[0].epoch), (NodeId(7), Epoch(3)));
        }
        assert!(ask(&mut n, 7, 3, some).is_empty(), "beyond the asks an assignment allows");
    }

    /// A synced node digests its snapshot ahead of any joiner (nothing is sent); a joiner's
    /// job of that snapshot then hashes nothing of the replicated part, and its pieces carry
    /// the digests computed ahead. Once is enough per snapshot; an outer step makes another.
    #[test]
    fn the_snapshot_is_digested_ahead_and_a_joiners_job_hashes_nothing_again() {
        let mut n = node(1);
        n.digest_ahead();
        assert!(n.poll_effect().is_none(), "not synced: nothing to send anyone");
        n.synced = true;
        n.digest_ahead();
        let Some(Effect::PrepareState(job)) = n.poll_effect() else { panic!("a job ahead") };
        assert!(job.ahead);
        let p = job.prepare(None);
        assert_eq!(p.bytes(), encoded_len(1000), "the replicated part, hashed");
        assert_eq!(p.frames().count(), 0);
        let ahead = p.shared_digests().expect("real bytes").1;
        n.state_prepared(Time::ZERO, p);
        assert!(n.transmits.is_empty());
        n.digest_ahead();
        assert!(n.poll_effect().is_none(), "digested already");
        n.send_state(Epoch(3), NodeId(7), &[NodeId(1)]);
        let Some(Effect::PrepareState(j)) = n.poll_effect() else { panic!("a job") };
        let p = j.prepare(None);
        assert_eq!(p.bytes(), 0, "nothing hashed before the first piece (an empty own part)");
        let frames: Vec<_> = p.frames().collect();
        for f in &frames {
            let (Header::State(h), Body::Bytes(b)) = (&f.header, &f.body) else { panic!() };
            if h.part == PART_SHARED {
                assert_eq!(h.digest, ahead.digest);
                assert_eq!(h.piece, crate::node::state::piece_digest(b));
            }
        }
        assert!(frames.len() > 1);
        if let Some(o) = n.outer.as_mut() {
            o.apply_outer_step();
        }
        n.digest_ahead();
        assert!(matches!(n.poll_effect(), Some(Effect::PrepareState(j)) if j.ahead));
    }

    /// A resend of the same snapshot reuses the digest the first preparation computed (the
    /// whole part is not hashed again for a few pieces); an outer step makes a new snapshot.
    #[test]
    fn a_resend_of_the_same_snapshot_reuses_its_digest() {
        let mut n = node(1);
        n.send_state(Epoch(3), NodeId(7), &[NodeId(1)]);
        let Some(Effect::PrepareState(first)) = n.poll_effect() else { panic!("a job") };
        assert!(first.known.is_none());
        let p = first.prepare(None);
        let digests = p.shared_digests().expect("real bytes").1;
        let digest = digests.digest.clone();
        n.state_prepared(Time::ZERO, p);
        let again = ask(&mut n, 7, 3, vec![(PART_SHARED, 0, 10)]);
        assert_eq!(again[0].known.as_ref(), Some(&digests));
        let frames: Vec<_> = again.into_iter().next().unwrap().prepare(None).frames().collect();
        assert!(!frames.is_empty());
        for f in &frames {
            let Header::State(h) = &f.header else { panic!("a state frame") };
            assert!(h.part != PART_SHARED || h.digest == digest);
        }
        // After an outer step the snapshot is another: its digest is computed afresh.
        if let Some(o) = n.outer.as_mut() {
            o.apply_outer_step();
        }
        let fresh = ask(&mut n, 7, 3, vec![(PART_SHARED, 0, 10)]);
        assert!(fresh[0].known.is_none());
    }
}
