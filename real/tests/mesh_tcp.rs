//! Real processes' protocol in one test process: a coordinator and workers over loopback TCP,
//! with the synthetic inner loop (no libtorch). Every wait is bounded.

use loco_core::ids::NodeId;
use loco_core::mesh::{MeshConfig, StopReason};
use loco_real::coord::{CoordinatorOptions, bind, run_coordinator};
use loco_real::inner::Quadratic;
use loco_real::node::{MetricsLine, WorkerOptions, WorkerReport, run_worker};
use loco_real::tcp::TcpConfig;
use std::collections::BTreeMap;
use std::time::Duration;

fn mesh() -> MeshConfig {
    MeshConfig {
        heartbeat_interval: Duration::from_millis(100),
        heartbeat_timeout: Duration::from_millis(600),
        barrier_timeout: Duration::from_secs(10),
        coordinator_timeout: Duration::from_secs(3),
        min_members: 3,
        join_window: Duration::from_millis(200),
        allreduce_timeout: Duration::from_secs(10),
        retry_backoff: Duration::from_millis(50),
        probe_duration: Duration::from_millis(50),
        ..MeshConfig::default()
    }
}

mod common;

fn worker(id: u32, coordinator: std::net::SocketAddr, dir: &std::path::Path) -> WorkerOptions {
    worker_in(common::scenario(4, 1, 5, "uint8", Some(1000), mesh()), id, coordinator, dir)
}

fn worker_in(
    scenario: std::sync::Arc<loco_core::scenario::Scenario>,
    id: u32,
    coordinator: std::net::SocketAddr,
    dir: &std::path::Path,
) -> WorkerOptions {
    WorkerOptions {
        scenario,
        id: NodeId(id),
        incarnation: 1,
        coordinator,
        listen: "127.0.0.1:0".parse().unwrap(),
        tcp: TcpConfig::default(),
        metrics: Some(dir.join(format!("w{id}.jsonl"))),
        time_offset_s: 0.0,
        checkpoint: None,
        resume: None,
        faults: Vec::new(),
        status: None,
        exporter: None,
        hang: None,
    }
}

fn rows(path: &std::path::Path) -> Vec<loco_core::metrics::OuterStepRow> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| match serde_json::from_str::<MetricsLine>(l).ok()? {
            MetricsLine::Row(r) => Some(r),
            _ => None,
        })
        .collect()
}

