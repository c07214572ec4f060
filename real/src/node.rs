//! A real worker process: the mesh [`Member`], the ring all-reduce and the DiLoCo outer state
//! over TCP, around an [`InnerLoop`] (the libtorch trainer, or a synthetic objective).
//!
//! One tokio task runs the protocol: it `select!`s over incoming frames, the member's next
//! deadline, the end of the inner steps (which run on a blocking thread, so heartbeats go on
//! while the model trains) and a shutdown signal, and executes the member's actions. Nothing is
//! applied before the coordinator's `Commit`, so every replica takes the same outer step.

use crate::checkpoint::{CheckpointConfig, CheckpointError, Checkpointer, Snapshot};
use crate::inner::{InnerError, InnerLoop, InnerStats};
use crate::tcp::{TcpConfig, TcpError, TcpTransport};
use bytes::Bytes;
use loco_core::codec::CodecKind;
use loco_core::diloco::{DilocoError, OuterConfig, OuterState, buckets_from_sizes};
use loco_core::ids::{Epoch, NodeId};
use loco_core::mesh::{
    AllReduceStart, LeaveReason, Member, MemberAction, MeshConfig, MeshError, StopReason,
    padded_frame,
};
use loco_core::metrics::{EventKind, EventRow, OuterStepRow};
use loco_core::node::acct::{RowIdentity, Span, StepAcct};
use loco_core::node::rings::{Admission, Inbox, ShardRings, Values};
use loco_core::node::state::{
    DEFAULT_EARLY_BYTES, EarlyPieces, Expect, PART_OWN, PART_SHARED, PieceRule, ReplayLog, Share,
    SharedState, StateAssembly, Verified, VerifyFailed, share_of, state_digest,
};
use loco_core::scenario::FaultPhase;
use loco_core::time::Time;
use loco_core::transport::{Body, Frame, Header, StateHeader, Transport};
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// How a worker runs.
#[derive(Clone, Debug)]
pub struct WorkerOptions {
    /// This node's id (its index in the scenario's node list).
    pub id: NodeId,
    /// This node's name, for the metrics.
    pub name: String,
    /// Distinguishes restarts of the same node.
    pub incarnation: u64,
    /// Where the coordinator listens.
    pub coordinator: SocketAddr,
    /// Where this worker listens for its peers (port 0: any).
    pub listen: SocketAddr,
    /// Mesh settings.
    pub mesh: MeshConfig,
    /// Inner steps per outer step (DiLoCo's H).
    pub inner_steps: u32,
    /// Codec of the all-reduce.
    pub codec: CodecKind,
    /// The outer optimiser.
    pub outer: OuterConfig,
    /// Pipelining unit of the all-reduce, in values (`None`: the all-reduce picks).
    pub segment_elems: Option<usize>,
    /// Local shards: this node runs one ring per shard over 1/G of the vector each, all in one
    /// epoch (the scenario's `gpus`).
    pub shards: u16,
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
    pub status: Option<crate::launch::StatusSender>,
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
/// `phase` at or after `after_s` seconds since it started.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fault {
    /// Where it strikes.
    pub phase: FaultPhase,
    /// Armed from this time on (seconds since this process started).
    pub after_s: f64,
}

impl std::str::FromStr for Fault {
    type Err = String;
    /// `PHASE@SECONDS`, like `reduce-scatter@3.5`.
    fn from_str(s: &str) -> Result<Fault, String> {
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
        Ok(Fault { phase, after_s })
    }
}

/// How a worker ended.
#[derive(Clone, Debug)]
pub struct WorkerReport {
    /// Why it stopped.
    pub stop: StopReason,
    /// Outer steps it committed.
    pub committed: u64,
    /// Digest of its outer weights at the end.
    pub weights_hash: String,
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
    /// The transport closed under the worker.
    #[error("transport: {0}")]
    Transport(#[from] loco_core::transport::TransportError),
    /// Writing the metrics.
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    /// The checkpoint to resume from, or the checkpoint settings.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// A checkpoint that does not belong to this worker or model.
    #[error("resume from {path}: {what}")]
    Resume {
        /// The checkpoint directory.
        path: PathBuf,
        /// What does not match.
        what: String,
    },
}

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
    /// The process's peak resident memory, written when it stops.
    Resources {
        /// The node.
        node: String,
        /// Peak resident set size in bytes (Linux `VmHWM`), when known.
        peak_rss_bytes: Option<u64>,
    },
}

/// Peak resident set size of this process in bytes (Linux: `VmHWM` of /proc/self/status).
pub fn peak_rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

pub use loco_core::node::digest::weights_digest;

/// The largest own part (the inner optimiser's exported state) a joiner accepts for a model of
/// `n` parameters: AdamW's two moments are 8 bytes per parameter; twice that and 64 MiB leave
/// room for the schedule, the data position and the encoding.
fn own_part_max(n: usize) -> u64 {
    (n as u64).saturating_mul(16).saturating_add(64 << 20)
}

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

/// A state transfer being received.
struct Fetch {
    /// The pieces, checked and assembled (core's one implementation).
    assembly: StateAssembly,
    /// Non-blocking mode: the results this node committed while the transfer ran, replayed onto
    /// the received state.
    log: ReplayLog,
}

