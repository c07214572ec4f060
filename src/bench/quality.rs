//! `loco bench quality`: does DiLoCo train as the papers say, in small?
//!
//! One process, no network, deterministic on the CPU (one libtorch thread): the `tiny` preset
//! (131,392 parameters, byte-level vocabulary 256, sequences of 64 bytes) trained on a text file
//! (by default `data/genesis-kjv.txt`), with the inner settings of `scenarios/tiny-real.toml`
//! (AdamW peak lr 1e-3 after a 10-step linear warmup, betas 0.9/0.95, weight decay 0.1, clip 1,
//! z-loss 2e-4) and `batch_rows` sequences per inner step. Four runs (and one more DiLoCo run per
//! `--also-codec`, after the uint8 one), every one from the same
//! starting point and with the same number `T = H x outer_steps` of inner steps per worker. The
//! starting point is the seeded initial model, trained by one worker for `pretrain_steps` steps
//! on the whole training set (weights, AdamW state and schedule position, exported and imported
//! into every trainer), as DiLoCo's experiments start from a pretrained model (24k steps in
//! arXiv 2311.08105). From scratch, the first pseudo-gradients hold the steep initial descent
//! (here from 5.9 to 2.6 nats in 100 steps); the outer Nesterov momentum keeps re-applying them
//! (7x in the steady state at lr 0.7, m 0.9) and the outer steps overshoot for many rounds, so
//! the comparison then mostly measures that transient (`--pretrain-steps 0` shows it).
//!
//!
//! 1. **1 worker**: one trainer, `T` steps on the whole training set.
//! 2. **DiLoCo fp32**: `W` trainers, worker `i` on shard `i` of `W` (disjoint). Every `H` inner
//!    steps each worker computes its pseudo-gradient `outer - inner`
//!    ([`compute_pseudo_gradient`](loco_core::diloco::OuterState::compute_pseudo_gradient)); the
//!    pseudo-gradients are averaged by core's ring all-reduce
//!    ([`run_ring`](loco_core::allreduce::run_ring) over the in-memory transport, one ring of `W`
//!    nodes) with the fp32 codec; each worker applies the outer Nesterov step (by default
//!    DiLoCo's lr 0.7, momentum 0.9: [`OuterConfig`](loco_core::diloco::OuterConfig)'s defaults)
//!    to its own [`OuterState`](loco_core::diloco::OuterState) and sets the new outer weights into
//!    its trainer (whose AdamW state and schedule carry on, as in the real worker). After every
//!    outer step the `W` outer weight vectors are compared bit for bit.
//! 3. **DiLoCo uint8**: the same with PRIME's uint8 codec.
//! 4. **data-parallel**: one trainer whose every step takes the concatenation of the `W` workers'
//!    batches (the next `batch_rows` sequences of each shard, one micro-batch each), for `T`
//!    steps. Synchronous data parallelism averages the `W` workers' gradients of equal-size
//!    batches before every optimiser step, which is exactly the gradient of the mean loss over
//!    the concatenated batch (what gradient accumulation over the micro-batches computes), and the
//!    gradient clip then applies to that average as in DDP: so this single trainer *is*
//!    `W`-worker data parallelism, with the same compute as the DiLoCo runs (`W x T` batches) and
//!    the same data, minus the wire. Its communication is reported as the fp32 ring formula
//!    `2 (W - 1) / W x 4 bytes x params` per step (estimated; nothing is sent).
//!
//! Evaluation: the text's `seq_len + 1`-token sequences (as [`DataLoader`](loco_real::data::DataLoader) packs them) are split
//! into a training set (the first 95%) and a held-out set (the last 5%), with one sequence
//! between them dropped so that no held-out token is ever a training target. Training loaders
//! read their shard in a seeded shuffled order and skip held-out sequences; the eval loss is the
//! mean cross-entropy over every held-out sequence (`Trainer::eval_loss`, batches of 32 rows
//! weighted by rows), measured at step 0 and after every `H` steps (every outer step).
//!
//! The claims checked (exit 1 when one fails):
//! - (a) DiLoCo fp32 with `W` workers ends at a lower eval loss than 1 worker;
//! - (b) DiLoCo uint8 ends within 1% (relative) of DiLoCo fp32's eval loss;
//! - and every DiLoCo replica held bit-identical outer weights after every outer step.
//!
//! Size: the four trainings of the benchmark and the checks of the papers' claims read as one
//! experiment; its report type and its plan share the settings above.

use crate::cli::QualityBench;
use anyhow::Result;
use serde::Serialize;
use std::io::Write;

#[cfg(feature = "torch")]
use loco_real::{
    data::{DataLoader, DataPosition, DataSource, Order, Shard},
    train::{TrainConfig, Trainer},
};

/// Percentage of the text's sequences held out for evaluation (the last ones in the file).
#[cfg(feature = "torch")]
const HOLDOUT_PERCENT: u64 = 5;
/// Rows per evaluation forward pass.
#[cfg(feature = "torch")]
const EVAL_ROWS: usize = 32;
/// Claim (b): uint8's final eval loss within this relative distance of fp32's.
#[cfg(feature = "torch")]
const UINT8_TOLERANCE: f64 = 0.01;
/// Claim (c): a `--mode` run's final eval loss within this relative distance of sync fp32's.
#[cfg(feature = "torch")]
const MODE_TOLERANCE: f64 = 0.01;
/// Largest `--workers` accepted.
#[cfg(feature = "torch")]
const MAX_WORKERS: usize = 64;
/// Largest `--batch-rows` accepted (one forward pass holds `rows x 64 x 256` logits).
#[cfg(feature = "torch")]
const MAX_BATCH_ROWS: usize = 1024;
/// Largest number of inner steps per run accepted.
#[cfg(feature = "torch")]
const MAX_STEPS: u64 = 10_000_000;

