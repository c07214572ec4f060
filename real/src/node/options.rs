//! How a worker runs: its options, its checkpoint plan and the faults injected into it.

use crate::checkpoint::CheckpointConfig;
use crate::tcp::TcpConfig;
use loco_core::ids::NodeId;
use loco_core::scenario::{FaultPhase, Scenario};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

/// How a worker runs.
#[derive(Clone, Debug)]
pub struct WorkerOptions {
    /// The scenario: the node's settings come from it ([`NodeConfig::for_node`]), as in the
    /// simulator.
    pub scenario: Arc<Scenario>,
    /// This node's id (its index in the scenario's node list).
    pub id: NodeId,
    /// Distinguishes restarts of the same node.
    pub incarnation: u64,
    /// Where the coordinator listens.
    pub coordinator: SocketAddr,
    /// Where this worker listens for its peers (port 0: any).
    pub listen: SocketAddr,
    /// TCP settings.
    pub tcp: TcpConfig,
    /// Where to append this worker's metrics (JSON lines of [`MetricsLine`]).
    pub metrics: Option<PathBuf>,
    /// Offset added to this process's clock in the metrics, so that all processes of a launch
    /// share one time base (seconds since the launch started).
    pub time_offset_s: f64,
    /// Checkpoints to write, if any.
    pub checkpoint: Option<CheckpointPlan>,
    /// A checkpoint directory (`.../<node>/step-<N>`) to start from instead of the initial model.
    pub resume: Option<PathBuf>,
    /// Faults to inject into this process (tests and fault drills).
    pub faults: Vec<Fault>,
    /// The launcher's status channel, when a launcher started this process: every metrics line
    /// is forwarded on it too.
    pub status: Option<crate::worker_status::StatusSender>,
    /// The Prometheus metrics served on `--metrics-addr`: every metrics line is counted there
    /// too.
    pub exporter: Option<crate::exporter::Exporter>,
    /// Whether the node hangs (the scenario's `hang`, played by the launcher): while `true` its
    /// application side stops (inner steps, collective frames, state sending) and its machine
    /// keeps its timers and heartbeats, as the simulator's hang. `None`: never.
    pub hang: Option<tokio::sync::watch::Receiver<bool>>,
}

/// When and where a worker writes its checkpoints.
#[derive(Clone, Debug)]
pub struct CheckpointPlan {
    /// Where, how many to keep, the remote copy.
    pub config: CheckpointConfig,
    /// Every this many outer steps (at least 1).
    pub every: u64,
}

/// A fault injected into a worker: the process kills itself (SIGKILL) when it next enters
/// `phase` at or after `after_s` seconds since it started, in outer step `from_step` or later.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fault {
    /// Where it strikes.
    pub phase: FaultPhase,
    /// Armed from this time on (seconds since this process started).
    pub after_s: f64,
    /// And only in this outer step or a later one (0: any).
    pub from_step: u64,
}

impl Fault {
    /// Whether it strikes on entering `phase` at `now_s` (seconds since the process started)
    /// in `outer_step`.
    pub fn strikes(&self, phase: FaultPhase, now_s: f64, outer_step: u64) -> bool {
        self.phase == phase && now_s >= self.after_s && outer_step >= self.from_step
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.phase, self.after_s)?;
        if self.from_step > 0 {
            write!(f, ",step={}", self.from_step)?;
        }
        Ok(())
    }
}

impl std::str::FromStr for Fault {
    type Err = String;
    /// `PHASE@SECONDS[,step=N]`, like `reduce-scatter@3.5` or `compute@1.5,step=4`.
    fn from_str(s: &str) -> Result<Fault, String> {
        let (s, from_step) = match s.split_once(",step=") {
            Some((rest, n)) => {
                let n = n.parse().map_err(|_| format!("{n:?} is not an outer step (0, 1, ...)"))?;
                (rest, n)
            }
            None => (s, 0),
        };
        let (phase, at) = s.split_once('@').unwrap_or((s, "0"));
        let phase = FaultPhase::parse(phase).ok_or_else(|| {
            let names: Vec<&str> = FaultPhase::ALL.iter().map(|(n, _)| *n).collect();
            format!("unknown phase {phase:?}; expected one of {}", names.join(", "))
        })?;
        let after_s: f64 = at
            .parse()
            .ok()
            .filter(|t: &f64| t.is_finite() && *t >= 0.0)
            .ok_or_else(|| format!("{at:?} is not a time in seconds"))?;
        Ok(Fault { phase, after_s, from_step })
    }
}