/// A state serialised and hashed for a joiner, its pieces not yet queued.
struct PreparedState {
    epoch: Epoch,
    to: NodeId,
    outer_step: u64,
    /// This node's share of the transfer.
    share: Share,
    /// `(part, digest, bytes)`.
    parts: Vec<(u32, String, Bytes)>,
}

/// A received state whose last steps wait for the inner loop (non-blocking mode: it was computing
/// when the state arrived, from parameters that were not the mesh's).
struct PendingSync {
    own: Vec<u8>,
}

struct Worker<L: InnerLoop> {
    opts: WorkerOptions,
    clock: Clock,
    t: TcpTransport,
    member: Member,
    inner: Option<L>,
    outer: Option<OuterState>,
    /// The running all-reduce: one ring per local shard.
    rings: Option<ShardRings>,
    /// Collective frames on their way to the rings: stale ones counted, early ones held.
    inbox: Inbox,
    fetch: Option<Fetch>,
    pending_sync: Option<PendingSync>,
    deferred_sends: Vec<(Epoch, NodeId, Vec<NodeId>)>,
    /// States being serialised and hashed for joiners, off the event loop.
    preparing: tokio::task::JoinSet<Result<PreparedState, InnerError>>,
    /// A received state being verified and decoded, off the event loop (at most one; while it
    /// runs, further state pieces are dropped).
    verifying: tokio::task::JoinSet<Result<Verified, Box<VerifyFailed>>>,
    /// The accounting of the outer step this node is in (opened at admission and at each
    /// compute, closed at the commit or skip).
    acct: Option<StepAcct>,
    /// Bytes this node has sent, for the rows.
    bytes_sent: u64,
    metrics: Option<MetricsFile>,
    checkpointer: Option<(Checkpointer, u64)>,
    /// The outer step count of the last checkpoint taken.
    checkpointed: Option<u64>,
    /// The inner loop has moved since the last commit (a checkpoint now would not be one of a
    /// step boundary).
    inner_dirty: bool,
    /// State pieces that arrived before this node learnt it is to receive them.
    early_state: EarlyPieces,
    /// The inner loop's parameter layout (known while it computes).
    layout: Vec<(String, usize)>,
    stop: Option<StopReason>,
}

type ComputeResult<L> = (L, Result<Vec<InnerStats>, InnerError>);

/// Runs a worker until it stops (the run ends, it is evicted, it leaves, or the coordinator is
/// lost). `shutdown` resolving makes it leave gracefully (its deathrattle).
pub async fn run_worker<L: InnerLoop>(
    opts: WorkerOptions,
    inner: L,
    shutdown: impl Future<Output = ()>,
) -> Result<WorkerReport, WorkerError> {
    let clock = Clock { start: tokio::time::Instant::now(), offset_s: opts.time_offset_s };
    let mut t = TcpTransport::bind(opts.id, opts.listen, opts.tcp.clone()).await?;
    t.set_peer_addr(NodeId::COORDINATOR, opts.coordinator);
    let metrics = MetricsFile::open(opts.metrics.as_deref())?;
    let member = Member::new(opts.id, opts.incarnation, opts.mesh.clone(), opts.shards.max(1));
    let checkpointer = match &opts.checkpoint {
        Some(plan) => Some((Checkpointer::new(plan.config.clone())?, plan.every.max(1))),
        None => None,
    };
    let layout = inner.param_layout();
    let mut w = Worker {
        layout,
        opts,
        clock,
        t,
        member,
        inner: Some(inner),
        outer: None,
        rings: None,
        inbox: Inbox::default(),
        fetch: None,
        pending_sync: None,
        deferred_sends: Vec::new(),
        preparing: tokio::task::JoinSet::new(),
        verifying: tokio::task::JoinSet::new(),
        acct: None,
        bytes_sent: 0,
        metrics,
        checkpointer,
        checkpointed: None,
        inner_dirty: false,
        early_state: EarlyPieces::new(DEFAULT_EARLY_BYTES),
        stop: None,
    };
    tracing::info!(node = %w.opts.name, incarnation = w.opts.incarnation, "worker started");
    if let Some(path) = w.opts.resume.clone() {
        w.resume(&path)?;
    }
    w.member.join(w.clock.now())?;
    w.run(shutdown).await
}

