//! Watching a live run: the Prometheus metrics a coordinator and its workers serve on
//! `--metrics-addr`.
// The test watches live processes: it waits on the wall clock and reads their stderr on a
// thread.
#![allow(clippy::disallowed_methods)]

use crate::common::TestContext;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
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
        Proc::spawn_tool(env!("CARGO_BIN_EXE_loco"), args)
    }

    /// `loco ARGS...` with transparent huge pages off for the process (`PR_SET_THP_DISABLE`), so
    /// its resident memory moves by 4 KiB pages: where the kernel backs memory with huge pages
    /// (`always`), a short-lived runtime thread's stack adds 2 MiB at once while it lives.
    #[allow(unsafe_code)]
    fn start_in_small_pages(args: &[&str]) -> Proc {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_loco"));
        // SAFETY: the closure runs between fork and exec and makes one system call (prctl),
        // which is async-signal-safe; it allocates nothing and takes no lock.
        unsafe {
            cmd.pre_exec(|| nix::sys::prctl::set_thp_disable(true).map_err(std::io::Error::from));
        }
        Proc::spawn(cmd.args(args))
    }

    /// `program ARGS...`, run in the repository root.
    fn spawn_tool(program: &str, args: &[&str]) -> Proc {
        Proc::spawn(Command::new(program).args(args))
    }

    /// Starts `cmd` in the repository root with stdin closed and stderr read line by line.
    fn spawn(cmd: &mut Command) -> Proc {
        let mut child = cmd
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
        "--http",
        "0",
    ]);
    let coord_metrics = coord.metrics_addr();
    let coord_page = coord.wait_for("live page on http://");
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
    // The ring's neighbours, and the coordinator, were sent bytes.
    for peer in ["n-1", "coordinator"] {
        let sent = sample(&second, "loco_peer_sent_bytes_total", &[("peer", peer)]);
        assert!(sent.is_some_and(|b| b > 0.0), "{peer}: {sent:?}");
    }

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
    // The coordinator's live page streams the eviction too.
    let page: SocketAddr = coord_page.trim_end_matches('/').parse().expect("page address");
    let mut s = TcpStream::connect_timeout(&page, Duration::from_secs(5)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    write!(s, "GET /events HTTP/1.1\r\nHost: loco\r\n\r\n").expect("ask");
    let mut r = BufReader::new(s);
    let mut line = String::new();
    let shown = loop {
        line.clear();
        match r.read_line(&mut line) {
            Ok(0) | Err(_) => break false,
            Ok(_) if line.starts_with("data: ") && line.contains("data-kind=\\\"evict\\\"") => {
                break true;
            }
            Ok(_) => {}
        }
    };
    assert!(shown, "the coordinator's live page shows no eviction");
}

/// A crash scenario for the live page: [`SCENARIO`]'s three workers, without a minimum to form,
/// n-2 crashing at 4 s, the run stopping at 10 s.
fn crash_scenario() -> String {
    let edits = [
        ("name = \"observe\"\nseed = 3", "name = \"live-crash\"\nseed = 4"),
        ("min_members = 3\n", ""),
        (
            "[stop]\ntime = \"60s\"",
            "[[churn]]\nat = \"4s\"\nkind = \"crash\"\nnode = \"n-2\"\n\n[stop]\ntime = \"10s\"",
        ),
    ];
    let mut s = SCENARIO.to_owned();
    for (from, to) in edits {
        assert!(s.contains(from), "the scenario holds {from:?}");
        s = s.replace(from, to);
    }
    s
}

