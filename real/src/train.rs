//! The inner optimiser of the real backend: AdamW on a `crate::model::Llama` with a
//! warmup-stable-decay schedule, gradient clipping, max-z-loss and gradient accumulation over
//! micro-batches. The configuration, the schedule, the step statistics and the exportable state
//! are plain data (no libtorch); `Trainer` needs the `torch` feature.
//!
//! # One inner step (`Trainer::inner_step`)
//!
//! 1. The batch (`rows x (seq_len + 1)` token ids) is split into micro-batches of
//!    `micro_batch` rows; each runs forward and backward, its loss weighted by its share of the
//!    rows, so the gradients are those of the mean over the whole batch.
//! 2. Loss: cross-entropy (mean over tokens) plus, if `z_loss > 0`, PRIME's max-z-loss
//!    `z_loss * mean(max(logits)^2)` (Baichuan 2's form, as `cross_entropy_max_z_loss` in PRIME's
//!    code, rather than PaLM's `logsumexp^2`).
//! 3. The global gradient norm (norm of the per-tensor norms, as `torch.nn.utils.clip_grad_norm_`);
//!    if loss or norm is not finite the step is refused ([`TrainError::NonFinite`]) and nothing
//!    changes; if `grad_clip > 0` and the norm exceeds it, the gradients are scaled by
//!    `grad_clip / (norm + 1e-6)`.
//! 4. AdamW with torch's semantics, written out here so its state can be exported exactly:
//!    `p *= 1 - lr * wd; m = lerp(m, g, 1 - b1); v = b2 v + (1 - b2) g^2;
//!    p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)`, with `t` the 1-based step
//!    and `lr` the schedule's rate at the 0-based step (as torch's `LambdaLR`: the first step has
//!    the rate of step 0). Weight decay applies to every parameter, as PRIME's
//!    `AdamW(model.parameters())`.
//!
//! The trainer's whole state is the parameters, `m`, `v` (fp32, in the order of
//! [`crate::model::param_layout`]) and the step count, which is also the schedule's position:
//! `Trainer::export_state` and `Trainer::import_state` move it between processes (live
//! recovery) and to checkpoints.

use crate::model::{ModelSpec, Precision};
use loco_core::scenario::{Decay, DilocoSpec, RealSpec};
use serde::{Deserialize, Serialize};

#[cfg(feature = "torch")]
use crate::model::{
    Llama, ModelError,
    llama::{TorchContext, flat_to_tensors, tensors_to_flat},
};
#[cfg(feature = "torch")]
use tch::{Device, Kind, Reduction, Tensor};

/// What can go wrong in training.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The model failed (libtorch, shapes).
    #[cfg(feature = "torch")]
    #[error(transparent)]
    Model(#[from] ModelError),
    /// A setting out of range.
    #[error("training setting {field} = {value}: expected {expected}")]
    BadConfig {
        /// The setting.
        field: &'static str,
        /// Its value, as written.
        value: String,
        /// What was expected.
        expected: String,
    },
    /// A batch that is not whole rows of `seq_len + 1` tokens.
    #[error("batch of {len} tokens: expected a positive multiple of seq_len + 1 = {row}")]
    BadBatch {
        /// Tokens given.
        len: usize,
        /// Tokens per row.
        row: usize,
    },
    /// A token id outside the vocabulary.
    #[error("token {token} at index {index} of the batch: expected 0 <= token < {vocab}")]
    TokenOutOfRange {
        /// Its index in the batch.
        index: usize,
        /// Its value.
        token: i64,
        /// The vocabulary size.
        vocab: u32,
    },
    /// The loss or the gradient norm is NaN or infinite; the step was not applied.
    #[error("inner step {step}: loss {loss}, gradient norm {grad_norm}: not finite, step refused")]
    NonFinite {
        /// The step that failed (0-based).
        step: u64,
        /// The loss (cross-entropy plus z-loss).
        loss: f64,
        /// The gradient norm.
        grad_norm: f64,
    },
    /// A state that does not belong to this model.
    #[error("trainer state: {what}: expected {expected}, got {got}")]
    StateMismatch {
        /// What differs.
        what: &'static str,
        /// This trainer's.
        expected: String,
        /// The state's.
        got: String,
    },
}

