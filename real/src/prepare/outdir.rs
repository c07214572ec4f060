//! The output directory of `loco data prepare`: what it already holds (nothing, an interrupted
//! preparation, a finished one), the journal of finished units, and atomic writes.
//!
//! `progress.jsonl` starts with a header line holding the settings, then one line per finished
//! unit, appended (and fsync'd) only after the unit's shards were renamed into place. On a rerun
//! with the same settings the units it lists whose shards have the recorded sizes are kept; the
//! first that does not check, and every unit after it, is done again. A last line cut short by a
//! kill is dropped.

use super::PrepareError;
use crate::data::prepared::{
    FORMAT_VERSION, MANIFEST_FILE, Manifest, PrepareSettings, Split, TOKENIZER_FILE,
};
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// The journal's file name inside the output directory.
pub(super) const JOURNAL_FILE: &str = "progress.jsonl";

/// The first line of the journal.
#[derive(Debug, Serialize, Deserialize)]
struct Header {
    journal: String,
    format_version: u32,
    settings: PrepareSettings,
}

const JOURNAL_NAME: &str = "loco-prepare";

/// One finished unit, as the journal records it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct UnitRecord {
    /// The unit's index.
    pub(super) unit: u64,
    /// Its documents, both splits.
    pub(super) documents: u64,
    /// Bytes of its documents' text.
    pub(super) text_bytes: u64,
    /// Its documents in the train split.
    pub(super) train_documents: u64,
    /// Tokens of its train shard.
    pub(super) train_tokens: u64,
    /// Its documents held out.
    pub(super) heldout_documents: u64,
    /// Tokens of its held-out shard.
    pub(super) heldout_tokens: u64,
}

impl UnitRecord {
    /// Documents and tokens of `split`.
    pub(super) fn split(&self, split: Split) -> (u64, u64) {
        match split {
            Split::Train => (self.train_documents, self.train_tokens),
            Split::HeldOut => (self.heldout_documents, self.heldout_tokens),
        }
    }
}

/// What the output directory holds.
#[derive(Debug)]
pub(super) enum State {
    /// A finished preparation with the same settings: nothing to do.
    Finished(Box<Manifest>),
    /// Nothing yet, or an interrupted preparation with the same settings: these units are done,
    /// and the journal is open to append the next ones.
    Resume { done: Vec<UnitRecord>, journal: Journal },
}

/// The journal, open for appending.
#[derive(Debug)]
pub(super) struct Journal {
    path: PathBuf,
    file: File,
}

impl Journal {
    /// Appends one finished unit and syncs it to disk.
    pub(super) fn append(&mut self, record: &UnitRecord) -> Result<(), PrepareError> {
        let mut line = serde_json::to_string(record).expect("a unit record serialises");
        line.push('\n');
        let io = |e| PrepareError::io(&self.path, "write", e);
        self.file.write_all(line.as_bytes()).map_err(io)?;
        self.file.sync_data().map_err(io)
    }
}

/// Opens `dir` for a preparation with `settings` and shards `width` bytes per token: creates it,
/// or finds a finished or interrupted preparation with the same settings in it. A directory
/// that holds anything else, or a preparation with other settings, is an error saying so.
pub(super) fn open(
    dir: &Path,
    settings: &PrepareSettings,
    width: usize,
) -> Result<State, PrepareError> {
    if dir.join(MANIFEST_FILE).exists() {
        let manifest = Manifest::read(dir)?;
        check_same(dir, &manifest.settings, settings)?;
        return Ok(State::Finished(Box::new(manifest)));
    }
    let journal_path = dir.join(JOURNAL_FILE);
    let done = if journal_path.exists() {
        let (header, records) = read_journal(&journal_path)?;
        check_same(dir, &header.settings, settings)?;
        let kept = verified_prefix(dir, records, width);
        remove_temporaries(dir)?;
        kept
    } else {
        std::fs::create_dir_all(dir).map_err(|e| PrepareError::io(dir, "create", e))?;
        let mut entries =
            std::fs::read_dir(dir).map_err(|e| PrepareError::io(dir, "read", e))?.peekable();
        if entries.peek().is_some() {
            return Err(PrepareError::OutDir {
                dir: dir.to_owned(),
                message: "not empty, and holds no preparation (no manifest.json or \
                          progress.jsonl): choose a new or empty directory"
                    .into(),
            });
        }
        Vec::new()
    };
    // The journal as kept: its header and the units that checked.
    let mut text = serde_json::to_string(&Header {
        journal: JOURNAL_NAME.into(),
        format_version: FORMAT_VERSION,
        settings: settings.clone(),
    })
    .expect("settings serialise");
    text.push('\n');
    for r in &done {
        text.push_str(&serde_json::to_string(r).expect("a unit record serialises"));
        text.push('\n');
    }
    write_atomic(&journal_path, text.as_bytes())?;
    let file = OpenOptions::new()
        .append(true)
        .open(&journal_path)
        .map_err(|e| PrepareError::io(&journal_path, "open", e))?;
    Ok(State::Resume { done, journal: Journal { path: journal_path, file } })
}

