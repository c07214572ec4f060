//! `cargo run --release -p loco-sim --example calibrate -- [STEPS] [SEED]`: replays the three
//! geographic scenarios and prints their all-reduce times and utilisation next to Table 2 of the
//! INTELLECT-1 report.

use loco_core::metrics::published_row;
use loco_core::scenario::Scenario;
use loco_sim::{ReplayOptions, replay};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let steps: u64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(30);
    let seed: Option<u64> = args.next().map(|s| s.parse()).transpose()?;
    println!(
        "{:<20} {:>6} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>7} {:>7}",
        "scenario", "steps", "ar p5", "ar med", "ar p95", "paper", "util", "paper", "mfu", "paper"
    );
    for name in ["intellect1-usa", "intellect1-usa-eu", "intellect1-global"] {
        let s = Scenario::load(format!("scenarios/{name}.toml"))?;
        let out =
            replay(&s, ReplayOptions { seed, max_outer_steps: Some(steps), ..Default::default() })?;
        let m = &out.summary;
        let p = m.published.as_deref().and_then(published_row);
        println!(
            "{:<20} {:>6} {:>9.1} {:>9.1} {:>9.1} {:>9} {:>7.1}% {:>7} {:>6.1}% {:>7} {}",
            name,
            m.outer_steps,
            m.allreduce_seconds.p5,
            m.allreduce_seconds.median,
            m.allreduce_seconds.p95,
            p.as_ref().and_then(|p| p.median_allreduce_s).map_or("-".into(), |x| format!("{x:.0}")),
            100.0 * m.utilization.table2,
            p.as_ref().map_or("-".into(), |p| format!("{:.1}%", 100.0 * p.compute_utilization)),
            100.0 * m.mfu.unwrap_or(0.0),
            p.as_ref().map_or("-".into(), |p| format!("{:.1}%", 100.0 * p.mfu)),
            if m.invariants.ok { "" } else { "INVARIANTS BROKEN" },
        );
    }
    Ok(())
}
