//! `loco bench train`: how fast one device trains a preset, and what that means for a scenario.
//!
//! One process, one [`Trainer`](loco_real::train::Trainer) of the chosen preset on the chosen
//! device and precision, fed synthetic tokens (throughput does not depend on what the tokens
//! say). Each step is the whole inner step a worker runs: the forward and backward passes over
//! `batch_rows / micro_batch` micro-batches, the global gradient norm, clipping and AdamW, with
//! the inner settings of a scenario's defaults (`[diloco]`). After `warmup` untimed steps,
//! `steps` timed ones; every step ends by reading its loss and gradient norm back to the host,
//! so on CUDA its time includes all its kernels.
//!
//! Figures:
//! - tokens/s: the timed steps' tokens over their total time;
//! - achieved flops: tokens/s x PRIME's flops per token (`6 N_non_embedding + 12 layers heads
//!   head_dim seq_len`, reference.md), and MFU = that over `--peak-flops`;
//! - the median step time, which is what a scenario's `[[nodes]] step_time` should say for this
//!   batch (so that `replay` predicts what `launch` and `worker` will do);
//! - the process's peak resident memory, next to the memory plan of the device (the plan that
//!   `launch` checks before it starts anything).

use crate::cli::TrainBench;
use anyhow::Result;
use serde::Serialize;
use std::io::Write;

/// What `loco bench train` measured.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct TrainReport {
    /// The preset's name.
    pub(crate) preset: String,
    /// Where it trained.
    pub(crate) device: String,
    /// What it computed in.
    pub(crate) precision: String,
    /// libtorch's intra-op threads.
    pub(crate) torch_threads: i64,
    /// Parameters.
    pub(crate) params: u64,
    /// PRIME's non-embedding parameter count (its flops formula's `N`; with tied embeddings the
    /// shared matrix counts, as it does the output projection).
    pub(crate) non_embedding_params: u64,
    /// PRIME's flops per token at the sequence length trained.
    pub(crate) flops_per_token: u64,
    /// Tokens per sequence.
    pub(crate) seq_len: usize,
    /// Sequences per forward pass.
    pub(crate) micro_batch: usize,
    /// Sequences per inner step.
    pub(crate) batch_rows: usize,
    /// Tokens predicted per inner step.
    pub(crate) tokens_per_step: u64,
    /// Untimed steps before the timed ones.
    pub(crate) warmup_steps: usize,
    /// Seconds of each timed step.
    pub(crate) step_seconds: Vec<f64>,
    /// Their median: a scenario's `step_time` for this batch.
    pub(crate) median_step_seconds: f64,
    /// Timed tokens over timed seconds.
    pub(crate) tokens_per_second: f64,
    /// `tokens_per_second x flops_per_token`.
    pub(crate) achieved_flops: f64,
    /// The peak given with `--peak-flops`.
    pub(crate) peak_flops: Option<f64>,
    /// `achieved_flops / peak_flops`.
    pub(crate) mfu: Option<f64>,
    /// Loss of the first step (warm-up included).
    pub(crate) first_loss: f64,
    /// Loss of the last step.
    pub(crate) last_loss: f64,
    /// Peak resident memory of this process.
    pub(crate) peak_rss_bytes: Option<u64>,
    /// The memory plan on the device, as `launch` prints it.
    pub(crate) memory_plan: String,
    /// Devices of the node (`--gpus`).
    pub(crate) gpus: u32,
    /// With several devices: what each holds between steps, against the plan.
    pub(crate) shards: Vec<ShardFigure>,
    /// With several devices: seconds in each phase over all steps (warm-up included).
    pub(crate) phases: Option<loco_real::sharded::PhaseSeconds>,
}

