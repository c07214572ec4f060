//! What the node machine reports: its events for `events.csv` ([`NodeEvent`]) and the checks it
//! feeds the run's invariants ([`Check`], [`Violation`]).

use crate::digest::WeightsDigest;
use crate::ids::{Epoch, NodeId};
use crate::metrics::EventKind;
use crate::node::events::admission_kind;
use crate::node::state::{Refused, VerifyFailed};
use std::fmt;
use std::time::Duration;

/// An event of this node, for `events.csv`.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeEvent {
    /// Admitted into `epoch` at `outer_step` (`start` into the first epoch, else `join`).
    Admitted {
        /// The epoch.
        epoch: Epoch,
        /// The outer step at admission.
        outer_step: u64,
    },
    /// A state transfer to this node starts, or its senders changed (`kept_bytes`: bytes
    /// already held that are kept).
    RecoveryStart {
        /// The epoch of the assignment.
        epoch: Epoch,
        /// The senders.
        senders: Vec<NodeId>,
        /// `Some` for a reassignment.
        kept_bytes: Option<u64>,
    },
    /// The state arrived, verified, and was taken.
    RecoveryDone {
        /// The epoch of the fetch.
        epoch: Epoch,
        /// Bytes received.
        bytes: u64,
        /// Who sent the own part.
        from: NodeId,
        /// The outer step of the state received.
        outer_step: u64,
        /// The digest of the outer weights taken (real numerics).
        weights: Option<WeightsDigest>,
        /// Steps committed meanwhile and replayed onto it.
        replayed: usize,
    },
    /// This node's pseudo-gradient of `outer_step` had `values` values that are not finite: it
    /// is withheld from the average (weight 0), and the node takes the others' average.
    Withheld {
        /// The epoch this node was in.
        epoch: Option<Epoch>,
        /// The outer step.
        outer_step: u64,
        /// How many values were NaN or infinite.
        values: usize,
        /// The pseudo-gradient's length.
        of: usize,
    },
    /// The coordinator went silent (written once per loss, not at every restart): the member
    /// waits for it, then checkpoints and stops.
    CoordinatorLost {
        /// The epoch this node was in.
        epoch: Option<Epoch>,
        /// How long the coordinator had been silent.
        silent_for: Duration,
        /// The last outer step this member committed.
        last_committed: Option<u64>,
        /// How much longer it waits for the coordinator.
        waits: Duration,
    },
}

impl NodeEvent {
    /// The event's kind.
    pub fn kind(&self) -> EventKind {
        match self {
            NodeEvent::Admitted { epoch, .. } => admission_kind(*epoch),
            NodeEvent::RecoveryStart { .. } => EventKind::RecoveryStart,
            NodeEvent::RecoveryDone { .. } => EventKind::RecoveryDone,
            NodeEvent::CoordinatorLost { .. } => EventKind::CoordinatorLost,
            NodeEvent::Withheld { .. } => EventKind::Withheld,
        }
    }

    /// The epoch it names.
    pub fn epoch(&self) -> Option<Epoch> {
        match self {
            NodeEvent::Admitted { epoch, .. }
            | NodeEvent::RecoveryStart { epoch, .. }
            | NodeEvent::RecoveryDone { epoch, .. } => Some(*epoch),
            NodeEvent::CoordinatorLost { epoch, .. } | NodeEvent::Withheld { epoch, .. } => *epoch,
        }
    }

    /// The `detail` column, with node ids written by `name`.
    pub fn detail(&self, name: &dyn Fn(NodeId) -> String) -> String {
        let names = |ids: &[NodeId]| ids.iter().map(|i| name(*i)).collect::<Vec<_>>().join(" ");
        match self {
            NodeEvent::Admitted { outer_step, .. } => {
                format!("admitted at outer step {outer_step}")
            }
            NodeEvent::RecoveryStart { senders, kept_bytes: None, .. } => {
                format!("from {}", names(senders))
            }
            NodeEvent::RecoveryStart { senders, kept_bytes: Some(k), .. } => {
                format!("senders now {}; {k} bytes already held are kept", names(senders))
            }
            NodeEvent::RecoveryDone { bytes, from, outer_step, weights, replayed, .. } => format!(
                "received {bytes} bytes of state from {} as of outer step {outer_step}{}{}",
                name(*from),
                weights.as_ref().map(|w| format!(", weights {w}")).unwrap_or_default(),
                if *replayed > 0 {
                    format!(", {replayed} step(s) replayed")
                } else {
                    String::new()
                }
            ),
            NodeEvent::CoordinatorLost { silent_for, last_committed, waits, .. } => {
                let step = match last_committed {
                    Some(s) => format!("checkpointing outer step {s}"),
                    None => "no outer step committed yet".to_string(),
                };
                format!(
                    "coordinator lost: nothing heard from it for {:.1}s; still a member for \
                     {:.1}s in case it comes back, then {step} and stopping",
                    silent_for.as_secs_f64(),
                    waits.as_secs_f64()
                )
            }
            NodeEvent::Withheld { outer_step, values, of, .. } => format!(
                "pseudo-gradient of outer step {outer_step} not finite ({values} of {of} values): \
                 withheld from the average (weight 0)"
            ),
        }
    }
}

