//! The event executor against turmoil, its reference: on the shipped small scenarios the same
//! membership story, and, where the all-reduce spans many of turmoil's ticks, all-reduce times
//! within 1%; the same seed gives the same bytes.

use loco_core::metrics::{EventKind, events_csv, outer_steps_csv};
use loco_core::scenario::{CollectiveModel, ExecutorKind, Scenario};
use loco_sim::{ReplayOptions, RunOutput, replay};
use std::collections::BTreeMap;
use std::path::PathBuf;

fn load(name: &str) -> Scenario {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scenarios").join(name);
    Scenario::load(p).unwrap_or_else(|e| panic!("{e}"))
}

fn run(s: &Scenario, executor: ExecutorKind, steps: Option<u64>) -> RunOutput {
    let opts =
        ReplayOptions { executor: Some(executor), max_outer_steps: steps, ..Default::default() };
    let out = replay(s, opts).unwrap_or_else(|e| panic!("{}: {e}", s.name()));
    assert!(out.summary.invariants.ok, "{}: {:?}", s.name(), out.summary.invariants.violations);
    out
}

/// Each node's (and the run's) membership events, in the order it lives them.
fn story(out: &RunOutput) -> BTreeMap<String, Vec<EventKind>> {
    let mut m: BTreeMap<String, Vec<EventKind>> = BTreeMap::new();
    for e in out.events.iter().filter(|e| EventKind::STORY.contains(&e.kind)) {
        m.entry(e.node.clone().unwrap_or_default()).or_default().push(e.kind);
    }
    m
}

/// The six fidelity scenarios: a crash, a join, a partition and its heal, a degrade and its
/// restore, three regions.
const FIDELITY: [&str; 6] = [
    "fidelity/steady.toml",
    "fidelity/crash.toml",
    "fidelity/join.toml",
    "fidelity/partition.toml",
    "fidelity/degrade.toml",
    "fidelity/three-regions.toml",
];

/// Both executors on `name`: the same story and steps; the relative difference of the median
/// all-reduce (events against turmoil).
fn compare(name: &str, steps: Option<u64>) -> f64 {
    let s = load(name);
    let (t, e) = (run(&s, ExecutorKind::Turmoil, steps), run(&s, ExecutorKind::Events, steps));
    assert_eq!(e.summary.extra["executor"], "events");
    assert_eq!(story(&t), story(&e), "{name}: the membership stories differ");
    assert_eq!(t.summary.outer_steps, e.summary.outer_steps, "{name}");
    let (a, b) = (t.summary.allreduce_seconds.median, e.summary.allreduce_seconds.median);
    b / a - 1.0
}

/// The fidelity scenarios' all-reduces take half a second to a second, hundreds of turmoil's
/// 1 ms ticks: there the two executors agree within 1%. Six outer steps each (a crash, a join,
/// a partition and its heal, a degrade and its restore all happen by then).
#[test]
fn on_the_fidelity_scenarios_both_executors_tell_one_story_and_agree_within_one_percent() {
    for name in FIDELITY {
        let d = compare(name, Some(8));
        assert!(
            d.abs() <= 0.01,
            "{name}: median all-reduce {:+.2}% (events against turmoil)",
            d * 100.0
        );
    }
}

/// The fault scenarios' links are a machine's loopback: their all-reduces take under a
/// millisecond, which turmoil rounds to its 1 ms tick. There the stories must agree; the times
/// are turmoil's tick, not the network's, and are not compared.
#[test]
fn on_the_fault_scenarios_both_executors_tell_one_story() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scenarios/faults");
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("scenarios/faults")
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|n| n.ends_with(".toml"))
        .collect();
    names.sort();
    assert!(names.len() >= 10, "{names:?}");
    for n in names.iter().map(|n| format!("faults/{n}")).chain(["small.toml".to_owned()]) {
        compare(&n, None);
    }
}

/// The event executor is deterministic: the same seed, the same files.
#[test]
fn the_event_executor_gives_the_same_bytes_for_the_same_seed() {
    let s = load("faults/crash-in-all-gather.toml");
    let a = run(&s, ExecutorKind::Events, None);
    let b = run(&s, ExecutorKind::Events, None);
    assert_eq!(outer_steps_csv(&a.rows), outer_steps_csv(&b.rows));
    assert_eq!(events_csv(&a.events), events_csv(&b.events));
    assert_eq!(serde_json::to_string(&a.summary).ok(), serde_json::to_string(&b.summary).ok());
}

