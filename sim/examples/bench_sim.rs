//! `cargo run --release -p loco-sim --example bench_sim -- SCENARIO [HOURS]`: the figures of
//! `loco bench sim` without the CLI (simulated seconds per wall second, peak memory).

use loco_core::scenario::Scenario;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().unwrap_or_else(|| "scenarios/intellect1-global.toml".to_owned());
    let hours: f64 = args.next().map(|h| h.parse()).transpose()?.unwrap_or(24.0);
    let s = Scenario::load(&path)?;
    let f = loco_sim::bench(&s, hours)?;
    println!("{}", serde_json::to_string_pretty(&f)?);
    Ok(())
}
