//! The ElasticDeviceMesh: membership that changes without a restart.
//!
//! Two sans-IO state machines speak the typed protocol [`MeshMsg`] over any
//! [`Transport`](crate::transport::Transport): one [`Coordinator`] and one [`Member`] per node.
//! Neither owns a socket, a clock or a thread. In quinn's naming scheme, each has
//!
//! - `handle_message(now, from, msg)` and `handle_timeout(now)` for events (an early
//!   `handle_timeout` is a harmless no-op),
//! - commands from the application ([`Member::barrier_arrive`], [`Member::leave`],
//!   [`Member::report_allreduce_done`], ...),
//! - `poll_action()` for outputs ([`MemberAction`], [`CoordinatorAction`]), to be drained after
//!   every call, in order, and `poll_timeout()` for the next deadline.
//!
//! The backends (the simulator, the real TCP backend, the in-memory harness in
//! `loco_core::testing`) only execute actions and report back. The coordinator's decisions are
//! one pure function, [`decide`]`(now, &MeshState, &MeshConfig) -> Decision`.
//!
//! # The protocol
//!
//! Liveness is judged only by the coordinator's own receive time: no message carries a clock.
//! And only over time it ran and heard: a silence while it heard nobody at all (its uplink
//! down), or while it was not running (a paused VM), is its own and evicts nobody.
//!
//! **Join.** A node sends `Join { incarnation, held }` (repeated with its heartbeats until
//! answered, and again when the state it holds changes while it waits); the coordinator queues
//! it (`Queued`). Before the first epoch, the queued joiners form it once
//! [`MeshConfig::min_members`] are queued and [`MeshConfig::join_window`] has passed (`View`).
//! The founders are the joiners that hold the state at the highest outer step among the queue,
//! and of those the largest group with one digest ([`Held`]); the mesh starts at that step. The
//! other joiners stay queued and fetch the state at the first boundary, as any joiner does. So
//! a coordinator restarted among members holding different states (one that missed a commit, a
//! joiner that was still receiving the state, a fresh process) cannot found replicas that
//! differ. A forming mesh also waits for the nodes it answered "not a member" while they said
//! they were members of an epoch (a restarted coordinator's old members, rejoining), for as long
//! as they beat; and it is never founded on a state behind a step some joiner knows was
//! finished (`finished`): if no joiner holds such a state, it waits for one that does (the
//! newest state is gone, as when no member holds it: resume from checkpoints).
//! Afterwards joiners are admitted only at an outer-step boundary, all queued ones at once, each
//! once; a joiner that arrives while a boundary is being processed waits for the next one. At
//! most [`MeshConfig::max_admissions`] are admitted at one boundary, the longest queued first;
//! at most [`MeshConfig::max_queue`] wait in the queue: a join beyond it is answered
//! `QueueFull`, and the joiner sends it again with its heartbeats.
//!
//! **Join from a current member.** Each (node, incarnation) is admitted at most once. A `Join`
//! from a node that is a member:
//! - with another incarnation: the old process is gone; its membership is evicted
//!   ([`EvictReason::Restarted`]) and the new incarnation is queued;
//! - with the same incarnation, while the member has not yet shown that it knows it was admitted
//!   (no heartbeat with an epoch, barrier arrival, `Done`, `Failed`, `Synced` or probe report
//!   received since its admission): a repeat that crossed the admission, answered by sending the
//!   admission again;
//! - with the same incarnation, after that: the process restarted and reuses its incarnation
//!   (the transport delivers in order, and a live member never sends `Join` again). Its state and
//!   its pseudo-gradient died with the old process, so the old membership is evicted
//!   ([`EvictReason::Restarted`]: it no longer counts as holding the state) and the new process is
//!   refused with `Evicted { reason: IncarnationReused }` ([`MeshEvent::JoinRefused`]); it must
//!   restart with a new incarnation. A `Join` with an incarnation admitted earlier and since
//!   removed is refused the same way.
//!
//! **Outer step k.** Each member runs its inner steps ([`MemberAction::Compute`]), then sends
//! `Barrier { k }`. When every member has arrived, or at the barrier deadline (evicting the
//! missing ones, even if they still beat), the coordinator
//! - admits the queued joiners and forms a new epoch if anything changed;
//! - in blocking mode with joiners, sends `Sync` naming the peers that send each joiner the state
//!   ([`MemberAction::FetchState`], [`MemberAction::SendState`]) and waits for `Synced`;
//! - sends `Release { epoch, k, attempt, ring, weights }`: every member runs the all-reduce
//!   ([`MemberAction::StartAllReduce`], one ring per local shard, all in this epoch) and answers
//!   `Done` (or `Failed`);
//! - when every member is done, sends `Commit { k }`: every member applies the outer update
//!   ([`MemberAction::Commit`]) and computes step k + 1. Nobody applies a result before this,
//!   so a failure at any point of the all-reduce leaves every replica in the same state.
//!
//! The barrier deadline is [`MeshConfig::barrier_timeout`] after the first arrival; while nobody
//! has arrived, it is [`MeshConfig::compute_timeout`] after the step began (the coordinator's
//! commit or skip of step k - 1, or the formation of the mesh). So a mesh whose members all hang
//! while still beating is not waited on forever: they are all evicted, which leaves no member
//! holding the state (below).
//!
//! **Failure during the all-reduce.** An eviction (heartbeat timeout, deathrattle) or a reported
//! failure (after [`MeshConfig::retry_backoff`]) makes the coordinator form a new epoch and send
//! a new `Release` with `attempt + 1`: the survivors abort ([`MemberAction::AbortAllReduce`]) and
//! start again from their kept pseudo-gradients; the all-reduce divides by the sum of the weights
//! in its frames, so the divisor is the survivors'. Frames of the old epoch are rejected by the
//! all-reduce. Past [`MeshConfig::max_retries`], or past [`MeshConfig::allreduce_timeout`] with
//! nobody evicted, the coordinator sends `Skip`: every member skips the outer update of step k
//! (outer weights unchanged, inner weights reset to them), logged as [`MeshEvent::StepSkipped`].
//! A retry whose members all have weight 0 (the ones left hold the state but have no
//! pseudo-gradient for step k: they were admitted at its boundary) is not run: step k is skipped.
//!
//! **No member holds the state.** Founding members hold the training state (they start from the
//! same initial weights, or from the same checkpoint in a resumed run); a joiner admitted later
//! holds it once it reports `Synced` (also repaired from its heartbeats). If, after the first
//! epoch, an eviction would leave no member holding the state (every synced member was evicted,
//! left, crashed or restarted, and only joiners without it remain: non-blocking joiners at
//! weight 0, or blocking joiners whose senders all died), going on would train from fresh
//! weights. Instead the coordinator stops the run ([`MeshEvent::NoSyncedMember`]): the evicted
//! members get `Evicted` as usual, every other member and queued joiner gets
//! `NoSyncedMember { outer_step }` ([`StopReason::NoSyncedMember`]), and so does any node that
//! writes to the coordinator afterwards. Outer steps before `outer_step` were finished (committed
//! or skipped); the run must be resumed from checkpoints
//! ([`Coordinator::starting_at`]). Before the first epoch there is nothing to lose, so the mesh
//! just waits for joiners.
//!
//! **Lost messages.** The transport delivers in order or not at all. Joins repeat until
//! answered; every heartbeat carries the member's epoch and phase, and the coordinator repairs
//! what a lost message broke: it records an arrival, a `Done` or a `Synced` it missed, and sends
//! again the `View`, `Sync`, `Release`, `Commit` or `Skip` the member missed. Both sides treat a
//! repeated message as a no-op (a repeated `Release` of the running collective does not restart
//! it).
//!
//! **Leaving.** `Leave { reason }` (the deathrattle: graceful exit, panic or signal) evicts at once;
//! silence evicts after [`MeshConfig::heartbeat_timeout`].
//!
//! **Ring order.** While the members compute, the coordinator measures the links not measured
//! yet, in rounds in which each node takes part in at most one probe: it sends
//! `ProbeRequest { peer }` to each prober of the round. The prober sends the peer a `Probe` with an
//! empty body, then `Probe`s with growing bodies, each echoed by an empty `ProbeAck`; the
//! difference of the round-trip times on the prober's own clock gives the bandwidth
//! (`ProbeReport`). Each release orders the ring by [`ring_order`] over the measured
//! [`BandwidthMatrix`].
//!
//! **Coordinator failure.** A member that has heard nothing from the coordinator for
//! [`MeshConfig::coordinator_timeout`] says so ([`MemberAction::CoordinatorSilent`]) and keeps
//! its membership, heartbeating, until the silence reaches [`MeshConfig::rejoin_for`]: a
//! coordinator that was itself away (a paused VM, its uplink down) comes back with its state and
//! credits its own absence to everyone, so nobody's membership or state is lost. Past
//! `rejoin_for` the member stops cleanly ([`StopReason::CoordinatorLost`]); the coordinator
//! answers every heartbeat, so neither fires while it lives and the link works. There is no
//! standby (see [`StopReason::CoordinatorLost`]).