/// The figures of one benchmark (the JSON of `--json`).
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(not(feature = "torch"), allow(dead_code))]
pub(crate) struct QualityReport {
    /// The model preset.
    pub(crate) model: &'static str,
    /// Its parameter count.
    pub(crate) params: usize,
    /// The text trained on, as given.
    pub(crate) data: String,
    /// Sequences in the training set (all shards).
    pub(crate) train_sequences: u64,
    /// Held-out sequences (every one is evaluated).
    pub(crate) eval_sequences: u64,
    /// Tokens predicted per sequence.
    pub(crate) seq_len: usize,
    /// Sequences per inner step per worker.
    pub(crate) batch_rows: usize,
    /// Peak inner AdamW learning rate.
    pub(crate) inner_lr: f64,
    /// Linear warmup of the inner rate, in steps.
    pub(crate) warmup_steps: u64,
    /// Steps of one worker the runs started from (0: from the initial weights).
    pub(crate) pretrain_steps: u64,
    /// Outer learning rate of the DiLoCo runs.
    pub(crate) outer_lr: f32,
    /// Outer Nesterov momentum of the DiLoCo runs.
    pub(crate) outer_momentum: f32,
    /// DiLoCo (and data-parallel) workers.
    pub(crate) workers: usize,
    /// H: inner steps per outer step.
    pub(crate) inner_steps: u64,
    /// Outer steps.
    pub(crate) outer_steps: u64,
    /// The seed of the weights and of the data order.
    pub(crate) seed: u64,
    /// The four runs, in the order of the module docs, with the `--also-codec` runs after uint8's.
    pub(crate) runs: Vec<RunReport>,
    /// Each `--also-codec` run's final eval loss relative to DiLoCo fp32's, minus 1 (no claim).
    pub(crate) also_vs_fp32: Vec<AlsoCodec>,
    /// Each `--mode` run against sync DiLoCo fp32 (claim (c)).
    pub(crate) modes: Vec<ModeClaim>,
    /// The claims checked (DiLoCo against plain data parallelism, the codecs, the modes).
    pub(crate) claims: Claims,
    /// Wall time of the whole benchmark.
    pub(crate) seconds: f64,
}

/// An `--also-codec` run, compared with DiLoCo fp32.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(not(feature = "torch"), allow(dead_code))]
pub(crate) struct AlsoCodec {
    /// The codec's name.
    pub(crate) codec: String,
    /// Its final eval loss relative to fp32's, minus 1.
    pub(crate) vs_fp32: f64,
}

/// A `--mode` run (overlapped or streaming DiLoCo), compared with sync DiLoCo fp32.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(not(feature = "torch"), allow(dead_code))]
pub(crate) struct ModeClaim {
    /// The run's name.
    pub(crate) run: String,
    /// Its final eval loss relative to sync fp32's, minus 1.
    pub(crate) vs_sync_fp32: f64,
    /// Within the tolerance.
    pub(crate) holds: bool,
    /// The tolerance.
    pub(crate) tolerance: f64,
}

/// One training run.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(not(feature = "torch"), allow(dead_code))]
pub(crate) struct RunReport {
    /// Short name: `single`, `diloco-fp32`, `diloco-uint8` (`diloco-int8-block`, ...),
    /// `data-parallel`.
    pub(crate) name: String,
    /// Workers whose compute it uses.
    pub(crate) workers: usize,
    /// Inner (optimiser) steps per worker.
    pub(crate) steps_per_worker: u64,
    /// Compute: forward-backward passes over `batch_rows` sequences, all workers together.
    pub(crate) compute_batches: u64,
    /// Tokens trained on, all workers together.
    pub(crate) tokens: u64,
    /// Synchronisations (all-reduces).
    pub(crate) sync_rounds: u64,
    /// Bytes each worker sent, in all (the largest over workers).
    pub(crate) bytes_per_worker: u64,
    /// True when `bytes_per_worker` is the ring formula, not a measurement.
    pub(crate) bytes_estimated: bool,
    /// Eval loss (mean cross-entropy in nats per byte on the held-out set) at the end.
    pub(crate) final_eval_loss: f64,
    /// Mean training loss of the last `H` inner steps (all workers).
    pub(crate) final_train_loss: f64,
    /// Eval loss at step 0 and after every `H` steps.
    pub(crate) curve: Vec<CurvePoint>,
    /// False when DiLoCo replicas ever held different outer weights.
    pub(crate) replicas_identical: bool,
    /// Wall time of the run.
    pub(crate) seconds: f64,
}

/// The eval loss after `step` inner steps per worker.
#[derive(Clone, Copy, Debug, Serialize)]
#[cfg_attr(not(feature = "torch"), allow(dead_code))]
pub(crate) struct CurvePoint {
    /// Inner steps per worker taken.
    pub(crate) step: u64,
    /// Eval loss there.
    pub(crate) eval_loss: f64,
}

/// The claims checked on the final eval losses.
#[derive(Clone, Copy, Debug, Serialize)]
#[cfg_attr(not(feature = "torch"), allow(dead_code))]
pub(crate) struct Claims {
    /// (a): DiLoCo fp32 ends below 1 worker.
    pub(crate) diloco_beats_single: bool,
    /// DiLoCo fp32's final eval loss relative to 1 worker's, minus 1 (negative: better).
    pub(crate) diloco_vs_single: f64,
    /// (b): uint8 ends within 1% of fp32.
    pub(crate) uint8_within_tolerance: bool,
    /// uint8's final eval loss relative to fp32's, minus 1.
    pub(crate) uint8_vs_fp32: f64,
    /// The tolerance of (b).
    pub(crate) uint8_tolerance: f64,
    /// Every DiLoCo replica held bit-identical outer weights after every outer step.
    pub(crate) replicas_identical: bool,
}

impl QualityReport {
    /// True when (a), (b) and replica identity all hold.
    pub(crate) fn claims_hold(&self) -> bool {
        let c = &self.claims;
        c.diloco_beats_single
            && c.uint8_within_tolerance
            && c.replicas_identical
            && self.modes.iter().all(|m| m.holds)
    }

