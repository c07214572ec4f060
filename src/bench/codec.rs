//! `loco bench codec`: codec throughput against a memcpy of the same buffer, and codec accuracy.
//!
//! One run measures, on `elements` values drawn from N(0,1) (seeded):
//!
//! - a single-core memcpy of the 4n-byte f32 buffer (`copy_from_slice` into a preallocated buffer),
//!   the yardstick every codec figure is divided by;
//! - per codec, single-threaded `encode` and `decode_accumulate` of the whole buffer in one call;
//! - the relative RMS error of one round trip, and the encoded bytes per value;
//! - with `threads > 1`, the same with the buffer split into `threads` contiguous segments, each
//!   encoded (decoded) independently on a dedicated rayon pool (what the real backend does), next to
//!   a memcpy split the same way.
//!
//! Throughput is in GB/s of f32 input (4n bytes / seconds, 1 GB = 1e9 bytes), the best of
//! `repeats` timed runs after one untimed warm-up run (page faults, caches).

use anyhow::{Context, Result, ensure};
use loco_core::codec::CodecKind;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;
use rayon::prelude::*;
use serde::Serialize;
use std::hint::black_box;
use std::io::Write;

/// What `loco bench codec` measures.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodecBenchArgs {
    /// Values in the buffer (f32).
    pub elements: usize,
    /// Codecs to measure, in this order.
    pub codecs: Vec<CodecKind>,
    /// Threads of the multi-threaded measurement; 1 measures single-threaded only.
    pub threads: usize,
    /// Timed runs per figure; the best one is reported.
    pub repeats: usize,
    /// Seed of the N(0,1) input.
    pub seed: u64,
}

impl Default for CodecBenchArgs {
    /// 2^24 values, every codec, all available cores, best of 5, seed 0.
    fn default() -> Self {
        CodecBenchArgs {
            elements: 1 << 24,
            codecs: CodecKind::ALL.to_vec(),
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            repeats: 5,
            seed: 0,
        }
    }
}

/// The figures of one run (serialised as the `--json` output).
#[derive(Clone, Debug, Serialize)]
pub struct CodecBenchReport {
    /// Values in the buffer.
    pub elements: usize,
    /// Bytes of the f32 input (4 per value): the numerator of every GB/s figure.
    pub input_bytes: usize,
    /// Threads of the multi-threaded figures (1: none measured).
    pub threads: usize,
    /// Timed runs per figure.
    pub repeats: usize,
    /// Seed of the input.
    pub seed: u64,
    /// Single-core memcpy of the input, GB/s.
    pub memcpy_gbps: f64,
    /// The same memcpy split into `threads` segments on `threads` threads, GB/s.
    pub memcpy_threaded_gbps: Option<f64>,
    /// One row per codec, in the order asked for.
    pub codecs: Vec<CodecFigures>,
}

/// Figures of one codec.
#[derive(Clone, Debug, Serialize)]
pub struct CodecFigures {
    /// The codec.
    pub codec: CodecKind,
    /// Encoded bytes per value for the whole buffer in one call.
    pub bytes_per_value: f64,
    /// sqrt(sum (x - decode(encode(x)))^2 / sum x^2) over the buffer.
    pub rel_rms_error: f64,
    /// Single-threaded encode, GB/s of f32 input.
    pub encode_gbps: f64,
    /// Single-threaded decode_accumulate, GB/s of f32 output.
    pub decode_acc_gbps: f64,
    /// Single-threaded `check` of the encoding (what a ring runs on every body it receives
    /// before decoding it), GB/s of the f32 values it holds.
    pub check_gbps: f64,
    /// `encode_gbps / memcpy_gbps`.
    pub encode_vs_memcpy: f64,
    /// `decode_acc_gbps / memcpy_gbps`.
    pub decode_acc_vs_memcpy: f64,
    /// Multi-threaded figures, when `threads > 1`.
    pub threaded: Option<ThreadedFigures>,
}

impl CodecFigures {
    /// Seconds per value of one thread's encode and of its check and decode-accumulate (a ring
    /// checks every body it receives before decoding it): the figures for a scenario's
    /// `[sim] encode_cost` and `decode_cost` (4 bytes of f32 a value).
    pub fn seconds_per_value(&self) -> (f64, f64) {
        let per_value = |gbps: f64| 4.0 / (gbps * 1e9);
        (per_value(self.encode_gbps), per_value(self.decode_acc_gbps) + per_value(self.check_gbps))
    }
}