/// Waits (at most 30 s) until the worker writing `path` has finished an outer step.
async fn first_step_of(path: &std::path::Path) {
    tokio::time::timeout(Duration::from_secs(30), async {
        while rows(path).is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{} finished no step", path.display()));
}

/// The reports of `ws`, which must all finish within `secs`.
async fn reports_of(
    ws: Vec<tokio::task::JoinHandle<Result<WorkerReport, loco_real::node::WorkerError>>>,
    secs: u64,
) -> Vec<WorkerReport> {
    tokio::time::timeout(Duration::from_secs(secs), async {
        let mut out = Vec::new();
        for w in ws {
            out.push(w.await.unwrap().unwrap());
        }
        out
    })
    .await
    .expect("every worker finishes in time")
}

/// Starts a coordinator with `mesh` that stops after `steps` outer steps; its events go to
/// `dir`.
async fn start_coordinator(
    dir: &std::path::Path,
    mesh: MeshConfig,
    steps: u64,
) -> (
    std::net::SocketAddr,
    tokio::task::JoinHandle<
        Result<loco_real::coord::CoordinatorReport, loco_real::coord::CoordinatorError>,
    >,
) {
    let copts = CoordinatorOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        mesh,
        tcp: TcpConfig::default(),
        stop_outer_steps: Some(steps),
        stop_time: None,
        names: BTreeMap::new(),
        metrics: Some(dir.join("coordinator.jsonl")),
        time_offset_s: 0.0,
        start_outer_step: 0,
        exporter: None,
        lines: None,
    };
    let t = bind(&copts).await.unwrap();
    let addr = t.local_addr();
    (addr, tokio::spawn(run_coordinator(copts, t, std::future::pending())))
}

/// Slows a worker's inner steps down (so that a crash can land mid-run), and pads its optimiser
/// state with `.2` bytes (a stand-in for a big model's AdamW moments, so that a live-recovery
/// transfer takes a while).
struct Slow(Quadratic, Duration, usize);

impl loco_real::inner::InnerLoop for Slow {
    fn param_layout(&self) -> Vec<(String, usize)> {
        self.0.param_layout()
    }
    fn params_into(&self, out: &mut [f32]) -> Result<(), loco_real::inner::InnerError> {
        self.0.params_into(out)
    }
    fn set_params(&mut self, p: &[f32]) -> Result<(), loco_real::inner::InnerError> {
        self.0.set_params(p)
    }
    fn step(&mut self) -> Result<loco_real::inner::InnerStats, loco_real::inner::InnerError> {
        std::thread::sleep(self.1);
        self.0.step()
    }
    fn export_optimizer(&self) -> Result<Vec<u8>, loco_real::inner::InnerError> {
        let own = self.0.export_optimizer()?;
        let mut out = (own.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(&own);
        out.resize(out.len() + self.2, 0xa5);
        Ok(out)
    }
    fn max_optimizer_bytes(&self) -> u64 {
        self.0.max_optimizer_bytes() + 8 + self.2 as u64
    }
    fn import_optimizer(&mut self, bytes: &[u8]) -> Result<(), loco_real::inner::InnerError> {
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        assert_eq!(bytes.len(), 8 + n + self.2, "the whole state arrived");
        assert!(bytes[8 + n..].iter().all(|&b| b == 0xa5));
        self.0.import_optimizer(&bytes[8..8 + n])
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_workers_train_and_end_bit_identical_after_every_outer_step() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, coord) = start_coordinator(dir.path(), mesh(), 4).await;
    let mut ws = Vec::new();
    for id in 0..3 {
        let o = worker(id, addr, dir.path());
        ws.push(tokio::spawn(run_worker(o, Quadratic::new(10_000, 1, id), std::future::pending())));
    }
    let reports: Vec<WorkerReport> = tokio::time::timeout(Duration::from_secs(60), async {
        let mut out = Vec::new();
        for w in ws {
            out.push(w.await.unwrap().unwrap());
        }
        out
    })
    .await
    .expect("the run ends");
    let c = coord.await.unwrap().unwrap();
    assert_eq!(c.outer_steps, 4);
    for r in &reports {
        assert_eq!(r.stop, StopReason::Shutdown);
        assert_eq!(r.committed, 4);
        assert_eq!(r.weights_hash, reports[0].weights_hash);
    }
    // A hash per worker per outer step, equal across workers; and the loss goes down.
    let per: Vec<_> = (0..3).map(|i| rows(&dir.path().join(format!("w{i}.jsonl")))).collect();
    for step in 0..4 {
        let hashes: Vec<_> = per.iter().map(|r| r[step].weights_hash).collect();
        assert!(hashes.iter().all(|h| *h == hashes[0] && h.is_some()), "step {step}: {hashes:?}");
    }
    let first = per[0][0].loss.unwrap();
    let last = per[0][3].loss.unwrap();
    assert!(last < first, "loss {first} -> {last}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_worker_is_evicted_and_the_survivors_agree() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, coord) = start_coordinator(dir.path(), mesh(), 5).await;
    let mut ws = Vec::new();
    for id in 0..4 {
        let o = worker(id, addr, dir.path());
        let inner = Slow(Quadratic::new(5_000, 1, id), Duration::from_millis(20), 0);
        ws.push(tokio::spawn(run_worker(o, inner, std::future::pending())));
    }
    // Crash worker 3 (abort its task: its sockets close, no deathrattle) after its first step.
    first_step_of(&dir.path().join("w3.jsonl")).await;
    let victim = ws.pop().unwrap();
    victim.abort();
    let reports = reports_of(ws, 60).await;
    coord.await.unwrap().unwrap();
    for r in &reports {
        assert_eq!(r.stop, StopReason::Shutdown);
        assert_eq!(r.weights_hash, reports[0].weights_hash, "survivors agree");
    }
    let events = std::fs::read_to_string(dir.path().join("coordinator.jsonl")).unwrap();
    assert!(events.contains(r#""kind":"evict","node":"n3""#), "{events}");
    // The steps after the eviction ran on 3 members.
    let last = rows(&dir.path().join("w0.jsonl"));
    assert_eq!(last.last().unwrap().world, 3);
}

/// A non-blocking joiner whose state takes several outer steps to arrive: the members do not
/// wait, and the joiner closes steps without the mesh's weights (no digest, weight 0), replays
/// them onto the state when it arrives, then counts fully; every replica ends identical. For
/// that the sender keeps its part in the ring while it serialises and hashes the state (off its
/// event loop), and its collective frames do not queue behind the state's (which have a
/// connection of their own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_blocking_joiner_replays_the_steps_committed_while_a_large_state_arrived() {
    const PAD: usize = 192 << 20;
    let dir = tempfile::tempdir().unwrap();
    let mut m = mesh();
    m.join_mode = loco_core::mesh::JoinMode::NonBlocking;
    let (addr, coord) = start_coordinator(dir.path(), m.clone(), 40).await;
    let start = |id: u32| {
        let o = worker_in(
            common::scenario(4, 1, 5, "uint8", Some(1000), m.clone()),
            id,
            addr,
            dir.path(),
        );
        let inner = Slow(Quadratic::new(2_000, 1, id), Duration::from_millis(5), PAD);
        tokio::spawn(run_worker(o, inner, std::future::pending()))
    };
    let mut ws: Vec<_> = [0, 2, 3].into_iter().map(start).collect();
    let first = dir.path().join("w0.jsonl");
    first_step_of(&first).await;
    ws.push(start(1));
    let reports = reports_of(ws, 120).await;
    coord.await.unwrap().unwrap();
    for r in &reports {
        assert_eq!(r.weights_hash, reports[0].weights_hash, "replicas agree at the end");
    }
    let joiner = rows(&dir.path().join("w1.jsonl"));
    // Every other worker's rows: under load one of them may be evicted and rejoin, and has no
    // row for the steps committed while it was out; whoever committed a step has its digest.
    let members: Vec<_> =
        [0, 2, 3].iter().flat_map(|i| rows(&dir.path().join(format!("w{i}.jsonl")))).collect();
    let unsynced = joiner.iter().take_while(|r| r.weights_hash.is_none()).count();
    assert!(unsynced >= 1, "the joiner closed steps before its state arrived: {joiner:?}");
    assert!(joiner[..unsynced].iter().all(|r| r.weight == 0.0), "{joiner:?}");
    assert!(joiner[unsynced..].iter().all(|r| r.weights_hash.is_some()), "{joiner:?}");
    assert_eq!(joiner.last().unwrap().weight, 1.0, "it counts fully in the end");
    // Its digests equal the members' at every step it holds the state.
    for r in &joiner[unsynced..] {
        let same: Vec<_> = members
            .iter()
            .filter(|x| x.outer_step == r.outer_step && x.weights_hash.is_some())
            .collect();
        assert!(!same.is_empty(), "no other worker closed outer step {}", r.outer_step);
        for m in same {
            assert_eq!(r.weights_hash, m.weights_hash, "outer step {} ({})", r.outer_step, m.node);
        }
    }
    let events = std::fs::read_to_string(dir.path().join("w1.jsonl")).unwrap();
    assert!(events.contains("step(s) replayed"), "{events}");
}

/// Two local shards per worker: two rings of half the vector each, one epoch; the replicas stay
/// bit-identical after every step (the shards' results are concatenated beside the loop).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_shards_per_worker_keep_the_replicas_identical() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, coord) = start_coordinator(dir.path(), mesh(), 3).await;
    let mut ws = Vec::new();
    for id in 0..3 {
        let o =
            worker_in(common::scenario(4, 2, 5, "uint8", Some(1000), mesh()), id, addr, dir.path());
        ws.push(tokio::spawn(run_worker(o, Quadratic::new(10_001, 1, id), std::future::pending())));
    }
    let reports = reports_of(ws, 60).await;
    assert_eq!(coord.await.unwrap().unwrap().outer_steps, 3);
    for r in &reports {
        assert_eq!((r.stop.clone(), r.committed), (StopReason::Shutdown, 3));
        assert_eq!(r.weights_hash, reports[0].weights_hash);
    }
    let per: Vec<_> = (0..3).map(|i| rows(&dir.path().join(format!("w{i}.jsonl")))).collect();
    for step in 0..3 {
        let hashes: Vec<_> = per.iter().map(|r| r[step].weights_hash).collect();
        assert!(hashes.iter().all(|h| *h == hashes[0] && h.is_some()), "step {step}: {hashes:?}");
    }
}

/// Relays connections from `listen` to `to`, changing one byte of the first connection that
/// carries more than `at` bytes towards `to` (once): a frame damaged on the path, which the
/// receiver drops with its connection. Sets `struck` when it did.
async fn damaging_proxy(
    listen: tokio::net::TcpListener,
    to: std::net::SocketAddr,
    at: u64,
    struck: std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // Bounded: a test's few connections.
    for _ in 0..64 {
        let Ok((inbound, _)) = listen.accept().await else { return };
        let Ok(outbound) = tokio::net::TcpStream::connect(to).await else { return };
        let struck = struck.clone();
        tokio::spawn(async move {
            let (mut ir, mut iw) = inbound.into_split();
            let (mut or, mut ow) = outbound.into_split();
            let back = tokio::spawn(async move { tokio::io::copy(&mut or, &mut iw).await });
            let mut buf = vec![0u8; 64 << 10];
            let mut seen = 0u64;
            loop {
                let n = match ir.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                let end = seen + n as u64;
                if seen <= at && at < end && !struck.swap(true, Ordering::SeqCst) {
                    buf[(at - seen) as usize] ^= 0x5a;
                }
                seen = end;
                if ow.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
            back.abort();
        });
    }
}

/// A state frame damaged on the path: the piece's bytes no longer match the digest in its
/// header, so the joiner refuses that piece alone and asks its sender for it at once, without
/// waiting `state_resend_after` (set long here) or dropping the connection and the pieces behind
/// it; it completes and the replicas end identical.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_frame_damaged_on_the_path_is_fetched_again() {
    const PAD: usize = 24 << 20;
    const QUIET: Duration = Duration::from_secs(40);
    let dir = tempfile::tempdir().unwrap();
    let m = MeshConfig { state_resend_after: QUIET, ..mesh() };
    let (addr, coord) = start_coordinator(dir.path(), m.clone(), 8).await;
    // The joiner listens on a port known in advance; its senders reach it through the proxy.
    let joiner_addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let via = proxy.local_addr().unwrap();
    let struck = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    tokio::spawn(damaging_proxy(proxy, joiner_addr, 5 << 20, struck.clone()));
    let start = |id: u32| {
        let mut o = worker_in(
            common::scenario(4, 1, 5, "uint8", Some(1000), m.clone()),
            id,
            addr,
            dir.path(),
        );
        if id == 1 {
            o.listen = joiner_addr;
        } else {
            o.tcp.dial_via.insert(NodeId(1), via);
        }
        let inner = Slow(Quadratic::new(2_000, 1, id), Duration::from_millis(5), PAD);
        tokio::spawn(run_worker(o, inner, std::future::pending()))
    };
    let mut ws: Vec<_> = [0, 2, 3].into_iter().map(start).collect();
    first_step_of(&dir.path().join("w0.jsonl")).await;
    ws.push(start(1));
    let reports = reports_of(ws, 120).await;
    coord.await.unwrap().unwrap();
    assert!(struck.load(std::sync::atomic::Ordering::SeqCst), "the proxy changed a byte");
    for r in &reports {
        assert_eq!(r.weights_hash, reports[0].weights_hash, "replicas agree at the end");
    }
    let joiner = rows(&dir.path().join("w1.jsonl"));
    assert!(joiner.iter().any(|r| r.weights_hash.is_some()), "the joiner synced: {joiner:?}");
    let waited: f64 = joiner.iter().map(|r| r.recovery_s).sum();
    assert!(waited < QUIET.as_secs_f64(), "the piece was asked for at once: recovery_s {waited}");
}

/// A worker whose checkpoints keep failing (here its directory is replaced by a file) trains on,
/// says so in its log and events from the third failure in a row, and ends with an error naming
/// the failures, not as a run that could be resumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_checkpoints_keep_failing_ends_with_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let mesh = MeshConfig { min_members: 1, ..mesh() };
    let (addr, coord) = start_coordinator(dir.path(), mesh.clone(), 10).await;
    let scenario = common::scenario(1, 1, 5, "uint8", Some(1000), mesh);
    let name = scenario.node(NodeId(0)).unwrap().name.clone();
    let mut o = worker_in(scenario, 0, addr, dir.path());
    let config = loco_real::checkpoint::CheckpointConfig {
        model: None,
        dir: dir.path().join("ckpt"),
        scenario: "test".into(),
        node: name.clone(),
        keep: 2,
        remote: None,
    };
    o.checkpoint = Some(loco_real::node::CheckpointPlan { config, every: 1 });
    let node_dir = dir.path().join("ckpt").join(&name);
    let inner = Slow(Quadratic::new(2_000, 1, 0), Duration::from_millis(40), 0);
    let w = tokio::spawn(run_worker(o, inner, std::future::pending()));
    // Once the worker made its directory, a file takes its place: every save fails from then.
    tokio::time::timeout(Duration::from_secs(30), async {
        while !node_dir.is_dir() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the worker makes its checkpoint directory");
    std::fs::remove_dir_all(&node_dir).unwrap();
    std::fs::write(&node_dir, b"not a directory").unwrap();
    let r = tokio::time::timeout(Duration::from_secs(60), w).await.expect("the run ends").unwrap();
    match r {
        Err(loco_real::node::WorkerError::CheckpointsFailing { failures, last }) => {
            assert!(failures >= 3, "{failures} failures");
            assert!(last.contains(&name), "{last}");
        }
        other => panic!("a run whose checkpoints all failed ended with {other:?}"),
    }
    assert_eq!(coord.await.unwrap().unwrap().outer_steps, 10, "training went on");
    let log = std::fs::read_to_string(dir.path().join("w0.jsonl")).unwrap();
    assert!(log.contains("3 in a row"), "the third failure in a row is said as such");
}

/// One run of 3 workers for `steps` outer steps (inner steps paced at 20 ms) with `flood` idle
/// connections opened to worker 0 and to the coordinator while it trains: its wall time, the
/// process's CPU time over it, and the epochs the coordinator formed.
async fn run_under_flood(flood: usize, steps: u64) -> (Duration, Duration, u64) {
    let dir = tempfile::tempdir().unwrap();
    let mesh = MeshConfig {
        heartbeat_interval: Duration::from_millis(200),
        heartbeat_timeout: Duration::from_millis(1500),
        ..mesh()
    };
    let cpu0 = cpu_time();
    let t0 = tokio::time::Instant::now();
    let (addr, coord) = start_coordinator(dir.path(), mesh.clone(), steps).await;
    // Worker 0 listens on a port known here, for the flood.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let target: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let scenario = common::scenario(3, 1, 5, "uint8", Some(1000), mesh);
    let mut ws = Vec::new();
    for id in 0..3 {
        let mut o = worker_in(scenario.clone(), id, addr, dir.path());
        if id == 0 {
            o.listen = target;
        }
        let inner = Slow(Quadratic::new(20_000, 1, id), Duration::from_millis(20), 0);
        ws.push(tokio::spawn(run_worker(o, inner, std::future::pending())));
    }
    // The flood: idle connections, opened as fast as they are accepted, held open to the end.
    let flooding = tokio::spawn(async move {
        let mut held = Vec::new();
        for i in 0..2 * flood {
            let to = if i % 2 == 0 { target } else { addr };
            match tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(to))
                .await
            {
                Ok(Ok(s)) => held.push(s),
                // Worker 0 not listening yet: try again shortly.
                _ => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
        held
    });
    let reports = reports_of(ws, 120).await;
    let wall = t0.elapsed();
    let cpu = cpu_time() - cpu0;
    let c = coord.await.unwrap().unwrap();
    assert_eq!(c.outer_steps, steps);
    for r in &reports {
        assert_eq!(r.committed, steps, "every worker committed every step");
    }
    let held = flooding.await.unwrap();
    assert!(flood == 0 || held.len() > flood, "{} idle connections held open", held.len());
    (wall, cpu, c.epochs)
}

/// CPU time of this process (user and system), from `/proc/self/stat`.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after.split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10) // USER_HZ is 100 on Linux
}

/// 2,000 idle connections to a worker and 2,000 to the coordinator while they train leave the
/// run as it was: one epoch (nobody evicted), every step committed by every worker, and a wall
/// and CPU time within a small factor of the same run without them, measured here (the
/// listeners evict the oldest handshakes in flight, at most 128 each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_idle_connections_each_to_a_worker_and_the_coordinator_slow_nothing() {
    let steps = 15;
    let (base_wall, base_cpu, base_epochs) = run_under_flood(0, steps).await;
    let (wall, cpu, epochs) = run_under_flood(2000, steps).await;
    eprintln!(
        "flood of 2 x 2000 idle connections: wall {:.2} s against {:.2} s ({:.2}x), \
         CPU {:.2} s against {:.2} s ({:.2}x)",
        wall.as_secs_f64(),
        base_wall.as_secs_f64(),
        wall.as_secs_f64() / base_wall.as_secs_f64(),
        cpu.as_secs_f64(),
        base_cpu.as_secs_f64(),
        cpu.as_secs_f64() / base_cpu.as_secs_f64().max(0.01),
    );
    assert_eq!(base_epochs, 1);
    assert_eq!(epochs, 1, "a member was evicted under the flood");
    assert!(wall < base_wall * 2, "{wall:?} under the flood against {base_wall:?}");
}

/// A coordinator that dies mid-run and is started again on the same address, knowing nobody:
/// the workers are told they are not members, join again saying which state they hold, and the
/// new coordinator founds its mesh on it, at the step they reached, with epochs above the old
/// ones. Every step's weights are the same on every worker, each step recorded once, and the
/// run ends at its step count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_restarted_on_its_address_goes_on_from_the_workers_state() {
    let dir = tempfile::tempdir().unwrap();
    let mesh = MeshConfig { heartbeat_interval: Duration::from_millis(200), ..mesh() };
    let steps = 12;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let coordinator = |metrics: &str| CoordinatorOptions {
        listen,
        mesh: mesh.clone(),
        tcp: TcpConfig::default(),
        stop_outer_steps: Some(steps),
        stop_time: None,
        names: BTreeMap::new(),
        metrics: Some(dir.path().join(metrics)),
        time_offset_s: 0.0,
        start_outer_step: 0,
        exporter: None,
        lines: None,
    };
    let first = coordinator("first.jsonl");
    let t = bind(&first).await.unwrap();
    let old = tokio::spawn(run_coordinator(first, t, std::future::pending()));
    let scenario = common::scenario(3, 1, 5, "uint8", Some(1000), mesh.clone());
    let mut ws = Vec::new();
    for id in 0..3 {
        let o = worker_in(scenario.clone(), id, listen, dir.path());
        let inner = Slow(Quadratic::new(5_000, 1, id), Duration::from_millis(20), 0);
        ws.push(tokio::spawn(run_worker(o, inner, std::future::pending())));
    }
    // Some steps, then the coordinator's process dies and a new one takes its address.
    tokio::time::timeout(Duration::from_secs(30), async {
        while rows(&dir.path().join("w0.jsonl")).len() < 4 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("steps before the restart");
    old.abort();
    let _ = old.await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = coordinator("second.jsonl");
    let t = bind(&second).await.unwrap();
    let c = tokio::spawn(run_coordinator(second, t, std::future::pending()));
    let reports = reports_of(ws, 90).await;
    let c = c.await.unwrap().unwrap();
    assert!(c.outer_steps < steps, "the new coordinator went on from the workers' step");
    let per: Vec<_> = (0..3).map(|i| rows(&dir.path().join(format!("w{i}.jsonl")))).collect();
    for r in &reports {
        assert_eq!(r.weights_hash, reports[0].weights_hash, "replicas equal at the end");
    }
    for w in &per {
        let mut seen = std::collections::BTreeMap::new();
        for r in w {
            let before = seen.insert(r.outer_step, r.weights_hash);
            assert!(before.is_none(), "step {} recorded twice: the run started over", r.outer_step);
        }
        assert_eq!(seen.keys().copied().collect::<Vec<_>>(), (0..steps).collect::<Vec<_>>());
    }
    for step in 0..steps as usize {
        let hashes: Vec<_> = per.iter().map(|r| r[step].weights_hash).collect();
        assert!(hashes.iter().all(|h| *h == hashes[0] && h.is_some()), "step {step}: {hashes:?}");
    }
    // The new mesh's epochs go on above the old one's.
    let epochs = |f: &str| -> Vec<u64> {
        std::fs::read_to_string(dir.path().join(f))
            .unwrap()
            .lines()
            .filter_map(|l| match serde_json::from_str::<MetricsLine>(l).ok()? {
                MetricsLine::EpochFormed { epoch, .. } => Some(epoch.0),
                _ => None,
            })
            .collect()
    };
    let (a, b) = (epochs("first.jsonl"), epochs("second.jsonl"));
    assert!(b.first() > a.last(), "epochs {a:?} then {b:?}");
}