    /// Prints the results table, the eval curves and the claims.
    pub(crate) fn print_table(&self, out: &mut impl Write) -> std::io::Result<()> {
        writeln!(
            out,
            "DiLoCo quality: {} model ({} parameters), {}, seed {}",
            self.model, self.params, self.data, self.seed
        )?;
        writeln!(
            out,
            "  {} training sequences, {} held out ({} tokens); seq {}, {} rows per step, \
             inner AdamW lr {} (warmup {}), outer Nesterov lr {} m {}",
            self.train_sequences,
            self.eval_sequences,
            self.eval_sequences * self.seq_len as u64,
            self.seq_len,
            self.batch_rows,
            self.inner_lr,
            self.warmup_steps,
            self.outer_lr,
            self.outer_momentum
        )?;
        if self.pretrain_steps > 0 {
            writeln!(
                out,
                "  every run starts from 1 worker's {} steps (eval loss and steps below count \
                 from there)",
                self.pretrain_steps
            )?;
        }
        writeln!(out)?;
        writeln!(
            out,
            "{:<18} {:>7} {:>11} {:>9} {:>6} {:>13} {:>10} {:>10} {:>8} {:>7}",
            "run",
            "workers",
            "steps/wkr",
            "compute",
            "syncs",
            "bytes/worker",
            "train loss",
            "eval loss",
            "eval ppl",
            "time"
        )?;
        for r in &self.runs {
            let bytes = if r.bytes_estimated {
                format!("~{}", crate::human::bytes(r.bytes_per_worker))
            } else {
                crate::human::bytes(r.bytes_per_worker)
            };
            writeln!(
                out,
                "{:<18} {:>7} {:>11} {:>9} {:>6} {:>13} {:>10.4} {:>10.4} {:>8.3} {:>6.1}s",
                r.name,
                r.workers,
                r.steps_per_worker,
                r.compute_batches,
                r.sync_rounds,
                bytes,
                r.final_train_loss,
                r.final_eval_loss,
                r.final_eval_loss.exp(),
                r.seconds
            )?;
        }
        writeln!(out)?;
        write!(out, "eval loss by step {:>5}", "step")?;
        for r in &self.runs {
            write!(out, " {:>17}", r.name)?;
        }
        writeln!(out)?;
        let points = self.runs.iter().map(|r| r.curve.len()).min().unwrap_or(0);
        for i in 0..points {
            write!(out, "{:>23}", self.runs[0].curve[i].step)?;
            for r in &self.runs {
                write!(out, " {:>17.4}", r.curve[i].eval_loss)?;
            }
            writeln!(out)?;
        }
        writeln!(out)?;
        let c = &self.claims;
        let verdict = |ok: bool| if ok { "holds" } else { "FAILS" };
        writeln!(
            out,
            "(a) DiLoCo W={} fp32 ends below 1 worker: {:+.2}%: {}",
            self.workers,
            100.0 * c.diloco_vs_single,
            verdict(c.diloco_beats_single)
        )?;
        writeln!(
            out,
            "(b) uint8 within {:.0}% of fp32: {:+.3}%: {}",
            100.0 * c.uint8_tolerance,
            100.0 * c.uint8_vs_fp32,
            verdict(c.uint8_within_tolerance)
        )?;
        for a in &self.also_vs_fp32 {
            writeln!(out, "    {} against fp32 (no claim): {:+.3}%", a.codec, 100.0 * a.vs_fp32)?;
        }
        for m in &self.modes {
            writeln!(
                out,
                "(c) {} within {:.0}% of sync fp32 at equal tokens: {:+.3}%: {}",
                m.run,
                100.0 * m.tolerance,
                100.0 * m.vs_sync_fp32,
                verdict(m.holds)
            )?;
        }
        writeln!(
            out,
            "    DiLoCo replicas bit-identical after every outer step: {}",
            verdict(c.replicas_identical)
        )?;
        writeln!(out, "total time {:.1} s", self.seconds)
    }
}

/// Without libtorch there is nothing to train.
#[cfg(not(feature = "torch"))]
pub(crate) fn run(_args: &QualityBench) -> Result<QualityReport> {
    Err(crate::InputError(anyhow::anyhow!(
        "bench quality trains the tiny model with libtorch: this loco was built without it; \
         rebuild with `--features torch` (see README)"
    ))
    .into())
}

/// The DiLoCo settings of a `--mode` run of `inner_steps` inner steps per outer step (its
/// rounds, syncs and schedule), as a scenario's `[diloco]` would give them.
#[cfg(feature = "torch")]
fn mode_spec(
    inner_steps: u64,
    mode: loco_core::diloco::Mode,
    fragments: u32,
    mix: f32,
    sync_delay: Option<u64>,
) -> Result<loco_core::scenario::DilocoSpec, String> {
    let mut spec = loco_core::scenario::DilocoSpec { inner_steps, ..Default::default() };
    let fragments = (mode == loco_core::diloco::Mode::Streaming).then_some(fragments);
    spec.set_mode(mode, fragments, Some(f64::from(mix)), sync_delay)?;
    Ok(spec)
}

/// Refuses flags out of range, naming the flag and what it expects.
#[cfg(feature = "torch")]
fn check_args(args: &QualityBench) -> Result<()> {
    let bad = |flag: &str, expected: &str| -> anyhow::Error {
        crate::InputError(anyhow::anyhow!("{flag}: expected {expected}")).into()
    };
    if args.workers == 0 || args.workers > MAX_WORKERS {
        return Err(bad("--workers", &format!("1 ..= {MAX_WORKERS}")));
    }
    if args.inner_steps == 0 {
        return Err(bad("--inner-steps", "at least 1"));
    }
    if args.outer_steps == 0 {
        return Err(bad("--outer-steps", "at least 1"));
    }
    if args.inner_steps.checked_mul(args.outer_steps).is_none_or(|t| t > MAX_STEPS) {
        return Err(bad("--inner-steps x --outer-steps", &format!("at most {MAX_STEPS} steps")));
    }
    if !(0.0..1.0).contains(&args.mix) {
        return Err(bad("--mix", "a value in [0, 1)"));
    }
    let streams = args.modes.contains(&loco_core::diloco::Mode::Streaming);
    if streams
        && (args.fragments == 0 || !args.inner_steps.is_multiple_of(u64::from(args.fragments)))
    {
        return Err(bad("--fragments", "a divisor of --inner-steps, at least 1"));
    }
    if let Some(d) = args.sync_delay {
        for &m in &args.modes {
            if let Err(e) = mode_spec(args.inner_steps, m, args.fragments, args.mix, Some(d)) {
                return Err(bad("--sync-delay", &format!("in {m} mode: {e}")));
            }
        }
    }
    if args.pretrain_steps > MAX_STEPS {
        return Err(bad("--pretrain-steps", &format!("at most {MAX_STEPS}")));
    }
    if args.batch_rows == 0 || args.batch_rows > MAX_BATCH_ROWS {
        return Err(bad("--batch-rows", &format!("1 ..= {MAX_BATCH_ROWS}")));
    }
    if !(args.inner_lr.is_finite() && args.inner_lr > 0.0) {
        return Err(bad("--inner-lr", "a finite rate > 0"));
    }
    if !(args.outer_lr.is_finite() && args.outer_lr > 0.0) {
        return Err(bad("--outer-lr", "a finite rate > 0"));
    }
    if !(0.0..1.0).contains(&args.outer_momentum) {
        return Err(bad("--outer-momentum", "a value in [0, 1)"));
    }
    Ok(())
}

