//! Every scenario in scenarios/ replays with its invariants holding (the long ones shortened), and
//! each shows the behaviour it was written for.

use loco_core::digest::WeightsDigest;
use loco_core::metrics::{EventKind, OuterStepRow, events_csv, outer_steps_csv};
use loco_core::scenario::Scenario;
use loco_sim::{ReplayOptions, RunOutput, replay};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scenarios")
}

fn scenario(name: &str) -> Scenario {
    Scenario::load(dir().join(name)).unwrap_or_else(|e| panic!("{e}"))
}

/// How much of each scenario the tests replay: the 10B runs without churn take two outer steps
/// (about 1.5 simulated hours); drop-4-of-12 runs until after its restarts.
fn shortened(name: &str) -> Option<u64> {
    match name {
        "intellect1-usa.toml" | "intellect1-usa-eu.toml" | "intellect1-global.toml" => Some(2),
        "drop-4-of-12.toml" => Some(8),
        _ => None,
    }
}

/// Replays `name` once per test binary (the tests share the runs).
fn run(name: &str) -> Arc<RunOutput> {
    type Cell = Arc<OnceLock<Arc<RunOutput>>>;
    static RUNS: OnceLock<Mutex<BTreeMap<String, Cell>>> = OnceLock::new();
    let cell = {
        let mut runs = RUNS.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
        runs.entry(name.to_owned()).or_default().clone()
    };
    cell.get_or_init(|| {
        let opts = ReplayOptions { max_outer_steps: shortened(name), ..ReplayOptions::default() };
        let out = replay(&scenario(name), opts).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(out.summary.invariants.ok, "{name}: {:?}", out.summary.invariants.violations);
        Arc::new(out)
    })
    .clone()
}

fn count(out: &RunOutput, kind: EventKind) -> usize {
    out.events.iter().filter(|e| e.kind == kind).count()
}

fn events_of(out: &RunOutput, kind: EventKind, node: &str) -> Vec<f64> {
    out.events
        .iter()
        .filter(|e| e.kind == kind && e.node.as_deref() == Some(node))
        .map(|e| e.time_s)
        .collect()
}

fn stop_reason(out: &RunOutput) -> String {
    out.summary.extra.get("stop_reason").and_then(|v| v.as_str()).unwrap_or_default().to_owned()
}

/// With real numerics, every row of an outer step carries the same non-empty hash (the
/// recorder checks it too; this checks what reaches the file).
fn assert_replicas_agree(rows: &[OuterStepRow]) {
    let mut by_step: BTreeMap<u64, BTreeSet<WeightsDigest>> = BTreeMap::new();
    for r in rows {
        if let Some(h) = r.weights_hash {
            by_step.entry(r.outer_step).or_default().insert(h);
        }
    }
    assert!(!by_step.is_empty());
    for (step, hashes) in by_step {
        assert_eq!(hashes.len(), 1, "step {step}: {hashes:?}");
    }
}

#[test]
fn every_scenario_file_replays() {
    let mut names: Vec<String> = std::fs::read_dir(dir())
        .expect("scenarios/")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".toml"))
        .collect();
    names.sort();
    assert!(names.len() >= 9, "{names:?}");
    for name in names {
        let out = run(&name);
        let s = &out.summary;
        assert!(s.outer_steps >= 1, "{name}: no outer step");
        assert!(!out.rows.is_empty() && !out.events.is_empty(), "{name}");
        assert_eq!(s.backend, "sim");
        if let Some(n) = shortened(&name) {
            assert_eq!(s.outer_steps, n, "{name}");
        }
        for r in &out.rows {
            let parts = r.compute_s
                + r.allreduce_s
                + r.barrier_s
                + r.recovery_s
                + r.outer_s
                + r.checkpoint_s
                + r.idle_s;
            assert!((parts - r.wall_s()).abs() < 1e-6 * r.wall_s().max(1.0), "{name}: {r:?}");
        }
    }
}

#[test]
fn small_crash_is_evicted_and_the_joiner_recovers() {
    let out = run("small.toml");
    assert_eq!(out.summary.outer_steps, 10);
    assert_eq!(stop_reason(&out), "10 outer steps done");
    // n-2 crashes at 25 s and is evicted by the heartbeat timeout (6 s), not before.
    let evict = events_of(&out, EventKind::Evict, "n-2");
    assert_eq!(evict.len(), 1);
    assert!(evict[0] > 25.0 + 4.0 && evict[0] < 25.0 + 8.0, "{evict:?}");
    // n-3 starts at 35 s, is admitted at the next boundary, and receives the state.
    let join = events_of(&out, EventKind::Join, "n-3");
    assert_eq!(join.len(), 1);
    assert!(join[0] > 35.0);
    assert_eq!(events_of(&out, EventKind::RecoveryDone, "n-3").len(), 1);
    assert!(out.rows.iter().any(|r| r.node == "n-3" && r.world == 3));
    assert_replicas_agree(&out.rows);
    // The synthetic objective descends.
    let loss = |step: u64| {
        let l: Vec<f64> =
            out.rows.iter().filter(|r| r.outer_step == step).filter_map(|r| r.loss).collect();
        l.iter().sum::<f64>() / l.len() as f64
    };
    assert!(loss(9) < 0.5 * loss(0), "{} -> {}", loss(0), loss(9));
}

#[test]
fn tiny_real_crash_and_late_join() {
    let out = run("tiny-real.toml");
    assert_eq!(out.summary.outer_steps, 40);
    assert_eq!(events_of(&out, EventKind::Evict, "n-1").len(), 1);
    assert_eq!(events_of(&out, EventKind::Join, "late").len(), 1);
    assert_replicas_agree(&out.rows);
}

