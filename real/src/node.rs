//! A real worker process: the mesh [`Member`], the ring all-reduce and the DiLoCo outer state
//! over TCP, around an [`InnerLoop`] (the libtorch trainer, or a synthetic objective).
//!
//! One tokio task runs the protocol: it `select!`s over incoming frames, the member's next
//! deadline, the end of the inner steps (which run on a blocking thread, so heartbeats go on
//! while the model trains) and a shutdown signal, and executes the member's actions. Nothing is
//! applied before the coordinator's `Commit`, so every replica takes the same outer step.

use crate::inner::{InnerError, InnerLoop, InnerStats};
use crate::tcp::{TcpConfig, TcpError, TcpTransport};
use bytes::Bytes;
use loco_core::allreduce::{Payload, RingAllReduce, RingConfig, RingError};
use loco_core::codec::CodecKind;
use loco_core::diloco::{DilocoError, OuterConfig, OuterState, buckets_from_sizes};
use loco_core::ids::{Epoch, NodeId};
use loco_core::mesh::{
    AllReduceStart, LeaveReason, Member, MemberAction, MeshConfig, MeshError, StopReason,
    padded_frame,
};
use loco_core::metrics::{EventKind, EventRow, OuterStepRow};
use loco_core::time::Time;
use loco_core::transport::{Body, Frame, Header, StateHeader, Transport};
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Bytes per piece of a state transfer.
const STATE_PIECE: usize = 4 << 20;
/// Collective frames kept for an all-reduce this node has not started yet.
const MAX_EARLY_FRAMES: usize = 1 << 16;

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
    /// Pipelining unit of the all-reduce, in values.
    pub segment_elems: usize,
    /// TCP settings.
    pub tcp: TcpConfig,
    /// Where to append this worker's metrics (JSON lines of [`MetricsLine`]).
    pub metrics: Option<PathBuf>,
    /// Offset added to this process's clock in the metrics, so that all processes of a launch
    /// share one time base (seconds since the launch started).
    pub time_offset_s: f64,
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

/// The training state a joiner receives (and a checkpoint holds).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TransferState {
    /// Outer steps applied.
    pub outer_steps: u64,
    /// Outer weights.
    pub outer: Vec<f32>,
    /// Outer momentum.
    pub momentum: Vec<f32>,
    /// Inner optimiser state and schedule position, serialised by the inner loop.
    pub inner: Vec<u8>,
}

