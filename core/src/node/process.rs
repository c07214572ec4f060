//! The process around a node: what a supervisor decides, once for every executor.
//!
//! A [`Node`] is one membership: it joins, trains, and stops (evicted, cut off from the
//! coordinator, left, or the run ended). A [`Process`] owns the node across its memberships:
//!
//! - **incarnations**: the process's incarnation `p` numbers its memberships `p << 16 | n`
//!   (`n` = 0 for the first, then 1, 2, ...), so that every later membership of the node, in
//!   this process or a restarted one, has a larger incarnation than every earlier one;
//! - **the rejoin policy**: a membership that stopped with `rejoin` (an eviction, a lost
//!   coordinator) is followed by a new one after a heartbeat interval: after at most
//!   [`MAX_REJOINS`] evictions per process (a node the mesh keeps evicting stops), and while the
//!   coordinator has been lost for less than the mesh's `rejoin_for` (a member keeps its
//!   membership through a silence of the coordinator until `rejoin_for`; past it, the
//!   coordinator is taken for dead: the process ends and the run resumes from checkpoints);
//! - **exit timing**: the process ends [`EXIT_GRACE`] after its last membership stopped, for the
//!   last frames (the deathrattle) to leave;
//! - **the stop rows** a node writes to `events.csv` ([`StopRow`]);
//! - **the fault phase of frames** ([`fault_phase`]): where an armed crash strikes;
//! - **one ordered output queue** ([`Process::poll`]): what the process itself decided (a new
//!   membership, the end), then the machine's effects, then its transmits, repeated until both
//!   are empty, then the membership's stop.
//!
//! Network inputs that arrive between two memberships are addressed to the one that stopped
//! (nobody knows the next one before it asks to join) and are dropped: a late `Evicted` answering
//! the old member's last heartbeat must not stop the new one.
//!
//! ```text
//! let mut p = Process::new(cfg, incarnation)?;
//! p.start(now)?;
//! loop {
//!     while let Some(out) = p.poll(now) {
//!         match out { Effect(e) => carry out e, Transmit(to, f) => send f,
//!                     Stopped(s) => drop the work in flight, write s.row, keep the state if
//!                                   s.holds_state, Restarted { .. } => note it, Exit => end }
//!     }
//!     sleep until p.poll_timeout() or an input; feed it (p.handle_frame, p.handle_timeout,
//!     p.node_mut().computed(..), ...)
//! }
//! ```

use crate::diloco::DilocoError;
use crate::ids::{Epoch, NodeId};
use crate::mesh::{LeaveReason, MeshError, StopReason};
use crate::metrics::EventKind;
use crate::node::events::stop_kind;
use crate::node::machine::{Effect, Node, NodeConfig, NodeEvent};
use crate::scenario::FaultPhase;
use crate::time::Time;
use crate::transport::{Frame, Header, Phase};
use std::collections::VecDeque;
use std::time::Duration;

/// How long a process lives on after its last membership stopped, for its last frames (the
/// deathrattle) to leave.
pub const EXIT_GRACE: Duration = Duration::from_millis(100);
/// Evictions a process rejoins after, at most.
pub const MAX_REJOINS: u64 = 32;
/// Memberships one process numbers (`p << 16 | n`, `n` below this).
const MAX_SESSIONS: u64 = 0xFFFF;
/// The phase of a node's outer step that sending `header` belongs to, where a crash armed for
/// that phase strikes (`None`: membership and state requests, which belong to none).
pub fn fault_phase(header: &Header) -> Option<FaultPhase> {
    match header {
        Header::Collective(h) if h.phase == Phase::AllGather => Some(FaultPhase::AllGather),
        Header::Collective(_) => Some(FaultPhase::ReduceScatter),
        Header::State(_) => Some(FaultPhase::StateSend),
        Header::Mesh(_) | Header::StateAsk(_) => None,
    }
}

/// The row a node writes to `events.csv` when its membership stops.
#[derive(Clone, Debug, PartialEq)]
pub struct StopRow {
    /// `evict`, `leave` or `stop`.
    pub kind: EventKind,
    /// The member's epoch, for an eviction.
    pub epoch: Option<Epoch>,
    /// Why, in words.
    pub detail: String,
}