use crate::ids::{Epoch, NodeId, Weight};
use serde::{Deserialize, Serialize};
use std::fmt;

mod blame;
mod config;
mod coordinator;
mod decide;
mod guard;
mod member;
mod probe;
mod ring;
mod state;
mod timer;

pub use config::{JoinMode, MAX_RETRIES_LIMIT, MeshConfig, MeshConfigError, RingOrder};
pub use coordinator::{Coordinator, CoordinatorAction, MeshEvent};
pub use decide::{Decision, EpochPlan, Reason, Round, Then, decide, next_deadline};
pub use guard::Refusal;
pub use member::{AllReduceStart, Command, Member, MemberAction, MemberPhase, StopReason};
pub use probe::{PROBE_MAX_BYTES, PROBE_START_BYTES};
pub use ring::{
    BandwidthMatrix, EXACT_MAX_NODES, bottleneck, ring_order, solve, solve_exact, solve_heuristic,
};
pub use state::{Joiner, MemberInfo, MeshState, Outcome, Phase};

/// Why a member leaves on its own (its deathrattle).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum LeaveReason {
    /// The process is exiting normally.
    Graceful,
    /// The process panicked (sent from the panic hook).
    Panic,
    /// The process received SIGTERM or SIGINT.
    Signal,
}

impl fmt::Display for LeaveReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LeaveReason::Graceful => "graceful exit",
            LeaveReason::Panic => "panic",
            LeaveReason::Signal => "signal",
        })
    }
}

