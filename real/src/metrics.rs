//! A worker's metrics file: JSON lines appended and never rewritten, which the launch reads back
//! to write the run's files and check its invariants.

use loco_core::digest::WeightsDigest;
use loco_core::ids::{Epoch, NodeId};
use loco_core::metrics::{EventRow, OuterStepRow};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::PathBuf;

/// Writing a process's metrics file failed.
#[derive(Debug, thiserror::Error)]
#[error("writing metrics to {path}: {source}")]
pub struct MetricsError {
    /// The file.
    pub path: PathBuf,
    /// The error.
    pub source: std::io::Error,
}

/// A process's metrics file: JSON lines of [`MetricsLine`], appended and never rewritten, so a
/// process killed at any moment loses at most its last line.
pub struct MetricsFile {
    path: PathBuf,
    file: std::fs::File,
}

impl MetricsFile {
    /// Opens `path` for appending (creating its directory), or `None` without a path.
    pub fn open(path: Option<&std::path::Path>) -> Result<Option<MetricsFile>, MetricsError> {
        let Some(path) = path else { return Ok(None) };
        let err = |source| MetricsError { path: path.to_path_buf(), source };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(err)?;
        }
        let file = std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(err)?;
        Ok(Some(MetricsFile { path: path.to_path_buf(), file }))
    }

    /// Appends one line.
    pub fn write(&mut self, line: &MetricsLine) -> Result<(), MetricsError> {
        let mut s = serde_json::to_string(line).expect("metrics serialise");
        s.push('\n');
        self.file
            .write_all(s.as_bytes())
            .map_err(|source| MetricsError { path: self.path.clone(), source })
    }
}

/// One line of a worker's metrics file.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum MetricsLine {
    /// An outer step of this node.
    Row(OuterStepRow),
    /// An event seen by this node.
    Event(EventRow),
    /// The node's counters of collective frames so far (this process's), written at the end of
    /// a step when they changed, and when it stops.
    Counters {
        /// The node.
        node: String,
        /// The process's incarnation (each counts from 0).
        incarnation: u64,
        /// Collective frames of epochs this node had left, rejected (summary.json's
        /// `stale_frames_rejected`).
        stale_frames_rejected: u64,
    },
    /// The process's peak resident memory, written when it stops.
    Resources {
        /// The node.
        node: String,
        /// Peak resident set size in bytes (Linux `VmHWM`), when known.
        peak_rss_bytes: Option<u64>,
    },
    /// A check this worker's machine emitted, for the launch's invariant checker.
    Check {
        /// The node whose machine emitted it.
        node: NodeId,
        /// The check.
        check: CheckLine,
    },
    /// The coordinator formed `epoch` with `members` (written by the coordinator).
    EpochFormed {
        /// The epoch.
        epoch: Epoch,
        /// Its members.
        members: Vec<NodeId>,
    },
}

/// A worker's [`Check`] as written to its metrics file (stale frames are counted in
/// [`MetricsLine::Counters`] instead), read back by the launch and fed to core's
/// [`loco_core::metrics::InvariantChecker`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum CheckLine {
    /// [`Check::View`]: the node holds `members` as the membership of `epoch`.
    View {
        /// The epoch.
        epoch: Epoch,
        /// Its members as the node holds them.
        members: Vec<NodeId>,
        /// Where they came from (`view`, `release`, ...).
        what: String,
    },
    /// [`Check::AllReduceWeights`]: the weight sums a finished all-reduce's chunks carried.
    AllReduceWeights {
        /// The step, attempt and epoch, in words.
        what: String,
        /// The sums seen (finite: a non-finite one is written as a [`CheckLine::Violation`]).
        sums: Vec<f64>,
        /// The ring's total weight.
        total: f64,
    },
    /// [`Check::WeightsAfter`]: the outer weights after `outer_step` hash to `hash`.
    WeightsAfter {
        /// The step.
        outer_step: u64,
        /// The digest.
        hash: WeightsDigest,
    },
    /// A violation the node saw, described in words.
    Violation(String),
}

impl CheckLine {
    /// Feeds this check of node `node` to `checker`.
    pub fn feed(&self, node: NodeId, checker: &mut loco_core::metrics::InvariantChecker) {
        match self {
            CheckLine::View { epoch, members, what } => {
                checker.member_view(node, *epoch, members, what)
            }
            CheckLine::AllReduceWeights { what, sums, total } => {
                checker.allreduce_weights(node, what, sums, *total)
            }
            CheckLine::WeightsAfter { outer_step, hash } => {
                checker.weights_after(node, *outer_step, hash)
            }
            CheckLine::Violation(msg) => checker.violation(msg.clone()),
        }
    }
}

/// Peak resident set size of this process in bytes (Linux: `VmHWM` of /proc/self/status).
pub fn peak_rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}
