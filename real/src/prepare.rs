//! `loco data prepare`: text in, token shards out, for [`DataSource::Prepared`].
//!
//! Inputs (plain text, JSON lines, Parquet; see `input`) are read in order as one stream of
//! documents, cut into work units of about [`PrepareOptions::unit_bytes`] of text. Each unit's
//! documents are tokenized in parallel (rayon, results in document order) with a Hugging Face
//! `tokenizer.json` (`encode(text, add_special_tokens = true)`, so a tokenizer that adds a BOS
//! adds it, as Python's `Tokenizer.encode(text).ids` does; then the `--eos` token, if any), and
//! each document goes to the train or the held-out split by a hash of (seed, its index in the
//! whole stream) ([`is_held_out`]). A unit writes `train-NNNNN.uXX` and `heldout-NNNNN.uXX`
//! (tokens of 2 bytes for vocabularies up to 65,536, else 4) atomically, then appends itself to
//! the journal; `manifest.json` is written last. The output depends only on the inputs and the
//! settings, not on the thread count; a killed run resumes where its journal ends.
//!
//! The layout of the directory and the manifest: [`crate::data::prepared`].
//!
//! [`DataSource::Prepared`]: crate::data::DataSource::Prepared

mod input;
mod outdir;
#[cfg(test)]
mod tests;

use crate::data::DataError;
use crate::data::prepared::{
    FORMAT_VERSION, MANIFEST_FILE, Manifest, PrepareSettings, ShardFile, Split, SplitManifest,
    TOKENIZER_FILE, TextUnit,
};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use input::{Input, Origin, ReadSettings};
use outdir::{State, UnitRecord};
use rayon::prelude::*;
use serde::Serialize;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Instant;

