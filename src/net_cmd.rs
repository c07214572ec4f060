//! `loco net check`: the emulated network's self-test, printed.

use crate::InputError;
use crate::cli::NetCheckArgs;
use anyhow::{Result, anyhow};
use loco_real::wan::WanError;
use loco_real::wan::check::{LinkCheck, check as run_check};
use std::time::Duration;

fn mbit(bytes_per_s: f64) -> f64 {
    bytes_per_s * 8.0 / 1e6
}

fn row(c: &LinkCheck) -> String {
    format!(
        "{:<22} {:>10} {:>10} {:>9.1} {:>9.1} {:>+7.1}% {:>9.2} {:>9.2} {:>+7.1}%",
        c.link,
        c.from,
        c.to,
        mbit(c.configured_rate),
        mbit(c.achieved_rate),
        c.rate_error() * 100.0,
        c.configured_rtt * 1e3,
        c.measured_rtt * 1e3,
        c.rtt_error() * 100.0,
    )
}

/// Runs the check; `Ok(false)` when a link is outside the tolerance.
pub(crate) fn check(a: &NetCheckArgs) -> Result<bool> {
    if !(a.seconds.is_finite() && a.seconds >= 0.5 && a.seconds <= 600.0) {
        return Err(InputError(anyhow!("--seconds: expected 0.5 to 600, got {}", a.seconds)).into());
    }
    if !(a.tolerance.is_finite() && a.tolerance > 0.0) {
        return Err(
            InputError(anyhow!("--tolerance: expected a number > 0, got {}", a.tolerance)).into()
        );
    }
    let s = crate::real_cmd::load(&a.scenario)?;
    let seed = a.seed.unwrap_or(s.seed());
    if !a.json {
        println!(
            "{:<22} {:>10} {:>10} {:>9} {:>9} {:>8} {:>9} {:>9} {:>8}",
            "link", "from", "to", "Mbit/s", "got", "error", "RTT ms", "got", "error"
        );
    }
    let json = a.json;
    let checks = run_check(&s, seed, Duration::from_secs_f64(a.seconds), |c| {
        if !json {
            println!("{}", row(c));
        }
    })
    .map_err(|e| match e {
        WanError::Unavailable { .. } => InputError(anyhow!(e)).into(),
        e => anyhow!(e),
    })?;
    let ok =
        |c: &LinkCheck| c.rate_error().abs() <= a.tolerance && c.rtt_error().abs() <= a.tolerance;
    let all_ok = !checks.is_empty() && checks.iter().all(ok);
    if json {
        let v = serde_json::json!({
            "scenario": s.name(),
            "seed": seed,
            "seconds": a.seconds,
            "tolerance": a.tolerance,
            "ok": all_ok,
            "links": checks,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else if checks.is_empty() {
        println!("no link has two nodes to measure it with");
    } else {
        let worst_rate = checks.iter().map(|c| c.rate_error().abs()).fold(0.0, f64::max);
        let worst_rtt = checks.iter().map(|c| c.rtt_error().abs()).fold(0.0, f64::max);
        println!(
            "{}: worst rate error {:.1}%, worst round-trip error {:.1}% (tolerance {:.1}%)",
            if all_ok { "ok" } else { "OUTSIDE THE TOLERANCE" },
            worst_rate * 100.0,
            worst_rtt * 100.0,
            a.tolerance * 100.0
        );
    }
    Ok(all_ok)
}
