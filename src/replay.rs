//! `loco replay`: a scenario in the simulator, then the run directory and its report.

use crate::InputError;
use anyhow::{Result, anyhow};
use loco_core::scenario::Scenario;
use std::path::{Path, PathBuf};

/// Where the default scenario lives in a checkout.
const DEFAULT: &str = "scenarios/intellect1-global.toml";
/// The default scenario, built in, for a `loco` binary run outside the checkout.
const DEFAULT_TEXT: &str = include_str!("../scenarios/intellect1-global.toml");

/// Loads `path`, or the default scenario (the INTELLECT-1 global run).
pub(crate) fn scenario_or_default(path: Option<&Path>) -> Result<Scenario> {
    match path {
        Some(p) => crate::real_cmd::load(p),
        None if Path::new(DEFAULT).exists() => crate::real_cmd::load(Path::new(DEFAULT)),
        None => Scenario::from_toml_str(DEFAULT_TEXT, DEFAULT)
            .map_err(|e| InputError(anyhow!(e)).into()),
    }
}

/// Runs the replay; `Ok(false)` when an invariant broke.
pub(crate) fn replay(a: &crate::cli::ReplayArgs) -> Result<bool> {
    let mut scenario = scenario_or_default(a.scenario.as_deref())?;
    if a.mode.is_some() || a.fragments.is_some() || a.sync_delay.is_some() {
        let mode = a.mode.unwrap_or(scenario.diloco().mode);
        scenario
            .set_mode(mode, a.fragments, None, a.sync_delay)
            .map_err(|e| InputError(anyhow!("--mode {mode}: {e}")))?;
    }
    if let Some(e) = a.executor {
        scenario.set_executor(e);
    }
    if let Some(c) = a.collectives {
        scenario.set_collectives(c);
    }
    let out = a.out.clone().unwrap_or_else(|| PathBuf::from("out").join(scenario.name()));
    let bar = progress_bar();
    let progress_bar = bar.clone();
    let opts = loco_sim::ReplayOptions {
        seed: a.seed,
        max_outer_steps: a.max_outer_steps,
        progress: Some(Box::new(move |p: loco_sim::Progress| {
            if let Some(b) = &progress_bar {
                // The bar follows what stops the run: outer steps, or simulated time.
                let hours = p.simulated_seconds / 3600.0;
                match (p.target_outer_steps, p.target_seconds) {
                    (Some(n), _) => {
                        b.set_length(n);
                        b.set_position(p.outer_steps);
                        b.set_prefix(format!("outer step {}/{n}", p.outer_steps));
                        b.set_message(format!("{hours:.1} h simulated"));
                    }
                    (None, Some(t)) => {
                        b.set_length(t.max(1.0) as u64);
                        b.set_position(p.simulated_seconds as u64);
                        b.set_prefix(format!("{hours:.1} of {:.1} h simulated", t / 3600.0));
                        b.set_message(format!("{} outer steps", p.outer_steps));
                    }
                    (None, None) => b.set_prefix(format!("outer step {}", p.outer_steps)),
                }
            }
        })),
        ..loco_sim::ReplayOptions::default()
    };
    let started = crate::clock::now();
    let run = loco_sim::replay(&scenario, opts).map_err(|e| InputError(anyhow!(e)))?;
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let wall = crate::clock::now().duration_since(started).as_secs_f64();
    // summary.json keeps wall_seconds at 0 so that the same seed gives byte-identical files; the
    // wall time is printed below.
    loco_reports::write_run(&out, &run.summary, &run.rows, &run.events).map_err(|e| anyhow!(e))?;
    crate::print_summary(&run.summary, &out);
    println!("wall time           {wall:.2} s");
    Ok(run.summary.invariants.ok)
}

fn progress_bar() -> Option<indicatif::ProgressBar> {
    if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        return None;
    }
    let b = indicatif::ProgressBar::new(0);
    b.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} {prefix} {wide_bar} {msg}, about {eta} left",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    Some(b)
}