/// What can go wrong preparing data. Errors about an input name the file and, where there is
/// one, the line or row.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// An input file that cannot be read, or holds something other than expected.
    #[error("{}{}: {message}", path.display(), at.as_ref().map(|a| format!(": {a}")).unwrap_or_default())]
    Input {
        /// The input file.
        path: PathBuf,
        /// Where in it (`line 3`, `row 7`), if anywhere in particular.
        at: Option<String>,
        /// What is wrong.
        message: String,
    },
    /// The tokenizer file cannot be read or used.
    #[error("{}: {message}", path.display())]
    Tokenizer {
        /// The tokenizer file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// An option out of range.
    #[error("{field} {value}: expected {expected}")]
    Setting {
        /// The option.
        field: &'static str,
        /// Its value.
        value: String,
        /// What was expected.
        expected: &'static str,
    },
    /// The output directory holds something this run cannot continue.
    #[error("{}: {message}", dir.display())]
    OutDir {
        /// The directory (or its journal).
        dir: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// Writing or reading the output failed.
    #[error("{}: cannot {op}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// A finished directory's manifest that does not read.
    #[error(transparent)]
    Data(#[from] DataError),
    /// The input reader stopped because writing failed (never returned by [`prepare`]: the
    /// writing error is).
    #[error("stopped")]
    Stopped,
}

impl PrepareError {
    fn input(path: &Path, at: Option<String>, message: impl Into<String>) -> PrepareError {
        PrepareError::Input { path: path.to_owned(), at, message: message.into() }
    }

    fn io(path: &Path, op: &'static str, source: std::io::Error) -> PrepareError {
        PrepareError::Io { path: path.to_owned(), op, source }
    }
}

/// Bytes of text per work unit unless told otherwise.
pub const DEFAULT_UNIT_BYTES: u64 = 64 << 20;

/// What `loco data prepare` is asked to do.
#[derive(Clone, Debug)]
pub struct PrepareOptions {
    /// The Hugging Face `tokenizer.json`.
    pub tokenizer: PathBuf,
    /// The output directory.
    pub out: PathBuf,
    /// Input paths or globs, in order.
    pub inputs: Vec<String>,
    /// The JSONL field or Parquet column of the text.
    pub field: String,
    /// How plain-text inputs are cut into documents.
    pub text_unit: TextUnit,
    /// The fraction of documents held out, in [0, 1).
    pub held_out: f64,
    /// The seed of the split.
    pub seed: u64,
    /// A token appended to every document (e.g. `<|end_of_text|>`).
    pub eos: Option<String>,
    /// Tokenizing threads (default: the cores).
    pub threads: Option<usize>,
    /// Bytes of text per work unit.
    pub unit_bytes: u64,
    /// Draw a progress bar on stderr (where it is a terminal).
    pub progress: bool,
}

impl PrepareOptions {
    /// The defaults: field `text`, paragraphs, 1% held out, seed 0, no eos, all cores,
    /// [`DEFAULT_UNIT_BYTES`], no progress bar.
    pub fn new(tokenizer: PathBuf, out: PathBuf, inputs: Vec<String>) -> PrepareOptions {
        PrepareOptions {
            tokenizer,
            out,
            inputs,
            field: "text".into(),
            text_unit: TextUnit::Paragraph,
            held_out: 0.01,
            seed: 0,
            eos: None,
            threads: None,
            unit_bytes: DEFAULT_UNIT_BYTES,
            progress: false,
        }
    }
}

/// What a preparation did.
#[derive(Clone, Debug, Serialize)]
pub struct PrepareReport {
    /// The output directory.
    pub dir: PathBuf,
    /// The directory was already finished with these settings: nothing was done.
    pub already_finished: bool,
    /// The tokenizer's vocabulary size.
    pub vocab_size: u64,
    /// Bytes per token in the shards.
    pub token_width: usize,
    /// Documents and tokens of the train split.
    pub train: SplitCounts,
    /// Documents and tokens of the held-out split.
    pub held_out: SplitCounts,
    /// Bytes of document text, all units.
    pub text_bytes: u64,
    /// Work units, all of them.
    pub units: u64,
    /// Units found finished in the directory and kept.
    pub units_resumed: u64,
    /// Bytes of text tokenized by this run (not counting resumed units).
    pub processed_bytes: u64,
    /// Wall seconds of this run.
    pub seconds: f64,
    /// Tokenizing threads.
    pub threads: usize,
}

/// Documents and tokens of one split.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SplitCounts {
    /// Documents.
    pub documents: u64,
    /// Tokens.
    pub tokens: u64,
}

impl PrepareReport {
    /// Documents of both splits.
    pub fn documents(&self) -> u64 {
        self.train.documents + self.held_out.documents
    }

    /// Tokens of both splits.
    pub fn tokens(&self) -> u64 {
        self.train.tokens + self.held_out.tokens
    }

    /// Megabytes (1e6) of text tokenized per second by this run.
    pub fn mb_per_second(&self) -> f64 {
        self.processed_bytes as f64 / 1e6 / self.seconds.max(1e-9)
    }
}

/// Whether document `index` (counted over all inputs, from 0) is held out: its hash with `seed`,
/// as a fraction in [0, 1), is below `fraction`. The hash is two rounds of SplitMix64:
/// `mix(seed ^ mix(index))`, whose top 53 bits make the fraction.
pub fn is_held_out(seed: u64, index: u64, fraction: f64) -> bool {
    fn mix(mut z: u64) -> u64 {
        z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    let h = mix(seed ^ mix(index));
    ((h >> 11) as f64) * (1.0 / (1u64 << 53) as f64) < fraction
}

/// A loaded tokenizer and what the preparation needs from it.
struct LoadedTokenizer {
    tokenizer: tokenizers::Tokenizer,
    bytes: Vec<u8>,
    blake3: String,
    vocab: u64,
    eos_id: Option<u32>,
    width: usize,
}

impl LoadedTokenizer {
    fn load(path: &Path, eos: Option<&str>) -> Result<LoadedTokenizer, PrepareError> {
        let bad = |message: String| PrepareError::Tokenizer { path: path.to_owned(), message };
        let bytes = std::fs::read(path).map_err(|e| bad(format!("cannot read: {e}")))?;
        let tokenizer = tokenizers::Tokenizer::from_bytes(&bytes)
            .map_err(|e| bad(format!("not a Hugging Face tokenizer.json: {e}")))?;
        let vocab = tokenizer.get_vocab_size(true) as u64;
        let eos_id = match eos {
            None => None,
            Some(token) => Some(tokenizer.token_to_id(token).ok_or_else(|| {
                bad(format!("--eos {token:?}: no such token in this tokenizer's vocabulary"))
            })?),
        };
        let width = if vocab <= 1 << 16 { 2 } else { 4 };
        let blake3 = blake3::hash(&bytes).to_hex().to_string();
        Ok(LoadedTokenizer { tokenizer, bytes, blake3, vocab, eos_id, width })
    }

    /// The ids of one document: the tokenizer's, special tokens added, then eos.
    fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        // `encode_fast` is `encode` without the offsets: the same ids.
        let encoding = self.tokenizer.encode_fast(text, true).map_err(|e| e.to_string())?;
        let mut ids = encoding.get_ids().to_vec();
        ids.extend(self.eos_id);
        if let Some(&bad) = ids.iter().find(|&&id| u64::from(id) >= self.vocab) {
            return Err(format!("token id {bad} is outside the vocabulary of {}", self.vocab));
        }
        Ok(ids)
    }
}

/// One unit of documents from the reader: their text (none for a unit already done) and where
/// each came from.
struct Unit {
    index: u64,
    first_document: u64,
    documents: u64,
    text_bytes: u64,
    docs: Vec<String>,
    origins: Vec<Origin>,
}

/// Runs a preparation: see the module docs.
pub fn prepare(opts: &PrepareOptions) -> Result<PrepareReport, PrepareError> {
    // Wall time for the summary only: nothing is decided on it.
    #[allow(clippy::disallowed_methods)]
    let start = Instant::now();
    if !(0.0..1.0).contains(&opts.held_out) {
        return Err(PrepareError::Setting {
            field: "--held-out",
            value: opts.held_out.to_string(),
            expected: "a fraction in [0, 1)",
        });
    }
    if opts.unit_bytes == 0 {
        return Err(PrepareError::Setting {
            field: "--unit-bytes",
            value: "0".into(),
            expected: "at least 1",
        });
    }
    let threads = match opts.threads {
        Some(0) => {
            return Err(PrepareError::Setting {
                field: "--threads",
                value: "0".into(),
                expected: "at least 1",
            });
        }
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let tok = LoadedTokenizer::load(&opts.tokenizer, opts.eos.as_deref())?;
    let inputs = input::resolve(&opts.inputs)?;
    let settings = PrepareSettings {
        tokenizer_blake3: tok.blake3.clone(),
        seed: opts.seed,
        held_out: opts.held_out,
        eos: opts.eos.clone(),
        field: opts.field.clone(),
        text_unit: opts.text_unit,
        unit_bytes: opts.unit_bytes,
        inputs: inputs.iter().map(Input::record).collect(),
    };
    let (done, mut journal) = match outdir::open(&opts.out, &settings, tok.width)? {
        State::Finished(m) => return Ok(finished_report(opts, &m, threads, start)),
        State::Resume { done, journal } => (done, journal),
    };
    outdir::copy_tokenizer(&opts.out, &tok.bytes)?;
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().map_err(|e| {
        PrepareError::Setting {
            field: "--threads",
            value: format!("{threads} ({e})"),
            expected: "a thread count this machine can start",
        }
    })?;
    let total_bytes: u64 = inputs.iter().map(|i| i.bytes).sum();
    let bar = progress_bar(opts.progress, total_bytes);
    let read_settings = ReadSettings { field: opts.field.clone(), text_unit: opts.text_unit };
    let ctx = Context { opts, tok: &tok, inputs: &inputs, pool: &pool, bar: &bar };
    let records = std::thread::scope(|scope| {
        let (tx, rx) = mpsc::sync_channel(1);
        let skip = done.len() as u64;
        let (inputs, read_settings, bar) = (&inputs, &read_settings, &bar);
        let reader =
            scope.spawn(move || read_units(inputs, read_settings, opts.unit_bytes, skip, bar, tx));
        let records = ctx.write_units(rx, &done, &mut journal);
        // The reader stops with `Stopped` when writing failed (the receiver is gone): the
        // writing error is the one. When reading failed, the units it sent were written and
        // the reading error is the one.
        match reader.join().unwrap_or_else(|p| std::panic::resume_unwind(p)) {
            Err(e) if !matches!(e, PrepareError::Stopped) => Err(e),
            _ => records,
        }
    })?;
    bar.finish_and_clear();
    if records.is_empty() {
        return Err(PrepareError::Setting {
            field: "INPUT",
            value: opts.inputs.join(" "),
            expected: "inputs holding at least one non-empty document",
        });
    }
    let manifest = manifest(&settings, &tok, &records);
    let text = serde_json::to_vec_pretty(&manifest).expect("a manifest serialises");
    outdir::write_atomic(&opts.out.join(MANIFEST_FILE), &text)?;
    outdir::sync_dir(&opts.out)?;
    let mut report = finished_report(opts, &manifest, threads, start);
    report.already_finished = false;
    report.units_resumed = done.len() as u64;
    report.processed_bytes = records[done.len()..].iter().map(|r| r.text_bytes).sum();
    Ok(report)
}

/// What the unit writer needs.
struct Context<'a> {
    opts: &'a PrepareOptions,
    tok: &'a LoadedTokenizer,
    inputs: &'a [Input],
    pool: &'a rayon::ThreadPool,
    bar: &'a ProgressBar,
}

impl Context<'_> {
    /// Tokenizes and writes each unit the reader sends (checking those already done against
    /// the journal); returns the records of all units.
    fn write_units(
        &self,
        rx: mpsc::Receiver<Unit>,
        done: &[UnitRecord],
        journal: &mut outdir::Journal,
    ) -> Result<Vec<UnitRecord>, PrepareError> {
        let mut records = Vec::new();
        let (mut documents, mut tokens) = (0u64, 0u64);
        for unit in rx {
            let record = match done.get(unit.index as usize) {
                Some(r) => {
                    if (r.documents, r.text_bytes) != (unit.documents, unit.text_bytes) {
                        return Err(PrepareError::OutDir {
                            dir: self.opts.out.clone(),
                            message: format!(
                                "unit {} held {} documents ({} bytes) when it was written, and \
                                 the inputs now give {} ({} bytes): an input changed; remove the \
                                 directory to start over",
                                unit.index,
                                r.documents,
                                r.text_bytes,
                                unit.documents,
                                unit.text_bytes
                            ),
                        });
                    }
                    r.clone()
                }
                None => {
                    let record = self.write_unit(&unit)?;
                    journal.append(&record)?;
                    record
                }
            };
            documents += record.documents;
            tokens += record.train_tokens + record.heldout_tokens;
            self.bar.set_message(format!("{documents} documents, {tokens} tokens"));
            records.push(record);
        }
        if records.len() < done.len() {
            return Err(PrepareError::OutDir {
                dir: self.opts.out.clone(),
                message: format!(
                    "{} units were written, and the inputs now give {}: an input changed; remove \
                     the directory to start over",
                    done.len(),
                    records.len()
                ),
            });
        }
        Ok(records)
    }

    /// Tokenizes one unit in parallel, splits its documents and writes its shards.
    fn write_unit(&self, unit: &Unit) -> Result<UnitRecord, PrepareError> {
        let ids: Vec<Vec<u32>> = self.pool.install(|| {
            unit.docs
                .par_iter()
                .zip(unit.origins.par_iter())
                .map(|(text, origin)| {
                    self.tok.encode(text).map_err(|message| {
                        let input = &self.inputs[origin.input as usize];
                        let at = if input.kind == input::Kind::Parquet { "row" } else { "line" };
                        PrepareError::Input {
                            path: input.path.clone(),
                            at: Some(format!("{at} {}", origin.at)),
                            message: format!("cannot tokenize: {message}"),
                        }
                    })
                })
                .collect::<Result<_, _>>()
        })?;
        let width = self.tok.width;
        let mut record = UnitRecord {
            unit: unit.index,
            documents: unit.documents,
            text_bytes: unit.text_bytes,
            ..UnitRecord::default()
        };
        let (mut train, mut held) = (Vec::new(), Vec::new());
        for (i, doc) in ids.iter().enumerate() {
            let index = unit.first_document + i as u64;
            let (bytes, docs, tokens) = if is_held_out(self.opts.seed, index, self.opts.held_out) {
                (&mut held, &mut record.heldout_documents, &mut record.heldout_tokens)
            } else {
                (&mut train, &mut record.train_documents, &mut record.train_tokens)
            };
            *docs += 1;
            *tokens += doc.len() as u64;
            for &id in doc {
                if width == 2 {
                    bytes.extend_from_slice(&(id as u16).to_le_bytes());
                } else {
                    bytes.extend_from_slice(&id.to_le_bytes());
                }
            }
        }
        for (split, bytes) in [(Split::Train, &train), (Split::HeldOut, &held)] {
            if !bytes.is_empty() {
                let path = self.opts.out.join(split.shard_file(unit.index, width));
                outdir::write_atomic(&path, bytes)?;
            }
        }
        outdir::sync_dir(&self.opts.out)?;
        Ok(record)
    }
}