impl<L: InnerLoop> Worker<L> {
    async fn run(
        &mut self,
        shutdown: impl Future<Output = ()>,
    ) -> Result<WorkerReport, WorkerError> {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut shutting_down = false;
        let mut compute: Option<tokio::task::JoinHandle<ComputeResult<L>>> = None;
        loop {
            while let Some(a) = self.member.poll_action() {
                if let Some(h) = self.act(a).await? {
                    compute = Some(h);
                }
            }
            if let Some(stop) = self.stop.take() {
                if let Some(h) = compute.take() {
                    h.abort();
                }
                return Ok(self.report(stop));
            }
            let deadline = self.member.poll_timeout().map(|t| self.clock.instant(t));
            tokio::select! {
                r = self.t.recv() => {
                    let (from, frame) = r?;
                    self.on_frame(from, frame).await?;
                }
                done = async { compute.as_mut().expect("guarded").await }, if compute.is_some() => {
                    compute = None;
                    let (inner, stats) = done.map_err(|e| InnerError::Backend(format!("inner steps panicked: {e}")))?;
                    self.inner = Some(inner);
                    self.on_computed(stats?)?;
                    for (epoch, to, senders) in std::mem::take(&mut self.deferred_sends) {
                        self.send_state(epoch, to, senders)?;
                    }
                }
                Some(done) = self.preparing.join_next(), if !self.preparing.is_empty() => {
                    let prepared = done.map_err(|e| InnerError::Backend(format!("preparing a state panicked: {e}")))??;
                    self.queue_state(prepared).await?;
                }
                Some(done) = self.verifying.join_next(), if !self.verifying.is_empty() => {
                    let checked = done.map_err(|e| InnerError::Backend(format!("verifying a state panicked: {e}")))?;
                    self.on_verified(checked)?;
                }
                () = tokio::time::sleep_until(deadline.unwrap_or_else(tokio::time::Instant::now)), if deadline.is_some() => {
                    self.member.handle_timeout(self.clock.now());
                }
                () = &mut shutdown, if !shutting_down => {
                    shutting_down = true;
                    self.member.leave(self.clock.now(), LeaveReason::Signal);
                }
            }
        }
    }

    /// Starts from a checkpoint: the inner loop's state and data position, and the outer state.
    fn resume(&mut self, path: &std::path::Path) -> Result<(), WorkerError> {
        let ck = crate::checkpoint::load(path)?;
        let bad = |what: String| WorkerError::Resume { path: path.to_path_buf(), what };
        if ck.meta.node != self.opts.name {
            return Err(bad(format!(
                "it is node {:?}'s, not {:?}'s",
                ck.meta.node, self.opts.name
            )));
        }
        let inner = self.inner.as_mut().expect("not computing before the start");
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
        self.outer = Some(OuterState::restore(
            self.opts.outer,
            snap.outer,
            snap.momentum,
            buckets_from_sizes(layout),
            snap.outer_step,
        )?);
        let hash = weights_digest(self.outer.as_ref().expect("just set").outer());
        self.event(
            EventKind::Start,
            format!(
                "resumed from checkpoint {} at outer step {} (weights {hash})",
                path.display(),
                snap.outer_step
            ),
        )
    }

    /// Whether a fault armed for `phase` strikes now.
    fn armed(&self, phase: FaultPhase) -> bool {
        let now = self.clock.start.elapsed().as_secs_f64();
        self.opts.faults.iter().any(|f| f.phase == phase && now >= f.after_s)
    }

    /// Fault injection: records the crash, then kills this process with SIGKILL (no cleanup, no
    /// deathrattle: what a machine failure looks like to the others).
    fn strike(&mut self, phase: FaultPhase) -> Result<(), WorkerError> {
        if !self.armed(phase) {
            return Ok(());
        }
        self.event(EventKind::Crash, format!("SIGKILL during {phase} (fault injection)"))?;
        kill_self();
        Ok(())
    }

    /// Snapshots the state for a checkpoint when one is due (every `checkpoint_every` outer
    /// steps, or `force`d at a stop); returns the seconds it cost training (the copy, and a wait
    /// for the previous save).
    ///
    /// A checkpoint at a commit is exact: resuming from it continues the run bit for bit. One
    /// forced at a stop after the inner loop moved on holds the committed outer state and the
    /// committed weights as parameters; the inner optimiser's moments, schedule and data position
    /// are as of the stop (the interrupted step's inner work is the only thing not kept).
    fn checkpoint(&mut self, force: bool) -> Result<f64, WorkerError> {
        let Some((_, every)) = &self.checkpointer else { return Ok(0.0) };
        let Some(outer) = self.outer.as_ref() else { return Ok(0.0) };
        let steps = outer.steps();
        let due = force || steps.is_multiple_of(*every);
        if steps == 0 || !due || self.checkpointed == Some(steps) {
            return Ok(0.0);
        }
        let Some(inner) = self.inner.as_ref() else { return Ok(0.0) };
        self.checkpointed = Some(steps);
        let t0 = self.clock.secs();
        let (mut trainer, data_position) = inner.save_state()?;
        if self.inner_dirty && trainer.params.len() == outer.len() {
            trainer.params.copy_from_slice(outer.outer());
        }
        let snap = Snapshot::from_trainer(
            steps,
            data_position,
            outer.outer().to_vec(),
            outer.momentum().to_vec(),
            trainer,
        );
        let (ck, _) = self.checkpointer.as_mut().expect("checked");
        let ticket = ck.save(snap);
        let spent = self.clock.secs() - t0;
        self.strike(FaultPhase::Checkpoint)?;
        match ticket {
            Ok(t) => {
                if let Some(prev) = t.previous {
                    self.on_saved(prev)?;
                }
            }
            Err(e) => self.event(EventKind::Checkpoint, format!("checkpoint failed: {e}"))?,
        }
        Ok(spent)
    }

    /// Records a finished background save.
    fn on_saved(
        &mut self,
        r: Result<crate::checkpoint::Saved, CheckpointError>,
    ) -> Result<(), WorkerError> {
        match r {
            Ok(s) => self.event(
                EventKind::Checkpoint,
                format!(
                    "saved {} ({} bytes)",
                    crate::checkpoint::step_dir_name(s.outer_step),
                    s.bytes
                ),
            ),
            Err(e) => {
                tracing::warn!(node = %self.opts.name, "checkpoint failed: {e}");
                self.event(EventKind::Checkpoint, format!("checkpoint failed: {e}"))
            }
        }
    }

