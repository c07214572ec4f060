//! The Llama-3 decoder in tch: token embedding; per block RMSNorm, grouped-query attention with
//! RoPE and a causal mask, residual, RMSNorm, SwiGLU, residual; final RMSNorm; output head
//! (untied, or the embedding matrix when tied). No biases, no dropout.

use super::{ModelSpec, ParamSpec, Precision, param_specs};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;
use rayon::prelude::*;
use tch::{Device, Kind, TchError, Tensor};

/// What can go wrong in the model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// libtorch reported an error (out of memory, a device failure).
    #[error("libtorch failed in {op}: {source}")]
    Torch {
        /// What the model was doing.
        op: &'static str,
        /// libtorch's error.
        source: TchError,
    },
    /// A shape the model cannot be built with.
    #[error("model spec: {field} = {value}: expected {expected}")]
    BadSpec {
        /// The field of the spec.
        field: &'static str,
        /// Its value.
        value: u64,
        /// What was expected.
        expected: &'static str,
    },
    /// A flat vector whose length is not the parameter count.
    #[error(
        "flat {what} vector of {got} values: expected {expected} (the model's parameter count)"
    )]
    FlatLength {
        /// Which vector.
        what: &'static str,
        /// The parameter count.
        expected: usize,
        /// Its length.
        got: usize,
    },
    /// A CUDA device that libtorch does not see.
    #[error("device cuda:{index}: libtorch sees {available} CUDA device(s); {library}")]
    NoCuda {
        /// The device asked for.
        index: u32,
        /// How many libtorch sees.
        available: i64,
        /// Whether libtorch's CUDA library loaded, and if not, why.
        library: String,
    },
    /// An input that is not a `[batch, seq]` tensor of token ids.
    #[error(
        "model input of shape {shape:?}: expected [batch, seq] token ids with 1 <= seq <= {max_seq}"
    )]
    BadInput {
        /// The input's shape.
        shape: Vec<i64>,
        /// The longest sequence the model takes (the spec's `seq_len`).
        max_seq: usize,
    },
}

/// Attaches what the model was doing to a libtorch error.
pub(crate) trait TorchContext<T> {
    /// Maps a [`TchError`] to [`ModelError::Torch`] with `op`.
    fn during(self, op: &'static str) -> Result<T, ModelError>;
}

impl<T> TorchContext<T> for Result<T, TchError> {
    fn during(self, op: &'static str) -> Result<T, ModelError> {
        self.map_err(|source| ModelError::Torch { op, source })
    }
}

/// The tch device for a scenario's device; fails for a CUDA device libtorch does not see. A CUDA
/// device first loads libtorch's CUDA library ([`load_cuda`](crate::torch_info::load_cuda)).
pub fn tch_device(device: loco_core::scenario::Device) -> Result<Device, ModelError> {
    match device {
        loco_core::scenario::Device::Cpu => Ok(Device::Cpu),
        loco_core::scenario::Device::Cuda(index) => {
            let library = match crate::torch_info::load_cuda() {
                Ok(()) => "its CUDA library is loaded".to_owned(),
                Err(e) => format!("its CUDA library did not load: {e}"),
            };
            let available = tch::Cuda::device_count();
            if i64::from(index) < available {
                Ok(Device::Cuda(index as usize))
            } else {
                Err(ModelError::NoCuda { index, available, library })
            }
        }
    }
}

/// Parameters per transformer block, and their offsets in a block.
const PER_LAYER: usize = 9;
const ATTN_NORM: usize = 0;
const WQ: usize = 1;
const WK: usize = 2;
const WV: usize = 3;
const WO: usize = 4;
const FFN_NORM: usize = 5;
const W1: usize = 6;
const W2: usize = 7;
const W3: usize = 8;

/// Values generated per random stream when initialising (streams make the values independent of
/// the number of threads).
const INIT_CHUNK: usize = 1 << 20;

/// A Llama-3 model: fp32 parameters on one device, in the order of
/// [`crate::model::param_specs`].
///
/// Initialisation is seeded and done on the CPU by ChaCha8 streams, one per (tensor, 2^20-value
/// chunk), so a seed gives the same weights on any device and thread count: RMSNorm weights 1;
/// `wq`, `wk`, `wv`, `w1` normal with std 0.02; `wo`, `w2`, `w3` std `0.02 / sqrt(2 (layer + 1))`
/// (torchtitan's depth init); the output head std `dim^-0.5`; the embedding std 1 (`dim^-0.5`
/// when tied, as it is then also the head); every normal truncated at 3 std.
pub struct Llama {
    spec: ModelSpec,
    device: Device,
    precision: Precision,
    specs: Vec<ParamSpec>,
    params: Vec<Tensor>,
    blocks: Blocks,
}

impl std::fmt::Debug for Llama {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Llama")
            .field("spec", &self.spec)
            .field("device", &self.device)
            .field("precision", &self.precision)
            .field("params", &self.num_params())
            .finish()
    }
}

