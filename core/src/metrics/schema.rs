//! The rows both backends write: one [`OuterStepRow`] per (outer step, node) and one [`EventRow`]
//! per membership or fault event.

use crate::digest::WeightsDigest;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// What one node did during one outer step: the row of `outer_steps.csv`.
///
/// Times are seconds on the run's own clock (simulated time for `sim`, the monotonic clock of the
/// process for `real`), counted from the start of the run. The breakdown fields (`compute_s` to
/// `idle_s`) are durations in seconds that add up to `end_s - start_s`; `idle_s` takes whatever
/// the others do not account for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OuterStepRow {
    /// The outer step (0-based, counted by the mesh, the same on every node).
    pub outer_step: u64,
    /// The node's name (as in the scenario file).
    pub node: String,
    /// The node's id on the transport.
    pub node_id: u32,
    /// The membership epoch in which the step's all-reduce completed (or was last tried).
    pub epoch: u64,
    /// Members in the all-reduce of this step (the ring's world size).
    pub world: u32,
    /// When the node started the step, seconds since the run started.
    pub start_s: f64,
    /// When the node finished the step (outer weights updated), seconds since the run started.
    pub end_s: f64,
    /// Seconds of inner (local) training steps.
    pub compute_s: f64,
    /// Seconds in the all-reduce of pseudo-gradients, retries included.
    pub allreduce_s: f64,
    /// Seconds waiting at the barrier before the all-reduce for the other members.
    pub barrier_s: f64,
    /// Seconds spent in live recovery (sending or receiving training state).
    pub recovery_s: f64,
    /// Seconds spent blocked on checkpointing.
    pub checkpoint_s: f64,
    /// Seconds of the outer step's own O(model) work on this node: computing the
    /// pseudo-gradient, applying the outer update, resetting the inner weights. Off the node's
    /// event loop (its heartbeats go on), but the node waits for it.
    #[serde(default)]
    pub outer_s: f64,
    /// Every other second of the step (`end_s - start_s` minus the fields above).
    pub idle_s: f64,
    /// Bytes this node sent during the step (all-reduce, recovery, control), on the wire.
    pub bytes_sent: u64,
    /// All-reduce attempts after the first one in this step.
    pub retries: u32,
    /// Training tokens this node processed during the step; 0 when unknown.
    pub tokens: u64,
    /// Training loss at the end of the step's inner steps, when there is a model.
    pub loss: Option<f64>,
    /// Digest of the outer weights after the step, written as hex; `None` (an empty field) for
    /// virtual numerics and for a non-blocking joiner that does not hold the mesh's state yet.
    #[serde(with = "crate::digest::hex_or_empty")]
    pub weights_hash: Option<WeightsDigest>,
    /// The weight of this node's contribution to the average (0 for a joiner not yet caught up).
    pub weight: f64,
    /// Seconds of this step's all-reduce from its first release to its commit, retries
    /// included, whether the node waited for it or not: in sync mode `allreduce_s`; in overlap
    /// and streaming modes it runs beside the next step's inner steps, and only the part the
    /// node waited for shows in the breakdown (as the next row's `allreduce_s`). 0 when the step
    /// had no all-reduce here.
    #[serde(default)]
    pub allreduce_wall_s: f64,
    /// Held-out loss of the global weights the step started from (those committed when its
    /// inner steps began), when the run evaluates at this step (`[real] eval_every`); `None`
    /// otherwise and in the simulator.
    #[serde(default)]
    pub eval_loss: Option<f64>,
}

impl OuterStepRow {
    /// Wall time of the step for this node: `end_s - start_s`, never negative.
    pub fn wall_s(&self) -> f64 {
        let w = self.end_s - self.start_s;
        if w.is_finite() && w > 0.0 { w } else { 0.0 }
    }
}

/// The kind of an [`EventRow`], written in kebab-case (`join-request`, `skip-step`, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EventKind {
    /// The run started (`node` empty), or a node was a member from the start (`node` set). The
    /// report counts members from these events: write one per initial member.
    Start,
    /// A node asked the coordinator to join.
    JoinRequest,
    /// The coordinator admitted a queued joiner at an outer-step boundary.
    Admit,
    /// A node became a member of the mesh.
    Join,
    /// A node left gracefully (deathrattle).
    Leave,
    /// A node's process died (SIGKILL, injected crash).
    Crash,
    /// The coordinator evicted a node (heartbeat timeout or missed barrier deadline).
    Evict,
    /// A node stopped making progress (injected hang).
    Hang,
    /// A crashed node's process was started again.
    Restart,
    /// A network partition began.
    Partition,
    /// A network partition ended.
    Heal,
    /// A link or node became slower (bandwidth or compute degradation).
    Degrade,
    /// A new membership epoch began (`epoch` set).
    Epoch,
    /// An all-reduce failed (a member was lost mid-collective).
    AllreduceFailed,
    /// A failed all-reduce was retried on a new epoch.
    Retry,
    /// An outer step was skipped after the retries ran out.
    SkipStep,
    /// The coordinator crashed.
    CoordinatorCrash,
    /// The coordinator's process was stopped, or runs again (`detail` says which).
    CoordinatorPause,
    /// A member lost contact with the coordinator.
    CoordinatorLost,
    /// A checkpoint was written.
    Checkpoint,
    /// A live recovery (state transfer to a joiner) began.
    RecoveryStart,
    /// A live recovery finished.
    RecoveryDone,
    /// A node's pseudo-gradient was not finite (its inner loop diverged): it took part in the
    /// all-reduce with weight 0 and took the others' average.
    Withheld,
    /// The run stopped (`node` empty), or a node stopped at the end of the run (`node` set).
    Stop,
}

