//! Training data for the real backend: packed token sequences from a file or a seeded generator,
//! sharded across nodes, with a resumable position. Needs no libtorch.
//!
//! # Sources
//!
//! | file name | tokens |
//! |---|---|
//! | `*.u16` | little-endian `u16`, two bytes each, no header (vocabularies up to 65,536) |
//! | `*.u32` | little-endian `u32`, four bytes each, no header |
//! | anything else | one token per byte (vocabulary 256: the `tiny` preset's) |
//! | a directory | a data set `loco data prepare` wrote ([`prepared`]): one split's shards |
//!
//! A prepared directory ([`DataSource::Prepared`]) has two splits, [`Split::Train`] and
//! [`Split::HeldOut`]; the loader reads one of them, its shards concatenated in the order of the
//! manifest as if they were one token file (so sequences may span two shards). A scenario's
//! `[real] data = "DIR"` trains on the train split; evaluation reads the held-out one with
//! [`DataLoader::prepared`]. The manifest's vocabulary must not exceed the model's.
//!
//! [`Synthetic`] data needs no file: every sequence is a walk of a seeded Markov chain (each token
//! has four successors, drawn with probabilities 0.55 / 0.25 / 0.12 / 0.08), so a model can learn
//! it (entropy about 1.1 nats per token against `ln(vocab)` for noise).
//!
//! # Packing, order, shards
//!
//! A file of `T` tokens holds `n = (T - 1) / seq_len` sequences of `seq_len + 1` tokens (inputs
//! and shifted targets): sequence `k` is tokens `k * seq_len ..= (k + 1) * seq_len`, so
//! consecutive sequences share one token and every token but the first is a target exactly once
//! per epoch. The tail that does not fill a sequence is not used.
//!
//! Each epoch visits the `n` sequences in an order: file order ([`Order::Sequential`]), or a
//! seeded permutation that changes every epoch ([`Order::Shuffled`]: `k -> (a * k + b) mod n` with
//! `a` coprime to `n`, drawn from the seed and the epoch; cheap and random-access, not a uniform
//! shuffle). Node `index` of `count` ([`Shard`]) reads positions `index, index + count, ...` of
//! that order, so the shards of one epoch are disjoint and together cover every sequence once.
//!
//! A [`DataPosition`] (epoch, sequences read in it) is all the state a loader has besides its
//! configuration: [`DataLoader::seek`] to a saved one and the same batches follow.
//!
//! Files are read with positioned reads of one sequence at a time (no memory map: mapping a file
//! needs `unsafe`, which this workspace denies, and one read per sequence costs nothing next to a
//! training step).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

pub mod prepared;
pub use prepared::{Manifest, Split};

