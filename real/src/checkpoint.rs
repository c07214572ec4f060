//! Checkpoints of a worker's training state, written in the background.
//!
//! PRIME wrote its checkpoints to RAM (`/dev/shm`) first and copied them to disk and remote
//! storage from background processes; a blocking save took up to 20 minutes (reference.md). loco
//! does the same in one process: the caller copies its vectors into a [`Snapshot`] (the "RAM
//! first" step, the only part that costs training time), [`Checkpointer::save`] hands it to a
//! background thread and returns, and that thread writes it to disk and then, optionally, copies it
//! to a second directory (the "remote"). Nothing here needs libtorch: plain `f32` vectors in and out.
//!
//! # Layout on disk
//!
//! ```text
//! DIR/<node>/step-<NNNNNNNN>/model.safetensors   the tensors (safetensors, fp32, little-endian)
//! DIR/<node>/step-<NNNNNNNN>/meta.json           the metadata (Meta), pretty JSON
//! ```
//!
//! `NNNNNNNN` is the outer step, zero-padded to eight digits (more digits past 99,999,999).
//! `model.safetensors` holds **one tensor per parameter and buffer**, named `<buffer>/<param>`
//! (`outer/layers.0.attention.wq.weight`, `exp_avg_sq/norm.weight`, ...), each 1-D of the
//! parameter's `numel`. One tensor per parameter rather than one per buffer because: a digest
//! mismatch then names the parameter that is damaged; the file opens in any safetensors reader with
//! the model's own names; and the writer converts one parameter at a time to bytes, so its extra
//! memory is the largest parameter, not a whole 40 GB buffer. The buffers are [`Buffer::ALL`]; a
//! buffer may be absent (an empty vector: an inner loop without AdamW state has no `exp_avg`), and
//! an absent buffer has no tensors. `meta.json` holds [`Meta`]: format version, scenario, node,
//! outer and inner steps, the data position (opaque JSON), the layout, the buffers present, a
//! creation counter, the BLAKE3 digest (hex) of every tensor's bytes as stored in the file, and
//! the model's shape when the writer knew it.
//!
//! # Durability
//!
//! A checkpoint is written into `step-<N>.tmp-<counter>`: the tensors, `fsync`, `meta.json`,
//! `fsync`, `fsync` of the directory; then the directory is renamed to `step-<N>` and its parent is
//! `fsync`'d. A crash at any point leaves at worst a `*.tmp-*` directory, which loading ignores and
//! [`Checkpointer::new`] deletes. Old checkpoints beyond the last `keep` are first renamed to
//! `*.tmp-deleted-*` and then deleted, so a directory named `step-<N>` is always complete. Saving a
//! step that already exists replaces it (renamed to `*.tmp-replaced-*`, then the new one is renamed
//! in, then the old one deleted): a crash between those two renames leaves that step only in its
//! `*.tmp-replaced-*` directory, which was complete, so [`list`] and [`latest`] count it as the
//! step and [`Checkpointer::new`] renames it back. No value that is not finite is saved or loaded:
//! a diverged state is an error naming the tensor, never a checkpoint to resume from.
//!
//! # One save at a time: wait, never skip
//!
//! If a save is still being written when the next [`Checkpointer::save`] comes, `save` **waits**
//! for it (and reports that it did, in [`SaveTicket::waited`]). Skipping would make the set of
//! checkpointed steps depend on disk speed, so the same scenario could resume from different steps
//! on different machines (test case 15 wants resume to reproduce the run), and a checkpoint the
//! worker asked for, and paid a RAM copy for, would be lost. Waiting bounds memory to two snapshots;
//! when the disk cannot keep up with the checkpoint interval, the time shows up in the worker's
//! `checkpoint_s` metric instead of silently thinning the checkpoints.
//!
//! # Loading
//!
//! [`load`] reads one checkpoint directory and verifies it: format version, every expected tensor
//! present with type F32 and the layout's shape, no extra tensors, every digest, and every value
//! finite. Errors name the file and, for a tensor, the tensor (and the expected and actual digest,
//! or the value that is not finite). [`latest`] loads the
//! highest complete step of a node and ignores other `*.tmp*` directories. A truncated or otherwise
//! broken file is an error, never a panic. Loading reads the whole tensor file into memory, so it
//! needs about twice the checkpoint's size in RAM. [`load_buffer`] reads and verifies one buffer
//! alone (the outer weights `loco export` writes), in that buffer's memory and one tensor's.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use loco_core::digest::Blake3Digest;
use safetensors::{Dtype, SafeTensorError, SafeTensors, View};
use serde::{Deserialize, Serialize};

