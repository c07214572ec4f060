//! The real coordinator process: the mesh [`Coordinator`] over TCP.
//!
//! It learns where members listen from their handshakes and sends each member the directory of
//! the others before any message that may make it dial them. It ends the run (telling every
//! member to stop) when the scenario's stop condition is reached. Its metrics file holds its
//! events and every epoch it formed (for the launch's invariant checker).

use crate::identity::PublicKey;
use crate::node::{MetricsFile, MetricsLine};
use crate::tcp::{TcpConfig, TcpError, TcpTransport};
use loco_core::ids::NodeId;
use loco_core::mesh::{
    Coordinator, CoordinatorAction, EvictReason, MeshConfig, MeshEvent, MeshMsg,
};
use loco_core::metrics::{EventKind, EventRow};
use loco_core::time::Time;
use loco_core::transport::{Header, Transport, padded_frame};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// How the coordinator runs.
#[derive(Clone, Debug)]
pub struct CoordinatorOptions {
    /// Where it listens.
    pub listen: SocketAddr,
    /// Mesh settings.
    pub mesh: MeshConfig,
    /// TCP settings.
    pub tcp: TcpConfig,
    /// Stop after this many committed (or skipped) outer steps.
    pub stop_outer_steps: Option<u64>,
    /// Stop after this long.
    pub stop_time: Option<Duration>,
    /// Names of the nodes, for the metrics.
    pub names: BTreeMap<NodeId, String>,
    /// Where to append the coordinator's events (JSON lines of [`MetricsLine`]).
    pub metrics: Option<PathBuf>,
    /// Offset of this process's clock in the metrics (seconds since the launch started).
    pub time_offset_s: f64,
    /// The outer step the run starts at (a run resumed from checkpoints; 0 otherwise).
    pub start_outer_step: u64,
    /// The Prometheus metrics served on `--metrics-addr`: events, epochs and the mesh's state.
    pub exporter: Option<crate::exporter::Exporter>,
    /// Where a copy of every metrics line goes as it is written (a live page), when set.
    pub lines: Option<std::sync::mpsc::Sender<MetricsLine>>,
}

/// How the coordinator ended.
#[derive(Clone, Debug)]
pub struct CoordinatorReport {
    /// Outer steps committed.
    pub outer_steps: u64,
    /// Epochs formed.
    pub epochs: u64,
}

