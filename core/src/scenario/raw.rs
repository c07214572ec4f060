//! The raw layer: serde types that mirror the TOML file one to one. Every field is optional here
//! (required ones are checked by validation, which knows the field's path and what it expects),
//! unknown keys are rejected, and values that carry units are kept as written.

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use std::fmt;

/// A scalar as written: a string, an integer or a float (units are parsed by validation).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum RawScalar {
    Str(String),
    Int(i64),
    Float(f64),
}

impl fmt::Display for RawScalar {
    /// As written in the file: strings quoted.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RawScalar::Str(s) => write!(f, "{s:?}"),
            RawScalar::Int(i) => write!(f, "{i}"),
            RawScalar::Float(x) => write!(f, "{x}"),
        }
    }
}

struct ScalarVisitor;

impl Visitor<'_> for ScalarVisitor {
    type Value = RawScalar;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string with a unit or a number")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<RawScalar, E> {
        Ok(RawScalar::Str(v.to_owned()))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawScalar, E> {
        Ok(RawScalar::Int(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawScalar, E> {
        i64::try_from(v)
            .map(RawScalar::Int)
            .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(v), &self))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<RawScalar, E> {
        Ok(RawScalar::Float(v))
    }
}

impl<'de> Deserialize<'de> for RawScalar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ScalarVisitor)
    }
}

/// A value that may vary over time: a scalar, `{ uniform = [lo, hi], resample = ... }` or
/// `{ trace = [[time, value], ...] }`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum RawVarying {
    Scalar(RawScalar),
    Table(RawVaryingTable),
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawVaryingTable {
    pub(crate) uniform: Option<Vec<RawScalar>>,
    pub(crate) trace: Option<Vec<Vec<RawScalar>>>,
    pub(crate) resample: Option<RawScalar>,
}

struct VaryingVisitor;

