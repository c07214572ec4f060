//! A real worker process: an executor of core's node machine
//! ([`loco_core::node::machine::Node`], which decides everything a member of the mesh does)
//! over TCP, around an [`InnerLoop`] (the libtorch trainer, or a synthetic objective).
//!
//! One tokio task `select!`s over incoming frames, the machine's next deadline, the end of a
//! blocking job and a shutdown signal, feeds each to the machine, then carries out the machine's
//! effects and sends its transmits ([`Worker::drain`]). What stays here is the real process's
//! own: the TCP transport and its auth, the inner loop and the blocking threads it runs on
//! ([`jobs`]), the checkpoints, the metrics lines and the launcher's status channel, and the
//! fault injection.
//!
//! Work that reads or writes every parameter runs on blocking threads, so heartbeats and the ring
//! go on meanwhile: the inner steps (and the copy of the inner weights after them), the outer
//! step's jobs ([`OuterJob`]), encoding a state for a joiner (with the inner optimiser's
//! export) and verifying a received one, a checkpoint's snapshot.
//!
//! The lifecycle is core's [`Process`] (docs/lifecycle.md), as in every executor: an eviction,
//! or a lost coordinator, ends the membership, and the process starts a new member with a new
//! incarnation and joins again (a bounded number of times); a leave, the end of the run or a
//! mesh without its state ends the process.

mod jobs;
mod options;
mod record;

pub use crate::metrics::{CheckLine, MetricsError, MetricsFile, MetricsLine, peak_rss_bytes};
pub use options::{CheckpointPlan, Fault, WorkerOptions, hang_commands};

use crate::checkpoint::{CheckpointError, Checkpointer};
use crate::inner::{HangGate, InnerError, InnerLoop};
use crate::tcp::{TcpError, TcpTransport};
use jobs::{Held, InnerOut, InnerWork};
use loco_core::diloco::{DilocoError, OuterState, buckets_from_sizes};
use loco_core::ids::NodeId;
use loco_core::mesh::{LeaveReason, MeshError, StopReason};
use loco_core::metrics::EventKind;
use loco_core::node::config::{ExecutorSide, UnknownNode, outer_config};
use loco_core::node::machine::{
    Effect, NodeConfig, Numerics, OuterJob, PreparedState, Snapshot, VerifyResult,
};
use loco_core::node::process::{Output, Process, ProcessError, Stopped, fault_phase};
use loco_core::scenario::FaultPhase;
use loco_core::time::Time;
use loco_core::transport::{Frame, Transport};
use std::collections::VecDeque;
use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

/// How a worker ended.
#[derive(Clone, Debug)]
pub struct WorkerReport {
    /// Why it stopped.
    pub stop: StopReason,
    /// Outer steps it committed.
    pub committed: u64,
    /// Digest of its outer weights at the end (`None` when it held none).
    pub weights_hash: Option<loco_core::digest::WeightsDigest>,
}

