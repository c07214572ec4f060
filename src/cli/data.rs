//! Command-line types of `loco data` and `loco bench data`.

use clap::{Args, Subcommand};
use std::path::PathBuf;

#[derive(Debug, Subcommand)]
pub(crate) enum DataCommand {
    /// Tokenize text with a Hugging Face tokenizer.json into token shards and a manifest in DIR,
    /// splitting the documents into train and held-out, in parallel over the cores. A killed
    /// run resumes when rerun with the same arguments; a finished DIR reruns as a no-op; other
    /// arguments into a used DIR are refused. Train on it with `[real] data = "DIR"`. The
    /// directory's layout and manifest: docs/data.md. Exit 2 on bad input (the message names the
    /// file and line or row).
    Prepare(PrepareArgs),
}

#[derive(Debug, Args)]
pub(crate) struct PrepareArgs {
    /// Input files or globs (quote globs, e.g. 'web/*.jsonl.zst'), read in the order given, a
    /// glob's matches in name order, as one stream of documents. By extension: `.txt` plain text
    /// (cut into documents by --text-unit), `.jsonl` one JSON object per line with the text in
    /// a string field (--field), `.parquet` the text in a string column (--field). `.txt` and
    /// `.jsonl` may be compressed: `.gz` or `.zst` after the extension.
    #[arg(required = true, value_name = "INPUT")]
    pub(crate) inputs: Vec<String>,
    /// The Hugging Face tokenizer (tokenizer.json). Each document is encoded with its special
    /// tokens (a Llama-3 tokenizer adds its BOS), as Python's `tokenizer.encode(text).ids`; the
    /// file is copied into DIR.
    #[arg(long, value_name = "FILE")]
    pub(crate) tokenizer: PathBuf,
    /// The output directory: new or empty, or one this command wrote with the same arguments
    /// (to resume or confirm it).
    #[arg(long, value_name = "DIR")]
    pub(crate) out: PathBuf,
    /// The JSON field (.jsonl) or string column (.parquet) holding each document's text.
    #[arg(long, default_value = "text", value_name = "NAME")]
    pub(crate) field: String,
    /// How plain text (.txt) is cut into documents: `line` (each non-blank line), `paragraph`
    /// (runs of lines between blank lines, joined by newlines) or `file` (the whole file).
    #[arg(long, default_value = "paragraph", value_name = "UNIT")]
    pub(crate) text_unit: loco_real::data::prepared::TextUnit,
    /// The fraction of documents held out for evaluation, in [0, 1): each document's split is
    /// decided by a hash of --seed and its index in the input stream, so it is the same on every
    /// machine and at any thread count.
    #[arg(long, default_value_t = 0.01, value_name = "FRACTION")]
    pub(crate) held_out: f64,
    /// The seed of the train/held-out split.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// A token appended to every document, e.g. `<|end_of_text|>` (must be in the tokenizer's
    /// vocabulary): marks where one document ends in the packed token stream.
    #[arg(long, value_name = "TOKEN")]
    pub(crate) eos: Option<String>,
    /// Tokenizing threads (default: the cores). The output is the same at any count.
    #[arg(long, value_name = "N")]
    pub(crate) threads: Option<usize>,
    /// Bytes of text per work unit: each unit writes one shard per split and is the step at
    /// which a killed run resumes. Part of the arguments a resume must repeat.
    #[arg(long, default_value_t = loco_real::prepare::DEFAULT_UNIT_BYTES, value_name = "BYTES")]
    pub(crate) unit_bytes: u64,
    /// Print the summary as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct DataBench {
    /// Megabytes (1e6 bytes) of text to generate.
    #[arg(long, default_value_t = 64)]
    pub(crate) mb: u64,
    /// Timed runs per thread count; the fastest is reported.
    #[arg(long, default_value_t = 2)]
    pub(crate) repeats: usize,
    /// A tokenizer.json to use instead of training one.
    #[arg(long, value_name = "FILE")]
    pub(crate) tokenizer: Option<PathBuf>,
    /// Vocabulary size of the trained tokenizer.
    #[arg(long, default_value_t = 8192)]
    pub(crate) vocab: usize,
    /// Threads of the parallel run (default: the cores).
    #[arg(long)]
    pub(crate) threads: Option<usize>,
    /// Seed of the generated text.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}