/// The inner learning rate: linear warmup, constant, then a sqrt decay (WSD), as
/// [`DilocoSpec::inner_lr_at`] and PRIME's `_get_linear_schedule_with_wsd_sqrt_lr_lambda`
/// (with `num_stable_steps = decay.start`, `num_training_steps = decay.start + decay.steps`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LrSchedule {
    /// Peak rate.
    pub peak: f64,
    /// Warmup length in steps: the rate at step `s < warmup_steps` is `peak * s / warmup_steps`.
    pub warmup_steps: u64,
    /// The decay: from `start`, `peak * (1 - sqrt((s - start) / steps))`, then 0.
    pub decay: Option<Decay>,
}

impl LrSchedule {
    /// A constant rate.
    pub fn constant(lr: f64) -> LrSchedule {
        LrSchedule { peak: lr, warmup_steps: 0, decay: None }
    }

    /// The rate at (0-based) step `step`.
    pub fn lr_at(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            return self.peak * step as f64 / self.warmup_steps as f64;
        }
        match self.decay {
            Some(d) if step >= d.start => {
                let frac = ((step - d.start) as f64 / d.steps.max(1) as f64).min(1.0);
                self.peak * (1.0 - frac.sqrt())
            }
            _ => self.peak,
        }
    }
}

/// Settings of the inner training loop.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainConfig {
    /// Tokens predicted per row; rows hold `seq_len + 1` tokens (at most the spec's `seq_len`).
    pub seq_len: usize,
    /// Rows per forward pass (gradient accumulation over the rest).
    pub micro_batch: usize,
    /// Rows per inner step: what the worker asks the data loader for.
    pub batch_rows: usize,
    /// The learning-rate schedule.
    pub schedule: LrSchedule,
    /// AdamW betas.
    pub betas: (f64, f64),
    /// AdamW epsilon.
    pub eps: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// Global gradient-norm clip; 0 disables.
    pub grad_clip: f64,
    /// Max-z-loss weight; 0 disables.
    pub z_loss: f64,
    /// What the model computes in.
    pub precision: Precision,
}

impl TrainConfig {
    /// The configuration a scenario gives: `seq_len` from `[real]` or the model, `micro_batch`
    /// from `[real]`, `batch_rows = max(1, batch_tokens / seq_len)`, the optimiser and schedule
    /// from `[diloco]`, eps 1e-8, the precision from `[real]`.
    pub fn from_scenario(model: &ModelSpec, diloco: &DilocoSpec, real: &RealSpec) -> TrainConfig {
        let seq_len = real.seq_len.unwrap_or(model.seq_len).max(1) as usize;
        TrainConfig {
            seq_len,
            micro_batch: real.micro_batch as usize,
            batch_rows: (diloco.batch_tokens / seq_len as u64).max(1) as usize,
            schedule: LrSchedule {
                peak: diloco.inner_lr,
                warmup_steps: diloco.warmup_steps,
                decay: diloco.decay,
            },
            betas: diloco.betas,
            eps: 1e-8,
            weight_decay: diloco.weight_decay,
            grad_clip: diloco.grad_clip,
            z_loss: diloco.z_loss,
            precision: real.precision,
        }
    }