/// Why the coordinator removed a node from the mesh.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum EvictReason {
    /// No message for [`MeshConfig::heartbeat_timeout`] by the coordinator's clock.
    HeartbeatTimeout,
    /// It sent its deathrattle.
    Deathrattle(LeaveReason),
    /// It did not reach the barrier within [`MeshConfig::barrier_timeout`] (even if it beat).
    BarrierMissed,
    /// As a joiner in blocking mode, it did not receive the state within
    /// [`MeshConfig::sync_timeout`].
    SyncTimeout,
    /// It joined again (with a new incarnation, or with the same one after it had shown that it
    /// knew it was a member): the old process is gone, with its state.
    Restarted,
    /// Sent to a process that joins with an incarnation already admitted once (a process
    /// restarted with the incarnation of the one before): each (node, incarnation) is admitted at
    /// most once. It must join again with a new incarnation.
    IncarnationReused,
    /// It alone reported [`BLAME_LIMIT`] all-reduce attempts in a row failed, while nobody died
    /// and no other member saw a failure: a member whose reports nobody corroborates (a broken
    /// link of its own, or a member failing every attempt on purpose) would otherwise have every
    /// step retried and skipped.
    Uncorroborated,
    /// One side of a dispute that lasted [`BLAME_LIMIT`] attempts in a row in a ring of two: one
    /// member alone reported each attempt failed and named the other (no frames, or values
    /// that are not finite). With no third member to give the named one another neighbour,
    /// which of the two lies cannot be told, so both go. In larger rings a named member gets a
    /// new successor instead ([`EvictReason::Accused`]).
    Disputed,
    /// Its weights' digest at the barrier differs from the one a strict majority of the members
    /// that applied the same outer steps reported: its replica diverged (a fault, or a bad
    /// commit of its own). It may join again and receive the state.
    Diverged,
    /// It sent a member's message but is not a member (evicted earlier, or unknown).
    NotAMember,
    /// Two members, each its successor in the ring of a failed attempt, named it in their
    /// reports (nothing came from it for [`MeshConfig::progress_timeout`], or its values were
    /// not finite) in attempts in a row since the last commit. The coordinator gives a named
    /// member another successor at the retry, so one lying member cannot gather two names
    /// against anyone: its own uncorroborated reports get it evicted instead
    /// ([`EvictReason::Uncorroborated`]).
    Accused,
}

/// The norms of an update as one member saw it at the end of an all-reduce, in its `Done`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct UpdateNorms {
    /// The L2 norm of the member's own pseudo-gradient (`None` when it contributed weight 0).
    pub own: Option<f64>,
    /// The L2 norm of the average every member holds (the same bits on every replica).
    pub average: f64,
}