impl Llama {
    /// A model of shape `spec` on `device`, initialised from `seed`.
    pub fn new(
        spec: &ModelSpec,
        device: Device,
        precision: Precision,
        seed: u64,
    ) -> Result<Llama, ModelError> {
        check_spec(spec)?;
        let specs = param_specs(spec);
        let mut params = Vec::with_capacity(specs.len());
        for (index, p) in specs.iter().enumerate() {
            let values = init_values(spec, p, index, seed);
            let shape: Vec<i64> = p.shape.iter().map(|&s| s as i64).collect();
            let t = Tensor::f_from_slice(&values)
                .and_then(|t| t.f_view(shape.as_slice()))
                .and_then(|t| t.f_to_device(device))
                .during("creating parameters")?
                .set_requires_grad(true);
            params.push(t);
        }
        let blocks = Blocks::new(spec, device, precision)?;
        Ok(Llama { spec: spec.clone(), device, precision, specs, params, blocks })
    }

    /// The model's shape.
    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    /// Where its parameters live.
    pub fn device(&self) -> Device {
        self.device
    }

    /// What it computes in.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// Number of parameters (the spec's `param_count`).
    pub fn num_params(&self) -> usize {
        self.specs.iter().map(ParamSpec::numel).sum()
    }

    /// The parameter tensors' names and shapes, in order.
    pub fn param_specs(&self) -> &[ParamSpec] {
        &self.specs
    }

    /// `(name, numel)` of every parameter tensor, in order (see [`crate::model::param_layout`]).
    pub fn param_layout(&self) -> Vec<(String, usize)> {
        self.specs.iter().map(|p| (p.name.clone(), p.numel())).collect()
    }

    /// The parameter tensors, in order (fp32 leaves that require grad).
    pub fn params(&self) -> &[Tensor] {
        &self.params
    }

    pub(crate) fn params_mut(&mut self) -> &mut [Tensor] {
        &mut self.params
    }

    /// Every parameter copied into one flat fp32 CPU vector, in order.
    pub fn flat_params(&self) -> Result<Vec<f32>, ModelError> {
        let mut out = vec![0.0; self.num_params()];
        self.flat_params_into(&mut out)?;
        Ok(out)
    }

    /// Copies every parameter into `out`, whose length must be the parameter count.
    pub fn flat_params_into(&self, out: &mut [f32]) -> Result<(), ModelError> {
        tensors_to_flat(&self.params, out, "parameter")
    }

    /// Sets every parameter from a flat vector in order (without recording gradients).
    pub fn set_flat_params(&mut self, flat: &[f32]) -> Result<(), ModelError> {
        flat_to_tensors(flat, &mut self.params, "parameter")
    }

    /// Logits `[batch, seq, vocab]` in fp32 for token ids `[batch, seq]` (int64, any device),
    /// with a causal mask: position `t` sees positions `0..=t` only.
    pub fn forward(&self, input: &Tensor) -> Result<Tensor, ModelError> {
        let shape = input.size();
        let max_seq = self.spec.seq_len as usize;
        if shape.len() != 2 || shape[0] < 1 || shape[1] < 1 || shape[1] as usize > max_seq {
            return Err(ModelError::BadInput { shape, max_seq });
        }
        self.forward_inner(input).during("forward")
    }

    fn forward_inner(&self, input: &Tensor) -> Result<Tensor, TchError> {
        let b = &self.blocks;
        let p = &self.params;
        let mut h = b.embed(&p[0], input)?;
        for layer in 0..self.spec.layers as usize {
            let base = 1 + PER_LAYER * layer;
            h = b.block(&p[base..base + PER_LAYER], &h)?;
        }
        let norm = 1 + PER_LAYER * self.spec.layers as usize;
        let head = if self.spec.tied_embeddings { 0 } else { norm + 1 };
        b.head(&p[norm], &p[head], &h)
    }
}

/// The model's computation, unit by unit, with the weights passed in: the embedding, one
/// transformer block, the final norm and head. [`Llama`] calls them with its own parameters; the
/// sharded trainer ([`crate::sharded`]) with weights gathered from its shards for one unit at a
/// time. Weights may be fp32 or the compute precision: each is cast where it is used, so the
/// same weights give the same values either way.
pub(crate) struct Blocks {
    spec: ModelSpec,
    device: Device,
    kind: Kind,
    rope_cos: Tensor,
    rope_sin: Tensor,
}

