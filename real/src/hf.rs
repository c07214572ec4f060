//! Hugging Face weights both ways: loco's Llama as a `LlamaForCausalLM` directory, and such a
//! directory as loco's flat parameter vector. Needs no libtorch.
//!
//! # The directory
//!
//! ```text
//! DIR/config.json                         LlamaForCausalLM's config (HfConfig)
//! DIR/model.safetensors                   the weights, fp32, when they fit one shard
//! DIR/model-00001-of-0000N.safetensors    ... or N shards (default: 5 GB each at most)
//! DIR/model.safetensors.index.json        ... with their index (weight_map, total_size)
//! ```
//!
//! # Names, shapes, permutation
//!
//! | loco (torchtitan) | Hugging Face |
//! |---|---|
//! | `tok_embeddings.weight` | `model.embed_tokens.weight` |
//! | `layers.{i}.attention_norm.weight` | `model.layers.{i}.input_layernorm.weight` |
//! | `layers.{i}.attention.wq.weight` | `model.layers.{i}.self_attn.q_proj.weight` (permuted) |
//! | `layers.{i}.attention.wk.weight` | `model.layers.{i}.self_attn.k_proj.weight` (permuted) |
//! | `layers.{i}.attention.wv.weight` | `model.layers.{i}.self_attn.v_proj.weight` |
//! | `layers.{i}.attention.wo.weight` | `model.layers.{i}.self_attn.o_proj.weight` |
//! | `layers.{i}.ffn_norm.weight` | `model.layers.{i}.post_attention_layernorm.weight` |
//! | `layers.{i}.feed_forward.w1.weight` | `model.layers.{i}.mlp.gate_proj.weight` |
//! | `layers.{i}.feed_forward.w2.weight` | `model.layers.{i}.mlp.down_proj.weight` |
//! | `layers.{i}.feed_forward.w3.weight` | `model.layers.{i}.mlp.up_proj.weight` |
//! | `norm.weight` | `model.norm.weight` |
//! | `output.weight` | `lm_head.weight` (absent when the embeddings are tied) |
//!
//! Shapes are the same on both sides (`[out, in]`). loco rotates interleaved pairs
//! `(x[2i], x[2i+1])` of each head (Meta's RoPE); Hugging Face's `rotate_half` rotates
//! `(x[i], x[i + hd/2])`. So the rows of `wq` and `wk` are permuted per head on the way out,
//! `hf = w.view(heads, hd/2, 2, dim).transpose(1, 2).reshape(heads * hd, dim)` (Meta's conversion
//! script), and back on the way in ([`permute_rows`]); the attention is then the same function.
//!
//! # Writing and reading
//!
//! [`write`] is deterministic (the same vector gives byte-identical files: fixed tensor order,
//! fixed JSON) and atomic per file (a temporary name, `fsync`, rename, `fsync` of the directory);
//! it holds one tensor beyond the flat vector at a time. [`read`] first reads and checks every
//! file's header (at most [`MAX_HEADER_BYTES`]) against the config: every tensor present once,
//! with its shape, of type F32, BF16 or F16, nothing else (`*.rotary_emb.inv_freq` buffers
//! aside); only then does it allocate the flat vector and read the tensors one at a time,
//! converting them to fp32 and checking that every value is finite. Every error names the file,
//! and the tensor where there is one. [`check_spec`] compares a config with a scenario's model.

use std::path::{Path, PathBuf};

use loco_core::scenario::ModelSpec;
use serde::{Deserialize, Serialize};

use crate::model::param_specs;

mod read;
mod write;

pub use read::{HfModel, read, read_config};
pub use write::{Written, write};