use crate::train::TrainerState;
pub use one_buffer::{LoadedBuffer, latest_buffer, load_buffer};
#[cfg(test)]
use writer::*;
pub use writer::{Checkpointer, SaveTicket, Saved};

mod one_buffer;
mod writer;

/// The value of [`Meta::format`].
pub const FORMAT: &str = "loco-checkpoint";
/// The version of the format written, and the only one read.
pub const FORMAT_VERSION: u32 = 1;
/// The tensor file of a checkpoint directory.
pub const MODEL_FILE: &str = "model.safetensors";
/// The metadata file of a checkpoint directory.
pub const META_FILE: &str = "meta.json";

/// Floats converted to bytes per hashing chunk (256 KiB).
const HASH_CHUNK: usize = 1 << 16;

/// A failure to save or load a checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A file-system operation failed.
    #[error("{}: {op}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done ("create directory", "rename to ...").
        op: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The checkpointer's configuration is unusable.
    #[error("checkpoint config: {field}: {what}")]
    Config {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        what: String,
    },
    /// The snapshot handed to [`Checkpointer::save`] is inconsistent.
    #[error("checkpoint snapshot: {0}")]
    Snapshot(String),
    /// `meta.json` is not valid JSON of the expected shape.
    #[error("{}: {source}", path.display())]
    MetaJson {
        /// The file.
        path: PathBuf,
        /// The parse error (with line and column).
        #[source]
        source: serde_json::Error,
    },
    /// `meta.json` parses but is wrong (format, version, layout, node, step).
    #[error("{}: {what}", path.display())]
    Meta {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// The safetensors crate rejected the tensor file (truncated, bad header, ...).
    #[error("{}: not a valid safetensors file: {source}", path.display())]
    SafeTensors {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: SafeTensorError,
    },
    /// A tensor is missing, unexpected, or of the wrong type or shape.
    #[error("{}: tensor `{tensor}`: {what}", path.display())]
    Tensor {
        /// The file.
        path: PathBuf,
        /// The tensor's name (`<buffer>/<param>`).
        tensor: String,
        /// What is wrong.
        what: String,
    },
    /// A tensor's bytes do not match the digest recorded at save time.
    #[error("{}: tensor `{tensor}`: BLAKE3 digest mismatch: expected {expected}, got {got}", path.display())]
    Digest {
        /// The tensor file.
        path: PathBuf,
        /// The tensor's name (`<buffer>/<param>`).
        tensor: String,
        /// The digest in `meta.json`.
        expected: Blake3Digest,
        /// The digest of the bytes found.
        got: Blake3Digest,
    },
    /// A tensor holds a NaN or an infinity: a diverged state, which no run should resume from.
    #[error("{}: tensor `{tensor}`: value {index} is {value}, expected a finite number", path.display())]
    NotFinite {
        /// The tensor file (being written or read).
        path: PathBuf,
        /// The tensor's name (`<buffer>/<param>`).
        tensor: String,
        /// The value's index within the tensor.
        index: usize,
        /// The value.
        value: f32,
    },
    /// The background writer panicked (a bug, not bad input).
    #[error("checkpoint writer for outer step {outer_step} panicked")]
    WriterPanicked {
        /// The outer step it was writing.
        outer_step: u64,
    },
}

fn io_err(path: &Path, op: impl Into<String>) -> impl FnOnce(std::io::Error) -> CheckpointError {
    let path = path.to_path_buf();
    let op = op.into();
    move |source| CheckpointError::Io { path, op, source }
}

/// The vectors a checkpoint holds, each following the parameter layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Buffer {
    /// The outer (global) weights.
    Outer,
    /// The outer Nesterov momentum.
    Momentum,
    /// The inner (local) parameters.
    Params,
    /// AdamW's first moment.
    ExpAvg,
    /// AdamW's second moment.
    ExpAvgSq,
    /// Error feedback's residual: what this node's codec has not sent yet (sparse codec).
    Residual,
}

impl Buffer {
    /// Every buffer, in the order of [`Meta::buffers`].
    pub const ALL: [Buffer; 6] = [
        Buffer::Outer,
        Buffer::Momentum,
        Buffer::Params,
        Buffer::ExpAvg,
        Buffer::ExpAvgSq,
        Buffer::Residual,
    ];

