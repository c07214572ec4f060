//! `loco bench allreduce`: one ring all-reduce of W ranks over the in-memory transport.

use anyhow::{Result, bail};
use loco_core::allreduce::{RingConfig, run_ring};
use loco_core::codec::CodecKind;
use loco_core::ids::{Epoch, NodeId, Weight};
use loco_core::transport::memory::network;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use serde::Serialize;
use std::io::Write;

/// What to measure.
#[derive(Clone, Debug)]
pub(crate) struct AllreduceBenchArgs {
    pub(crate) world: usize,
    pub(crate) elements: usize,
    pub(crate) codec: CodecKind,
    pub(crate) segment: usize,
    pub(crate) seed: u64,
}

/// The figures of one run (the JSON of `--json`).
#[derive(Clone, Debug, Serialize)]
pub(crate) struct AllreduceBenchReport {
    pub(crate) backend: &'static str,
    pub(crate) codec: String,
    pub(crate) world: usize,
    pub(crate) elements: usize,
    pub(crate) segment_elems: usize,
    pub(crate) seconds: f64,
    /// Body bytes sent by each rank (the maximum over ranks).
    pub(crate) bytes_sent_per_rank: u64,
    /// The ring's theoretical 2(W-1)/W x payload in this codec's bytes per value, tables aside.
    pub(crate) ring_formula_bytes: f64,
    /// Relative RMS error of rank 0's result against the exact average computed in f64.
    pub(crate) rel_rms_error: f64,
    /// True when every rank's result is bit-identical to rank 0's.
    pub(crate) replicas_identical: bool,
    /// Payload throughput: W x elements x 4 bytes / seconds.
    pub(crate) algbw_gbytes_per_s: f64,
}

/// Runs the benchmark.
pub(crate) fn run(args: &AllreduceBenchArgs) -> Result<AllreduceBenchReport> {
    if args.world == 0 {
        bail!("--world: expected at least 1 rank");
    }
    if args.segment == 0 {
        bail!("--segment: expected at least 1 value");
    }
    let ring: Vec<NodeId> = (0..args.world as u32).map(NodeId).collect();
    let inputs: Vec<Vec<f32>> = (0..args.world)
        .map(|r| {
            let mut rng = ChaCha8Rng::seed_from_u64(args.seed.wrapping_mul(1000).wrapping_add(r as u64));
            (0..args.elements)
                .map(|_| {
                    let v: f64 = StandardNormal.sample(&mut rng);
                    10.0 * v as f32
                })
                .collect()
        })
        .collect();
    let exact: Vec<f64> = (0..args.elements)
        .map(|i| inputs.iter().map(|x| f64::from(x[i])).sum::<f64>() / args.world as f64)
        .collect();
    let mut data = inputs;
    let mut endpoints = network(&ring);
    let started = crate::clock::now();
    let stats = futures::executor::block_on(async {
        let runs = endpoints.iter_mut().zip(data.iter_mut()).zip(&ring).map(|((t, d), &me)| {
            let mut cfg = RingConfig::new(Epoch(1), 0, ring.clone(), me, args.codec);
            cfg.segment_elems = args.segment;
            run_ring(t, cfg, Some(d.as_mut_slice()), args.elements, Weight::ONE)
        });
        futures::future::join_all(runs).await
    });
    let seconds = crate::clock::now().duration_since(started).as_secs_f64();
    let stats = stats.into_iter().collect::<Result<Vec<_>, _>>()?;
    let bytes_sent_per_rank = stats.iter().map(|s| s.body_bytes_sent).max().unwrap_or(0);
    let per_value = args.codec.codec().encoded_len(1 << 20) as f64 / f64::from(1 << 20);
    let ring_formula_bytes = 2.0 * (args.world as f64 - 1.0) / args.world as f64
        * args.elements as f64
        * per_value;
    let (num, den) = data[0].iter().zip(&exact).fold((0.0, 0.0), |(n, d), (g, w)| {
        (n + (f64::from(*g) - w).powi(2), d + w * w)
    });
    let rel_rms_error = if den > 0.0 { (num / den).sqrt() } else { num.sqrt() };
    let replicas_identical = data.iter().all(|d| {
        d.iter().zip(&data[0]).all(|(a, b)| a.to_bits() == b.to_bits())
    });
    Ok(AllreduceBenchReport {
        backend: "memory",
        codec: args.codec.to_string(),
        world: args.world,
        elements: args.elements,
        segment_elems: args.segment,
        seconds,
        bytes_sent_per_rank,
        ring_formula_bytes,
        rel_rms_error,
        replicas_identical,
        algbw_gbytes_per_s: (args.world * args.elements * 4) as f64 / seconds.max(1e-12) / 1e9,
    })
}

impl AllreduceBenchReport {
    /// Prints a short human-readable table.
    pub(crate) fn print_table(&self, out: &mut impl Write) -> std::io::Result<()> {
        writeln!(out, "ring all-reduce over {} transport", self.backend)?;
        writeln!(out, "  codec                {}", self.codec)?;
        writeln!(out, "  world x elements     {} x {}", self.world, self.elements)?;
        writeln!(out, "  segment              {} values", self.segment_elems)?;
        writeln!(out, "  time                 {:.4} s", self.seconds)?;
        writeln!(
            out,
            "  bytes sent per rank  {} ({:.4}x the ring formula 2(W-1)/W x payload = {:.0})",
            self.bytes_sent_per_rank,
            self.bytes_sent_per_rank as f64 / self.ring_formula_bytes.max(1.0),
            self.ring_formula_bytes
        )?;
        writeln!(out, "  rel. RMS error       {:.4}%", 100.0 * self.rel_rms_error)?;
        writeln!(out, "  replicas identical   {}", self.replicas_identical)?;
        writeln!(out, "  payload throughput   {:.3} GB/s", self.algbw_gbytes_per_s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_run_reports_sane_figures() {
        for codec in [CodecKind::Fp32, CodecKind::Uint8] {
            let r = run(&AllreduceBenchArgs { world: 3, elements: 30_000, codec, segment: 4096, seed: 1 })
                .unwrap();
            assert!(r.replicas_identical);
            assert!(r.seconds > 0.0);
            let limit = if codec == CodecKind::Fp32 { 1e-6 } else { 0.03 };
            assert!(r.rel_rms_error < limit, "{codec}: {}", r.rel_rms_error);
            let ratio = r.bytes_sent_per_rank as f64 / r.ring_formula_bytes;
            assert!((1.0..1.05).contains(&ratio), "{codec}: bytes ratio {ratio}");
        }
    }
}