/// Failures of a worker that are not part of the protocol.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The listening socket.
    #[error(transparent)]
    Tcp(#[from] TcpError),
    /// The mesh refused a command (a bug, reported as such).
    #[error("mesh: {0}")]
    Mesh(#[from] MeshError),
    /// The inner loop failed.
    #[error("inner training: {0}")]
    Inner(#[from] InnerError),
    /// The outer state.
    #[error("outer state: {0}")]
    Diloco(#[from] DilocoError),
    /// The node's process.
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// The node is not in the scenario.
    #[error(transparent)]
    UnknownNode(#[from] UnknownNode),
    /// The transport closed under the worker.
    #[error("transport: {0}")]
    Transport(#[from] loco_core::transport::TransportError),
    /// Writing the metrics.
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    /// The checkpoint to resume from, or the checkpoint settings.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The checkpoints this worker was asked to keep kept failing: the run went on, and the
    /// worker ends with this error so that nobody takes its run for one that can be resumed.
    #[error(
        "{failures} checkpoints in a row failed (the last: {last}); the latest state on disk is older than the run"
    )]
    CheckpointsFailing {
        /// Failures in a row, up to the end of the run.
        failures: u32,
        /// The last one's error.
        last: String,
    },
    /// A checkpoint that does not belong to this worker or model.
    #[error("resume from {path}: {what}")]
    Resume {
        /// The checkpoint directory.
        path: PathBuf,
        /// What does not match.
        what: String,
    },
}

pub use loco_core::node::digest::weights_digest;

/// The monotonic clock of this process, as core [`Time`].
struct Clock {
    start: tokio::time::Instant,
    offset_s: f64,
}

impl Clock {
    fn now(&self) -> Time {
        Time::from_nanos(self.start.elapsed().as_nanos() as u64)
    }
    fn secs(&self) -> f64 {
        self.offset_s + self.start.elapsed().as_secs_f64()
    }
    fn instant(&self, t: Time) -> tokio::time::Instant {
        self.start + Duration::from_nanos(t.as_nanos())
    }
}

type InnerTask<L> = tokio::task::JoinHandle<(Held<L>, Result<InnerOut, WorkerError>)>;

struct Worker<L: InnerLoop> {
    opts: WorkerOptions,
    /// This node's name in the scenario.
    name: String,
    clock: Clock,
    t: TcpTransport,
    /// The peers whose first dial failed ([`TcpTransport::unreachable`]).
    unreachable: crate::tcp::Unreachable,
    process: Process,
    /// Why the last membership stopped.
    last_stop: Option<StopReason>,
    /// The inner loop and the checkpointer; away while a job holds them.
    held: Option<Held<L>>,
    /// The job on the inner loop, running on a blocking thread.
    inner_job: Option<InnerTask<L>>,
    /// The jobs waiting for it, in order.
    queue: VecDeque<InnerWork>,
    /// What the inner loop takes before its next job.
    pending: jobs::Pending,
    /// The own part of a verified state: the inner loop's once the machine takes the state.
    verified_own: Option<Vec<u8>>,
    /// The machine's outer job, on a blocking thread.
    outer_job: Option<tokio::task::JoinHandle<OuterJob>>,
    /// States being encoded for joiners (without the own part).
    preparing: tokio::task::JoinSet<PreparedState>,
    /// A received state being verified.
    verifying: tokio::task::JoinSet<VerifyResult>,
    /// The inner loop ran steps since the last commit.
    dirty: bool,
    /// The outer step count of the last checkpoint taken.
    checkpointed: Option<u64>,
    /// Stale collective frames rejected by this process, and the count last written.
    stale: u64,
    stale_written: u64,
    metrics: Option<MetricsFile>,
    /// Closed while the node hangs (the inner steps wait on it).
    gate: HangGate,
    /// Whether the node hangs, as the launcher says ([`WorkerOptions::hang`]).
    hang: Option<tokio::sync::watch::Receiver<bool>>,
    /// Checkpoints failed in a row since the last one saved, and the last failure.
    checkpoint_failures: (u32, String),
}

/// Checkpoints failed in a row from which the worker says so as an error (in its log and
/// events at once, and in its exit status at the end of the run).
pub const CHECKPOINT_FAILURES_LIMIT: u32 = 3;

/// Runs a worker until it stops (the run ends, it leaves, the mesh lost its state, or it gave up
/// rejoining). `shutdown` resolving makes it leave gracefully (its deathrattle).
pub async fn run_worker<L: InnerLoop>(
    opts: WorkerOptions,
    mut inner: L,
    shutdown: impl Future<Output = ()>,
) -> Result<WorkerReport, WorkerError> {
    let clock = Clock { start: tokio::time::Instant::now(), offset_s: opts.time_offset_s };
    let name = match opts.scenario.node(opts.id) {
        Some(n) => n.name.clone(),
        None => return Err(UnknownNode(opts.id, opts.scenario.nodes().len()).into()),
    };
    let mut t = TcpTransport::bind(opts.id, opts.listen, opts.tcp.clone()).await?;
    t.set_peer_addr(NodeId::COORDINATOR, opts.coordinator);
    if let Some(e) = &opts.exporter {
        let mut names: std::collections::BTreeMap<NodeId, String> =
            opts.scenario.nodes().iter().map(|n| (n.id, n.name.clone())).collect();
        names.insert(NodeId::COORDINATOR, "coordinator".into());
        e.watch_transport(t.stats_handle(), names);
    }
    let metrics = MetricsFile::open(opts.metrics.as_deref())?;
    let checkpointer = match &opts.checkpoint {
        Some(plan) => Some((Checkpointer::new(plan.config.clone())?, plan.every.max(1))),
        None => None,
    };
    tracing::info!(node = %name, incarnation = opts.incarnation, "worker started");
    let resumed = match opts.resume.clone() {
        Some(path) => Some((resume(&opts, &name, &mut inner, &path)?, path)),
        None => None,
    };
    // The initial weights, before the node joins and has heartbeats to keep (a joiner's are
    // replaced by the state it receives).
    let initial = match &resumed {
        Some((o, _)) => o.outer().to_vec(),
        None => {
            let mut p = vec![0.0f32; inner.num_params()];
            inner.params_into(&mut p)?;
            p
        }
    };
    let layers: Vec<usize> = inner.param_layout().into_iter().map(|(_, n)| n).collect();
    let side = executor_side(&opts, initial, layers, inner.max_optimizer_bytes());
    let cfg = NodeConfig::for_node(&opts.scenario, opts.id, side)?;
    let mut process = Process::new(cfg, opts.incarnation)?;
    if let Some((o, _)) = &resumed {
        let mut again = OuterState::restore(
            outer_config(&opts.scenario),
            o.outer().to_vec(),
            o.momentum().to_vec(),
            Vec::new(),
            o.steps(),
        )?;
        if !o.residual().is_empty() {
            again.set_residual(o.residual().to_vec())?;
        }
        process.node_mut().resume_from(again)?;
    }
    let gate = HangGate::default();
    inner.set_gate(gate.clone());
    let hang = opts.hang.clone();
    let mut w = Worker {
        clock,
        unreachable: t.unreachable(),
        t,
        process,
        name,
        opts,
        last_stop: None,
        held: Some(Held { inner, checkpointer, gate: gate.clone() }),
        gate,
        hang,
        inner_job: None,
        queue: VecDeque::new(),
        pending: jobs::Pending::default(),
        verified_own: None,
        outer_job: None,
        preparing: tokio::task::JoinSet::new(),
        verifying: tokio::task::JoinSet::new(),
        dirty: false,
        checkpointed: None,
        stale: 0,
        stale_written: 0,
        metrics,
        checkpoint_failures: (0, String::new()),
    };
    if let Some((o, path)) = &resumed {
        let detail = format!(
            "resumed from checkpoint {} at outer step {} (weights {})",
            path.display(),
            o.steps(),
            weights_digest(o.outer())
        );
        w.event(EventKind::Start, None, detail)?;
    }
    w.process.start(w.clock.now())?;
    w.run(shutdown).await
}

/// What a worker tells [`NodeConfig::for_node`] besides the scenario: its initial weights and
/// their tensors' lengths, its inner optimiser's largest state, its clock's offset, whether it
/// writes checkpoints.
pub fn executor_side(
    opts: &WorkerOptions,
    initial: Vec<f32>,
    layers: Vec<usize>,
    own_max: u64,
) -> ExecutorSide {
    ExecutorSide {
        numerics: Numerics::Real { initial },
        layers,
        own_max,
        offset_s: opts.time_offset_s,
        checkpoints: opts.checkpoint.is_some(),
        virtual_padding: false,
        modelled_collectives: false,
    }
}

/// Loads a checkpoint into the inner loop and returns its outer state.
fn resume<L: InnerLoop>(
    opts: &WorkerOptions,
    name: &str,
    inner: &mut L,
    path: &std::path::Path,
) -> Result<OuterState, WorkerError> {
    let ck = crate::checkpoint::load(path)?;
    let bad = |what: String| WorkerError::Resume { path: path.to_path_buf(), what };
    if ck.meta.node != name {
        return Err(bad(format!("it is node {:?}'s, not {name:?}'s", ck.meta.node)));
    }
    let layout = inner.param_layout();
    if ck.snapshot.layout != layout {
        return Err(bad(format!(
            "its model has {} tensors of {} values, this one {} of {}",
            ck.snapshot.layout.len(),
            ck.snapshot.layout.iter().map(|(_, n)| n).sum::<usize>(),
            layout.len(),
            layout.iter().map(|(_, n)| n).sum::<usize>()
        )));
    }
    inner.load_state(&ck.snapshot.trainer_state(), &ck.snapshot.data_position)?;
    let snap = ck.snapshot;
    let cfg = outer_config(&opts.scenario);
    let mut o = OuterState::restore(
        cfg,
        snap.outer,
        snap.momentum,
        buckets_from_sizes(layout),
        snap.outer_step,
    )?;
    // Error feedback's residual, exactly as it was; a checkpoint without one (error feedback
    // off when it was written) starts it at zero, and one the run no longer uses is dropped.
    if cfg.feedback.is_some() && !snap.residual.is_empty() {
        o.set_residual(snap.residual)
            .map_err(|e| bad(format!("its error feedback residual: {e}")))?;
    } else if !snap.residual.is_empty() {
        tracing::info!(target: "loco_real", "{}: the checkpoint's error feedback residual is not used (error_feedback is off)", path.display());
    }
    Ok(o)
}

impl<L: InnerLoop> Worker<L> {
    async fn run(
        &mut self,
        shutdown: impl Future<Output = ()>,
    ) -> Result<WorkerReport, WorkerError> {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut shutting_down = false;
        loop {
            if let Some(report) = self.drain().await? {
                let (failures, last) = std::mem::take(&mut self.checkpoint_failures);
                if failures >= CHECKPOINT_FAILURES_LIMIT {
                    return Err(WorkerError::CheckpointsFailing { failures, last });
                }
                return Ok(report);
            }
            self.start_inner();
            if let Some(e) = &self.opts.exporter {
                e.recovery(self.process.node().recovery_progress());
            }
            let deadline = self.process.poll_timeout().map(|t| self.clock.instant(t));
            tokio::select! {
                r = self.t.recv() => {
                    let (from, frame) = r?;
                    self.process.handle_frame(self.clock.now(), from, frame);
                }
                // A first dial failed in the background: what was sent to that peer was lost.
                peer = self.unreachable.next() => {
                    tracing::debug!(node = %self.name, %peer, "unreachable");
                    self.process.peer_unreachable(self.clock.now(), peer);
                }
                // A hang holds what the application side finished until it ends.
                done = join(&mut self.inner_job), if self.inner_job.is_some() && !self.hung() => {
                    self.inner_job = None;
                    let (held, out) = done.map_err(|e| panicked("the inner loop", e))?;
                    self.held = Some(held);
                    self.on_inner(out?)?;
                }
                done = join(&mut self.outer_job), if self.outer_job.is_some() && !self.hung() => {
                    self.outer_job = None;
                    let job = done.map_err(|e| panicked("an outer job", e))?;
                    self.process.node_mut().outer_done(self.clock.now(), job);
                }
                Some(done) = self.preparing.join_next(), if !self.preparing.is_empty() && !self.hung() => {
                    let p = done.map_err(|e| panicked("preparing a state", e))?;
                    self.process.node_mut().state_prepared(self.clock.now(), p);
                }
                Some(done) = self.verifying.join_next(), if !self.verifying.is_empty() && !self.hung() => {
                    let r = done.map_err(|e| panicked("verifying a state", e))?;
                    self.on_verified(r);
                }
                () = tokio::time::sleep_until(deadline.unwrap_or_else(tokio::time::Instant::now)), if deadline.is_some() => {
                    self.process.handle_timeout(self.clock.now());
                }
                changed = hang_changed(&mut self.hang), if self.hang.is_some() => {
                    self.on_hang(changed)?;
                }
                () = &mut shutdown, if !shutting_down => {
                    shutting_down = true;
                    self.process.leave(self.clock.now(), LeaveReason::Signal);
                }
            }
        }
    }

    /// Carries out the process's outputs until it has none; `Some` when the process ended.
    async fn drain(&mut self) -> Result<Option<WorkerReport>, WorkerError> {
        let now = self.clock.now();
        while let Some(out) = self.process.poll(now) {
            match out {
                Output::Effect(e) => self.effect(e)?,
                Output::Transmit(to, frame) => self.transmit(to, frame).await?,
                Output::Stopped(s) => {
                    self.on_stop(&s).await?;
                    self.last_stop = Some(s.reason);
                }
                Output::Restarted { incarnation, after } => {
                    tracing::info!(node = %self.name, incarnation, "joined again after: {after}");
                }
                Output::Exit => {
                    let node = self.name.clone();
                    self.write(&MetricsLine::Resources { node, peak_rss_bytes: peak_rss_bytes() })?;
                    let stop = self.last_stop.take().unwrap_or(StopReason::Shutdown);
                    return Ok(Some(self.report(stop)));
                }
            }
        }
        Ok(None)
    }

    /// Sends one frame; a peer the transport cannot reach is the machine's to know.
    async fn transmit(&mut self, to: NodeId, frame: Frame) -> Result<(), WorkerError> {
        let phase = fault_phase(&frame.header);
        match self.t.send(to, frame).await {
            Ok(()) => {
                if let Some(p) = phase {
                    self.strike(p, self.process.node().outer_step().unwrap_or(0))?;
                }
            }
            Err(e) => {
                tracing::debug!(node = %self.name, peer = %to, "send failed: {e}");
                self.process.peer_unreachable(self.clock.now(), to);
            }
        }
        Ok(())
    }

    /// Carries out one effect.
    fn effect(&mut self, e: Effect) -> Result<(), WorkerError> {
        match e {
            Effect::Compute { outer_step, inner_steps, .. } => {
                let crash = self.armed(FaultPhase::Compute, outer_step);
                if crash {
                    let d = "SIGKILL during compute (fault injection)".to_string();
                    self.event(EventKind::Crash, None, d)?;
                }
                self.dirty = true;
                // The simulator counts a node's processes from 0, the launcher from 1.
                let draw = self.process.incarnation().saturating_sub(1 << 16);
                let eval = self.eval_weights(outer_step);
                let work = InnerWork::Compute { outer_step, draw, steps: inner_steps, crash, eval };
                self.queue.push_back(work);
            }
            Effect::SetParams(p) => self.pending.params = Some(p),
            Effect::Outer(job) => {
                let mut job = *job;
                // One thread per shard of this node's rings (its GPUs).
                let shards = usize::from(self.process.node().config().shards.max(1));
                self.outer_job = Some(tokio::task::spawn_blocking(move || {
                    job.run_sharded(shards);
                    job
                }));
            }
            Effect::PrepareState(job) => {
                if job.sends_own() {
                    self.queue.push_back(InnerWork::Export(job));
                } else {
                    self.preparing.spawn_blocking(move || job.prepare(None));
                }
            }
            Effect::VerifyState { received, params } => {
                self.verifying.spawn_blocking(move || received.verify(params));
            }
            Effect::Checkpoint { outer_step, snapshot } => {
                self.checkpoint(outer_step + 1, false, snapshot)
            }
            Effect::Row(row) => {
                self.dirty = false;
                self.write(&MetricsLine::Row(row))?;
                self.write_counters(false)?;
                let saved = self.held.as_mut().and_then(|h| h.checkpointer.as_mut()?.0.poll());
                if let Some(r) = saved {
                    self.on_saved(r)?;
                }
            }
            Effect::Event(ev) => self.node_event(ev)?,
            Effect::Check(c) => self.check(c)?,
            // The process carries out the stop ([`Output::Stopped`]).
            Effect::Stop { .. } => {}
            // Real runs move every frame (`modelled_collectives` is off here).
            Effect::ModelledAllReduce(_) => {
                tracing::warn!(target: "loco_real", "a modelled all-reduce was asked of a real node");
            }
        }
        Ok(())
    }

    fn hung(&self) -> bool {
        self.gate.is_hung()
    }

    /// The launcher said the node hangs (`Some(true)`), or no longer; `None`: it will say
    /// nothing more (the hang, if any, goes on).
    fn on_hang(&mut self, changed: Option<bool>) -> Result<(), WorkerError> {
        let Some(hung) = changed else {
            self.hang = None;
            return Ok(());
        };
        if hung == self.hung() {
            return Ok(());
        }
        let now = self.clock.now();
        self.gate.set(hung);
        if hung {
            self.process.suspend(now);
        } else {
            self.process.resume(now);
        }
        tracing::info!(node = %self.name, hung, "hang");
        Ok(())
    }

    /// Starts the next job on the inner loop when it is free.
    fn start_inner(&mut self) {
        if self.inner_job.is_some() || self.queue.is_empty() {
            return;
        }
        let Some(held) = self.held.take() else { return };
        let work = self.queue.pop_front().expect("not empty");
        let pending = std::mem::take(&mut self.pending);
        self.inner_job = Some(jobs::spawn(held, pending, work));
    }

    /// The global weights to evaluate before the inner steps of `outer_step`: those committed
    /// so far, copied, when `[real] eval_every` divides the step and this node holds the mesh's
    /// state.
    fn eval_weights(&self, outer_step: u64) -> Option<Vec<f32>> {
        let every = self.opts.scenario.real().eval_every;
        if every == 0 || !outer_step.is_multiple_of(every) || !self.process.node().is_synced() {
            return None;
        }
        self.process.node().outer().map(|o| o.outer().to_vec())
    }

    /// A job on the inner loop is done.
    fn on_inner(&mut self, out: InnerOut) -> Result<(), WorkerError> {
        let now = self.clock.now();
        match out {
            InnerOut::Computed { outer_step, result } => {
                let r = result?;
                self.process.node_mut().computed_tokens(
                    now,
                    outer_step,
                    Some(r.inner),
                    r.loss,
                    r.eval_loss,
                    r.tokens,
                );
            }
            InnerOut::Exported(job, own) => {
                let own = own?;
                self.preparing.spawn_blocking(move || job.prepare(Some(own)));
            }
            InnerOut::Checkpointed { steps, ticket } => {
                // The snapshot holds `steps` outer steps: that of the last one committed.
                self.strike(FaultPhase::Checkpoint, steps.saturating_sub(1))?;
                match ticket {
                    Ok(t) => {
                        if let Some(prev) = t.previous {
                            self.on_saved(prev)?;
                        }
                    }
                    Err(e) => self.on_saved(Err(e))?,
                }
            }
            InnerOut::Nothing => {}
        }
        Ok(())
    }

    /// A verified state (or why not) for the machine; the own part waits for the machine to
    /// take the state (its `recovery-done`).
    fn on_verified(&mut self, r: VerifyResult) {
        let r = r.map(|mut v| {
            self.verified_own = v.own.take();
            v
        });
        self.process.node_mut().state_verified(self.clock.now(), r);
    }

    /// Queues a checkpoint of the outer state of `steps` steps (when one is written and not
    /// taken yet). The outer weights and momentum are copied here; the rest on the inner loop.
    fn checkpoint(&mut self, steps: u64, dirty: bool, snapshot: Option<Snapshot>) {
        if self.opts.checkpoint.is_none() || steps == 0 || self.checkpointed == Some(steps) {
            return;
        }
        let Some(o) = self.process.node().outer() else { return };
        if o.steps() != steps {
            return;
        }
        // The commit's job copied the state off the loop; a stop's checkpoint copies it here
        // (the node has left: no heartbeats to keep).
        let (outer, momentum, residual) = match snapshot {
            Some(s) if s.outer.len() == o.len() && s.momentum.len() == o.len() => {
                (s.outer, s.momentum, s.residual)
            }
            _ => (o.outer().to_vec(), o.momentum().to_vec(), o.residual().to_vec()),
        };
        self.checkpointed = Some(steps);
        self.queue.push_back(InnerWork::Checkpoint { steps, outer, momentum, residual, dirty });
    }

    /// The membership stopped: the outer state and the inner loop come back, a node that holds
    /// the mesh's state checkpoints its last commit, and the counters are written.
    async fn on_stop(&mut self, s: &Stopped) -> Result<(), WorkerError> {
        let now = self.clock.now();
        if let Some(h) = self.outer_job.take() {
            let job = h.await.map_err(|e| panicked("an outer job", e))?;
            self.process.node_mut().outer_done(now, job);
        }
        // Aborted and gone before the next membership: none of their results is for it.
        self.preparing.shutdown().await;
        self.verifying.shutdown().await;
        // A checkpoint still waiting in the queue is dropped with it, and written below with
        // the stop's own (the state it would have saved is the one held now).
        let queued = |w: &InnerWork| matches!(w, InnerWork::Checkpoint { steps, .. } if Some(*steps) == self.checkpointed);
        if self.queue.iter().any(queued) {
            self.checkpointed = None;
        }
        self.queue.clear();
        self.verified_own = None;
        // The steps under way are for nobody now: a hung node's would wait for its hang to end,
        // and this loop with them.
        self.gate.abort(true);
        let waited = self.wait_inner().await;
        self.gate.abort(false);
        waited?;
        if let Some(row) = &s.row {
            self.event(row.kind, row.epoch, row.detail.clone())?;
        }
        if s.holds_state
            && let Some(steps) = self.process.node().outer().map(OuterState::steps)
        {
            self.checkpoint(steps, self.dirty, None);
            self.start_inner();
            self.wait_inner().await?;
        }
        self.pending = jobs::Pending::default();
        self.flush_checkpoints()?;
        self.write_counters(true)
    }

    /// Waits for the job on the inner loop; only a checkpoint's outcome is kept.
    async fn wait_inner(&mut self) -> Result<(), WorkerError> {
        let Some(h) = self.inner_job.take() else { return Ok(()) };
        let (held, out) = h.await.map_err(|e| panicked("the inner loop", e))?;
        self.held = Some(held);
        match out? {
            c @ InnerOut::Checkpointed { .. } => self.on_inner(c),
            _ => Ok(()),
        }
    }
}

fn panicked(what: &str, e: tokio::task::JoinError) -> WorkerError {
    WorkerError::Inner(InnerError::Backend(format!("{what} panicked: {e}")))
}

/// The next value of the hang flag; `None` once its sender is gone.
async fn hang_changed(rx: &mut Option<tokio::sync::watch::Receiver<bool>>) -> Option<bool> {
    let rx = rx.as_mut()?;
    rx.changed().await.ok()?;
    Some(*rx.borrow_and_update())
}

/// The output of `h`'s task; pending while there is none (a `select!` arm guards it).
async fn join<T>(h: &mut Option<tokio::task::JoinHandle<T>>) -> Result<T, tokio::task::JoinError> {
    match h.as_mut() {
        Some(h) => h.await,
        None => std::future::pending().await,
    }
}