    /// Checks every setting, and `seq_len` against the model's.
    pub fn validate(&self, spec: &ModelSpec) -> Result<(), TrainError> {
        let bad = |field, value: String, expected: String| {
            Err(TrainError::BadConfig { field, value, expected })
        };
        if self.seq_len == 0 || self.seq_len > spec.seq_len as usize {
            return bad(
                "seq_len",
                self.seq_len.to_string(),
                format!("1 ..= {} (the model's seq_len)", spec.seq_len),
            );
        }
        if self.micro_batch == 0 {
            return bad("micro_batch", "0".into(), "at least 1".into());
        }
        if self.batch_rows == 0 {
            return bad("batch_rows", "0".into(), "at least 1".into());
        }
        let unit = |x: f64| (0.0..1.0).contains(&x);
        if !unit(self.betas.0) || !unit(self.betas.1) {
            return bad("betas", format!("{:?}", self.betas), "each in [0, 1)".into());
        }
        for (field, v, strict) in [
            ("lr", self.schedule.peak, false),
            ("eps", self.eps, true),
            ("weight_decay", self.weight_decay, false),
            ("grad_clip", self.grad_clip, false),
            ("z_loss", self.z_loss, false),
        ] {
            let ok = v.is_finite() && if strict { v > 0.0 } else { v >= 0.0 };
            if !ok {
                let expected = if strict { "finite and > 0" } else { "finite and >= 0" };
                return bad(field, v.to_string(), expected.into());
            }
        }
        Ok(())
    }
}

/// What one inner step did.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepStats {
    /// The step's index (0-based): the trainer's step count before it.
    pub step: u64,
    /// Mean cross-entropy over the batch's predicted tokens, before the update.
    pub loss: f64,
    /// The z-loss term added to it (0 when disabled).
    pub z_loss: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// The learning rate applied.
    pub lr: f64,
    /// Tokens predicted (`rows * seq_len`).
    pub tokens: u64,
}

/// Everything a trainer holds, on the CPU: enough to continue bit-identically elsewhere.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    /// Inner steps taken: AdamW's step count and the schedule's position.
    pub step: u64,
    /// `(name, numel)` of every parameter tensor; the vectors below follow it.
    pub layout: Vec<(String, usize)>,
    /// The parameters.
    pub params: Vec<f32>,
    /// AdamW's first moment.
    pub exp_avg: Vec<f32>,
    /// AdamW's second moment.
    pub exp_avg_sq: Vec<f32>,
}

impl TrainerState {
    /// A 64-bit FNV-1a hash of the step, the layout and the bits of every value: equal states
    /// have equal fingerprints (to compare replicas without moving the vectors).
    pub fn fingerprint(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |bytes: &[u8]| {
            for &b in bytes {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
        };
        eat(&self.step.to_le_bytes());
        for (name, n) in &self.layout {
            eat(name.as_bytes());
            eat(&(*n as u64).to_le_bytes());
        }
        for v in [&self.params, &self.exp_avg, &self.exp_avg_sq] {
            eat(&(v.len() as u64).to_le_bytes());
            for x in v.iter() {
                eat(&x.to_bits().to_le_bytes());
            }
        }
        h
    }
}

/// A Llama model with its AdamW state.
#[cfg(feature = "torch")]
pub struct Trainer {
    model: Llama,
    config: TrainConfig,
    exp_avg: Vec<Tensor>,
    exp_avg_sq: Vec<Tensor>,
    step: u64,
}

#[cfg(feature = "torch")]
impl std::fmt::Debug for Trainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainer")
            .field("model", &self.model)
            .field("config", &self.config)
            .field("step", &self.step)
            .finish()
    }
}

#[cfg(feature = "torch")]
impl Trainer {
    /// A fresh model of shape `spec` on `device`, initialised from `seed` (see
    /// [`Llama`]), with zero AdamW state at step 0.
    pub fn new(
        spec: &ModelSpec,
        config: TrainConfig,
        device: Device,
        seed: u64,
    ) -> Result<Trainer, TrainError> {
        config.validate(spec)?;
        let model = Llama::new(spec, device, config.precision, seed)?;
        let zeros = || -> Result<Vec<Tensor>, ModelError> {
            model
                .params()
                .iter()
                .map(|p| p.f_zeros_like().during("allocating AdamW state"))
                .collect()
        };
        let (exp_avg, exp_avg_sq) = (zeros()?, zeros()?);
        Ok(Trainer { model, config, exp_avg, exp_avg_sq, step: 0 })
    }

    /// Inner steps taken so far (the next step's index).
    pub fn step(&self) -> u64 {
        self.step
    }

    /// The learning rate the next step will use.
    pub fn lr(&self) -> f64 {
        self.config.schedule.lr_at(self.step)
    }

    /// The model.
    pub fn model(&self) -> &Llama {
        &self.model
    }