    /// The prefix of its tensor names: `outer`, `momentum`, `params`, `exp_avg`, `exp_avg_sq`,
    /// `residual`.
    pub fn name(self) -> &'static str {
        match self {
            Buffer::Outer => "outer",
            Buffer::Momentum => "momentum",
            Buffer::Params => "params",
            Buffer::ExpAvg => "exp_avg",
            Buffer::ExpAvgSq => "exp_avg_sq",
            Buffer::Residual => "residual",
        }
    }

    /// The safetensors name of one parameter of this buffer: `<buffer>/<param>`.
    pub fn tensor_name(self, param: &str) -> String {
        format!("{}/{param}", self.name())
    }
}

/// The training state of one node at one moment, in memory: what a checkpoint holds.
///
/// Each buffer is either empty (absent: not written, and loaded back empty) or exactly the
/// layout's total length.
#[derive(Clone, Default)]
pub struct Snapshot {
    /// Outer steps applied.
    pub outer_step: u64,
    /// Inner steps taken (AdamW's step count and the schedule's position).
    pub inner_step: u64,
    /// Where the data loader is; opaque to the checkpoint (the worker stores `DataPosition`).
    pub data_position: serde_json::Value,
    /// `(name, numel)` of every parameter tensor; the vectors follow it.
    pub layout: Vec<(String, usize)>,
    /// The outer weights.
    pub outer: Vec<f32>,
    /// The outer momentum.
    pub momentum: Vec<f32>,
    /// The inner parameters.
    pub params: Vec<f32>,
    /// AdamW's first moment.
    pub exp_avg: Vec<f32>,
    /// AdamW's second moment.
    pub exp_avg_sq: Vec<f32>,
    /// Error feedback's residual (empty without error feedback).
    pub residual: Vec<f32>,
}

impl fmt::Debug for Snapshot {
    /// Lengths, not values: a snapshot may hold billions of floats.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Snapshot")
            .field("outer_step", &self.outer_step)
            .field("inner_step", &self.inner_step)
            .field("data_position", &self.data_position)
            .field("params_in_layout", &self.layout.len())
            .field("outer", &self.outer.len())
            .field("momentum", &self.momentum.len())
            .field("params", &self.params.len())
            .field("exp_avg", &self.exp_avg.len())
            .field("exp_avg_sq", &self.exp_avg_sq.len())
            .field("residual", &self.residual.len())
            .finish()
    }
}

impl Snapshot {
    /// A snapshot of the outer state and a trainer's state (its step becomes the inner step).
    pub fn from_trainer(
        outer_step: u64,
        data_position: serde_json::Value,
        outer: Vec<f32>,
        momentum: Vec<f32>,
        trainer: TrainerState,
    ) -> Snapshot {
        Snapshot {
            outer_step,
            inner_step: trainer.step,
            data_position,
            layout: trainer.layout,
            outer,
            momentum,
            params: trainer.params,
            exp_avg: trainer.exp_avg,
            exp_avg_sq: trainer.exp_avg_sq,
            residual: Vec::new(),
        }
    }

    /// The trainer's part, for `Trainer::import_state` (copies the vectors).
    pub fn trainer_state(&self) -> TrainerState {
        TrainerState {
            step: self.inner_step,
            layout: self.layout.clone(),
            params: self.params.clone(),
            exp_avg: self.exp_avg.clone(),
            exp_avg_sq: self.exp_avg_sq.clone(),
        }
    }

    /// One buffer.
    pub fn buffer(&self, b: Buffer) -> &[f32] {
        match b {
            Buffer::Outer => &self.outer,
            Buffer::Momentum => &self.momentum,
            Buffer::Params => &self.params,
            Buffer::ExpAvg => &self.exp_avg,
            Buffer::ExpAvgSq => &self.exp_avg_sq,
            Buffer::Residual => &self.residual,
        }
    }

    fn buffer_mut(&mut self, b: Buffer) -> &mut Vec<f32> {
        match b {
            Buffer::Outer => &mut self.outer,
            Buffer::Momentum => &mut self.momentum,
            Buffer::Params => &mut self.params,
            Buffer::ExpAvg => &mut self.exp_avg,
            Buffer::ExpAvgSq => &mut self.exp_avg_sq,
            Buffer::Residual => &mut self.residual,
        }
    }