/// Above 32 nodes a scenario that names no executor runs on events; one that names turmoil
/// keeps it.
#[test]
fn the_default_executor_follows_the_size() {
    let s = load("small.toml");
    assert_eq!(s.sim().executor_for(s.nodes().len()), ExecutorKind::Turmoil);
    assert_eq!(s.sim().executor_for(33), ExecutorKind::Events);
    let out = replay(&s, ReplayOptions::default()).expect("replay");
    assert_eq!(out.summary.extra["executor"], "turmoil");
}

/// A fidelity scenario with virtual numerics (modelled all-reduces move no values).
fn virtual_copy(name: &str) -> Scenario {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scenarios").join(name);
    let src = std::fs::read_to_string(&p).expect("scenario");
    assert!(src.contains("numerics = \"real\""), "{name}");
    let src = src.replace("numerics = \"real\"", "numerics = \"virtual\"");
    Scenario::from_toml_str(&src, name).unwrap_or_else(|e| panic!("{e}"))
}

/// The event executor's modelled all-reduces (each computed whole when its last member starts
/// it) against its frames: on the six fidelity scenarios the same membership story and outer
/// steps, and median all-reduces within 1% (measured: 0.0-0.5%).
#[test]
fn modelled_all_reduces_tell_the_story_of_frames_within_one_percent() {
    for name in FIDELITY {
        let mut s = virtual_copy(name);
        s.set_collectives(CollectiveModel::Frames);
        let frames = run(&s, ExecutorKind::Events, Some(8));
        s.set_collectives(CollectiveModel::Modelled);
        let modelled = run(&s, ExecutorKind::Events, Some(8));
        assert_eq!(modelled.summary.extra["collectives"], "modelled", "{name}");
        assert_eq!(frames.summary.extra["collectives"], "frames", "{name}");
        assert_eq!(story(&frames), story(&modelled), "{name}: the membership stories differ");
        assert_eq!(frames.summary.outer_steps, modelled.summary.outer_steps, "{name}");
        let (a, b) =
            (frames.summary.allreduce_seconds.median, modelled.summary.allreduce_seconds.median);
        let d = b / a - 1.0;
        assert!(
            d.abs() <= 0.01,
            "{name}: median all-reduce {:+.2}% (modelled against frames)",
            d * 100.0
        );
        // The frames the modelled run did not move are its collective frames.
        assert!(
            modelled.summary.extra["frames_sent"].as_u64()
                < frames.summary.extra["frames_sent"].as_u64(),
            "{name}"
        );
    }
}

/// `modelled` is the event executor's, with virtual numerics: elsewhere it is refused.
#[test]
fn modelled_all_reduces_are_refused_on_turmoil_and_with_real_numerics() {
    let mut s = virtual_copy("fidelity/steady.toml");
    s.set_collectives(CollectiveModel::Modelled);
    let opts = ReplayOptions { executor: Some(ExecutorKind::Turmoil), ..Default::default() };
    let e = replay(&s, opts).expect_err("turmoil moves frames").to_string();
    assert!(e.contains("sim.collectives") && e.contains("event executor"), "{e}");
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scenarios/fidelity/steady.toml");
    let src = std::fs::read_to_string(p).expect("scenario");
    let src =
        src.replace("\nnumerics = \"real\"", "\nnumerics = \"real\"\ncollectives = \"modelled\"");
    let e =
        Scenario::from_toml_str(&src, "steady.toml").expect_err("real values travel").to_string();
    assert!(e.contains("sim.collectives") && e.contains("real"), "{e}");
}

fn nodes(n: usize, extra: &str) -> Scenario {
    let src = format!(
        "name = \"size\"\nseed = 1\n[model]\npreset = \"tiny\"\n[mesh]\nring = \"ids\"\n\
         [[regions]]\nname = \"r\"\n[[links]]\nfrom = \"r\"\nto = \"r\"\nbandwidth = \"1Gbit/s\"\n\
         latency = \"10ms\"\n[[nodes]]\nname = \"n\"\ncount = {n}\nregion = \"r\"\n\
         step_time = \"1s\"\n[stop]\ntime = \"1min\"\n{extra}"
    );
    Scenario::from_toml_str(&src, "size.toml").unwrap_or_else(|e| panic!("{e}"))
}

