//! `loco fidelity`: one scenario replayed by the simulator and launched on real processes in
//! its emulated network, then compared step by step (`loco_reports::fidelity`).

use crate::InputError;
use crate::cli::FidelityArgs;
use anyhow::{Result, anyhow};
use loco_core::scenario::Numerics;
use loco_real::launch::{LaunchError, LaunchPlan, Launcher, Notice};
use std::path::PathBuf;
use std::time::Duration;

/// Runs both backends and compares them; `Ok(false)` when a figure is outside the tolerance, the
/// stories differ, or a run broke an invariant.
pub(crate) fn fidelity(a: &FidelityArgs) -> Result<bool> {
    if !(a.tolerance.is_finite() && a.tolerance > 0.0) {
        return Err(
            InputError(anyhow!("--tolerance: expected a number > 0, got {}", a.tolerance)).into()
        );
    }
    let mut s = crate::real_cmd::load(&a.scenario)?;
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("out").join(format!("{}-fidelity", s.name())));
    // Another seed: both runs read a copy of the file with it (the real processes read the
    // file themselves).
    let path = match a.seed {
        None => a.scenario.clone(),
        Some(seed) => {
            let copy = with_seed(&a.scenario, seed, &out)?;
            s = crate::real_cmd::load(&copy)?;
            copy
        }
    };
    if s.sim().numerics != Numerics::Real {
        return Err(InputError(anyhow!(
            "{}: sim.numerics: expected \"real\" (both backends then train the same synthetic \
             objective of `sim.elements` parameters and send the same bytes)",
            a.scenario.display()
        ))
        .into());
    }
    let params = usize::try_from(s.sim().elements)
        .map_err(|_| InputError(anyhow!("{}: sim.elements: too large", a.scenario.display())))?;
    let network =
        a.network.map_or(loco_core::scenario::NetworkMode::Emulated, crate::real_cmd::network_mode);
    if network == loco_core::scenario::NetworkMode::Relay {
        s.set_tcp(loco_core::scenario::TcpKind::None);
    }
    let (sim_dir, real_dir) = (out.join("sim"), out.join("real"));

    eprintln!("loco: replaying {} in the simulator", s.name());
    let run = loco_sim::replay(
        &s,
        loco_sim::ReplayOptions {
            max_outer_steps: a.max_outer_steps,
            // The commit's cost is that of the objective the real run steps.
            outer_params: Some(s.sim().elements),
            ..loco_sim::ReplayOptions::default()
        },
    )
    .map_err(|e| InputError(anyhow!(e)))?;
    loco_reports::write_run(&sim_dir, &run.summary, &run.rows, &run.events)
        .map_err(|e| anyhow!(e))?;

    eprintln!("loco: launching {} on real processes ({params} parameters each)", s.name());
    let plan = LaunchPlan {
        max_outer_steps: a.max_outer_steps,
        synthetic_params: Some(params),
        timeout: a.timeout.map(Duration::from_secs),
        // The point is the scenario's network: emulated unless asked otherwise.
        network: Some(network),
        ..LaunchPlan::new(s.clone(), path.clone(), std::env::current_exe()?, real_dir.clone())
    };
    let outcome = Launcher::new(plan)
        .on_notice(|n| match n {
            Notice::Progress { .. } | Notice::ClockStarted { .. } => tracing::info!("{n}"),
            n => eprintln!("loco: {n}"),
        })
        .run()
        .map_err(|e| match e {
            LaunchError::Network(loco_real::wan::WanError::Unavailable { .. }) => {
                InputError(anyhow!(e)).into()
            }
            e => anyhow!(e),
        })?;
    loco_reports::write_run(&real_dir, &outcome.summary, &outcome.rows, &outcome.events)
        .map_err(|e| anyhow!(e))?;

    let sim = loco_reports::read_run(&sim_dir).map_err(|e| anyhow!(e))?;
    let real = loco_reports::read_run(&real_dir).map_err(|e| anyhow!(e))?;
    let f = loco_reports::fidelity::compare(&sim, &real);
    let files =
        loco_reports::fidelity::write_fidelity(&out, &f, a.tolerance).map_err(|e| anyhow!(e))?;
    // The real run's report gets the comparison too (and keeps it when redrawn).
    loco_reports::fidelity::write_fidelity(&real_dir, &f, a.tolerance).map_err(|e| anyhow!(e))?;
    loco_reports::render(std::slice::from_ref(&real_dir)).map_err(|e| anyhow!(e))?;
    println!(
        "scenario               {} (seed {}, real network: {})",
        f.scenario,
        f.seed,
        f.network.as_deref().unwrap_or("unknown")
    );
    print!("{}", f.text(a.tolerance));
    let ok = f.within(a.tolerance) && sim.summary.invariants.ok && real.summary.invariants.ok;
    println!(
        "verdict                {} (tolerance {:.1}%)",
        if ok { "within" } else { "OUTSIDE" },
        a.tolerance * 100.0
    );
    for p in files {
        println!("wrote                  {}", p.display());
    }
    Ok(ok)
}

/// Writes `DIR/scenario.toml`: the scenario at `path` with its top-level `seed` replaced, its
/// comments and layout kept. Returns its path.
fn with_seed(path: &std::path::Path, seed: u64, dir: &std::path::Path) -> Result<PathBuf> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| InputError(anyhow!("{}: cannot read: {e}", path.display())))?;
    let mut doc: toml_edit::DocumentMut =
        text.parse().map_err(|e| InputError(anyhow!("{}: not TOML: {e}", path.display())))?;
    let seed = i64::try_from(seed)
        .map_err(|_| InputError(anyhow!("--seed: expected at most {}, got {seed}", i64::MAX)))?;
    doc["seed"] = toml_edit::value(seed);
    std::fs::create_dir_all(dir).map_err(|e| anyhow!("creating {}: {e}", dir.display()))?;
    let copy = dir.join("scenario.toml");
    let tmp = dir.join("scenario.toml.tmp");
    std::fs::write(&tmp, doc.to_string()).map_err(|e| anyhow!("writing {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, &copy).map_err(|e| anyhow!("writing {}: {e}", copy.display()))?;
    Ok(copy)
}
