//! The launcher with stand-in processes: this test binary (no libtest harness) also plays the
//! coordinator and the workers, run by the launcher as `launcher coordinator SCENARIO ...` and
//! `launcher worker SCENARIO ...`. So what the launcher makes of its status channel is seen
//! without the `loco` binary or a model, with workers that are slow to be ready or that send
//! garbage on purpose.

use loco_core::metrics::{EventKind, EventRow, OuterStepRow};
use loco_real::launch::{LaunchPlan, Launcher, Notice, StatusSender, status, unix_now};
use loco_real::node::MetricsLine;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("coordinator") => coordinator(&args),
        Some("worker") => worker(&args),
        _ => run_tests(&args),
    }
}

/// The value after `--name`.
fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    let i = args.iter().position(|a| a == name)?;
    args.get(i + 1).map(String::as_str)
}

/// Stand-in coordinator: says an address, then waits to be stopped (at most 60 s).
fn coordinator(args: &[String]) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let f = PathBuf::from(flag(args, "--addr-file").unwrap());
    let tmp = f.with_extension("tmp");
    std::fs::write(&tmp, l.local_addr().unwrap().to_string()).unwrap();
    std::fs::rename(&tmp, &f).unwrap();
    std::thread::sleep(Duration::from_secs(60));
}

/// How long the stand-in worker `slow` takes to load its model.
const SLOW_LOAD: Duration = Duration::from_millis(1500);
/// A weights digest the fake workers report.
const AB: &str = "00000000000000ab";

/// Stand-in worker, by node name: `slow` is ready after [`SLOW_LOAD`]; `fast` at once (and the
/// scenario kills it); `noisy` at once, after garbage on its channel and a stranger's.
fn worker(args: &[String]) {
    let name = flag(args, "--id").unwrap().to_string();
    let run_start: f64 = flag(args, "--run-start").unwrap().parse().unwrap();
    let metrics = PathBuf::from(flag(args, "--metrics").unwrap());
    let now = || unix_now() - run_start;
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&metrics).unwrap();
    let mut write = |line: &MetricsLine| {
        writeln!(file, "{}", serde_json::to_string(line).unwrap()).unwrap();
    };
    match name.as_str() {
        "noisy" => {
            let path = std::env::var_os(status::SOCKET_ENV).expect("a status socket");
            let token = std::env::var(status::TOKEN_ENV).expect("a token");
            // A stranger first: no hello, then one with a made-up token.
            let mut stranger = std::os::unix::net::UnixStream::connect(&path).unwrap();
            let _ = stranger.write_all(b"{\"kind\":\"ready\"}\n");
            let mut guess = std::os::unix::net::UnixStream::connect(&path).unwrap();
            let _ =
                guess.write_all(b"{\"kind\":\"hello\",\"token\":\"00ff\"}\n{\"kind\":\"ready\"}\n");
            let mut c = std::os::unix::net::UnixStream::connect(&path).unwrap();
            writeln!(c, "{{\"kind\":\"hello\",\"token\":\"{token}\"}}").unwrap();
            c.write_all(b"not json\n{\"kind\":\"nope\"}\n\xff\xfe\n{\"kind\":\"ready\"\n").unwrap();
            c.write_all(&vec![b'{'; 3 * status::MAX_LINE]).unwrap();
            c.write_all(b"\n{\"kind\":\"ready\"}\n").unwrap();
            write(&MetricsLine::Event(EventRow::new(now(), EventKind::Start).node(name.clone())));
            write(&MetricsLine::Row(row(&name, now())));
            writeln!(
                c,
                "{{\"kind\":\"stopped\",\"reason\":\"done\",\"committed\":1,\"weights_hash\":\"{AB}\"}}"
            )
            .unwrap();
            std::thread::sleep(Duration::from_millis(300));
        }
        _ => {
            let s = StatusSender::from_env().expect("a status channel");
            if name == "slow" {
                std::thread::sleep(SLOW_LOAD);
            }
            s.ready();
            let start =
                MetricsLine::Event(EventRow::new(now(), EventKind::Start).node(name.clone()));
            s.metrics(&start);
            write(&start);
            if name == "fast" {
                std::thread::sleep(Duration::from_secs(20)); // killed by the scenario
            }
            let r = MetricsLine::Row(row(&name, now()));
            s.metrics(&r);
            write(&r);
            std::thread::sleep(Duration::from_millis(300));
            s.stopped("done", 1, AB.parse().ok());
        }
    }
}

fn row(node: &str, t: f64) -> OuterStepRow {
    OuterStepRow {
        outer_step: 0,
        node: node.to_string(),
        node_id: 0,
        epoch: 1,
        world: 2,
        start_s: t,
        end_s: t,
        compute_s: 0.0,
        allreduce_s: 0.0,
        barrier_s: 0.0,
        recovery_s: 0.0,
        checkpoint_s: 0.0,
        outer_s: 0.0,
        idle_s: 0.0,
        bytes_sent: 0,
        retries: 0,
        tokens: 0,
        loss: None,
        weights_hash: AB.parse().ok(),
        weight: 1.0,
        allreduce_wall_s: 0.0,
        eval_loss: None,
    }
}