/// What the machine saw, for the invariant checks of an executor (the simulator's recorder).
#[derive(Debug, Clone, PartialEq)]
pub enum Check {
    /// This node holds `members` as the membership of `epoch`; `what` names the message
    /// (`view` or `release`).
    View {
        /// The epoch.
        epoch: Epoch,
        /// Its members as this node holds them.
        members: Vec<NodeId>,
        /// Where they came from.
        what: &'static str,
    },
    /// A finished all-reduce on more than one node: the weight sums its chunks carried, and
    /// the ring's total weight they must each equal.
    AllReduceWeights {
        /// The step, attempt and epoch, in words.
        what: String,
        /// The sums seen.
        sums: Vec<f64>,
        /// The ring's total weight.
        total: f64,
    },
    /// The outer weights after `outer_step` hash to `hash` (real numerics, synced nodes).
    WeightsAfter {
        /// The step.
        outer_step: u64,
        /// [`weights_digest`] of the outer weights.
        hash: WeightsDigest,
    },
    /// A collective frame of an epoch this node has left was rejected.
    StaleFrame,
    /// Something that must not happen did.
    Violation(Violation),
}

/// An invariant this node saw broken.
#[derive(Debug, Clone, PartialEq)]
pub enum Violation {
    /// Told to commit without a finished all-reduce of that epoch.
    CommitWithoutResult {
        /// The step.
        outer_step: u64,
        /// The epoch of the commit.
        epoch: Epoch,
    },
    /// The release's weight for this node disagrees with whether it holds a pseudo-gradient.
    WrongWeight {
        /// The weight released.
        weight: f32,
        /// The step.
        outer_step: u64,
        /// The attempt.
        attempt: u32,
        /// Whether this node holds a pseudo-gradient for the step.
        holds: bool,
    },
    /// The rings refused a frame (a peer off the schedule).
    RingRefused {
        /// The collective's epoch.
        epoch: Epoch,
        /// Its op.
        op: u64,
        /// The sender.
        from: NodeId,
        /// Why.
        error: String,
    },
    /// A state piece was refused for a fault of a sender or the grid.
    PieceRefused {
        /// The sender, if known.
        from: Option<NodeId>,
        /// Why.
        refused: Refused,
    },
    /// A complete state failed verification.
    StateRejected(Box<VerifyFailed>),
    /// A verified state could not be taken (restored or replayed).
    StateUnusable {
        /// Its outer step.
        outer_step: u64,
        /// Why.
        error: String,
    },
}

impl Violation {
    /// The violation in words, as node `me` saw it, with node ids written by `name`.
    pub fn describe(&self, me: NodeId, name: &dyn Fn(NodeId) -> String) -> String {
        let me = name(me);
        match self {
            Violation::CommitWithoutResult { outer_step, epoch } => format!(
                "{me} was told to commit outer step {outer_step} of epoch {epoch} without a finished all-reduce"
            ),
            Violation::WrongWeight { weight, outer_step, attempt, holds } => format!(
                "{me} contributes weight {weight} to outer step {outer_step} attempt {attempt} but {} a \
                 pseudo-gradient for it: a contribution would be {}",
                if *holds { "holds" } else { "does not hold" },
                if *holds { "lost" } else { "counted without being computed" }
            ),
            Violation::RingRefused { epoch, op, from, error } => format!(
                "{me}: all-reduce of {epoch} op {op} refused a frame from {}: {error}",
                name(*from)
            ),
            Violation::PieceRefused { from, refused } => format!(
                "{me} refused a state piece from {}: {refused}",
                from.map_or_else(|| "a sender".to_owned(), name)
            ),
            Violation::StateRejected(failed) => {
                format!("the state {me} received from {}: {failed}", name(failed.own_from))
            }
            Violation::StateUnusable { outer_step, error } => format!(
                "{me} received a state as of outer step {outer_step} but cannot take it: {error}"
            ),
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe(NodeId(u32::MAX), &|n| n.to_string()))
    }
}

/// The node machine's checks, fed to the run's invariants (here, so that the metrics do not
/// depend on the node).
impl crate::metrics::InvariantChecker {
    /// Feeds one [`Check`] node `node`'s machine emitted. Views are compared with the epochs
    /// formed so far, so feed [`InvariantChecker::epoch_formed`] first.
    pub fn check(&mut self, node: NodeId, c: &Check) {
        match c {
            Check::View { epoch, members, what } => self.member_view(node, *epoch, members, what),
            Check::AllReduceWeights { what, sums, total } => {
                self.allreduce_weights(node, what, sums, *total)
            }
            Check::WeightsAfter { outer_step, hash } => self.weights_after(node, *outer_step, hash),
            Check::StaleFrame => self.stale(1),
            Check::Violation(v) => {
                let msg = v.describe(node, &|n| self.name(n));
                self.violation(msg);
            }
        }
    }
}