    /// The configuration.
    pub fn config(&self) -> &TrainConfig {
        &self.config
    }

    /// Number of parameters.
    pub fn num_params(&self) -> usize {
        self.model.num_params()
    }

    /// `(name, numel)` of every parameter tensor, in the flat order.
    pub fn param_layout(&self) -> Vec<(String, usize)> {
        self.model.param_layout()
    }

    /// The parameters as one flat fp32 vector.
    pub fn flat_params(&self) -> Result<Vec<f32>, TrainError> {
        Ok(self.model.flat_params()?)
    }

    /// Copies the parameters into `out` (length: the parameter count).
    pub fn flat_params_into(&self, out: &mut [f32]) -> Result<(), TrainError> {
        Ok(self.model.flat_params_into(out)?)
    }

    /// Sets the parameters (DiLoCo: the new outer weights); the AdamW state and the step stay.
    pub fn set_flat_params(&mut self, flat: &[f32]) -> Result<(), TrainError> {
        Ok(self.model.set_flat_params(flat)?)
    }

    /// One inner step on `tokens`: `rows x (seq_len + 1)` token ids, row after row (see the
    /// module docs). After a bad batch or a non-finite loss or norm nothing has changed; a
    /// libtorch failure during the update itself (out of device memory) can leave it partly
    /// applied, so the caller should then restore a saved state.
    pub fn inner_step(&mut self, tokens: &[i64]) -> Result<StepStats, TrainError> {
        let vocab = self.model.spec().vocab;
        inner_step(self, tokens, vocab)
    }

    /// Mean cross-entropy on `tokens` (rows of `seq_len + 1`), without gradients or updates.
    pub fn eval_loss(&self, tokens: &[i64]) -> Result<f64, TrainError> {
        let rows = self.check_batch(tokens)?;
        let batch = self.batch_tensor(tokens, rows)?;
        let _guard = tch::no_grad_guard();
        let mut total = 0.0;
        for (start, n) in self.micro_batches(rows) {
            let (ce, _) = self.micro_loss(&batch, start, n)?;
            total += ce.f_double_value(&[]).during("reading the loss")? * n as f64;
        }
        Ok(total / rows as f64)
    }

    /// The whole state, copied to the CPU.
    pub fn export_state(&self) -> Result<TrainerState, TrainError> {
        let n = self.num_params();
        let mut state = TrainerState {
            step: self.step,
            layout: self.param_layout(),
            params: vec![0.0; n],
            exp_avg: vec![0.0; n],
            exp_avg_sq: vec![0.0; n],
        };
        self.model.flat_params_into(&mut state.params)?;
        tensors_to_flat(&self.exp_avg, &mut state.exp_avg, "exp_avg")?;
        tensors_to_flat(&self.exp_avg_sq, &mut state.exp_avg_sq, "exp_avg_sq")?;
        Ok(state)
    }

    /// Replaces the whole state with `state` (from [`Trainer::export_state`] of a trainer of
    /// the same model shape); fails without changing anything if the layout differs.
    pub fn import_state(&mut self, state: &TrainerState) -> Result<(), TrainError> {
        let layout = self.param_layout();
        if state.layout != layout {
            let first = layout.iter().zip(&state.layout).position(|(a, b)| a != b);
            let show = |l: &[(String, usize)], i: Option<usize>| match i.and_then(|i| l.get(i)) {
                Some((name, n)) => format!("{name} ({n} values)"),
                None => format!("{} tensors", l.len()),
            };
            return Err(TrainError::StateMismatch {
                what: "parameter layout",
                expected: show(&layout, first),
                got: show(&state.layout, first),
            });
        }
        let n = self.num_params();
        for (what, len) in [
            ("params length", state.params.len()),
            ("exp_avg length", state.exp_avg.len()),
            ("exp_avg_sq length", state.exp_avg_sq.len()),
        ] {
            if len != n {
                return Err(TrainError::StateMismatch {
                    what,
                    expected: n.to_string(),
                    got: len.to_string(),
                });
            }
        }
        self.model.set_flat_params(&state.params)?;
        flat_to_tensors(&state.exp_avg, &mut self.exp_avg, "exp_avg")?;
        flat_to_tensors(&state.exp_avg_sq, &mut self.exp_avg_sq, "exp_avg_sq")?;
        self.step = state.step;
        Ok(())
    }