/// Runs the four trainings and checks the claims (see the module docs).
#[cfg(feature = "torch")]
pub(crate) fn run(args: &QualityBench) -> Result<QualityReport> {
    use loco_core::codec::CodecKind;
    use loco_core::scenario::{DilocoSpec, Preset, RealSpec};
    check_args(args)?;
    let started = crate::clock::now();
    tch::set_num_threads(1);
    let spec = Preset::Tiny.spec();
    // tiny-real.toml's inner settings, with `batch_rows` rows of the model's 64 tokens.
    let seq_len = spec.seq_len as usize;
    let diloco = DilocoSpec {
        inner_lr: args.inner_lr,
        warmup_steps: 10,
        batch_tokens: (args.batch_rows * seq_len) as u64,
        ..DilocoSpec::default()
    };
    let real = RealSpec { micro_batch: args.batch_rows as u32, ..RealSpec::default() };
    let cfg = TrainConfig::from_scenario(&spec, &diloco, &real);
    let source = DataSource::File(args.data.clone());
    let sequences = DataLoader::new(&source, seq_len, spec.vocab, Shard::WHOLE, Order::Sequential)
        .map_err(|e| crate::InputError(anyhow::anyhow!("{e}")))?
        .sequences();
    let eval_sequences = (sequences * HOLDOUT_PERCENT).div_ceil(100);
    // One sequence between the sets is dropped: it shares its last token with the first
    // held-out sequence's first.
    let train_sequences = sequences.saturating_sub(eval_sequences + 1);
    if train_sequences < args.workers as u64 || eval_sequences == 0 {
        return Err(crate::InputError(anyhow::anyhow!(
            "{}: {sequences} sequences of {} tokens: too few to hold out {HOLDOUT_PERCENT}% and \
             give each of {} workers a training sequence",
            args.data.display(),
            seq_len + 1,
            args.workers
        ))
        .into());
    }
    let eval = eval_batches(&source, seq_len, spec.vocab, sequences - eval_sequences)?;
    let mut plan = Plan {
        spec: &spec,
        cfg: &cfg,
        source: &source,
        train_sequences,
        eval: &eval,
        workers: args.workers,
        inner_steps: args.inner_steps,
        outer_steps: args.outer_steps,
        seed: args.seed,
        outer: loco_core::diloco::OuterConfig {
            lr: args.outer_lr,
            momentum: args.outer_momentum,
            nesterov: true,
            feedback: None,
        },
        ef_outer: (
            args.ef_outer_lr.unwrap_or(args.outer_lr),
            args.ef_outer_momentum.unwrap_or(args.outer_momentum),
        ),
        start: None,
    };
    let start = plan.pretrain(args.pretrain_steps)?;
    plan.start = start.as_ref();
    let single = plan.single()?;
    let fp32 = plan.diloco(CodecKind::Fp32)?;
    let uint8 = plan.diloco(CodecKind::Uint8)?;
    let (also_codecs, also) = also_runs(&plan, args)?;
    let mut modes: Vec<loco_core::diloco::Mode> = Vec::new();
    for &m in &args.modes {
        if m != loco_core::diloco::Mode::Sync && !modes.contains(&m) {
            modes.push(m);
        }
    }
    let mode_runs = modes
        .iter()
        .map(|&m| plan.diloco_mode(m, args.mode_codec, args.fragments, args.mix, args.sync_delay))
        .collect::<Result<Vec<_>>>()?;
    let dp = plan.data_parallel()?;
    let (claims, mode_claims, also_vs_fp32) =
        judge(&single, &fp32, &uint8, &also_codecs, &also, &mode_runs);
    let mut runs = vec![single, fp32, uint8];
    runs.extend(also);
    runs.extend(mode_runs);
    runs.push(dp);
    Ok(QualityReport {
        model: Preset::Tiny.name(),
        params: plan.params(),
        data: args.data.display().to_string(),
        train_sequences,
        eval_sequences,
        seq_len,
        batch_rows: args.batch_rows,
        inner_lr: args.inner_lr,
        warmup_steps: diloco.warmup_steps,
        pretrain_steps: args.pretrain_steps,
        outer_lr: args.outer_lr,
        outer_momentum: args.outer_momentum,
        workers: args.workers,
        inner_steps: args.inner_steps,
        outer_steps: args.outer_steps,
        seed: args.seed,
        runs,
        also_vs_fp32,
        modes: mode_claims,
        claims,
        seconds: crate::clock::now().duration_since(started).as_secs_f64(),
    })
}