    /// The buffers present (non-empty), in [`Buffer::ALL`] order.
    pub fn present(&self) -> Vec<Buffer> {
        Buffer::ALL.into_iter().filter(|&b| !self.buffer(b).is_empty()).collect()
    }

    /// Checks the layout (non-empty unique names, no overflow) and every buffer's length.
    pub fn validate(&self) -> Result<(), CheckpointError> {
        let total = layout_total(&self.layout).map_err(CheckpointError::Snapshot)?;
        for b in Buffer::ALL {
            let n = self.buffer(b).len();
            if n != 0 && n != total {
                return Err(CheckpointError::Snapshot(format!(
                    "buffer {} has {n} values, the layout has {total} (or 0 for an absent buffer)",
                    b.name()
                )));
            }
        }
        Ok(())
    }

    /// The first value that is not finite, as `(tensor name, index in the tensor, value)`, in
    /// [`Buffer::ALL`] and layout order; `None` when every value is finite.
    pub fn first_non_finite(&self) -> Option<(String, usize, f32)> {
        for b in self.present() {
            let v = self.buffer(b);
            let mut at = 0;
            for (name, n) in &self.layout {
                let end = at + n;
                let slice = v.get(at..end).unwrap_or_default();
                if let Some(i) = slice.iter().position(|x| !x.is_finite()) {
                    return Some((b.tensor_name(name), i, slice[i]));
                }
                at = end;
            }
        }
        None
    }

    /// The BLAKE3 digest of every tensor a checkpoint of this snapshot holds, by tensor name:
    /// what [`Meta::digests`] records at save and what [`load`] verifies.
    pub fn digests(&self) -> BTreeMap<String, Blake3Digest> {
        let mut out = BTreeMap::new();
        for b in self.present() {
            let v = self.buffer(b);
            let mut at = 0;
            for (name, n) in &self.layout {
                let end = at + n;
                if let Some(slice) = v.get(at..end) {
                    out.insert(b.tensor_name(name), digest_f32(slice));
                }
                at = end;
            }
        }
        out
    }
}

/// Sum of the layout's sizes; an error for an empty or repeated name or an overflow.
fn layout_total(layout: &[(String, usize)]) -> Result<usize, String> {
    let mut seen = BTreeSet::new();
    let mut total: usize = 0;
    for (name, n) in layout {
        if name.is_empty() {
            return Err("layout: a parameter has an empty name".to_string());
        }
        if !seen.insert(name.as_str()) {
            return Err(format!("layout: parameter `{name}` appears twice"));
        }
        total = total
            .checked_add(*n)
            .filter(|t| t.checked_mul(4).is_some())
            .ok_or_else(|| format!("layout: sizes overflow at parameter `{name}`"))?;
    }
    Ok(total)
}

/// BLAKE3 of the little-endian bytes of `v`, as stored in the tensor file.
fn digest_f32(v: &[f32]) -> Blake3Digest {
    let mut h = blake3::Hasher::new();
    let mut buf = Vec::with_capacity(HASH_CHUNK.min(v.len()) * 4);
    for chunk in v.chunks(HASH_CHUNK) {
        buf.clear();
        for x in chunk {
            buf.extend_from_slice(&x.to_le_bytes());
        }
        h.update(&buf);
    }
    Blake3Digest::from_blake3(&h.finalize())
}

/// The metadata of a checkpoint: `meta.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    /// Always [`FORMAT`].
    pub format: String,
    /// [`FORMAT_VERSION`] when written.
    pub format_version: u32,
    /// The scenario's name.
    pub scenario: String,
    /// The node's name.
    pub node: String,
    /// Outer steps applied.
    pub outer_step: u64,
    /// Inner steps taken.
    pub inner_step: u64,
    /// Creation order of this node's checkpoints: strictly increasing across saves and restarts.
    pub counter: u64,
    /// The data loader's position, as the worker gave it.
    pub data_position: serde_json::Value,
    /// `(name, numel)` of every parameter tensor.
    pub layout: Vec<(String, usize)>,
    /// The buffers stored, in [`Buffer::ALL`] order.
    pub buffers: Vec<Buffer>,
    /// BLAKE3 digest of every tensor's stored bytes, by tensor name (`<buffer>/<param>`),
    /// written as hex.
    pub digests: BTreeMap<String, Blake3Digest>,
    /// The model's shape, when the writer knew it (`loco export` needs it; checkpoints written
    /// before it was recorded lack it, and a scenario gives it then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<loco_core::scenario::ModelSpec>,
}