/// Reads the inputs in order into units of at least `unit_bytes` of text (the last may be
/// smaller) and sends them; the first `skip` units are sent without their text. Stops at the
/// first error, or with [`PrepareError::Stopped`] when the receiver is gone.
fn read_units(
    inputs: &[Input],
    settings: &ReadSettings,
    unit_bytes: u64,
    skip: u64,
    bar: &ProgressBar,
    tx: mpsc::SyncSender<Unit>,
) -> Result<(), PrepareError> {
    let read = Arc::new(AtomicU64::new(0));
    let fresh = |index: u64, first_document: u64| Unit {
        index,
        first_document,
        documents: 0,
        text_bytes: 0,
        docs: Vec::new(),
        origins: Vec::new(),
    };
    let mut unit = fresh(0, 0);
    let mut emit = |text: String, origin: Origin| -> Result<(), PrepareError> {
        unit.documents += 1;
        unit.text_bytes += text.len() as u64;
        if unit.index >= skip {
            unit.docs.push(text);
            unit.origins.push(origin);
        }
        if unit.documents % 1024 == 0 {
            bar.set_position(read.load(Ordering::Relaxed));
        }
        if unit.text_bytes >= unit_bytes {
            let next = fresh(unit.index + 1, unit.first_document + unit.documents);
            tx.send(std::mem::replace(&mut unit, next)).map_err(|_| PrepareError::Stopped)?;
        }
        Ok(())
    };
    for (i, input) in inputs.iter().enumerate() {
        input::read_documents(input, i as u32, settings, &read, &mut emit)?;
    }
    bar.set_position(read.load(Ordering::Relaxed));
    if unit.documents > 0 {
        tx.send(unit).map_err(|_| PrepareError::Stopped)?;
    }
    Ok(())
}