/// A membership stopped.
#[derive(Clone, Debug, PartialEq)]
pub struct Stopped {
    /// Why.
    pub reason: StopReason,
    /// A new membership follows ([`Output::Restarted`]); otherwise the process ends
    /// ([`Output::Exit`]).
    pub rejoin: bool,
    /// What the node writes to `events.csv` (`None`: the machine already wrote it, as for a lost
    /// coordinator, once per loss).
    pub row: Option<StopRow>,
    /// The node holds the mesh's training state: a backend that writes checkpoints keeps its
    /// last commit (an evicted node, or one that never received the state, has nothing to keep).
    pub holds_state: bool,
}

/// One output of a [`Process`], in the order the executor carries them out.
#[derive(Debug)]
pub enum Output {
    /// An effect of the machine (never [`Effect::Stop`]: that is [`Output::Stopped`]).
    Effect(Effect),
    /// A frame to send.
    Transmit(NodeId, Frame),
    /// The membership stopped: the executor drops (or collects) the work it ran for it.
    Stopped(Stopped),
    /// A new membership of this incarnation joined (its work starts from nothing).
    Restarted {
        /// Its incarnation.
        incarnation: u64,
        /// Why the last one stopped.
        after: StopReason,
    },
    /// The process ends now.
    Exit,
}

/// A process could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// The node's outer state.
    #[error(transparent)]
    Diloco(#[from] DilocoError),
    /// The incarnation leaves no room for the memberships' numbers.
    #[error("incarnation {0} is above {max}, which leaves no room for its memberships' numbers", max = u64::MAX >> 16)]
    Incarnation(u64),
}

#[derive(Debug)]
enum Life {
    /// A member runs.
    Member,
    /// Between two memberships: the next joins at `restart_at` (`None` while the node hangs).
    Waiting { restart_at: Option<Time>, after: StopReason },
    /// The last membership stopped: the process ends at `at`.
    Exiting { at: Time },
    /// It ended.
    Exited,
}

/// The process around a node. See the module documentation.
pub struct Process {
    node: Node,
    /// The process's incarnation (`p` of `p << 16 | n`).
    base: u64,
    /// Memberships started after the first.
    session: u64,
    /// Evictions so far.
    evictions: u64,
    life: Life,
    /// The node's application side hangs (its heartbeats go on).
    hung: bool,
    /// The process was asked to leave: its next stop is its last.
    leaving: bool,
    /// Since when the coordinator has been lost (reset by an admission).
    lost_since: Option<Time>,
    /// The machine's stop, carried out once its queues are empty.
    stop: Option<(StopReason, bool)>,
    /// The output queue is on the machine's transmits (else on its effects).
    on_transmits: bool,
    /// The process's own outputs, after the machine's.
    out: VecDeque<Output>,
    /// Network inputs dropped between memberships.
    dropped: u64,
}

impl Process {
    /// A process of incarnation `incarnation` around a node made from `cfg`; its first
    /// membership is `incarnation << 16`.
    pub fn new(cfg: NodeConfig, incarnation: u64) -> Result<Process, ProcessError> {
        if incarnation > u64::MAX >> 16 {
            return Err(ProcessError::Incarnation(incarnation));
        }
        let node = Node::new(cfg, incarnation << 16)?;
        Ok(Process {
            node,
            base: incarnation,
            session: 0,
            evictions: 0,
            life: Life::Member,
            hung: false,
            leaving: false,
            lost_since: None,
            stop: None,
            on_transmits: false,
            out: VecDeque::new(),
            dropped: 0,
        })
    }

    /// The node of the current (or last) membership.
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// The node, for the completions of the work the executor ran for it.
    pub fn node_mut(&mut self) -> &mut Node {
        &mut self.node
    }

    /// The process's incarnation.
    pub fn base_incarnation(&self) -> u64 {
        self.base
    }

    /// The incarnation of the current (or last) membership.
    pub fn incarnation(&self) -> u64 {
        (self.base << 16) | self.session
    }

    /// Memberships started after the first.
    pub fn rejoins(&self) -> u64 {
        self.session
    }

    /// A member runs (not between memberships, not ending).
    pub fn is_member(&self) -> bool {
        matches!(self.life, Life::Member)
    }

    /// The process ended ([`Output::Exit`] was given).
    pub fn has_exited(&self) -> bool {
        matches!(self.life, Life::Exited)
    }

