//! Reading a Hugging Face Llama directory into loco's flat parameter vector.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use loco_core::scenario::ModelSpec;
use safetensors::Dtype;
use safetensors::tensor::{Metadata, TensorInfo};
use serde::Deserialize;

use super::{
    CONFIG_FILE, Direction, HfConfig, HfError, HfParam, INDEX_FILE, MAX_HEADER_BYTES, SINGLE_FILE,
    check_model, hf_params, io_err, permute_rows,
};

/// The largest `config.json` or index read (a real one is a few kilobytes, an index of a large
/// model a few hundred).
const MAX_JSON_BYTES: u64 = 64 << 20;

/// A Hugging Face model read into loco's layout.
#[derive(Clone)]
pub struct HfModel {
    /// Its config.
    pub config: HfConfig,
    /// loco's model of that config ([`HfConfig::model_spec`]).
    pub spec: ModelSpec,
    /// The parameters, fp32, in loco's flat order.
    pub flat: Vec<f32>,
    /// The weight files read.
    pub files: Vec<PathBuf>,
}

impl std::fmt::Debug for HfModel {
    /// The vector's length, not its values: it may hold billions of floats.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HfModel")
            .field("config", &self.config)
            .field("flat", &self.flat.len())
            .field("files", &self.files)
            .finish()
    }
}

/// `config.json` as found: every field optional, so that a missing one gets Hugging Face's
/// default or a clear error; fields loco does not use are ignored.
#[derive(Deserialize)]
struct RawConfig {
    architectures: Option<Vec<String>>,
    model_type: Option<String>,
    hidden_size: Option<u64>,
    intermediate_size: Option<u64>,
    num_hidden_layers: Option<u64>,
    num_attention_heads: Option<u64>,
    num_key_value_heads: Option<u64>,
    head_dim: Option<u64>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    vocab_size: Option<u64>,
    max_position_embeddings: Option<u64>,
    tie_word_embeddings: Option<bool>,
    hidden_act: Option<String>,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
    torch_dtype: Option<String>,
    dtype: Option<String>,
    rope_scaling: Option<serde_json::Value>,
    rope_parameters: Option<serde_json::Value>,
    bos_token_id: Option<serde_json::Value>,
    eos_token_id: Option<serde_json::Value>,
}

/// Reads `path` whole, refusing a file over `max` bytes.
fn read_bounded(path: &Path, max: u64) -> Result<Vec<u8>, HfError> {
    let f = File::open(path).map_err(io_err(path, "open"))?;
    let len = f.metadata().map_err(io_err(path, "stat"))?.len();
    if len > max {
        return Err(HfError::TooLarge { path: path.to_path_buf(), len, max });
    }
    let mut out = Vec::with_capacity(len as usize);
    f.take(max + 1).read_to_end(&mut out).map_err(io_err(path, "read"))?;
    Ok(out)
}

fn parse_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T, HfError> {
    let bytes = read_bounded(path, MAX_JSON_BYTES)?;
    serde_json::from_slice(&bytes)
        .map_err(|source| HfError::Json { path: path.to_path_buf(), source })
}

/// Whether a `rope_scaling` or `rope_parameters` value asks for plain RoPE: `null`, or a
/// `rope_type` (or `type`) of `"default"`.
fn plain_rope(v: &serde_json::Value) -> bool {
    let kind = v.get("rope_type").or_else(|| v.get("type"));
    v.is_null() || kind.is_none_or(|k| k == "default")
}