/// One device's shard of a sharded run, against the memory plan.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct ShardFigure {
    /// The device.
    pub(crate) device: String,
    /// Values of the flat parameter vector it owns.
    pub(crate) values: u64,
    /// Bytes it holds between steps (fp32 weights, gradient and AdamW moments of its shard).
    pub(crate) held_bytes: u64,
    /// The plan's bytes for the same (the largest shard's).
    pub(crate) plan_bytes: u64,
    /// The plan's whole figure per device (with the gathered unit, the checkpoints, the
    /// activations and the temporaries).
    pub(crate) plan_device_bytes: u64,
}

/// What `loco bench train --plan` prints: the memory plan of a node, allocating nothing.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct PlanReport {
    /// The preset's name.
    pub(crate) preset: String,
    /// Parameters.
    pub(crate) params: u64,
    /// The first device.
    pub(crate) device: String,
    /// Devices of the node.
    pub(crate) gpus: u32,
    /// Bytes each device needs.
    pub(crate) per_device_bytes: u64,
    /// Bytes the host needs (with CPU devices, theirs too).
    pub(crate) host_bytes: u64,
    /// The plan, as `launch` prints it.
    pub(crate) plan: String,
}

impl PlanReport {
    /// The human-readable form.
    pub(crate) fn print_table(&self, out: &mut impl Write) -> std::io::Result<()> {
        writeln!(out, "{}", self.plan)?;
        writeln!(
            out,
            "per device: {:.1} GiB; host: {:.1} GiB",
            self.per_device_bytes as f64 / f64::from(1u32 << 30),
            self.host_bytes as f64 / f64::from(1u32 << 30)
        )
    }
}

/// The model: the preset, with `--layers` blocks where given (at the preset's full width).
fn spec_of(a: &TrainBench) -> loco_core::scenario::ModelSpec {
    let spec = a.preset.spec();
    match a.layers {
        Some(layers) => loco_core::scenario::ModelSpec { layers, preset: None, ..spec },
        None => spec,
    }
}

/// The model's name in reports: the preset's, with its layer count where `--layers` changed it.
fn model_name(a: &TrainBench) -> String {
    match a.layers {
        Some(l) => format!("{} ({l} layers)", a.preset),
        None => a.preset.to_string(),
    }
}

/// The checks of the flags shared by the plan and the run; returns (seq_len, batch_rows,
/// precision).
fn settings(a: &TrainBench) -> Result<(usize, usize, loco_core::scenario::Precision)> {
    let bad = |flag: &str, expected: String| -> anyhow::Error {
        crate::InputError(anyhow::anyhow!("{flag}: expected {expected}")).into()
    };
    if a.layers == Some(0) {
        return Err(bad("--layers", "at least 1".into()));
    }
    let spec = spec_of(a);
    let seq_len = a.seq_len.unwrap_or(spec.seq_len as usize);
    if seq_len == 0 || seq_len > spec.seq_len as usize {
        return Err(bad("--seq-len", format!("1 ..= {} (the preset's)", spec.seq_len)));
    }
    if a.micro_batch == 0 {
        return Err(bad("--micro-batch", "at least 1".into()));
    }
    if a.gpus == 0 || a.gpus > 1024 {
        return Err(bad("--gpus", "1 ..= 1024".into()));
    }
    let batch_rows = a.batch_rows.unwrap_or(a.micro_batch * a.gpus as usize);
    if batch_rows == 0 {
        return Err(bad("--batch-rows", "at least 1".into()));
    }
    if a.steps == 0 {
        return Err(bad("--steps", "at least 1".into()));
    }
    if a.threads == Some(0) {
        return Err(bad("--threads", "at least 1".into()));
    }
    if let Some(p) = a.peak_flops
        && !(p.is_finite() && p > 0.0)
    {
        return Err(bad("--peak-flops", "a positive number of flops per second".into()));
    }
    let precision = a.precision.unwrap_or(loco_core::scenario::Precision::default_for(a.device));
    Ok((seq_len, batch_rows, precision))
}

