//! `loco fidelity`: one scenario replayed by the simulator and launched on real processes in
//! its emulated network, then compared step by step (`loco_reports::fidelity`).

use crate::InputError;
use crate::cli::FidelityArgs;
use anyhow::{Result, anyhow};
use loco_core::scenario::Numerics;
use loco_core::scenario::Scenario;
use loco_real::launch::{LaunchError, LaunchPlan, Launcher, Notice};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Runs both backends and compares them; `Ok(false)` when a figure is outside the tolerance, the
/// stories differ, or a run broke an invariant.
pub(crate) fn fidelity(a: &FidelityArgs) -> Result<bool> {
    if !(a.tolerance.is_finite() && a.tolerance > 0.0) {
        return Err(
            InputError(anyhow!("--tolerance: expected a number > 0, got {}", a.tolerance)).into()
        );
    }
    let (Some(path), None) = (&a.scenario, a.random) else {
        return random(a);
    };
    let s = crate::real_cmd::load(path)?;
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("out").join(format!("{}-fidelity", s.name())));
    // Another seed: both runs read a copy of the file with it (the real processes read the
    // file themselves).
    let (path, s) = match a.seed {
        None => (path.clone(), s),
        Some(seed) => {
            let copy = with_seed(path, seed, &out)?;
            let s = crate::real_cmd::load(&copy)?;
            (copy, s)
        }
    };
    let (f, invariants) = compare(a, &path, s, &out)?;
    println!(
        "scenario               {} (seed {}, real network: {})",
        f.scenario,
        f.seed,
        f.network.as_deref().unwrap_or("unknown")
    );
    print!("{}", f.text(a.tolerance));
    let ok = f.within(a.tolerance) && invariants;
    println!(
        "verdict                {} (tolerance {:.1}%)",
        if ok { "within" } else { "OUTSIDE" },
        a.tolerance * 100.0
    );
    for p in ["fidelity.csv", "fidelity.json", "fidelity.html"] {
        println!("wrote                  {}", out.join(p).display());
    }
    Ok(ok)
}

/// Replays the scenario `s` (read from `path`), launches it, writes both runs and the comparison
/// under `out`; returns the comparison and whether both runs kept their invariants.
fn compare(
    a: &FidelityArgs,
    path: &Path,
    mut s: Scenario,
    out: &Path,
) -> Result<(loco_reports::fidelity::Fidelity, bool)> {
    if s.sim().numerics != Numerics::Real {
        return Err(InputError(anyhow!(
            "{}: sim.numerics: expected \"real\" (both backends then train the same synthetic \
             objective of `sim.elements` parameters and send the same bytes)",
            path.display()
        ))
        .into());
    }
    let params = usize::try_from(s.sim().elements)
        .map_err(|_| InputError(anyhow!("{}: sim.elements: too large", path.display())))?;
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
        ..LaunchPlan::new(s.clone(), path.to_path_buf(), std::env::current_exe()?, real_dir.clone())
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
    loco_reports::fidelity::write_fidelity(out, &f, a.tolerance).map_err(|e| anyhow!(e))?;
    // The real run's report gets the comparison too (and keeps it when redrawn).
    loco_reports::fidelity::write_fidelity(&real_dir, &f, a.tolerance).map_err(|e| anyhow!(e))?;
    loco_reports::render(std::slice::from_ref(&real_dir)).map_err(|e| anyhow!(e))?;
    Ok((f, sim.summary.invariants.ok && real.summary.invariants.ok))
}

/// `--random N`: N drawn scenarios, each compared, and the distribution of the errors.
fn random(a: &FidelityArgs) -> Result<bool> {
    let n = a.random.unwrap_or(1);
    let seed = match a.seed {
        Some(s) => s,
        None => {
            let s: u64 = rand::random();
            eprintln!("loco: drew the seed {s} (again: loco fidelity --random {n} --seed {s})");
            s
        }
    };
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("out").join(format!("fidelity-random-{seed}")));
    let mut outcomes = Vec::new();
    for index in 0..n {
        let dir = out.join(index.to_string());
        let text = loco_core::scenario::random::fidelity_scenario(seed, index);
        let path = dir.join("scenario.toml");
        write_atomic(&path, &text)?;
        let s = crate::real_cmd::load(&path)?;
        let name = s.name().to_string();
        eprintln!("loco: scenario {} of {n}: {name} ({})", index + 1, path.display());
        let (fidelity, failure) = match compare(a, &path, s, &dir) {
            Ok((f, true)) => (Some(f), None),
            Ok((f, false)) => (Some(f), Some("an invariant broke".to_string())),
            Err(e) if e.downcast_ref::<InputError>().is_some() => return Err(e),
            Err(e) => {
                eprintln!("loco: {name}: {e:#}");
                (None, Some(format!("{e:#}")))
            }
        };
        outcomes.push(loco_reports::draw::Outcome { index, name, fidelity, failure });
        // What is done so far is on disk, should the draw stop here.
        let summary = loco_reports::draw::DrawSummary::new(seed, outcomes.clone());
        write_atomic(&out.join("draw.csv"), &summary.csv())?;
        let json = serde_json::to_string_pretty(&summary).map_err(|e| anyhow!(e))?;
        write_atomic(&out.join("draw.json"), &json)?;
    }
    let summary = loco_reports::draw::DrawSummary::new(seed, outcomes);
    print!("{}", summary.text(5));
    let ok = summary.within(a.tolerance);
    println!(
        "verdict                {} (every scenario's timing figures within {:.1}%)",
        if ok { "within" } else { "OUTSIDE" },
        a.tolerance * 100.0
    );
    println!("wrote                  {}", out.join("draw.csv").display());
    println!("wrote                  {}", out.join("draw.json").display());
    Ok(ok)
}

/// Writes `text` to `path` through a temporary file beside it (its folder made first).
fn write_atomic(path: &Path, text: &str) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| anyhow!("creating {}: {e}", dir.display()))?;
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).map_err(|e| anyhow!("writing {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| anyhow!("writing {}: {e}", path.display()))?;
    Ok(())
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
