//! `cargo run --release -p loco-sim --example replay_files -- SCENARIO OUT_DIR [SEED]`: replays a
//! scenario and writes summary.json, outer_steps.csv and events.csv (without the report), for
//! checking that two runs give the same bytes.

use loco_core::metrics::{events_csv, outer_steps_csv};
use loco_core::scenario::Scenario;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: replay_files SCENARIO OUT_DIR [SEED]")?;
    let out = std::path::PathBuf::from(args.next().ok_or("missing OUT_DIR")?);
    let seed: Option<u64> = args.next().map(|s| s.parse()).transpose()?;
    let s = Scenario::load(&path)?;
    let run = loco_sim::replay(&s, loco_sim::ReplayOptions { seed, ..Default::default() })?;
    std::fs::create_dir_all(&out)?;
    std::fs::write(out.join("summary.json"), serde_json::to_string_pretty(&run.summary)? + "\n")?;
    std::fs::write(out.join("outer_steps.csv"), outer_steps_csv(&run.rows))?;
    std::fs::write(out.join("events.csv"), events_csv(&run.events))?;
    println!(
        "{} outer steps, invariants ok: {}",
        run.summary.outer_steps, run.summary.invariants.ok
    );
    Ok(())
}