/// One HTTP/1.1 exchange with a WebDriver server: the JSON it answers.
fn webdriver(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &serde_json::Value,
) -> serde_json::Value {
    let body = body.to_string();
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("chromedriver");
    s.set_read_timeout(Some(Duration::from_secs(60))).expect("timeout");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("ask chromedriver");
    // chromedriver may keep the connection open: read the head, then the body's length.
    let mut r = BufReader::new(s);
    let (mut head, mut length, mut chunked) = (String::new(), None, false);
    loop {
        let mut line = String::new();
        r.read_line(&mut line).expect("chromedriver's answer");
        if line == "\r\n" || line.is_empty() {
            break;
        }
        let lower = line.to_ascii_lowercase();
        if let Some(n) = lower.strip_prefix("content-length:") {
            length = n.trim().parse::<usize>().ok();
        }
        chunked |= lower.starts_with("transfer-encoding:") && lower.contains("chunked");
        head.push_str(&line);
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            let mut len = String::new();
            r.read_line(&mut len).expect("chunk length");
            let n = usize::from_str_radix(len.trim(), 16).expect("chunk length");
            let mut chunk = vec![0; n + 2];
            r.read_exact(&mut chunk).expect("chunk");
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
    } else {
        let mut b = vec![0; length.expect("a Content-Length")];
        r.read_exact(&mut b).expect("chromedriver's body");
        body = b;
    }
    let json = String::from_utf8(body).expect("utf-8");
    serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {head}\n{json}"))
}

/// A loopback port free now (for chromedriver, which takes its port on the command line).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("address").port()
}

