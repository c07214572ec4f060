//! Watching a live run: the Prometheus metrics a coordinator and its workers serve on
//! `--metrics-addr`.
// The test watches live processes: it waits on the wall clock and reads their stderr on a
// thread.
#![allow(clippy::disallowed_methods)]

use crate::common::TestContext;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Three synthetic workers on loopback, 0.1 s steps, H = 2: an outer step every 0.2-0.3 s.
const SCENARIO: &str = r#"
name = "observe"
seed = 3

[model]
preset = "tiny"

[diloco]
inner_steps = 2
codec = "int8-block"

[mesh]
heartbeat = "200ms"
heartbeat_timeout = "1s"
join_window = "500ms"
min_members = 3

[[regions]]
name = "local"

[[links]]
from = "local"
to = "local"
bandwidth = "1Gbit/s"
latency = "1ms"

[[nodes]]
name = "n"
count = 3
step_time = "100ms"

[stop]
time = "60s"
"#;

/// A started `loco` process: its stderr lines arrive on a channel (read by a thread), and it is
/// killed when dropped.
struct Proc {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Proc {
    fn start(args: &[&str]) -> Proc {
        let mut child = Command::new(env!("CARGO_BIN_EXE_loco"))
            .args(args)
            .current_dir(TestContext::repo())
            .env_remove("LOCO_LOG")
            .env_remove("LOCO_SECRET")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start loco");
        let err = child.stderr.take().expect("stderr");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Proc { child, lines, seen: Vec::new() }
    }

    /// The text after `prefix` on the first stderr line that has it, waiting up to 60 s.
    fn wait_for(&mut self, prefix: &str) -> String {
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(rest) = self.seen.iter().find_map(|l| l.split_once(prefix)) {
                return rest.1.trim().to_string();
            }
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => self.seen.push(l),
                Err(_) => panic!("no {prefix:?} on stderr:\n{}", self.seen.join("\n")),
            }
        }
    }

    /// The address of `/metrics` it printed.
    fn metrics_addr(&mut self) -> SocketAddr {
        let url = self.wait_for("metrics on http://");
        url.trim_end_matches("/metrics").parse().expect("metrics address")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET /metrics` at `addr`: the body, parsed by a Prometheus text-format parser.
fn scrape(addr: SocketAddr) -> prometheus_parse::Scrape {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    write!(s, "GET /metrics HTTP/1.1\r\nHost: loco\r\nConnection: close\r\n\r\n").expect("ask");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read the answer");
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let lines = body.lines().map(|l| Ok(l.to_string()));
    prometheus_parse::Scrape::parse(lines).expect("Prometheus text format")
}

/// The value of the sample `name` whose labels include `labels`, if any.
fn sample(s: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    s.samples.iter().find_map(|x| {
        let matches = x.metric == name && labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v));
        match (matches, &x.value) {
            (true, prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Gauge(v)) => {
                Some(*v)
            }
            (true, prometheus_parse::Value::Untyped(v)) => Some(*v),
            _ => None,
        }
    })
}

/// Polls `f` every 100 ms until it holds or `secs` pass; whether it held.
fn eventually(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    f()
}

/// A coordinator and three workers with `--metrics-addr`: scraped twice, a worker's counters
/// move; the coordinator counts its members and how long since each was heard; a worker killed
/// shows as an eviction in the coordinator's events within a few heartbeat timeouts.
#[test]
fn a_live_run_s_metrics_move_and_show_a_crash() {
    let ctx = TestContext::new();
    let scenario = ctx.path().join("observe.toml");
    std::fs::write(&scenario, SCENARIO).expect("write the scenario");
    let scenario = scenario.to_str().expect("utf-8 path");
    let addr_file = ctx.path().join("coordinator.addr");
    let mut coord = Proc::start(&[
        "coordinator",
        scenario,
        "--listen",
        "127.0.0.1:0",
        "--addr-file",
        addr_file.to_str().expect("utf-8 path"),
        "--metrics-addr",
        "0",
    ]);
    let coord_metrics = coord.metrics_addr();
    let coord_addr = coord.wait_for("listening on");
    let mut workers: Vec<Proc> = (0..3)
        .map(|i| {
            let id = i.to_string();
            Proc::start(&[
                "worker",
                scenario,
                "--coordinator",
                &coord_addr,
                "--id",
                &id,
                "--listen",
                "127.0.0.1:0",
                "--synthetic-params",
                "4096",
                "--metrics-addr",
                "127.0.0.1:0",
            ])
        })
        .collect();
    let worker_metrics: Vec<SocketAddr> = workers.iter_mut().map(Proc::metrics_addr).collect();
    let steps = |addr| sample(&scrape(addr), "loco_outer_steps_total", &[]).unwrap_or(0.0);
    assert!(
        eventually(60, || steps(worker_metrics[0]) >= 2.0),
        "no outer steps counted:\n{}",
        workers[0].seen.join("\n")
    );
    let first = scrape(worker_metrics[0]);
    std::thread::sleep(Duration::from_millis(1500));
    let second = scrape(worker_metrics[0]);
    for name in ["loco_outer_steps_total", "loco_tokens_total", "loco_compute_seconds_total"] {
        let (a, b) = (sample(&first, name, &[]), sample(&second, name, &[]));
        assert!(matches!((a, b), (Some(a), Some(b)) if b > a), "{name}: {a:?} then {b:?}");
    }
    assert_eq!(sample(&second, "loco_members", &[]), Some(3.0));
    assert!(sample(&second, "loco_allreduce_seconds_count", &[]).is_some_and(|n| n >= 2.0));

    let c = scrape(coord_metrics);
    assert_eq!(sample(&c, "loco_members", &[]), Some(3.0));
    for n in ["n-0", "n-1", "n-2"] {
        let age = sample(&c, "loco_heartbeat_age_seconds", &[("node", n)]);
        assert!(age.is_some_and(|a| (0.0..5.0).contains(&a)), "{n}: {age:?}");
    }
    let evictions =
        |s: &prometheus_parse::Scrape| sample(s, "loco_events_total", &[("kind", "evict")]);
    assert_eq!(evictions(&c), None, "an eviction before any fault");

    // A crash: the coordinator's metrics show the eviction and the smaller membership.
    drop(workers.pop());
    assert!(
        eventually(20, || {
            let c = scrape(coord_metrics);
            evictions(&c) == Some(1.0) && sample(&c, "loco_members", &[]) == Some(2.0)
        }),
        "no eviction shown:\n{}",
        coord.seen.join("\n")
    );
}
