//! Prepared data sets: the directories `loco data prepare` writes (see `crate::prepare`), and
//! what a [`DataLoader`](super::DataLoader) needs to read them.
//!
//! A prepared directory holds, per work unit `NNNNN` (documents in input order),
//! `train-NNNNN.u16` and `heldout-NNNNN.u16` (`.u32` for vocabularies over 65,536): the token
//! ids of the unit's documents of that split, one after another, little-endian, no header. A
//! split's shards, concatenated in the order [`manifest.json`](MANIFEST_FILE) lists them, are
//! one stream of tokens, which the loader packs into sequences as it does a single token file.
//! A shard with no token is not written and not listed.
//!
//! The manifest is written last: a directory without one is an unfinished preparation (rerun
//! the same command to finish it), never something to train on.

use super::{DataError, TokenFormat};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// The manifest's file name inside a prepared directory.
pub const MANIFEST_FILE: &str = "manifest.json";

/// The name of the copy of the tokenizer inside a prepared directory.
pub const TOKENIZER_FILE: &str = "tokenizer.json";

/// The manifest format this version of loco writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// The largest manifest read, in bytes (a million shards fit in a tenth of it).
pub const MAX_MANIFEST_BYTES: u64 = 256 << 20;

/// One of the two parts a prepared data set is split into, per document.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    /// The documents to train on.
    Train,
    /// The documents kept out of training, for evaluation (`--held-out` of them).
    #[serde(rename = "heldout")]
    HeldOut,
}

impl Split {
    /// Both splits, train first.
    pub const ALL: [Split; 2] = [Split::Train, Split::HeldOut];

    /// `train` or `heldout`: the split's name in the manifest and its shards' file-name prefix.
    pub fn name(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::HeldOut => "heldout",
        }
    }

    /// The file name of unit `unit`'s shard of this split, for tokens `width` bytes wide:
    /// `train-00007.u16`.
    pub fn shard_file(self, unit: u64, width: usize) -> String {
        format!("{}-{unit:05}.u{}", self.name(), width * 8)
    }
}

impl fmt::Display for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a plain-text input is cut into documents.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TextUnit {
    /// Every line is a document.
    Line,
    /// Runs of lines separated by blank lines are documents (their lines joined by `\n`).
    #[default]
    Paragraph,
    /// The whole file is one document.
    File,
}

impl FromStr for TextUnit {
    type Err = String;

    fn from_str(s: &str) -> Result<TextUnit, String> {
        match s {
            "line" => Ok(TextUnit::Line),
            "paragraph" => Ok(TextUnit::Paragraph),
            "file" => Ok(TextUnit::File),
            _ => Err(format!("`{s}`: expected line, paragraph or file")),
        }
    }
}

impl fmt::Display for TextUnit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TextUnit::Line => "line",
            TextUnit::Paragraph => "paragraph",
            TextUnit::File => "file",
        })
    }
}

/// One input file of a preparation, as the glob expanded it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputFile {
    /// The path, as given or as the glob matched it.
    pub path: String,
    /// Its size in bytes (compressed, where it is).
    pub bytes: u64,
}

/// Everything that decides a preparation's output: a rerun with equal settings resumes (or, once
/// finished, does nothing); one with other settings into the same directory is refused.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PrepareSettings {
    /// BLAKE3 of the tokenizer file's bytes, hex.
    pub tokenizer_blake3: String,
    /// The seed of the per-document split.
    pub seed: u64,
    /// The fraction of documents held out, in [0, 1).
    pub held_out: f64,
    /// The token appended to every document, if any.
    pub eos: Option<String>,
    /// The JSONL field or Parquet column holding the text.
    pub field: String,
    /// How plain-text inputs are cut into documents.
    pub text_unit: TextUnit,
    /// Bytes of text per work unit (a unit closes at the first document that reaches it).
    pub unit_bytes: u64,
    /// The input files, in order.
    pub inputs: Vec<InputFile>,
}

/// One shard of a split.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardFile {
    /// Its file name inside the directory.
    pub file: String,
    /// Tokens in it.
    pub tokens: u64,
}

/// One split of a prepared data set.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitManifest {
    /// Documents in the split.
    pub documents: u64,
    /// Tokens in the split (the sum over its shards).
    pub tokens: u64,
    /// Its shards, in stream order.
    pub shards: Vec<ShardFile>,
}

/// `manifest.json` of a prepared directory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`FORMAT_VERSION`] of the writer.
    pub format_version: u32,
    /// The settings the data was prepared with.
    pub settings: PrepareSettings,
    /// The tokenizer's vocabulary size, added tokens included: every token is below it.
    pub vocab_size: u64,
    /// Bytes per token in the shards: 2 (`.u16`) or 4 (`.u32`).
    pub token_width: usize,
    /// The id of the end-of-document token appended to every document, if any.
    pub eos_id: Option<u32>,
    /// The copy of the tokenizer in the directory ([`TOKENIZER_FILE`]).
    pub tokenizer: String,
    /// Bytes of document text tokenized (UTF-8, after decompression).
    pub text_bytes: u64,
    /// The documents to train on.
    pub train: SplitManifest,
    /// The documents held out.
    #[serde(rename = "heldout")]
    pub held_out: SplitManifest,
}

