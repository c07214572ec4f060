//! Why a launch could not run.

use crate::checkpoint::CheckpointError;
use std::path::PathBuf;
use std::time::Duration;

/// Why a launch could not run.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The scenario's network could not be emulated (`[real] network = "emulated"`, or the
    /// emulation failed to start).
    #[error("the scenario's network: {0}")]
    Network(#[from] crate::wan::WanError),
    /// The starting processes need more memory than this machine has.
    #[error(
        "{scenario}: {processes} processes of this model need {:.1} GiB, and this machine has \
         {:.1} GiB available; nothing was started. Each process: {plan}",
        gib(*.need_bytes),
        gib(*.available_bytes)
    )]
    DoesNotFit {
        /// The scenario's name.
        scenario: String,
        /// Starting processes.
        processes: u64,
        /// Host memory they need.
        need_bytes: u64,
        /// Host memory available.
        available_bytes: u64,
        /// One process's memory plan.
        plan: String,
    },
    /// A node's devices have less memory than its plan needs on each.
    #[error(
        "{scenario}: node {node} needs {:.1} GiB on each of its {gpus} device(s) from {device}, \
         which has {:.1} GiB; nothing was started. Its plan: {plan}. More GPUs per node \
         (`gpus`) shard the model further; a shorter `[real] seq_len` or `micro_batch` needs \
         fewer activations",
        gib(*.need_bytes),
        gib(*.device_bytes)
    )]
    DeviceDoesNotFit {
        /// The scenario's name.
        scenario: String,
        /// The node.
        node: String,
        /// Its devices.
        gpus: u32,
        /// The first of them.
        device: String,
        /// What each needs.
        need_bytes: u64,
        /// What the first has.
        device_bytes: u64,
        /// The node's memory plan.
        plan: String,
    },
    /// Resuming needs a checkpoint directory.
    #[error(
        "{}: [real] checkpoint_dir: needed to resume, and the scenario has none \
         (or pass --checkpoint-dir)",
        .scenario_path.display()
    )]
    NoCheckpointDir {
        /// The scenario file.
        scenario_path: PathBuf,
    },
    /// No checkpoint to resume from.
    #[error(
        "{}: no complete checkpoint {}common to every starting node ({have})",
        .root.display(),
        .wanted.map(|k| format!("of outer step {k} ")).unwrap_or_default()
    )]
    NoCommonCheckpoint {
        /// The checkpoint root.
        root: PathBuf,
        /// The step asked for.
        wanted: Option<u64>,
        /// The steps each starting node has.
        have: String,
    },
    /// The nodes' checkpoints of every common step (or of the step asked for) hold different
    /// replicated states: no step is one run's state.
    #[error(
        "{}: the starting nodes' checkpoints {}hold different outer weights or momentum, \
         so no step is one run's state (nodes grouped by what they hold: {groups}); resume \
         from an older step with --resume-step, or remove the checkpoints of the nodes that \
         differ",
        .root.display(),
        .wanted.map(|k| format!("of outer step {k} ")).unwrap_or_default()
    )]
    CheckpointsDiffer {
        /// The checkpoint root.
        root: PathBuf,
        /// The step asked for.
        wanted: Option<u64>,
        /// Per step, the nodes grouped by their replicated state.
        groups: String,
    },
    /// Listing checkpoints failed.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The start gate could not be opened.
    #[error(transparent)]
    Gate(#[from] super::gate::GateError),
    /// A file or directory of the run.
    #[error("{action} {}: {source}", .path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A process did not start, or could not be watched.
    #[error("{action} {process}: {source}")]
    Process {
        /// What was being done.
        action: &'static str,
        /// The process.
        process: String,
        /// The error.
        source: std::io::Error,
    },
    /// The coordinator exited before it said its address.
    #[error("the coordinator exited at start ({status})")]
    CoordinatorExited {
        /// Its exit status.
        status: String,
    },
    /// The coordinator did not say its address in time.
    #[error("the coordinator did not start within {} s", .waited.as_secs())]
    CoordinatorSilent {
        /// How long it was given.
        waited: Duration,
    },
    /// The coordinator's address file does not hold an address.
    #[error("the coordinator's address: {text:?}")]
    CoordinatorAddr {
        /// What the file held.
        text: String,
    },
    /// The status channel could not be set up.
    #[error("the status channel at {}: {source}", .path.display())]
    Status {
        /// The socket's path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

fn gib(b: u64) -> f64 {
    b as f64 / f64::from(1u32 << 30)
}
