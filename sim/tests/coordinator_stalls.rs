//! The claim that a coordinator stopped (`coordinator-pause`) or cut off from every node (a
//! partition of all of them) for less than the members' `rejoin_for` evicts nobody, held on
//! generated scenarios: node counts, regions and latencies, heartbeat settings, step times and
//! the stall's start and length all drawn from a seed that changes with the commit (`git
//! rev-parse HEAD`; `LOCO_SEED=N` replays one). The seed is printed.

use loco_core::metrics::EventKind;
use loco_core::scenario::Scenario;
use loco_sim::{ReplayOptions, replay};
use rand::{Rng, SeedableRng};

/// The commit's seed, or `LOCO_SEED`.
fn seed() -> u64 {
    if let Some(s) = std::env::var("LOCO_SEED").ok().and_then(|v| v.parse().ok()) {
        return s;
    }
    let head = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    u64::from_str_radix(head.get(..16).unwrap_or("0"), 16).unwrap_or(0)
}

/// One generated scenario and the length of its stall, in milliseconds.
fn scenario(rng: &mut impl Rng, i: usize) -> (String, u64, bool) {
    let nodes = rng.random_range(3..=6u32);
    let regions = rng.random_range(1..=3u32).min(nodes);
    let hb_ms = rng.random_range(100..=400u64);
    let timeout_ms = hb_ms * rng.random_range(4..=8u64);
    let coordinator_ms = timeout_ms * rng.random_range(2..=3u64);
    // `rejoin_for` is twice the coordinator timeout by default.
    let rejoin_ms = coordinator_ms * 2;
    let stall_ms = rng.random_range(timeout_ms + hb_ms..rejoin_ms - 4 * hb_ms);
    let step_ms = rng.random_range(20..=80u64);
    let inner = rng.random_range(3..=8u32);
    let at_ms = rng.random_range(1_000..4_000u64);
    let cut = rng.random_bool(0.5);
    let mut s = format!(
        "name = \"stall-{i}\"\nseed = {}\n\n[model]\npreset = \"tiny\"\n\n[diloco]\n\
         inner_steps = {inner}\n\n[mesh]\nheartbeat = \"{hb_ms}ms\"\n\
         heartbeat_timeout = \"{timeout_ms}ms\"\ncoordinator_timeout = \"{coordinator_ms}ms\"\n\
         barrier_timeout = \"120s\"\njoin_window = \"{hb_ms}ms\"\nmin_members = {nodes}\n\n",
        rng.random_range(0..1000u32)
    );
    for r in 0..regions {
        s.push_str(&format!("[[regions]]\nname = \"r{r}\"\n\n"));
    }
    for a in 0..regions {
        for b in a..regions {
            let lat = if a == b { 1 } else { rng.random_range(5..=60u32) };
            s.push_str(&format!(
                "[[links]]\nfrom = \"r{a}\"\nto = \"r{b}\"\nbandwidth = \"1Gbit/s\"\nlatency = \"{lat}ms\"\n\n"
            ));
        }
    }
    let mut names = Vec::new();
    for n in 0..nodes {
        let name = format!("n{n}");
        s.push_str(&format!(
            "[[nodes]]\nname = \"{name}\"\nregion = \"r{}\"\nstep_time = \"{step_ms}ms\"\n\n",
            n % regions
        ));
        names.push(format!("\"{name}\""));
    }
    if cut {
        s.push_str(&format!(
            "[[churn]]\nat = \"{at_ms}ms\"\nkind = \"partition\"\nnodes = [{}]\nfor = \"{stall_ms}ms\"\n\n",
            names.join(", ")
        ));
    } else {
        s.push_str(&format!(
            "[[churn]]\nat = \"{at_ms}ms\"\nkind = \"coordinator-pause\"\nfor = \"{stall_ms}ms\"\n\n"
        ));
    }
    s.push_str("[stop]\nouter_steps = 40\ntime = \"10min\"\n\n[sim]\nnumerics = \"real\"\nelements = 1024\n");
    (s, stall_ms, cut)
}

#[test]
fn a_coordinator_stalled_for_less_than_rejoin_for_evicts_nobody_in_generated_scenarios() {
    let seed = seed();
    eprintln!("coordinator stalls: seed {seed} (LOCO_SEED={seed} replays it)");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let (mut pauses, mut cuts) = (0, 0);
    for i in 0..12 {
        let (text, stall_ms, cut) = scenario(&mut rng, i);
        let s = Scenario::from_toml_str(&text, "generated.toml")
            .unwrap_or_else(|e| panic!("seed {seed}, scenario {i}: {e}\n{text}"));
        let out = replay(&s, ReplayOptions::default())
            .unwrap_or_else(|e| panic!("seed {seed}, scenario {i}: {e}\n{text}"));
        let what = if cut { "cut off" } else { "paused" };
        let why = || format!("seed {seed}, scenario {i} ({what} {stall_ms} ms):\n{text}");
        assert!(out.summary.invariants.ok, "{}", why());
        let changes: Vec<_> = out
            .events
            .iter()
            .filter(|e| matches!(e.kind, EventKind::Evict | EventKind::Leave | EventKind::Restart))
            .collect();
        assert!(changes.is_empty(), "{changes:?}\n{}", why());
        let epochs = out.events.iter().filter(|e| e.kind == EventKind::Epoch && e.node.is_none());
        assert_eq!(epochs.count(), 1, "{}", why());
        assert_eq!(out.summary.outer_steps, 40, "{}", why());
        if cut {
            cuts += 1;
        } else {
            pauses += 1;
        }
    }
    eprintln!("coordinator stalls: {pauses} pauses and {cuts} cut-offs, nobody evicted");
}