/// Committed updates whose norms the guard keeps ([`MeshConfig::max_update_ratio`]).
pub const UPDATE_HISTORY: usize = 16;
/// The guard compares with the median only once it holds this many committed norms.
pub const UPDATE_MIN_HISTORY: usize = 4;
/// Updates refused in a row before the run stops ([`MeshMsg::UpdatesRefused`]).
pub const UPDATE_REFUSALS_LIMIT: u32 = 3;

/// How many all-reduce attempts in a row one member may alone report failed before it is
/// evicted ([`EvictReason::Uncorroborated`]). A commit clears the count.
pub const BLAME_LIMIT: u32 = 3;

impl fmt::Display for EvictReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EvictReason::HeartbeatTimeout => f.write_str("heartbeat timeout"),
            EvictReason::Deathrattle(r) => write!(f, "deathrattle ({r})"),
            EvictReason::BarrierMissed => f.write_str("missed the barrier deadline"),
            EvictReason::SyncTimeout => f.write_str("did not receive the state in time"),
            EvictReason::Restarted => f.write_str("restarted"),
            EvictReason::IncarnationReused => {
                f.write_str("incarnation already used: join again with a new incarnation")
            }
            EvictReason::NotAMember => f.write_str("not a member"),
            EvictReason::Uncorroborated => {
                write!(f, "alone reported {BLAME_LIMIT} attempts in a row failed")
            }
            EvictReason::Diverged => {
                f.write_str("its weights differ from the majority's after the same outer steps")
            }
            EvictReason::Accused => f.write_str(
                "named by two ring successors as the cause of failed attempts (no frames, or \
                 values not finite)",
            ),
            EvictReason::Disputed => write!(
                f,
                "in a dispute over {BLAME_LIMIT} attempts in a row: one member named the other's \
                 values not finite"
            ),
        }
    }
}

/// Which peers send the training state to one joiner. The backend splits the state among the
/// senders (any split both sides agree on) and verifies it by hash.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transfer {
    /// The node receiving the state.
    pub joiner: NodeId,
    /// The members sending it, in id order.
    pub senders: Vec<NodeId>,
}

/// One measured link.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProbeResult {
    /// The peer probed (the receiving end of the link).
    pub peer: NodeId,
    /// Bandwidth from the prober to the peer, bytes per second.
    pub bytes_per_sec: f64,
}

/// The training state a joining node holds: a fresh process holds the initial weights (step
/// 0), a resumed one its checkpoint's, a member that lost its coordinator the state it had
/// committed. A node whose state is not a whole replicated one (a joiner that was still
/// receiving it, or never had it) holds none and says `None`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Held {
    /// The outer steps applied to it (committed or skipped): the next step it computes.
    pub outer_step: u64,
    /// The digest of its outer weights, where the node has it (after a commit); `None` for the
    /// initial or a resumed state, which nodes at step 0 or a checked resume step share.
    pub digest: Option<crate::digest::WeightsDigest>,
}