    /// Waits for the checkpoint being written (a graceful stop loses nothing).
    fn flush_checkpoints(&mut self) -> Result<(), WorkerError> {
        let r = match self.checkpointer.as_mut() {
            Some((ck, _)) => ck.flush(),
            None => return Ok(()),
        };
        match r {
            Ok(Some(saved)) => self.on_saved(Ok(saved)),
            Ok(None) => Ok(()),
            Err(e) => self.on_saved(Err(e)),
        }
    }

    /// Opens the row of `step` (once: admission and the compute that follows share it).
    fn open_row(&mut self, step: u64, now: Time) {
        if self.acct.as_ref().is_some_and(|a| a.step() == step) {
            return;
        }
        let epoch = self.member.epoch().unwrap_or_default();
        self.acct = Some(StepAcct::open(step, now, epoch, self.bytes_sent));
    }

    /// The time since `started_s` (on this process's clock, in seconds) that this node's loop
    /// spent on live recovery.
    fn spend_recovery(&mut self, started_s: f64) {
        let d = Duration::from_secs_f64((self.clock.secs() - started_s).max(0.0));
        if let Some(a) = self.acct.as_mut() {
            if a.current() == Some(Span::Recovery) {
                return; // already counted by the span
            }
            a.spend(Span::Recovery, d);
        }
    }

    fn report(&self, stop: StopReason) -> WorkerReport {
        let (committed, weights_hash) = match &self.outer {
            Some(o) => (o.steps(), weights_digest(o.outer())),
            None => (0, String::new()),
        };
        WorkerReport { stop, committed, weights_hash }
    }

    fn write(&mut self, line: &MetricsLine) -> Result<(), WorkerError> {
        if let Some(s) = &self.opts.status {
            s.metrics(line);
        }
        match self.metrics.as_mut() {
            Some(f) => Ok(f.write(line)?),
            None => Ok(()),
        }
    }

    fn event(&mut self, kind: EventKind, detail: String) -> Result<(), WorkerError> {
        let mut e =
            EventRow::new(self.clock.secs(), kind).node(self.opts.name.clone()).detail(detail);
        if let Some(ep) = self.member.epoch() {
            e = e.epoch(ep.0);
        }
        tracing::info!(node = %self.opts.name, kind = kind.as_str(), "{}", e.detail);
        self.write(&MetricsLine::Event(e))
    }

    fn params(&self) -> Result<Vec<f32>, WorkerError> {
        let inner = self
            .inner
            .as_ref()
            .ok_or_else(|| InnerError::Backend("the inner loop is busy computing".into()))?;
        let mut p = vec![0.0f32; inner.num_params()];
        inner.params_into(&mut p)?;
        Ok(p)
    }

    /// `pseudo_gradient = outer - inner`, written in place (no copy of the weights).
    fn refresh_pseudo_gradient(&mut self) -> Result<(), WorkerError> {
        let inner = self
            .inner
            .as_ref()
            .ok_or_else(|| InnerError::Backend("the inner loop is busy computing".into()))?;
        let outer = self.outer.as_mut().ok_or(InnerError::Backend("no outer state".into()))?;
        outer.compute_pseudo_gradient_with(|buf| inner.params_into(buf))?;
        Ok(())
    }

    /// Copies the outer weights into the inner model; returns their digest.
    fn sync_inner_to_outer(&mut self) -> Result<String, WorkerError> {
        let outer = self.outer.as_ref().ok_or(InnerError::Backend("no outer state".into()))?;
        if let Some(inner) = self.inner.as_mut() {
            inner.set_params(outer.outer())?;
        }
        Ok(weights_digest(outer.outer()))
    }

    fn ensure_outer(&mut self) -> Result<(), WorkerError> {
        if self.outer.is_none() {
            let layout = self.inner.as_ref().map(|i| i.param_layout()).unwrap_or_default();
            let p = self.params()?;
            self.outer = Some(OuterState::new(self.opts.outer, p, buckets_from_sizes(layout))?);
        }
        Ok(())
    }

    async fn send(&mut self, to: NodeId, frame: Frame) -> bool {
        let n = frame.wire_len();
        match self.t.send(to, frame).await {
            Ok(()) => {
                self.bytes_sent += n;
                true
            }
            Err(e) => {
                tracing::debug!(node = %self.opts.name, peer = %to, "send failed: {e}");
                false
            }
        }
    }