/// What can go wrong with training data. Every error about a file names it.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The file could not be opened or its size read.
    #[error("{}: cannot open token file: {source}", path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: io::Error,
    },
    /// Reading or writing the file failed.
    #[error("{}: cannot {op} token file: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// `read` or `write`.
        op: &'static str,
        /// The operating system's error.
        source: io::Error,
    },
    /// A binary token file whose size is not a whole number of tokens.
    #[error(
        "{}: {bytes} bytes is not a whole number of {width}-byte tokens (expected a `.u{bits}` file of little-endian u{bits} tokens, no header)",
        path.display(),
        bits = width * 8
    )]
    BadLength {
        /// The file.
        path: PathBuf,
        /// Its size in bytes.
        bytes: u64,
        /// Bytes per token.
        width: usize,
    },
    /// The file holds fewer tokens than one sequence needs.
    #[error("{}: holds {tokens} tokens, fewer than one sequence of {needed} (seq_len + 1)", path.display())]
    TooShort {
        /// The file.
        path: PathBuf,
        /// Tokens in the file.
        tokens: u64,
        /// Tokens one sequence needs.
        needed: u64,
    },
    /// A token is not below the model's vocabulary size.
    #[error("{}: token {token} at token offset {offset} is outside the vocabulary (expected < {vocab})", path.display())]
    TokenOutOfRange {
        /// The file.
        path: PathBuf,
        /// The token's position in the file, in tokens.
        offset: u64,
        /// Its value.
        token: u64,
        /// The model's vocabulary size.
        vocab: u64,
    },
    /// A token does not fit the file's format when writing.
    #[error("{}: token {token} does not fit a `.u{bits}` file", path.display(), bits = width * 8)]
    TokenTooWide {
        /// The file.
        path: PathBuf,
        /// The token.
        token: u64,
        /// Bytes per token of the format.
        width: usize,
    },
    /// A shard index not below the shard count, or a zero count.
    #[error("shard {index} of {count}: expected 0 <= index < count")]
    BadShard {
        /// The shard's index.
        index: u32,
        /// The number of shards.
        count: u32,
    },
    /// A shard that would get no sequence.
    #[error("shard {index} of {count} gets no sequence: the data holds only {sequences} sequences")]
    EmptyShard {
        /// The shard's index.
        index: u32,
        /// The number of shards.
        count: u32,
        /// Sequences in the data.
        sequences: u64,
    },
    /// A position past the end of the shard's epoch.
    #[error("data position {position} is past this shard's {per_epoch} sequences per epoch")]
    BadPosition {
        /// The position asked for.
        position: DataPosition,
        /// Sequences per epoch in the shard.
        per_epoch: u64,
    },
    /// A prepared directory's manifest is missing, unreadable or inconsistent.
    #[error("{}: {reason}", path.display())]
    Manifest {
        /// The manifest file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A prepared data set whose tokenizer has more tokens than the model's vocabulary.
    #[error(
        "{}: prepared with a tokenizer of {prepared} tokens, more than the model's vocabulary of \
         {model}: set the scenario's `[model] vocab` to at least {prepared}",
        dir.display()
    )]
    VocabTooLarge {
        /// The prepared directory.
        dir: PathBuf,
        /// The manifest's vocabulary size.
        prepared: u64,
        /// The model's vocabulary size.
        model: u64,
    },
    /// A shard of a prepared data set whose size is not what its manifest says.
    #[error(
        "{}: {bytes} bytes, but the manifest lists {tokens} tokens of {width} bytes: the shard is \
         truncated or was changed (rerun `loco data prepare` into a new directory)",
        path.display()
    )]
    ShardSize {
        /// The shard.
        path: PathBuf,
        /// Its size in bytes.
        bytes: u64,
        /// Tokens the manifest lists for it.
        tokens: u64,
        /// Bytes per token.
        width: u64,
    },
    /// One split of a prepared data set holds fewer tokens than one sequence needs.
    #[error(
        "{}: the {split} split holds {tokens} tokens, fewer than one sequence of {needed} (seq_len + 1)",
        dir.display()
    )]
    SplitTooShort {
        /// The prepared directory.
        dir: PathBuf,
        /// The split.
        split: Split,
        /// Tokens in it.
        tokens: u64,
        /// Tokens one sequence needs.
        needed: u64,
    },
    /// A setting out of range.
    #[error("data setting {field} = {value}: expected {expected}")]
    BadSetting {
        /// The setting.
        field: &'static str,
        /// Its value.
        value: u64,
        /// What was expected.
        expected: &'static str,
    },
}

/// How tokens are stored in a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenFormat {
    /// One token per byte.
    Bytes,
    /// Little-endian `u16`.
    U16,
    /// Little-endian `u32`.
    U32,
}

impl TokenFormat {
    /// The format of the file at `path`, by extension: `.u16`, `.u32`, else bytes.
    pub fn from_path(path: &Path) -> TokenFormat {
        match path.extension().and_then(|e| e.to_str()) {
            Some("u16") => TokenFormat::U16,
            Some("u32") => TokenFormat::U32,
            _ => TokenFormat::Bytes,
        }
    }

    /// Bytes per token.
    pub fn width(self) -> usize {
        match self {
            TokenFormat::Bytes => 1,
            TokenFormat::U16 => 2,
            TokenFormat::U32 => 4,
        }
    }

    fn decode(self, bytes: &[u8], out: &mut Vec<u64>) {
        out.clear();
        match self {
            TokenFormat::Bytes => out.extend(bytes.iter().map(|&b| u64::from(b))),
            TokenFormat::U16 => out
                .extend(bytes.chunks_exact(2).map(|c| u64::from(u16::from_le_bytes([c[0], c[1]])))),
            TokenFormat::U32 => out.extend(
                bytes
                    .chunks_exact(4)
                    .map(|c| u64::from(u32::from_le_bytes([c[0], c[1], c[2], c[3]]))),
            ),
        }
    }
}