/// A control-plane message of the mesh protocol (the header of a
/// [`Frame`](crate::transport::Frame) with `Header::Mesh`).
/// Only `Probe` has a body (padding whose length is measured).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum MeshMsg {
    // ---- member -> coordinator ----
    /// Asks to join the mesh. Repeated until the coordinator answers; idempotent.
    Join {
        /// Distinguishes restarts of the same node id: a join with a new incarnation from a
        /// member evicts the old process.
        incarnation: u64,
        /// The training state the node holds, if any: a mesh that forms (a restarted
        /// coordinator's included) founds itself only on the states most joiners share at the
        /// highest step ([`Held`]). Sent again, with the same incarnation, when it changes
        /// while queued.
        held: Option<Held>,
        /// The outer steps the node knows were finished (committed or skipped) in the run, in
        /// any membership of its process: a mesh is never founded on a state behind it.
        finished: u64,
    },
    /// "I am alive", and where the sender is. Judged by the coordinator's own receive time;
    /// carries no clock. The state lets the coordinator repair a lost message: it records a
    /// barrier arrival, a `Done` or a `Synced` it missed, and sends again a `View`, `Sync`,
    /// `Release`, `Commit` or `Skip` the member missed.
    Heartbeat {
        /// Counts the sender's heartbeats (for traces only).
        seq: u64,
        /// The sender's epoch.
        epoch: Option<Epoch>,
        /// The sender's phase.
        phase: MemberPhase,
        /// Whether the sender holds the training state.
        synced: bool,
        /// The outer step whose pseudo-gradient the sender withholds (see `Barrier`).
        withheld: Option<u64>,
    },
    /// The sender finished its inner steps of `outer_step` and waits at the barrier.
    Barrier {
        /// The outer step.
        outer_step: u64,
        /// Its pseudo-gradient is not finite (a diverged inner loop): it takes part in the
        /// all-reduce with weight 0 and takes the others' average.
        withheld: bool,
        /// The state it holds: every member that applied the same steps holds the same
        /// weights, so the coordinator compares their digests (a member in a minority is
        /// evicted as [`EvictReason::Diverged`]).
        held: Option<Held>,
    },
    /// The sender finished the all-reduce of this epoch and attempt (on every shard).
    Done {
        /// Epoch of the release.
        epoch: Epoch,
        /// Outer step.
        outer_step: u64,
        /// Attempt of the release.
        attempt: u32,
        /// The update's norms, where the values are real and the guard is on
        /// ([`MeshConfig::max_update_ratio`]).
        norms: Option<UpdateNorms>,
    },
    /// A blocking joiner received a complete state that is not the one the members vouch for
    /// (`Sync`'s `vouched`): another outer step or other weights, from these senders of its
    /// assignment in `epoch`. The coordinator assigns it other senders where it can.
    StateRefused {
        /// The epoch of the assignment.
        epoch: Epoch,
        /// The senders of the state refused.
        senders: Vec<NodeId>,
    },
    /// The sender's all-reduce of this epoch and attempt failed.
    Failed {
        /// Epoch of the release.
        epoch: Epoch,
        /// Outer step.
        outer_step: u64,
        /// Attempt of the release.
        attempt: u32,
        /// The member it names for the failure: its ring neighbour that sent values that are
        /// not finite, or nothing for [`MeshConfig::progress_timeout`] (none for a link or a
        /// peer that went away).
        accused: Option<NodeId>,
        /// Collective frames of this attempt it had received from that neighbour. When a ring
        /// stalls, every member after the cause stalls in turn and names its own neighbour; the
        /// one that received least is the first after the cause, and only its name counts.
        received: u64,
    },
    /// The sender (a joiner) holds the training state.
    Synced {
        /// The sender's epoch when it finished.
        epoch: Epoch,
    },
    /// Measured bandwidth to peers.
    ProbeReport {
        /// The round of the request answered.
        round: u64,
        /// One entry per peer that answered.
        results: Vec<ProbeResult>,
    },
    /// The deathrattle: the sender is leaving now.
    Leave {
        /// Why.
        reason: LeaveReason,
    },

    // ---- coordinator -> member ----
    /// The queue of joiners is full ([`MeshConfig::max_queue`]): the join is not queued. The
    /// joiner keeps sending it with its heartbeats until a place frees.
    QueueFull,
    /// The join is queued; admission happens at the next boundary.
    Queued {
        /// Position in the queue (0-based).
        position: u32,
    },
    /// Answer to a heartbeat (members notice a dead coordinator by the lack of these).
    HeartbeatAck,
    /// A new epoch while members compute (formation, or a member left): for a queued joiner in
    /// `members`, its admission; compute `outer_step`.
    View {
        /// The new epoch.
        epoch: Epoch,
        /// The outer step being computed.
        outer_step: u64,
        /// Members of the epoch, in id order.
        members: Vec<NodeId>,
        /// The incarnation of the process it is meant for, as the coordinator knows it: a
        /// restarted process, still joining, must not take its predecessor's view for its own
        /// admission.
        incarnation: u64,
    },
    /// Blocking mode: a new epoch with joiners that first receive the state from the named
    /// senders; the all-reduce waits for them.
    Sync {
        /// The new epoch.
        epoch: Epoch,
        /// The outer step whose all-reduce waits.
        outer_step: u64,
        /// Members of the epoch, in id order.
        members: Vec<NodeId>,
        /// Each member's incarnation as the coordinator knows it, aligned with `members` (a
        /// restarted process must not take its predecessor's admission).
        incarnations: Vec<u64>,
        /// Who sends the state to whom.
        transfers: Vec<Transfer>,
        /// The state the joiners must receive: what a strict majority of the members reported
        /// holding at this step's barrier (outer steps applied, weights digest), when one did.
        /// A joiner refuses any other, so a member sending a forged state cannot install it.
        vouched: Option<Held>,
    },
    /// Start (or restart) the all-reduce of `outer_step` on this ring.
    Release {
        /// Epoch of the collective: every frame carries it.
        epoch: Epoch,
        /// The outer step.
        outer_step: u64,
        /// 0 for the first try, then 1, 2, ... for retries.
        attempt: u32,
        /// The ring order (also the members of the epoch).
        ring: Vec<NodeId>,
        /// Each ring member's weight, aligned with `ring`.
        weights: Vec<Weight>,
        /// Each ring member's incarnation as the coordinator knows it, aligned with `ring`.
        incarnations: Vec<u64>,
        /// Non-blocking mode: state transfers that run alongside.
        transfers: Vec<Transfer>,
    },
    /// Every member finished the all-reduce: apply the outer update and compute the next step.
    Commit {
        /// The epoch of the finished all-reduce.
        epoch: Epoch,
        /// The outer step committed.
        outer_step: u64,
    },
    /// Retries are exhausted: every member skips the outer update of this step.
    Skip {
        /// The new epoch.
        epoch: Epoch,
        /// The outer step skipped.
        outer_step: u64,
        /// Members of the epoch, in id order.
        members: Vec<NodeId>,
        /// Attempts made.
        attempts: u32,
    },
    /// The receiver is no longer a member.
    Evicted {
        /// Why.
        reason: EvictReason,
    },
    /// Measure the bandwidth to these peers and report it.
    ProbeRequest {
        /// Round number; a new round supersedes the previous one.
        round: u64,
        /// Peers to probe, in this order.
        peers: Vec<NodeId>,
    },
    /// The run is over: stop.
    Shutdown,
    /// The averaged update was refused [`UPDATE_REFUSALS_LIMIT`] outer steps in a row: the run
    /// stops with the weights of the last commit, for a person to look at.
    UpdatesRefused {
        /// The outer step the mesh was at (every step before it was committed or skipped).
        outer_step: u64,
    },
    /// The run cannot go on: no member holding the training state is left (see the module
    /// documentation). Stop; the run must be resumed from checkpoints.
    NoSyncedMember {
        /// The outer step the mesh was at: every step before it was finished (committed or
        /// skipped), so the run resumes from checkpoints taken after that many outer steps.
        outer_step: u64,
    },

    // ---- member <-> member ----
    /// A bandwidth probe; its body is padding of a known length.
    Probe {
        /// The probe round.
        round: u64,
        /// Sequence number within the round.
        seq: u32,
    },
    /// Echo of a probe, with an empty body.
    ProbeAck {
        /// The probe round.
        round: u64,
        /// The sequence number echoed.
        seq: u32,
    },
}