/// The node's memory plan for these flags, without the outer state when `model_only`.
fn memory_plan(a: &TrainBench, model_only: bool) -> Result<loco_real::memory::MemoryPlan> {
    let (seq_len, _, precision) = settings(a)?;
    let plan = loco_real::memory::MemoryPlan::for_node(
        &spec_of(a),
        a.device,
        a.gpus,
        a.micro_batch as u32,
        seq_len as u32,
        precision,
    );
    Ok(if model_only { plan.without_outer_state() } else { plan })
}

/// `loco bench train --plan`: the memory plan of a worker of such a node (its outer state
/// included), allocating nothing.
pub(crate) fn plan(a: &TrainBench) -> Result<PlanReport> {
    use loco_real::memory::Place;
    let plan = memory_plan(a, false)?;
    Ok(PlanReport {
        preset: model_name(a),
        params: plan.params,
        device: a.device.to_string(),
        gpus: a.gpus,
        per_device_bytes: plan.per_device(),
        host_bytes: plan.total(Place::Host),
        plan: plan.to_string(),
    })
}

impl TrainReport {
    /// The human-readable form.
    pub(crate) fn print_table(&self, out: &mut impl Write) -> std::io::Result<()> {
        let best = self.step_seconds.iter().copied().fold(f64::INFINITY, f64::min);
        writeln!(
            out,
            "the {} preset ({:.4e} parameters; PRIME's non-embedding count {:.4e}) on {} in {}, \
             libtorch threads: {}",
            self.preset,
            self.params as f64,
            self.non_embedding_params as f64,
            self.device,
            self.precision,
            self.torch_threads
        )?;
        writeln!(
            out,
            "batch:       {} x {} tokens per inner step, in micro-batches of {}; {} timed steps \
             after {} warm-up",
            self.batch_rows,
            self.seq_len,
            self.micro_batch,
            self.step_seconds.len(),
            self.warmup_steps
        )?;
        writeln!(
            out,
            "step time:   median {:.4} s, best {best:.4} s: a scenario's step_time = \"{}\" \
             for this batch",
            self.median_step_seconds,
            scenario_duration(self.median_step_seconds)
        )?;
        writeln!(
            out,
            "throughput:  {:.0} tokens/s, {} by PRIME's formula ({:.4e} flops per token)",
            self.tokens_per_second,
            flops_rate(self.achieved_flops),
            self.flops_per_token as f64
        )?;
        match (self.mfu, self.peak_flops) {
            (Some(mfu), Some(peak)) => {
                writeln!(out, "MFU:         {:.2}% of {}", mfu * 100.0, flops_rate(peak))?
            }
            _ => writeln!(out, "MFU:         pass --peak-flops (the device's peak) to compute it")?,
        }
        writeln!(
            out,
            "loss:        {:.4} at the first step, {:.4} at the last (synthetic tokens)",
            self.first_loss, self.last_loss
        )?;
        let rss = match self.peak_rss_bytes {
            Some(b) => format!("{:.2} GiB", b as f64 / f64::from(1u32 << 30)),
            None => "unknown".to_owned(),
        };
        writeln!(out, "memory:      peak resident {rss}; plan {}", self.memory_plan)?;
        let g = |b: u64| b as f64 / f64::from(1u32 << 30);
        if let Some(p) = &self.phases {
            let total = (p.gather + p.compute + p.reduce_scatter + p.update).max(f64::MIN_POSITIVE);
            writeln!(
                out,
                "phases:      exchange {:.1}% (gathers {:.3} s, reduce-scatters {:.3} s), \
                 compute {:.1}% ({:.3} s), update {:.1}% ({:.3} s), all steps",
                100.0 * (p.gather + p.reduce_scatter) / total,
                p.gather,
                p.reduce_scatter,
                100.0 * p.compute / total,
                p.compute,
                100.0 * p.update / total,
                p.update
            )?;
        }
        for (d, s) in self.shards.iter().enumerate() {
            writeln!(
                out,
                "shard {d}:     {} holds {:.3} GiB ({} values: fp32 weights, gradient, AdamW); \
                 plan {:.3} GiB of {:.3} GiB per device",
                s.device,
                g(s.held_bytes),
                s.values,
                g(s.plan_bytes),
                g(s.plan_device_bytes)
            )?;
        }
        Ok(())
    }
}