/// No valid scenario is run at a size its executor cannot take: it is refused before anything
/// runs, with the reason and what to change.
#[test]
fn sizes_an_executor_cannot_run_are_refused_up_front() {
    let refused = |s: &Scenario, executor| {
        let opts = ReplayOptions { executor: Some(executor), ..Default::default() };
        replay(s, opts).expect_err("refused").to_string()
    };
    let e = refused(&nodes(300, ""), ExecutorKind::Turmoil);
    assert!(e.contains("300 nodes on turmoil") && e.contains("sim.executor = \"events\""), "{e}");
    let e = refused(&nodes(1100, "[sim]\ncollectives = \"frames\"\n"), ExecutorKind::Events);
    assert!(e.contains("1100 nodes") && e.contains("sim.collectives = \"modelled\""), "{e}");
    let e = refused(&nodes(2100, ""), ExecutorKind::Events);
    assert!(e.contains("2100 nodes") && e.contains("every pair") && e.contains("GB"), "{e}");
    // Below the limits they run (the default for 300 nodes: events, modelled all-reduces).
    let s = nodes(300, "");
    let opts =
        ReplayOptions { max_time: Some(std::time::Duration::from_secs(5)), ..Default::default() };
    let out = replay(&s, opts).expect("300 nodes run on the event executor");
    assert_eq!(out.summary.extra["executor"], "events");
    assert_eq!(out.summary.extra["collectives"], "modelled");
}

/// The thousand-node scenario `loco bench sim` is held to (docs/simulator.md) loads, runs on
/// the event executor with modelled all-reduces, admits its thousand nodes and keeps its
/// invariants over its first simulated half hour.
#[test]
fn the_thousand_node_scenario_runs_with_modelled_all_reduces() {
    let s = load("thousand-nodes.toml");
    assert_eq!(s.nodes().len(), 1000);
    let opts = ReplayOptions {
        max_time: Some(std::time::Duration::from_secs(1800)),
        ..Default::default()
    };
    let out = replay(&s, opts).unwrap_or_else(|e| panic!("{e}"));
    assert!(out.summary.invariants.ok, "{:?}", out.summary.invariants.violations);
    assert_eq!(out.summary.extra["executor"], "events");
    assert_eq!(out.summary.extra["collectives"], "modelled");
    assert!(out.summary.outer_steps >= 1, "{}", out.summary.outer_steps);
    let admitted = out.events.iter().filter(|e| e.kind == EventKind::Admit).count();
    assert!(admitted >= 1000, "{admitted}");
}

/// A crash armed for a phase of the all-reduce strikes when its frames are sent, and a hung
/// member holds them: modelled all-reduces model neither, so such a scenario moves frames by
/// default and is refused when it asks for modelled ones.
#[test]
fn crashes_armed_in_the_all_reduce_and_hangs_keep_its_frames() {
    let crash =
        "[[churn]]\nat = \"1s\"\nkind = \"crash\"\nnode = \"n-3\"\nduring = \"all-gather\"\n";
    let opts = || ReplayOptions {
        executor: Some(ExecutorKind::Events),
        max_time: Some(std::time::Duration::from_secs(5)),
        ..Default::default()
    };
    let out = replay(&nodes(200, crash), opts()).expect("runs with frames");
    assert_eq!(out.summary.extra["collectives"], "frames");
    let out = replay(&nodes(200, ""), opts()).expect("runs modelled");
    assert_eq!(out.summary.extra["collectives"], "modelled");
    let e = replay(&nodes(200, &format!("{crash}[sim]\ncollectives = \"modelled\"\n")), opts())
        .expect_err("refused")
        .to_string();
    assert!(e.contains("sim.collectives") && e.contains("all-gather"), "{e}");
    let hang = "[[churn]]\nat = \"1s\"\nkind = \"hang\"\nnode = \"n-3\"\nfor = \"2s\"\n";
    let out = replay(&nodes(200, hang), opts()).expect("runs with frames");
    assert_eq!(out.summary.extra["collectives"], "frames");
}