/// Hex BLAKE3 digest of a float vector's bits.
pub fn weights_digest(v: &[f32]) -> String {
    let mut h = blake3::Hasher::new();
    for x in v {
        h.update(&x.to_bits().to_le_bytes());
    }
    h.finalize().to_hex()[..16].to_string()
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

/// Per-step timestamps for the metrics row.
#[derive(Default)]
struct StepClock {
    start: f64,
    compute_end: f64,
    ring_start: Option<f64>,
    ring_end: f64,
    recovery: f64,
    loss: Option<f64>,
    tokens: u64,
    bytes: u64,
    retries: u32,
    world: u32,
    weight: f64,
}

/// A state transfer being received.
struct Fetch {
    epoch: Epoch,
    started: f64,
    buf: Vec<u8>,
    got: Vec<(u64, u64)>,
    digest: Option<String>,
}

struct Worker<L: InnerLoop> {
    opts: WorkerOptions,
    clock: Clock,
    t: TcpTransport,
    member: Member,
    inner: Option<L>,
    outer: Option<OuterState>,
    ring: Option<(RingAllReduce<'static>, AllReduceStart)>,
    early: Vec<(NodeId, Frame)>,
    fetch: Option<Fetch>,
    step: StepClock,
    metrics: Option<MetricsFile>,
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
    let member = Member::new(opts.id, opts.incarnation, opts.mesh.clone(), 1);
    let mut w = Worker {
        opts,
        clock,
        t,
        member,
        inner: Some(inner),
        outer: None,
        ring: None,
        early: Vec::new(),
        fetch: None,
        step: StepClock::default(),
        metrics,
        stop: None,
    };
    w.event(EventKind::Start, format!("incarnation {}", w.opts.incarnation))?;
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

    fn report(&self, stop: StopReason) -> WorkerReport {
        let (committed, weights_hash) = match &self.outer {
            Some(o) => (o.steps(), weights_digest(o.outer())),
            None => (0, String::new()),
        };
        WorkerReport { stop, committed, weights_hash }
    }

    fn write(&mut self, line: &MetricsLine) -> Result<(), WorkerError> {
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
                self.step.bytes += n;
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
                self.event(
                    EventKind::Admit,
                    format!("admitted in {epoch} at outer step {outer_step}"),
                )?;
            }
            MemberAction::EpochChanged { epoch, members } => {
                self.event(EventKind::Epoch, format!("{epoch}: {} members", members.len()))?;
            }
            MemberAction::Compute { outer_step, .. } => {
                self.ensure_outer()?;
                let inner = self.inner.take().ok_or_else(|| {
                    InnerError::Backend(format!(
                        "asked to compute step {outer_step} while computing"
                    ))
                })?;
                self.step = StepClock { start: self.clock.secs(), ..StepClock::default() };
                let h = self.opts.inner_steps;
                let handle = tokio::task::spawn_blocking(move || {
                    let mut inner = inner;
                    let mut stats = Vec::with_capacity(h as usize);
                    for _ in 0..h {
                        match inner.step() {
                            Ok(s) => stats.push(s),
                            Err(e) => return (inner, Err(e)),
                        }
                    }
                    (inner, Ok(stats))
                });
                return Ok(Some(handle));
            }
            MemberAction::FetchState { epoch, senders } => {
                self.event(
                    EventKind::RecoveryStart,
                    format!("receiving the state from {senders:?}"),
                )?;
                self.fetch = Some(Fetch {
                    epoch,
                    started: self.clock.secs(),
                    buf: Vec::new(),
                    got: Vec::new(),
                    digest: None,
                });
            }
            MemberAction::SendState { epoch, to } => self.send_state(epoch, to).await?,
            MemberAction::StartAllReduce(start) => self.start_ring(start).await?,
            MemberAction::AbortAllReduce { epoch, op } => {
                if let Some((ring, s)) = self.ring.take() {
                    if s.epoch == epoch && s.op == op {
                        let g = ring.into_payload().unwrap_or_default();
                        if let Some(o) = self.outer.as_mut() {
                            o.put_pseudo_gradient(g)?;
                        }
                        self.step.retries += 1;
                        self.event(
                            EventKind::Retry,
                            format!("all-reduce {epoch}/op {op} aborted"),
                        )?;
                    } else {
                        self.ring = Some((ring, s));
                    }
                }
                self.early
                    .retain(|(_, f)| matches!(&f.header, Header::Collective(h) if h.epoch > epoch));
            }
            MemberAction::Commit { epoch, outer_step } => {
                let outer = self
                    .outer
                    .as_mut()
                    .ok_or(InnerError::Backend("commit without outer state".into()))?;
                outer.apply_outer_step();
                let hash = self.sync_inner_to_outer()?;
                self.finish_step(epoch, outer_step, hash)?;
            }
            MemberAction::SkipStep { epoch, outer_step, attempts } => {
                let outer = self
                    .outer
                    .as_mut()
                    .ok_or(InnerError::Backend("skip without outer state".into()))?;
                outer.skip_outer_step();
                let hash = self.sync_inner_to_outer()?;
                self.event(
                    EventKind::SkipStep,
                    format!("outer step {outer_step} skipped after {attempts} attempts"),
                )?;
                self.finish_step(epoch, outer_step, hash)?;
            }
            MemberAction::Stop(reason) => {
                let kind = match &reason {
                    StopReason::Left(_) => EventKind::Leave,
                    StopReason::Evicted(_) => EventKind::Evict,
                    StopReason::CoordinatorLost { .. } => EventKind::CoordinatorLost,
                    StopReason::Shutdown => EventKind::Stop,
                };
                self.event(kind, reason.to_string())?;
                let node = self.opts.name.clone();
                self.write(&MetricsLine::Resources { node, peak_rss_bytes: peak_rss_bytes() })?;
                // Let the deathrattle and the last frames leave before the process exits.
                tokio::time::sleep(Duration::from_millis(100)).await;
                self.stop = Some(reason);
            }
        }
        Ok(None)
    }

    fn on_computed(&mut self, stats: Vec<InnerStats>) -> Result<(), WorkerError> {
        self.step.compute_end = self.clock.secs();
        self.step.loss = stats.last().and_then(|s| s.loss);
        self.step.tokens = stats.iter().map(|s| s.tokens).sum();
        self.refresh_pseudo_gradient()?;
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
        let end = self.clock.secs();
        let s = &self.step;
        let compute_s = (s.compute_end - s.start).max(0.0);
        let ring_start = s.ring_start.unwrap_or(s.compute_end);
        let barrier_s = (ring_start - s.compute_end - s.recovery).max(0.0);
        let allreduce_s = (s.ring_end - ring_start).max(0.0);
        let wall = (end - s.start).max(0.0);
        let idle_s = (wall - compute_s - barrier_s - allreduce_s - s.recovery).max(0.0);
        let row = OuterStepRow {
            outer_step,
            node: self.opts.name.clone(),
            node_id: self.opts.id.0,
            epoch: epoch.0,
            world: s.world,
            start_s: s.start,
            end_s: end,
            compute_s,
            allreduce_s,
            barrier_s,
            recovery_s: s.recovery,
            checkpoint_s: 0.0,
            idle_s,
            bytes_sent: s.bytes,
            retries: s.retries,
            tokens: s.tokens,
            loss: s.loss,
            weights_hash: hash,
            weight: s.weight,
        };
        self.write(&MetricsLine::Row(row))
    }

    async fn start_ring(&mut self, s: AllReduceStart) -> Result<(), WorkerError> {
        self.ensure_outer()?;
        // Recompute the pseudo-gradient: a retry starts again from the kept inputs.
        self.refresh_pseudo_gradient()?;
        let g = self.outer.as_mut().expect("outer state").take_pseudo_gradient();
        let n = g.len();
        if self.step.ring_start.is_none() {
            self.step.ring_start = Some(self.clock.secs());
        }
        self.step.world = s.ring.len() as u32;
        self.step.weight = f64::from(s.weight.get());
        let mut cfg = RingConfig::new(s.epoch, s.op, s.ring.clone(), self.opts.id, self.opts.codec);
        cfg.segment_elems = self.opts.segment_elems;
        let ring = match RingAllReduce::new(cfg, Payload::Owned(g), s.weight) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(node = %self.opts.name, "cannot start the all-reduce: {e}");
                // The buffer went with the refused collective; the next attempt recomputes it.
                self.outer.as_mut().expect("outer state").put_pseudo_gradient(vec![0.0; n])?;
                self.member.report_allreduce_failed(self.clock.now(), s.epoch, s.op)?;
                return Ok(());
            }
        };
        self.ring = Some((ring, s));
        let early = std::mem::take(&mut self.early);
        for (from, f) in early {
            self.on_collective(from, f).await?;
        }
        self.pump_ring().await
    }

    async fn pump_ring(&mut self) -> Result<(), WorkerError> {
        loop {
            let Some((ring, _)) = self.ring.as_mut() else { return Ok(()) };
            let Some((to, f)) = ring.poll_send() else { break };
            if !self.send(to, f).await {
                let (ring, s) = self.ring.take().expect("ring");
                self.outer
                    .as_mut()
                    .expect("outer")
                    .put_pseudo_gradient(ring.into_payload().unwrap_or_default())?;
                self.event(EventKind::AllreduceFailed, format!("{} unreachable", to))?;
                let _ = self.member.report_allreduce_failed(self.clock.now(), s.epoch, s.op);
                return Ok(());
            }
        }
        let done = self.ring.as_ref().is_some_and(|(r, _)| r.is_done());
        if done {
            let (ring, s) = self.ring.take().expect("ring");
            self.outer
                .as_mut()
                .expect("outer")
                .put_pseudo_gradient(ring.into_payload().unwrap_or_default())?;
            self.step.ring_end = self.clock.secs();
            let _ = self.member.report_allreduce_done(self.clock.now(), s.epoch, s.op);
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
                self.on_state(h, frame.body)
            }
        }
    }

    async fn on_collective(&mut self, from: NodeId, frame: Frame) -> Result<(), WorkerError> {
        let Header::Collective(h) = &frame.header else { return Ok(()) };
        let Some((ring, s)) = self.ring.as_mut() else {
            // Not started yet: a neighbour's Release arrived first. Keep newer frames.
            let current = self.member.epoch().unwrap_or(Epoch(0));
            if h.epoch >= current && self.early.len() < MAX_EARLY_FRAMES {
                self.early.push((from, frame));
            }
            return Ok(());
        };
        match ring.handle_frame(from, &frame) {
            Ok(()) => self.pump_ring().await,
            Err(RingError::StaleEpoch { .. }) => Ok(()),
            Err(RingError::FutureEpoch { .. }) | Err(RingError::WrongOp { .. })
                if h.epoch >= s.epoch && h.op != s.op || h.epoch > s.epoch =>
            {
                if self.early.len() < MAX_EARLY_FRAMES {
                    self.early.push((from, frame));
                }
                Ok(())
            }
            Err(e) => {
                tracing::warn!(node = %self.opts.name, peer = %from, "dropped a collective frame: {e}");
                Ok(())
            }
        }
    }

    async fn send_state(&mut self, epoch: Epoch, to: NodeId) -> Result<(), WorkerError> {
        self.ensure_outer()?;
        let started = self.clock.secs();
        let inner = match self.inner.as_ref() {
            Some(i) => i.export_optimizer()?,
            None => Vec::new(),
        };
        let outer = self.outer.as_ref().expect("outer state");
        let state = TransferState {
            outer_steps: outer.steps(),
            outer: outer.outer().to_vec(),
            momentum: outer.momentum().to_vec(),
            inner,
        };
        let bytes =
            postcard::to_allocvec(&state).map_err(|e| InnerError::Backend(e.to_string()))?;
        let digest = blake3::hash(&bytes).to_hex().to_string();
        let bytes = Bytes::from(bytes);
        let total = bytes.len() as u64;
        let mut offset = 0usize;
        loop {
            let end = (offset + STATE_PIECE).min(bytes.len());
            let header = Header::State(StateHeader {
                epoch,
                outer_step: state.outer_steps,
                offset: offset as u64,
                total,
                digest: digest.clone(),
            });
            if !self.send(to, Frame { header, body: Body::Bytes(bytes.slice(offset..end)) }).await {
                break;
            }
            offset = end;
            if offset >= bytes.len() {
                break;
            }
        }
        self.step.recovery += self.clock.secs() - started;
        self.event(EventKind::RecoveryDone, format!("sent {total} bytes of state to {to}"))
    }

    fn on_state(&mut self, h: StateHeader, body: Body) -> Result<(), WorkerError> {
        let Some(f) = self.fetch.as_mut() else { return Ok(()) };
        let Body::Bytes(b) = body else { return Ok(()) };
        if h.epoch < f.epoch || h.total > (1 << 40) {
            return Ok(());
        }
        if f.digest.as_deref() != Some(h.digest.as_str()) {
            // First piece, or a sender with a different (newer) state: start over with it.
            f.digest = Some(h.digest.clone());
            f.buf = vec![0u8; h.total as usize];
            f.got.clear();
        }
        let end = h.offset as usize + b.len();
        if end > f.buf.len() {
            return Ok(());
        }
        f.buf[h.offset as usize..end].copy_from_slice(&b);
        f.got.push((h.offset, end as u64));
        let have: u64 = {
            let mut spans = f.got.clone();
            spans.sort_unstable();
            let (mut covered, mut reach) = (0u64, 0u64);
            for (a, e) in spans {
                if e > reach {
                    covered += e - a.max(reach);
                    reach = e;
                }
            }
            covered
        };
        if have < h.total {
            return Ok(());
        }
        let f = self.fetch.take().expect("fetch");
        if blake3::hash(&f.buf).to_hex().as_str() != h.digest {
            tracing::warn!(node = %self.opts.name, "state digest mismatch; waiting for another copy");
            self.fetch = Some(Fetch { buf: Vec::new(), got: Vec::new(), digest: None, ..f });
            return Ok(());
        }
        let state: TransferState =
            postcard::from_bytes(&f.buf).map_err(|e| InnerError::Backend(format!("state: {e}")))?;
        let layout = self.inner.as_ref().map(|i| i.param_layout()).unwrap_or_default();
        self.outer = Some(OuterState::restore(
            self.opts.outer,
            state.outer.clone(),
            state.momentum,
            buckets_from_sizes(layout),
            state.outer_steps,
        )?);
        if let Some(inner) = self.inner.as_mut() {
            inner.import_optimizer(&state.inner)?;
            inner.set_params(&state.outer)?;
        }
        self.step.recovery += self.clock.secs() - f.started;
        self.event(
            EventKind::RecoveryDone,
            format!("received {} bytes of state, digest {}", h.total, &h.digest[..16]),
        )?;
        self.member.report_sync_done(self.clock.now())?;
        Ok(())
    }
}