impl EventKind {
    /// The kinds that make a run's membership story, in the order a node lives them: what two
    /// runs of one scenario (the simulator and a real run, or two executors) must agree on.
    pub const STORY: [EventKind; 11] = [
        EventKind::Admit,
        EventKind::Leave,
        EventKind::Crash,
        EventKind::Evict,
        EventKind::Restart,
        EventKind::Partition,
        EventKind::Heal,
        EventKind::SkipStep,
        EventKind::RecoveryDone,
        EventKind::CoordinatorCrash,
        EventKind::CoordinatorPause,
    ];

    /// Every kind, in declaration order.
    pub const ALL: [EventKind; 24] = [
        EventKind::Start,
        EventKind::JoinRequest,
        EventKind::Admit,
        EventKind::Join,
        EventKind::Leave,
        EventKind::Crash,
        EventKind::Evict,
        EventKind::Hang,
        EventKind::Restart,
        EventKind::Partition,
        EventKind::Heal,
        EventKind::Degrade,
        EventKind::Epoch,
        EventKind::AllreduceFailed,
        EventKind::Retry,
        EventKind::SkipStep,
        EventKind::CoordinatorCrash,
        EventKind::CoordinatorPause,
        EventKind::CoordinatorLost,
        EventKind::Checkpoint,
        EventKind::RecoveryStart,
        EventKind::RecoveryDone,
        EventKind::Withheld,
        EventKind::Stop,
    ];

    /// The kebab-case name used in `events.csv`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Start => "start",
            EventKind::JoinRequest => "join-request",
            EventKind::Admit => "admit",
            EventKind::Join => "join",
            EventKind::Leave => "leave",
            EventKind::Crash => "crash",
            EventKind::Evict => "evict",
            EventKind::Hang => "hang",
            EventKind::Restart => "restart",
            EventKind::Partition => "partition",
            EventKind::Heal => "heal",
            EventKind::Degrade => "degrade",
            EventKind::Epoch => "epoch",
            EventKind::AllreduceFailed => "allreduce-failed",
            EventKind::Retry => "retry",
            EventKind::SkipStep => "skip-step",
            EventKind::CoordinatorCrash => "coordinator-crash",
            EventKind::CoordinatorPause => "coordinator-pause",
            EventKind::CoordinatorLost => "coordinator-lost",
            EventKind::Checkpoint => "checkpoint",
            EventKind::RecoveryStart => "recovery-start",
            EventKind::RecoveryDone => "recovery-done",
            EventKind::Withheld => "withheld",
            EventKind::Stop => "stop",
        }
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The name given is not an [`EventKind`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown event kind `{0}`")]
pub struct UnknownEventKind(pub String);

impl FromStr for EventKind {
    type Err = UnknownEventKind;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EventKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| UnknownEventKind(s.to_owned()))
    }
}

/// One membership or fault event: the row of `events.csv`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EventRow {
    /// When it happened, seconds since the run started (the run's own clock).
    pub time_s: f64,
    /// What happened.
    pub kind: EventKind,
    /// The node concerned, if any (never an empty string: empty in CSV means `None`).
    pub node: Option<String>,
    /// The epoch concerned, if any (for [`EventKind::Epoch`], the new epoch).
    pub epoch: Option<u64>,
    /// Free text for people (a reason, a link name); may be empty.
    pub detail: String,
}

impl EventRow {
    /// An event with no node, epoch or detail.
    pub fn new(time_s: f64, kind: EventKind) -> EventRow {
        EventRow { time_s, kind, node: None, epoch: None, detail: String::new() }
    }

    /// The same event, about `node`.
    #[must_use]
    pub fn node(mut self, node: impl Into<String>) -> EventRow {
        self.node = Some(node.into());
        self
    }

    /// The same event, in `epoch`.
    #[must_use]
    pub fn epoch(mut self, epoch: u64) -> EventRow {
        self.epoch = Some(epoch);
        self
    }

    /// The same event, with `detail`.
    #[must_use]
    pub fn detail(mut self, detail: impl Into<String>) -> EventRow {
        self.detail = detail.into();
        self
    }
}