/// The manifest of a finished preparation from its unit records.
fn manifest(settings: &PrepareSettings, tok: &LoadedTokenizer, records: &[UnitRecord]) -> Manifest {
    let split = |split: Split| {
        let mut m = SplitManifest::default();
        for r in records {
            let (documents, tokens) = r.split(split);
            m.documents += documents;
            m.tokens += tokens;
            if tokens > 0 {
                m.shards.push(ShardFile { file: split.shard_file(r.unit, tok.width), tokens });
            }
        }
        m
    };
    Manifest {
        format_version: FORMAT_VERSION,
        settings: settings.clone(),
        vocab_size: tok.vocab,
        token_width: tok.width,
        eos_id: tok.eos_id,
        tokenizer: TOKENIZER_FILE.into(),
        text_bytes: records.iter().map(|r| r.text_bytes).sum(),
        train: split(Split::Train),
        held_out: split(Split::HeldOut),
    }
}

/// The report of a finished directory (with nothing processed by this run).
fn finished_report(
    opts: &PrepareOptions,
    m: &Manifest,
    threads: usize,
    start: Instant,
) -> PrepareReport {
    let counts = |s: &SplitManifest| SplitCounts { documents: s.documents, tokens: s.tokens };
    let units = m
        .train
        .shards
        .iter()
        .chain(&m.held_out.shards)
        .filter_map(|s| s.file.split(['-', '.']).nth(1)?.parse::<u64>().ok())
        .max()
        .map_or(0, |u| u + 1);
    PrepareReport {
        dir: opts.out.clone(),
        already_finished: true,
        vocab_size: m.vocab_size,
        token_width: m.token_width,
        train: counts(&m.train),
        held_out: counts(&m.held_out),
        text_bytes: m.text_bytes,
        units,
        units_resumed: 0,
        processed_bytes: 0,
        seconds: start.elapsed().as_secs_f64(),
        threads,
    }
}

