//! `loco bench outer`: the per-parameter cost of a commit's O(model) work, as the real backend
//! does it, and what it comes to for the model presets.
//!
//! One run measures, on `params` fp32 parameters (seeded), each part of the work once per outer
//! step that a real worker does on the whole parameter vector:
//!
//! - `pseudo-gradient`: [`OuterState::compute_pseudo_gradient_with`], the inner weights copied into
//!   the pseudo-gradient buffer and turned into `outer - inner` in place (the worker's
//!   `params_into` then the subtraction);
//! - `outer step`: [`OuterState::apply_outer_step`], the Nesterov update of weights and momentum;
//! - `set params`: one copy of the outer weights into the model (`set_params` on the CPU);
//! - `digest`: [`weights_digest`] of the outer weights (the `weights_hash` column);
//!
//! next to a plain memcpy of the same 4n bytes in the same run, the yardstick of the ratios. Each
//! figure is the best of `repeats` timed runs after one untimed warm-up run, on one thread, or
//! with `shards` G > 1 the pseudo-gradient (in its one-pass form,
//! [`OuterState::compute_pseudo_gradient_sharded`]) and the outer step on G threads, one per
//! shard, as a worker of a node of G GPUs runs them. The sum, in seconds per parameter, is what the
//! simulator charges per commit (`[sim] outer_cost`).

use anyhow::{Result, ensure};
use loco_core::diloco::{OuterConfig, OuterState};
use loco_core::node::digest::{weights_digest, weights_digest_parallel};
use loco_core::scenario::Preset;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;
use serde::Serialize;
use std::hint::black_box;
use std::io::Write;

/// What `loco bench outer` measures.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OuterBenchArgs {
    /// Parameters (fp32) of the vector.
    pub params: usize,
    /// Timed runs per figure; the best one is reported.
    pub repeats: usize,
    /// Seed of the weights.
    pub seed: u64,
    /// Threads of the pseudo-gradient and the outer step, one per shard of a node of that many
    /// GPUs (1: the single-threaded work the simulator's `outer_cost` is measured on).
    pub shards: usize,
}

impl Default for OuterBenchArgs {
    /// 5e7 parameters (200 MB per fp32 copy, far past any cache), best of 5, seed 0, one
    /// thread.
    fn default() -> Self {
        OuterBenchArgs { params: 50_000_000, repeats: 5, seed: 0, shards: 1 }
    }
}

/// One part of the work.
#[derive(Clone, Debug, Serialize)]
pub struct OuterPart {
    /// What it is.
    pub name: &'static str,
    /// Seconds for the whole vector (best run).
    pub seconds: f64,
    /// Nanoseconds per parameter.
    pub ns_per_param: f64,
    /// `seconds` over the memcpy's.
    pub vs_memcpy: f64,
}

/// What the measured cost comes to for one model preset.
#[derive(Clone, Debug, Serialize)]
pub struct PresetCost {
    /// The preset's name.
    pub preset: String,
    /// Its parameters.
    pub params: u64,
    /// Seconds of O(model) work per outer step at the measured cost.
    pub seconds: f64,
}

/// The figures of one run (serialised as the `--json` output).
#[derive(Clone, Debug, Serialize)]
pub struct OuterBenchReport {
    /// Parameters of the vector.
    pub params: usize,
    /// Bytes of one fp32 copy of it.
    pub bytes: usize,
    /// Timed runs per figure.
    pub repeats: usize,
    /// Seed of the weights.
    pub seed: u64,
    /// Threads of the pseudo-gradient and the outer step.
    pub shards: usize,
    /// The memcpy of `bytes`, seconds (best run).
    pub memcpy_seconds: f64,
    /// The memcpy, GB/s (1 GB = 1e9 bytes).
    pub memcpy_gbps: f64,
    /// The parts, in the order the worker does them.
    pub parts: Vec<OuterPart>,
    /// Their sum, seconds per parameter: the figure for `[sim] outer_cost`.
    pub outer_cost: f64,
    /// The sum in nanoseconds per parameter.
    pub ns_per_param: f64,
    /// The sum over the memcpy.
    pub vs_memcpy: f64,
    /// The sum times the parameters of each preset (150m, 1b, 10b).
    pub presets: Vec<PresetCost>,
}

