//! Writing a Hugging Face directory: `config.json` and the weights, sharded above a size.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use loco_core::scenario::ModelSpec;
use safetensors::Dtype;
use safetensors::tensor::{Metadata, TensorInfo};
use serde::Serialize;

use super::{
    CONFIG_FILE, Direction, HfConfig, HfError, HfParam, INDEX_FILE, SINGLE_FILE, check_model,
    hf_params, io_err, permute_rows,
};

/// What [`write`] wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Written {
    /// Every file, in the order written (the weights, the index if sharded, `config.json`).
    pub files: Vec<PathBuf>,
    /// Bytes of tensor data (the index's `total_size`).
    pub tensor_bytes: u64,
    /// Weight files: 1 for `model.safetensors`, else the shards.
    pub shards: usize,
}

/// The index of a sharded model, as `save_pretrained` writes it.
#[derive(Serialize)]
struct Index<'a> {
    metadata: IndexMeta,
    weight_map: BTreeMap<&'a str, &'a str>,
}

#[derive(Serialize)]
struct IndexMeta {
    total_size: u64,
}

/// Writes loco's model `spec` with the flat fp32 parameters `flat` (loco's order) into `dir` as a
/// `LlamaForCausalLM` (created if missing): `config.json` from `config` (typically
/// [`HfConfig::from_spec`], with token ids when known; its shape must be `spec`'s), and the
/// weights in fp32, in one `model.safetensors` when they fit `shard_bytes`, else in shards of at
/// most `shard_bytes` (a tensor larger than that gets a shard of its own) with an index. Weight
/// files of an earlier export that this one does not write are removed, so that the directory
/// holds one model. Deterministic and atomic per file; see the module docs.
pub fn write(
    dir: &Path,
    spec: &ModelSpec,
    config: &HfConfig,
    flat: &[f32],
    shard_bytes: u64,
) -> Result<Written, HfError> {
    let total = check_model(spec)?;
    if flat.len() != total {
        return Err(HfError::FlatLength { expected: total, got: flat.len() });
    }
    if config.model_spec() != HfConfig::from_spec(spec).model_spec() {
        return Err(HfError::Spec(format!(
            "config.json to write does not describe the model: {:?} against {:?}",
            config.model_spec(),
            spec
        )));
    }
    fs::create_dir_all(dir).map_err(io_err(dir, "create directory"))?;
    let params = hf_params(spec);
    let shards = plan_shards(&params, shard_bytes);
    let n = shards.len();
    let names: Vec<String> = if n == 1 {
        vec![SINGLE_FILE.to_string()]
    } else {
        (1..=n).map(|i| format!("model-{i:05}-of-{n:05}.safetensors")).collect()
    };
    let mut files = Vec::new();
    let mut weight_map = BTreeMap::new();
    for (shard, name) in shards.iter().zip(&names) {
        let path = dir.join(name);
        write_shard(&path, &params[shard.clone()], flat, spec)?;
        for p in &params[shard.clone()] {
            weight_map.insert(p.name.as_str(), name.as_str());
        }
        files.push(path);
    }
    let tensor_bytes: u64 = params.iter().map(|p| 4 * p.numel as u64).sum();
    if n > 1 {
        let index = Index { metadata: IndexMeta { total_size: tensor_bytes }, weight_map };
        let path = dir.join(INDEX_FILE);
        write_json(&path, &index)?;
        files.push(path);
    }
    remove_stale(dir, &names)?;
    let path = dir.join(CONFIG_FILE);
    write_json(&path, config)?;
    files.push(path);
    sync_dir(dir)?;
    tracing::info!(dir = %dir.display(), shards = n, tensor_bytes, "Hugging Face model written");
    Ok(Written { files, tensor_bytes, shards: n })
}

/// Consecutive ranges of `params` whose fp32 bytes fit `max` each (one tensor at least).
fn plan_shards(params: &[HfParam], max: u64) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut size) = (0, 0u64);
    for (i, p) in params.iter().enumerate() {
        let bytes = 4 * p.numel as u64;
        if i > start && size.saturating_add(bytes) > max {
            out.push(start..i);
            (start, size) = (i, 0);
        }
        size = size.saturating_add(bytes);
    }
    out.push(start..params.len());
    out
}

