//! `loco export`: a checkpoint's outer weights as a Hugging Face `LlamaForCausalLM` directory;
//! and the other way, the `[real] init` weights a run starts from. Plain safetensors work: no
//! libtorch.
//!
//! A checkpoint records its parameter layout (names and sizes) and, since it was added to the
//! metadata, the model's shape (heads, RoPE theta, norm epsilon, sequence length); `export` takes
//! the shape from there, or from `--scenario` (the scenario the run was trained with) for an older
//! checkpoint, checking that it gives the checkpoint's layout (and its recorded shape).

use crate::InputError;
use anyhow::{Context, Result, anyhow};
use clap::{Args, ValueEnum};
use loco_core::node::digest::weights_digest_parallel;
use loco_core::scenario::{ModelSpec, Scenario};
use loco_real::checkpoint::{self, Buffer, CheckpointError, LoadedBuffer, META_FILE};
use loco_real::hf::{self, HfConfig, TOKENIZER_FILE};
use loco_real::launch::scenario_base;
use std::fs::{self, File};
use std::path::{Path, PathBuf};

#[derive(Debug, Args)]
pub(crate) struct ExportArgs {
    /// The checkpoint: a step directory (DIR/<node>/step-N) or a node's directory (DIR/<node>:
    /// its newest complete step).
    pub(crate) checkpoint: PathBuf,
    /// The format to write.
    #[arg(long, value_enum, default_value_t = ExportFormat::Hf)]
    pub(crate) format: ExportFormat,
    /// The directory to write into (created if missing; weight files of an earlier export there
    /// are replaced).
    #[arg(long, value_name = "DIR")]
    pub(crate) out: PathBuf,
    /// The scenario the checkpoint was trained with: its `[model]` must be the one the
    /// checkpoint records, and its `[real] data` directory gives the tokenizer. Optional: a
    /// checkpoint records its model (needed for one written before it did).
    #[arg(long, value_name = "FILE")]
    pub(crate) scenario: Option<PathBuf>,
    /// The tokenizer to copy into DIR as tokenizer.json (default: tokenizer.json in the
    /// scenario's `[real] data` directory, when there is one).
    #[arg(long, value_name = "FILE")]
    pub(crate) tokenizer: Option<PathBuf>,
    /// The largest weight file, in bytes: a larger model is written in shards with an index.
    #[arg(long, value_name = "BYTES", default_value_t = loco_real::hf::DEFAULT_SHARD_BYTES)]
    pub(crate) shard_size: u64,
}

/// What `loco export` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum ExportFormat {
    /// A Hugging Face `LlamaForCausalLM` directory (safetensors).
    Hf,
}

/// `loco export`.
pub(crate) fn export(a: &ExportArgs) -> Result<()> {
    // The one format so far (a new one makes this an error until it is handled).
    let ExportFormat::Hf = a.format;
    let ck = load_checkpoint(&a.checkpoint)?;
    let Some(scenario_path) = &a.scenario else {
        // The checkpoint's own record of the model (written since checkpoints record it).
        let Some(spec) = &ck.meta.model else {
            return Err(InputError(anyhow!(
                "{}: this checkpoint records its parameter layout, not the whole model (heads, \
                 RoPE theta, norm epsilon): pass --scenario FILE, the scenario it was trained \
                 with",
                ck.path.display()
            ))
            .into());
        };
        check_layout(&ck, spec, &ck.path)?;
        let tokenizer = a.tokenizer.clone();
        return write_export(a, &ck, spec, tokenizer);
    };
    let s = Scenario::load(scenario_path).map_err(|e| InputError(anyhow!(e)))?;
    let spec = s.model();
    check_layout(&ck, spec, scenario_path)?;
    if let Some(recorded) = ck.meta.model.as_ref().filter(|m| *m != spec) {
        return Err(InputError(anyhow!(
            "{}: the checkpoint records a model that differs from the [model] of {}: {recorded:?} \
             against {spec:?}",
            ck.path.display(),
            scenario_path.display()
        ))
        .into());
    }
    if ck.meta.scenario != s.name() {
        tracing::warn!(
            checkpoint = ck.meta.scenario,
            scenario = s.name(),
            "the checkpoint was written by a run of another scenario (same parameter layout)"
        );
    }
    let tokenizer = tokenizer_source(a, &s, scenario_path)?;
    write_export(a, &ck, spec, tokenizer)
}

/// Refuses a checkpoint whose parameter layout is not `spec`'s (`source`: where `spec` came
/// from, for the message).
fn check_layout(ck: &LoadedBuffer, spec: &ModelSpec, source: &Path) -> Result<()> {
    let layout = loco_real::model::param_layout(spec);
    if layout != ck.meta.layout {
        let first = layout
            .iter()
            .zip(&ck.meta.layout)
            .find(|(a, b)| a != b)
            .map(|(a, b)| format!("the scenario's {a:?} against the checkpoint's {b:?}"))
            .unwrap_or_else(|| {
                format!(
                    "{} parameter tensors in the scenario's model, {} in the checkpoint",
                    layout.len(),
                    ck.meta.layout.len()
                )
            });
        return Err(InputError(anyhow!(
            "{}: the checkpoint's parameters are not those of the model of {}: {first}",
            ck.path.display(),
            source.display()
        ))
        .into());
    }
    Ok(())
}