/// The config file of a Hugging Face model directory.
pub const CONFIG_FILE: &str = "config.json";
/// The weights file of a model in one shard.
pub const SINGLE_FILE: &str = "model.safetensors";
/// The index of a sharded model.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// The tokenizer file `loco export` copies beside the weights.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// The largest shard [`write`] writes unless told otherwise: 5 GB, as `save_pretrained`.
pub const DEFAULT_SHARD_BYTES: u64 = 5_000_000_000;
/// The largest safetensors header [`read`] accepts (the safetensors crate's own limit).
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// What can go wrong reading or writing a Hugging Face directory. Every error names the file.
#[derive(Debug, thiserror::Error)]
pub enum HfError {
    /// A file-system operation failed.
    #[error("{}: {op}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done.
        op: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A JSON file (config, index) does not parse.
    #[error("{}: {source}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// The parse error (with line and column).
        #[source]
        source: serde_json::Error,
    },
    /// `config.json` parses but describes a model loco does not have.
    #[error("{}: {field}: {what}", path.display())]
    Config {
        /// The file.
        path: PathBuf,
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        what: String,
    },
    /// A safetensors file (or the index) is malformed: header, size, truncation.
    #[error("{}: not a valid safetensors file: {what}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// A JSON file (config, index) larger than any such file is.
    #[error("{}: {len} bytes: more than the {max} such a file may have", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// A tensor is missing, unexpected, duplicated, or of the wrong type or shape.
    #[error("{}: tensor `{tensor}`: {what}", path.display())]
    Tensor {
        /// The file (or the index, for a tensor it lists).
        path: PathBuf,
        /// The tensor's Hugging Face name.
        tensor: String,
        /// What is wrong.
        what: String,
    },
    /// A tensor holds a NaN or an infinity.
    #[error("{}: tensor `{tensor}`: value {index} is {value}, expected a finite number", path.display())]
    NotFinite {
        /// The file.
        path: PathBuf,
        /// The tensor's Hugging Face name.
        tensor: String,
        /// The value's index in the tensor.
        index: usize,
        /// The value.
        value: f32,
    },
    /// The flat vector handed to [`write`] does not fit the model.
    #[error("flat parameter vector of {got} values: the model has {expected}")]
    FlatLength {
        /// The model's parameter count.
        expected: usize,
        /// The vector's length.
        got: usize,
    },
    /// The model's shape is not one loco can build (sizes of 0, dim not a multiple of heads...).
    #[error("model: {0}")]
    Spec(String),
}

pub(crate) fn io_err(path: &Path, op: impl Into<String>) -> impl FnOnce(std::io::Error) -> HfError {
    let path = path.to_path_buf();
    let op = op.into();
    move |source| HfError::Io { path, op, source }
}

/// `config.json` of a `LlamaForCausalLM`, as [`write`] writes it (fields in this order) and
/// [`read_config`] returns it (with Hugging Face's defaults for the fields a file leaves out).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HfConfig {
    /// `["LlamaForCausalLM"]`.
    pub architectures: Vec<String>,
    /// `"llama"`.
    pub model_type: String,
    /// `[model] dim`.
    pub hidden_size: u32,
    /// `[model] ffn`.
    pub intermediate_size: u32,
    /// `[model] layers`.
    pub num_hidden_layers: u32,
    /// `[model] heads`.
    pub num_attention_heads: u32,
    /// `[model] kv_heads`.
    pub num_key_value_heads: u32,
    /// `hidden_size / num_attention_heads` (loco's only head size).
    pub head_dim: u32,
    /// `[model] norm_eps`.
    pub rms_norm_eps: f64,
    /// `[model] rope_theta`.
    pub rope_theta: f64,
    /// `[model] vocab`.
    pub vocab_size: u32,
    /// `[model] seq_len`.
    pub max_position_embeddings: u32,
    /// `[model] tied_embeddings`.
    pub tie_word_embeddings: bool,
    /// `"silu"` (SwiGLU).
    pub hidden_act: String,
    /// `false`.
    pub attention_bias: bool,
    /// `false`.
    pub mlp_bias: bool,
    /// `"float32"`: what [`write`] stores.
    pub torch_dtype: String,
    /// `null`: loco's RoPE has no scaling.
    pub rope_scaling: Option<serde_json::Value>,
    /// The tokenizer's beginning-of-sequence id, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bos_token_id: Option<u32>,
    /// The tokenizer's end-of-sequence id, when known (one id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eos_token_id: Option<u32>,
}

impl HfConfig {
    /// The config of loco's model `spec`, stored in fp32, without token ids.
    pub fn from_spec(spec: &ModelSpec) -> HfConfig {
        HfConfig {
            architectures: vec!["LlamaForCausalLM".to_string()],
            model_type: "llama".to_string(),
            hidden_size: spec.dim,
            intermediate_size: spec.ffn,
            num_hidden_layers: spec.layers,
            num_attention_heads: spec.heads,
            num_key_value_heads: spec.kv_heads,
            head_dim: spec.head_dim(),
            rms_norm_eps: spec.norm_eps,
            rope_theta: spec.rope_theta,
            vocab_size: spec.vocab,
            max_position_embeddings: spec.seq_len,
            tie_word_embeddings: spec.tied_embeddings,
            hidden_act: "silu".to_string(),
            attention_bias: false,
            mlp_bias: false,
            torch_dtype: "float32".to_string(),
            rope_scaling: None,
            bos_token_id: None,
            eos_token_id: None,
        }
    }

