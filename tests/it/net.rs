//! The scenario's network for real runs: `loco net check` (the emulation's self-test) and
//! `loco fidelity` (the simulator against a real run in the emulated network, or through the
//! userspace relays).
//!
//! The emulation needs root (network namespaces, TUN devices), as CI has. Without it those tests
//! check the refusal (exit 2 and why); the relays need no privileges.

use crate::common::{TestContext, one_real_run_at_a_time, stderr, stdout};

fn root() -> bool {
    nix::unistd::geteuid().is_root()
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// Without the privileges, a clear refusal (exit 2, the reason) rather than a run on a network
/// other than the one asked for.
fn assert_refused(o: &std::process::Output) {
    assert_eq!(o.status.code(), Some(2), "{}", stderr(o));
    assert!(stderr(o).contains("needs root"), "{}", stderr(o));
}

/// `loco fidelity SCENARIO --out DIR ARGS...` and its fidelity.json.
fn fidelity(
    ctx: &TestContext,
    scenario: &str,
    out: &std::path::Path,
    args: &[&str],
) -> (std::process::Output, Option<serde_json::Value>) {
    let mut all = vec!["fidelity", scenario, "--out", out.to_str().unwrap()];
    all.extend_from_slice(args);
    let o = ctx.loco(&all);
    let f = std::fs::read_to_string(out.join("fidelity.json")).ok().map(|t| json(&t));
    (o, f)
}

/// The fidelity.json of a run that must have written one.
fn written(o: &std::process::Output, f: Option<serde_json::Value>) -> serde_json::Value {
    f.unwrap_or_else(|| panic!("no fidelity.json: {}\n{}", stdout(o), stderr(o)))
}

/// Every link of the fidelity scenarios' network reaches its configured rate and round trip
/// within 5% (issue: "the emulation self-test is within 5% of the configured rate and round
/// trip on every link").
#[test]
fn net_check_gives_every_link_its_rate_and_round_trip() {
    let _one = one_real_run_at_a_time();
    let ctx = TestContext::new();
    let o = ctx.loco(&["net", "check", "scenarios/fidelity/three-regions.toml", "--json"]);
    if !root() {
        return assert_refused(&o);
    }
    assert!(o.status.code().is_some(), "{}", stderr(&o));
    let v = json(&stdout(&o));
    let links = v["links"].as_array().expect("links");
    // us->us, us->eu, us->asia, eu->us, eu->eu, eu->asia, asia->us, asia->eu (asia has one
    // node: no asia->asia).
    assert_eq!(links.len(), 8, "{v:#}");
    for l in links {
        let (want, got) =
            (l["configured_rate"].as_f64().unwrap(), l["achieved_rate"].as_f64().unwrap());
        let (rtt, measured) =
            (l["configured_rtt"].as_f64().unwrap(), l["measured_rtt"].as_f64().unwrap());
        assert!((got / want - 1.0).abs() <= 0.05, "rate {got} against {want}: {l:#}");
        assert!((measured / rtt - 1.0).abs() <= 0.05, "round trip {measured} against {rtt}: {l:#}");
    }
    // What one connection should get: the link's rate, capped by the NICs (asia's is 40 Mbit/s,
    // above both of its links' rates).
    let rate = |from: &str, to: &str| {
        links
            .iter()
            .find(|l| l["link"] == format!("{from} -> {to}"))
            .map(|l| l["configured_rate"].as_f64().unwrap() * 8.0 / 1e6)
            .unwrap()
    };
    assert!((rate("eu", "asia") - 30.0).abs() < 1e-6 && (rate("us", "asia") - 40.0).abs() < 1e-6);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(v["ok"].as_bool().unwrap());
}

/// `loco fidelity` on `steady` (16 outer steps, over BBR): both backends send the same bytes,
/// tell the same membership story, the simulator's median all-reduce is within 5% of the real
/// run's (over BBR a real all-reduce takes one time, step after step; it has been within 1.6%)
/// and its mean outer step within 10% (a stall of this shared machine lengthens a few steps).
/// Where the kernel has no BBR the workers keep the host's congestion control, and over cubic a
/// real all-reduce takes one of two times (with or without a loss recovery): the median is held
/// to 10% there. A run on a loaded machine can lose its pace: one retry, as the conformance test
/// does, on the same figures.
#[test]
fn fidelity_of_steady_is_within_five_percent_and_tells_the_same_story() {
    let _one = one_real_run_at_a_time();
    let bbr = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control")
        .is_ok_and(|s| s.split_whitespace().any(|c| c == "bbr"));
    let median_tol = if bbr { 0.05 } else { 0.10 };
    let ctx = TestContext::new();
    let mut last = String::new();
    for attempt in 0..2 {
        let out = ctx.path().join(format!("fid{attempt}"));
        let (o, f) =
            fidelity(&ctx, "scenarios/fidelity/steady.toml", &out, &["--tolerance", "0.10"]);
        if !root() {
            return assert_refused(&o);
        }
        let f = written(&o, f);
        assert_eq!(f["network"], "emulated", "{f:#}");
        assert_eq!(f["steps_compared"], 16, "{f:#}");
        assert_eq!(f["story_differences"].as_array().map(Vec::len), Some(0), "{f:#}");
        // The same payloads; control frames (heartbeats, their timing) differ by a few bytes.
        let bytes = f["bytes"]["relative"].as_f64().expect("a bytes error");
        assert!(bytes.abs() < 1e-3, "the same bytes: {f:#}");
        let within = |k: &str, tol: f64| f[k]["relative"].as_f64().is_some_and(|e| e.abs() <= tol);
        // The real run's report carries the comparison.
        let report = std::fs::read_to_string(out.join("real/report.html")).expect("report.html");
        assert!(
            report.contains("id=\"fidelity\"") && report.contains("<svg"),
            "no fidelity section"
        );
        if within("allreduce_median", median_tol) && within("outer_step_mean", 0.10) {
            assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
            assert!(stdout(&o).contains("verdict                within"), "{}", stdout(&o));
            return;
        }
        last = format!("{}\n{f:#}", stdout(&o));
    }
    panic!("outside {median_tol} (median) or 10% (mean step) twice:\n{last}");
}

/// A partition and its heal tell the same membership story in both backends: the eu nodes are
/// evicted for their silence, learn it after the heal, and rejoin by live recovery in the same
/// outer step (the real transport reconnects at once after a heal, as the simulator's does,
/// rather than at TCP's next backed-off retransmission). One retry, as above.
#[test]
fn a_partition_and_its_heal_tell_the_same_story_in_both_backends() {
    let _one = one_real_run_at_a_time();
    let ctx = TestContext::new();
    let mut last = String::new();
    for attempt in 0..2 {
        let out = ctx.path().join(format!("part{attempt}"));
        let (o, f) =
            fidelity(&ctx, "scenarios/fidelity/partition.toml", &out, &["--tolerance", "0.10"]);
        if !root() {
            return assert_refused(&o);
        }
        let f = written(&o, f);
        let events = std::fs::read_to_string(out.join("real/events.csv")).expect("events.csv");
        let rejoined = events.lines().filter(|l| l.contains(",recovery-done,eu-")).count();
        assert_eq!(rejoined, 2, "both eu nodes rejoin by recovery:\n{events}");
        let bytes = f["bytes"]["relative"].as_f64().expect("a bytes error");
        if f["story_differences"].as_array().is_some_and(Vec::is_empty) && bytes.abs() < 1e-3 {
            return;
        }
        last = format!("{}\n{f:#}", stdout(&o));
    }
    panic!("another story twice:\n{last}");
}

/// The userspace relays (no privileges needed) give the real run the scenario's links too: a
/// short fidelity run against the simulator's fluid model has the same story and bytes, and a
/// median all-reduce within 15% (measured: 1-5%), where bare loopback would be 30 times faster.
#[test]
fn relayed_links_without_privileges_give_the_real_run_the_scenarios_rates() {
    let _one = one_real_run_at_a_time();
    let ctx = TestContext::new();
    let out = ctx.path().join("relay");
    let args = ["--network", "relay", "--max-outer-steps", "4", "--tolerance", "0.15"];
    let (o, f) = fidelity(&ctx, "scenarios/fidelity/steady.toml", &out, &args);
    let f = written(&o, f);
    assert_eq!(f["network"], "relay", "{f:#}");
    assert_eq!(f["story_differences"].as_array().map(Vec::len), Some(0), "{f:#}");
    let bytes = f["bytes"]["relative"].as_f64().expect("a bytes error");
    assert!(bytes.abs() < 1e-3, "the same bytes: {f:#}");
    let ar = f["allreduce_median"]["relative"].as_f64().expect("an all-reduce error");
    assert!(ar.abs() <= 0.15, "all-reduce {ar:+.3}: {f:#}");
    let real = f["allreduce_median"]["real"].as_f64().expect("the real median");
    assert!(real > 0.3, "a 50 Mbit/s link's all-reduce takes about 0.5 s, not {real} s");
}

/// `--network emulated` where the emulation cannot run refuses, and where it can, the run says
/// so in summary.json; a bad `[real] network` names the file and the field.
#[test]
fn launch_says_which_network_it_ran_in() {
    let ctx = TestContext::new();
    let bad = ctx.path().join("bad.toml");
    let text = std::fs::read_to_string(TestContext::repo().join("scenarios/fidelity/steady.toml"))
        .expect("the scenario");
    std::fs::write(&bad, text.replace("[real]\n", "[real]\nnetwork = \"wan\"\n")).unwrap();
    let o = ctx.loco(&["launch", bad.to_str().unwrap(), "--synthetic-params", "1000"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("bad.toml") && err.contains("real.network"), "{err}");
    assert!(err.contains("\"emulated\""), "{err}");
}

/// Live recovery across the emulated links reaches at least 90% of the rate they give one
/// connection (issue: "on emulated links, recovery reaches at least 90% of the link rate"):
/// steady.toml's first node sends 50 MB over its 200 Mbit/s, 10 ms link to the second.
///
/// A rate is a measurement: on a shared machine another process can only slow it, never speed
/// it up past the link, so the best of two tries is taken (a second only after a short first).
#[test]
fn bench_recovery_on_emulated_links_fills_the_link() {
    let _one = one_real_run_at_a_time();
    let ctx = TestContext::new();
    let mut best: Option<(f64, serde_json::Value)> = None;
    for _ in 0..2 {
        let o = ctx.loco(&[
            "bench",
            "recovery",
            "--bytes",
            "50MB",
            "--scenario",
            "scenarios/fidelity/steady.toml",
            "--json",
        ]);
        if !root() {
            return assert_refused(&o);
        }
        assert!(o.status.success(), "{}", stderr(&o));
        let v = json(&stdout(&o));
        assert_eq!(v["state_bytes"], 50_000_024, "{v:#}");
        let link = v["link_gbps"].as_f64().expect("the link's rate");
        // 200 Mbit/s on the wire, less the TCP/IP headers.
        assert!((0.023..0.025).contains(&link), "{v:#}");
        let share = v["vs_link"].as_f64().expect("the share of the link");
        assert!(share < 1.02, "faster than the link: {v:#}");
        if best.as_ref().is_none_or(|(b, _)| share > *b) {
            best = Some((share, v));
        }
        if share >= 0.9 {
            break;
        }
    }
    let (share, v) = best.expect("a try");
    assert!(share >= 0.9, "recovery got {share:.3} of the link: {v:#}");
    // Five nodes would need the scenario to have them.
    let few = ctx.loco(&[
        "bench",
        "recovery",
        "--senders",
        "4",
        "--scenario",
        "scenarios/fidelity/steady.toml",
    ]);
    assert_eq!(few.status.code(), Some(2), "{}", stderr(&few));
    assert!(stderr(&few).contains("4 node(s)"), "{}", stderr(&few));
}

/// A joiner far from the coordinator (150 ms one way) and the scenario's `start` of it.
fn near_boundary_scenario(join_ms: u64) -> String {
    format!(
        "name = \"join-near-boundary\"\nseed = 5\n[model]\npreset = \"tiny\"\n\
         [diloco]\ninner_steps = 4\ncodec = \"uint8\"\nbatch_tokens = 256\n\
         [mesh]\nheartbeat = \"300ms\"\nheartbeat_timeout = \"2s\"\nbarrier_timeout = \"30s\"\n\
         join_window = \"500ms\"\nmin_members = 3\nring = \"ids\"\n\
         [[regions]]\nname = \"a\"\n[[regions]]\nname = \"b\"\n\
         [[links]]\nfrom = \"a\"\nto = \"a\"\nbandwidth = \"200Mbit/s\"\nlatency = \"5ms\"\n\
         [[links]]\nfrom = \"a\"\nto = \"b\"\nbandwidth = \"50Mbit/s\"\nlatency = \"150ms\"\n\
         [[links]]\nfrom = \"b\"\nto = \"b\"\nbandwidth = \"200Mbit/s\"\nlatency = \"5ms\"\n\
         [[nodes]]\nname = \"a\"\ncount = 3\nregion = \"a\"\nstep_time = \"200ms\"\n\
         [[nodes]]\nname = \"late\"\nregion = \"b\"\nstep_time = \"200ms\"\nstart = \"{join_ms}ms\"\n\
         [stop]\nouter_steps = 8\n[sim]\ntcp = \"bbr\"\nnumerics = \"real\"\nelements = 20000\n\
         [real]\ndevice = \"cpu\"\n"
    )
}

/// The outer step the simulator admits the joiner at, when it starts at `join_ms` (`u64::MAX`:
/// never, the run ended first).
fn simulated_admission(join_ms: u64) -> u64 {
    let text = near_boundary_scenario(join_ms);
    let s = loco_core::scenario::Scenario::from_toml_str(&text, "join.toml").expect("scenario");
    let run = loco_sim::replay(&s, loco_sim::ReplayOptions::default()).expect("replay");
    let join = run.events.iter().find(|e| {
        e.kind == loco_core::metrics::EventKind::Join && e.node.as_deref() == Some("late")
    });
    let detail = join.map(|e| e.detail.clone()).unwrap_or_default();
    detail.rsplit(' ').next().and_then(|n| n.parse().ok()).unwrap_or(u64::MAX)
}

/// A joiner whose join falls near an outer-step boundary is admitted at the same outer step in
/// both backends. The simulator finds the latest start admitted at outer step 2 (by bisection),
/// and the join is placed 0.2 s before it. Its request reaches the coordinator two and a half
/// round trips (0.75 s here) after its start on the wire; a simulator whose connections took one
/// round trip (as it did) puts the latest start 0.45 s later, and the join 0.25 s after the real
/// run's: the real run then admits it a step later than the simulator. One retry, as above: a
/// loaded machine can lose its pace.
#[test]
fn a_joiner_near_a_step_boundary_is_admitted_at_the_same_step_in_both_backends() {
    let _one = one_real_run_at_a_time();
    let (mut early, mut late) = (1_000u64, 5_000u64);
    assert!(simulated_admission(early) <= 2, "a join at 1 s is admitted by outer step 2");
    assert!(simulated_admission(late) > 2, "a join at 5 s is admitted after outer step 2");
    while late - early > 5 {
        let mid = (early + late) / 2;
        if simulated_admission(mid) <= 2 { early = mid } else { late = mid }
    }
    let join_ms = early - 200;
    assert_eq!(simulated_admission(join_ms), 2, "the join at {join_ms} ms is admitted at step 2");
    let ctx = TestContext::new();
    let path = ctx.path().join("join-near-boundary.toml");
    std::fs::write(&path, near_boundary_scenario(join_ms)).expect("scenario");
    let mut last = String::new();
    for attempt in 0..2 {
        let out = ctx.path().join(format!("join{attempt}"));
        let (o, f) = fidelity(&ctx, path.to_str().unwrap(), &out, &["--tolerance", "0.5"]);
        if !root() {
            return assert_refused(&o);
        }
        let f = written(&o, f);
        let events = std::fs::read_to_string(out.join("real/events.csv")).expect("events.csv");
        if events.contains(",join,late,") && events.contains("admitted at outer step 2") {
            assert_eq!(f["story_differences"].as_array().map(Vec::len), Some(0), "{f:#}");
            return;
        }
        last = format!("join at {join_ms} ms\n{events}");
    }
    panic!("the real run admitted the joiner at another step twice:\n{last}");
}

/// The commit's seed (the first 16 hex digits of `git rev-parse HEAD`), or `LOCO_SEED`.
fn commit_seed() -> u64 {
    if let Some(s) = std::env::var("LOCO_SEED").ok().and_then(|v| v.parse().ok()) {
        return s;
    }
    let head = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(TestContext::repo())
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    u64::from_str_radix(head.get(..16).unwrap_or("0"), 16).unwrap_or(0)
}

/// `loco fidelity --random` on a scenario drawn with the commit's seed (printed; `LOCO_SEED=N`
/// replays one): both backends run the scenario nobody tuned to its end and keep their
/// invariants (identical replicas, every joiner's state equal to its senders'), and the draw's
/// files say so. Its errors are printed, not bounded here: docs/fidelity.md gives the
/// distribution over a draw of 30.
#[test]
fn a_drawn_scenario_runs_in_both_backends_and_keeps_their_invariants() {
    let _one = one_real_run_at_a_time();
    let seed = commit_seed();
    eprintln!("draw seed {seed} (LOCO_SEED={seed} draws it again)");
    let ctx = TestContext::new();
    let out = ctx.path().join("draw");
    let args = ["fidelity", "--random", "1", "--seed", &seed.to_string(), "--out"];
    let o = ctx.loco(&[&args[..], &[out.to_str().unwrap()]].concat());
    if !root() {
        return assert_refused(&o);
    }
    eprintln!("{}", stdout(&o));
    assert!(out.join("0/scenario.toml").is_file(), "the scenario is written beside its results");
    let text = std::fs::read_to_string(out.join("draw.json"))
        .unwrap_or_else(|e| panic!("draw.json: {e}\n{}\n{}", stdout(&o), stderr(&o)));
    let draw = json(&text);
    let one = &draw["outcomes"][0];
    assert!(one["failure"].is_null(), "{one:#}\n{}", stderr(&o));
    assert!(one["fidelity"]["steps_compared"].as_u64().is_some_and(|n| n >= 8), "{one:#}");
    assert!(stdout(&o).contains("membership stories"), "{}", stdout(&o));
}

/// The sparse codec with error feedback in the emulated network (issue: "a real run with a crash
/// and a join on the sparse codec matches the simulator's story"): `join.toml` on the sparse
/// codec with us-1 killed in outer step 3: the same membership story and the same bytes (its
/// timings are reported, not held: see docs/fidelity.md). One retry, as above.
#[test]
fn a_sparse_run_with_a_crash_and_a_join_tells_the_same_story_in_both_backends() {
    let _one = one_real_run_at_a_time();
    let ctx = TestContext::new();
    let text = std::fs::read_to_string(TestContext::repo().join("scenarios/fidelity/join.toml"))
        .unwrap()
        .replace("codec = \"uint8\"", "codec = \"sparse\"")
        .replacen(
            "[stop]",
            "[[churn]]\nat = \"6s\"\nkind = \"crash\"\nnode = \"us-1\"\nduring = \"compute\"\nstep = 3\n\n[stop]",
            1,
        );
    assert!(text.contains("codec = \"sparse\"") && text.contains("node = \"us-1\""));
    let path = ctx.path().join("sparse-crash-join.toml");
    std::fs::write(&path, text).unwrap();
    let mut last = String::new();
    for attempt in 0..2 {
        let out = ctx.path().join(format!("sparse{attempt}"));
        let (o, f) = fidelity(&ctx, path.to_str().unwrap(), &out, &["--tolerance", "0.50"]);
        if !root() {
            return assert_refused(&o);
        }
        let f = written(&o, f);
        let events = std::fs::read_to_string(out.join("real/events.csv")).expect("events.csv");
        assert!(events.lines().any(|l| l.contains(",evict,us-1")), "us-1 evicted:\n{events}");
        assert!(
            events.lines().any(|l| l.contains(",recovery-done,late")),
            "late recovers:\n{events}"
        );
        let bytes = f["bytes"]["relative"].as_f64().expect("a bytes error");
        if f["story_differences"].as_array().is_some_and(Vec::is_empty) && bytes.abs() < 1e-3 {
            return;
        }
        last = format!("{}\n{f:#}", stdout(&o));
    }
    panic!("another story twice:\n{last}");
}