/// Writes the export of `ck`'s outer weights as a model of shape `spec`, with `tokenizer`.
fn write_export(
    a: &ExportArgs,
    ck: &LoadedBuffer,
    spec: &ModelSpec,
    tokenizer: Option<PathBuf>,
) -> Result<()> {
    let outer = &ck.values;
    let written = hf::write(&a.out, spec, &HfConfig::from_spec(spec), outer, a.shard_size)
        .with_context(|| format!("exporting to {}", a.out.display()))?;
    let mut files = written.files;
    if let Some(src) = tokenizer {
        let dst = a.out.join(TOKENIZER_FILE);
        copy_atomic(&src, &dst)?;
        files.push(dst);
    }
    println!(
        "exported the outer weights of {} (node {}, outer step {}, weights {}) as a Hugging Face \
         LlamaForCausalLM: {} parameters, {} weight file(s)",
        ck.path.display(),
        ck.meta.node,
        ck.meta.outer_step,
        weights_digest_parallel(outer),
        outer.len(),
        written.shards
    );
    for f in &files {
        println!("  {}", f.display());
    }
    Ok(())
}

/// The outer weights of the checkpoint at `path`, a step directory (with `meta.json`) or a
/// node's directory (its newest complete step), verified; the other buffers are not read.
fn load_checkpoint(path: &Path) -> Result<LoadedBuffer> {
    if path.join(META_FILE).exists() {
        return checkpoint::load_buffer(path, Buffer::Outer)
            .map_err(|e| InputError(e.into()).into());
    }
    let node = path.file_name().and_then(|n| n.to_str());
    let root = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let found = match node.map(|node| (node, checkpoint::latest_buffer(root, node, Buffer::Outer)))
    {
        Some((_, Ok(found))) => found,
        // A name that no node can have: not a node's directory.
        Some((_, Err(CheckpointError::Config { .. }))) | None => None,
        Some((_, Err(e))) => return Err(InputError(e.into()).into()),
    };
    found.ok_or_else(|| {
        InputError(anyhow!(
            "{}: no checkpoint there: expected a step directory (DIR/<node>/step-N, with \
             {META_FILE}) or a node's directory (DIR/<node>, with step-N directories)",
            path.display()
        ))
        .into()
    })
}

/// The tokenizer to copy beside the weights: `--tokenizer`, else `tokenizer.json` in the
/// scenario's `[real] data` directory (the data path itself when it is a directory, else the
/// directory it is in), when there is one.
fn tokenizer_source(a: &ExportArgs, s: &Scenario, scenario_path: &Path) -> Result<Option<PathBuf>> {
    if let Some(t) = &a.tokenizer {
        if !t.is_file() {
            return Err(InputError(anyhow!("--tokenizer {}: no such file", t.display())).into());
        }
        return Ok(Some(t.clone()));
    }
    let Some(data) = &s.real().data else { return Ok(None) };
    let data = scenario_base(scenario_path).join(data);
    let dir =
        if data.is_dir() { data } else { data.parent().map(Path::to_path_buf).unwrap_or_default() };
    let candidate = dir.join(TOKENIZER_FILE);
    Ok(candidate.is_file().then_some(candidate))
}

/// Copies `src` to `dst` through a temporary file beside it, `fsync`'d before the rename.
fn copy_atomic(src: &Path, dst: &Path) -> Result<()> {
    let name = dst.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = dst.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| -> Result<()> {
        fs::copy(src, &tmp)
            .with_context(|| format!("copying {} to {}", src.display(), tmp.display()))?;
        File::open(&tmp)
            .and_then(|f| f.sync_all())
            .with_context(|| format!("fsync {}", tmp.display()))?;
        fs::rename(&tmp, dst).with_context(|| format!("renaming to {}", dst.display()))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// The directory of `[real] init`, when the scenario has one (relative to the scenario file).
fn init_dir(s: &Scenario, scenario_path: &Path) -> Option<PathBuf> {
    s.real().init.as_ref().map(|d| scenario_base(scenario_path).join(d))
}

/// Checks `[real] init`'s `config.json` against the scenario's model (reads no weights): what
/// a launch checks once before it starts the workers.
pub(crate) fn check_init(s: &Scenario, scenario_path: &Path) -> Result<()> {
    let Some(dir) = init_dir(s, scenario_path) else { return Ok(()) };
    let config = hf::read_config(&dir).map_err(|e| init_error(scenario_path, &dir, &e))?;
    hf::check_spec(&config, s.model()).map_err(|e| init_error(scenario_path, &dir, &e))?;
    Ok(())
}

fn init_error(scenario_path: &Path, dir: &Path, e: &dyn std::fmt::Display) -> anyhow::Error {
    InputError(anyhow!("{}: [real] init = {}: {e}", scenario_path.display(), dir.display())).into()
}

/// The weights `[real] init` names, in loco's flat order, when the scenario has it: the Hugging
/// Face directory read and checked against the scenario's model (every differing field named).
/// Every node reads the same files, so every node starts from the same weights; their digest is
/// logged.
#[cfg(feature = "torch")]
pub(crate) fn init_weights(s: &Scenario, scenario_path: &Path) -> Result<Option<Vec<f32>>> {
    let Some(dir) = init_dir(s, scenario_path) else { return Ok(None) };
    check_init(s, scenario_path)?;
    let m = hf::read(&dir).map_err(|e| init_error(scenario_path, &dir, &e))?;
    tracing::info!(
        dir = %dir.display(),
        params = m.flat.len(),
        weights = %weights_digest_parallel(&m.flat),
        "initial weights from a Hugging Face model ([real] init)"
    );
    Ok(Some(m.flat))
}