/// `s` seconds, rounded to the millisecond (at least 1 ms), as a scenario duration.
fn scenario_duration(s: f64) -> String {
    let ms = (s * 1e3).round().max(1.0) as u64;
    loco_core::scenario::units::format_duration(std::time::Duration::from_millis(ms))
}

/// A flops rate with its unit.
fn flops_rate(f: f64) -> String {
    if f >= 1e12 { format!("{:.1} TFLOP/s", f / 1e12) } else { format!("{:.2} GFLOP/s", f / 1e9) }
}

/// Without libtorch there is nothing to train.
#[cfg(not(feature = "torch"))]
pub(crate) fn run(_args: &TrainBench) -> Result<TrainReport> {
    Err(crate::InputError(anyhow::anyhow!(
        "bench train trains a model with libtorch: this loco was built without it; rebuild with \
         `--features torch` (see README)"
    ))
    .into())
}

/// Builds the trainer, runs the steps, and measures them (see the module docs).
#[cfg(feature = "torch")]
pub(crate) fn run(a: &TrainBench) -> Result<TrainReport> {
    use loco_core::scenario::{DilocoSpec, ModelSpec, RealSpec};
    use loco_real::data::{DataLoader, DataSource, Order, Shard, Synthetic};
    use loco_real::inner::NodeTrainer;
    use loco_real::memory::{Place, host_available_bytes};
    use loco_real::sharded::ShardedTrainer;
    use loco_real::train::{TrainConfig, Trainer};
    let spec = spec_of(a);
    let (seq_len, batch_rows, precision) = settings(a)?;
    let real = RealSpec {
        device: a.device,
        precision,
        micro_batch: a.micro_batch as u32,
        seq_len: Some(seq_len as u32),
        ..RealSpec::default()
    };
    let diloco =
        DilocoSpec { batch_tokens: (batch_rows * seq_len) as u64, ..DilocoSpec::default() };
    let config = TrainConfig::from_scenario(&spec, &diloco, &real);
    debug_assert_eq!(config.batch_rows, batch_rows);

    // The model's own memory, checked before allocating it (no outer state in this run).
    let plan = memory_plan(a, true)?;
    let place = Place::from(a.device);
    if let (Place::Host, Some(avail)) = (place, host_available_bytes())
        && let Err(short) = plan.fits(place, avail)
    {
        return Err(crate::InputError(anyhow::anyhow!("{short}; nothing was allocated")).into());
    }

    if let Some(t) = a.threads {
        tch::set_num_threads(t as i32);
    }
    let devices = loco_real::sharded::node_devices(a.device, a.gpus)?;
    tch::manual_seed(a.seed as i64);
    let mut trainer = if a.gpus > 1 {
        NodeTrainer::Sharded(ShardedTrainer::new(&spec, config, &devices, a.seed)?)
    } else {
        NodeTrainer::One(Trainer::new(&spec, config, devices[0], a.seed)?)
    };
    let source = DataSource::Synthetic(Synthetic { seed: a.seed, sequences: 1 << 20 });
    let mut data =
        DataLoader::new(&source, seq_len, spec.vocab, Shard::new(0, 1)?, Order::Sequential)?;
    let (step_seconds, first_loss, last_loss) =
        timed_steps(a, &mut trainer, &mut data, &devices, batch_rows)?;
    let tokens_per_step = (batch_rows * seq_len) as u64;
    let timed: f64 = step_seconds.iter().sum();
    let tokens_per_second = tokens_per_step as f64 * step_seconds.len() as f64 / timed;
    // PRIME's formula at the sequence length trained.
    let flops_per_token = ModelSpec { seq_len: seq_len as u32, ..spec.clone() }.flops_per_token();
    let achieved_flops = tokens_per_second * flops_per_token as f64;
    Ok(TrainReport {
        preset: model_name(a),
        device: a.device.to_string(),
        precision: precision.to_string(),
        torch_threads: i64::from(tch::get_num_threads()),
        params: spec.param_count(),
        non_embedding_params: spec.non_embedding_params(),
        flops_per_token,
        seq_len,
        micro_batch: a.micro_batch,
        batch_rows,
        tokens_per_step,
        warmup_steps: a.warmup,
        median_step_seconds: {
            let mut sorted = step_seconds.clone();
            sorted.sort_by(f64::total_cmp);
            loco_core::metrics::percentile(&sorted, 50.0).expect("at least one timed step")
        },
        step_seconds,
        tokens_per_second,
        achieved_flops,
        peak_flops: a.peak_flops,
        mfu: a.peak_flops.map(|p| achieved_flops / (p * f64::from(a.gpus))),
        first_loss,
        last_loss,
        peak_rss_bytes: loco_real::node::peak_rss_bytes(),
        memory_plan: plan.describe(place),
        gpus: a.gpus,
        shards: shard_figures(&trainer, &plan),
        phases: match &trainer {
            NodeTrainer::Sharded(t) => Some(t.phase_seconds()),
            NodeTrainer::One(_) => None,
        },
    })
}