/// The longest hang command line read ([`hang_commands`]); a longer one is skipped.
const MAX_COMMAND: u64 = 64;

/// Reads the launcher's fault commands from `input` (the worker's standard input with
/// `--control-stdin`) on a thread of its own: one a line, `hang` or `resume`; anything else is
/// logged and ignored, a line longer than 64 bytes skipped. The flag is `true` from a `hang` to
/// the next `resume`; the sender goes when `input` ends.
pub fn hang_commands(
    input: impl std::io::BufRead + Send + 'static,
) -> tokio::sync::watch::Receiver<bool> {
    let (tx, rx) = tokio::sync::watch::channel(false);
    // A plain thread: it blocks on the pipe for the process's life, before the runtime starts.
    #[allow(clippy::disallowed_methods)]
    std::thread::spawn(move || read_hang_commands(input, &tx));
    rx
}

fn read_hang_commands(mut input: impl std::io::BufRead, tx: &tokio::sync::watch::Sender<bool>) {
    use std::io::{BufRead, Read};
    let mut line = Vec::new();
    loop {
        line.clear();
        match (&mut input).take(MAX_COMMAND + 1).read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if line.last() != Some(&b'\n') && line.len() as u64 > MAX_COMMAND {
            tracing::warn!("a fault command longer than {MAX_COMMAND} bytes: skipped");
            // Skip to the line's end.
            loop {
                line.clear();
                match (&mut input).take(MAX_COMMAND).read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => return,
                    Ok(_) if line.last() == Some(&b'\n') => break,
                    Ok(_) => {}
                }
            }
            continue;
        }
        let hung = match String::from_utf8_lossy(&line).trim() {
            "hang" => true,
            "resume" => false,
            "" => continue,
            other => {
                tracing::warn!("unknown fault command {other:?}: expected hang or resume");
                continue;
            }
        };
        if tx.send(hung).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hang_commands_read_a_line_each_and_skip_what_they_do_not_know() {
        let (tx, mut rx) = tokio::sync::watch::channel(false);
        let long = "x".repeat(500);
        let text = format!("hang\n{long}\nresume\nexplode\n\nhang\n");
        let mut seen = Vec::new();
        // Each send is observed: collect them by reading after every line.
        for line in text.split_inclusive('\n') {
            read_hang_commands(std::io::Cursor::new(line.as_bytes().to_vec()), &tx);
            if rx.has_changed().unwrap() {
                seen.push(*rx.borrow_and_update());
            }
        }
        assert_eq!(seen, [true, false, true]);
        // A long line in one read is skipped whole; the next command counts.
        read_hang_commands(std::io::Cursor::new(format!("{long}\nresume\n").into_bytes()), &tx);
        assert!(!*rx.borrow_and_update());
    }

    #[test]
    fn a_fault_flag_reads_back_what_the_launcher_writes() {
        for text in ["reduce-scatter@1.5", "compute@0", "checkpoint@2.25,step=4"] {
            let f: Fault = text.parse().unwrap();
            assert_eq!(f.to_string(), text);
        }
        let f: Fault = "all-gather@1.5,step=4".parse().unwrap();
        assert!(!f.strikes(FaultPhase::AllGather, 1.4, 4), "before its time");
        assert!(!f.strikes(FaultPhase::AllGather, 9.0, 3), "before its step");
        assert!(!f.strikes(FaultPhase::ReduceScatter, 9.0, 4), "another phase");
        assert!(f.strikes(FaultPhase::AllGather, 1.5, 4));
        assert!("compute@1,step=x".parse::<Fault>().unwrap_err().contains("\"x\""));
        assert!("lunch@1".parse::<Fault>().unwrap_err().contains("unknown phase"));
    }
}