/// Fails, listing the differences, unless `found` (in `dir`) equals `wanted`.
fn check_same(
    dir: &Path,
    found: &PrepareSettings,
    wanted: &PrepareSettings,
) -> Result<(), PrepareError> {
    if found == wanted {
        return Ok(());
    }
    let mut diffs = Vec::new();
    let mut diff = |name: &str, a: String, b: String| {
        if a != b {
            diffs.push(format!("{name}: {a} there, {b} now"));
        }
    };
    diff("tokenizer (BLAKE3)", found.tokenizer_blake3.clone(), wanted.tokenizer_blake3.clone());
    diff("seed", found.seed.to_string(), wanted.seed.to_string());
    diff("held-out", found.held_out.to_string(), wanted.held_out.to_string());
    diff("eos", format!("{:?}", found.eos), format!("{:?}", wanted.eos));
    diff("field", found.field.clone(), wanted.field.clone());
    diff("text unit", found.text_unit.to_string(), wanted.text_unit.to_string());
    diff("unit bytes", found.unit_bytes.to_string(), wanted.unit_bytes.to_string());
    let inputs = |s: &PrepareSettings| {
        let list: Vec<String> =
            s.inputs.iter().map(|i| format!("{} ({} bytes)", i.path, i.bytes)).collect();
        format!("[{}]", list.join(", "))
    };
    diff("inputs", inputs(found), inputs(wanted));
    Err(PrepareError::OutDir {
        dir: dir.to_owned(),
        message: format!(
            "holds a preparation with other arguments ({}): use another directory, or remove \
             this one to start over",
            diffs.join("; ")
        ),
    })
}

/// The journal's header and unit records. A last line that does not parse (cut short by a kill)
/// is dropped; any other line that does not is an error naming it.
fn read_journal(path: &Path) -> Result<(Header, Vec<UnitRecord>), PrepareError> {
    let text = std::fs::read_to_string(path).map_err(|e| PrepareError::io(path, "read", e))?;
    let corrupt = |line: usize, what: String| PrepareError::OutDir {
        dir: path.to_owned(),
        message: format!("line {line}: {what}: remove the directory to start over"),
    };
    let lines: Vec<&str> = text.lines().collect();
    let complete = if text.ends_with('\n') { lines.len() } else { lines.len().saturating_sub(1) };
    let header: Header = match lines.first() {
        Some(l) if complete > 0 => {
            serde_json::from_str(l).map_err(|e| corrupt(1, format!("not a journal header: {e}")))?
        }
        _ => return Err(corrupt(1, "no journal header".into())),
    };
    if header.journal != JOURNAL_NAME || header.format_version != FORMAT_VERSION {
        return Err(corrupt(1, format!("a journal of another format ({})", header.journal)));
    }
    let mut records = Vec::new();
    for (i, line) in lines.iter().enumerate().take(complete).skip(1) {
        match serde_json::from_str::<UnitRecord>(line) {
            Ok(r) if r.unit == records.len() as u64 => records.push(r),
            Ok(r) => return Err(corrupt(i + 1, format!("unit {} out of order", r.unit))),
            Err(_) if i + 1 == complete => break,
            Err(e) => return Err(corrupt(i + 1, format!("not a unit record: {e}"))),
        }
    }
    Ok((header, records))
}

/// The records, up to the first whose shards are missing or of another size.
fn verified_prefix(dir: &Path, records: Vec<UnitRecord>, width: usize) -> Vec<UnitRecord> {
    let mut kept = Vec::new();
    for r in records {
        let intact = Split::ALL.iter().all(|&split| {
            let (_, tokens) = r.split(split);
            tokens == 0
                || std::fs::metadata(dir.join(split.shard_file(r.unit, width)))
                    .is_ok_and(|m| m.len() == tokens * width as u64)
        });
        if !intact {
            tracing::info!(unit = r.unit, "shard missing or changed: redoing from this unit");
            break;
        }
        kept.push(r);
    }
    kept
}

/// Removes `*.tmp` files a killed run left.
fn remove_temporaries(dir: &Path) -> Result<(), PrepareError> {
    for entry in std::fs::read_dir(dir).map_err(|e| PrepareError::io(dir, "read", e))? {
        let path = entry.map_err(|e| PrepareError::io(dir, "read", e))?.path();
        if path.extension().is_some_and(|e| e == "tmp") {
            std::fs::remove_file(&path).map_err(|e| PrepareError::io(&path, "remove", e))?;
        }
    }
    Ok(())
}

/// Writes `bytes` to `path` atomically: to `path.tmp`, synced, then renamed over `path`.
pub(super) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), PrepareError> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let io = |e: io::Error| PrepareError::io(path, "write", e);
    let mut f = File::create(&tmp).map_err(io)?;
    f.write_all(bytes).map_err(io)?;
    f.sync_all().map_err(io)?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(io)
}

/// Syncs the directory itself, so that renames into it survive a crash.
pub(super) fn sync_dir(dir: &Path) -> Result<(), PrepareError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| PrepareError::io(dir, "sync", e))
}

/// Copies the tokenizer into the directory (atomically), unless an identical copy is there.
pub(super) fn copy_tokenizer(dir: &Path, bytes: &[u8]) -> Result<(), PrepareError> {
    let path = dir.join(TOKENIZER_FILE);
    if std::fs::read(&path).is_ok_and(|b| b == bytes) {
        return Ok(());
    }
    write_atomic(&path, bytes)
}