#[test]
fn coordinator_crash_stops_cleanly() {
    let out = run("coordinator-crash.toml");
    assert!(
        stop_reason(&out).starts_with("the coordinator died; 4 members stopped cleanly"),
        "{}",
        stop_reason(&out)
    );
    assert_eq!(count(&out, EventKind::CoordinatorCrash), 1);
    assert_eq!(count(&out, EventKind::CoordinatorLost), 4);
    // Members notice 18 s (the coordinator timeout) after the last answer they had, which came
    // at most a heartbeat interval (2 s) before the crash.
    for e in out.events.iter().filter(|e| e.kind == EventKind::CoordinatorLost) {
        assert!(e.time_s > 2700.0 + 15.5 && e.time_s < 2700.0 + 18.5, "{e:?}");
    }
    assert!(out.rows.iter().all(|r| r.end_s <= 2700.0 + 1.0));
    // They wait for it until `rejoin_for` (36 s) after the last answer, then stop: the run ends.
    let t = out.summary.simulated_seconds;
    assert!(t > 2700.0 + 33.5 && t < 2700.0 + 40.0, "{t}");
}

#[test]
fn flapping_node_rejoins_without_blocking_the_others() {
    let out = run("flapping-node.toml");
    assert_eq!(out.summary.outer_steps, 25);
    assert_eq!(events_of(&out, EventKind::Crash, "eu-0").len(), 4);
    // The fourth restart (1h30) comes before the 25th outer step, which each commit's outer
    // work (`[sim] outer_cost`, 4 s at 1B) pushes past it.
    assert_eq!(events_of(&out, EventKind::Restart, "eu-0").len(), 4);
    assert!(events_of(&out, EventKind::Join, "eu-0").len() >= 2);
    // Non-blocking: the others never wait for eu-0's state at a barrier.
    let max_barrier =
        out.rows.iter().filter(|r| r.node != "eu-0").map(|r| r.barrier_s).fold(0.0, f64::max);
    assert!(max_barrier < 30.0, "{max_barrier}");
    // eu-0 contributes weight 0 in the step it joins at, then 1.
    let w: Vec<f64> = out.rows.iter().filter(|r| r.node == "eu-0").map(|r| r.weight).collect();
    assert!(w.contains(&0.0) && w.contains(&1.0), "{w:?}");
}

#[test]
fn partitioned_nodes_are_evicted_and_rejoin_after_the_heal() {
    let out = run("partition-heal.toml");
    for n in ["eu-0", "eu-1"] {
        let ev = events_of(&out, EventKind::Evict, n);
        assert_eq!(ev.len(), 1, "{n}");
        assert!(ev[0] > 1800.0 && ev[0] < 1810.0);
        let joins = events_of(&out, EventKind::Join, n);
        assert!(joins.iter().any(|t| *t > 3000.0), "{n} did not rejoin after the heal: {joins:?}");
    }
    let asia = events_of(&out, EventKind::Evict, "asia-1");
    assert_eq!(asia.len(), 1);
    assert!(asia[0] > 5400.0 && asia[0] < 5410.0);
    assert_eq!(count(&out, EventKind::Partition), 3);
    assert_eq!(count(&out, EventKind::Heal), 3);
}

#[test]
fn four_of_twelve_drop_and_two_come_back() {
    let out = run("drop-4-of-12.toml");
    let crashes: Vec<f64> =
        out.events.iter().filter(|e| e.kind == EventKind::Crash).map(|e| e.time_s).collect();
    assert_eq!(crashes, vec![10800.0; 4]);
    assert!(count(&out, EventKind::Evict) >= 4);
    for n in ["eu-1", "asia-1"] {
        assert!(!events_of(&out, EventKind::RecoveryDone, n).is_empty(), "{n}");
    }
    // After the drop, all-reduces run with 8 members, and with 10 once the two are back.
    let worlds: BTreeSet<u32> = out.rows.iter().map(|r| r.world).collect();
    assert!(worlds.contains(&12) && worlds.contains(&8) && worlds.contains(&10), "{worlds:?}");
}

fn files(out: &RunOutput) -> (String, String, String) {
    (
        serde_json::to_string_pretty(&out.summary).expect("json"),
        outer_steps_csv(&out.rows),
        events_csv(&out.events),
    )
}

#[test]
fn the_same_seed_gives_the_same_bytes_and_another_seed_another_valid_run() {
    for (name, steps) in [("small.toml", None), ("intellect1-usa.toml", Some(2))] {
        let s = scenario(name);
        let go = |seed: Option<u64>| {
            let out = replay(
                &s,
                ReplayOptions { seed, max_outer_steps: steps, ..ReplayOptions::default() },
            )
            .expect("replay");
            assert!(
                out.summary.invariants.ok,
                "{name} {seed:?}: {:?}",
                out.summary.invariants.violations
            );
            out
        };
        let a = files(&go(None));
        let b = files(&go(None));
        assert_eq!(a.0, b.0, "{name}: summary.json differs");
        assert_eq!(a.1, b.1, "{name}: outer_steps.csv differs");
        assert_eq!(a.2, b.2, "{name}: events.csv differs");
        let other = go(Some(12345));
        assert_eq!(other.summary.seed, 12345);
        let c = files(&other);
        assert_ne!(a.1, c.1, "{name}: another seed gave the same rows");
    }
}