/// Runs `warmup + steps` inner steps on synthetic batches, with a progress bar, and returns the
/// timed steps' seconds (after the warm-up; CUDA synchronised) and the first and last loss.
#[cfg(feature = "torch")]
fn timed_steps(
    a: &TrainBench,
    trainer: &mut loco_real::inner::NodeTrainer,
    data: &mut loco_real::data::DataLoader,
    devices: &[tch::Device],
    batch_rows: usize,
) -> Result<(Vec<f64>, f64, f64)> {
    let total = a.warmup + a.steps;
    let bar = indicatif::ProgressBar::new(total as u64).with_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} steps, {elapsed}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.set_message(format!("{} on {}", model_name(a), a.device));
    let (mut first_loss, mut last_loss) = (f64::NAN, f64::NAN);
    let mut step_seconds = Vec::with_capacity(a.steps);
    for i in 0..total {
        let batch = data.next_batch(batch_rows)?;
        let start = crate::clock::now();
        let stats = trainer.inner_step(&batch)?;
        for d in devices {
            if let tch::Device::Cuda(index) = d {
                tch::Cuda::synchronize(*index as i64);
            }
        }
        let secs = start.elapsed().as_secs_f64();
        if i == 0 {
            first_loss = stats.loss;
        }
        last_loss = stats.loss;
        if i >= a.warmup {
            step_seconds.push(secs);
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok((step_seconds, first_loss, last_loss))
}

/// The memory each device's shard holds against the plan (none for one device).
#[cfg(feature = "torch")]
fn shard_figures(
    trainer: &loco_real::inner::NodeTrainer,
    plan: &loco_real::memory::MemoryPlan,
) -> Vec<ShardFigure> {
    use loco_real::inner::NodeTrainer;
    match &trainer {
        NodeTrainer::Sharded(t) => t
            .shard_memory()
            .into_iter()
            .map(|m| ShardFigure {
                device: m.device.clone(),
                values: m.values,
                held_bytes: m.total(),
                plan_bytes: plan.bytes("weights shard")
                    + plan.bytes("gradient shard")
                    + plan.bytes("AdamW state shard"),
                plan_device_bytes: plan.per_device(),
            })
            .collect(),
        NodeTrainer::One(_) => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_scenario_durations() {
        use loco_core::scenario::units::parse_duration;
        for (secs, ms) in [(0.8124, 812), (1.25, 1250), (0.0001, 1), (61.0, 61_000)] {
            let text = scenario_duration(secs);
            let back = parse_duration(&text).unwrap();
            assert_eq!(back, std::time::Duration::from_millis(ms), "{text}");
        }
    }
}