/// Multi-threaded figures of one codec: `threads` contiguous segments coded independently.
#[derive(Clone, Debug, Serialize)]
pub struct ThreadedFigures {
    /// Encode, GB/s of f32 input.
    pub encode_gbps: f64,
    /// decode_accumulate, GB/s of f32 output.
    pub decode_acc_gbps: f64,
    /// Threaded over single-threaded encode throughput.
    pub encode_speedup: f64,
    /// Threaded over single-threaded decode_accumulate throughput.
    pub decode_acc_speedup: f64,
    /// Threaded encode over threaded memcpy.
    pub encode_vs_memcpy: f64,
    /// Threaded decode_accumulate over threaded memcpy.
    pub decode_acc_vs_memcpy: f64,
}

/// Best wall time, in seconds, of `repeats` runs of `f`, after one untimed warm-up run.
#[allow(clippy::disallowed_methods)] // benchmarks measure wall time; nothing decides on it
fn best_seconds(repeats: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut best = f64::INFINITY;
    for _ in 0..repeats {
        let start = std::time::Instant::now();
        f();
        best = best.min(start.elapsed().as_secs_f64());
    }
    // A clock too coarse for a tiny buffer must not give an infinite throughput.
    best.max(1e-9)
}

fn gbps(bytes: usize, seconds: f64) -> f64 {
    bytes as f64 / seconds / 1e9
}

/// Splits `buf` into consecutive mutable pieces of the given lengths.
fn split_lengths<'a, T>(mut buf: &'a mut [T], lengths: &[usize]) -> Vec<&'a mut [T]> {
    let mut parts = Vec::with_capacity(lengths.len());
    for &len in lengths {
        let (head, tail) = std::mem::take(&mut buf).split_at_mut(len);
        parts.push(head);
        buf = tail;
    }
    parts
}

/// Splits `buf` into consecutive pieces of the given lengths.
fn split_lengths_ref<'a, T>(mut buf: &'a [T], lengths: &[usize]) -> Vec<&'a [T]> {
    let mut parts = Vec::with_capacity(lengths.len());
    for &len in lengths {
        let (head, tail) = buf.split_at(len);
        parts.push(head);
        buf = tail;
    }
    parts
}

fn rel_rms_error(x: &[f32], y: &[f32]) -> f64 {
    let (mut err, mut norm) = (0.0f64, 0.0f64);
    for (a, b) in x.iter().zip(y) {
        err += (f64::from(*a) - f64::from(*b)).powi(2);
        norm += f64::from(*a).powi(2);
    }
    if norm > 0.0 { (err / norm).sqrt() } else { 0.0 }
}

/// Runs the benchmark.
pub fn run(args: &CodecBenchArgs) -> Result<CodecBenchReport> {
    ensure!(args.elements >= 1, "elements: expected at least 1, got {}", args.elements);
    ensure!(args.threads >= 1, "threads: expected at least 1, got {}", args.threads);
    ensure!(args.repeats >= 1, "repeats: expected at least 1, got {}", args.repeats);
    let n = args.elements;
    let input_bytes = 4 * n;

    let mut rng = ChaCha8Rng::seed_from_u64(args.seed);
    let src: Vec<f32> = (0..n).map(|_| rng.sample::<f32, _>(StandardNormal)).collect();
    let mut out = vec![0.0f32; n];

    let memcpy_s = best_seconds(args.repeats, || {
        out.copy_from_slice(&src);
        black_box(&mut out);
    });
    let memcpy_gbps = gbps(input_bytes, memcpy_s);

    // The threaded set-up: a dedicated pool, and the segments each thread codes.
    let threaded = if args.threads > 1 {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(args.threads)
            .thread_name(|i| format!("bench-codec-{i}"))
            .build()
            .context("building the benchmark's thread pool")?;
        let seg = n.div_ceil(args.threads);
        let seg_lens: Vec<usize> = src.chunks(seg).map(<[f32]>::len).collect();
        let secs = best_seconds(args.repeats, || {
            pool.install(|| {
                out.par_chunks_mut(seg).zip(src.par_chunks(seg)).for_each(|(d, s)| {
                    d.copy_from_slice(s);
                });
            });
            black_box(&mut out);
        });
        Some((pool, seg, seg_lens, gbps(input_bytes, secs)))
    } else {
        None
    };

    let mut rows = Vec::with_capacity(args.codecs.len());
    for &kind in &args.codecs {
        let codec = kind.codec();
        let mut encoded = vec![0u8; codec.encoded_len(n)];
        let enc_s = best_seconds(args.repeats, || {
            codec.encode(&src, &mut encoded);
            black_box(&mut encoded);
        });
        codec.decode(&encoded, &mut out);
        let rel_rms_error = rel_rms_error(&src, &out);
        let dec_s = best_seconds(args.repeats, || {
            codec.decode_accumulate(&encoded, &mut out);
            black_box(&mut out);
        });
        let check_s = best_seconds(args.repeats, || {
            black_box(codec.check(black_box(&encoded)).is_ok());
        });
        let encode_gbps = gbps(input_bytes, enc_s);
        let decode_acc_gbps = gbps(input_bytes, dec_s);

        let threaded = match &threaded {
            None => None,
            Some((pool, seg, seg_lens, memcpy_t)) => {
                let enc_lens: Vec<usize> = seg_lens.iter().map(|&l| codec.encoded_len(l)).collect();
                let mut encoded = vec![0u8; enc_lens.iter().sum()];
                let enc_s = best_seconds(args.repeats, || {
                    let parts = split_lengths(&mut encoded, &enc_lens);
                    pool.install(|| {
                        parts.into_par_iter().zip(src.par_chunks(*seg)).for_each(|(d, s)| {
                            codec.encode(s, d);
                        });
                    });
                    black_box(&mut encoded);
                });
                let dec_s = best_seconds(args.repeats, || {
                    let parts = split_lengths_ref(&encoded, &enc_lens);
                    pool.install(|| {
                        parts.into_par_iter().zip(out.par_chunks_mut(*seg)).for_each(|(s, d)| {
                            codec.decode_accumulate(s, d);
                        });
                    });
                    black_box(&mut out);
                });
                let (e, d) = (gbps(input_bytes, enc_s), gbps(input_bytes, dec_s));
                Some(ThreadedFigures {
                    encode_gbps: e,
                    decode_acc_gbps: d,
                    encode_speedup: e / encode_gbps,
                    decode_acc_speedup: d / decode_acc_gbps,
                    encode_vs_memcpy: e / memcpy_t,
                    decode_acc_vs_memcpy: d / memcpy_t,
                })
            }
        };

        rows.push(CodecFigures {
            codec: kind,
            bytes_per_value: codec.encoded_len(n) as f64 / n as f64,
            rel_rms_error,
            encode_gbps,
            decode_acc_gbps,
            check_gbps: gbps(input_bytes, check_s),
            encode_vs_memcpy: encode_gbps / memcpy_gbps,
            decode_acc_vs_memcpy: decode_acc_gbps / memcpy_gbps,
            threaded,
        });
    }

    Ok(CodecBenchReport {
        elements: n,
        input_bytes,
        threads: args.threads,
        repeats: args.repeats,
        seed: args.seed,
        memcpy_gbps,
        memcpy_threaded_gbps: threaded.as_ref().map(|t| t.3),
        codecs: rows,
    })
}