/// A checkpoint read back and verified.
#[derive(Clone, Debug)]
pub struct LoadedCheckpoint {
    /// Its directory.
    pub path: PathBuf,
    /// Its metadata.
    pub meta: Meta,
    /// The state.
    pub snapshot: Snapshot,
}

/// Where and how a node's checkpoints are kept.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckpointConfig {
    /// The checkpoint root; this node's checkpoints go to `dir/<node>/`.
    pub dir: PathBuf,
    /// The scenario's name, recorded in [`Meta::scenario`].
    pub scenario: String,
    /// The model's shape, recorded in [`Meta::model`] when known.
    pub model: Option<loco_core::scenario::ModelSpec>,
    /// The node's name: a directory name (not empty, no `/`, `\` or NUL, not `.` or `..`).
    pub node: String,
    /// How many complete checkpoints to keep (at least 1); older steps are deleted after a new one
    /// is complete.
    pub keep: usize,
    /// A second root (the "remote") that each complete checkpoint is copied to, in the background,
    /// with the same layout, protocol and `keep`.
    pub remote: Option<PathBuf>,
}

impl CheckpointConfig {
    /// Checks the node name, `keep` and that the remote differs from the local root.
    pub fn validate(&self) -> Result<(), CheckpointError> {
        check_node_name(&self.node)?;
        if self.keep == 0 {
            return Err(CheckpointError::Config {
                field: "keep",
                what: "must be at least 1".to_string(),
            });
        }
        if self.remote.as_deref() == Some(self.dir.as_path()) {
            return Err(CheckpointError::Config {
                field: "remote",
                what: format!("is the local directory {}", self.dir.display()),
            });
        }
        Ok(())
    }
}

fn check_node_name(node: &str) -> Result<(), CheckpointError> {
    let bad = node.is_empty()
        || node == "."
        || node == ".."
        || node.contains(['/', '\\', '\0'])
        || node.contains(".tmp");
    if bad {
        return Err(CheckpointError::Config {
            field: "node",
            what: format!("{node:?} is not usable as a directory name"),
        });
    }
    Ok(())
}

/// The name of a checkpoint directory: `step-<NNNNNNNN>`.
pub fn step_dir_name(outer_step: u64) -> String {
    format!("step-{outer_step:08}")
}

/// The outer step of a complete checkpoint directory's name, `None` for anything else
/// (including every `*.tmp*` directory).
pub fn parse_step_dir(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("step-")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The outer step of a `step-<N>.tmp-replaced-<counter>` directory's name: a complete step renamed
/// aside while a new save of the same step is installed.
fn parse_replaced_dir(name: &str) -> Option<(u64, u64)> {
    let (step, counter) = name.split_once(".tmp-replaced-")?;
    let counter = (!counter.is_empty() && counter.bytes().all(|b| b.is_ascii_digit()))
        .then(|| counter.parse().ok())??;
    Some((parse_step_dir(step)?, counter))
}

/// The steps under `node_dir` that exist only as a `*.tmp-replaced-*` directory (a crash came
/// between the two renames that replace a step), with the newest such directory of each whose
/// `meta.json` reads and names that step.
fn orphaned_replacements(node_dir: &Path) -> Result<Vec<(u64, PathBuf)>, CheckpointError> {
    let entries = match fs::read_dir(node_dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err(node_dir, "list directory")(e)),
    };
    let mut newest: BTreeMap<u64, (u64, PathBuf)> = BTreeMap::new();
    for entry in entries {
        let entry = entry.map_err(io_err(node_dir, "list directory"))?;
        let name = entry.file_name();
        let Some((step, counter)) = name.to_str().and_then(parse_replaced_dir) else { continue };
        let complete = node_dir.join(step_dir_name(step));
        if complete.exists() || !read_meta(&entry.path()).is_ok_and(|m| m.outer_step == step) {
            continue;
        }
        if newest.get(&step).is_none_or(|(c, _)| *c < counter) {
            newest.insert(step, (counter, entry.path()));
        }
    }
    Ok(newest.into_iter().map(|(step, (_, p))| (step, p)).collect())
}