/// The `--also-codec` runs (fp32 and uint8 run anyway), each with its label: a gathering codec
/// runs with error feedback and without, to show what it buys.
#[cfg(feature = "torch")]
fn also_runs(plan: &Plan<'_>, args: &QualityBench) -> Result<(Vec<String>, Vec<RunReport>)> {
    use loco_core::codec::CodecKind;
    let mut codecs: Vec<CodecKind> = Vec::new();
    for &c in &args.also_codec {
        if !matches!(c, CodecKind::Fp32 | CodecKind::Uint8) && !codecs.contains(&c) {
            codecs.push(c);
        }
    }
    let mut runs: Vec<(String, CodecKind, Option<f32>)> = Vec::new();
    for &c in &codecs {
        if c.sums_in_ring() {
            runs.push((c.to_string(), c, None));
        } else {
            runs.push((c.to_string(), c, Some(args.error_feedback)));
            runs.push((format!("{c}, no error feedback"), c, None));
        }
    }
    let reports =
        runs.iter().map(|(_, c, ef)| plan.diloco_with(*c, *ef)).collect::<Result<Vec<_>>>()?;
    Ok((runs.into_iter().map(|(l, ..)| l).collect(), reports))
}

/// The claims of the module docs, judged on the runs' final held-out losses: DiLoCo against
/// one worker, uint8 against fp32, each `--also-codec` and each `--mode` against sync fp32.
#[cfg(feature = "torch")]
fn judge(
    single: &RunReport,
    fp32: &RunReport,
    uint8: &RunReport,
    also_codecs: &[String],
    also: &[RunReport],
    mode_runs: &[RunReport],
) -> (Claims, Vec<ModeClaim>, Vec<AlsoCodec>) {
    let diloco_vs_single = fp32.final_eval_loss / single.final_eval_loss - 1.0;
    let uint8_vs_fp32 = uint8.final_eval_loss / fp32.final_eval_loss - 1.0;
    let claims = Claims {
        diloco_beats_single: fp32.final_eval_loss < single.final_eval_loss,
        diloco_vs_single,
        uint8_within_tolerance: uint8_vs_fp32.abs() <= UINT8_TOLERANCE,
        uint8_vs_fp32,
        uint8_tolerance: UINT8_TOLERANCE,
        replicas_identical: fp32.replicas_identical
            && uint8.replicas_identical
            && also.iter().all(|r| r.replicas_identical)
            && mode_runs.iter().all(|r| r.replicas_identical),
    };
    let mode_claims = mode_runs
        .iter()
        .map(|r| {
            let vs = r.final_eval_loss / fp32.final_eval_loss - 1.0;
            ModeClaim {
                run: r.name.clone(),
                vs_sync_fp32: vs,
                holds: vs.abs() <= MODE_TOLERANCE,
                tolerance: MODE_TOLERANCE,
            }
        })
        .collect();
    let also_vs_fp32 = also_codecs
        .iter()
        .zip(also)
        .map(|(c, r)| AlsoCodec {
            codec: c.clone(),
            vs_fp32: r.final_eval_loss / fp32.final_eval_loss - 1.0,
        })
        .collect();
    (claims, mode_claims, also_vs_fp32)
}

/// The held-out set from sequence `first` to the end, in batches of at most [`EVAL_ROWS`].
#[cfg(feature = "torch")]
fn eval_batches(
    source: &DataSource,
    seq_len: usize,
    vocab: u32,
    first: u64,
) -> Result<Vec<Vec<i64>>> {
    let mut loader = DataLoader::new(source, seq_len, vocab, Shard::WHOLE, Order::Sequential)?;
    let total = loader.sequences();
    loader.seek(DataPosition { epoch: 0, offset: first })?;
    let mut batches = Vec::new();
    let mut left = total - first;
    while left > 0 {
        let rows = (EVAL_ROWS as u64).min(left);
        batches.push(loader.next_batch(rows as usize)?);
        left -= rows;
    }
    Ok(batches)
}

/// What every run shares.
#[cfg(feature = "torch")]
#[derive(Clone, Copy)]
struct Plan<'a> {
    spec: &'a loco_core::scenario::ModelSpec,
    cfg: &'a TrainConfig,
    source: &'a DataSource,
    train_sequences: u64,
    eval: &'a [Vec<i64>],
    workers: usize,
    inner_steps: u64,
    outer_steps: u64,
    seed: u64,
    outer: loco_core::diloco::OuterConfig,
    /// The outer learning rate and momentum of the runs with error feedback.
    ef_outer: (f32, f32),
    /// The state every run starts from, after pretraining.
    start: Option<&'a loco_real::train::TrainerState>,
}

/// A loader of one shard of the training set: the sequences of the shuffled order whose index is
/// below `limit` (the held-out ones are skipped).
#[cfg(feature = "torch")]
struct TrainLoader {
    loader: DataLoader,
    limit: u64,
    scratch: Vec<i64>,
}

#[cfg(feature = "torch")]
impl TrainLoader {
    fn new(plan: &Plan<'_>, shard: Shard) -> Result<TrainLoader> {
        let loader = DataLoader::new(
            plan.source,
            plan.cfg.seq_len,
            plan.spec.vocab,
            shard,
            Order::Shuffled { seed: plan.seed },
        )?;
        Ok(TrainLoader { loader, limit: plan.train_sequences, scratch: Vec::new() })
    }

    /// Appends the next `rows` training sequences to `out`.
    fn next_into(&mut self, rows: usize, out: &mut Vec<i64>) -> Result<()> {
        let mut skipped = 0;
        let mut taken = 0;
        while taken < rows {
            let k = self.loader.sequence_index(self.loader.position());
            if k < self.limit {
                self.loader.next_sequence_into(out)?;
                taken += 1;
                skipped = 0;
            } else {
                self.scratch.clear();
                self.loader.next_sequence_into(&mut self.scratch)?;
                skipped += 1;
                // Two epochs of the shard without a training sequence: there is none.
                anyhow::ensure!(
                    skipped <= 2 * self.loader.per_epoch(),
                    "shard {} of {} holds no training sequence",
                    self.loader.shard().index,
                    self.loader.shard().count
                );
            }
        }
        Ok(())
    }
}

/// Collects the figures of a run as it goes.
#[cfg(feature = "torch")]
struct Recorder {
    name: &'static str,
    started: std::time::Instant,
    curve: Vec<CurvePoint>,
    window_loss: f64,
    window_count: u64,
}