    /// The node hangs ([`suspend`](Self::suspend)).
    pub fn is_hung(&self) -> bool {
        self.hung
    }

    /// Network inputs dropped between memberships (addressed to a stopped one).
    pub fn dropped_inputs(&self) -> u64 {
        self.dropped
    }

    /// Starts the first membership: asks to join.
    pub fn start(&mut self, now: Time) -> Result<(), MeshError> {
        self.node.join(now)
    }

    /// A frame from `from`.
    pub fn handle_frame(&mut self, now: Time, from: NodeId, frame: Frame) {
        match &mut self.life {
            Life::Member => self.node.handle_frame(now, from, frame),
            Life::Waiting { .. } => self.dropped += 1,
            Life::Exiting { .. } | Life::Exited => {}
        }
    }

    /// The transport cannot reach `peer`.
    pub fn peer_unreachable(&mut self, now: Time, peer: NodeId) {
        match &mut self.life {
            Life::Member => self.node.peer_unreachable(now, peer),
            Life::Waiting { .. } => self.dropped += 1,
            Life::Exiting { .. } | Life::Exited => {}
        }
    }

    /// The executor's model of the all-reduce `(epoch, op)` says it is done here (a stopped
    /// membership's is dropped).
    pub fn allreduce_modelled(&mut self, now: Time, epoch: Epoch, op: u64) {
        if self.is_member() {
            self.node.allreduce_modelled(now, epoch, op);
        }
    }

    /// When [`handle_timeout`](Self::handle_timeout) is next due (`None`: not before an input).
    pub fn poll_timeout(&self) -> Option<Time> {
        match &self.life {
            Life::Member => self.node.poll_timeout(),
            Life::Waiting { restart_at, .. } => *restart_at,
            Life::Exiting { at } => Some(*at),
            Life::Exited => None,
        }
    }

    /// The deadline came (an early call is a harmless no-op): the machine's timers, the next
    /// membership, or the end of the process.
    pub fn handle_timeout(&mut self, now: Time) {
        match &self.life {
            Life::Member => self.node.handle_timeout(now),
            Life::Waiting { restart_at: Some(t), .. } if now >= *t => self.restart(now),
            Life::Exiting { at } if now >= *at => {
                self.life = Life::Exited;
                self.out.push_back(Output::Exit);
            }
            Life::Waiting { .. } | Life::Exiting { .. } | Life::Exited => {}
        }
    }

    /// The process is asked to leave (a signal, or the scenario's `leave`): a member sends its
    /// deathrattle and stops; between memberships the process stops at once.
    pub fn leave(&mut self, now: Time, reason: LeaveReason) {
        self.leaving = true;
        match &self.life {
            Life::Member => self.node.leave(now, reason),
            Life::Waiting { .. } => {
                let reason = StopReason::Left(reason);
                let row = Self::row(&reason, None);
                self.out.push_back(Output::Stopped(Stopped {
                    reason,
                    rejoin: false,
                    row,
                    holds_state: false,
                }));
                self.life = Life::Exiting { at: now + EXIT_GRACE };
            }
            Life::Exiting { .. } | Life::Exited => {}
        }
    }

    /// The node's application side stops while its heartbeats go on (a hung kernel): the
    /// member's collective work waits, and no new membership starts before
    /// [`resume`](Self::resume).
    pub fn suspend(&mut self, now: Time) {
        self.hung = true;
        if self.is_member() {
            self.node.suspend(now);
        }
    }

    /// The application side goes on after [`suspend`](Self::suspend); a membership waiting for
    /// it starts a heartbeat interval later.
    pub fn resume(&mut self, now: Time) {
        self.hung = false;
        let after = self.node.config().mesh.heartbeat_interval;
        match &mut self.life {
            Life::Member => self.node.resume(now),
            Life::Waiting { restart_at, .. } => {
                if restart_at.is_none() {
                    *restart_at = Some(now + after);
                }
            }
            Life::Exiting { .. } | Life::Exited => {}
        }
    }

    /// The next output, in order (`None`: nothing until the next input). Call after every input
    /// until it gives `None`.
    pub fn poll(&mut self, now: Time) -> Option<Output> {
        if let Some(o) = self.out.pop_front() {
            return Some(o);
        }
        if let Some(o) = self.machine_output() {
            return Some(o);
        }
        let (reason, rejoin) = self.stop.take()?;
        Some(Output::Stopped(self.stopped(now, reason, rejoin)))
    }

