//! What a worker writes of itself: its events, checks, counters and checkpoint outcomes in its
//! metrics file (and on the launcher's status channel), and its fault injection.

use super::{CheckLine, MetricsLine, Worker, WorkerError, WorkerReport, weights_digest};
use crate::checkpoint::CheckpointError;
use crate::inner::InnerLoop;
use loco_core::ids::{Epoch, NodeId};
use loco_core::mesh::StopReason;
use loco_core::metrics::{EventKind, EventRow};
use loco_core::node::machine::{Check, NodeEvent};
use loco_core::scenario::FaultPhase;
use std::collections::BTreeMap;

impl<L: InnerLoop> Worker<L> {
    /// The scenario's name of node `n`, or its id where the scenario does not name it.
    pub(super) fn peer_name(&self, n: NodeId) -> String {
        self.opts.scenario.node(n).map_or_else(|| n.to_string(), |s| s.name.clone())
    }

    pub(super) fn node_event(&mut self, ev: NodeEvent) -> Result<(), WorkerError> {
        match &ev {
            // The state is taken: its own part goes to the inner loop before its next job.
            NodeEvent::RecoveryDone { .. } => {
                if let Some(own) = self.verified_own.take() {
                    self.pending.own = Some(own);
                }
            }
            NodeEvent::Admitted { .. }
            | NodeEvent::RecoveryStart { .. }
            | NodeEvent::CoordinatorLost { .. }
            | NodeEvent::Withheld { .. } => {}
        }
        let detail = ev.detail(&|n| self.peer_name(n));
        self.event(ev.kind(), ev.epoch(), detail)
    }

    /// Counts a stale frame; writes every other check for the launch's invariant checker (a
    /// violation is logged too).
    pub(super) fn check(&mut self, c: Check) -> Result<(), WorkerError> {
        let check = match c {
            Check::StaleFrame => {
                self.stale += 1;
                return Ok(());
            }
            Check::Violation(v) => {
                let msg = v.describe(self.opts.id, &|n| self.peer_name(n));
                tracing::warn!(node = %self.name, "{msg}");
                CheckLine::Violation(msg)
            }
            Check::View { epoch, members, what } => {
                CheckLine::View { epoch, members, what: what.to_owned() }
            }
            Check::AllReduceWeights { what, sums, total }
                if sums.iter().chain([&total]).all(|x| x.is_finite()) =>
            {
                CheckLine::AllReduceWeights { what, sums, total }
            }
            Check::AllReduceWeights { what, sums, total } => {
                // JSON has no NaN or infinity: judge it here, in the checker's words.
                let names = BTreeMap::from([(self.opts.id, self.name.clone())]);
                let mut checker = loco_core::metrics::InvariantChecker::new(names);
                checker.allreduce_weights(self.opts.id, &what, &sums, total);
                for msg in checker.violations() {
                    self.write(&MetricsLine::Check {
                        node: self.opts.id,
                        check: CheckLine::Violation(msg),
                    })?;
                }
                return Ok(());
            }
            Check::WeightsAfter { outer_step, hash } => {
                CheckLine::WeightsAfter { outer_step, hash }
            }
        };
        self.write(&MetricsLine::Check { node: self.opts.id, check })
    }

    /// Whether a fault armed for `phase` strikes now.
    pub(super) fn armed(&self, phase: FaultPhase, outer_step: u64) -> bool {
        let now = self.clock.start.elapsed().as_secs_f64();
        self.opts.faults.iter().any(|f| f.strikes(phase, now, outer_step))
    }

    /// Fault injection: records the crash, then kills this process with SIGKILL (no cleanup, no
    /// deathrattle: what a machine failure looks like to the others).
    pub(super) fn strike(&mut self, phase: FaultPhase, outer_step: u64) -> Result<(), WorkerError> {
        if !self.armed(phase, outer_step) {
            return Ok(());
        }
        self.event(EventKind::Crash, None, format!("SIGKILL during {phase} (fault injection)"))?;
        kill_self();
        Ok(())
    }

    /// Records a finished background save.
    pub(super) fn on_saved(
        &mut self,
        r: Result<crate::checkpoint::Saved, CheckpointError>,
    ) -> Result<(), WorkerError> {
        match r {
            Ok(s) => {
                self.checkpoint_failures = (0, String::new());
                self.event(
                    EventKind::Checkpoint,
                    None,
                    format!(
                        "saved {} ({} bytes)",
                        crate::checkpoint::step_dir_name(s.outer_step),
                        s.bytes
                    ),
                )
            }
            Err(e) => {
                let failures = self.checkpoint_failures.0.saturating_add(1);
                self.checkpoint_failures = (failures, e.to_string());
                let limit = super::CHECKPOINT_FAILURES_LIMIT;
                let detail = if failures >= limit {
                    tracing::error!(node = %self.name, "{failures} checkpoints in a row failed; training goes on, and the worker will exit with an error: {e}");
                    format!(
                        "checkpoint failed ({failures} in a row: the run is not resumable from here): {e}"
                    )
                } else {
                    tracing::warn!(node = %self.name, "checkpoint failed: {e}");
                    format!("checkpoint failed: {e}")
                };
                self.event(EventKind::Checkpoint, None, detail)
            }
        }
    }

    /// Waits for the checkpoint being written (a graceful stop loses nothing).
    pub(super) fn flush_checkpoints(&mut self) -> Result<(), WorkerError> {
        let r = match self.held.as_mut().and_then(|h| h.checkpointer.as_mut()) {
            Some((ck, _)) => ck.flush(),
            None => return Ok(()),
        };
        match r {
            Ok(Some(saved)) => self.on_saved(Ok(saved)),
            Ok(None) => Ok(()),
            Err(e) => self.on_saved(Err(e)),
        }
    }

    /// Writes the frame counters when they changed since the last time (or `always`).
    pub(super) fn write_counters(&mut self, always: bool) -> Result<(), WorkerError> {
        if !always && self.stale == self.stale_written {
            return Ok(());
        }
        self.stale_written = self.stale;
        self.write(&MetricsLine::Counters {
            node: self.name.clone(),
            incarnation: self.opts.incarnation,
            stale_frames_rejected: self.stale,
        })
    }

    pub(super) fn report(&self, stop: StopReason) -> WorkerReport {
        let (committed, weights_hash) = match self.process.node().outer() {
            Some(o) => (o.steps(), Some(weights_digest(o.outer()))),
            None => (0, None),
        };
        WorkerReport { stop, committed, weights_hash }
    }

    pub(super) fn write(&mut self, line: &MetricsLine) -> Result<(), WorkerError> {
        if let Some(s) = &self.opts.status {
            s.metrics(line);
        }
        if let Some(e) = &self.opts.exporter {
            e.observe(line);
        }
        match self.metrics.as_mut() {
            Some(f) => Ok(f.write(line)?),
            None => Ok(()),
        }
    }

    pub(super) fn event(
        &mut self,
        kind: EventKind,
        epoch: Option<Epoch>,
        detail: String,
    ) -> Result<(), WorkerError> {
        let mut e = EventRow::new(self.clock.secs(), kind).node(self.name.clone()).detail(detail);
        if let Some(ep) = epoch {
            e = e.epoch(ep.0);
        }
        tracing::info!(node = %self.name, kind = kind.as_str(), "{}", e.detail);
        self.write(&MetricsLine::Event(e))
    }
}

/// Kills this process at once with SIGKILL (fault injection).
pub(super) fn kill_self() {
    let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    // SIGKILL cannot be caught; should the raise fail, end as abruptly.
    std::process::abort();
}