/// The header of a safetensors file of `params` in fp32, as the safetensors crate writes it
/// (the JSON, padded with spaces to a multiple of 8 bytes), with `{"format": "pt"}` as its
/// metadata (which `transformers` asks for).
fn header(params: &[HfParam]) -> Result<Vec<u8>, String> {
    let mut at = 0;
    let tensors = params
        .iter()
        .map(|p| {
            let end = at + 4 * p.numel;
            let info =
                TensorInfo { dtype: Dtype::F32, shape: p.shape.clone(), data_offsets: (at, end) };
            at = end;
            (p.name.clone(), info)
        })
        .collect();
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    let meta = Metadata::new(Some(meta), tensors).map_err(|e| e.to_string())?;
    let mut json = serde_json::to_vec(&meta).map_err(|e| e.to_string())?;
    json.resize(json.len().next_multiple_of(8), b' ');
    Ok(json)
}

/// Writes one weight file, atomically.
fn write_shard(
    path: &Path,
    params: &[HfParam],
    flat: &[f32],
    spec: &ModelSpec,
) -> Result<(), HfError> {
    let header = header(params).map_err(|what| HfError::File { path: path.to_path_buf(), what })?;
    let hd = spec.head_dim() as usize;
    let dim = spec.dim as usize;
    write_atomic(path, |w| {
        w.write_all(&(header.len() as u64).to_le_bytes())?;
        w.write_all(&header)?;
        let mut permuted = Vec::new();
        for p in params {
            let values = &flat[p.offset..p.offset + p.numel];
            let values = match p.rope_heads {
                Some(heads) => {
                    permuted.resize(values.len(), 0.0);
                    permute_rows(values, &mut permuted, heads, hd, dim, Direction::ToHf);
                    &permuted[..]
                }
                None => values,
            };
            write_f32(w, values)?;
        }
        Ok(())
    })
}

/// The little-endian bytes of `values`, in blocks.
fn write_f32(w: &mut impl Write, values: &[f32]) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(4 << 16);
    for chunk in values.chunks(1 << 16) {
        buf.clear();
        for x in chunk {
            buf.extend_from_slice(&x.to_le_bytes());
        }
        w.write_all(&buf)?;
    }
    Ok(())
}

fn write_json(path: &Path, value: &impl Serialize) -> Result<(), HfError> {
    let mut text = serde_json::to_vec_pretty(value)
        .map_err(|source| HfError::Json { path: path.to_path_buf(), source })?;
    text.push(b'\n');
    write_atomic(path, |w| w.write_all(&text))
}

/// Writes `path` through `body` into a temporary file beside it, `fsync`s it and renames it over
/// `path`; the temporary file is removed on failure.
fn write_atomic(
    path: &Path,
    body: impl FnOnce(&mut BufWriter<&File>) -> std::io::Result<()>,
) -> Result<(), HfError> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = path.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        let f = File::create(&tmp).map_err(io_err(&tmp, "create"))?;
        let mut w = BufWriter::with_capacity(1 << 20, &f);
        body(&mut w).and_then(|()| w.flush()).map_err(io_err(&tmp, "write"))?;
        drop(w);
        f.sync_all().map_err(io_err(&tmp, "fsync"))?;
        fs::rename(&tmp, path).map_err(io_err(&tmp, format!("rename to {}", path.display())))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Removes the weight files and index of an earlier export that `keep` (this export's weight
/// files) does not name: `model.safetensors`, `model-*-of-*.safetensors`, the index.
fn remove_stale(dir: &Path, keep: &[String]) -> Result<(), HfError> {
    let entries = fs::read_dir(dir).map_err(io_err(dir, "list directory"))?;
    let sharded = keep.len() > 1;
    for entry in entries {
        let entry = entry.map_err(io_err(dir, "list directory"))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let weights = name == SINGLE_FILE
            || (name.starts_with("model-")
                && name.ends_with(".safetensors")
                && name.contains("-of-"));
        let stale =
            (weights && !keep.iter().any(|k| k == name)) || (name == INDEX_FILE && !sharded);
        if stale {
            let path = entry.path();
            tracing::info!(file = %path.display(), "removing a weight file of an earlier export");
            fs::remove_file(&path).map_err(io_err(&path, "remove"))?;
        }
    }
    Ok(())
}

fn sync_dir(dir: &Path) -> Result<(), HfError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io_err(dir, "fsync directory"))
}