    fn check_batch(&self, tokens: &[i64]) -> Result<usize, TrainError> {
        check_batch(tokens, self.config.seq_len, self.model.spec().vocab)
    }

    fn batch_tensor(&self, tokens: &[i64], rows: usize) -> Result<Tensor, TrainError> {
        batch_tensor(tokens, rows, self.config.seq_len, self.model.device())
    }

    fn micro_batches(&self, rows: usize) -> impl Iterator<Item = (usize, usize)> {
        let mb = self.config.micro_batch;
        (0..rows).step_by(mb).map(move |start| (start, mb.min(rows - start)))
    }

    /// Cross-entropy and z-loss (weighted) of rows `start..start + n` of `batch`.
    fn micro_loss(
        &self,
        batch: &Tensor,
        start: usize,
        n: usize,
    ) -> Result<(Tensor, Option<Tensor>), ModelError> {
        let s = self.config.seq_len as i64;
        let rows = batch.f_narrow(0, start as i64, n as i64).during("slicing the batch")?;
        let input = rows.f_narrow(1, 0, s).during("slicing the batch")?;
        let target =
            rows.f_narrow(1, 1, s).and_then(|t| t.f_reshape([-1])).during("slicing the batch")?;
        let logits = self.model.forward(&input)?;
        loss_terms(&logits, &target, self.config.z_loss)
    }

    /// Forward and backward over the micro-batches; returns (cross-entropy, z-loss), averaged.
    fn accumulate_gradients(
        &mut self,
        batch: &Tensor,
        rows: usize,
    ) -> Result<(f64, f64), TrainError> {
        let mut ce_total = 0.0;
        let mut z_total = 0.0;
        self.zero_grads();
        for (start, n) in self.micro_batches(rows).collect::<Vec<_>>() {
            let share = n as f64 / rows as f64;
            let step = || -> Result<(f64, f64), ModelError> {
                let (ce, z) = self.micro_loss(batch, start, n)?;
                let total = match &z {
                    Some(z) => ce.f_add(z).during("loss")?,
                    None => ce.shallow_clone(),
                };
                total.f_mul_scalar(share).and_then(|t| t.f_backward()).during("backward")?;
                let ce = ce.f_double_value(&[]).during("reading the loss")?;
                let z = match z {
                    Some(z) => z.f_double_value(&[]).during("reading the loss")?,
                    None => 0.0,
                };
                Ok((ce, z))
            };
            let (ce, z) = step()?;
            ce_total += ce * share;
            z_total += z * share;
        }
        Ok((ce_total, z_total))
    }

    fn grads(&self) -> Result<Vec<Tensor>, ModelError> {
        self.model.params().iter().map(|p| p.f_grad().during("reading gradients")).collect()
    }

    fn grad_norm(&self) -> Result<f64, TrainError> {
        let norms = self
            .grads()?
            .iter()
            .map(|g| g.f_norm())
            .collect::<Result<Vec<_>, _>>()
            .during("gradient norm")?;
        Ok(Tensor::f_stack(&norms, 0)
            .and_then(|n| n.f_norm())
            .and_then(|n| n.f_double_value(&[]))
            .during("gradient norm")?)
    }

    fn clip(&mut self, grad_norm: f64) -> Result<(), TrainError> {
        let clip = self.config.grad_clip;
        if clip <= 0.0 || grad_norm <= clip {
            return Ok(());
        }
        let coef = clip / (grad_norm + 1e-6);
        let _guard = tch::no_grad_guard();
        for mut g in self.grads()? {
            let _ = g.f_mul_scalar_(coef).during("clipping gradients")?;
        }
        Ok(())
    }