/// Writes `tokens` to `path` in the format its extension names ([`TokenFormat::from_path`]).
/// Fails without writing if a token does not fit the format.
pub fn write_token_file(path: &Path, tokens: &[u32]) -> Result<(), DataError> {
    let format = TokenFormat::from_path(path);
    let width = format.width();
    let mut bytes = Vec::with_capacity(tokens.len() * width);
    for &t in tokens {
        let too_wide =
            || DataError::TokenTooWide { path: path.to_owned(), token: u64::from(t), width };
        match format {
            TokenFormat::Bytes => bytes.push(u8::try_from(t).map_err(|_| too_wide())?),
            TokenFormat::U16 => {
                bytes.extend_from_slice(&u16::try_from(t).map_err(|_| too_wide())?.to_le_bytes())
            }
            TokenFormat::U32 => bytes.extend_from_slice(&t.to_le_bytes()),
        }
    }
    let io = |source| DataError::Io { path: path.to_owned(), op: "write", source };
    let mut f = File::create(path).map_err(io)?;
    f.write_all(&bytes).map_err(io)?;
    f.sync_all().map_err(io)
}

/// Seeded synthetic data: `sequences` walks of a Markov chain over `vocab` tokens (see the
/// module docs). Sequence `k` depends only on `(seed, k)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Synthetic {
    /// The seed of the chain and of every walk.
    pub seed: u64,
    /// Number of sequences in one epoch.
    pub sequences: u64,
}

/// Successor probabilities of the synthetic chain, in 1/100.
const SYNTHETIC_WEIGHTS: [u32; 4] = [55, 25, 12, 8];

/// Where the tokens come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DataSource {
    /// A token file ([`TokenFormat::from_path`] decides its format).
    File(PathBuf),
    /// Generated data.
    Synthetic(Synthetic),
    /// One split of a directory written by `loco data prepare` ([`prepared`]): its shards,
    /// concatenated in manifest order, read as one token stream. `[real] data = "DIR"` is the
    /// train split; the held-out split is for evaluation.
    Prepared {
        /// The prepared directory (holding `manifest.json`).
        dir: PathBuf,
        /// The split to read.
        split: Split,
    },
}

impl DataSource {
    /// Sequences per epoch of the synthetic data a scenario without a data file trains on.
    pub const SYNTHETIC_SEQUENCES: u64 = 1 << 20;

    /// The source a scenario's `[real] data` names: the file at `data` (relative to
    /// `scenario_dir`, the directory of the scenario file, unless absolute), the train split of
    /// the prepared data set when that path is a directory, or, when there is none,
    /// [`Synthetic`] data from `seed` with [`DataSource::SYNTHETIC_SEQUENCES`] sequences.
    ///
    /// (A [`DataSource::File`] naming a directory is read as that directory's train split too.)
    pub fn from_scenario(data: Option<&str>, scenario_dir: &Path, seed: u64) -> DataSource {
        match data {
            Some(file) => {
                let path = scenario_dir.join(file);
                if path.is_dir() {
                    DataSource::Prepared { dir: path, split: Split::Train }
                } else {
                    DataSource::File(path)
                }
            }
            None => DataSource::Synthetic(Synthetic { seed, sequences: Self::SYNTHETIC_SEQUENCES }),
        }
    }
}

/// One node's share of the data: node `index` of `count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    /// This node's index, below `count`.
    pub index: u32,
    /// The number of shards.
    pub count: u32,
}

impl Shard {
    /// The whole data set.
    pub const WHOLE: Shard = Shard { index: 0, count: 1 };

    /// Shard `index` of `count`; fails unless `index < count`.
    pub fn new(index: u32, count: u32) -> Result<Shard, DataError> {
        if index >= count {
            return Err(DataError::BadShard { index, count });
        }
        Ok(Shard { index, count })
    }
}

/// The order sequences are visited in each epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Order {
    /// File order, every epoch.
    Sequential,
    /// A seeded permutation, different every epoch.
    Shuffled {
        /// The permutation's seed.
        seed: u64,
    },
}

/// Where a loader is: the epoch, and how many of its shard's sequences it has read in it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DataPosition {
    /// Completed passes over the shard.
    pub epoch: u64,
    /// Sequences of this shard read in the current epoch.
    pub offset: u64,
}

impl fmt::Display for DataPosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "epoch {} offset {}", self.epoch, self.offset)
    }
}

enum Tokens {
    /// A stream of tokens in one file, or in the shards of a prepared split one after another.
    Files {
        /// The file, or the directory and split, for messages.
        label: String,
        segments: Vec<prepared::Segment>,
        format: TokenFormat,
        buf: Vec<u8>,
        decoded: Vec<u64>,
    },
    Synthetic {
        seed: u64,
        successors: Vec<u32>,
    },
}

