//! One node's inner optimiser over its G devices, sharded as ZeRO-3 (FSDP) shards it: each device
//! owns `1/G` of the fp32 master weights, of their gradient and of AdamW's two moments; the
//! weights of one unit (the embedding, one transformer block, the final norm and head) are
//! gathered onto every device just before that unit computes and dropped just after; gradients
//! are reduce-scattered unit by unit onto the devices that own them.
//!
//! # Why this shape
//!
//! - **The shards are the rings' shards.** Device `d` owns values
//!   `chunk_range(n, G, d)` of the flat parameter vector, the same range the node's ring `d`
//!   all-reduces across nodes ([`loco_core::node::rings`]) and the same split of the DiLoCo outer
//!   state. So a device's shard of the inner weights, of the pseudo-gradient and of the outer
//!   state are the same values, as INTELLECT-1 ran one ring per local rank over its own shard.
//! - **Per-unit gather with activation checkpoints.** Forward runs unit by unit without
//!   recording a graph and keeps only each block's input; the backward pass gathers a unit
//!   again, recomputes it from its saved input with the graph, and back-propagates the gradient
//!   of its output. A device therefore holds at most one unit's full weights and gradients at a
//!   time: the 10B preset's 152 GiB of weights, gradients and moments spread over 8 devices as
//!   19 GiB each, plus one unit ([`crate::memory::MemoryPlan::sharded`]).
//! - **One process, a thread per device.** tch exposes no NCCL process group; within one process
//!   devices exchange by `Tensor::to_device` copies (peer-to-peer where the driver allows), which
//!   needs no binding beyond tch and no second rendezvous next to the mesh's. Each compute phase
//!   of a unit runs on one thread per device; the gathers and the reduce-scatters between them
//!   run on the calling thread, in a fixed order, so that the sums are deterministic. On the CPU
//!   the G "devices" are threads over the same memory: the code path CI tests is the one a
//!   CUDA node runs.
//! - **Mixed precision:** weights are gathered in the compute precision (bf16 with
//!   `precision = "bf16"`) and their gradients reduced in fp32 into fp32 shards; AdamW updates
//!   the fp32 master shard in chunks of [`ADAM_CHUNK`] values, bounding its temporaries.
//!
//! One inner step is the same step as [`crate::train::Trainer`]'s (its module documents the
//! loss, clipping and AdamW): the batch's rows are split over the devices, each device's
//! micro-batches weighted by their share of the whole batch, so the gradient is the batch mean.
//! The results differ from one device's only by the order of floating-point sums.
//!
//! Size: one trainer type whose methods (gather, reduce-scatter, the AdamW step, export and
//! import) all work on its per-unit shard layout, which the reasons above explain.

pub use crate::memory::ADAM_CHUNK;

/// Seconds a sharded trainer spent in each phase of its steps, summed since it was made: where
/// the devices exchange (gathers, reduce-scatters) against where they compute. On CUDA the
/// phases are timed on the host, where kernels are queued, not run: only the sum (a step ends
/// by reading its loss back) is the devices' time.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct PhaseSeconds {
    /// Gathering the units' weights onto the devices.
    pub gather: f64,
    /// The forward and backward passes, on the devices' threads.
    pub compute: f64,
    /// Summing the gradients into the shards that own them.
    pub reduce_scatter: f64,
    /// The gradient norm, clipping and AdamW on the shards.
    pub update: f64,
}

/// Bytes one device holds between steps (its shard), by what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardMemory {
    /// The device.
    pub device: String,
    /// Values of the flat parameter vector it owns.
    pub values: u64,
    /// fp32 master weights.
    pub weights: u64,
    /// The fp32 gradient accumulator.
    pub gradient: u64,
    /// AdamW's two fp32 moments.
    pub adamw: u64,
}

impl ShardMemory {
    /// All of it.
    pub fn total(&self) -> u64 {
        self.weights + self.gradient + self.adamw
    }
}

#[cfg(feature = "torch")]
pub use imp::{ShardedTrainer, node_devices};

#[cfg(feature = "torch")]
mod imp {
    use super::{ADAM_CHUNK, PhaseSeconds, ShardMemory};
    use crate::model::llama::{Blocks, init_values};
    use crate::model::{ModelError, ModelSpec, param_specs};
    use crate::train::{
        AdamStep, StepParts, StepStats, TrainConfig, TrainError, TrainerState, batch_tensor,
        inner_step, loss_terms,
    };
    use loco_core::allreduce::schedule::chunk_range;
    use std::ops::Range;
    use tch::{Device, Kind, TchError, Tensor};