/// The op id of a collective (see [`CollectiveHeader::op`](crate::transport::CollectiveHeader)):
/// the outer step in the high bits, the attempt in the low 16.
pub fn op_id(outer_step: u64, attempt: u32) -> u64 {
    (outer_step << 16) | u64::from(attempt & 0xffff)
}

/// A command given to a [`Member`] that does not fit its state.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MeshError {
    /// The command names an epoch other than the member's current one.
    #[error("stale epoch {got}, current is {current:?}")]
    StaleEpoch {
        /// The epoch in the command.
        got: Epoch,
        /// The member's epoch.
        current: Option<Epoch>,
    },
    /// The command names another collective than the one running.
    #[error("unknown collective op {got}, running is {running:?}")]
    UnknownOp {
        /// The op in the command.
        got: u64,
        /// The op running, if any.
        running: Option<u64>,
    },
    /// The command names another outer step than the one being computed.
    #[error("wrong outer step {got}, expected {expected:?}")]
    WrongStep {
        /// The step in the command.
        got: u64,
        /// The step expected, if any.
        expected: Option<u64>,
    },
    /// The command does not apply in the member's current phase.
    #[error("{command} is not possible while {phase}")]
    WrongPhase {
        /// The command.
        command: &'static str,
        /// The phase, as text.
        phase: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_ids_order_by_step_then_attempt() {
        assert!(op_id(3, 2) < op_id(4, 0));
        assert!(op_id(3, 1) < op_id(3, 2));
        assert_eq!(op_id(1, 0), 1 << 16);
    }

    #[test]
    fn messages_round_trip_through_serde() {
        let m = MeshMsg::Release {
            epoch: Epoch(4),
            outer_step: 9,
            attempt: 1,
            ring: vec![NodeId(2), NodeId(0)],
            weights: vec![Weight::ONE, Weight::ZERO],
            incarnations: vec![3, 0],
            transfers: vec![Transfer { joiner: NodeId(2), senders: vec![NodeId(0)] }],
        };
        let s = serde_json::to_string(&m).unwrap();
        assert_eq!(serde_json::from_str::<MeshMsg>(&s).unwrap(), m);
    }
}