/// Reads batches of packed sequences from one shard of a [`DataSource`].
pub struct DataLoader {
    tokens: Tokens,
    seq_len: u64,
    vocab: u64,
    sequences: u64,
    shard: Shard,
    order: Order,
    per_epoch: u64,
    position: DataPosition,
    /// The permutation of the current epoch, `(a, b)`; `(1, 0)` for file order.
    perm: (u64, u64),
}

impl fmt::Debug for DataLoader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let source = match &self.tokens {
            Tokens::Files { label, format, .. } => format!("{label} ({format:?})"),
            Tokens::Synthetic { seed, .. } => format!("synthetic (seed {seed})"),
        };
        f.debug_struct("DataLoader")
            .field("source", &source)
            .field("seq_len", &self.seq_len)
            .field("sequences", &self.sequences)
            .field("shard", &self.shard)
            .field("order", &self.order)
            .field("position", &self.position)
            .finish()
    }
}

impl DataLoader {
    /// A loader of sequences of `seq_len + 1` tokens below `vocab` from `source`, for `shard`,
    /// at the start of epoch 0. A file is opened and its size checked here; its tokens are
    /// checked against `vocab` as they are read.
    pub fn new(
        source: &DataSource,
        seq_len: usize,
        vocab: u32,
        shard: Shard,
        order: Order,
    ) -> Result<DataLoader, DataError> {
        if seq_len == 0 {
            return Err(DataError::BadSetting {
                field: "seq_len",
                value: 0,
                expected: "at least 1",
            });
        }
        if vocab == 0 {
            return Err(DataError::BadSetting { field: "vocab", value: 0, expected: "at least 1" });
        }
        Shard::new(shard.index, shard.count)?;
        let seq_len = seq_len as u64;
        let (tokens, sequences) = match source {
            DataSource::File(path) if path.is_dir() => {
                open_prepared(path, Split::Train, seq_len, u64::from(vocab))?
            }
            DataSource::Prepared { dir, split } => {
                open_prepared(dir, *split, seq_len, u64::from(vocab))?
            }
            DataSource::File(path) => open_file(path, seq_len)?,
            DataSource::Synthetic(s) => {
                if s.sequences == 0 {
                    return Err(DataError::BadSetting {
                        field: "synthetic.sequences",
                        value: 0,
                        expected: "at least 1",
                    });
                }
                let mut rng = ChaCha8Rng::seed_from_u64(s.seed);
                let successors = (0..u64::from(vocab) * SYNTHETIC_WEIGHTS.len() as u64)
                    .map(|_| rng.random_range(0..vocab))
                    .collect();
                (Tokens::Synthetic { seed: s.seed, successors }, s.sequences)
            }
        };
        let index = u64::from(shard.index);
        let count = u64::from(shard.count);
        let per_epoch = if sequences > index { (sequences - index).div_ceil(count) } else { 0 };
        if per_epoch == 0 {
            return Err(DataError::EmptyShard {
                index: shard.index,
                count: shard.count,
                sequences,
            });
        }
        let mut loader = DataLoader {
            tokens,
            seq_len,
            vocab: u64::from(vocab),
            sequences,
            shard,
            order,
            per_epoch,
            position: DataPosition::default(),
            perm: (1, 0),
        };
        loader.perm = loader.permutation(0);
        Ok(loader)
    }

    /// A loader of one split of the prepared data set in `dir` (written by `loco data
    /// prepare`): [`DataLoader::new`] with [`DataSource::Prepared`]. Evaluation reads
    /// [`Split::HeldOut`] with it, e.g. `DataLoader::prepared(dir, Split::HeldOut, seq_len,
    /// vocab, Shard::WHOLE, Order::Sequential)`. Fails if the manifest's vocabulary is larger
    /// than `vocab`, a shard's size differs from the manifest, or the split holds fewer than
    /// `seq_len + 1` tokens.
    pub fn prepared(
        dir: &Path,
        split: Split,
        seq_len: usize,
        vocab: u32,
        shard: Shard,
        order: Order,
    ) -> Result<DataLoader, DataError> {
        let source = DataSource::Prepared { dir: dir.to_owned(), split };
        DataLoader::new(&source, seq_len, vocab, shard, order)
    }