const SCENARIO: &str = r#"
name = "launcher-stand-ins"
seed = 1

[model]
preset = "tiny"

[diloco]
inner_steps = 5
codec = "uint8"
batch_tokens = 256

[mesh]
heartbeat = "200ms"
heartbeat_timeout = "1500ms"
coordinator_timeout = "3s"
min_members = 1

[[regions]]
name = "local"

[[links]]
from = "local"
to = "local"
bandwidth = "10Gbit/s"
latency = "100us"

[[nodes]]
name = "fast"
step_time = "50ms"

[[nodes]]
name = "slow"
step_time = "50ms"

[[nodes]]
name = "noisy"
step_time = "50ms"

[[churn]]
at = "300ms"
kind = "crash"
node = "fast"

[stop]
outer_steps = 1
time = "30s"

[real]
network = "loopback"
device = "cpu"
"#;

/// The run clock starts when the last starting worker says it is ready, not when the first does:
/// the slow worker's start-up is not part of the run, so the crash the scenario puts 0.3 s into
/// it comes 0.3 s after the slow worker is ready. A worker whose channel carries malformed,
/// overlong and strangers' lines is still heard.
fn the_clock_starts_when_the_last_starting_worker_is_ready() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.toml");
    std::fs::write(&path, SCENARIO).unwrap();
    let s = loco_core::scenario::Scenario::load(&path).unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut plan = LaunchPlan::new(s, path, exe, dir.path().join("run"));
    plan.synthetic_params = Some(100);
    plan.timeout = Some(Duration::from_secs(30));
    let mut notices = Vec::new();
    let o = Launcher::new(plan).on_notice(|n| notices.push(n)).run().unwrap();
    let p = |name: &str| o.processes.iter().find(|p| p.name == name).unwrap().clone();
    let (fast, slow, noisy) = (p("fast"), p("slow"), p("noisy"));
    let slow_ready = slow.ready_s.expect("slow said ready");
    let fast_ready = fast.ready_s.expect("fast said ready");
    assert!(noisy.ready_s.is_some(), "noisy is heard after its garbage: {noisy:?}");
    assert!(slow_ready >= SLOW_LOAD.as_secs_f64(), "{slow:?}");
    assert!(fast_ready + 1.0 < slow_ready, "fast {fast_ready} slow {slow_ready}");
    let t0 = o.clock_start_s.expect("the clock started");
    assert!(t0 >= slow_ready && t0 < slow_ready + 0.5, "clock {t0}, slow ready {slow_ready}");
    assert!(
        notices.contains(&Notice::ClockStarted { after_s: t0, all_ready: true }),
        "{notices:?}"
    );
    let crash = o
        .events
        .iter()
        .find(|e| e.kind == EventKind::Crash && e.node.as_deref() == Some("fast"))
        .expect("the scenario's crash");
    assert!(crash.time_s >= t0 + 0.29, "crash at {}, clock from {t0}", crash.time_s);
    assert_eq!(slow.stopped.as_deref(), Some("done"));
    assert_eq!(noisy.stopped.as_deref(), Some("done"));
    assert_eq!(fast.stopped, None, "killed before it could say");
    assert!(o.ok(), "{:?}", o.summary.invariants);
    // The socket file went with the launch.
    assert!(!dir.path().join("run/nodes/status.sock").exists());
}

/// A worker started by hand has no channel.
fn a_worker_without_a_launcher_has_no_channel() {
    assert!(std::env::var_os(status::SOCKET_ENV).is_none(), "this test runs without one");
    assert!(StatusSender::from_env().is_none());
}

fn run_tests(args: &[String]) {
    let tests: [(&str, fn()); 2] = [
        (
            "the_clock_starts_when_the_last_starting_worker_is_ready",
            the_clock_starts_when_the_last_starting_worker_is_ready,
        ),
        ("a_worker_without_a_launcher_has_no_channel", a_worker_without_a_launcher_has_no_channel),
    ];
    let filters: Vec<&String> = args.iter().skip(1).filter(|a| !a.starts_with('-')).collect();
    let chosen = tests
        .iter()
        .filter(|(n, _)| filters.is_empty() || filters.iter().any(|f| n.contains(f.as_str())));
    if args.iter().any(|a| a == "--list") {
        for (n, _) in chosen {
            println!("{n}: test");
        }
        return;
    }
    let chosen: Vec<_> = chosen.collect();
    println!("running {} tests", chosen.len());
    let count = chosen.len();
    for (n, f) in chosen {
        f();
        println!("test {n} ... ok");
    }
    println!("\ntest result: ok. {count} passed");
}