    /// Parameters per transformer block (see [`crate::model::param_specs`]).
    const PER_LAYER: usize = 9;

    /// What one device holds between steps: its shard of the training state.
    struct Shard {
        device: Device,
        /// The values of the flat parameter vector it owns.
        range: Range<usize>,
        /// fp32 master weights, `[range.len()]`.
        master: Tensor,
        exp_avg: Tensor,
        exp_avg_sq: Tensor,
        /// The gradient accumulated over this step's micro-batches.
        grad: Tensor,
    }

    /// The `gpus` devices of a node whose `[real] device` is `device`: the CPU `gpus` times (threads
    /// over shards), or `cuda:i` to `cuda:i+gpus-1`. Fails for a CUDA device libtorch does not see.
    pub fn node_devices(
        device: loco_core::scenario::Device,
        gpus: u32,
    ) -> Result<Vec<Device>, ModelError> {
        use loco_core::scenario::Device as Scenario;
        (0..gpus.max(1))
            .map(|d| match device {
                Scenario::Cpu => Ok(Device::Cpu),
                Scenario::Cuda(i) => crate::model::tch_device(Scenario::Cuda(i.saturating_add(d))),
            })
            .collect()
    }

    /// One device's compute lane for the micro-batch under way.
    struct Lane {
        blocks: Blocks,
        /// `[rows, seq]` token ids of its micro-batch, and the flat targets; `None` when the device
        /// has no micro-batch in this round.
        input: Option<(Tensor, Tensor)>,
        /// The micro-batch's share of the batch's rows.
        share: f64,
        /// The input of each block, then of the head (activation checkpoints).
        saved: Vec<Tensor>,
        /// The gradient of the loss with respect to the output of the unit computed next backward.
        grad_out: Option<Tensor>,
        /// Cross-entropy and z-loss of the micro-batches so far, weighted by their share.
        ce: f64,
        z: f64,
    }

    /// A Llama model trained with AdamW over G devices, sharded. See the module documentation.
    pub struct ShardedTrainer {
        spec: ModelSpec,
        config: TrainConfig,
        layout: Vec<(String, usize)>,
        shapes: Vec<Vec<i64>>,
        /// Offset of each parameter tensor in the flat vector.
        offsets: Vec<usize>,
        shards: Vec<Shard>,
        lanes: Vec<Lane>,
        step: u64,
        times: PhaseTimes,
    }

    #[derive(Debug, Default)]
    struct PhaseTimes {
        gather: std::cell::Cell<f64>,
        compute: std::cell::Cell<f64>,
        reduce: std::cell::Cell<f64>,
        update: std::cell::Cell<f64>,
    }

    /// A start time for [`PhaseTimes`]: measurement only, it never reaches a decision.
    #[allow(clippy::disallowed_methods)]
    fn started() -> std::time::Instant {
        std::time::Instant::now()
    }

    fn add(cell: &std::cell::Cell<f64>, since: std::time::Instant) {
        cell.set(cell.get() + since.elapsed().as_secs_f64());
    }