/// A progress bar of the input bytes read, on stderr when it is a terminal; hidden otherwise.
fn progress_bar(wanted: bool, total_bytes: u64) -> ProgressBar {
    if !wanted || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(total_bytes), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template(
            "{bar:30} {bytes}/{total_bytes} read, {msg} ({binary_bytes_per_sec}, eta {eta})",
        )
        .expect("a valid template"),
    );
    bar.enable_steady_tick(std::time::Duration::from_millis(250));
    bar
}

/// A byte-level BPE tokenizer (GPT-2 style: byte-level pre-tokenizer, post-processor and
/// decoder, no normaliser) trained on `texts` up to `vocab_size` tokens, with `special` tokens
/// first; returned as `tokenizer.json` text. For tests and `loco bench data`.
pub fn train_byte_level_bpe(
    texts: &[String],
    vocab_size: usize,
    special: &[&str],
) -> Result<String, String> {
    use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
    use tokenizers::normalizers::NormalizerWrapper;
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    let mut trainer = BpeTrainerBuilder::new()
        .show_progress(false)
        .vocab_size(vocab_size)
        .min_frequency(2)
        .special_tokens(special.iter().map(|s| tokenizers::AddedToken::from(*s, true)).collect())
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let mut tokenizer = tokenizers::TokenizerBuilder::<
        BPE,
        NormalizerWrapper,
        ByteLevel,
        ByteLevel,
        ByteLevel,
    >::new()
    .with_model(BPE::default())
    .with_normalizer(None)
    .with_pre_tokenizer(Some(ByteLevel::default()))
    .with_post_processor(Some(ByteLevel::default()))
    .with_decoder(Some(ByteLevel::default()))
    .build()
    .map_err(|e| e.to_string())?;
    tokenizer.train(&mut trainer, texts.iter()).map_err(|e| e.to_string())?;
    tokenizer.to_string(false).map_err(|e| e.to_string())
}