    fn adamw(&mut self, lr: f64) -> Result<(), TrainError> {
        let step = AdamStep::new(&self.config, lr, self.step);
        let grads = self.grads()?;
        let _guard = tch::no_grad_guard();
        let params = self.model.params_mut();
        for (((p, m), v), g) in
            params.iter_mut().zip(&mut self.exp_avg).zip(&mut self.exp_avg_sq).zip(&grads)
        {
            step.apply(p, m, v, g).during("AdamW update")?;
        }
        Ok(())
    }

    fn zero_grads(&mut self) {
        for p in self.model.params_mut() {
            p.zero_grad();
        }
    }
}

/// The parts of one inner step that differ between a trainer on one device and one sharded
/// over G ([`crate::sharded::ShardedTrainer`]); [`inner_step`] puts them together the same way
/// for both.
#[cfg(feature = "torch")]
pub(crate) trait StepParts {
    /// The settings.
    fn config(&self) -> &TrainConfig;
    /// Inner steps taken (the next step's index).
    fn steps(&self) -> u64;
    /// Counts one more step.
    fn count_step(&mut self);
    /// Forward and backward over the batch's micro-batches (`rows` checked rows of `tokens`):
    /// (cross-entropy, z-loss), averaged; the gradients accumulated.
    fn gradients(&mut self, tokens: &[i64], rows: usize) -> Result<(f64, f64), TrainError>;
    /// The global gradient norm.
    fn gradient_norm(&mut self) -> Result<f64, TrainError>;
    /// Clipping to the configured norm, then AdamW at rate `lr`.
    fn clip_and_update(&mut self, grad_norm: f64, lr: f64) -> Result<(), TrainError>;
    /// Zeroes the accumulated gradients.
    fn clear_gradients(&mut self);
}

/// One inner step on `tokens` (see the module docs): checks, gradients, the norm, refusal of a
/// non-finite step (nothing changed), clipping and AdamW, the statistics.
#[cfg(feature = "torch")]
pub(crate) fn inner_step<T: StepParts>(
    t: &mut T,
    tokens: &[i64],
    vocab: u32,
) -> Result<StepStats, TrainError> {
    let seq_len = t.config().seq_len;
    let rows = check_batch(tokens, seq_len, vocab)?;
    let measured = t.gradients(tokens, rows).and_then(|(loss, z_loss)| {
        let grad_norm = t.gradient_norm()?;
        Ok((loss, z_loss, grad_norm))
    });
    let (loss, z_loss, grad_norm) = match measured {
        Ok(v) => v,
        Err(e) => {
            t.clear_gradients();
            return Err(e);
        }
    };
    let step = t.steps();
    if !(loss + z_loss).is_finite() || !grad_norm.is_finite() {
        t.clear_gradients();
        return Err(TrainError::NonFinite { step, loss: loss + z_loss, grad_norm });
    }
    let lr = t.config().schedule.lr_at(step);
    let applied = t.clip_and_update(grad_norm, lr);
    t.clear_gradients();
    applied?;
    t.count_step();
    Ok(StepStats { step, loss, z_loss, grad_norm, lr, tokens: (rows * seq_len) as u64 })
}

#[cfg(feature = "torch")]
impl StepParts for Trainer {
    fn config(&self) -> &TrainConfig {
        &self.config
    }

    fn steps(&self) -> u64 {
        self.step
    }

    fn count_step(&mut self) {
        self.step += 1;
    }

    fn gradients(&mut self, tokens: &[i64], rows: usize) -> Result<(f64, f64), TrainError> {
        let batch = self.batch_tensor(tokens, rows)?;
        self.accumulate_gradients(&batch, rows)
    }

    fn gradient_norm(&mut self) -> Result<f64, TrainError> {
        self.grad_norm()
    }

    fn clip_and_update(&mut self, grad_norm: f64, lr: f64) -> Result<(), TrainError> {
        self.clip(grad_norm).and_then(|()| self.adamw(lr))
    }

    fn clear_gradients(&mut self) {
        self.zero_grads();
    }
}

/// One AdamW step's constants (see the module docs): the 0-based `step` about to be taken at
/// rate `lr`.
#[cfg(feature = "torch")]
pub(crate) struct AdamStep {
    b1: f64,
    b2: f64,
    bc2_sqrt: f64,
    step_size: f64,
    decay: f64,
    eps: f64,
}

