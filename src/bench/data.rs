//! `loco bench data`: the throughput of `loco data prepare`.
//!
//! Generates `--mb` megabytes of pseudo-English text (a seeded lexicon of syllable words drawn
//! with Zipf frequencies, in sentences and paragraphs) as JSON lines, trains a byte-level BPE of
//! `--vocab` tokens on its first 2 MB (or takes `--tokenizer`), then prepares it twice: on one
//! thread and on `--threads` (default: the cores), each the best of `--repeats` runs. Reports
//! MB of text per second (1 MB = 1e6 bytes of UTF-8 text; the seconds are the whole
//! preparation's, from loading the tokenizer to the manifest) in total and per thread for each,
//! the speed-up, and whether the two runs wrote identical shards (they must).

use crate::cli::DataBench;
use anyhow::{Context, Result, ensure};
use loco_real::prepare::{PrepareOptions, PrepareReport, prepare};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::io::Write;
use std::path::Path;

/// Bytes of text the tokenizer is trained on.
const TRAIN_SAMPLE_BYTES: usize = 2_000_000;

/// The figures of one run (serialised as the `--json` output).
#[derive(Clone, Debug, Serialize)]
pub(crate) struct DataBenchReport {
    /// Cores this machine offers.
    pub(crate) cores: usize,
    /// Bytes of document text.
    pub(crate) text_bytes: u64,
    /// Documents.
    pub(crate) documents: u64,
    /// Tokens written (both splits).
    pub(crate) tokens: u64,
    /// The tokenizer: a path, or the BPE trained here.
    pub(crate) tokenizer: String,
    /// Seconds spent training the tokenizer (0 with `--tokenizer`).
    pub(crate) train_seconds: f64,
    /// The single-threaded run.
    pub(crate) single: RunFigures,
    /// The parallel run.
    pub(crate) parallel: RunFigures,
    /// Parallel MB/s over single-threaded MB/s.
    pub(crate) speedup: f64,
    /// Both runs wrote the same bytes.
    pub(crate) identical: bool,
}

/// Figures of one preparation.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct RunFigures {
    /// Tokenizing threads.
    pub(crate) threads: usize,
    /// Runs timed; the figures are the fastest's.
    pub(crate) repeats: usize,
    /// Wall seconds of the whole preparation.
    pub(crate) seconds: f64,
    /// MB of text per second.
    pub(crate) mb_per_s: f64,
    /// The same per thread.
    pub(crate) mb_per_s_per_thread: f64,
}

impl RunFigures {
    fn of(r: &PrepareReport, repeats: usize) -> RunFigures {
        let mb_per_s = r.mb_per_second();
        RunFigures {
            threads: r.threads,
            repeats,
            seconds: r.seconds,
            mb_per_s,
            mb_per_s_per_thread: mb_per_s / r.threads as f64,
        }
    }
}

impl DataBenchReport {
    /// The table `loco bench data` prints.
    pub(crate) fn print_table(&self, out: &mut impl Write) -> std::io::Result<()> {
        writeln!(
            out,
            "loco data prepare: {} of JSONL text, {} documents, {} tokens; {} ({}); {} cores",
            crate::human::bytes(self.text_bytes),
            self.documents,
            self.tokens,
            self.tokenizer,
            if self.train_seconds > 0.0 {
                format!("trained in {}", crate::human::seconds(self.train_seconds))
            } else {
                "given".to_owned()
            },
            self.cores
        )?;
        writeln!(
            out,
            "{:>8} {:>10} {:>10} {:>16}",
            "threads", "seconds", "MB/s", "MB/s per thread"
        )?;
        for r in [&self.single, &self.parallel] {
            writeln!(
                out,
                "{:>8} {:>10.2} {:>10.2} {:>16.2}",
                r.threads, r.seconds, r.mb_per_s, r.mb_per_s_per_thread
            )?;
        }
        writeln!(
            out,
            "speed-up {:.2}x on {} threads; outputs identical: {}",
            self.speedup,
            self.parallel.threads,
            if self.identical { "yes" } else { "NO" }
        )
    }
}