impl Blocks {
    /// The units of `spec` computing in `precision` on `device` (builds the RoPE tables there).
    pub(crate) fn new(
        spec: &ModelSpec,
        device: Device,
        precision: Precision,
    ) -> Result<Blocks, ModelError> {
        check_spec(spec)?;
        let (rope_cos, rope_sin) = rope_tables(spec, device).during("building RoPE tables")?;
        let kind = match precision {
            Precision::F32 => Kind::Float,
            Precision::Bf16 => Kind::BFloat16,
        };
        Ok(Blocks { spec: spec.clone(), device, kind, rope_cos, rope_sin })
    }

    /// The kind activations and matrix products are computed in.
    pub(crate) fn kind(&self) -> Kind {
        self.kind
    }

    /// The hidden states `[batch, seq, dim]` of token ids `[batch, seq]`.
    pub(crate) fn embed(&self, emb: &Tensor, input: &Tensor) -> Result<Tensor, TchError> {
        let input = input.f_to_device(self.device)?;
        Tensor::f_embedding(emb, &input, -1, false, false)?.f_to_kind(self.kind)
    }

    /// RMSNorm of `x` with weight `w`, computed in fp32, returned in the compute kind.
    fn rms(&self, x: &Tensor, w: &Tensor) -> Result<Tensor, TchError> {
        let dim = i64::from(self.spec.dim);
        let w = w.f_to_kind(Kind::Float)?;
        x.f_to_kind(Kind::Float)?
            .f_rms_norm([dim], Some(&w), self.spec.norm_eps)?
            .f_to_kind(self.kind)
    }

    /// One transformer block on `h` with its nine weights in the order of
    /// [`crate::model::param_specs`].
    pub(crate) fn block(&self, ws: &[Tensor], h: &Tensor) -> Result<Tensor, TchError> {
        let (b, s) = (h.size()[0], h.size()[1]);
        let kind = self.kind;
        let spec = &self.spec;
        let (heads, kv_heads) = (i64::from(spec.heads), i64::from(spec.kv_heads));
        let hd = i64::from(spec.head_dim());
        let w = |i: usize| ws[i].f_to_kind(kind);
        let cos = self.rope_cos.f_narrow(0, 0, s)?.f_view([1, s, 1, hd / 2])?;
        let sin = self.rope_sin.f_narrow(0, 0, s)?.f_view([1, s, 1, hd / 2])?;
        // Rotates interleaved pairs (x[2i], x[2i+1]) by position * theta^(-2i/hd), in fp32
        // (Meta's and torchtitan's complex formulation).
        let rope = |x: &Tensor, n: i64| -> Result<Tensor, TchError> {
            let x = x.f_to_kind(Kind::Float)?.f_view([b, s, n, hd / 2, 2])?;
            let (x0, x1) = (x.f_select(-1, 0)?, x.f_select(-1, 1)?);
            let o0 = x0.f_mul(&cos)?.f_sub(&x1.f_mul(&sin)?)?;
            let o1 = x0.f_mul(&sin)?.f_add(&x1.f_mul(&cos)?)?;
            Tensor::f_stack(&[o0, o1], -1)?.f_view([b, s, n, hd])?.f_to_kind(kind)
        };
        let n_rep = heads / kv_heads;
        // [b, s, kv, hd] -> [b, heads, s, hd]: query head h reads kv head h / n_rep.
        let expand_kv = |x: Tensor| -> Result<Tensor, TchError> {
            let x = x.f_transpose(1, 2)?;
            if n_rep == 1 {
                return Ok(x);
            }
            x.f_unsqueeze(2)?
                .f_expand([b, kv_heads, n_rep, s, hd], false)?
                .f_reshape([b, heads, s, hd])
        };
        let x = self.rms(h, &ws[ATTN_NORM])?;
        let q = x.f_linear::<Tensor>(&w(WQ)?, None)?.f_view([b, s, heads, hd])?;
        let k = x.f_linear::<Tensor>(&w(WK)?, None)?.f_view([b, s, kv_heads, hd])?;
        let v = x.f_linear::<Tensor>(&w(WV)?, None)?.f_view([b, s, kv_heads, hd])?;
        let q = rope(&q, heads)?.f_transpose(1, 2)?;
        let k = expand_kv(rope(&k, kv_heads)?)?;
        let v = expand_kv(v)?;
        let a = Tensor::f_scaled_dot_product_attention::<Tensor>(
            &q, &k, &v, None, 0.0, true, None, false,
        )?;
        let a = a.f_transpose(1, 2)?.f_reshape([b, s, heads * hd])?;
        let h = h.f_add(&a.f_linear::<Tensor>(&w(WO)?, None)?)?;
        let x = self.rms(&h, &ws[FFN_NORM])?;
        let gate = x.f_linear::<Tensor>(&w(W1)?, None)?.f_silu()?;
        let up = x.f_linear::<Tensor>(&w(W3)?, None)?;
        let ff = gate.f_mul(&up)?.f_linear::<Tensor>(&w(W2)?, None)?;
        h.f_add(&ff)
    }