/// Best wall time, in seconds, of `repeats` runs of `f`, after one untimed warm-up run.
fn best_seconds(repeats: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut best = f64::INFINITY;
    for _ in 0..repeats {
        let start = crate::clock::now();
        f();
        best = best.min(start.elapsed().as_secs_f64());
    }
    // A clock too coarse for a tiny vector must not give a zero cost.
    best.max(1e-9)
}

/// Runs the benchmark; `progress` is told the name of each figure before it is measured.
pub fn run(args: &OuterBenchArgs, mut progress: impl FnMut(&str)) -> Result<OuterBenchReport> {
    ensure!(args.params >= 1, "params: expected at least 1, got {}", args.params);
    ensure!(args.repeats >= 1, "repeats: expected at least 1, got {}", args.repeats);
    ensure!(args.shards >= 1, "shards: expected at least 1, got {}", args.shards);
    let n = args.params;
    let mut rng = ChaCha8Rng::seed_from_u64(args.seed);
    let weights: Vec<f32> = (0..n).map(|_| rng.sample::<f32, _>(StandardNormal)).collect();
    // The inner weights after training: the outer ones moved a little. The pseudo-gradient is
    // then small and normal (no denormals to slow the arithmetic down).
    let trained: Vec<f32> =
        weights.iter().map(|w| w + 1e-3 * rng.sample::<f32, _>(StandardNormal)).collect();
    let mut model = vec![0.0f32; n];
    let mut outer = OuterState::new(OuterConfig::default(), weights, Vec::new())?;

    progress("memcpy");
    let memcpy_seconds = best_seconds(args.repeats, || {
        model.copy_from_slice(&trained);
        black_box(&mut model);
    });

    let mut parts = Vec::with_capacity(4);
    let mut part = |name: &'static str, seconds: f64| {
        parts.push(OuterPart {
            name,
            seconds,
            ns_per_param: seconds / n as f64 * 1e9,
            vs_memcpy: seconds / memcpy_seconds,
        });
    };
    progress("pseudo-gradient");
    part(
        "pseudo-gradient",
        best_seconds(args.repeats, || {
            let filled = if args.shards > 1 {
                outer.compute_pseudo_gradient_sharded(&trained, args.shards).map(|_| ())
            } else {
                outer.compute_pseudo_gradient_with(|buf| {
                    buf.copy_from_slice(&trained);
                    Ok::<(), loco_core::diloco::DilocoError>(())
                })
            };
            black_box(filled.is_ok());
            black_box(outer.pseudo_gradient());
        }),
    );
    progress("outer step");
    part(
        "outer step",
        best_seconds(args.repeats, || {
            outer.apply_outer_step_sharded(args.shards);
            black_box(outer.outer());
        }),
    );
    progress("set params");
    part(
        "set params",
        best_seconds(args.repeats, || {
            model.copy_from_slice(outer.outer());
            black_box(&mut model);
        }),
    );
    progress("digest");
    part(
        "digest",
        best_seconds(args.repeats, || {
            let w = black_box(outer.outer());
            black_box(if args.shards > 1 { weights_digest_parallel(w) } else { weights_digest(w) });
        }),
    );

    let total: f64 = parts.iter().map(|p| p.seconds).sum();
    let outer_cost = total / n as f64;
    let presets = [Preset::M150, Preset::B1, Preset::B10]
        .into_iter()
        .map(|p| {
            let params = p.spec().param_count();
            PresetCost { preset: p.name().to_owned(), params, seconds: params as f64 * outer_cost }
        })
        .collect();
    Ok(OuterBenchReport {
        params: n,
        bytes: 4 * n,
        repeats: args.repeats,
        seed: args.seed,
        shards: args.shards,
        memcpy_seconds,
        memcpy_gbps: (4 * n) as f64 / memcpy_seconds / 1e9,
        parts,
        outer_cost,
        ns_per_param: outer_cost * 1e9,
        vs_memcpy: total / memcpy_seconds,
        presets,
    })
}