/// The complete checkpoints of `node` under `dir`, as `(outer step, directory)`, oldest step first.
/// A step that a crash left only in its `*.tmp-replaced-*` directory is listed with that directory
/// (the next [`Checkpointer::new`] renames it back). A missing directory has none.
pub fn list(dir: &Path, node: &str) -> Result<Vec<(u64, PathBuf)>, CheckpointError> {
    check_node_name(node)?;
    list_node_dir(&dir.join(node))
}

fn list_node_dir(node_dir: &Path) -> Result<Vec<(u64, PathBuf)>, CheckpointError> {
    let entries = match fs::read_dir(node_dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err(node_dir, "list directory")(e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io_err(node_dir, "list directory"))?;
        let name = entry.file_name();
        let Some(step) = name.to_str().and_then(parse_step_dir) else { continue };
        let is_dir = entry.file_type().map_err(io_err(&entry.path(), "stat"))?.is_dir();
        if is_dir {
            out.push((step, entry.path()));
        }
    }
    out.extend(orphaned_replacements(node_dir)?);
    out.sort();
    Ok(out)
}

/// Loads and verifies the newest complete checkpoint of `node` under `dir` (as [`list`] finds
/// them); `None` when there is none. A damaged newest checkpoint is an error, not a reason
/// to fall back silently: [`list`] and [`load`] let a caller choose to try older ones.
pub fn latest(dir: &Path, node: &str) -> Result<Option<LoadedCheckpoint>, CheckpointError> {
    let Some((_, path)) = list(dir, node)?.pop() else { return Ok(None) };
    let ck = load(&path)?;
    if ck.meta.node != node {
        return Err(CheckpointError::Meta {
            path: path.join(META_FILE),
            what: format!("node is {:?}, expected {node:?}", ck.meta.node),
        });
    }
    Ok(Some(ck))
}

/// Reads a checkpoint directory and verifies it (format, version, layout, tensors, digests, and the
/// outer step against a `step-<N>` directory name).
pub fn load(path: &Path) -> Result<LoadedCheckpoint, CheckpointError> {
    let meta = read_meta(path)?;
    let model_path = path.join(MODEL_FILE);
    // The model file is read only once the metadata has been checked.
    load_with(path, meta, || fs::read(&model_path).map_err(io_err(&model_path, "read")))
}

/// [`load`] from the bytes of a checkpoint's two files, `path` naming the directory in errors
/// and giving the step its name must match: the entry point of the fuzz target.
#[cfg(feature = "fuzzing")]
pub fn load_bytes(
    path: &Path,
    meta: &[u8],
    model: &[u8],
) -> Result<LoadedCheckpoint, CheckpointError> {
    let meta = parse_meta(path.join(META_FILE), meta)?;
    load_with(path, meta, || Ok(model.to_vec()))
}

/// The checks of a checkpoint's metadata that need no tensor: format, version, the step
/// against a `step-<N>` directory name, the layout, the buffers, a digest for every tensor and
/// no other. Returns the layout's total, the buffers, and every tensor name expected.
fn check_meta(
    path: &Path,
    meta: &Meta,
) -> Result<(usize, BTreeSet<Buffer>, BTreeSet<String>), CheckpointError> {
    let meta_path = path.join(META_FILE);
    let bad_meta = |what: String| CheckpointError::Meta { path: meta_path.clone(), what };
    if meta.format != FORMAT {
        return Err(bad_meta(format!("format is {:?}, expected {FORMAT:?}", meta.format)));
    }
    if meta.format_version != FORMAT_VERSION {
        return Err(bad_meta(format!(
            "format version {} is not supported (this build reads {FORMAT_VERSION})",
            meta.format_version
        )));
    }
    let name = path.file_name().and_then(|n| n.to_str());
    if let Some(step) =
        name.and_then(|n| parse_step_dir(n).or_else(|| parse_replaced_dir(n).map(|(s, _)| s)))
        && step != meta.outer_step
    {
        return Err(bad_meta(format!(
            "outer step is {}, but the directory is {}",
            meta.outer_step,
            step_dir_name(step)
        )));
    }
    let total = layout_total(&meta.layout).map_err(&bad_meta)?;
    let buffers: BTreeSet<Buffer> = meta.buffers.iter().copied().collect();
    if buffers.len() != meta.buffers.len() {
        return Err(bad_meta("a buffer is listed twice".to_string()));
    }
    // Every parameter of every stored buffer has a tensor, zero-sized ones included.
    let expected: BTreeSet<String> = buffers
        .iter()
        .flat_map(|b| meta.layout.iter().map(move |(p, _)| b.tensor_name(p)))
        .collect();
    if let Some(name) = expected.iter().find(|n| !meta.digests.contains_key(*n)) {
        return Err(bad_meta(format!("no digest for tensor `{name}`")));
    }
    if let Some(name) = meta.digests.keys().find(|n| !expected.contains(*n)) {
        return Err(bad_meta(format!("digest for unknown tensor `{name}`")));
    }
    Ok((total, buffers, expected))
}