/// Failures of the coordinator process.
#[derive(Debug, thiserror::Error)]
pub enum CoordinatorError {
    /// The listening socket.
    #[error(transparent)]
    Tcp(#[from] TcpError),
    /// The transport closed.
    #[error("transport: {0}")]
    Transport(#[from] loco_core::transport::TransportError),
    /// Writing the metrics.
    #[error(transparent)]
    Metrics(#[from] crate::node::MetricsError),
}

/// How often the coordinator refreshes the mesh's figures of its [`Exporter`](crate::exporter::Exporter).
const EXPORT_EVERY: Duration = Duration::from_millis(500);

/// Binds the coordinator's socket; returns it with its address (for launchers that pick port 0).
/// Its sends never wait for a dial ([`TcpConfig::dial_in_background`]): its one loop also
/// judges every member's heartbeats, and a member announcing an address that drops SYNs must
/// not hold it.
pub async fn bind(opts: &CoordinatorOptions) -> Result<TcpTransport, CoordinatorError> {
    let cfg = TcpConfig { dial_in_background: true, ..opts.tcp.clone() };
    Ok(TcpTransport::bind(NodeId::COORDINATOR, opts.listen, cfg).await?)
}

/// The nodes the coordinator keeps addresses of, and names in directories: its members and
/// its queued joiners.
fn known(c: &Coordinator) -> BTreeSet<NodeId> {
    let s = c.state();
    s.members.keys().copied().chain(s.queue.iter().map(|j| j.id)).collect()
}

/// Sends `msg` to `to`, after the directory of peers' addresses where the message makes members
/// dial each other and `to` has not been sent this directory yet. The directory names only
/// `known` nodes: the addresses of ids that connected and never joined would grow it past a
/// frame's header limit. It is sent as changes: only the entries `to` was not sent before (a
/// member merges what it receives), so a new member costs each other member one entry, not
/// the whole directory again.
async fn send(
    t: &mut TcpTransport,
    sent_dirs: &mut BTreeMap<NodeId, SentDir>,
    known: &BTreeSet<NodeId>,
    to: NodeId,
    msg: MeshMsg,
) {
    if matches!(
        msg,
        MeshMsg::Release { .. }
            | MeshMsg::Sync { .. }
            | MeshMsg::View { .. }
            | MeshMsg::ProbeRequest { .. }
    ) {
        let mut dir: SentDir = BTreeMap::new();
        for (id, addr) in t.peer_addrs().into_iter().filter(|(id, _)| known.contains(id)) {
            dir.insert(id, (addr, t.key_of(id)));
        }
        let entries = dir_changes(sent_dirs.get(&to), &dir);
        if !entries.is_empty() && t.send_directory(to, entries).await.is_ok() {
            sent_dirs.insert(to, dir);
        }
    }
    if let Err(e) = t.send(to, padded_frame(msg, 0, false)).await {
        tracing::debug!(peer = %to, "send failed: {e}");
    }
}

/// What a member was sent of the directory: each peer's address and key.
type SentDir = BTreeMap<NodeId, (SocketAddr, Option<PublicKey>)>;

/// The entries of `dir` that a member sent `sent` before lacks or holds otherwise (another
/// address, or another key).
fn dir_changes(sent: Option<&SentDir>, dir: &SentDir) -> Vec<(NodeId, SocketAddr)> {
    dir.iter()
        .filter(|&(id, entry)| sent.and_then(|s| s.get(id)) != Some(entry))
        .map(|(&id, &(addr, _))| (id, addr))
        .collect()
}

/// The transport's upkeep at a new epoch: fresh dials to the partitioned, and addresses of
/// nodes neither members nor queued (nor connected now) forgotten. A node evicted is sent a
/// whole directory when it is a member again (a restarted process knows no peer).
fn after_epoch(
    t: &mut TcpTransport,
    sent_dirs: &mut BTreeMap<NodeId, SentDir>,
    c: &Coordinator,
    evicted: &[(NodeId, EvictReason)],
) {
    // A node silent for the heartbeat timeout is likely behind a partition: the connection to
    // it would resume only at TCP's next backed-off retransmission after the heal. Dial afresh
    // instead.
    for (n, why) in evicted {
        if *why == EvictReason::HeartbeatTimeout {
            t.reset(*n);
        }
        sent_dirs.remove(n);
    }
    let keep = known(c);
    t.retain_peer_addrs(|id| keep.contains(&id));
    sent_dirs.retain(|id, _| keep.contains(id));
}

/// Where the coordinator's metrics lines go: its file, the exporter and the launch's channel.
struct Lines<'a> {
    file: Option<MetricsFile>,
    opts: &'a CoordinatorOptions,
}

impl Lines<'_> {
    /// Writes `l` everywhere it goes (an event is logged too).
    fn write(&mut self, l: MetricsLine) -> Result<(), CoordinatorError> {
        if let MetricsLine::Event(e) = &l {
            tracing::info!(
                kind = e.kind.as_str(),
                node = e.node.as_deref().unwrap_or(""),
                "{}",
                e.detail
            );
        }
        if let Some(e) = &self.opts.exporter {
            e.observe(&l);
        }
        if let Some(tx) = &self.opts.lines {
            let _ = tx.send(l.clone());
        }
        if let Some(f) = self.file.as_mut() {
            f.write(&l)?;
        }
        Ok(())
    }
}

/// Whether the coordinator's event ends an outer step (committed or skipped).
fn ends_a_step(ev: &MeshEvent) -> bool {
    matches!(
        ev,
        MeshEvent::Committed { .. }
            | MeshEvent::StepSkipped { .. }
            | MeshEvent::UpdateRefused { stopping: false, .. }
    )
}

/// Logs a coordinator's event at the level it deserves.
fn log_event(ev: &MeshEvent) {
    match ev {
        MeshEvent::NoSyncedMember { .. } | MeshEvent::UpdateRefused { stopping: true, .. } => {
            tracing::error!("{ev}")
        }
        MeshEvent::UpdateRefused { stopping: false, .. }
        | MeshEvent::JoinRefused { .. }
        | MeshEvent::QueueFull { .. } => tracing::warn!("{ev}"),
        _ => tracing::debug!("{ev}"),
    }
}

/// The `stop` row of an event that ends the run, at `at` seconds.
fn stop_row(ev: &MeshEvent, at: f64) -> Option<EventRow> {
    let detail = match ev {
        MeshEvent::NoSyncedMember { outer_step, .. } => format!(
            "no member holds the training state any more: stopped at outer step {outer_step} \
             (resume from checkpoints)"
        ),
        MeshEvent::UpdateRefused { stopping: true, .. } | MeshEvent::Shutdown => ev.to_string(),
        _ => return None,
    };
    Some(EventRow::new(at, EventKind::Stop).detail(detail))
}

/// Runs the coordinator on a bound transport until the stop condition, or until `shutdown`
/// resolves (then it tells every member to stop).
pub async fn run_coordinator(
    opts: CoordinatorOptions,
    mut t: TcpTransport,
    shutdown: impl Future<Output = ()>,
) -> Result<CoordinatorReport, CoordinatorError> {
    let start = tokio::time::Instant::now();
    let now = || Time::from_nanos(start.elapsed().as_nanos() as u64);
    let secs = || opts.time_offset_s + start.elapsed().as_secs_f64();
    let mut out = Lines { file: MetricsFile::open(opts.metrics.as_deref())?, opts: &opts };
    if let Some(e) = &opts.exporter {
        e.watch_transport(t.stats_handle(), opts.names.clone());
    }
    let name = |n: NodeId| opts.names.get(&n).cloned().unwrap_or_else(|| n.to_string());
    let mut write = |l: MetricsLine| out.write(l);
    let mut c = Coordinator::starting_at(opts.mesh.clone(), opts.start_outer_step);
    let mut sent_dirs: BTreeMap<NodeId, SentDir> = BTreeMap::new();
    let mut committed = 0u64;
    let mut epochs = 0u64;
    let mut stopping = false;
    let mut shutdown = std::pin::pin!(shutdown);
    let deadline = opts.stop_time.map(|d| start + d);
    // The mesh's figures are read at most this often: a heartbeat must stay O(1).
    let mut exported: Option<tokio::time::Instant> = None;
    loop {
        if let Some(e) = &opts.exporter {
            let due = exported.is_none_or(|t| t.elapsed() >= EXPORT_EVERY);
            if due {
                exported = Some(tokio::time::Instant::now());
                e.mesh(c.state(), now(), name);
            }
        }
        while let Some(a) = c.poll_action() {
            match a {
                CoordinatorAction::Send { to, msg } => {
                    send(&mut t, &mut sent_dirs, &known(&c), to, msg).await;
                }
                CoordinatorAction::Event(ev) => {
                    let at = secs();
                    for r in loco_core::node::events::coordinator_rows(at, &ev, &name) {
                        write(MetricsLine::Event(r))?;
                    }
                    match &ev {
                        MeshEvent::EpochFormed { epoch, members, evicted, .. } => {
                            epochs += 1;
                            // For the launch's invariant checker: members' views must agree.
                            write(MetricsLine::EpochFormed {
                                epoch: *epoch,
                                members: members.clone(),
                            })?;
                            after_epoch(&mut t, &mut sent_dirs, &c, evicted);
                        }
                        _ if ends_a_step(&ev) => committed += 1,
                        _ => {}
                    }
                    log_event(&ev);
                    if let Some(row) = stop_row(&ev, at) {
                        // The run's end, as the simulator writes it: no epoch.
                        write(MetricsLine::Event(row))?;
                    }
                }
            }
        }
        if c.is_stopped() {
            // Let the shutdown messages leave, as a worker's last frames do.
            tokio::time::sleep(loco_core::node::process::EXIT_GRACE).await;
            return Ok(CoordinatorReport { outer_steps: committed, epochs });
        }
        // The stop counts the run's outer steps, those before a resume included.
        let reached = opts.stop_outer_steps.is_some_and(|n| c.outer_step() >= n)
            || deadline.is_some_and(|d| tokio::time::Instant::now() >= d);
        if reached && !stopping {
            stopping = true;
            c.shutdown(now());
            continue;
        }
        let next = c.poll_timeout().map(|t| start + Duration::from_nanos(t.as_nanos()));
        let next = match (next, deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        tokio::select! {
            r = t.recv() => {
                let (from, frame) = r?;
                if let Header::Mesh(msg) = frame.header {
                    c.handle_message(now(), from, msg);
                }
            }
            () = tokio::time::sleep_until(next.unwrap_or_else(tokio::time::Instant::now)), if next.is_some() => {
                c.handle_timeout(now());
            }
            () = &mut shutdown, if !stopping => {
                stopping = true;
                c.shutdown(now());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A member is sent only what it lacks or holds otherwise (an address, a key); a member
    /// sent nothing before gets the whole directory.
    #[test]
    fn a_directory_goes_as_changes() {
        let addr = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
        let key = Some(PublicKey([7; 32]));
        let sent: SentDir =
            [(NodeId(1), (addr(1), None)), (NodeId(2), (addr(2), None))].into_iter().collect();
        let mut dir = sent.clone();
        assert!(dir_changes(Some(&sent), &dir).is_empty());
        dir.insert(NodeId(3), (addr(3), None));
        dir.insert(NodeId(2), (addr(22), None));
        dir.insert(NodeId(1), (addr(1), key));
        let want = vec![(NodeId(1), addr(1)), (NodeId(2), addr(22)), (NodeId(3), addr(3))];
        assert_eq!(dir_changes(Some(&sent), &dir), want, "a new key, address, member");
        dir.remove(&NodeId(1));
        assert_eq!(dir_changes(None, &dir).len(), 2);
    }
}
