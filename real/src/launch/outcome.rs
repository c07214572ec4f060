//! What a launch tells its caller: notices while it runs, its outcome at the end.

use loco_core::ids::NodeId;
use loco_core::metrics::{EventRow, OuterStepRow, Summary};
use std::collections::BTreeMap;

/// Something a user should see while a launch runs. `Display` gives the line to show.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Notice {
    /// How far the run is (at most every 100 ms).
    Progress {
        /// Seconds since the launch started.
        elapsed_s: f64,
        /// Outer steps the workers reported committed in this launch.
        committed: u64,
    },
    /// The scenario's clock started.
    ClockStarted {
        /// Seconds after the launch started.
        after_s: f64,
        /// Every starting worker was ready (else [`READY_LIMIT`](super::READY_LIMIT) passed first).
        all_ready: bool,
    },
    /// A worker exited with a status other than 0 on its own.
    WorkerFailed {
        /// The node.
        name: String,
        /// Its exit status.
        status: String,
    },
    /// Every worker stopped and none is due to start: the run ends.
    EveryWorkerStopped,
    /// The run exceeded its time limit and is being stopped.
    TimeLimit,
    /// The network the processes run in.
    Network {
        /// What it is ([`super::NetworkUsed`]'s text).
        description: String,
    },
}

impl std::fmt::Display for Notice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Notice::Progress { elapsed_s, committed } => {
                write!(f, "{elapsed_s:>6.1}s, {committed} outer steps committed")
            }
            Notice::ClockStarted { after_s, all_ready: true } => {
                write!(f, "every starting worker is ready; the run's clock starts ({after_s:.1} s)")
            }
            Notice::ClockStarted { after_s, all_ready: false } => write!(
                f,
                "not every starting worker is ready after {after_s:.0} s; the run's clock starts"
            ),
            Notice::WorkerFailed { name, status } => {
                write!(f, "worker {name} failed ({status}); see its log above")
            }
            Notice::EveryWorkerStopped => {
                write!(f, "every worker has stopped and none is due to start; ending the run")
            }
            Notice::TimeLimit => write!(f, "the run exceeded its time limit; stopping it"),
            Notice::Network { description } => write!(f, "network: {description}"),
        }
    }
}

/// One worker process of a launch, as the launcher saw it.
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessRecord {
    /// The node.
    pub node: NodeId,
    /// Its name.
    pub name: String,
    /// Its incarnation.
    pub incarnation: u64,
    /// When it was started, seconds after the launch started.
    pub started_s: f64,
    /// When it said it was ready, seconds after the launch started.
    pub ready_s: Option<f64>,
    /// Why it stopped, as it said on its status channel.
    pub stopped: Option<String>,
    /// Its exit status, when it exited while the launcher watched.
    pub exit: Option<String>,
}

/// A finished launch: the run's record, for the caller to write and show.
#[derive(Clone, Debug)]
pub struct LaunchOutcome {
    /// The run's figures and invariants.
    pub summary: Summary,
    /// Every outer-step row of every process.
    pub rows: Vec<OuterStepRow>,
    /// Every event, the launcher's and the processes', by time.
    pub events: Vec<EventRow>,
    /// Peak resident memory of each node's processes, in bytes.
    pub peak_rss_bytes: BTreeMap<String, u64>,
    /// When the scenario's clock started, seconds after the launch started (`None`: it never
    /// did, the run ended first).
    pub clock_start_s: Option<f64>,
    /// The worker processes, in the order they were started.
    pub processes: Vec<ProcessRecord>,
}

impl LaunchOutcome {
    /// Whether every invariant held.
    pub fn ok(&self) -> bool {
        self.summary.invariants.ok
    }
}