#[cfg(feature = "torch")]
impl AdamStep {
    pub(crate) fn new(config: &TrainConfig, lr: f64, step: u64) -> AdamStep {
        let (b1, b2) = config.betas;
        let t = (step + 1) as f64;
        AdamStep {
            b1,
            b2,
            bc2_sqrt: (1.0 - b2.powf(t)).sqrt(),
            step_size: lr / (1.0 - b1.powf(t)),
            decay: 1.0 - lr * config.weight_decay,
            eps: config.eps,
        }
    }

    /// Updates parameters `p` and moments `m`, `v` in place with gradient `g` (whole tensors, or
    /// the same chunk of each): the same arithmetic wherever it runs.
    pub(crate) fn apply(
        &self,
        p: &mut Tensor,
        m: &mut Tensor,
        v: &mut Tensor,
        g: &Tensor,
    ) -> Result<(), tch::TchError> {
        if self.decay != 1.0 {
            let _ = p.f_mul_scalar_(self.decay)?;
        }
        let _ = m.f_lerp_(g, 1.0 - self.b1)?;
        let _ = v.f_mul_scalar_(self.b2)?;
        let _ = v.f_add_(&g.f_square()?.f_mul_scalar(1.0 - self.b2)?)?;
        let denom = v.f_sqrt()?.f_div_scalar(self.bc2_sqrt)?.f_add_scalar(self.eps)?;
        let _ = p.f_add_(&m.f_div(&denom)?.f_mul_scalar(-self.step_size)?)?;
        Ok(())
    }
}

/// The number of rows of a batch of `tokens`: whole rows of `seq_len + 1` ids below `vocab`.
#[cfg(feature = "torch")]
pub(crate) fn check_batch(tokens: &[i64], seq_len: usize, vocab: u32) -> Result<usize, TrainError> {
    let row = seq_len + 1;
    if tokens.is_empty() || !tokens.len().is_multiple_of(row) {
        return Err(TrainError::BadBatch { len: tokens.len(), row });
    }
    if let Some(index) = tokens.iter().position(|&t| t < 0 || t >= i64::from(vocab)) {
        return Err(TrainError::TokenOutOfRange { index, token: tokens[index], vocab });
    }
    Ok(tokens.len() / row)
}

/// A checked batch as a `[rows, seq_len + 1]` tensor on `device`.
#[cfg(feature = "torch")]
pub(crate) fn batch_tensor(
    tokens: &[i64],
    rows: usize,
    seq_len: usize,
    device: Device,
) -> Result<Tensor, TrainError> {
    let row = (seq_len + 1) as i64;
    Ok(Tensor::f_from_slice(tokens)
        .and_then(|t| t.f_view([rows as i64, row]))
        .and_then(|t| t.f_to_device(device))
        .during("moving the batch")?)
}

/// Cross-entropy (mean over tokens) of fp32 `logits` `[.., vocab]` against `target` (flat token
/// ids), and the max-z-loss term `z_loss * mean(max(logits)^2)` when `z_loss > 0`.
#[cfg(feature = "torch")]
pub(crate) fn loss_terms(
    logits: &Tensor,
    target: &Tensor,
    z_loss: f64,
) -> Result<(Tensor, Option<Tensor>), ModelError> {
    let vocab = *logits.size().last().unwrap_or(&1);
    let logits = logits.f_reshape([-1, vocab]).during("loss")?;
    let ce = logits
        .f_cross_entropy_loss::<Tensor>(target, None, Reduction::Mean, -100, 0.0)
        .during("loss")?;
    let z = if z_loss > 0.0 {
        let (max, _) = logits.f_max_dim(-1, false).during("z-loss")?;
        let z = max
            .f_square()
            .and_then(|m| m.f_mean(Kind::Float))
            .and_then(|m| m.f_mul_scalar(z_loss))
            .during("z-loss")?;
        Some(z)
    } else {
        None
    };
    Ok((ce, z))
}

#[cfg(test)]
mod tests;