/// `loco launch --http` on a crash scenario, the page open in headless Chromium: the eviction
/// appears in the page's latest events (read from the DOM) within a few seconds of the
/// coordinator recording it, and when the run ends the page shows the report. Chromium and
/// chromedriver come from Debian's packages (`scripts/test.sh` installs them where missing).
#[test]
fn the_live_page_shows_an_eviction_within_seconds() {
    for tool in ["chromium", "chromedriver"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(found, "{tool} is needed (apt-get install chromium chromium-driver)");
    }
    let ctx = TestContext::new();
    let scenario = ctx.path().join("live.toml");
    std::fs::write(&scenario, crash_scenario()).expect("write the scenario");
    let out = ctx.path().join("run");
    let mut launch = Proc::start(&[
        "launch",
        scenario.to_str().expect("utf-8 path"),
        "--synthetic-params",
        "4096",
        "--network",
        "loopback",
        "--http",
        "0",
        "--out",
        out.to_str().expect("utf-8 path"),
    ]);
    let url = launch.wait_for("live page on");

    let port = free_port();
    let driver = Proc::spawn_tool("chromedriver", &[&format!("--port={port}")]);
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    assert!(
        eventually(20, || TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok()),
        "chromedriver did not start"
    );
    let caps = serde_json::json!({ "capabilities": { "alwaysMatch": {
        "goog:chromeOptions": {
            "binary": "/usr/bin/chromium",
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
        }
    }}});
    let session = webdriver(addr, "POST", "/session", &caps);
    let id = session["value"]["sessionId"].as_str().expect("a session").to_string();
    webdriver(addr, "POST", &format!("/session/{id}/url"), &serde_json::json!({ "url": url }));
    let read = |script: &str| {
        let args = serde_json::json!({ "script": script, "args": [] });
        webdriver(addr, "POST", &format!("/session/{id}/execute/sync"), &args)["value"].clone()
    };
    let evict_row = "const r = document.querySelector('#latest-events tr[data-kind=\"evict\"]'); \
                     return r ? r.textContent : null;";

    // When the coordinator's file records the eviction, and when the page shows it.
    let file = out.join("nodes").join("coordinator.jsonl");
    let recorded =
        || std::fs::read_to_string(&file).is_ok_and(|t| t.lines().any(|l| l.contains("\"evict\"")));
    let start = Instant::now();
    let (mut at_file, mut at_page) = (None, None);
    while start.elapsed() < Duration::from_secs(60) && at_page.is_none() {
        if at_file.is_none() && recorded() {
            at_file = Some(Instant::now());
        }
        if read(evict_row).as_str().is_some_and(|t| t.contains("n-2")) {
            at_page = Some(Instant::now());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let at_page = at_page.unwrap_or_else(|| {
        panic!("no eviction on the page; launch said:\n{}", launch.seen.join("\n"))
    });
    let at_file = at_file.unwrap_or(at_page);
    let late = at_page.saturating_duration_since(at_file);
    eprintln!("the page showed the eviction {late:?} after the coordinator recorded it");
    assert!(late < Duration::from_secs(5), "the page showed the eviction {late:?} after the file");

    // The run ends: the page says so and shows the report's sections.
    let status = "return document.getElementById('live-status').textContent;";
    assert!(
        eventually(60, || read(status).as_str().is_some_and(|s| s.starts_with("ended"))),
        "the page never said the run ended: {}",
        read(status)
    );
    let events_table = "return document.querySelector('#events') !== null;";
    assert_eq!(read(events_table), serde_json::json!(true));
    webdriver(addr, "DELETE", &format!("/session/{id}"), &serde_json::json!({}));
    drop(driver);
}

/// `GET path` at `addr` with `headers` (each ending in CRLF): the status line and the body.
fn get(addr: SocketAddr, path: &str, headers: &str) -> (String, String) {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    write!(s, "GET {path} HTTP/1.1\r\nHost: loco\r\n{headers}Connection: close\r\n\r\n")
        .expect("ask");
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (head.lines().next().unwrap_or("").to_string(), body.to_string())
}

/// Anonymous resident memory of process `pid` (heap and stacks, what a leak grows), in bytes
/// (Linux `RssAnon`): the pages of its binary and libraries (libtorch's, where linked) that are
/// read in as code first runs are not counted.
fn rss(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let kib: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("RssAnon");
    kib * 1024
}

/// A coordinator's `/metrics` and live page scraped every 100 ms for a minute (the page's event
/// stream opened and left once a second): every answer is whole, and the process's memory does
/// not grow (a leak of a few KiB per request would add megabytes).
#[test]
fn the_endpoints_hold_a_scrape_every_100_ms_for_a_minute() {
    let ctx = TestContext::new();
    let scenario = ctx.path().join("observe.toml");
    // No workers join: the run neither starts nor stops while it is scraped.
    let idle = SCENARIO.replace("time = \"60s\"", "time = \"600s\"");
    assert_ne!(idle, SCENARIO);
    std::fs::write(&scenario, idle).expect("write the scenario");
    let mut coord = Proc::start_in_small_pages(&[
        "coordinator",
        scenario.to_str().expect("utf-8 path"),
        "--listen",
        "127.0.0.1:0",
        "--metrics-addr",
        "0",
        "--http",
        "0",
    ]);
    let metrics = coord.metrics_addr();
    let page: SocketAddr =
        coord.wait_for("live page on http://").trim_end_matches('/').parse().expect("address");
    let pid = coord.child.id();
    let start = Instant::now();
    // Resident memory read after every round of requests; each end of the minute is judged by
    // its smallest reading over two seconds, so a leak shows and a passing peak does not.
    let (mut early, mut late, mut answers) = (Vec::new(), Vec::new(), 0u32);
    let mut k = 0u32;
    while start.elapsed() < Duration::from_secs(60) {
        let (status, body) = get(metrics, "/metrics", "");
        assert!(status.ends_with("200 OK") && body.ends_with("# EOF\n"), "{status}: {body}");
        let (status, body) = get(page, "/", "");
        assert!(status.ends_with("200 OK") && body.contains("EventSource"), "{status}");
        if k.is_multiple_of(10) {
            // Open the stream, take its first message, leave.
            let mut s = TcpStream::connect_timeout(&page, Duration::from_secs(5)).expect("connect");
            s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
            write!(s, "GET /events HTTP/1.1\r\nHost: loco\r\n\r\n").expect("ask");
            let mut r = BufReader::new(s);
            let mut first = String::new();
            r.read_line(&mut first).expect("the stream's status");
            assert!(first.contains("200 OK"), "{first}");
            let mut line = String::new();
            while r.read_line(&mut line).is_ok_and(|n| n > 0) && !line.starts_with("data: ") {
                line.clear();
            }
            assert!(line.starts_with("data: "), "no first message");
        }
        answers += 2;
        k += 1;
        match start.elapsed().as_secs() {
            10..12 => early.push(rss(pid)),
            58.. => late.push(rss(pid)),
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let before = *early.iter().min().expect("readings at 10-12 s");
    let after = *late.iter().min().expect("readings at 58-60 s");
    eprintln!(
        "{answers} answers; anonymous resident memory at least {before} B at 10-12 s ({} readings), \
         {after} B at 58-60 s ({} readings)",
        early.len(),
        late.len()
    );
    assert!(after < before + (2 << 20), "memory grew from {before} B to {after} B");
}

/// A server beyond loopback refuses a request without its token, on `/metrics` and on the live
/// page, and answers one that carries it (`Authorization: Bearer` or `?token=`). Run in a
/// network namespace the test makes (198.18.7.1 on its own `lo`) and removes; without root,
/// an address this machine lacks is refused at start with the flag's name.
#[test]
fn an_unauthenticated_request_beyond_loopback_is_refused() {
    let ctx = TestContext::new();
    let scenario = ctx.path().join("observe.toml");
    std::fs::write(&scenario, SCENARIO).expect("write the scenario");
    let scenario = scenario.to_str().expect("utf-8 path");
    if !nix::unistd::geteuid().is_root() {
        let o = ctx.loco(&[
            "coordinator",
            scenario,
            "--listen",
            "127.0.0.1:0",
            "--metrics-addr",
            "198.19.255.254:0",
        ]);
        assert!(!o.status.success());
        assert!(
            crate::common::stderr(&o).contains("--metrics-addr"),
            "{}",
            crate::common::stderr(&o)
        );
        return;
    }
    let ns = format!("loco-observe-{}", std::process::id());
    let ip = |args: &[&str]| {
        let o = Command::new("ip").args(args).output().expect("run ip");
        assert!(o.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    };
    struct Netns(String);
    impl Drop for Netns {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
        }
    }
    ip(&["netns", "add", &ns]);
    let _ns = Netns(ns.clone());
    ip(&["-n", &ns, "link", "set", "lo", "up"]);
    ip(&["-n", &ns, "addr", "add", "198.18.7.1/32", "dev", "lo"]);
    let loco = env!("CARGO_BIN_EXE_loco");
    let mut coord = Proc::spawn_tool(
        "ip",
        &[
            "netns",
            "exec",
            &ns,
            "env",
            "LOCO_HTTP_TOKEN=s3cret-token",
            loco,
            "coordinator",
            scenario,
            "--listen",
            "127.0.0.1:0",
            "--metrics-addr",
            "198.18.7.1:0",
            "--http",
            "198.18.7.1:0",
        ],
    );
    let metrics = coord.wait_for("metrics on http://");
    let metrics = metrics.split('/').next().expect("address").to_string();
    let page = coord.wait_for("live page on http://");
    let page = page.split('/').next().expect("address").to_string();
    // Asked from inside the namespace, with bash's /dev/tcp: the status line of each answer.
    let status = |addr: &str, path: &str, header: &str| {
        let (host, port) = addr.split_once(':').expect("host:port");
        let script = format!(
            "exec 3<>/dev/tcp/{host}/{port}; printf 'GET {path} HTTP/1.1\\r\\nHost: x\\r\\n{header}\
             Connection: close\\r\\n\\r\\n' >&3; head -n 1 <&3"
        );
        let o = Command::new("ip")
            .args(["netns", "exec", &ns, "bash", "-c", &script])
            .output()
            .expect("ask");
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    for (addr, path) in [(&metrics, "/metrics"), (&page, "/"), (&page, "/events")] {
        let refused = status(addr, path, "");
        assert!(refused.contains("403"), "{path} without a token: {refused}");
        let wrong = status(addr, path, "Authorization: Bearer s3cret-tokem\\r\\n");
        assert!(wrong.contains("403"), "{path} with a wrong token: {wrong}");
    }
    let ok = status(&metrics, "/metrics", "Authorization: Bearer s3cret-token\\r\\n");
    assert!(ok.contains("200"), "/metrics with the token: {ok}");
    let ok = status(&page, "/?token=s3cret-token", "");
    assert!(ok.contains("200"), "/ with the token: {ok}");
}

/// Keys across machines as a user sets them up: `loco keygen` on each, the coordinator's roster
/// naming every node, each worker's only the coordinator and itself (it learns its peers' keys
/// from the coordinator). A node missing from the coordinator's roster is refused at the
/// handshake; once its line is added to the file, the running coordinator reads it again and
/// the node joins and trains with the others.
#[test]
fn a_node_added_to_the_coordinators_roster_joins_the_running_mesh() {
    let ctx = TestContext::new();
    let secret = "[real]\nsecret = \"Vq3k9ZpX2mT7rL0sWd5eYb8n\"\n";
    let scenario = ctx.path().join("keys.toml");
    let text = SCENARIO.replace("min_members = 3\n", "").replace("count = 3", "count = 2");
    std::fs::write(&scenario, format!("{text}\n{secret}")).expect("write the scenario");
    let scenario = scenario.to_str().expect("utf-8 path").to_string();
    let file = |name: &str| ctx.path().join(name).to_str().expect("utf-8 path").to_string();
    let mut line = BTreeMap::new();
    for name in ["coordinator", "n-0", "n-1"] {
        let o = Command::new(env!("CARGO_BIN_EXE_loco"))
            .args(["keygen", &file(&format!("{name}.key")), "--name", name])
            .output()
            .expect("run loco keygen");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        line.insert(name, String::from_utf8_lossy(&o.stdout).trim().to_string());
    }
    let roster = |names: &[&str]| {
        let body: Vec<&str> = names.iter().map(|n| line[n].as_str()).collect();
        format!("[keys]\n{}\n", body.join("\n"))
    };
    std::fs::write(file("coordinator.roster"), roster(&["coordinator", "n-0"])).unwrap();
    for n in ["n-0", "n-1"] {
        std::fs::write(file(&format!("{n}.roster")), roster(&["coordinator", n])).unwrap();
    }
    let mut coord = Proc::start(&[
        "coordinator",
        &scenario,
        "--listen",
        "127.0.0.1:0",
        "--metrics-addr",
        "0",
        "--key",
        &file("coordinator.key"),
        "--roster",
        &file("coordinator.roster"),
    ]);
    let coord_metrics = coord.metrics_addr();
    let coord_addr = coord.wait_for("listening on");
    let _workers: Vec<Proc> = ["n-0", "n-1"]
        .iter()
        .map(|n| {
            Proc::start(&[
                "worker",
                &scenario,
                "--coordinator",
                &coord_addr,
                "--id",
                n,
                "--listen",
                "127.0.0.1:0",
                "--synthetic-params",
                "4096",
                "--key",
                &file(&format!("{n}.key")),
                "--roster",
                &file(&format!("{n}.roster")),
            ])
        })
        .collect();
    let members = || sample(&scrape(coord_metrics), "loco_members", &[]).unwrap_or(0.0);
    let steps = || sample(&scrape(coord_metrics), "loco_outer_step", &[]).unwrap_or(0.0);
    assert!(eventually(30, || members() == 1.0 && steps() >= 2.0), "n-0 alone does not train");
    coord.wait_for("a peer claiming to be n1 has a key no node of the roster has");
    assert_eq!(members(), 1.0, "n-1 got in without a key in the roster");
    let with_n1 = roster(&["coordinator", "n-0", "n-1"]);
    std::fs::write(file("coordinator.roster"), with_n1).unwrap();
    assert!(
        eventually(30, || members() == 2.0),
        "n-1 was not admitted:\n{}",
        coord.seen.join("\n")
    );
    let before = steps();
    assert!(
        eventually(30, || steps() >= before + 2.0),
        "the two do not train together:\n{}",
        coord.seen.join("\n")
    );
    assert_eq!(members(), 2.0);
}