    /// Executes one member action; returns a compute task when it started one.
    async fn act(
        &mut self,
        a: MemberAction,
    ) -> Result<Option<tokio::task::JoinHandle<ComputeResult<L>>>, WorkerError> {
        match a {
            MemberAction::Send { to, msg, padding } => {
                self.send(to, padded_frame(msg, padding, false)).await;
            }
            MemberAction::Admitted { epoch, outer_step } => {
                self.ensure_outer()?;
                self.open_row(outer_step, self.clock.now());
                self.event(
                    loco_core::node::events::admission_kind(epoch),
                    format!("admitted at outer step {outer_step}"),
                )?;
            }
            MemberAction::EpochChanged { epoch, members } => {
                self.event(EventKind::Epoch, format!("{epoch}: {} members", members.len()))?;
            }
            MemberAction::Compute { epoch, outer_step } => {
                self.ensure_outer()?;
                self.finish_pending_sync()?;
                let crash_in_compute = self.armed(FaultPhase::Compute);
                if crash_in_compute {
                    self.event(
                        EventKind::Crash,
                        "SIGKILL during compute (fault injection)".to_string(),
                    )?;
                }
                let inner = self.inner.take().ok_or_else(|| {
                    InnerError::Backend(format!(
                        "asked to compute step {outer_step} while computing"
                    ))
                })?;
                self.inner_dirty = true;
                let now = self.clock.now();
                self.open_row(outer_step, now);
                if let Some(a) = self.acct.as_mut() {
                    a.set_epoch(epoch);
                    a.enter(Span::Compute, now);
                }
                let h = self.opts.inner_steps;
                let handle = tokio::task::spawn_blocking(move || {
                    let mut inner = inner;
                    let mut stats = Vec::with_capacity(h as usize);
                    for _ in 0..h {
                        match inner.step() {
                            Ok(s) => stats.push(s),
                            Err(e) => return (inner, Err(e)),
                        }
                        if crash_in_compute {
                            kill_self();
                        }
                    }
                    (inner, Ok(stats))
                });
                return Ok(Some(handle));
            }
            MemberAction::FetchState { epoch, senders } => {
                let names: Vec<String> = senders.iter().map(ToString::to_string).collect();
                match self.fetch.as_mut() {
                    // A sender died: new senders, and what already arrived is kept.
                    Some(f) => {
                        let r = f.assembly.reassign(epoch, senders);
                        self.event(
                            EventKind::RecoveryStart,
                            format!(
                                "senders now {}; {} bytes already held are kept",
                                names.join(", "),
                                r.kept_bytes
                            ),
                        )?;
                    }
                    None => {
                        let blocking =
                            self.opts.mesh.join_mode == loco_core::mesh::JoinMode::Blocking;
                        let n = self.outer.as_ref().map_or(0, OuterState::len);
                        let expect = Expect::real(n, own_part_max(n));
                        self.fetch = Some(Fetch {
                            assembly: StateAssembly::new(epoch, senders, blocking, expect),
                            log: ReplayLog::default(),
                        });
                        self.event(
                            EventKind::RecoveryStart,
                            format!("receiving the state from {}", names.join(", ")),
                        )?;
                        if matches!(
                            self.member.phase(),
                            loco_core::mesh::MemberPhase::Syncing { .. }
                        ) {
                            let now = self.clock.now();
                            if let Some(a) = self.acct.as_mut() {
                                a.enter(Span::Recovery, now);
                            }
                        }
                    }
                }
                if let Some(f) = self.fetch.as_mut() {
                    let fed = f.assembly.feed(&mut self.early_state);
                    for r in &fed.refused {
                        tracing::warn!(node = %self.opts.name, "state piece refused: {r}");
                    }
                }
                self.verify_when_complete();
            }
            MemberAction::SendState { epoch, to, senders } => {
                self.send_state(epoch, to, senders)?
            }
            MemberAction::StartAllReduce(start) => self.start_ring(start).await?,
            MemberAction::AbortAllReduce { epoch, op } => {
                if let Some(rings) = self.rings.take() {
                    if rings.collective() == (epoch, op) {
                        self.return_values(rings)?;
                        self.event(
                            EventKind::Retry,
                            format!("all-reduce {epoch}/op {op} aborted"),
                        )?;
                    } else {
                        self.rings = Some(rings);
                    }
                }
                self.inbox.abort(epoch, op);
            }
            MemberAction::Commit { epoch, outer_step } => {
                let hash = self.close_step(outer_step, true)?;
                self.finish_step(epoch, outer_step, hash)?;
            }
            MemberAction::SkipStep { epoch, outer_step, attempts } => {
                if let Some(a) = self.acct.as_mut() {
                    a.set_retries(attempts.saturating_sub(1));
                }
                let hash = self.close_step(outer_step, false)?;
                self.event(
                    EventKind::SkipStep,
                    format!("outer step {outer_step} skipped after {attempts} attempts"),
                )?;
                self.finish_step(epoch, outer_step, hash)?;
            }
            MemberAction::Stop(reason) => {
                let kind = loco_core::node::events::stop_kind(&reason);
                self.event(kind, reason.to_string())?;
                // An evicted node, or one that never held the mesh's state, has nothing to keep.
                let holds = !matches!(
                    reason,
                    StopReason::Evicted(_) | StopReason::NoSyncedMember { synced: false, .. }
                );
                if holds {
                    // The last commit, when the inner loop has not moved on since.
                    self.checkpoint(true)?;
                }
                self.flush_checkpoints()?;
                let node = self.opts.name.clone();
                self.write(&MetricsLine::Resources { node, peak_rss_bytes: peak_rss_bytes() })?;
                // Let the deathrattle and the last frames leave before the process exits.
                tokio::time::sleep(Duration::from_millis(100)).await;
                self.stop = Some(reason);
            }
        }
        Ok(None)
    }

