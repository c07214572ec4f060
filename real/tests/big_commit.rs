//! A model whose commit work takes longer than the heartbeat timeout: applying the outer step,
//! resetting the inner weights, digesting them and refreshing the pseudo-gradient read and write
//! every parameter, which for 2e8 parameters takes seconds on a small machine. The worker does
//! that work on blocking threads and keeps heartbeating meanwhile, so nobody is evicted; each
//! commit's time is in the rows' `outer_s`.
//!
//! Size: `LOCO_BIG_PARAMS` parameters (default 2e8: 800 MB per fp32 buffer, four buffers per
//! worker: the inner weights and the outer state's weights, momentum and pseudo-gradient; 3
//! workers hold about 10 GB).

use loco_core::ids::NodeId;
use loco_core::mesh::{MeshConfig, StopReason};
use loco_core::metrics::OuterStepRow;
use loco_real::coord::{CoordinatorOptions, bind, run_coordinator};
use loco_real::inner::{InnerError, InnerLoop, InnerStats};
use loco_real::node::{MetricsLine, WorkerOptions, run_worker};
use loco_real::tcp::TcpConfig;
use std::collections::BTreeMap;
use std::time::Duration;

const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(1);
const WORKERS: u32 = 3;
const OUTER_STEPS: u64 = 3;

fn params() -> usize {
    std::env::var("LOCO_BIG_PARAMS")
        .ok()
        .map(|v| v.parse::<f64>().expect("LOCO_BIG_PARAMS is a number") as usize)
        .unwrap_or(200_000_000)
}

/// A synthetic inner loop whose inner steps are cheap (a big model's run on an accelerator; here
/// they would only take the CPU from what is measured): each moves a strided sample of its
/// weights towards a target of its node. Its parameters are one flat fp32 vector, copied in and
/// out like a real model's.
struct Flat {
    x: Vec<f32>,
    node: u32,
}

impl Flat {
    fn new(n: usize, node: u32) -> Flat {
        // The same start on every node.
        let x =
            (0..n).map(|i| ((i as u32).wrapping_mul(2_654_435_761) >> 20) as f32 * 1e-3).collect();
        Flat { x, node }
    }
}

impl InnerLoop for Flat {
    fn param_layout(&self) -> Vec<(String, usize)> {
        vec![("x".to_string(), self.x.len())]
    }
    fn params_into(&self, out: &mut [f32]) -> Result<(), InnerError> {
        if out.len() != self.x.len() {
            return Err(InnerError::Length { expected: self.x.len(), got: out.len() });
        }
        out.copy_from_slice(&self.x);
        Ok(())
    }
    fn set_params(&mut self, p: &[f32]) -> Result<(), InnerError> {
        if p.len() != self.x.len() {
            return Err(InnerError::Length { expected: self.x.len(), got: p.len() });
        }
        self.x.copy_from_slice(p);
        Ok(())
    }
    fn step(&mut self) -> Result<InnerStats, InnerError> {
        let target = 1.0 + self.node as f32;
        let mut loss = 0.0f64;
        let mut k = 0u64;
        for x in self.x.iter_mut().step_by(4099) {
            let g = *x - target;
            loss += f64::from(0.5 * g * g);
            *x -= 0.1 * g;
            k += 1;
        }
        Ok(InnerStats { loss: Some(loss / k.max(1) as f64), tokens: k })
    }
}

mod common;

fn mesh() -> MeshConfig {
    MeshConfig {
        heartbeat_interval: Duration::from_millis(200),
        heartbeat_timeout: HEARTBEAT_TIMEOUT,
        barrier_timeout: Duration::from_secs(120),
        coordinator_timeout: Duration::from_secs(5),
        min_members: WORKERS as usize,
        join_window: Duration::from_millis(200),
        allreduce_timeout: Duration::from_secs(120),
        retry_backoff: Duration::from_millis(50),
        probe_duration: Duration::from_millis(50),
        ..MeshConfig::default()
    }
}

fn lines(path: &std::path::Path) -> Vec<MetricsLine> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<MetricsLine>(l).ok())
        .collect()
}

fn rows(path: &std::path::Path) -> Vec<OuterStepRow> {
    lines(path)
        .into_iter()
        .filter_map(|l| match l {
            MetricsLine::Row(r) => Some(r),
            _ => None,
        })
        .collect()
}