    /// Sequences in the whole data (all shards), per epoch.
    pub fn sequences(&self) -> u64 {
        self.sequences
    }

    /// Sequences in this shard, per epoch.
    pub fn per_epoch(&self) -> u64 {
        self.per_epoch
    }

    /// The shard this loader reads.
    pub fn shard(&self) -> Shard {
        self.shard
    }

    /// Tokens per sequence: `seq_len + 1`.
    pub fn row_len(&self) -> usize {
        self.seq_len as usize + 1
    }

    /// The position of the next sequence.
    pub fn position(&self) -> DataPosition {
        self.position
    }

    /// Moves to `position` (from [`DataLoader::position`], possibly of another process with the
    /// same source, shard and order); the batches that followed it follow again.
    pub fn seek(&mut self, position: DataPosition) -> Result<(), DataError> {
        if position.offset >= self.per_epoch {
            return Err(DataError::BadPosition { position, per_epoch: self.per_epoch });
        }
        self.position = position;
        self.perm = self.permutation(position.epoch);
        Ok(())
    }

    /// The index (in file order) of the sequence at `position`.
    pub fn sequence_index(&self, position: DataPosition) -> u64 {
        let perm = if position.epoch == self.position.epoch {
            self.perm
        } else {
            self.permutation(position.epoch)
        };
        let slot = u64::from(self.shard.index) + position.offset * u64::from(self.shard.count);
        permute(perm, slot, self.sequences)
    }

    /// The next `rows` sequences, row after row (`rows * (seq_len + 1)` tokens, as the trainer
    /// takes them), moving on to the next epoch at the end of one. On error the position is
    /// that of the sequence that failed.
    pub fn next_batch(&mut self, rows: usize) -> Result<Vec<i64>, DataError> {
        let mut out = Vec::with_capacity(rows * self.row_len());
        for _ in 0..rows {
            self.next_sequence_into(&mut out)?;
        }
        Ok(out)
    }

    /// Appends the next sequence (`seq_len + 1` tokens) to `out` and moves on.
    pub fn next_sequence_into(&mut self, out: &mut Vec<i64>) -> Result<(), DataError> {
        let k = self.sequence_index(self.position);
        self.read_sequence(k, out)?;
        self.position.offset += 1;
        if self.position.offset == self.per_epoch {
            self.position = DataPosition { epoch: self.position.epoch + 1, offset: 0 };
            self.perm = self.permutation(self.position.epoch);
        }
        Ok(())
    }

    fn permutation(&self, epoch: u64) -> (u64, u64) {
        match self.order {
            Order::Sequential => (1, 0),
            Order::Shuffled { seed } => {
                let n = self.sequences;
                if n == 1 {
                    return (1, 0);
                }
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                rng.set_stream(epoch);
                let b = rng.random_range(0..n);
                loop {
                    let a = rng.random_range(1..n);
                    if gcd(a, n) == 1 {
                        return (a, b);
                    }
                }
            }
        }
    }

    fn read_sequence(&mut self, k: u64, out: &mut Vec<i64>) -> Result<(), DataError> {
        let len = self.seq_len + 1;
        match &mut self.tokens {
            Tokens::Files { segments, format, buf, decoded, .. } => {
                let width = format.width() as u64;
                let mut pos = k * self.seq_len;
                let end = pos + len;
                while pos < end {
                    // The segment holding `pos`: the first that ends after it.
                    let i = segments.partition_point(|s| s.start + s.tokens <= pos);
                    let seg = &mut segments[i];
                    let local = pos - seg.start;
                    let n = (end - pos).min(seg.tokens - local);
                    let io = |source| DataError::Io { path: seg.path.clone(), op: "read", source };
                    buf.resize((n * width) as usize, 0);
                    seg.file.seek(SeekFrom::Start(local * width)).map_err(io)?;
                    seg.file.read_exact(buf).map_err(io)?;
                    format.decode(buf, decoded);
                    for (j, &t) in decoded.iter().enumerate() {
                        if t >= self.vocab {
                            return Err(DataError::TokenOutOfRange {
                                path: seg.path.clone(),
                                offset: local + j as u64,
                                token: t,
                                vocab: self.vocab,
                            });
                        }
                        out.push(t as i64);
                    }
                    pos += n;
                }
            }
            Tokens::Synthetic { seed, successors } => {
                let mut rng = ChaCha8Rng::seed_from_u64(*seed);
                // Stream 0 drew the chain; walk k uses stream k + 1.
                rng.set_stream(k + 1);
                let mut t = rng.random_range(0..self.vocab);
                let total: u32 = SYNTHETIC_WEIGHTS.iter().sum();
                for _ in 0..len {
                    out.push(t as i64);
                    let mut r = rng.random_range(0..total);
                    let mut j = 0;
                    while r >= SYNTHETIC_WEIGHTS[j] {
                        r -= SYNTHETIC_WEIGHTS[j];
                        j += 1;
                    }
                    t = u64::from(successors[t as usize * SYNTHETIC_WEIGHTS.len() + j]);
                }
            }
        }
        Ok(())
    }
}