    /// Ends `outer_step` as every member does: applies the all-reduce's result (`apply`) or skips
    /// the update, resets the inner weights to the outer ones, and takes a checkpoint when one is
    /// due; returns the digest of the outer weights (empty while this node does not hold the
    /// mesh's state yet).
    fn close_step(&mut self, outer_step: u64, apply: bool) -> Result<String, WorkerError> {
        let outer = self
            .outer
            .as_mut()
            .ok_or(InnerError::Backend("end of a step without outer state".into()))?;
        if let Some(f) = self.fetch.as_mut() {
            f.log.push(outer_step, apply.then(|| outer.pseudo_gradient().to_vec()));
        }
        if let Some(a) = self.acct.as_mut() {
            a.enter(Span::Outer, self.clock.now());
        }
        // A state received meanwhile (non-blocking join) may already hold this step.
        if outer.steps() == outer_step {
            if apply {
                outer.apply_outer_step();
            } else {
                outer.skip_outer_step();
            }
        }
        let mut hash = self.sync_inner_to_outer()?;
        if self.fetch.is_some() {
            // A non-blocking joiner still receiving the state holds its own weights, not the
            // mesh's: no digest to compare (as in the simulator).
            hash.clear();
        }
        self.inner_dirty = false;
        self.early_state.clear();
        if let Some(a) = self.acct.as_mut() {
            a.enter(Span::Checkpoint, self.clock.now());
        }
        self.checkpoint(false)?;
        Ok(hash)
    }

    fn on_computed(&mut self, stats: Vec<InnerStats>) -> Result<(), WorkerError> {
        let now = self.clock.now();
        if let Some(a) = self.acct.as_mut() {
            a.trained(stats.iter().map(|s| s.tokens).sum(), stats.last().and_then(|s| s.loss));
            a.enter(Span::Outer, now);
        }
        self.refresh_pseudo_gradient()?;
        if let Some(a) = self.acct.as_mut() {
            a.enter(Span::Barrier, self.clock.now());
        }
        let outer_step = match self.member.phase() {
            loco_core::mesh::MemberPhase::Computing { outer_step } => outer_step,
            _ => return Ok(()), // stopped or evicted meanwhile
        };
        self.member.barrier_arrive(self.clock.now(), outer_step)?;
        Ok(())
    }

    fn finish_step(
        &mut self,
        epoch: Epoch,
        outer_step: u64,
        hash: String,
    ) -> Result<(), WorkerError> {
        let Some(mut a) = self.acct.take() else { return Ok(()) };
        if a.step() != outer_step {
            self.acct = Some(a);
            return Ok(());
        }
        a.set_epoch(epoch);
        let who = RowIdentity {
            node: self.opts.name.clone(),
            node_id: self.opts.id.0,
            offset_s: self.opts.time_offset_s,
        };
        let row = a.close(self.clock.now(), self.bytes_sent, &who, hash);
        self.write(&MetricsLine::Row(row))?;
        if let Some(r) = self.checkpointer.as_mut().and_then(|(c, _)| c.poll()) {
            self.on_saved(r)?;
        }
        Ok(())
    }