#[cfg(feature = "torch")]
impl Recorder {
    fn new(name: &'static str) -> Recorder {
        Recorder {
            name,
            started: crate::clock::now(),
            curve: Vec::new(),
            window_loss: 0.0,
            window_count: 0,
        }
    }

    fn train_loss(&mut self, loss: f64) {
        self.window_loss += loss;
        self.window_count += 1;
    }

    /// Records the eval loss after `step` steps and prints progress; returns the mean training
    /// loss since the previous call.
    fn checkpoint(&mut self, step: u64, eval_loss: f64, of: u64) -> f64 {
        let train = if self.window_count > 0 {
            self.window_loss / self.window_count as f64
        } else {
            f64::NAN
        };
        self.window_loss = 0.0;
        self.window_count = 0;
        self.curve.push(CurvePoint { step, eval_loss });
        let secs = crate::clock::now().duration_since(self.started).as_secs_f64();
        if step == 0 {
            eprintln!("{}: step 0/{of}: eval {eval_loss:.4}", self.name);
        } else {
            eprintln!(
                "{}: step {step}/{of}: train {train:.4}, eval {eval_loss:.4} ({secs:.1} s)",
                self.name
            );
        }
        train
    }

    fn seconds(&self) -> f64 {
        crate::clock::now().duration_since(self.started).as_secs_f64()
    }
}