/// Reads and checks `DIR/config.json`: a Llama (`model_type` "llama") without biases, with
/// `hidden_act` "silu", no RoPE scaling, `head_dim` = `hidden_size / num_attention_heads`, and
/// a shape loco can build. Missing optional fields take Hugging Face's `LlamaConfig` defaults.
pub fn read_config(dir: &Path) -> Result<HfConfig, HfError> {
    let path = dir.join(CONFIG_FILE);
    let raw: RawConfig = parse_json(&path)?;
    let bad =
        |field: &'static str, what: String| HfError::Config { path: path.clone(), field, what };
    match raw.model_type.as_deref() {
        Some("llama") => {}
        other => {
            return Err(bad(
                "model_type",
                format!("is {other:?}: loco reads Llama models (model_type \"llama\")"),
            ));
        }
    }
    if let Some(a) = &raw.architectures
        && !a.iter().any(|a| a == "LlamaForCausalLM")
    {
        return Err(bad("architectures", format!("{a:?} has no \"LlamaForCausalLM\"")));
    }
    let size = |field: &'static str, v: Option<u64>| -> Result<u32, HfError> {
        let v = v.ok_or_else(|| bad(field, "missing".to_string()))?;
        u32::try_from(v).map_err(|_| bad(field, format!("{v} is too large")))
    };
    let hidden = size("hidden_size", raw.hidden_size)?;
    let heads = size("num_attention_heads", raw.num_attention_heads)?;
    let kv_heads =
        size("num_key_value_heads", raw.num_key_value_heads.or(raw.num_attention_heads))?;
    let hd = hidden.checked_div(heads).unwrap_or(0);
    if let Some(h) = raw.head_dim
        && h != u64::from(hd)
    {
        return Err(bad(
            "head_dim",
            format!("is {h}: loco's head size is hidden_size / num_attention_heads = {hd}"),
        ));
    }
    let hidden_act = raw.hidden_act.unwrap_or_else(|| "silu".to_string());
    if hidden_act != "silu" {
        return Err(bad(
            "hidden_act",
            format!("is {hidden_act:?}: loco's feed-forward is SwiGLU (\"silu\")"),
        ));
    }
    for (field, v) in [("attention_bias", raw.attention_bias), ("mlp_bias", raw.mlp_bias)] {
        if v == Some(true) {
            return Err(bad(field, "is true: loco's model has no biases".to_string()));
        }
    }
    for (field, v) in
        [("rope_scaling", &raw.rope_scaling), ("rope_parameters", &raw.rope_parameters)]
    {
        if let Some(v) = v
            && !plain_rope(v)
        {
            return Err(bad(
                field,
                format!("is {v}: loco's model lacks RoPE scaling (rope_scaling must be null)"),
            ));
        }
    }
    let theta_in_params =
        raw.rope_parameters.as_ref().and_then(|p| p.get("rope_theta")).and_then(|t| t.as_f64());
    let one_id = |v: &Option<serde_json::Value>| {
        v.as_ref().and_then(serde_json::Value::as_u64).and_then(|v| u32::try_from(v).ok())
    };
    let config = HfConfig {
        architectures: raw.architectures.unwrap_or_else(|| vec!["LlamaForCausalLM".to_string()]),
        model_type: "llama".to_string(),
        hidden_size: hidden,
        intermediate_size: size("intermediate_size", raw.intermediate_size)?,
        num_hidden_layers: size("num_hidden_layers", raw.num_hidden_layers)?,
        num_attention_heads: heads,
        num_key_value_heads: kv_heads,
        head_dim: hd,
        rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6),
        rope_theta: raw.rope_theta.or(theta_in_params).unwrap_or(10_000.0),
        vocab_size: size("vocab_size", raw.vocab_size)?,
        max_position_embeddings: size(
            "max_position_embeddings",
            raw.max_position_embeddings.or(Some(2048)),
        )?,
        tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
        hidden_act,
        attention_bias: false,
        mlp_bias: false,
        torch_dtype: raw.torch_dtype.or(raw.dtype).unwrap_or_else(|| "float32".to_string()),
        rope_scaling: None,
        bos_token_id: one_id(&raw.bos_token_id),
        eos_token_id: one_id(&raw.eos_token_id),
    };
    for (field, v) in [("rms_norm_eps", config.rms_norm_eps), ("rope_theta", config.rope_theta)] {
        if !(v.is_finite() && v > 0.0) {
            return Err(bad(field, format!("is {v}: expected a finite number above 0")));
        }
    }
    check_model(&config.model_spec()).map_err(|e| bad("the model's shape", e.to_string()))?;
    Ok(config)
}

/// The header of one safetensors file, read and checked without its data.
struct Header {
    path: PathBuf,
    /// Where the data starts: 8 + the header's length.
    data_start: u64,
    tensors: BTreeMap<String, TensorInfo>,
}