    async fn start_ring(&mut self, s: AllReduceStart) -> Result<(), WorkerError> {
        self.ensure_outer()?;
        // Recompute the pseudo-gradient: a retry starts again from the kept inputs.
        self.refresh_pseudo_gradient()?;
        let g = self.outer.as_mut().expect("outer state").take_pseudo_gradient();
        if let Some(a) = self.acct.as_mut() {
            a.enter(Span::AllReduce, self.clock.now());
            let world = u32::try_from(s.ring.len()).unwrap_or(u32::MAX);
            a.ring(s.epoch, world, f64::from(s.weight.get()), s.attempt);
        }
        let (epoch, op) = (s.epoch, s.op);
        let rings = match ShardRings::new(
            s,
            self.opts.id,
            self.opts.codec,
            Values::Real(g),
            self.opts.segment_elems,
        ) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(node = %self.opts.name, "cannot start the all-reduce: {}", e.source);
                if let Values::Real(g) = e.values {
                    self.outer.as_mut().expect("outer state").put_pseudo_gradient(g)?;
                }
                self.member.report_allreduce_failed(self.clock.now(), epoch, op)?;
                return Ok(());
            }
        };
        let early = self.inbox.take_for(rings.collective());
        self.rings = Some(rings);
        for (from, f) in early {
            self.feed_rings(from, &f)?;
        }
        self.pump_ring().await
    }

    /// Gives the values of a finished or abandoned all-reduce back to the outer state (after a
    /// failure they are unspecified; the next attempt recomputes them).
    fn return_values(&mut self, rings: ShardRings) -> Result<(), WorkerError> {
        let n = self.outer.as_ref().map_or(0, OuterState::len);
        let g = rings.into_values().unwrap_or_else(|| vec![0.0; n]);
        if let Some(o) = self.outer.as_mut() {
            o.put_pseudo_gradient(g)?;
        }
        Ok(())
    }

    async fn pump_ring(&mut self) -> Result<(), WorkerError> {
        loop {
            let Some(rings) = self.rings.as_mut() else { return Ok(()) };
            let Some((to, f)) = rings.poll_send() else { break };
            let phase = match &f.header {
                Header::Collective(h) if h.phase == loco_core::transport::Phase::AllGather => {
                    FaultPhase::AllGather
                }
                _ => FaultPhase::ReduceScatter,
            };
            let sent = self.send(to, f).await;
            if sent {
                self.strike(phase)?;
            }
            if !sent {
                let rings = self.rings.take().expect("rings");
                let (epoch, op) = rings.collective();
                self.return_values(rings)?;
                self.event(EventKind::AllreduceFailed, format!("{} unreachable", to))?;
                let _ = self.member.report_allreduce_failed(self.clock.now(), epoch, op);
                return Ok(());
            }
        }
        if self.rings.as_ref().is_some_and(ShardRings::is_done) {
            let rings = self.rings.take().expect("rings");
            let (epoch, op) = rings.collective();
            self.return_values(rings)?;
            let _ = self.member.report_allreduce_done(self.clock.now(), epoch, op);
        }
        Ok(())
    }

    /// Feeds one collective frame to the running rings; a refused frame is logged and dropped
    /// (the collective fails by its neighbours' timeouts or is retried on a new epoch).
    fn feed_rings(&mut self, from: NodeId, f: &Frame) -> Result<(), WorkerError> {
        if let Some(rings) = self.rings.as_mut() {
            if let Err(e) = rings.handle_frame(from, f) {
                tracing::warn!(node = %self.opts.name, peer = %from, "dropped a collective frame: {e}");
            }
        }
        Ok(())
    }

    async fn on_frame(&mut self, from: NodeId, frame: Frame) -> Result<(), WorkerError> {
        match &frame.header {
            Header::Mesh(_) => {
                let Header::Mesh(msg) = frame.header else { unreachable!() };
                self.member.handle_message(self.clock.now(), from, msg);
                Ok(())
            }
            Header::Collective(_) => self.on_collective(from, frame).await,
            Header::State(h) => {
                let h = h.clone();
                self.on_state(from, h, frame.body)
            }
        }
    }

    async fn on_collective(&mut self, from: NodeId, frame: Frame) -> Result<(), WorkerError> {
        let running = self.rings.as_ref().map(ShardRings::collective);
        match self.inbox.admit(self.member.epoch(), running, from, frame) {
            Admission::Feed(f) => {
                self.feed_rings(from, &f)?;
                self.pump_ring().await
            }
            Admission::Held | Admission::Refused | Admission::Stale | Admission::Dropped => Ok(()),
        }
    }

    /// Sends this node's share of the state to a joiner: the pieces `i, i + k, i + 2k, ...` of the
    /// replicated part (it is sender `i` of `k`), and, from the first sender only, its own inner
    /// optimiser state whole. A sender still computing (non-blocking mode) sends when it is done.
    ///
    /// The state is copied here, at once (a consistent snapshot); serialising and hashing it, which
    /// for a large model takes seconds, run on a blocking thread, and the pieces are queued when
    /// that is done ([`queue_state`](Self::queue_state)), so that this node keeps its heartbeats
    /// and its part in the all-reduce meanwhile.
    fn send_state(
        &mut self,
        epoch: Epoch,
        to: NodeId,
        senders: Vec<NodeId>,
    ) -> Result<(), WorkerError> {
        self.ensure_outer()?;
        let Some(inner) = self.inner.as_ref() else {
            self.deferred_sends.push((epoch, to, senders));
            return Ok(());
        };
        let started = self.clock.secs();
        let blocking = self.opts.mesh.join_mode == loco_core::mesh::JoinMode::Blocking;
        let Some(share) = share_of(&senders, self.opts.id, blocking) else {
            tracing::warn!(node = %self.opts.name, "asked to send the state to {to} but not among its senders");
            return Ok(());
        };
        let own = if share.sends_own { Some(inner.export_optimizer()?) } else { None };
        let outer = self.outer.as_ref().expect("outer state");
        let shared = SharedState::from_outer(outer);
        self.preparing.spawn_blocking(move || {
            let outer_step = shared.outer_steps();
            let shared = shared.encode();
            let mut parts = vec![(PART_SHARED, Bytes::from(shared))];
            parts.extend(own.map(|own| (PART_OWN, Bytes::from(own))));
            let parts = parts
                .into_iter()
                .map(|(part, bytes)| (part, state_digest(&bytes), bytes))
                .collect();
            Ok(PreparedState { epoch, to, outer_step, share, parts })
        });
        // The time this node's loop spent on it (the rest runs beside the loop).
        self.spend_recovery(started);
        Ok(())
    }

    /// Queues the pieces of a prepared state (reference-counted slices, no copy).
    async fn queue_state(&mut self, p: PreparedState) -> Result<(), WorkerError> {
        let PreparedState { epoch, to, outer_step, share, parts } = p;
        let started = self.clock.secs();
        let mut sent = 0u64;
        let mut first = true;
        'parts: for (part, digest, bytes) in parts {
            let total = bytes.len() as u64;
            for r in share.pieces(part, total, PieceRule::Clamped) {
                let (lo, hi) = (r.start as usize, r.end as usize);
                let header = Header::State(StateHeader {
                    epoch,
                    outer_step,
                    offset: r.start,
                    total,
                    digest: digest.clone(),
                    part,
                });
                let body = Body::Bytes(bytes.slice(lo..hi));
                if !self.send(to, Frame { header, body }).await {
                    break 'parts;
                }
                sent += r.end - r.start;
                if first {
                    first = false;
                    self.strike(FaultPhase::StateSend)?;
                }
            }
        }
        self.spend_recovery(started);
        self.event(
            EventKind::RecoveryDone,
            format!(
                "sent {sent} bytes of state (share {} of {}) to {to}",
                share.index + 1,
                share.of
            ),
        )
    }

    fn on_state(&mut self, from: NodeId, h: StateHeader, body: Body) -> Result<(), WorkerError> {
        let Some(f) = self.fetch.as_mut() else {
            // A sender was told before this node was (both by the coordinator): keep the piece
            // for the FetchState that follows, within a bound.
            if let Err(r) = self.early_state.hold(from, h, body) {
                tracing::debug!(node = %self.opts.name, peer = %from, "early state piece dropped: {r}");
            }
            return Ok(());
        };
        match f.assembly.put(from, &h, &body) {
            Ok(p) if p.is_complete() => self.verify_when_complete(),
            Ok(_) => {}
            Err(r) => {
                tracing::warn!(node = %self.opts.name, peer = %from, "state piece refused: {r}")
            }
        }
        Ok(())
    }

    /// When both parts of the state are complete, checks their digests and decodes them on a
    /// blocking thread (for a large model that takes seconds: this node keeps its heartbeats and
    /// its part in the ring meanwhile); [`on_verified`](Self::on_verified) takes the result.
    fn verify_when_complete(&mut self) {
        if !self.verifying.is_empty() {
            return;
        }
        let Some(f) = self.fetch.as_mut() else { return };
        let Some(received) = f.assembly.take_complete() else { return };
        let n = self.outer.as_ref().map_or(0, OuterState::len);
        self.verifying.spawn_blocking(move || received.verify(n));
    }

    /// Takes a verified state: the outer state from it, the steps committed meanwhile replayed
    /// (non-blocking mode), the inner part for the inner loop. A part whose digest is wrong is
    /// dropped, and the transfer waits for another copy of it.
    fn on_verified(&mut self, c: Result<Verified, Box<VerifyFailed>>) -> Result<(), WorkerError> {
        let Some(f) = self.fetch.as_mut() else { return Ok(()) };
        let v = match c {
            Ok(v) => v,
            Err(failed) => {
                tracing::warn!(node = %self.opts.name, "{failed}; waiting for another copy");
                f.assembly.retry(*failed);
                self.verify_when_complete();
                return Ok(());
            }
        };
        let f = self.fetch.take().expect("fetch");
        let Some(shared) = v.shared else {
            return Err(InnerError::Backend("a state without bytes".into()).into());
        };
        let layout = self.layout.clone();
        let as_of = shared.outer_steps();
        let mut outer = shared.into_outer(self.opts.outer, buckets_from_sizes(layout))?;
        // Non-blocking mode: replay the steps committed here since the state was taken.
        let replayed = f.log.replay_onto(&mut outer).map_err(|e| {
            InnerError::Backend(format!("the state received is as of outer step {as_of}: {e}"))
        })?;
        let hash = weights_digest(outer.outer());
        // The pseudo-gradient buffer holds this step's all-reduce result when it has finished
        // (the commit applies it next): it carries over to the received state.
        if let Some(old) = self.outer.as_mut() {
            let g = old.take_pseudo_gradient();
            if g.len() == outer.len() {
                outer.put_pseudo_gradient(g)?;
            }
        }
        self.outer = Some(outer);
        // A blocking joiner's wait is its Recovery span; a non-blocking one computes meanwhile.
        self.event(
            EventKind::RecoveryDone,
            format!(
                "received {} bytes of state as of outer step {as_of}, digest {}, weights {hash}{}",
                v.bytes,
                &v.shared_digest[..16.min(v.shared_digest.len())],
                if replayed > 0 { format!(", {replayed} step(s) replayed") } else { String::new() }
            ),
        )?;
        self.pending_sync = Some(PendingSync { own: v.own.unwrap_or_default() });
        if matches!(self.member.phase(), loco_core::mesh::MemberPhase::Syncing { .. }) {
            // Blocking mode: the inner loop is idle; take the state and report now.
            self.finish_pending_sync()?;
        }
        Ok(())
    }

    /// Gives the inner loop the received state and tells the coordinator this node is synced.
    /// In non-blocking mode this waits for the next outer step's start, so that the first
    /// pseudo-gradient this node contributes with weight 1 starts from the mesh's weights.
    fn finish_pending_sync(&mut self) -> Result<(), WorkerError> {
        let Some(p) = self.pending_sync.take() else { return Ok(()) };
        if let Some(inner) = self.inner.as_mut() {
            inner.import_optimizer(&p.own)?;
        }
        self.sync_inner_to_outer()?;
        let now = self.clock.now();
        if let Some(a) = self.acct.as_mut() {
            if a.current() == Some(Span::Recovery) {
                a.enter(Span::Barrier, now);
            }
        }
        self.member.report_sync_done(now)?;
        Ok(())
    }
}

/// Kills this process at once with SIGKILL (fault injection).
fn kill_self() {
    let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    // SIGKILL cannot be caught; should the raise fail, end as abruptly.
    std::process::abort();
}
