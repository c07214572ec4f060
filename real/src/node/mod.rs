//! A real worker process: the mesh [`Member`], the ring all-reduce and the DiLoCo outer state
//! over TCP, around an [`InnerLoop`] (the libtorch trainer, or a synthetic objective).
//!
//! One tokio task runs the protocol: it `select!`s over incoming frames, the member's next
//! deadline, the end of the inner steps (which run on a blocking thread, so heartbeats go on
//! while the model trains), the end of an O(model) job and a shutdown signal, and executes the
//! member's actions. Nothing is applied before the coordinator's `Commit`, so every replica takes
//! the same outer step.
//!
//! Work that reads or writes every parameter (the outer step, resetting the inner weights, the
//! weights digest, the pseudo-gradient, the copies of a checkpoint or of a state for a joiner)
//! runs as one blocking job at a time ([`jobs`]), which owns the inner loop and the outer state
//! while it runs. Meanwhile the task keeps sending heartbeats, answering pings and running the
//! ring; the member's other actions wait in order until the job is back.

mod jobs;

use crate::checkpoint::{CheckpointConfig, CheckpointError, Checkpointer};
use crate::inner::{InnerError, InnerLoop, InnerStats};
use crate::tcp::{TcpConfig, TcpError, TcpTransport};
use bytes::Bytes;
use jobs::{Done, Held, JobOut};
use loco_core::codec::CodecKind;
use loco_core::diloco::{DilocoError, OuterConfig, OuterState, buckets_from_sizes};
use loco_core::ids::{Epoch, NodeId};
use loco_core::mesh::{
    AllReduceStart, LeaveReason, Member, MemberAction, MeshConfig, MeshError, StopReason,
    padded_frame,
};
use loco_core::metrics::{EventKind, EventRow, OuterStepRow};
use loco_core::node::acct::{RowIdentity, Span, StepAcct};
use loco_core::node::rings::{Admission, Inbox, ShardRings};
use loco_core::node::state::{
    DEFAULT_EARLY_BYTES, EarlyPieces, Expect, PART_OWN, PART_SHARED, PieceRule, ReplayLog, Share,
    SharedState, StateAssembly, Verified, VerifyFailed, share_of, state_digest,
};
use loco_core::scenario::FaultPhase;
use loco_core::time::Time;
use loco_core::transport::{Body, Frame, Header, StateHeader, Transport};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
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
}

/// Peak resident set size of this process in bytes (Linux: `VmHWM` of /proc/self/status).
pub fn peak_rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
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

/// The longest the event loop runs the rings before it takes a turn of its own (timers,
/// frames, jobs): see [`Worker::pump_ring`].
const RING_SLICE: Duration = Duration::from_millis(10);

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

/// The blocking job running, if any: [`Worker::inner`], [`Worker::outer`] and
/// [`Worker::checkpointer`] are in it.
type Job<L> = tokio::task::JoinHandle<JobOut<L>>;

struct Worker<L: InnerLoop> {
    opts: WorkerOptions,
    clock: Clock,
    t: TcpTransport,
    member: Member,
    /// The inner loop; away while it computes or a job holds it.
    inner: Option<L>,
    /// The outer state (made before the node joins); away while a job holds it.
    outer: Option<OuterState>,
    /// Parameters of the model.
    n_params: usize,
    /// The inner steps running on a blocking thread.
    compute: Option<tokio::task::JoinHandle<ComputeResult<L>>>,
    /// The O(model) job running on a blocking thread.
    job: Option<Job<L>>,
    /// Member actions that wait for the job (in order; sends do not wait).
    deferred: VecDeque<MemberAction>,
    /// The pseudo-gradient buffer holds `outer - inner` of the current weights (a first attempt
    /// need not recompute it; a retry, whose values the failed attempt consumed, does).
    g_fresh: bool,
    /// The values of an all-reduce that ended while a job held the outer state.
    parked_g: Option<Vec<f32>>,
    /// Stale frames last written to the metrics.
    stale_written: u64,
    /// Frames of the running rings that arrived before they started, still to be fed.
    ring_backlog: VecDeque<(NodeId, Frame)>,
    /// The rings have more to do than [`pump_ring`](Worker::pump_ring) did in its slice.
    ring_busy: bool,
    /// The results of a finished all-reduce of several shards, being concatenated.
    gathering: Option<tokio::task::JoinHandle<Gathered>>,
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
    /// The largest own part of a state this node accepts ([`InnerLoop::max_optimizer_bytes`]).
    own_max: u64,
    stop: Option<StopReason>,
}