    /// loco's model of this config (no preset; `seq_len` is `max_position_embeddings`).
    pub fn model_spec(&self) -> ModelSpec {
        ModelSpec {
            preset: None,
            layers: self.num_hidden_layers,
            dim: self.hidden_size,
            heads: self.num_attention_heads,
            kv_heads: self.num_key_value_heads,
            ffn: self.intermediate_size,
            vocab: self.vocab_size,
            seq_len: self.max_position_embeddings,
            rope_theta: self.rope_theta,
            norm_eps: self.rms_norm_eps,
            tied_embeddings: self.tie_word_embeddings,
        }
    }
}

/// One field of a scenario's `[model]` that differs from a Hugging Face config.
#[derive(Clone, Debug, PartialEq)]
pub struct SpecMismatch {
    /// The `[model]` key to change.
    pub key: &'static str,
    /// The config's field.
    pub hf_field: &'static str,
    /// The scenario's value.
    pub scenario: String,
    /// The config's value.
    pub hf: String,
}

/// A scenario's model that is not the model of a Hugging Face directory.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{}", describe_mismatches(.0))]
pub struct SpecMismatches(pub Vec<SpecMismatch>);

fn describe_mismatches(m: &[SpecMismatch]) -> String {
    let parts: Vec<String> = m
        .iter()
        .map(|m| {
            if m.key == "seq_len" {
                format!(
                    "[model] seq_len = {} exceeds the config's {} = {}: set `seq_len` to at most {} \
                     in [model]",
                    m.scenario, m.hf_field, m.hf, m.hf
                )
            } else {
                format!(
                    "[model] {} = {} but the config's {} = {}: set `{} = {}` in [model]",
                    m.key, m.scenario, m.hf_field, m.hf, m.key, m.hf
                )
            }
        })
        .collect();
    format!("the scenario's model is not the Hugging Face model: {}", parts.join("; "))
}

/// Compares a Hugging Face config with a scenario's model: every field that differs, named with
/// both values and the `[model]` key to change. The scenario's `seq_len` may be shorter than
/// `max_position_embeddings` (the weights do not depend on it), not longer.
pub fn check_spec(config: &HfConfig, spec: &ModelSpec) -> Result<(), SpecMismatches> {
    let hf = config.model_spec();
    let mut out = Vec::new();
    let mut int = |key, hf_field, s: u32, h: u32| {
        if s != h {
            out.push(SpecMismatch { key, hf_field, scenario: s.to_string(), hf: h.to_string() });
        }
    };
    int("layers", "num_hidden_layers", spec.layers, hf.layers);
    int("dim", "hidden_size", spec.dim, hf.dim);
    int("heads", "num_attention_heads", spec.heads, hf.heads);
    int("kv_heads", "num_key_value_heads", spec.kv_heads, hf.kv_heads);
    int("ffn", "intermediate_size", spec.ffn, hf.ffn);
    int("vocab", "vocab_size", spec.vocab, hf.vocab);
    let close = |a: f64, b: f64| a == b || (a - b).abs() <= 1e-12 * a.abs().max(b.abs());
    for (key, hf_field, s, h) in [
        ("rope_theta", "rope_theta", spec.rope_theta, hf.rope_theta),
        ("norm_eps", "rms_norm_eps", spec.norm_eps, hf.norm_eps),
    ] {
        if !close(s, h) {
            out.push(SpecMismatch { key, hf_field, scenario: s.to_string(), hf: h.to_string() });
        }
    }
    if spec.tied_embeddings != hf.tied_embeddings {
        out.push(SpecMismatch {
            key: "tied_embeddings",
            hf_field: "tie_word_embeddings",
            scenario: spec.tied_embeddings.to_string(),
            hf: hf.tied_embeddings.to_string(),
        });
    }
    if spec.seq_len > hf.seq_len {
        out.push(SpecMismatch {
            key: "seq_len",
            hf_field: "max_position_embeddings",
            scenario: spec.seq_len.to_string(),
            hf: hf.seq_len.to_string(),
        });
    }
    if out.is_empty() { Ok(()) } else { Err(SpecMismatches(out)) }
}