    impl std::fmt::Debug for ShardedTrainer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("ShardedTrainer")
                .field("spec", &self.spec)
                .field("devices", &self.shards.iter().map(|s| s.device).collect::<Vec<_>>())
                .field("step", &self.step)
                .finish()
        }
    }

    fn torch(op: &'static str) -> impl FnOnce(TchError) -> TrainError {
        move |source| TrainError::Model(ModelError::Torch { op, source })
    }

    impl ShardedTrainer {
        /// A fresh model of shape `spec` sharded over `devices` (one shard each, in order),
        /// initialised from `seed` exactly as [`crate::model::Llama::new`] initialises it, with zero
        /// AdamW state at step 0.
        pub fn new(
            spec: &ModelSpec,
            config: TrainConfig,
            devices: &[Device],
            seed: u64,
        ) -> Result<ShardedTrainer, TrainError> {
            config.validate(spec)?;
            if devices.is_empty() || devices.len() > usize::from(u16::MAX) {
                return Err(TrainError::BadConfig {
                    field: "gpus",
                    value: devices.len().to_string(),
                    expected: "1 ..= 65535 devices".into(),
                });
            }
            let specs = param_specs(spec);
            let layout: Vec<(String, usize)> =
                specs.iter().map(|p| (p.name.clone(), p.numel())).collect();
            let shapes =
                specs.iter().map(|p| p.shape.iter().map(|&s| s as i64).collect()).collect();
            let mut offsets = Vec::with_capacity(specs.len());
            let mut n = 0usize;
            for p in &specs {
                offsets.push(n);
                n += p.numel();
            }
            let g = devices.len();
            // Initial values tensor by tensor (as the unsharded model draws them), each copied into
            // the shards it overlaps: at most one tensor's values beside the shards.
            let mut host: Vec<Vec<f32>> =
                (0..g).map(|d| Vec::with_capacity(chunk_range(n, g, d).len())).collect();
            for (index, p) in specs.iter().enumerate() {
                let values = init_values(spec, p, index, seed);
                let (lo, hi) = (offsets[index], offsets[index] + p.numel());
                for (d, buf) in host.iter_mut().enumerate() {
                    let r = chunk_range(n, g, d);
                    let (x, y) = (lo.max(r.start), hi.min(r.end));
                    if x < y {
                        buf.extend_from_slice(&values[x - lo..y - lo]);
                    }
                }
            }
            let mut shards = Vec::with_capacity(g);
            let mut lanes = Vec::with_capacity(g);
            for (d, (&device, values)) in devices.iter().zip(host).enumerate() {
                let range = chunk_range(n, g, d);
                let master = Tensor::f_from_slice(&values)
                    .and_then(|t| t.f_to_device(device))
                    .map_err(torch("creating the weight shards"))?;
                drop(values);
                let zeros = || master.f_zeros_like().map_err(torch("allocating the AdamW shards"));
                let (exp_avg, exp_avg_sq, grad) = (zeros()?, zeros()?, zeros()?);
                shards.push(Shard { device, range, master, exp_avg, exp_avg_sq, grad });
                lanes.push(Lane {
                    blocks: Blocks::new(spec, device, config.precision)?,
                    input: None,
                    share: 0.0,
                    saved: Vec::new(),
                    grad_out: None,
                    ce: 0.0,
                    z: 0.0,
                });
            }
            Ok(ShardedTrainer {
                spec: spec.clone(),
                config,
                layout,
                shapes,
                offsets,
                shards,
                lanes,
                step: 0,
                times: PhaseTimes::default(),
            })
        }

        /// Inner steps taken so far (the next step's index).
        pub fn step(&self) -> u64 {
            self.step
        }

        /// The configuration.
        pub fn config(&self) -> &TrainConfig {
            &self.config
        }

        /// The number of devices (shards).
        pub fn devices(&self) -> usize {
            self.shards.len()
        }

        /// Number of parameters.
        pub fn num_params(&self) -> usize {
            self.layout.iter().map(|(_, n)| n).sum()
        }

        /// `(name, numel)` of every parameter tensor, in the flat order.
        pub fn param_layout(&self) -> Vec<(String, usize)> {
            self.layout.clone()
        }

        /// Seconds spent in each phase so far (see [`PhaseSeconds`]).
        pub fn phase_seconds(&self) -> PhaseSeconds {
            PhaseSeconds {
                gather: self.times.gather.get(),
                compute: self.times.compute.get(),
                reduce_scatter: self.times.reduce.get(),
                update: self.times.update.get(),
            }
        }

        /// What each device holds between steps.
        pub fn shard_memory(&self) -> Vec<ShardMemory> {
            self.shards
                .iter()
                .map(|s| {
                    let v = s.range.len() as u64;
                    ShardMemory {
                        device: format!("{:?}", s.device),
                        values: v,
                        weights: 4 * v,
                        gradient: 4 * v,
                        adamw: 8 * v,
                    }
                })
                .collect()
        }

        /// Copies the parameters into `out` (length: the parameter count), shard by shard.
        pub fn flat_params_into(&self, out: &mut [f32]) -> Result<(), TrainError> {
            self.copy_out(|s| &s.master, out, "parameter")
        }

        /// Sets the parameters (DiLoCo: the new outer weights); the AdamW state and the step stay.
        pub fn set_flat_params(&mut self, flat: &[f32]) -> Result<(), TrainError> {
            self.copy_in(|s| &mut s.master, flat, "parameter")
        }

        fn check_len(&self, len: usize, what: &'static str) -> Result<(), TrainError> {
            let expected = self.num_params();
            if len == expected {
                Ok(())
            } else {
                Err(TrainError::Model(ModelError::FlatLength { what, expected, got: len }))
            }
        }

        fn copy_out(
            &self,
            pick: impl Fn(&Shard) -> &Tensor,
            out: &mut [f32],
            what: &'static str,
        ) -> Result<(), TrainError> {
            self.check_len(out.len(), what)?;
            for s in &self.shards {
                let n = s.range.len();
                pick(s)
                    .f_copy_data(&mut out[s.range.clone()], n)
                    .map_err(torch("copying shards out"))?;
            }
            Ok(())
        }

        fn copy_in(
            &mut self,
            pick: impl Fn(&mut Shard) -> &mut Tensor,
            flat: &[f32],
            what: &'static str,
        ) -> Result<(), TrainError> {
            self.check_len(flat.len(), what)?;
            let _guard = tch::no_grad_guard();
            for s in &mut self.shards {
                let src = Tensor::f_from_slice(&flat[s.range.clone()])
                    .map_err(torch("copying shards in"))?;
                pick(s).f_copy_(&src).map_err(torch("copying shards in"))?;
            }
            Ok(())
        }

        /// The whole state, gathered to the CPU in the flat order: the same state as an unsharded
        /// [`crate::train::Trainer`]'s, so checkpoints and live recovery move between node sizes.
        pub fn export_state(&self) -> Result<TrainerState, TrainError> {
            let n = self.num_params();
            let mut state = TrainerState {
                step: self.step,
                layout: self.param_layout(),
                params: vec![0.0; n],
                exp_avg: vec![0.0; n],
                exp_avg_sq: vec![0.0; n],
            };
            self.copy_out(|s| &s.master, &mut state.params, "params")?;
            self.copy_out(|s| &s.exp_avg, &mut state.exp_avg, "exp_avg")?;
            self.copy_out(|s| &s.exp_avg_sq, &mut state.exp_avg_sq, "exp_avg_sq")?;
            Ok(state)
        }

        /// Replaces the whole state with `state` (from either trainer of the same model shape);
        /// fails without changing anything if the layout or a length differs.
        pub fn import_state(&mut self, state: &TrainerState) -> Result<(), TrainError> {
            if state.layout != self.layout {
                return Err(TrainError::StateMismatch {
                    what: "parameter layout",
                    expected: format!(
                        "{} tensors, {} values",
                        self.layout.len(),
                        self.num_params()
                    ),
                    got: format!(
                        "{} tensors, {} values",
                        state.layout.len(),
                        state.layout.iter().map(|(_, n)| n).sum::<usize>()
                    ),
                });
            }
            for (what, v) in [
                ("params length", &state.params),
                ("exp_avg length", &state.exp_avg),
                ("exp_avg_sq length", &state.exp_avg_sq),
            ] {
                if v.len() != self.num_params() {
                    return Err(TrainError::StateMismatch {
                        what,
                        expected: self.num_params().to_string(),
                        got: v.len().to_string(),
                    });
                }
            }
            self.copy_in(|s| &mut s.master, &state.params, "params")?;
            self.copy_in(|s| &mut s.exp_avg, &state.exp_avg, "exp_avg")?;
            self.copy_in(|s| &mut s.exp_avg_sq, &state.exp_avg_sq, "exp_avg_sq")?;
            self.step = state.step;
            Ok(())
        }

        /// One inner step on `tokens` (`rows x (seq_len + 1)` token ids): the rows split over the
        /// devices, then the step of [`crate::train::Trainer::inner_step`]. After a bad batch or a
        /// non-finite loss or norm nothing has changed.
        pub fn inner_step(&mut self, tokens: &[i64]) -> Result<StepStats, TrainError> {
            let vocab = self.spec.vocab;
            inner_step(self, tokens, vocab)
        }

        /// The micro-batches of device `d`: `(first row, rows)`.
        fn micro_batches(&self, rows: usize, d: usize) -> Vec<(usize, usize)> {
            let r = chunk_range(rows, self.shards.len(), d);
            let mb = self.config.micro_batch.max(1);
            (r.start..r.end).step_by(mb).map(|start| (start, mb.min(r.end - start))).collect()
        }

        /// Mean cross-entropy on `tokens` (rows of `seq_len + 1`), forward only: no gradients,
        /// no update. The rows are split over the devices as for a step.
        pub fn eval_loss(&mut self, tokens: &[i64]) -> Result<f64, TrainError> {
            let rows = crate::train::check_batch(tokens, self.config.seq_len, self.spec.vocab)?;
            let batch = batch_tensor(tokens, rows, self.config.seq_len, Device::Cpu)?;
            self.pass(&batch, rows, false).map(|(ce, _)| ce)
        }

        /// Forward and backward over every device's micro-batches, round by round; returns the
        /// batch's (cross-entropy, z-loss).
        fn accumulate(&mut self, batch: &Tensor, rows: usize) -> Result<(f64, f64), TrainError> {
            self.pass(batch, rows, true)
        }

        /// Every device's micro-batches, round by round: forward, and with `backward` the
        /// gradients too; returns the batch's (cross-entropy, z-loss).
        fn pass(
            &mut self,
            batch: &Tensor,
            rows: usize,
            backward: bool,
        ) -> Result<(f64, f64), TrainError> {
            let g = self.shards.len();
            let plans: Vec<Vec<(usize, usize)>> =
                (0..g).map(|d| self.micro_batches(rows, d)).collect();
            let rounds = plans.iter().map(Vec::len).max().unwrap_or(0);
            let s = self.config.seq_len as i64;
            for lane in &mut self.lanes {
                lane.ce = 0.0;
                lane.z = 0.0;
            }
            for k in 0..rounds {
                for (d, lane) in self.lanes.iter_mut().enumerate() {
                    lane.saved.clear();
                    lane.grad_out = None;
                    lane.input = None;
                    if let Some(&(start, n)) = plans[d].get(k) {
                        let device = self.shards[d].device;
                        let rows_t = batch
                            .f_narrow(0, start as i64, n as i64)
                            .and_then(|t| t.f_to_device(device))
                            .map_err(torch("slicing the batch"))?;
                        let input = rows_t.f_narrow(1, 0, s).map_err(torch("slicing the batch"))?;
                        let target = rows_t
                            .f_narrow(1, 1, s)
                            .and_then(|t| t.f_reshape([-1]))
                            .map_err(torch("slicing the batch"))?;
                        lane.input = Some((input, target));
                        lane.share = n as f64 / rows as f64;
                    }
                }
                let done = if backward { self.round() } else { self.forward_loss() };
                for lane in &mut self.lanes {
                    lane.saved.clear();
                    lane.grad_out = None;
                    lane.input = None;
                }
                done?;
            }
            Ok((self.lanes.iter().map(|l| l.ce).sum(), self.lanes.iter().map(|l| l.z).sum()))
        }

        /// The parameter tensors of the units, in forward order: the embedding, each block, then the
        /// head's (the final norm and the output matrix, or the embedding when tied).
        fn head_tensors(&self) -> [usize; 2] {
            let norm = 1 + PER_LAYER * self.spec.layers as usize;
            [norm, if self.spec.tied_embeddings { 0 } else { norm + 1 }]
        }

        /// One round without gradients: every device with a micro-batch runs it forward and
        /// adds its cross-entropy, weighted by its share.
        fn forward_loss(&mut self) -> Result<(), TrainError> {
            let layers = self.spec.layers as usize;
            let ws = self.gather(&[0], false)?;
            self.parallel(ws, "forward", |lane, ws| {
                let _guard = tch::no_grad_guard();
                let Some((input, _)) = &lane.input else { return Ok(None) };
                lane.saved.push(lane.blocks.embed(&ws[0], input)?);
                Ok(None)
            })?;
            for l in 0..layers {
                let tensors: Vec<usize> = (1 + PER_LAYER * l..1 + PER_LAYER * (l + 1)).collect();
                let ws = self.gather(&tensors, false)?;
                self.parallel(ws, "forward", |lane, ws| {
                    let _guard = tch::no_grad_guard();
                    let Some(h) = lane.saved.pop() else { return Ok(None) };
                    lane.saved.push(lane.blocks.block(&ws, &h)?);
                    Ok(None)
                })?;
            }
            let ws = self.gather(&self.head_tensors(), false)?;
            self.parallel(ws, "the loss", |lane, ws| {
                let _guard = tch::no_grad_guard();
                let (Some((_, target)), Some(h)) = (&lane.input, lane.saved.pop()) else {
                    return Ok(None);
                };
                let logits = lane.blocks.head(&ws[0], &ws[1], &h)?;
                let (ce, _) = loss_terms(&logits, target, 0.0).map_err(model_to_tch)?;
                lane.ce += ce.f_double_value(&[])? * lane.share;
                Ok(None)
            })?;
            Ok(())
        }

        /// One round: every device with a micro-batch runs it forward and backward.
        fn round(&mut self) -> Result<(), TrainError> {
            let layers = self.spec.layers as usize;
            let block =
                |l: usize| -> Vec<usize> { (1 + PER_LAYER * l..1 + PER_LAYER * (l + 1)).collect() };
            // Forward, without a graph, keeping each block's input.
            let ws = self.gather(&[0], false)?;
            self.parallel(ws, "forward", |lane, ws| {
                let _guard = tch::no_grad_guard();
                let Some((input, _)) = &lane.input else { return Ok(None) };
                let h = lane.blocks.embed(&ws[0], input)?;
                lane.saved.push(h);
                Ok(None)
            })?;
            for l in 0..layers {
                let ws = self.gather(&block(l), false)?;
                self.parallel(ws, "forward", |lane, ws| {
                    let _guard = tch::no_grad_guard();
                    let Some(h) = lane.saved.last() else { return Ok(None) };
                    let h = lane.blocks.block(&ws, h)?;
                    lane.saved.push(h);
                    Ok(None)
                })?;
            }
            // The head: the loss and its gradients.
            let head = self.head_tensors();
            let ws = self.gather(&head, true)?;
            let z_loss = self.config.z_loss;
            let grads = self.parallel(ws, "the loss's backward pass", move |lane, ws| {
                let (Some((_, target)), Some(h)) = (&lane.input, lane.saved.pop()) else {
                    return Ok(None);
                };
                let x = h.f_detach()?.set_requires_grad(true);
                let logits = lane.blocks.head(&ws[0], &ws[1], &x)?;
                let (ce, z) = loss_terms(&logits, target, z_loss).map_err(model_to_tch)?;
                let total = match &z {
                    Some(z) => ce.f_add(z)?,
                    None => ce.shallow_clone(),
                };
                total.f_mul_scalar(lane.share)?.f_backward()?;
                lane.ce += ce.f_double_value(&[])? * lane.share;
                lane.z += match z {
                    Some(z) => z.f_double_value(&[])? * lane.share,
                    None => 0.0,
                };
                lane.grad_out = Some(x.f_grad()?);
                Ok(Some(grads_of(&ws)?))
            })?;
            self.reduce_scatter(&head, grads)?;
            // Back through the blocks, each recomputed from its saved input.
            for l in (0..layers).rev() {
                let tensors = block(l);
                let ws = self.gather(&tensors, true)?;
                let grads = self.parallel(ws, "a block's backward pass", |lane, ws| {
                    let (Some(h), Some(g)) = (lane.saved.pop(), lane.grad_out.take()) else {
                        return Ok(None);
                    };
                    let x = h.f_detach()?.set_requires_grad(true);
                    let out = lane.blocks.block(&ws, &x)?;
                    out.f_mul(&g)?.f_sum(out.kind())?.f_backward()?;
                    lane.grad_out = Some(x.f_grad()?);
                    Ok(Some(grads_of(&ws)?))
                })?;
                self.reduce_scatter(&tensors, grads)?;
            }
            let ws = self.gather(&[0], true)?;
            let grads = self.parallel(ws, "the embedding's backward pass", |lane, ws| {
                let (Some((input, _)), Some(g)) = (&lane.input, lane.grad_out.take()) else {
                    return Ok(None);
                };
                let out = lane.blocks.embed(&ws[0], input)?;
                out.f_mul(&g)?.f_sum(out.kind())?.f_backward()?;
                Ok(Some(grads_of(&ws)?))
            })?;
            self.reduce_scatter(&[0], grads)
        }

        /// The full values of parameter tensors `tensors` on every device with a micro-batch, in
        /// the compute precision, from the shards that own them; with `grad`, as leaves that
        /// record their gradient.
        fn gather(
            &self,
            tensors: &[usize],
            grad: bool,
        ) -> Result<Vec<Option<Vec<Tensor>>>, TrainError> {
            let _guard = tch::no_grad_guard();
            let kind = self.lanes.first().map_or(Kind::Float, |l| l.blocks.kind());
            let mut out = Vec::with_capacity(self.lanes.len());
            for (lane, dest) in self.lanes.iter().zip(&self.shards) {
                if lane.input.is_none() {
                    out.push(None);
                    continue;
                }
                let mut ws = Vec::with_capacity(tensors.len());
                for &t in tensors {
                    let (lo, hi) = (self.offsets[t], self.offsets[t] + self.layout[t].1);
                    let mut pieces = Vec::new();
                    for s in &self.shards {
                        let (x, y) = (lo.max(s.range.start), hi.min(s.range.end));
                        if x < y {
                            let piece = s
                                .master
                                .f_narrow(0, (x - s.range.start) as i64, (y - x) as i64)
                                .and_then(|p| p.f_to_device(dest.device))
                                .map_err(torch("gathering weights"))?;
                            pieces.push(piece);
                        }
                    }
                    let full = if pieces.len() == 1 {
                        pieces.pop().unwrap_or_else(Tensor::new)
                    } else {
                        Tensor::f_cat(&pieces, 0).map_err(torch("gathering weights"))?
                    };
                    let w = full
                        .f_to_kind(kind)
                        .and_then(|w| w.f_view(self.shapes[t].as_slice()))
                        .and_then(|w| w.f_detach())
                        .map_err(torch("gathering weights"))?;
                    ws.push(if grad { w.set_requires_grad(true) } else { w });
                }
                out.push(Some(ws));
            }
            Ok(out)
        }

        /// Adds each device's gradients of `tensors` into the shards that own their values, in
        /// fp32, device after device in order.
        fn reduce_scatter(
            &mut self,
            tensors: &[usize],
            grads: Vec<Option<Vec<Tensor>>>,
        ) -> Result<(), TrainError> {
            let t = started();
            let out = self.reduce_scatter_untimed(tensors, grads);
            add(&self.times.reduce, t);
            out
        }

        fn reduce_scatter_untimed(
            &mut self,
            tensors: &[usize],
            grads: Vec<Option<Vec<Tensor>>>,
        ) -> Result<(), TrainError> {
            let _guard = tch::no_grad_guard();
            for (i, &t) in tensors.iter().enumerate() {
                let (lo, hi) = (self.offsets[t], self.offsets[t] + self.layout[t].1);
                let flats: Vec<Tensor> = grads
                    .iter()
                    .flatten()
                    .map(|g| g[i].f_reshape([-1]).and_then(|g| g.f_to_kind(Kind::Float)))
                    .collect::<Result<_, _>>()
                    .map_err(torch("reducing gradients"))?;
                for s in &mut self.shards {
                    let (x, y) = (lo.max(s.range.start), hi.min(s.range.end));
                    if x >= y {
                        continue;
                    }
                    let mut acc = s
                        .grad
                        .f_narrow(0, (x - s.range.start) as i64, (y - x) as i64)
                        .map_err(torch("reducing gradients"))?;
                    for f in &flats {
                        let part = f
                            .f_narrow(0, (x - lo) as i64, (y - x) as i64)
                            .and_then(|p| p.f_to_device(s.device))
                            .map_err(torch("reducing gradients"))?;
                        let _ = acc.f_add_(&part).map_err(torch("reducing gradients"))?;
                    }
                }
            }
            Ok(())
        }

        /// Runs `f` on every lane, one thread per device (inline for one), each with its gathered
        /// weights; returns what each returned, in device order.
        fn parallel<F>(
            &mut self,
            weights: Vec<Option<Vec<Tensor>>>,
            op: &'static str,
            f: F,
        ) -> Result<Vec<Option<Vec<Tensor>>>, TrainError>
        where
            F: Fn(&mut Lane, Vec<Tensor>) -> Result<Option<Vec<Tensor>>, TchError> + Sync,
        {
            let t = started();
            let out = self.parallel_untimed(weights, op, f);
            add(&self.times.compute, t);
            out
        }

        fn parallel_untimed<F>(
            &mut self,
            weights: Vec<Option<Vec<Tensor>>>,
            op: &'static str,
            f: F,
        ) -> Result<Vec<Option<Vec<Tensor>>>, TrainError>
        where
            F: Fn(&mut Lane, Vec<Tensor>) -> Result<Option<Vec<Tensor>>, TchError> + Sync,
        {
            let run = |lane: &mut Lane, ws: Option<Vec<Tensor>>| match ws {
                Some(ws) => f(lane, ws),
                None => Ok(None),
            };
            if self.lanes.len() == 1 {
                let ws = weights.into_iter().next().flatten();
                return Ok(vec![run(&mut self.lanes[0], ws).map_err(torch(op))?]);
            }
            let run = &run;
            let results: Vec<Result<Option<Vec<Tensor>>, TchError>> = std::thread::scope(|scope| {
                let handles: Vec<_> = self
                    .lanes
                    .iter_mut()
                    .zip(weights)
                    .map(|(lane, ws)| scope.spawn(move || run(lane, ws)))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| {
                            Err(TchError::Torch("a device thread panicked".into()))
                        })
                    })
                    .collect()
            });
            results.into_iter().map(|r| r.map_err(torch(op))).collect()
        }

        fn grad_norm(&self) -> Result<f64, TrainError> {
            let mut sum = 0.0;
            for s in &self.shards {
                let n = s
                    .grad
                    .f_norm()
                    .and_then(|n| n.f_double_value(&[]))
                    .map_err(torch("gradient norm"))?;
                sum += n * n;
            }
            Ok(sum.sqrt())
        }

        fn clip(&mut self, grad_norm: f64) -> Result<(), TrainError> {
            let clip = self.config.grad_clip;
            if clip <= 0.0 || grad_norm <= clip {
                return Ok(());
            }
            let coef = clip / (grad_norm + 1e-6);
            let _guard = tch::no_grad_guard();
            for s in &mut self.shards {
                let _ = s.grad.f_mul_scalar_(coef).map_err(torch("clipping gradients"))?;
            }
            Ok(())
        }

        /// AdamW on every shard, [`ADAM_CHUNK`] values at a time, with the unsharded trainer's
        /// formulas.
        fn adamw(&mut self, lr: f64) -> Result<(), TrainError> {
            let step = AdamStep::new(&self.config, lr, self.step);
            let _guard = tch::no_grad_guard();
            for s in &mut self.shards {
                let len = s.range.len();
                let mut at = 0;
                while at < len {
                    let n = ADAM_CHUNK.min(len - at);
                    let view = |t: &Tensor| t.f_narrow(0, at as i64, n as i64);
                    let update = || -> Result<(), TchError> {
                        let (mut p, mut m, mut v) =
                            (view(&s.master)?, view(&s.exp_avg)?, view(&s.exp_avg_sq)?);
                        step.apply(&mut p, &mut m, &mut v, &view(&s.grad)?)
                    };
                    update().map_err(torch("AdamW update"))?;
                    at += n;
                }
            }
            Ok(())
        }

        fn zero_grads(&mut self) {
            let _guard = tch::no_grad_guard();
            for s in &mut self.shards {
                let _ = s.grad.f_zero_();
            }
        }
    }

    impl StepParts for ShardedTrainer {
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
            let batch = batch_tensor(tokens, rows, self.config.seq_len, Device::Cpu)?;
            self.accumulate(&batch, rows)
        }

        fn gradient_norm(&mut self) -> Result<f64, TrainError> {
            let t = started();
            let norm = self.grad_norm();
            add(&self.times.update, t);
            norm
        }

        fn clip_and_update(&mut self, grad_norm: f64, lr: f64) -> Result<(), TrainError> {
            let t = started();
            let applied = self.clip(grad_norm).and_then(|()| self.adamw(lr));
            add(&self.times.update, t);
            applied
        }

        fn clear_gradients(&mut self) {
            self.zero_grads();
        }
    }

    /// The gradients of gathered weights (zeros where a weight received none).
    fn grads_of(ws: &[Tensor]) -> Result<Vec<Tensor>, TchError> {
        ws.iter()
            .map(|w| {
                let g = w.f_grad()?;
                if g.defined() { Ok(g) } else { w.f_zeros_like() }
            })
            .collect()
    }

    fn model_to_tch(e: ModelError) -> TchError {
        match e {
            ModelError::Torch { source, .. } => source,
            other => TchError::Torch(other.to_string()),
        }
    }
}