/// Runs `f` to its end on a runtime of its own (two threads), on a blocking thread of this one.
fn own_runtime<T: Send + 'static>(
    f: impl std::future::Future<Output = T> + Send + 'static,
) -> tokio::task::JoinHandle<T> {
    tokio::task::spawn_blocking(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        rt.block_on(f)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_work_longer_than_the_heartbeat_timeout_evicts_nobody() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let n = params();
    let dir = tempfile::tempdir().unwrap();
    let copts = CoordinatorOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        mesh: mesh(),
        tcp: TcpConfig::default(),
        stop_outer_steps: Some(OUTER_STEPS),
        stop_time: None,
        names: BTreeMap::new(),
        metrics: Some(dir.path().join("coordinator.jsonl")),
        time_offset_s: 0.0,
        start_outer_step: 0,
        exporter: None,
        lines: None,
    };
    // Each node on a runtime of its own, as in its own process: their event loops do not wait
    // for each other's turns on the runtime's threads.
    let (tx, rx) = tokio::sync::oneshot::channel();
    let coord = own_runtime(async move {
        let t = bind(&copts).await.unwrap();
        let _ = tx.send(t.local_addr());
        run_coordinator(copts, t, std::future::pending()).await
    });
    let addr = rx.await.unwrap();
    let mut ws = Vec::new();
    let scenario = common::scenario(WORKERS, 1, 2, "uint8", None, mesh());
    for id in 0..WORKERS {
        let o = WorkerOptions {
            scenario: scenario.clone(),
            id: NodeId(id),
            incarnation: 1,
            coordinator: addr,
            listen: "127.0.0.1:0".parse().unwrap(),
            tcp: TcpConfig::default(),
            metrics: Some(dir.path().join(format!("w{id}.jsonl"))),
            time_offset_s: 0.0,
            checkpoint: None,
            resume: None,
            faults: Vec::new(),
            status: None,
            exporter: None,
            hang: None,
        };
        // Built on a blocking thread: filling 2e8 values is not for the runtime's threads.
        let inner = tokio::task::spawn_blocking(move || Flat::new(n, id)).await.unwrap();
        ws.push(own_runtime(run_worker(o, inner, std::future::pending())));
    }
    let Ok(reports) = tokio::time::timeout(Duration::from_secs(300), async {
        let mut out = Vec::new();
        for w in ws {
            out.push(w.await.unwrap().unwrap());
        }
        out
    })
    .await
    else {
        let all: Vec<String> = ["coordinator", "w0", "w1", "w2"]
            .iter()
            .map(|f| {
                std::fs::read_to_string(dir.path().join(format!("{f}.jsonl"))).unwrap_or_default()
            })
            .collect();
        panic!("the run did not end in 300 s:\n{}", all.join("\n"));
    };
    let c = coord.await.unwrap().unwrap();
    assert_eq!(c.outer_steps, OUTER_STEPS);

    let events = std::fs::read_to_string(dir.path().join("coordinator.jsonl")).unwrap();
    assert!(!events.contains(r#""kind":"evict""#), "nobody is evicted: {events}");
    for r in &reports {
        assert_eq!(r.stop, StopReason::Shutdown);
        assert_eq!(r.committed, OUTER_STEPS);
        assert_eq!(r.weights_hash, reports[0].weights_hash);
    }
    let per: Vec<Vec<OuterStepRow>> =
        (0..WORKERS).map(|i| rows(&dir.path().join(format!("w{i}.jsonl")))).collect();
    let mut longest = 0.0f64;
    for (i, rs) in per.iter().enumerate() {
        assert_eq!(rs.len() as u64, OUTER_STEPS, "w{i}: {rs:?}");
        for r in rs {
            eprintln!(
                "w{i} outer step {}: outer_s {:.2} allreduce_s {:.2} compute_s {:.2} barrier_s {:.2} world {} ({n} parameters)",
                r.outer_step, r.outer_s, r.allreduce_s, r.compute_s, r.barrier_s, r.world
            );
            assert_eq!(r.world, WORKERS, "every step ran on every worker: {r:?}");
            longest = longest.max(r.outer_s);
        }
    }
    for step in 0..OUTER_STEPS as usize {
        let hashes: Vec<_> = per.iter().map(|r| r[step].weights_hash).collect();
        assert!(hashes.iter().all(|h| *h == hashes[0] && h.is_some()), "step {step}: {hashes:?}");
    }
    // The point of the test: the commit work outlasted the heartbeat timeout, and yet nobody was
    // evicted. On a machine fast enough to do it in less, raise LOCO_BIG_PARAMS.
    assert!(
        longest > HEARTBEAT_TIMEOUT.as_secs_f64(),
        "the longest commit's outer_s is {longest:.2} s, not past the {HEARTBEAT_TIMEOUT:?} heartbeat \
         timeout: this machine is too fast for {n} parameters (set LOCO_BIG_PARAMS higher)"
    );
}