    /// The machine's effects, then its transmits, until both are empty in one round.
    fn machine_output(&mut self) -> Option<Output> {
        for _ in 0..3 {
            if self.on_transmits {
                if let Some((to, frame)) = self.node.poll_transmit() {
                    return Some(Output::Transmit(to, frame));
                }
            } else {
                while let Some(e) = self.node.poll_effect() {
                    match e {
                        Effect::Stop { reason, rejoin } => self.stop = Some((reason, rejoin)),
                        e => {
                            if let Effect::Event(NodeEvent::Admitted { .. }) = &e {
                                self.lost_since = None;
                            }
                            return Some(Output::Effect(e));
                        }
                    }
                }
            }
            self.on_transmits = !self.on_transmits;
        }
        // Both queues are empty: the next input's outputs start with effects.
        self.on_transmits = false;
        None
    }

    /// The membership stopped for `reason`; `rejoin`: the machine would join again.
    fn stopped(&mut self, now: Time, reason: StopReason, rejoin: bool) -> Stopped {
        let rejoin = rejoin && !self.leaving && self.may_rejoin(now, &reason);
        let epoch = self.node.member().epoch();
        let row = Self::row(&reason, epoch);
        let holds_state = self.node.is_synced()
            && !matches!(
                reason,
                StopReason::Evicted(_) | StopReason::NoSyncedMember { synced: false, .. }
            );
        self.life = if rejoin {
            let after = self.node.config().mesh.heartbeat_interval;
            Life::Waiting { restart_at: (!self.hung).then(|| now + after), after: reason.clone() }
        } else {
            Life::Exiting { at: now + EXIT_GRACE }
        };
        Stopped { reason, rejoin, row, holds_state }
    }

    /// The row of a stop for `reason` (`epoch`: the member's).
    fn row(reason: &StopReason, epoch: Option<Epoch>) -> Option<StopRow> {
        let kind = stop_kind(reason);
        // The machine wrote the loss of the coordinator (once per loss).
        if kind == EventKind::CoordinatorLost {
            return None;
        }
        let epoch = matches!(reason, StopReason::Evicted(_)).then_some(epoch).flatten();
        Some(StopRow { kind, epoch, detail: reason.to_string() })
    }

    /// Whether a membership that stopped for `reason` is followed by another.
    fn may_rejoin(&mut self, now: Time, reason: &StopReason) -> bool {
        if self.session >= MAX_SESSIONS {
            tracing::warn!(node = %self.node.id(), "not joining again: {MAX_SESSIONS} memberships in this process");
            return false;
        }
        if let StopReason::Evicted(_) = reason {
            self.evictions += 1;
            if self.evictions > MAX_REJOINS {
                tracing::warn!(node = %self.node.id(), "not joining again: evicted {} times", self.evictions);
                return false;
            }
        }
        if let StopReason::CoordinatorLost { silent_for, .. } = reason {
            // A member waits for a silent coordinator until `rejoin_for` before it stops; a
            // stop before that was a coordinator that answered "not a member" (restarted, or it
            // evicted this node meanwhile): join it, for at most `rejoin_for` in all.
            let since = *self.lost_since.get_or_insert(now);
            let bound = self.node.config().mesh.rejoin_for;
            if *silent_for >= bound || now - since >= bound {
                tracing::warn!(node = %self.node.id(), "not joining again: the coordinator is gone");
                return false;
            }
        }
        true
    }

    /// A new membership: a new incarnation joins.
    fn restart(&mut self, now: Time) {
        let Life::Waiting { after, .. } = std::mem::replace(&mut self.life, Life::Member) else {
            return;
        };
        self.session += 1;
        let incarnation = self.incarnation();
        self.node.restart(incarnation);
        if let Err(e) = self.node.join(now) {
            tracing::warn!(node = %self.node.id(), "join refused: {e}");
        }
        if self.hung {
            // A hang that began while it waited: the new member's application side waits too.
            self.node.suspend(now);
        }
        self.out.push_back(Output::Restarted { incarnation, after });
    }
}

#[cfg(test)]
mod tests;