    /// fp32 logits `[batch, seq, vocab]` of the last hidden states: the final norm (weight
    /// `norm`) and the head (`out`: the output matrix, or the embedding when tied).
    pub(crate) fn head(&self, norm: &Tensor, out: &Tensor, h: &Tensor) -> Result<Tensor, TchError> {
        let h = self.rms(h, norm)?;
        h.f_linear::<Tensor>(&out.f_to_kind(self.kind)?, None)?.f_to_kind(Kind::Float)
    }
}

fn check_spec(spec: &ModelSpec) -> Result<(), ModelError> {
    super::check_shape(spec).map_err(|b| ModelError::BadSpec {
        field: b.field,
        value: u64::from(b.value),
        expected: b.expected,
    })
}

/// The initial values of parameter `index` (see [`Llama`]).
pub(crate) fn init_values(spec: &ModelSpec, p: &ParamSpec, index: usize, seed: u64) -> Vec<f32> {
    let n = p.numel();
    let dim = f64::from(spec.dim);
    let layer = p
        .name
        .strip_prefix("layers.")
        .and_then(|r| r.split('.').next())
        .and_then(|l| l.parse::<u32>().ok());
    let leaf = p.name.rsplit('.').nth(1).unwrap_or("");
    let std = match (leaf, layer) {
        ("attention_norm" | "ffn_norm" | "norm", _) => return vec![1.0; n],
        ("wq" | "wk" | "wv" | "w1", _) => 0.02,
        ("wo" | "w2" | "w3", Some(l)) => 0.02 / (2.0 * f64::from(l + 1)).sqrt(),
        ("tok_embeddings", _) if !spec.tied_embeddings => 1.0,
        _ => dim.powf(-0.5),
    };
    let mut out = vec![0.0f32; n];
    out.par_chunks_mut(INIT_CHUNK).enumerate().for_each(|(chunk, values)| {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(((index as u64) << 32) | chunk as u64);
        for v in values {
            *v = loop {
                let x: f64 = rng.sample(StandardNormal);
                if x.abs() <= 3.0 {
                    break (x * std) as f32;
                }
            };
        }
    });
    out
}

/// cos and sin of `position * theta^(-2i/hd)`, `[seq_len, hd / 2]`, fp32, computed in f64.
fn rope_tables(spec: &ModelSpec, device: Device) -> Result<(Tensor, Tensor), TchError> {
    let half = spec.head_dim() as usize / 2;
    let hd = f64::from(spec.head_dim());
    let seq = spec.seq_len as usize;
    let mut cos = Vec::with_capacity(seq * half);
    let mut sin = Vec::with_capacity(seq * half);
    for pos in 0..seq {
        for i in 0..half {
            let freq = spec.rope_theta.powf(-(2.0 * i as f64) / hd);
            let angle = pos as f64 * freq;
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
    let shape = [seq as i64, half as i64];
    let cos = Tensor::f_from_slice(&cos)?.f_view(shape)?.f_to_device(device)?;
    let sin = Tensor::f_from_slice(&sin)?.f_view(shape)?.f_to_device(device)?;
    Ok((cos, sin))
}

/// Copies fp32 tensors one after the other into `out`, whose length must be their total size.
pub(crate) fn tensors_to_flat(
    tensors: &[Tensor],
    out: &mut [f32],
    what: &'static str,
) -> Result<(), ModelError> {
    let expected: usize = tensors.iter().map(Tensor::numel).sum();
    if out.len() != expected {
        return Err(ModelError::FlatLength { what, expected, got: out.len() });
    }
    let mut at = 0;
    for t in tensors {
        let n = t.numel();
        t.f_detach()
            .and_then(|t| t.f_copy_data(&mut out[at..at + n], n))
            .during("copying tensors out")?;
        at += n;
    }
    Ok(())
}

/// Sets fp32 tensors from consecutive ranges of `flat`, without recording gradients.
pub(crate) fn flat_to_tensors(
    flat: &[f32],
    tensors: &mut [Tensor],
    what: &'static str,
) -> Result<(), ModelError> {
    let expected: usize = tensors.iter().map(Tensor::numel).sum();
    if flat.len() != expected {
        return Err(ModelError::FlatLength { what, expected, got: flat.len() });
    }
    let _guard = tch::no_grad_guard();
    let mut at = 0;
    for t in tensors.iter_mut() {
        let n = t.numel();
        let src = Tensor::f_from_slice(&flat[at..at + n])
            .and_then(|s| s.f_view(t.size().as_slice()))
            .during("copying tensors in")?;
        t.f_copy_(&src).during("copying tensors in")?;
        at += n;
    }
    Ok(())
}
