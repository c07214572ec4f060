//! `[sim] encode_cost` and `decode_cost`: a ring node's CPU time for the codec's work on a
//! frame's values, before the frame leaves, one piece of work at a time per node.

use loco_core::scenario::Scenario;
mod common;

use common::{run, three_tiny_nodes};

/// Three nodes reducing 3000 real values (chunks of 1000, one segment each).
fn scenario(costs: &str) -> Scenario {
    let rest =
        format!("[stop]\nouter_steps = 3\n[sim]\nnumerics = \"real\"\nelements = 3000\n{costs}\n");
    three_tiny_nodes("codec-cost", 5, &rest)
}

#[test]
fn the_codec_work_on_the_rings_critical_path_lengthens_each_all_reduce() {
    let free = run(&scenario("encode_cost = 0\ndecode_cost = 0"));
    // 1 ms per value encoded, 0.5 ms per value decoded.
    let out = run(&scenario("encode_cost = 1e-3\ndecode_cost = 5e-4"));
    assert_eq!((out.summary.outer_steps, free.summary.outer_steps), (3, 3));
    // With three ranks, along a chunk's way: its first node encodes it (1 s), the next
    // decodes, adds and encodes (1.5 s), its owner decodes, averages, encodes and decodes its
    // copy (2 s), and the next decodes and forwards it (0.5 s): 5 s more on each all-reduce.
    let (a, b) = (out.summary.allreduce_seconds.median, free.summary.allreduce_seconds.median);
    assert!((a - b - 5.0).abs() < 0.05, "{a} s against {b} s");
    // The same result: the time the work takes changes nothing it computes.
    let hash = |o: &loco_sim::RunOutput| o.rows.iter().map(|r| r.weights_hash).collect::<Vec<_>>();
    assert_eq!(hash(&out), hash(&free));
}

#[test]
fn the_measured_codec_figures_are_the_default() {
    let s = scenario("");
    let uint8 = loco_core::codec::CodecKind::Uint8;
    assert_eq!(s.sim().codec_costs(uint8), uint8.measured_cost());
}
