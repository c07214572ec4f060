//! `loco plan`: a sweep over scenario fields, its frontier and its answer, its files, and its
//! errors.

use crate::common::{TestContext, stderr, stdout};

fn sweep(ctx: &TestContext, body: &str) -> std::path::PathBuf {
    let scenario = TestContext::repo().join("scenarios/small.toml");
    let path = ctx.path().join("sweep.toml");
    std::fs::write(&path, format!("scenario = {:?}\n{body}", scenario.display().to_string()))
        .unwrap();
    path
}

const GRID: &str = r#"cost = "bytes_per_node_hour"
[set]
"stop.outer_steps" = 4
"sim.numerics" = "virtual"
"model.preset" = "150m"
[target]
utilization = 0.5
[[axis]]
field = "diloco.inner_steps"
values = [5, 20]
[[axis]]
field = "diloco.codec"
values = ["fp32", "uint8"]
"#;

#[test]
fn a_sweep_replays_every_setting_and_names_the_cheapest_that_meets_the_target() {
    let ctx = TestContext::new();
    let path = sweep(&ctx, GRID);
    let out = ctx.path().join("plan");
    let run = |jobs: &str| {
        let o = ctx.loco(&[
            "plan",
            path.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--jobs",
            jobs,
            "--json",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_str::<serde_json::Value>(&stdout(&o)).expect("JSON")
    };
    let v = run("2");
    let points = v["points"].as_array().unwrap();
    assert_eq!(points.len(), 4);
    // The grid's order: the first axis slowest.
    let setting = |p: &serde_json::Value| p["setting"].to_string();
    assert!(setting(&points[0]).contains("5") && setting(&points[0]).contains("fp32"), "{v}");
    assert!(setting(&points[3]).contains("20") && setting(&points[3]).contains("uint8"), "{v}");
    let f = |p: &serde_json::Value, k: &str| p[k].as_f64().unwrap();
    for p in points {
        assert_eq!(p["outer_steps"], 4, "the [set] override applies");
        assert!(f(p, "utilization") > 0.0 && f(p, "bytes_per_node_hour") > 0.0, "{p}");
    }
    // uint8's all-reduce moves a quarter of fp32's bytes, in about a quarter of the time.
    let ratio = f(&points[1], "allreduce_median_s") / f(&points[0], "allreduce_median_s");
    assert!((0.2..0.35).contains(&ratio), "{ratio}");
    // The answer is the least cost among the settings that meet the target.
    let meets: Vec<usize> = (0..4).filter(|&i| f(&points[i], "utilization") >= 0.5).collect();
    let want = meets.iter().copied().min_by(|&a, &b| {
        f(&points[a], "bytes_per_node_hour").total_cmp(&f(&points[b], "bytes_per_node_hour"))
    });
    assert_eq!(v["cheapest"].as_u64().map(|c| c as usize), want, "{v}");
    // The frontier: no setting is both cheaper and busier than one on it.
    for p in points.iter().filter(|p| p["frontier"] == true) {
        assert!(!points.iter().any(|q| f(q, "bytes_per_node_hour") < f(p, "bytes_per_node_hour")
            && f(q, "utilization") > f(p, "utilization")));
    }
    for name in ["plan.csv", "plan.json", "plan.svg", "plan.html"] {
        assert!(out.join(name).exists(), "{name}");
    }
    let csv = std::fs::read_to_string(out.join("plan.csv")).unwrap();
    assert_eq!(csv.lines().count(), 5);
    assert!(csv.starts_with("diloco.inner_steps,diloco.codec,utilization,"), "{csv}");
    // The same settings, one at a time: the same figures (the simulator is deterministic).
    let again = run("1");
    for (a, b) in points.iter().zip(again["points"].as_array().unwrap()) {
        assert_eq!(a, b);
    }
}

#[test]
fn a_bad_sweep_is_refused_before_anything_runs_naming_the_file_and_the_field() {
    let ctx = TestContext::new();
    for (body, needles) in [
        (GRID.replace("diloco.codec", "diloco.codex"), vec!["sweep.toml", "diloco.codex", "codex"]),
        (
            GRID.replace("\"uint8\"", "\"uint7\""),
            vec!["sweep.toml", "diloco.codec = \"uint7\"", "uint7"],
        ),
        (GRID.replace("utilization = 0.5", "utilization = 1.5"), vec!["target.utilization"]),
        (GRID.replace("bytes_per_node_hour", "dollars"), vec!["cost", "order"]),
        (GRID.replace("values = [5, 20]", "values = []"), vec!["axis[0].values"]),
        (GRID.replace("\"stop.outer_steps\"", "\"nodes.99.count\""), vec!["nodes has", "no 99"]),
    ] {
        let path = sweep(&ctx, &body);
        let o = ctx.loco(&[
            "plan",
            path.to_str().unwrap(),
            "--out",
            ctx.path().join("x").to_str().unwrap(),
        ]);
        assert_eq!(o.status.code(), Some(2), "{body}: {}", stderr(&o));
        let err = stderr(&o);
        for n in needles {
            assert!(err.contains(n), "no {n:?} in: {err}");
        }
        assert!(!ctx.path().join("x").exists(), "nothing written for a bad sweep");
    }
}

/// The sparse codec's density and bits are scenario fields, so a sweep can take them: denser or
/// wider values move more bytes.
#[test]
fn a_sweep_over_the_sparse_codecs_density_and_bits() {
    let ctx = TestContext::new();
    let body = r#"cost = "bytes_per_node_hour"
[set]
"stop.outer_steps" = 4
"sim.numerics" = "virtual"
"model.preset" = "150m"
"diloco.codec" = "sparse"
[target]
utilization = 0.5
[[axis]]
field = "diloco.sparse_density"
values = [0.01, 0.03]
[[axis]]
field = "diloco.sparse_bits"
values = [2, 4]
"#;
    let path = sweep(&ctx, body);
    let out = ctx.path().join("plan");
    let o = ctx.loco(&["plan", path.to_str().unwrap(), "--out", out.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("JSON");
    let points = v["points"].as_array().unwrap();
    assert_eq!(points.len(), 4);
    let bytes = |i: usize| points[i]["bytes_per_node_hour"].as_f64().unwrap();
    // Grid order: (1%, 2 bits), (1%, 4 bits), (3%, 2 bits), (3%, 4 bits).
    assert!(bytes(0) < bytes(1) && bytes(0) < bytes(2) && bytes(2) < bytes(3), "{v}");
    for p in points {
        assert_eq!(p["invariants_ok"], true, "{p}");
    }
}