/// One parameter tensor as Hugging Face stores it, in loco's flat order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HfParam {
    /// Its Hugging Face name.
    pub name: String,
    /// Its shape (the same as loco's).
    pub shape: Vec<usize>,
    /// Where it starts in loco's flat vector.
    pub offset: usize,
    /// Its number of values.
    pub numel: usize,
    /// For `q_proj` and `k_proj`: the heads whose rows are permuted (see the module docs).
    pub rope_heads: Option<usize>,
}

/// The Hugging Face name of loco's parameter `name`.
pub fn hf_name(name: &str) -> String {
    let Some(rest) = name.strip_prefix("layers.") else {
        return match name {
            "tok_embeddings.weight" => "model.embed_tokens.weight".to_string(),
            "norm.weight" => "model.norm.weight".to_string(),
            "output.weight" => "lm_head.weight".to_string(),
            other => other.to_string(),
        };
    };
    let (layer, leaf) = rest.split_once('.').unwrap_or((rest, ""));
    let leaf = match leaf {
        "attention_norm.weight" => "input_layernorm.weight",
        "attention.wq.weight" => "self_attn.q_proj.weight",
        "attention.wk.weight" => "self_attn.k_proj.weight",
        "attention.wv.weight" => "self_attn.v_proj.weight",
        "attention.wo.weight" => "self_attn.o_proj.weight",
        "ffn_norm.weight" => "post_attention_layernorm.weight",
        "feed_forward.w1.weight" => "mlp.gate_proj.weight",
        "feed_forward.w2.weight" => "mlp.down_proj.weight",
        "feed_forward.w3.weight" => "mlp.up_proj.weight",
        other => other,
    };
    format!("model.layers.{layer}.{leaf}")
}

/// Every parameter tensor of `spec` with its Hugging Face name and place in the flat vector, in
/// loco's order (which is also the order of the files [`write`] writes).
pub fn hf_params(spec: &ModelSpec) -> Vec<HfParam> {
    let mut offset = 0;
    param_specs(spec)
        .into_iter()
        .map(|p| {
            let numel = p.numel();
            let rope_heads = if p.name.ends_with(".attention.wq.weight") {
                Some(spec.heads as usize)
            } else if p.name.ends_with(".attention.wk.weight") {
                Some(spec.kv_heads as usize)
            } else {
                None
            };
            let out = HfParam { name: hf_name(&p.name), shape: p.shape, offset, numel, rope_heads };
            offset += numel;
            out
        })
        .collect()
}

/// Whether the direction of [`permute_rows`] is loco's layout to Hugging Face's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Interleaved pairs to halves (export).
    ToHf,
    /// Halves to interleaved pairs (import).
    FromHf,
}

/// Permutes the rows of a `[heads * hd, cols]` projection (`src`, row-major) into `dst`: within
/// each head, row `2i + j` (loco) is row `j * hd/2 + i` (Hugging Face). `hd` must be even and the
/// lengths `heads * hd * cols`.
pub fn permute_rows(
    src: &[f32],
    dst: &mut [f32],
    heads: usize,
    hd: usize,
    cols: usize,
    dir: Direction,
) {
    debug_assert_eq!(src.len(), heads * hd * cols);
    debug_assert_eq!(dst.len(), src.len());
    let half = hd / 2;
    for h in 0..heads {
        for i in 0..half {
            for j in 0..2 {
                let loco = (h * hd + 2 * i + j) * cols;
                let hf = (h * hd + j * half + i) * cols;
                let (from, to) = match dir {
                    Direction::ToHf => (loco, hf),
                    Direction::FromHf => (hf, loco),
                };
                dst[to..to + cols].copy_from_slice(&src[from..from + cols]);
            }
        }
    }
}

/// Checks that loco can build `spec`: every size at least 1, `dim` a multiple of `heads`,
/// `heads` of `kv_heads`, an even head size, and a parameter count that fits memory's indices.
pub fn check_model(spec: &ModelSpec) -> Result<usize, HfError> {
    crate::model::check_shape(spec).map_err(|b| {
        HfError::Spec(format!("{} = {}, expected {}", b.field, b.value, b.expected))
    })?;
    usize::try_from(spec.param_count())
        .ok()
        .filter(|n| n.checked_mul(4).is_some() && spec.param_count() != u64::MAX)
        .ok_or_else(|| HfError::Spec("the parameter count overflows this machine".to_string()))
}

#[cfg(test)]
mod tests;