/// Runs the benchmark in a temporary directory.
pub(crate) fn run(a: &DataBench) -> Result<DataBenchReport> {
    ensure!(a.mb >= 1, "--mb: expected at least 1");
    ensure!(a.repeats >= 1, "--repeats: expected at least 1");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = a.threads.unwrap_or(cores);
    ensure!(threads >= 1, "--threads: expected at least 1");
    let tmp = TempDir::new()?;
    let docs = corpus(a.seed, a.mb * 1_000_000);
    let input = tmp.path().join("corpus.jsonl");
    write_jsonl(&input, &docs)?;
    let (tokenizer, label, train_seconds) = match &a.tokenizer {
        Some(path) => (path.clone(), path.display().to_string(), 0.0),
        None => {
            let clock = crate::clock::now();
            let mut sample = Vec::new();
            let mut bytes = 0;
            for d in &docs {
                if bytes >= TRAIN_SAMPLE_BYTES {
                    break;
                }
                bytes += d.len();
                sample.push(d.clone());
            }
            let json =
                loco_real::prepare::train_byte_level_bpe(&sample, a.vocab, &["<|endoftext|>"])
                    .map_err(|e| anyhow::anyhow!("training the tokenizer: {e}"))?;
            let path = tmp.path().join("tokenizer.json");
            std::fs::write(&path, json)?;
            (path, format!("byte-level BPE of {} tokens", a.vocab), clock.elapsed().as_secs_f64())
        }
    };
    drop(docs);
    // Best of `repeats` (fewest seconds), each into a fresh directory.
    let run = |name: &str, threads: usize| -> Result<PrepareReport> {
        let out = tmp.path().join(name);
        let mut best: Option<PrepareReport> = None;
        for _ in 0..a.repeats {
            let _ = std::fs::remove_dir_all(&out);
            let input = vec![input.display().to_string()];
            let mut o = PrepareOptions::new(tokenizer.clone(), out.clone(), input);
            o.threads = Some(threads);
            o.unit_bytes = 4 << 20;
            o.eos = a.tokenizer.is_none().then(|| "<|endoftext|>".to_owned());
            let r = prepare(&o)?;
            if best.as_ref().is_none_or(|b| r.seconds < b.seconds) {
                best = Some(r);
            }
        }
        Ok(best.expect("at least one repeat"))
    };
    let single = run("one", 1)?;
    let parallel = run("all", threads)?;
    let identical = same_shards(&tmp.path().join("one"), &tmp.path().join("all"))?;
    let (s, p) = (RunFigures::of(&single, a.repeats), RunFigures::of(&parallel, a.repeats));
    Ok(DataBenchReport {
        cores,
        text_bytes: single.text_bytes,
        documents: single.documents(),
        tokens: single.tokens(),
        tokenizer: label,
        train_seconds,
        speedup: p.mb_per_s / s.mb_per_s.max(1e-12),
        single: s,
        parallel: p,
        identical,
    })
}

/// A directory under the system's temporary directory, removed when dropped.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new() -> Result<TempDir> {
        let path = std::env::temp_dir().join(format!("loco-bench-data-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(TempDir(path))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Whether two prepared directories hold the same shards and manifest splits.
fn same_shards(a: &Path, b: &Path) -> Result<bool> {
    let list = |d: &Path| -> Result<Vec<(String, Vec<u8>)>> {
        let mut v = Vec::new();
        for e in std::fs::read_dir(d)? {
            let p = e?.path();
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            if name.starts_with("train-") || name.starts_with("heldout-") {
                v.push((name, std::fs::read(&p)?));
            }
        }
        v.sort();
        Ok(v)
    };
    Ok(list(a)? == list(b)?)
}

fn write_jsonl(path: &Path, docs: &[String]) -> Result<()> {
    let mut w = std::io::BufWriter::new(std::fs::File::create(path)?);
    for d in docs {
        serde_json::to_writer(&mut w, &serde_json::json!({ "text": d }))?;
        w.write_all(b"\n")?;
    }
    w.flush()?;
    Ok(())
}

/// About `bytes` of pseudo-English documents from `seed`.
pub(crate) fn corpus(seed: u64, bytes: u64) -> Vec<String> {
    const ONSETS: &[&str] = &[
        "", "b", "c", "d", "f", "g", "h", "l", "m", "n", "p", "r", "s", "t", "w", "br", "ch", "cl",
        "dr", "gr", "pl", "sh", "st", "th", "tr",
    ];
    const NUCLEI: &[&str] = &["a", "e", "i", "o", "u", "ea", "ou", "ai", "ee", "oo"];
    const CODAS: &[&str] = &["", "", "n", "r", "s", "t", "d", "l", "ng", "st", "ck", "m"];
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let words: Vec<String> = (0..6000)
        .map(|_| {
            let syllables = 1 + rng.random_range(0..3) + usize::from(rng.random_bool(0.1));
            (0..syllables)
                .map(|_| {
                    fn pick(r: &mut ChaCha8Rng, l: &[&'static str]) -> &'static str {
                        l[r.random_range(0..l.len())]
                    }
                    format!(
                        "{}{}{}",
                        pick(&mut rng, ONSETS),
                        pick(&mut rng, NUCLEI),
                        pick(&mut rng, CODAS)
                    )
                })
                .collect()
        })
        .collect();
    // Zipf: the r-th word has weight 1 / (r + 1).
    let mut cumulative = Vec::with_capacity(words.len());
    let mut total = 0.0;
    for r in 0..words.len() {
        total += 1.0 / (r as f64 + 1.0);
        cumulative.push(total);
    }
    let mut docs = Vec::new();
    let mut written = 0u64;
    while written < bytes {
        let mut doc = String::new();
        for s in 0..rng.random_range(2..40) {
            if s > 0 {
                doc.push_str(if rng.random_bool(0.15) { "\n\n" } else { " " });
            }
            let n = rng.random_range(4..18);
            for w in 0..n {
                let x = rng.random_range(0.0..total);
                let word = &words[cumulative.partition_point(|&c| c < x).min(words.len() - 1)];
                if w == 0 {
                    let mut cs = word.chars();
                    doc.extend(cs.next().map(|c| c.to_ascii_uppercase()));
                    doc.push_str(cs.as_str());
                } else {
                    doc.push(' ');
                    doc.push_str(word);
                }
                if w + 1 < n && rng.random_bool(0.08) {
                    doc.push(',');
                }
            }
            doc.push(['.', '.', '.', '?', '!'][rng.random_range(0..5)]);
        }
        written += doc.len() as u64;
        docs.push(doc);
    }
    docs
}