impl CodecBenchReport {
    /// Writes the report as a human-readable table.
    pub fn print_table(&self, out: &mut impl Write) -> std::io::Result<()> {
        writeln!(
            out,
            "codec benchmark: {} values ({:.1} MiB of f32, N(0,1), seed {}), best of {}",
            self.elements,
            self.input_bytes as f64 / (1 << 20) as f64,
            self.seed,
            self.repeats
        )?;
        writeln!(out, "throughput in GB/s of f32 data (4 bytes per value); (x) = ratio to memcpy")?;
        write!(out, "memcpy: 1 thread {:.2} GB/s", self.memcpy_gbps)?;
        if let Some(t) = self.memcpy_threaded_gbps {
            write!(out, ", {} threads {:.2} GB/s", self.threads, t)?;
        }
        writeln!(out)?;
        writeln!(out)?;
        write!(
            out,
            "{:<11} {:>8} {:>10} {:>16} {:>16} {:>9}",
            "codec", "B/value", "rel RMS", "encode", "decode-acc", "check"
        )?;
        if self.memcpy_threaded_gbps.is_some() {
            let t = self.threads;
            write!(
                out,
                " {:>23} {:>23}",
                format!("encode {t} thr"),
                format!("decode-acc {t} thr")
            )?;
        }
        writeln!(out)?;
        for r in &self.codecs {
            write!(
                out,
                "{:<11} {:>8.3} {:>10.2e} {:>8.2} ({:>4.2}x) {:>8.2} ({:>4.2}x) {:>9.2}",
                r.codec.name(),
                r.bytes_per_value,
                r.rel_rms_error,
                r.encode_gbps,
                r.encode_vs_memcpy,
                r.decode_acc_gbps,
                r.decode_acc_vs_memcpy,
                r.check_gbps
            )?;
            if let Some(t) = &r.threaded {
                write!(
                    out,
                    " {:>8.2} ({:>4.2}x) {:>4.1}x {:>8.2} ({:>4.2}x) {:>4.1}x",
                    t.encode_gbps,
                    t.encode_vs_memcpy,
                    t.encode_speedup,
                    t.decode_acc_gbps,
                    t.decode_acc_vs_memcpy,
                    t.decode_acc_speedup
                )?;
            }
            writeln!(out)?;
        }
        if self.memcpy_threaded_gbps.is_some() {
            writeln!(
                out,
                "threaded columns: (x) = ratio to the {}-thread memcpy, then speed-up over 1 thread",
                self.threads
            )?;
        }
        writeln!(out)?;
        writeln!(
            out,
            "seconds per value on one thread (decode_cost: check and decode-accumulate), for the \
             scenario's [sim] section:"
        )?;
        for r in &self.codecs {
            let (e, d) = r.seconds_per_value();
            writeln!(out, "{:<11} encode_cost = {e:.2e}   decode_cost = {d:.2e}", r.codec.name())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_run_reports_sane_figures() {
        let args = CodecBenchArgs {
            elements: 4096 + 3,
            codecs: CodecKind::ALL.to_vec(),
            threads: 2,
            repeats: 1,
            seed: 7,
        };
        let report = run(&args).unwrap();
        assert_eq!(report.elements, 4099);
        assert_eq!(report.input_bytes, 4 * 4099);
        assert!(report.memcpy_gbps.is_finite() && report.memcpy_gbps > 0.0);
        assert!(report.memcpy_threaded_gbps.is_some_and(|g| g.is_finite() && g > 0.0));
        assert_eq!(report.codecs.iter().map(|r| r.codec).collect::<Vec<_>>(), args.codecs);
        for r in &report.codecs {
            let t = r.threaded.as_ref().unwrap();
            for g in [r.encode_gbps, r.decode_acc_gbps, t.encode_gbps, t.decode_acc_gbps] {
                assert!(g.is_finite() && g > 0.0, "{}: {g}", r.codec);
            }
            let expect = r.codec.codec().encoded_len(4099) as f64 / 4099.0;
            assert_eq!(r.bytes_per_value, expect);
            let (lo, hi) = match r.codec {
                CodecKind::Fp32 => (0.0, 0.0),
                CodecKind::Fp16 => (5e-5, 5e-4),
                CodecKind::Bf16 => (5e-4, 5e-3),
                CodecKind::Uint8 => (0.01, 0.03),
                CodecKind::Int8Block => (0.002, 0.015),
                CodecKind::Int4Block => (0.07, 0.18),
                // 1% of the values kept: most of a Gaussian's energy is dropped (error
                // feedback keeps it for later).
                CodecKind::Sparse(_) => (0.8, 1.0),
            };
            assert!((lo..=hi).contains(&r.rel_rms_error), "{}: {}", r.codec, r.rel_rms_error);
        }

        let mut table = Vec::new();
        report.print_table(&mut table).unwrap();
        let table = String::from_utf8(table).unwrap();
        for kind in CodecKind::ALL {
            assert!(table.lines().any(|l| l.starts_with(kind.name())), "{table}");
        }
        assert!(table.contains("2 threads"), "{table}");
        // The simulator's terms: 4 bytes of f32 a value at the measured speed, the decode's
        // with the check a ring makes before it.
        for r in &report.codecs {
            let (e, d) = r.seconds_per_value();
            assert!((e * r.encode_gbps * 1e9 - 4.0).abs() < 1e-9, "{}", r.codec);
            let check = 4.0 / (r.check_gbps * 1e9);
            assert!(check > 0.0 && check < d, "{}", r.codec);
            assert!(((d - check) * r.decode_acc_gbps * 1e9 - 4.0).abs() < 1e-6, "{}", r.codec);
            let line = format!("{:<11} encode_cost = {e:.2e}", r.codec.name());
            assert!(table.contains(&line), "{table}");
        }

        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["codecs"][4]["codec"], "int8-block");
        assert_eq!(json["codecs"][5]["codec"], "int4-block");
        assert!(json["codecs"][0]["threaded"]["encode_gbps"].as_f64().unwrap() > 0.0);
    }

    #[test]
    fn single_thread_run_has_no_threaded_figures() {
        let args = CodecBenchArgs {
            elements: 1,
            codecs: vec![CodecKind::Uint8],
            threads: 1,
            repeats: 1,
            seed: 0,
        };
        let report = run(&args).unwrap();
        assert!(report.memcpy_threaded_gbps.is_none());
        assert!(report.codecs[0].threaded.is_none());
        // One value decodes exactly.
        assert_eq!(report.codecs[0].rel_rms_error, 0.0);
    }

    #[test]
    fn bad_arguments_are_rejected_with_the_field_name() {
        let base = CodecBenchArgs { elements: 10, repeats: 1, threads: 1, ..Default::default() };
        for (args, field) in [
            (CodecBenchArgs { elements: 0, ..base.clone() }, "elements"),
            (CodecBenchArgs { threads: 0, ..base.clone() }, "threads"),
            (CodecBenchArgs { repeats: 0, ..base.clone() }, "repeats"),
        ] {
            let err = run(&args).unwrap_err().to_string();
            assert!(err.starts_with(field), "{err}");
        }
    }
}