impl<'de> Visitor<'de> for VaryingVisitor {
    type Value = RawVarying;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "a value with a unit, { uniform = [low, high] } or { trace = [[time, value], ...] }",
        )
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<RawVarying, E> {
        Ok(RawVarying::Scalar(RawScalar::Str(v.to_owned())))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawVarying, E> {
        Ok(RawVarying::Scalar(RawScalar::Int(v)))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawVarying, E> {
        ScalarVisitor.visit_u64(v).map(RawVarying::Scalar)
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<RawVarying, E> {
        Ok(RawVarying::Scalar(RawScalar::Float(v)))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawVarying, A::Error> {
        RawVaryingTable::deserialize(de::value::MapAccessDeserializer::new(map))
            .map(RawVarying::Table)
    }
}

impl<'de> Deserialize<'de> for RawVarying {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(VaryingVisitor)
    }
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawScenario {
    pub(crate) name: Option<String>,
    pub(crate) description: Option<String>,
    pub(crate) seed: Option<u64>,
    pub(crate) published: Option<String>,
    pub(crate) model: Option<RawModel>,
    pub(crate) diloco: Option<RawDiloco>,
    pub(crate) mesh: Option<RawMesh>,
    #[serde(default)]
    pub(crate) regions: Vec<RawRegion>,
    #[serde(default)]
    pub(crate) links: Vec<RawLink>,
    #[serde(default)]
    pub(crate) nodes: Vec<RawNode>,
    #[serde(default)]
    pub(crate) churn: Vec<RawChurn>,
    #[serde(default)]
    pub(crate) failures: Vec<RawFailures>,
    #[serde(default)]
    pub(crate) diurnal: Vec<RawDiurnal>,
    #[serde(default)]
    pub(crate) arrivals: Vec<RawArrivals>,
    pub(crate) stop: Option<RawStop>,
    pub(crate) sim: Option<RawSim>,
    pub(crate) real: Option<RawReal>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawModel {
    pub(crate) preset: Option<String>,
    pub(crate) layers: Option<u32>,
    pub(crate) dim: Option<u32>,
    pub(crate) heads: Option<u32>,
    pub(crate) kv_heads: Option<u32>,
    pub(crate) ffn: Option<u32>,
    pub(crate) vocab: Option<u32>,
    pub(crate) seq_len: Option<u32>,
    pub(crate) rope_theta: Option<f64>,
    pub(crate) norm_eps: Option<f64>,
    pub(crate) tied_embeddings: Option<bool>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDiloco {
    pub(crate) inner_steps: Option<u64>,
    pub(crate) codec: Option<String>,
    pub(crate) outer_lr: Option<f64>,
    pub(crate) outer_momentum: Option<f64>,
    pub(crate) nesterov: Option<bool>,
    pub(crate) inner_lr: Option<f64>,
    pub(crate) betas: Option<Vec<f64>>,
    pub(crate) warmup_steps: Option<u64>,
    pub(crate) decay_start: Option<u64>,
    pub(crate) decay_steps: Option<u64>,
    pub(crate) weight_decay: Option<f64>,
    pub(crate) grad_clip: Option<f64>,
    pub(crate) z_loss: Option<f64>,
    pub(crate) batch_tokens: Option<u64>,
    pub(crate) segment: Option<RawScalar>,
    pub(crate) mode: Option<String>,
    pub(crate) fragments: Option<u32>,
    pub(crate) mix: Option<f64>,
    pub(crate) sync_delay: Option<u64>,
    pub(crate) sparse_density: Option<f64>,
    pub(crate) sparse_chunk: Option<u32>,
    pub(crate) sparse_bits: Option<u8>,
    pub(crate) error_feedback: Option<f64>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMesh {
    pub(crate) heartbeat: Option<RawScalar>,
    pub(crate) heartbeat_timeout: Option<RawScalar>,
    pub(crate) barrier_timeout: Option<RawScalar>,
    pub(crate) max_retries: Option<u32>,
    pub(crate) join_mode: Option<String>,
    pub(crate) probe: Option<RawScalar>,
    pub(crate) coordinator_timeout: Option<RawScalar>,
    pub(crate) rejoin_for: Option<RawScalar>,
    pub(crate) coordinator_region: Option<String>,
    pub(crate) min_members: Option<u32>,
    pub(crate) join_window: Option<RawScalar>,
    pub(crate) sync_timeout: Option<RawScalar>,
    pub(crate) state_resend_after: Option<RawScalar>,
    pub(crate) compute_timeout: Option<RawScalar>,
    pub(crate) allreduce_timeout: Option<RawScalar>,
    pub(crate) retry_backoff: Option<RawScalar>,
    pub(crate) progress_timeout: Option<RawScalar>,
    pub(crate) state_senders: Option<u32>,
    pub(crate) ring: Option<String>,
    pub(crate) max_queue: Option<u32>,
    pub(crate) max_admissions: Option<u32>,
    pub(crate) max_update_ratio: Option<f64>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRegion {
    pub(crate) name: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLink {
    pub(crate) from: Option<String>,
    pub(crate) to: Option<String>,
    pub(crate) oneway: Option<bool>,
    pub(crate) bandwidth: Option<RawVarying>,
    pub(crate) latency: Option<RawVarying>,
    pub(crate) jitter: Option<RawScalar>,
    pub(crate) streams: Option<u32>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawNode {
    pub(crate) name: Option<String>,
    pub(crate) count: Option<u32>,
    pub(crate) region: Option<String>,
    pub(crate) gpus: Option<u32>,
    pub(crate) step_time: Option<RawScalar>,
    pub(crate) step_jitter: Option<f64>,
    pub(crate) start: Option<RawScalar>,
    pub(crate) nic: Option<RawScalar>,
    pub(crate) peak_flops: Option<f64>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawChurn {
    pub(crate) at: Option<RawScalar>,
    pub(crate) kind: Option<String>,
    pub(crate) node: Option<String>,
    pub(crate) nodes: Option<Vec<String>>,
    pub(crate) from: Option<String>,
    pub(crate) to: Option<String>,
    pub(crate) oneway: Option<bool>,
    pub(crate) bandwidth: Option<RawVarying>,
    pub(crate) latency: Option<RawVarying>,
    pub(crate) jitter: Option<RawScalar>,
    #[serde(rename = "for")]
    pub(crate) for_: Option<RawScalar>,
    pub(crate) during: Option<String>,
    pub(crate) step: Option<u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawFailures {
    pub(crate) nodes: Option<Vec<String>>,
    pub(crate) region: Option<String>,
    pub(crate) kind: Option<String>,
    pub(crate) mtbf: Option<RawScalar>,
    pub(crate) shape: Option<f64>,
    pub(crate) repair: Option<RawScalar>,
    pub(crate) up: Option<Vec<RawScalar>>,
    pub(crate) down: Option<Vec<RawScalar>>,
    pub(crate) from: Option<RawScalar>,
    pub(crate) until: Option<RawScalar>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawArrivals {
    pub(crate) nodes: Option<Vec<String>>,
    pub(crate) region: Option<String>,
    pub(crate) every: Option<RawScalar>,
    pub(crate) from: Option<RawScalar>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDiurnal {
    pub(crate) nodes: Option<Vec<String>>,
    pub(crate) region: Option<String>,
    pub(crate) offline_at: Option<RawScalar>,
    pub(crate) offline_for: Option<RawScalar>,
    pub(crate) jitter: Option<RawScalar>,
    pub(crate) from: Option<RawScalar>,
    pub(crate) until: Option<RawScalar>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawStop {
    pub(crate) outer_steps: Option<u64>,
    pub(crate) time: Option<RawScalar>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSim {
    pub(crate) tick: Option<RawScalar>,
    pub(crate) numerics: Option<String>,
    pub(crate) elements: Option<u64>,
    pub(crate) duration_limit: Option<RawScalar>,
    pub(crate) outer_cost: Option<f64>,
    pub(crate) state_prepare_cost: Option<f64>,
    pub(crate) state_receive_cost: Option<f64>,
    pub(crate) encode_cost: Option<f64>,
    pub(crate) decode_cost: Option<f64>,
    pub(crate) tcp: Option<String>,
    pub(crate) executor: Option<String>,
    pub(crate) collectives: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawReal {
    pub(crate) device: Option<String>,
    pub(crate) precision: Option<String>,
    pub(crate) data: Option<String>,
    pub(crate) init: Option<String>,
    pub(crate) eval_every: Option<u64>,
    pub(crate) eval_sequences: Option<u32>,
    pub(crate) micro_batch: Option<u32>,
    pub(crate) seq_len: Option<u32>,
    pub(crate) checkpoint_dir: Option<String>,
    pub(crate) checkpoint_remote: Option<String>,
    pub(crate) checkpoint_every: Option<u64>,
    pub(crate) keep: Option<u32>,
    pub(crate) secret_env: Option<String>,
    pub(crate) secret: Option<String>,
    pub(crate) roster: Option<String>,
    pub(crate) network: Option<String>,
}