impl OuterBenchReport {
    /// Writes the report as a human-readable table.
    pub fn print_table(&self, out: &mut impl Write) -> std::io::Result<()> {
        writeln!(
            out,
            "outer-step work: {} fp32 parameters ({:.1} MB per copy, seed {}), best of {}, {}",
            self.params,
            self.bytes as f64 / 1e6,
            self.seed,
            self.repeats,
            if self.shards > 1 {
                format!("pseudo-gradient and outer step on {} threads (shards)", self.shards)
            } else {
                "1 thread".to_owned()
            }
        )?;
        writeln!(
            out,
            "memcpy of the same bytes: {:.2} ms ({:.2} GB/s, {:.3} ns/param)",
            self.memcpy_seconds * 1e3,
            self.memcpy_gbps,
            self.memcpy_seconds / self.params as f64 * 1e9
        )?;
        writeln!(out)?;
        writeln!(out, "{:<16} {:>10} {:>10} {:>9}", "part", "ms", "ns/param", "x memcpy")?;
        for p in &self.parts {
            writeln!(
                out,
                "{:<16} {:>10.2} {:>10.3} {:>9.2}",
                p.name,
                p.seconds * 1e3,
                p.ns_per_param,
                p.vs_memcpy
            )?;
        }
        writeln!(
            out,
            "{:<16} {:>10.2} {:>10.3} {:>9.2}",
            "total",
            self.outer_cost * self.params as f64 * 1e3,
            self.ns_per_param,
            self.vs_memcpy
        )?;
        writeln!(out)?;
        writeln!(out, "[sim] outer_cost = {:.3e}   # seconds per parameter", self.outer_cost)?;
        writeln!(out)?;
        writeln!(out, "per outer step at this cost:")?;
        for p in &self.presets {
            writeln!(out, "  {:<5} {:>14} params  {:>8.2} s", p.preset, p.params, p.seconds)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_run_reports_the_parts_and_their_sum() {
        let args = OuterBenchArgs { params: 10_007, repeats: 2, seed: 3, shards: 1 };
        let mut seen = Vec::new();
        let report = run(&args, |name| seen.push(name.to_owned())).unwrap();
        assert_eq!(seen, ["memcpy", "pseudo-gradient", "outer step", "set params", "digest"]);
        assert_eq!((report.params, report.bytes), (10_007, 40_028));
        let names: Vec<&str> = report.parts.iter().map(|p| p.name).collect();
        assert_eq!(names, ["pseudo-gradient", "outer step", "set params", "digest"]);
        for p in &report.parts {
            assert!(p.seconds.is_finite() && p.seconds > 0.0, "{}: {}", p.name, p.seconds);
            assert!((p.ns_per_param - p.seconds / 10_007.0 * 1e9).abs() < 1e-9 * p.ns_per_param);
            assert!((p.vs_memcpy - p.seconds / report.memcpy_seconds).abs() < 1e-9 * p.vs_memcpy);
        }
        let sum: f64 = report.parts.iter().map(|p| p.seconds).sum();
        assert!((report.outer_cost - sum / 10_007.0).abs() <= 1e-12 * report.outer_cost);
        assert_eq!(report.ns_per_param, report.outer_cost * 1e9);
        let presets: Vec<(&str, u64)> =
            report.presets.iter().map(|p| (p.preset.as_str(), p.params)).collect();
        assert_eq!(
            presets,
            [("150m", 149_840_640), ("1b", 1_235_814_400), ("10b", 10_211_381_248)]
        );
        for p in &report.presets {
            assert_eq!(p.seconds, p.params as f64 * report.outer_cost);
        }

        let mut table = Vec::new();
        report.print_table(&mut table).unwrap();
        let table = String::from_utf8(table).unwrap();
        for needle in ["memcpy", "pseudo-gradient", "outer step", "digest", "total", "outer_cost"] {
            assert!(table.contains(needle), "missing {needle} in:\n{table}");
        }
        assert!(table.lines().any(|l| l.trim_start().starts_with("10b")), "{table}");
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["parts"][3]["name"], "digest");
        assert!(json["outer_cost"].as_f64().unwrap() > 0.0);
    }

    #[test]
    fn bad_arguments_are_rejected_with_the_field_name() {
        for (args, field) in [
            (OuterBenchArgs { params: 0, repeats: 1, seed: 0, shards: 1 }, "params"),
            (OuterBenchArgs { params: 1, repeats: 0, seed: 0, shards: 1 }, "repeats"),
            (OuterBenchArgs { params: 1, repeats: 1, seed: 0, shards: 0 }, "shards"),
        ] {
            let err = run(&args, |_| {}).unwrap_err().to_string();
            assert!(err.starts_with(field), "{err}");
        }
    }
}