#[cfg(feature = "torch")]
impl Plan<'_> {
    fn total_steps(&self) -> u64 {
        self.inner_steps * self.outer_steps
    }

    fn params(&self) -> usize {
        loco_real::model::param_layout(self.spec).iter().map(|(_, n)| n).sum()
    }

    fn trainer(&self, cfg: TrainConfig) -> Result<Trainer> {
        let mut t = Trainer::new(self.spec, cfg, tch::Device::Cpu, self.seed)?;
        if let Some(s) = self.start {
            t.import_state(s)?;
        }
        Ok(t)
    }

    /// `steps` steps of one worker on the whole training set, in an order of its own; `None`
    /// for 0 steps.
    fn pretrain(&self, steps: u64) -> Result<Option<loco_real::train::TrainerState>> {
        if steps == 0 {
            return Ok(None);
        }
        let mut rec = Recorder::new("pretrain");
        let mut t = self.trainer(self.cfg.clone())?;
        let mut data = TrainLoader::new(&Plan { seed: !self.seed, ..*self }, Shard::WHOLE)?;
        let mut batch = Vec::new();
        for _ in 0..steps {
            batch.clear();
            data.next_into(self.cfg.batch_rows, &mut batch)?;
            rec.train_loss(t.inner_step(&batch)?.loss);
        }
        rec.checkpoint(steps, self.eval_loss(&t)?, steps);
        Ok(Some(t.export_state()?))
    }

    /// Mean cross-entropy over the held-out set.
    fn eval_loss(&self, t: &Trainer) -> Result<f64> {
        let row = self.cfg.seq_len + 1;
        let (mut total, mut rows) = (0.0, 0usize);
        for b in self.eval {
            let n = b.len() / row;
            total += t.eval_loss(b)? * n as f64;
            rows += n;
        }
        Ok(total / rows.max(1) as f64)
    }

    /// Run 1: one trainer on the whole training set.
    fn single(&self) -> Result<RunReport> {
        let mut rec = Recorder::new("single");
        let mut t = self.trainer(self.cfg.clone())?;
        let mut data = TrainLoader::new(self, Shard::WHOLE)?;
        let total = self.total_steps();
        rec.checkpoint(0, self.eval_loss(&t)?, total);
        let mut batch = Vec::new();
        let mut last_train = f64::NAN;
        for step in 1..=total {
            batch.clear();
            data.next_into(self.cfg.batch_rows, &mut batch)?;
            rec.train_loss(t.inner_step(&batch)?.loss);
            if step % self.inner_steps == 0 {
                last_train = rec.checkpoint(step, self.eval_loss(&t)?, total);
            }
        }
        Ok(RunReport {
            name: "single".into(),
            workers: 1,
            steps_per_worker: total,
            compute_batches: total,
            tokens: total * (self.cfg.batch_rows * self.cfg.seq_len) as u64,
            sync_rounds: 0,
            bytes_per_worker: 0,
            bytes_estimated: false,
            final_eval_loss: rec.curve.last().map_or(f64::NAN, |p| p.eval_loss),
            final_train_loss: last_train,
            curve: rec.curve.clone(),
            replicas_identical: true,
            seconds: rec.seconds(),
        })
    }

    /// Runs 2 and 3: DiLoCo with `codec`.
    fn diloco(&self, codec: loco_core::codec::CodecKind) -> Result<RunReport> {
        self.diloco_with(codec, None)
    }

    /// DiLoCo with `codec` and error feedback of decay `feedback` (the `--also-codec` runs):
    /// each worker contributes `beta * residual + pseudo-gradient` and keeps what its codec did
    /// not send, as a node does ([`OuterState::add_residual`](loco_core::diloco::OuterState::add_residual)).
    fn diloco_with(
        &self,
        codec: loco_core::codec::CodecKind,
        feedback: Option<f32>,
    ) -> Result<RunReport> {
        use loco_core::diloco::{OuterState, SentContribution, buckets_from_sizes};
        let name = match feedback {
            Some(_) => format!("diloco-{}-ef", codec.name()),
            None => format!("diloco-{}", codec.name()),
        };
        let mut rec = Recorder::new("diloco");
        let w = self.workers;
        let mut trainers =
            (0..w).map(|_| self.trainer(self.cfg.clone())).collect::<Result<Vec<_>>>()?;
        let mut data = (0..w)
            .map(|i| TrainLoader::new(self, Shard::new(i as u32, w as u32)?))
            .collect::<Result<Vec<_>>>()?;
        let init = trainers[0].flat_params()?;
        let buckets = buckets_from_sizes(trainers[0].param_layout());
        let outer_cfg = match feedback {
            Some(_) => loco_core::diloco::OuterConfig {
                feedback,
                lr: self.ef_outer.0,
                momentum: self.ef_outer.1,
                ..self.outer
            },
            None => self.outer,
        };
        let mut outers = (0..w)
            .map(|_| OuterState::new(outer_cfg, init.clone(), buckets.clone()))
            .collect::<Result<Vec<_>, _>>()?;
        let total = self.total_steps();
        rec.checkpoint(0, self.eval_loss(&trainers[0])?, total);
        let mut batch = Vec::new();
        let mut inner = vec![0.0f32; init.len()];
        let mut bytes = 0u64;
        let mut identical = true;
        let mut last_train = f64::NAN;
        for outer_step in 0..self.outer_steps {
            for ((t, d), o) in trainers.iter_mut().zip(&mut data).zip(&mut outers) {
                for _ in 0..self.inner_steps {
                    batch.clear();
                    d.next_into(self.cfg.batch_rows, &mut batch)?;
                    rec.train_loss(t.inner_step(&batch)?.loss);
                }
                t.flat_params_into(&mut inner)?;
                o.compute_pseudo_gradient(&inner)?;
                o.add_residual();
            }
            // What each worker's codec sends (a gathering ring sends the whole contribution
            // in segments of the default size): error feedback keeps the rest. Every worker's
            // contribution counts here, so the residual is taken before the average.
            if feedback.is_some() && !codec.sums_in_ring() {
                let seg = loco_core::allreduce::DEFAULT_SEGMENT_ELEMS;
                for o in outers.iter_mut() {
                    let sent = SentContribution::encode(codec, o.pseudo_gradient(), seg);
                    o.keep_residual(&sent);
                }
            }
            bytes += average(&mut outers, codec, outer_step)?;
            for (t, o) in trainers.iter_mut().zip(&mut outers) {
                o.apply_outer_step();
                t.set_flat_params(o.outer())?;
            }
            identical &= outers.iter().all(|o| {
                o.outer().iter().zip(outers[0].outer()).all(|(a, b)| a.to_bits() == b.to_bits())
            });
            let step = (outer_step + 1) * self.inner_steps;
            last_train = rec.checkpoint(step, self.eval_loss(&trainers[0])?, total);
        }
        Ok(RunReport {
            name,
            workers: w,
            steps_per_worker: total,
            compute_batches: total * w as u64,
            tokens: total * w as u64 * (self.cfg.batch_rows * self.cfg.seq_len) as u64,
            sync_rounds: self.outer_steps,
            bytes_per_worker: bytes,
            bytes_estimated: false,
            final_eval_loss: rec.curve.last().map_or(f64::NAN, |p| p.eval_loss),
            final_train_loss: last_train,
            curve: rec.curve.clone(),
            replicas_identical: identical,
            seconds: rec.seconds(),
        })
    }

    /// A `--mode` run: DiLoCo in overlap or streaming `mode` with `codec`, on the node
    /// machine's arithmetic ([`OuterState::overlap_round`](loco_core::diloco::OuterState::overlap_round),
    /// [`apply_outer_step_to`](loco_core::diloco::OuterState::apply_outer_step_to)): rounds of
    /// `H / P` inner steps (`H` in overlap mode); the all-reduce of round `r`'s fragment lands
    /// during round `r + 1` and is merged at its end. The curve evaluates the global weights;
    /// the final point, after a flush (`P` rounds of no inner steps, which synchronise the
    /// progress every fragment still holds: communication, no compute), so that the run is
    /// compared at equal tokens with every step of it counted.
    fn diloco_mode(
        &self,
        mode: loco_core::diloco::Mode,
        codec: loco_core::codec::CodecKind,
        fragments: u32,
        mix: f32,
        sync_delay: Option<u64>,
    ) -> Result<RunReport> {
        use loco_core::diloco::{OuterState, buckets_from_sizes};
        // Rounds of `round_steps` inner steps, `p` per outer step, a sync every `every` rounds
        // (the others all-reduce nothing).
        let spec = mode_spec(self.inner_steps, mode, fragments, mix, sync_delay)
            .map_err(|e| crate::InputError(anyhow::anyhow!("--mode {mode}: {e}")))?;
        let (round_steps, p, every) =
            (spec.round_steps(), spec.rounds_per_step(), spec.sync_every());
        let name = match every {
            1 => format!("{mode}-{codec}"),
            _ => format!("{mode}-{codec}-delay{round_steps}"),
        };
        let mut rec = Recorder::new("mode");
        let w = self.workers;
        let mut trainers =
            (0..w).map(|_| self.trainer(self.cfg.clone())).collect::<Result<Vec<_>>>()?;
        let mut data = (0..w)
            .map(|i| TrainLoader::new(self, Shard::new(i as u32, w as u32)?))
            .collect::<Result<Vec<_>>>()?;
        let init = trainers[0].flat_params()?;
        let layout = trainers[0].param_layout();
        let layers: Vec<usize> = layout.iter().map(|(_, n)| *n).collect();
        let schedule = spec.schedule(init.len(), &layers);
        let buckets = buckets_from_sizes(layout);
        let mut outers = (0..w)
            .map(|_| OuterState::new(self.outer, init.clone(), buckets.clone()))
            .collect::<Result<Vec<_>, _>>()?;
        outers.iter_mut().for_each(OuterState::anchor_here);
        let total = self.total_steps();
        rec.checkpoint(0, self.eval_loss(&trainers[0])?, total);
        let mut batch = Vec::new();
        let mut inner = vec![0.0f32; init.len()];
        let (mut bytes, mut identical, mut last_train) = (0u64, true, f64::NAN);
        let mut in_flight: Option<(std::ops::Range<usize>, Vec<Vec<f32>>)> = None;
        let rounds = self.outer_steps * p;
        // The rounds that train, then `p` that only synchronise (the flush).
        for round in 0..rounds + p {
            let steps = if round < rounds { round_steps } else { 0 };
            let mut sent = Vec::with_capacity(w);
            // The all-reduce of the round before, which ran beside this round's inner steps.
            if let Some((f, mut vals)) = in_flight.take() {
                bytes += average_values(&mut vals, codec, round)?;
                for o in &mut outers {
                    o.apply_outer_step_to(f.clone(), &vals[0])?;
                }
                identical &= outers.iter().all(|o| {
                    o.outer().iter().zip(outers[0].outer()).all(|(a, b)| a.to_bits() == b.to_bits())
                });
            }
            let fragment = schedule.fragment(round);
            for ((t, d), o) in trainers.iter_mut().zip(&mut data).zip(&mut outers) {
                for _ in 0..steps {
                    batch.clear();
                    d.next_into(self.cfg.batch_rows, &mut batch)?;
                    rec.train_loss(t.inner_step(&batch)?.loss);
                }
                t.flat_params_into(&mut inner)?;
                let merge = schedule.merged(round);
                o.overlap_round(&mut inner, merge, fragment.clone(), mix, true)?;
                t.set_flat_params(&inner)?;
                sent.push(o.pseudo_gradient()[fragment.clone()].to_vec());
            }
            // A round between two syncs all-reduces nothing.
            in_flight = (!fragment.is_empty()).then_some((fragment, sent));
            // The global weights after every H inner steps (the last point after the flush).
            let done = (round + 1) * round_steps;
            let end_of_step = round < rounds && (round + 1) % p == 0;
            if (end_of_step && round + 1 < rounds) || round + 1 == rounds + p {
                let step = done.min(total);
                let mut eval = self.trainer(self.cfg.clone())?;
                eval.set_flat_params(outers[0].outer())?;
                last_train = rec.checkpoint(step, self.eval_loss(&eval)?, total);
            }
        }
        Ok(RunReport {
            name,
            workers: w,
            steps_per_worker: total,
            compute_batches: total * w as u64,
            tokens: total * w as u64 * (self.cfg.batch_rows * self.cfg.seq_len) as u64,
            sync_rounds: (rounds + p) / every,
            bytes_per_worker: bytes,
            bytes_estimated: false,
            final_eval_loss: rec.curve.last().map_or(f64::NAN, |p| p.eval_loss),
            final_train_loss: last_train,
            curve: rec.curve.clone(),
            replicas_identical: identical,
            seconds: rec.seconds(),
        })
    }

    /// Run 4: one trainer on the `W` shards' batches together (see the module docs).
    fn data_parallel(&self) -> Result<RunReport> {
        let mut rec = Recorder::new("data-parallel");
        let w = self.workers;
        let rows = self.cfg.batch_rows * w;
        // One micro-batch per worker: the gradient is the mean of the workers' (as DDP's).
        let cfg = TrainConfig { batch_rows: rows, ..self.cfg.clone() };
        let mut t = self.trainer(cfg)?;
        let mut data = (0..w)
            .map(|i| TrainLoader::new(self, Shard::new(i as u32, w as u32)?))
            .collect::<Result<Vec<_>>>()?;
        let total = self.total_steps();
        rec.checkpoint(0, self.eval_loss(&t)?, total);
        let mut batch = Vec::new();
        let mut last_train = f64::NAN;
        for step in 1..=total {
            batch.clear();
            for d in &mut data {
                d.next_into(self.cfg.batch_rows, &mut batch)?;
            }
            rec.train_loss(t.inner_step(&batch)?.loss);
            if step % self.inner_steps == 0 {
                last_train = rec.checkpoint(step, self.eval_loss(&t)?, total);
            }
        }
        // One fp32 ring all-reduce of the gradient per step: 2 (W - 1) / W x 4 bytes x params.
        let per_step = 2 * (w as u64 - 1) * 4 * self.params() as u64 / w as u64;
        Ok(RunReport {
            name: "data-parallel".into(),
            workers: w,
            steps_per_worker: total,
            compute_batches: total * w as u64,
            tokens: total * rows as u64 * self.cfg.seq_len as u64,
            sync_rounds: if w > 1 { total } else { 0 },
            bytes_per_worker: per_step * total,
            bytes_estimated: true,
            final_eval_loss: rec.curve.last().map_or(f64::NAN, |p| p.eval_loss),
            final_train_loss: last_train,
            curve: rec.curve.clone(),
            replicas_identical: true,
            seconds: rec.seconds(),
        })
    }
}

