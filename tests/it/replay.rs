//! `loco replay` and `loco report`: the simulator's run directory and its report.

use crate::common::{TestContext, stderr, stdout};
use std::path::Path;

const FILES: [&str; 4] = ["summary.json", "outer_steps.csv", "events.csv", "report.html"];

fn replay(ctx: &TestContext, scenario: &str, out: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["replay", scenario, "--out", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    ctx.loco(&args)
}

#[test]
fn replay_writes_the_run_and_a_report_whose_numbers_are_the_summarys() {
    let ctx = TestContext::new();
    let out = ctx.path().join("small");
    let o = replay(&ctx, "scenarios/small.toml", &out, &[]);
    assert_eq!(o.status.code(), Some(0), "stdout: {}\nstderr: {}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("invariants          ok"), "{}", stdout(&o));
    for f in FILES {
        assert!(out.join(f).is_file(), "missing {f}");
    }
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["backend"], "sim");
    assert_eq!(summary["invariants"]["ok"], true);
    for plot in [
        "active_nodes",
        "allreduce_hist",
        "time_by_node",
        "time_by_step",
        "timeline",
        "bandwidth",
        "bytes_per_step",
    ] {
        let png = std::fs::read(out.join(format!("{plot}.png"))).unwrap();
        assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 2000, "{plot}.png");
        let svg = std::fs::read_to_string(out.join(format!("{plot}.svg"))).unwrap();
        roxmltree::Document::parse(&svg).unwrap_or_else(|e| panic!("{plot}.svg: {e}"));
    }
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("<table") && html.matches("<svg").count() >= 5, "tables and plots");
    // The table's numbers are summary.json's (exact values in data-value attributes).
    let median = summary["allreduce_seconds"]["median"].as_f64().unwrap();
    let util = summary["utilization"]["mean"].as_f64().unwrap();
    for v in [median, util] {
        assert!(html.contains(&format!("data-value=\"{v}\"")), "{v} not in the report's table");
    }
    // `loco report` redraws the same bytes from the files.
    let before = std::fs::read(out.join("report.html")).unwrap();
    let o = ctx.loco(&["report", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read(out.join("report.html")).unwrap(), before);
}

#[test]
fn the_same_seed_gives_byte_identical_files_and_another_seed_a_different_valid_run() {
    let ctx = TestContext::new();
    let (a, b, c) = (ctx.path().join("a"), ctx.path().join("b"), ctx.path().join("c"));
    for (dir, seed) in [(&a, "5"), (&b, "5"), (&c, "6")] {
        let o = replay(&ctx, "scenarios/small.toml", dir, &["--seed", seed]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    }
    for f in FILES {
        assert_eq!(std::fs::read(a.join(f)).unwrap(), std::fs::read(b.join(f)).unwrap(), "{f}");
    }
    assert_ne!(
        std::fs::read(a.join("outer_steps.csv")).unwrap(),
        std::fs::read(c.join("outer_steps.csv")).unwrap()
    );
}

#[test]
fn a_bad_scenario_exits_2_naming_file_line_field_and_expectation() {
    let ctx = TestContext::new();
    let text = std::fs::read_to_string(TestContext::repo().join("scenarios/small.toml"))
        .unwrap()
        .replace("bandwidth = ", "bandwidth = \"fast\" # was ");
    let bad = ctx.path().join("bad.toml");
    std::fs::write(&bad, text).unwrap();
    let out = ctx.path().join("out");
    let o = replay(&ctx, bad.to_str().unwrap(), &out, &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("bad.toml:") && err.contains("bandwidth") && err.contains("expected a rate"),
        "{err}"
    );
    assert!(!out.join("summary.json").exists(), "nothing written for bad input");
    let o = ctx.loco(&["replay", "no/such/file.toml"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("no/such/file.toml"), "{}", stderr(&o));
}

#[test]
fn bench_sim_prints_speed_and_peak_memory() {
    let ctx = TestContext::new();
    let o = ctx.loco(&["bench", "sim", "scenarios/small.toml", "--hours", "0.02", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert!(v["simulated_per_wall_second"].as_f64().unwrap() > 1.0);
    assert!(v["peak_rss_bytes"].as_u64().unwrap() > 0);
    assert_eq!(v["invariants_ok"], true);
}

/// 256 nodes dialling the coordinator at once: the simulator makes room for every pending
/// connection instead of panicking inside turmoil ("server socket buffer full", its default
/// backlog of 64). One simulated second: the start is where it failed.
#[test]
fn a_scenario_of_256_nodes_starts_without_a_panic() {
    let ctx = TestContext::new();
    let text = std::fs::read_to_string(TestContext::repo().join("scenarios/small.toml"))
        .unwrap()
        .replace("count = 4", "count = 256");
    let mut text = text[..text.find("[[churn]]").expect("small.toml's churn")].to_string();
    text.push_str("[stop]\ntime = \"1s\"\n");
    let big = ctx.path().join("big.toml");
    std::fs::write(&big, text).unwrap();
    let out = ctx.path().join("out");
    let o = replay(&ctx, big.to_str().unwrap(), &out, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(s["simulated_seconds"], 1.0, "{s:#}");
    assert_eq!(s["invariants"]["ok"], true, "{s:#}");
}

/// `--mode` replays the scenario in another DiLoCo mode on the same links: streaming runs
/// `fragments` rounds per outer step, and the summary and the terminal say which mode ran; a
/// fragment count that does not divide H is refused naming the flag.
#[test]
fn replay_mode_overrides_the_scenarios_diloco_mode() {
    let ctx = TestContext::new();
    let out = ctx.path().join("streaming");
    let o =
        replay(&ctx, "scenarios/small.toml", &out, &["--mode", "streaming", "--fragments", "2"]);
    assert_eq!(o.status.code(), Some(0), "stdout: {}\nstderr: {}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("rounds of streaming DiLoCo (2 fragments"), "{}", stdout(&o));
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["diloco"]["mode"], "streaming");
    let s = loco_core::scenario::Scenario::load(TestContext::repo().join("scenarios/small.toml"))
        .unwrap();
    let steps = s.stop().outer_steps.expect("small.toml stops after outer steps");
    assert_eq!(summary["outer_steps"].as_u64(), Some(2 * steps), "two rounds per outer step");
    let bad =
        replay(&ctx, "scenarios/small.toml", &out, &["--mode", "streaming", "--fragments", "3"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(stderr(&bad).contains("--mode streaming: fragments = 3"), "{}", stderr(&bad));
}