/// A single token file as a one-segment stream, and its sequence count.
fn open_file(path: &Path, seq_len: u64) -> Result<(Tokens, u64), DataError> {
    let format = TokenFormat::from_path(path);
    let open = |source| DataError::Open { path: path.to_owned(), source };
    let file = File::open(path).map_err(open)?;
    let bytes = file.metadata().map_err(open)?.len();
    let width = format.width() as u64;
    if bytes % width != 0 {
        return Err(DataError::BadLength { path: path.to_owned(), bytes, width: format.width() });
    }
    let count = bytes / width;
    if count < seq_len + 1 {
        return Err(DataError::TooShort {
            path: path.to_owned(),
            tokens: count,
            needed: seq_len + 1,
        });
    }
    let segment = prepared::Segment { path: path.to_owned(), file, start: 0, tokens: count };
    let tokens = Tokens::Files {
        label: path.display().to_string(),
        segments: vec![segment],
        format,
        buf: Vec::new(),
        decoded: Vec::new(),
    };
    Ok((tokens, (count - 1) / seq_len))
}

/// One split of a prepared directory as a stream of its shards, and its sequence count.
fn open_prepared(
    dir: &Path,
    split: Split,
    seq_len: u64,
    vocab: u64,
) -> Result<(Tokens, u64), DataError> {
    let (segments, format, count) = prepared::open(dir, split, vocab)?;
    if count < seq_len + 1 {
        return Err(DataError::SplitTooShort {
            dir: dir.to_owned(),
            split,
            tokens: count,
            needed: seq_len + 1,
        });
    }
    let tokens = Tokens::Files {
        label: format!("{} ({split})", dir.display()),
        segments,
        format,
        buf: Vec::new(),
        decoded: Vec::new(),
    };
    Ok((tokens, (count - 1) / seq_len))
}

/// `(a * slot + b) mod n` without overflow.
fn permute((a, b): (u64, u64), slot: u64, n: u64) -> u64 {
    ((u128::from(a) * u128::from(slot) + u128::from(b)) % u128::from(n)) as u64
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn affine_permutations_are_bijections() {
        for n in [2u64, 3, 7, 12, 64, 97, 100] {
            let shard = Shard::WHOLE;
            let src = DataSource::Synthetic(Synthetic { seed: 1, sequences: n });
            let loader = DataLoader::new(&src, 4, 16, shard, Order::Shuffled { seed: n }).unwrap();
            for epoch in 0..4 {
                let mut seen: Vec<u64> = (0..n)
                    .map(|offset| loader.sequence_index(DataPosition { epoch, offset }))
                    .collect();
                seen.sort_unstable();
                assert_eq!(seen, (0..n).collect::<Vec<_>>(), "n {n} epoch {epoch}");
            }
        }
    }

    #[test]
    fn formats_by_extension() {
        assert_eq!(TokenFormat::from_path(Path::new("a/b.u16")), TokenFormat::U16);
        assert_eq!(TokenFormat::from_path(Path::new("b.u32")), TokenFormat::U32);
        assert_eq!(TokenFormat::from_path(Path::new("b.txt")), TokenFormat::Bytes);
        assert_eq!(TokenFormat::from_path(Path::new("b")), TokenFormat::Bytes);
        let mut out = Vec::new();
        TokenFormat::U16.decode(&[1, 0, 0, 1], &mut out);
        assert_eq!(out, [1, 256]);
        TokenFormat::U32.decode(&[1, 0, 0, 0, 0, 0, 1, 0], &mut out);
        assert_eq!(out, [1, 65536]);
    }

    #[test]
    fn gcd_by_hand() {
        assert_eq!(gcd(12, 18), 6);
        assert_eq!(gcd(7, 100), 1);
        assert_eq!(gcd(5, 0), 5);
    }
}