fn load_with(
    path: &Path,
    meta: Meta,
    model: impl FnOnce() -> Result<Vec<u8>, CheckpointError>,
) -> Result<LoadedCheckpoint, CheckpointError> {
    let (total, buffers, expected) = check_meta(path, &meta)?;
    let meta_path = path.join(META_FILE);
    let bad_meta = |what: String| CheckpointError::Meta { path: meta_path.clone(), what };
    let model_path = path.join(MODEL_FILE);
    let bytes = model()?;
    let st = SafeTensors::deserialize(&bytes)
        .map_err(|source| CheckpointError::SafeTensors { path: model_path.clone(), source })?;
    let tensor_err = |tensor: &str, what: String| CheckpointError::Tensor {
        path: model_path.clone(),
        tensor: tensor.to_string(),
        what,
    };
    if let Some(extra) = st.names().into_iter().find(|n| !expected.contains(*n)) {
        return Err(tensor_err(extra, "is in the file but not in meta.json".to_string()));
    }

    // First verify everything (so nothing is allocated from a file that lies about sizes), then
    // convert.
    for b in &buffers {
        for (param, n) in &meta.layout {
            let name = b.tensor_name(param);
            let view = st.tensor(&name).map_err(|_| tensor_err(&name, "missing".to_string()))?;
            if view.dtype() != Dtype::F32 {
                return Err(tensor_err(&name, format!("type {:?}, expected F32", view.dtype())));
            }
            if view.shape() != [*n] {
                return Err(tensor_err(&name, format!("shape {:?}, expected [{n}]", view.shape())));
            }
            let got = Blake3Digest::from_blake3(&blake3::hash(view.data()));
            let Some(&want) = meta.digests.get(&name) else {
                return Err(bad_meta(format!("no digest for tensor `{name}`")));
            };
            if got != want {
                return Err(CheckpointError::Digest {
                    path: model_path.clone(),
                    tensor: name,
                    expected: want,
                    got,
                });
            }
        }
    }
    let mut snapshot = Snapshot {
        outer_step: meta.outer_step,
        inner_step: meta.inner_step,
        data_position: meta.data_position.clone(),
        layout: meta.layout.clone(),
        ..Snapshot::default()
    };
    for &b in &buffers {
        let v = snapshot.buffer_mut(b);
        v.reserve_exact(total);
        for (param, _) in &meta.layout {
            let name = b.tensor_name(param);
            let view = st.tensor(&name).map_err(|_| tensor_err(&name, "missing".to_string()))?;
            v.extend(
                view.data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            );
        }
    }
    if let Some((tensor, index, value)) = snapshot.first_non_finite() {
        return Err(CheckpointError::NotFinite { path: model_path, tensor, index, value });
    }
    Ok(LoadedCheckpoint { path: path.to_path_buf(), meta, snapshot })
}

/// The digests of the replicated part of a checkpoint (the outer weights and the outer
/// momentum, which every replica holds bit for bit after a commit), by tensor name, read from
/// its `meta.json` alone (no tensor is read). Two nodes' checkpoints of one step that differ
/// here are not one run's state.
pub fn replicated_digests(dir: &Path) -> Result<BTreeMap<String, Blake3Digest>, CheckpointError> {
    let shared = [Buffer::Outer.name(), Buffer::Momentum.name()];
    Ok(read_meta(dir)?
        .digests
        .into_iter()
        .filter(|(name, _)| {
            name.split_once('/').is_some_and(|(buffer, _)| shared.contains(&buffer))
        })
        .collect())
}

fn read_meta(dir: &Path) -> Result<Meta, CheckpointError> {
    let path = dir.join(META_FILE);
    let text = fs::read(&path).map_err(io_err(&path, "read"))?;
    parse_meta(path, &text)
}

fn parse_meta(path: PathBuf, text: &[u8]) -> Result<Meta, CheckpointError> {
    serde_json::from_slice(text).map_err(|source| CheckpointError::MetaJson { path, source })
}

#[cfg(test)]
mod tests;