/// Reads and checks the header of `path`: its size (at most [`MAX_HEADER_BYTES`]), its JSON (the
/// safetensors crate's checks: contiguous offsets that match the shapes and types), and that the
/// file is exactly as long as the header says.
fn read_header(path: &Path) -> Result<Header, HfError> {
    let bad = |what: String| HfError::File { path: path.to_path_buf(), what };
    let mut f = File::open(path).map_err(io_err(path, "open"))?;
    let len = f.metadata().map_err(io_err(path, "stat"))?.len();
    if len < 8 {
        return Err(bad(format!("truncated: {len} bytes, less than the 8 of the header's size")));
    }
    let mut n = [0u8; 8];
    f.read_exact(&mut n).map_err(io_err(path, "read"))?;
    let n = u64::from_le_bytes(n);
    if n > MAX_HEADER_BYTES {
        return Err(bad(format!("header of {n} bytes: more than the {MAX_HEADER_BYTES} allowed")));
    }
    if 8 + n > len {
        return Err(bad(format!("truncated: a header of {n} bytes, in a file of {len}")));
    }
    let mut json = vec![0u8; n as usize];
    f.read_exact(&mut json).map_err(io_err(path, "read"))?;
    let meta: Metadata = serde_json::from_slice(&json).map_err(|e| bad(format!("header: {e}")))?;
    let described = 8 + n + meta.data_len() as u64;
    if described != len {
        let how = if described > len { "truncated" } else { "trailing bytes" };
        return Err(bad(format!(
            "{how}: the file has {len} bytes, its header describes {described}"
        )));
    }
    let tensors = meta.tensors().into_iter().map(|(k, v)| (k, v.clone())).collect();
    Ok(Header { path: path.to_path_buf(), data_start: 8 + n, tensors })
}

#[derive(Deserialize)]
struct RawIndex {
    weight_map: BTreeMap<String, String>,
}

/// Whether a tensor that is not a parameter may be ignored: RoPE's frequency buffer, which
/// older exports stored.
fn ignorable(name: &str) -> bool {
    name.ends_with("rotary_emb.inv_freq")
}

/// Every tensor of the directory: where it is (file, header) by name. `model.safetensors` when
/// there is one (as `transformers` prefers it), else the index and its shards, which must agree
/// with it: each tensor in the file the index names, and only there.
fn locate(dir: &Path) -> Result<(Vec<Header>, BTreeMap<String, usize>), HfError> {
    let single = dir.join(SINGLE_FILE);
    let index_path = dir.join(INDEX_FILE);
    if single.exists() || !index_path.exists() {
        let h = read_header(&single)?;
        let names = h.tensors.keys().map(|k| (k.clone(), 0)).collect();
        return Ok((vec![h], names));
    }
    let index: RawIndex = parse_json(&index_path)?;
    let files: BTreeSet<&str> = index.weight_map.values().map(String::as_str).collect();
    let mut headers = Vec::new();
    let mut at = BTreeMap::new();
    for file in files {
        let plain = !file.is_empty()
            && !file.starts_with('.')
            && Path::new(file).file_name().and_then(|n| n.to_str()) == Some(file)
            && !file.contains(['/', '\\']);
        if !plain {
            return Err(HfError::File {
                path: index_path.clone(),
                what: format!("weight file {file:?} is not a file name in the directory"),
            });
        }
        let h = read_header(&dir.join(file))?;
        for name in h.tensors.keys() {
            match index.weight_map.get(name) {
                Some(f) if f == file => {
                    at.insert(name.clone(), headers.len());
                }
                Some(f) => {
                    return Err(HfError::Tensor {
                        path: h.path.clone(),
                        tensor: name.clone(),
                        what: format!("is in this file too, the index puts it in {f}"),
                    });
                }
                None if ignorable(name) => {}
                None => {
                    return Err(HfError::Tensor {
                        path: h.path.clone(),
                        tensor: name.clone(),
                        what: format!("is in the file but not in {INDEX_FILE}"),
                    });
                }
            }
        }
        headers.push(h);
    }
    for (name, file) in &index.weight_map {
        if !at.contains_key(name) && !ignorable(name) {
            return Err(HfError::Tensor {
                path: dir.join(file),
                tensor: name.clone(),
                what: format!("{INDEX_FILE} puts it in this file, which has no such tensor"),
            });
        }
    }
    Ok((headers, at))
}