/// A finished all-reduce's collective and its values, concatenated from its shards.
type Gathered = (Epoch, u64, Option<Vec<f32>>);

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
    let n_params = layout.iter().map(|(_, n)| n).sum();
    let own_max = inner.max_optimizer_bytes();
    let mut w = Worker {
        layout,
        own_max,
        opts,
        clock,
        t,
        member,
        inner: Some(inner),
        outer: None,
        n_params,
        compute: None,
        job: None,
        deferred: VecDeque::new(),
        g_fresh: false,
        parked_g: None,
        stale_written: 0,
        ring_backlog: VecDeque::new(),
        ring_busy: false,
        gathering: None,
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
    // The outer state, before the node joins and has heartbeats to keep: the initial weights
    // (a joiner's are replaced by the state it receives).
    if w.outer.is_none() {
        let p = w.params()?;
        let buckets = buckets_from_sizes(w.layout.clone());
        w.outer = Some(OuterState::new(w.opts.outer, p, buckets)?);
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
        loop {
            self.drain().await?;
            if let Some(stop) = self.stop.take() {
                if let Some(h) = self.compute.take() {
                    h.abort();
                }
                return Ok(self.report(stop));
            }
            let deadline = self.member.poll_timeout().map(|t| self.clock.instant(t));
            // While a job holds the outer state, what needs it waits.
            let idle = self.job.is_none();
            tokio::select! {
                r = self.t.recv() => {
                    let (from, frame) = r?;
                    self.on_frame(from, frame).await?;
                }
                done = join(&mut self.job), if !idle => {
                    self.job = None;
                    let out = done.map_err(|e| InnerError::Backend(format!("an outer-state job panicked: {e}")))?;
                    self.on_job(out).await?;
                }
                done = join(&mut self.compute), if idle && self.compute.is_some() => {
                    self.compute = None;
                    let (inner, stats) = done.map_err(|e| InnerError::Backend(format!("inner steps panicked: {e}")))?;
                    self.inner = Some(inner);
                    self.on_computed(stats?)?;
                    for (epoch, to, senders) in std::mem::take(&mut self.deferred_sends) {
                        self.deferred.push_back(MemberAction::SendState { epoch, to, senders });
                    }
                }
                done = join(&mut self.gathering), if self.gathering.is_some() => {
                    self.gathering = None;
                    let (epoch, op, g) = done.map_err(|e| InnerError::Backend(format!("gathering the shards panicked: {e}")))?;
                    self.put_values(g.unwrap_or_else(|| vec![0.0; self.n_params]))?;
                    let _ = self.member.report_allreduce_done(self.clock.now(), epoch, op);
                }
                () = std::future::ready(()), if self.ring_busy => {
                    self.pump_ring().await?;
                }
                Some(done) = self.preparing.join_next(), if !self.preparing.is_empty() => {
                    let prepared = done.map_err(|e| InnerError::Backend(format!("preparing a state panicked: {e}")))??;
                    self.queue_state(prepared).await?;
                }
                Some(done) = self.verifying.join_next(), if idle && !self.verifying.is_empty() => {
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

    /// Executes the member's actions: the ones a job made wait first, in order, then new ones.
    /// While a job runs, sends (heartbeats, replies, the deathrattle) go out at once and every
    /// other action waits, so that they all see the state in the order the member issued them.
    async fn drain(&mut self) -> Result<(), WorkerError> {
        loop {
            if self.job.is_none() {
                if let Some(a) = self.deferred.pop_front() {
                    self.act(a).await?;
                    continue;
                }
            }
            let Some(a) = self.member.poll_action() else { return Ok(()) };
            if self.job.is_some() && !matches!(a, MemberAction::Send { .. }) {
                self.deferred.push_back(a);
            } else {
                self.act(a).await?;
            }
        }
    }

    /// Moves the inner loop, the outer state and the checkpointer into a blocking job running
    /// `f`; [`on_job`](Self::on_job) takes them back with its result.
    fn start_job(
        &mut self,
        f: impl FnOnce(&mut Held<L>) -> Result<Done, WorkerError> + Send + 'static,
    ) -> Result<(), WorkerError> {
        debug_assert!(self.job.is_none(), "one job at a time");
        let outer = self.outer.take().ok_or(InnerError::Backend("no outer state".into()))?;
        let held = Held { inner: self.inner.take(), outer, checkpointer: self.checkpointer.take() };
        self.job = Some(jobs::spawn(held, f));
        Ok(())
    }

    /// A job is back: its holdings return, and what it did goes on.
    async fn on_job(&mut self, out: JobOut<L>) -> Result<(), WorkerError> {
        let JobOut { held, took, done } = out;
        if held.inner.is_some() {
            self.inner = held.inner;
        }
        let mut outer = held.outer;
        if let Some(g) = self.parked_g.take() {
            outer.put_pseudo_gradient(g)?;
        }
        self.outer = Some(outer);
        self.checkpointer = held.checkpointer;
        match done? {
            Done::Refreshed => {
                self.g_fresh = true;
                self.arrive_at_barrier()?;
            }
            Done::RingReady { epoch, op, refreshed, rings } => {
                if refreshed {
                    self.spend(Span::Outer, took);
                }
                self.g_fresh = false;
                match rings {
                    Ok(rings) => {
                        self.ring_backlog = self.inbox.take_for(rings.collective()).into();
                        self.rings = Some(rings);
                        self.pump_ring().await?;
                    }
                    Err(e) => {
                        tracing::warn!(node = %self.opts.name, "cannot start the all-reduce: {e}");
                        self.member.report_allreduce_failed(self.clock.now(), epoch, op)?;
                    }
                }
            }
            Done::Committed { epoch, outer_step, skipped, hash, log, checkpoint } => {
                self.g_fresh = false;
                if let (Some(f), Some(entry)) = (self.fetch.as_mut(), log) {
                    f.log.push(outer_step, entry);
                }
                self.inner_dirty = false;
                if let Some(taken) = checkpoint {
                    self.spend(Span::Checkpoint, taken.spent);
                    self.on_checkpoint_taken(taken)?;
                }
                if let Some(attempts) = skipped {
                    self.event(
                        EventKind::SkipStep,
                        format!("outer step {outer_step} skipped after {attempts} attempts"),
                    )?;
                }
                self.finish_step(epoch, outer_step, hash)?;
            }
            Done::StateCopied { epoch, to, share, shared, own } => {
                self.spend_recovery(took);
                self.prepare_state(epoch, to, share, shared, own);
            }
            Done::Installed { as_of, replayed, hash, bytes, shared_digest, own } => {
                self.g_fresh = false;
                self.spend_recovery(took);
                // A blocking joiner's wait is its Recovery span; a non-blocking one computes
                // meanwhile.
                self.event(
                    EventKind::RecoveryDone,
                    format!(
                        "received {bytes} bytes of state as of outer step {as_of}, digest {}, weights {hash}{}",
                        &shared_digest[..16.min(shared_digest.len())],
                        if replayed > 0 { format!(", {replayed} step(s) replayed") } else { String::new() }
                    ),
                )?;
                self.pending_sync = Some(PendingSync { own });
                if matches!(self.member.phase(), loco_core::mesh::MemberPhase::Syncing { .. }) {
                    // Blocking mode: the inner loop is idle; take the state and report now.
                    self.finish_pending_sync()?;
                }
            }
            Done::Synced => {
                self.g_fresh = false;
                let now = self.clock.now();
                if let Some(a) = self.acct.as_mut() {
                    if a.current() == Some(Span::Recovery) {
                        a.enter(Span::Barrier, now);
                    }
                }
                self.member.report_sync_done(now)?;
            }
        }
        Ok(())
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
    fn armed(&self, phase: FaultPhase, outer_step: u64) -> bool {
        let now = self.clock.start.elapsed().as_secs_f64();
        self.opts.faults.iter().any(|f| f.strikes(phase, now, outer_step))
    }

    /// The outer step of the open row (0 before the first).
    fn row_step(&self) -> u64 {
        self.acct.as_ref().map_or(0, StepAcct::step)
    }

    /// Fault injection: records the crash, then kills this process with SIGKILL (no cleanup, no
    /// deathrattle: what a machine failure looks like to the others).
    fn strike(&mut self, phase: FaultPhase, outer_step: u64) -> Result<(), WorkerError> {
        if !self.armed(phase, outer_step) {
            return Ok(());
        }
        self.event(EventKind::Crash, format!("SIGKILL during {phase} (fault injection)"))?;
        kill_self();
        Ok(())
    }

    /// Snapshots the state for a checkpoint at a stop, on the loop (the node has left: no
    /// heartbeats to keep); see [`jobs::checkpoint`].
    fn checkpoint_at_stop(&mut self) -> Result<(), WorkerError> {
        let Some(outer) = self.outer.as_ref() else { return Ok(()) };
        let taken = jobs::checkpoint(
            self.inner.as_ref(),
            outer,
            self.checkpointer.as_mut(),
            true,
            self.inner_dirty,
            self.checkpointed,
        )?;
        match taken {
            Some(t) => self.on_checkpoint_taken(t),
            None => Ok(()),
        }
    }

    /// A snapshot went to the writer: noted, the fault drill's strike, the previous save's outcome.
    fn on_checkpoint_taken(&mut self, t: jobs::CheckpointTaken) -> Result<(), WorkerError> {
        self.checkpointed = Some(t.steps);
        // The snapshot holds `steps` outer steps: that of the last one committed.
        self.strike(FaultPhase::Checkpoint, t.steps.saturating_sub(1))?;
        match t.ticket {
            Ok(t) => {
                if let Some(prev) = t.previous {
                    self.on_saved(prev)?;
                }
                Ok(())
            }
            Err(e) => self.event(EventKind::Checkpoint, format!("checkpoint failed: {e}")),
        }
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

    /// `d` of live recovery, beside the current span (the sender's share of a transfer, a
    /// non-blocking joiner's install): counted unless the node is in the Recovery span already.
    fn spend_recovery(&mut self, d: Duration) {
        if let Some(a) = self.acct.as_mut() {
            if a.current() == Some(Span::Recovery) {
                return; // already counted by the span
            }
            a.spend(Span::Recovery, d);
        }
    }

    /// `d` of `span`, beside the current span (work a job did while the node was in another).
    fn spend(&mut self, span: Span, d: Duration) {
        if let Some(a) = self.acct.as_mut() {
            if a.current() != Some(span) {
                a.spend(span, d);
            }
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

    /// Executes one member action (no job is running, unless it is a send).
    async fn act(&mut self, a: MemberAction) -> Result<(), WorkerError> {
        match a {
            MemberAction::Send { to, msg, padding } => {
                self.send(to, padded_frame(msg, padding, false)).await;
            }
            MemberAction::Admitted { epoch, outer_step } => {
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
                if self.pending_sync.is_some() {
                    // The received state goes into the inner loop first (a job); then this.
                    self.finish_pending_sync()?;
                    self.deferred.push_front(MemberAction::Compute { epoch, outer_step });
                    return Ok(());
                }
                let crash_in_compute = self.armed(FaultPhase::Compute, outer_step);
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
                self.compute = Some(tokio::task::spawn_blocking(move || {
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
                }));
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
                        let expect = Expect::real(self.n_params, self.own_max);
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
            MemberAction::StartAllReduce(start) => self.start_ring(start)?,
            MemberAction::AbortAllReduce { epoch, op } => {
                if let Some(rings) = self.rings.take() {
                    if rings.collective() == (epoch, op) {
                        self.ring_backlog.clear();
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
                self.close_step(epoch, outer_step, None)?;
            }
            MemberAction::SkipStep { epoch, outer_step, attempts } => {
                if let Some(a) = self.acct.as_mut() {
                    a.set_retries(attempts.saturating_sub(1));
                }
                self.close_step(epoch, outer_step, Some(attempts))?;
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
                    self.checkpoint_at_stop()?;
                }
                self.flush_checkpoints()?;
                self.write_counters(true)?;
                let node = self.opts.name.clone();
                self.write(&MetricsLine::Resources { node, peak_rss_bytes: peak_rss_bytes() })?;
                // Let the deathrattle and the last frames leave before the process exits.
                tokio::time::sleep(Duration::from_millis(100)).await;
                self.stop = Some(reason);
            }
        }
        Ok(())
    }

    /// Ends `outer_step` as every member does, in a job ([`jobs::commit`]): applies the
    /// all-reduce's result (`skipped: None`) or skips the update, resets the inner weights to the
    /// outer ones, digests them and takes a checkpoint when one is due; its return writes the row
    /// (with an empty digest while this node does not hold the mesh's state yet). The job's time
    /// is the row's `outer_s` (its checkpoint copy, `checkpoint_s`).
    fn close_step(
        &mut self,
        epoch: Epoch,
        outer_step: u64,
        skipped: Option<u32>,
    ) -> Result<(), WorkerError> {
        if let Some(a) = self.acct.as_mut() {
            a.enter(Span::Outer, self.clock.now());
        }
        self.early_state.clear();
        let job = jobs::CommitJob {
            epoch,
            outer_step,
            skipped,
            log: self.fetch.is_some(),
            // A non-blocking joiner still receiving the state holds its own weights, not the
            // mesh's: no digest to compare (as in the simulator).
            digest: self.fetch.is_none(),
            checkpointed: self.checkpointed,
        };
        self.start_job(move |h| jobs::commit(h, job))
    }

    /// The inner steps are done: the pseudo-gradient is refreshed in a job, then the node arrives
    /// at the barrier ([`arrive_at_barrier`](Self::arrive_at_barrier)).
    fn on_computed(&mut self, stats: Vec<InnerStats>) -> Result<(), WorkerError> {
        let now = self.clock.now();
        if let Some(a) = self.acct.as_mut() {
            a.trained(stats.iter().map(|s| s.tokens).sum(), stats.last().and_then(|s| s.loss));
            a.enter(Span::Outer, now);
        }
        self.start_job(|h| {
            jobs::refresh(h)?;
            Ok(Done::Refreshed)
        })
    }

    fn arrive_at_barrier(&mut self) -> Result<(), WorkerError> {
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
        self.write_counters(false)?;
        if let Some(r) = self.checkpointer.as_mut().and_then(|(c, _)| c.poll()) {
            self.on_saved(r)?;
        }
        Ok(())
    }

    /// Writes the frame counters when they changed since the last time (or `always`).
    fn write_counters(&mut self, always: bool) -> Result<(), WorkerError> {
        let stale = self.inbox.counters().stale;
        if !always && stale == self.stale_written {
            return Ok(());
        }
        self.stale_written = stale;
        self.write(&MetricsLine::Counters {
            node: self.opts.name.clone(),
            incarnation: self.opts.incarnation,
            stale_frames_rejected: stale,
        })
    }

    /// Starts this node's rings of an attempt. They are built in a job ([`jobs::ring_ready`]),
    /// which first recomputes the pseudo-gradient when a previous attempt consumed it (a retry
    /// starts again from the kept inputs); its return feeds them the frames that came early and
    /// starts sending.
    fn start_ring(&mut self, s: AllReduceStart) -> Result<(), WorkerError> {
        if let Some(a) = self.acct.as_mut() {
            a.enter(Span::AllReduce, self.clock.now());
            let world = u32::try_from(s.ring.len()).unwrap_or(u32::MAX);
            a.ring(s.epoch, world, f64::from(s.weight.get()), s.attempt);
        }
        let (me, codec, segment, fresh) =
            (self.opts.id, self.opts.codec, self.opts.segment_elems, self.g_fresh);
        self.g_fresh = false;
        self.start_job(move |h| jobs::ring_ready(h, s, me, codec, segment, fresh))
    }

    /// Gives the values of a finished or abandoned all-reduce back to the outer state (after a
    /// failure they are unspecified; the next attempt recomputes them), or keeps them for it
    /// while a job holds it.
    fn return_values(&mut self, rings: ShardRings) -> Result<(), WorkerError> {
        let g = match rings.shards() {
            1 => rings.into_values(),
            // Not worth a copy of the shards (the next attempt recomputes the values).
            _ => None,
        };
        self.put_values(g.unwrap_or_else(|| vec![0.0; self.n_params]))
    }

    /// Puts the pseudo-gradient buffer back into the outer state, or keeps it for it while a job
    /// holds it.
    fn put_values(&mut self, g: Vec<f32>) -> Result<(), WorkerError> {
        match self.outer.as_mut() {
            Some(o) => o.put_pseudo_gradient(g)?,
            None => self.parked_g = Some(g),
        }
        Ok(())
    }

    /// Runs the rings for at most [`RING_SLICE`]: sends what they have to send, then feeds them
    /// the frames that arrived before they started, one at a time; reports the all-reduce done
    /// when it is. Left with more to do, it sets `ring_busy` and the event loop calls it again
    /// after a turn of its own: each frame is one segment's coding, but an attempt's first
    /// chunk, or a backlog of early frames, is O(model / world) of them, which for a large
    /// model would hold the loop (and the heartbeats) for seconds.
    async fn pump_ring(&mut self) -> Result<(), WorkerError> {
        let started = tokio::time::Instant::now();
        self.ring_busy = false;
        loop {
            let Some(rings) = self.rings.as_mut() else {
                self.ring_backlog.clear();
                return Ok(());
            };
            if let Some((to, f)) = rings.poll_send() {
                let phase = match &f.header {
                    Header::Collective(h) if h.phase == loco_core::transport::Phase::AllGather => {
                        FaultPhase::AllGather
                    }
                    _ => FaultPhase::ReduceScatter,
                };
                let sent = self.send(to, f).await;
                if sent {
                    self.strike(phase, self.row_step())?;
                }
                if !sent {
                    let rings = self.rings.take().expect("rings");
                    self.ring_backlog.clear();
                    let (epoch, op) = rings.collective();
                    self.return_values(rings)?;
                    self.event(EventKind::AllreduceFailed, format!("{} unreachable", to))?;
                    let _ = self.member.report_allreduce_failed(self.clock.now(), epoch, op);
                    return Ok(());
                }
            } else if let Some((from, f)) = self.ring_backlog.pop_front() {
                self.feed_rings(from, &f)?;
            } else {
                break;
            }
            if started.elapsed() >= RING_SLICE {
                self.ring_busy = true;
                return Ok(());
            }
        }
        if self.rings.as_ref().is_some_and(ShardRings::is_done) {
            let rings = self.rings.take().expect("rings");
            let (epoch, op) = rings.collective();
            if rings.shards() > 1 {
                // Concatenating the shards' results copies (G-1)/G of the model: beside the
                // loop, and the all-reduce is reported done when that is.
                self.gathering =
                    Some(tokio::task::spawn_blocking(move || (epoch, op, rings.into_values())));
                return Ok(());
            }
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
            Admission::Feed(f) if !self.ring_backlog.is_empty() => {
                // Behind the early frames still to be fed, in arrival order.
                self.ring_backlog.push_back((from, f));
                self.ring_busy = true;
                Ok(())
            }
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
    /// The state is copied at once, in a job (a consistent snapshot); serialising and hashing it,
    /// which for a large model takes seconds, run beside the loop when that is done
    /// ([`prepare_state`](Self::prepare_state)), and the pieces are queued after that
    /// ([`queue_state`](Self::queue_state)), so that this node keeps its heartbeats and its part
    /// in the all-reduce meanwhile.
    fn send_state(
        &mut self,
        epoch: Epoch,
        to: NodeId,
        senders: Vec<NodeId>,
    ) -> Result<(), WorkerError> {
        if self.inner.is_none() {
            self.deferred_sends.push((epoch, to, senders));
            return Ok(());
        }
        let blocking = self.opts.mesh.join_mode == loco_core::mesh::JoinMode::Blocking;
        let Some(share) = share_of(&senders, self.opts.id, blocking) else {
            tracing::warn!(node = %self.opts.name, "asked to send the state to {to} but not among its senders");
            return Ok(());
        };
        self.start_job(move |h| jobs::copy_state(h, epoch, to, share))
    }

    /// Serialises and hashes a copied state on a blocking thread, beside everything else.
    fn prepare_state(
        &mut self,
        epoch: Epoch,
        to: NodeId,
        share: Share,
        shared: SharedState,
        own: Option<Vec<u8>>,
    ) {
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
    }

    /// Queues the pieces of a prepared state (reference-counted slices, no copy).
    async fn queue_state(&mut self, p: PreparedState) -> Result<(), WorkerError> {
        let PreparedState { epoch, to, outer_step, share, parts } = p;
        let started = tokio::time::Instant::now();
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
                    self.strike(FaultPhase::StateSend, self.row_step())?;
                }
            }
        }
        self.spend_recovery(started.elapsed());
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
        let n = self.n_params;
        self.verifying.spawn_blocking(move || received.verify(n));
    }

    /// Takes a verified state: in a job ([`jobs::install`]), the outer state from it, the steps
    /// committed meanwhile replayed (non-blocking mode); the inner part for the inner loop. A part whose digest is wrong is
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
        let job = jobs::InstallJob {
            shared,
            log: f.log,
            cfg: self.opts.outer,
            layout: self.layout.clone(),
            bytes: v.bytes,
            shared_digest: v.shared_digest,
            own: v.own.unwrap_or_default(),
        };
        self.start_job(move |h| jobs::install(h, job))
    }

    /// Gives the inner loop the received state and tells the coordinator this node is synced.
    /// In non-blocking mode this waits for the next outer step's start, so that the first
    /// pseudo-gradient this node contributes with weight 1 starts from the mesh's weights.
    fn finish_pending_sync(&mut self) -> Result<(), WorkerError> {
        let Some(p) = self.pending_sync.take() else { return Ok(()) };
        self.start_job(move |h| jobs::sync(h, p.own))
    }
}

/// The output of `h`'s task; pending while there is none (a `select!` arm guards it).
async fn join<T>(h: &mut Option<tokio::task::JoinHandle<T>>) -> Result<T, tokio::task::JoinError> {
    match h.as_mut() {
        Some(h) => h.await,
        None => std::future::pending().await,
    }
}

/// Kills this process at once with SIGKILL (fault injection).
fn kill_self() {
    let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    // SIGKILL cannot be caught; should the raise fail, end as abruptly.
    std::process::abort();
}

#[cfg(test)]
mod tests {
    use super::*;

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
