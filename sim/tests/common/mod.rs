//! What the simulator's cost tests share: three one-GPU nodes of the tiny model in one region.

use loco_core::scenario::Scenario;
use loco_sim::{ReplayOptions, RunOutput, replay};

/// Three one-GPU nodes `n-0..n-2`, the tiny model, 5 inner steps of 1 s, on 1 Gbit/s links of
/// 5 ms; `rest` follows the nodes (more nodes, churn, `[stop]`, `[sim]`).
pub fn three_tiny_nodes(name: &str, seed: u64, rest: &str) -> Scenario {
    let toml = format!(
        r#"
name = "{name}"
seed = {seed}
[model]
preset = "tiny"
[diloco]
inner_steps = 5
[mesh]
join_window = "1s"
[[regions]]
name = "r"
[[links]]
from = "r"
to = "r"
bandwidth = "1Gbit/s"
latency = "5ms"
[[nodes]]
name = "n"
count = 3
step_time = "1s"
{rest}"#
    );
    Scenario::from_toml_str(&toml, "inline.toml").unwrap_or_else(|e| panic!("{e}"))
}

/// Replays `s`, whose invariants must hold.
pub fn run(s: &Scenario) -> RunOutput {
    let out = replay(s, ReplayOptions::default()).expect("replay");
    assert!(out.summary.invariants.ok, "{:?}", out.summary.invariants.violations);
    out
}
