//! Replaying the 10B global scenario with virtual numerics stays far under 200 MB of resident
//! memory: bodies are lengths, never buffers. Alone in its test binary, so the peak is
//! this replay's.

use loco_core::scenario::Scenario;
use loco_sim::{ReplayOptions, peak_rss_bytes, replay};
use std::path::PathBuf;

#[test]
fn the_10b_global_replay_stays_under_200_mb() {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scenarios/intellect1-global.toml");
    let s = Scenario::load(&p).expect("scenario");
    assert!(s.model().param_count() > 10_000_000_000);
    let out = replay(&s, ReplayOptions { max_outer_steps: Some(3), ..ReplayOptions::default() })
        .expect("replay");
    assert!(out.summary.invariants.ok, "{:?}", out.summary.invariants.violations);
    assert_eq!(out.summary.outer_steps, 3);
    // 14 nodes moved 19 GB each per step.
    assert!(out.summary.bytes_sent_total > 3 * 14 * 18_000_000_000);
    let peak = peak_rss_bytes().expect("VmHWM in /proc/self/status");
    assert!(peak < 200 << 20, "peak resident memory {} MB", peak >> 20);
}