/// Checks every tensor found against the parameters expected: present, shape, type, nothing
/// else.
fn check_tensors(
    dir: &Path,
    config: &HfConfig,
    params: &[HfParam],
    headers: &[Header],
    at: &BTreeMap<String, usize>,
) -> Result<(), HfError> {
    let listing = if headers.len() == 1 { dir.join(SINGLE_FILE) } else { dir.join(INDEX_FILE) };
    for p in params {
        let Some(&file) = at.get(&p.name) else {
            let why = if p.name == "lm_head.weight" {
                " (config.json has tie_word_embeddings = false)"
            } else {
                ""
            };
            return Err(HfError::Tensor {
                path: listing,
                tensor: p.name.clone(),
                what: format!("missing: expected shape {:?}{why}", p.shape),
            });
        };
        let h = &headers[file];
        let info = &h.tensors[&p.name];
        let tensor_err =
            |what: String| HfError::Tensor { path: h.path.clone(), tensor: p.name.clone(), what };
        if info.shape != p.shape {
            return Err(tensor_err(format!("shape {:?}, expected {:?}", info.shape, p.shape)));
        }
        if !matches!(info.dtype, Dtype::F32 | Dtype::BF16 | Dtype::F16) {
            return Err(tensor_err(format!("type {:?}: loco reads F32, BF16 or F16", info.dtype)));
        }
    }
    let expected: BTreeSet<&str> = params.iter().map(|p| p.name.as_str()).collect();
    for (name, &file) in at {
        if expected.contains(name.as_str()) || ignorable(name) {
            continue;
        }
        let what = if name == "lm_head.weight" && config.tie_word_embeddings {
            "is stored, but config.json has tie_word_embeddings = true".to_string()
        } else {
            format!(
                "is not a parameter of this config's Llama ({} layers)",
                config.num_hidden_layers
            )
        };
        return Err(HfError::Tensor {
            path: headers[file].path.clone(),
            tensor: name.clone(),
            what,
        });
    }
    Ok(())
}

/// Converts the stored bytes of one tensor to fp32 into `out` (of the tensor's length).
fn to_f32(bytes: &[u8], dtype: Dtype, out: &mut [f32]) {
    match dtype {
        Dtype::BF16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16);
            }
        }
        Dtype::F16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
            }
        }
        _ => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
    }
}

/// Reads a Hugging Face Llama directory (`config.json` and `model.safetensors`, or an index and
/// its shards) into loco's flat fp32 vector. Checks everything first, reads one tensor at a time;
/// see the module docs.
pub fn read(dir: &Path) -> Result<HfModel, HfError> {
    let config = read_config(dir)?;
    let spec = config.model_spec();
    let total = check_model(&spec)?;
    let params = hf_params(&spec);
    let (headers, at) = locate(dir)?;
    check_tensors(dir, &config, &params, &headers, &at)?;
    // Every tensor is in a file that holds its bytes, so the vector is no larger than the files.
    let mut flat = vec![0.0f32; total];
    let (hd, dim) = (spec.head_dim() as usize, spec.dim as usize);
    let mut bytes = Vec::new();
    let mut stored = Vec::new();
    for (i, h) in headers.iter().enumerate() {
        let mut f = File::open(&h.path).map_err(io_err(&h.path, "open"))?;
        for p in params.iter().filter(|p| at.get(&p.name) == Some(&i)) {
            let info = &h.tensors[&p.name];
            let (start, end) = info.data_offsets;
            bytes.resize(end - start, 0);
            f.seek(SeekFrom::Start(h.data_start + start as u64))
                .and_then(|_| f.read_exact(&mut bytes))
                .map_err(io_err(&h.path, format!("read tensor {}", p.name)))?;
            let dst = &mut flat[p.offset..p.offset + p.numel];
            let values: &[f32] = match p.rope_heads {
                Some(_) => {
                    stored.resize(p.numel, 0.0);
                    to_f32(&bytes, info.dtype, &mut stored);
                    &stored
                }
                None => {
                    to_f32(&bytes, info.dtype, dst);
                    &*dst
                }
            };
            if let Some(index) = values.iter().position(|x| !x.is_finite()) {
                return Err(HfError::NotFinite {
                    path: h.path.clone(),
                    tensor: p.name.clone(),
                    index,
                    value: values[index],
                });
            }
            if let Some(heads) = p.rope_heads {
                permute_rows(&stored, dst, heads, hd, dim, Direction::FromHf);
            }
        }
    }
    let files = headers.into_iter().map(|h| h.path).collect();
    Ok(HfModel { config, spec, flat, files })
}