/// Averages the pseudo-gradients of `outers` in place with one ring all-reduce over the
/// in-memory transport; returns the largest body bytes any node sent.
#[cfg(feature = "torch")]
fn average(
    outers: &mut [loco_core::diloco::OuterState],
    codec: loco_core::codec::CodecKind,
    op: u64,
) -> Result<u64> {
    ring_average(outers.iter_mut().map(|o| o.pseudo_gradient_mut()).collect(), codec, op)
}

/// [`average`] of plain vectors (a fragment's pseudo-gradients).
#[cfg(feature = "torch")]
fn average_values(
    values: &mut [Vec<f32>],
    codec: loco_core::codec::CodecKind,
    op: u64,
) -> Result<u64> {
    ring_average(values.iter_mut().map(Vec::as_mut_slice).collect(), codec, op)
}

/// One ring all-reduce of `values` (one slice per node, of one length) over the in-memory
/// transport, averaging in place; returns the largest body bytes any node sent.
#[cfg(feature = "torch")]
fn ring_average(
    values: Vec<&mut [f32]>,
    codec: loco_core::codec::CodecKind,
    op: u64,
) -> Result<u64> {
    use loco_core::allreduce::{RingConfig, run_ring};
    use loco_core::ids::{Epoch, NodeId, Weight};
    let ring: Vec<NodeId> = (0..values.len() as u32).map(NodeId).collect();
    let mut endpoints = loco_core::transport::memory::network(&ring);
    let stats = futures::executor::block_on(async {
        let runs = endpoints.iter_mut().zip(values).zip(&ring).map(|((t, v), &me)| {
            let cfg = RingConfig::new(Epoch(1), op, ring.clone(), me, codec);
            let len = v.len();
            run_ring(t, cfg, Some(v), len, Weight::ONE)
        });
        futures::future::join_all(runs).await
    });
    let mut bytes = 0;
    for s in stats {
        bytes = bytes.max(s?.body_bytes_sent);
    }
    Ok(bytes)
}