impl Manifest {
    /// The manifest of the prepared directory `dir`, read (at most [`MAX_MANIFEST_BYTES`]) and
    /// checked; every error names the file.
    pub fn read(dir: &Path) -> Result<Manifest, DataError> {
        let path = dir.join(MANIFEST_FILE);
        let bad = |reason: String| DataError::Manifest { path: path.clone(), reason };
        let file = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(bad(
                    "missing: expected a directory written by `loco data prepare` (an unfinished \
                     preparation has no manifest yet: rerun the same command to finish it)"
                        .into(),
                ));
            }
            Err(e) => return Err(DataError::Open { path, source: e }),
        };
        let mut bytes = Vec::new();
        file.take(MAX_MANIFEST_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|source| DataError::Io { path: path.clone(), op: "read", source })?;
        if bytes.len() as u64 > MAX_MANIFEST_BYTES {
            return Err(bad(format!("larger than {MAX_MANIFEST_BYTES} bytes")));
        }
        let manifest: Manifest =
            serde_json::from_slice(&bytes).map_err(|e| bad(format!("not a manifest: {e}")))?;
        manifest.check().map_err(bad)?;
        Ok(manifest)
    }

    /// The manifest of `split`.
    pub fn split(&self, split: Split) -> &SplitManifest {
        match split {
            Split::Train => &self.train,
            Split::HeldOut => &self.held_out,
        }
    }

    /// The token format of the shards.
    pub fn format(&self) -> TokenFormat {
        if self.token_width == 2 { TokenFormat::U16 } else { TokenFormat::U32 }
    }

    /// Checks what a reader relies on: the version, the width, the vocabulary against the
    /// width, shard names (plain file names of the split's width) and token sums.
    fn check(&self) -> Result<(), String> {
        if self.format_version != FORMAT_VERSION {
            return Err(format!(
                "format_version {}: this loco reads version {FORMAT_VERSION}",
                self.format_version
            ));
        }
        if self.token_width != 2 && self.token_width != 4 {
            return Err(format!("token_width {}: expected 2 or 4", self.token_width));
        }
        if self.vocab_size == 0 || self.vocab_size > 1u64 << (8 * self.token_width) {
            return Err(format!(
                "vocab_size {}: expected 1 to {} for {}-byte tokens",
                self.vocab_size,
                1u64 << (8 * self.token_width),
                self.token_width
            ));
        }
        let ext = format!(".u{}", self.token_width * 8);
        for split in Split::ALL {
            let m = self.split(split);
            let mut sum = 0u64;
            for s in &m.shards {
                let plain = !s.file.is_empty()
                    && !s.file.contains(['/', '\\'])
                    && s.file != ".."
                    && s.file.ends_with(&ext);
                if !plain {
                    return Err(format!(
                        "{split} shard `{}`: expected a file name in the directory ending {ext}",
                        s.file
                    ));
                }
                sum = sum.checked_add(s.tokens).ok_or("token counts overflow")?;
            }
            if sum != m.tokens {
                return Err(format!("{split}: tokens {} but its shards hold {sum}", m.tokens));
            }
        }
        Ok(())
    }
}

/// One file of a token stream: where its tokens start in the stream, and how many it holds.
#[derive(Debug)]
pub(super) struct Segment {
    pub(super) path: PathBuf,
    pub(super) file: std::fs::File,
    /// The stream offset of its first token.
    pub(super) start: u64,
    /// Tokens in it.
    pub(super) tokens: u64,
}

/// Opens the shards of `split` in `dir`, checking the manifest's vocabulary against the model's
/// `vocab` and each shard's size against the manifest. Returns the shards as segments of one
/// stream, their format and the stream's length in tokens.
pub(super) fn open(
    dir: &Path,
    split: Split,
    vocab: u64,
) -> Result<(Vec<Segment>, TokenFormat, u64), DataError> {
    let manifest = Manifest::read(dir)?;
    if manifest.vocab_size > vocab {
        return Err(DataError::VocabTooLarge {
            dir: dir.to_owned(),
            prepared: manifest.vocab_size,
            model: vocab,
        });
    }
    let format = manifest.format();
    let width = format.width() as u64;
    let mut segments = Vec::new();
    let mut start = 0u64;
    for shard in &manifest.split(split).shards {
        if shard.tokens == 0 {
            continue;
        }
        let path = dir.join(&shard.file);
        let open = |source| DataError::Open { path: path.clone(), source };
        let file = std::fs::File::open(&path).map_err(open)?;
        let bytes = file.metadata().map_err(open)?.len();
        let expected = shard.tokens.checked_mul(width);
        if expected != Some(bytes) {
            return Err(DataError::ShardSize { path, bytes, tokens: shard.tokens, width });
        }
        segments.push(Segment { path, file, start, tokens: shard.tokens });
        start += shard.tokens;
    }
    Ok((segments, format, start))
}
