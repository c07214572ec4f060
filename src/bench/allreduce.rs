//! `loco bench allreduce`: one ring all-reduce of W ranks over the in-memory transport.

use anyhow::{Result, bail};
use loco_core::allreduce::{RingConfig, run_ring, run_ring_stashed};
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
    /// Timed all-reduces (tcp backend).
    pub(crate) repeat: usize,
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
    /// Each timed repetition's time (its slowest rank), in order; `seconds` is the least.
    pub(crate) repetitions: Vec<f64>,
    /// CPU time of one rank's all-reduce (user and system, all its threads; the median over
    /// repetitions of the mean over ranks); tcp backend only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cpu_seconds_per_rank: Option<f64>,
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
            let mut rng =
                ChaCha8Rng::seed_from_u64(args.seed.wrapping_mul(1000).wrapping_add(r as u64));
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
    let ring_formula_bytes =
        2.0 * (args.world as f64 - 1.0) / args.world as f64 * args.elements as f64 * per_value;
    let (num, den) = data[0]
        .iter()
        .zip(&exact)
        .fold((0.0, 0.0), |(n, d), (g, w)| (n + (f64::from(*g) - w).powi(2), d + w * w));
    let rel_rms_error = if den > 0.0 { (num / den).sqrt() } else { num.sqrt() };
    let replicas_identical =
        data.iter().all(|d| d.iter().zip(&data[0]).all(|(a, b)| a.to_bits() == b.to_bits()));
    Ok(AllreduceBenchReport {
        backend: "memory",
        codec: args.codec.to_string(),
        world: args.world,
        elements: args.elements,
        segment_elems: args.segment,
        seconds,
        repetitions: vec![seconds],
        cpu_seconds_per_rank: None,
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
        if let Some(c) = self.cpu_seconds_per_rank {
            writeln!(out, "  CPU per rank         {c:.4} s (user + system)")?;
        }
        if self.repetitions.len() > 1 {
            let mut sorted = self.repetitions.clone();
            sorted.sort_by(f64::total_cmp);
            writeln!(
                out,
                "  time                 {:.4} s best, {:.4} s median of {} repetitions",
                self.seconds,
                sorted[sorted.len() / 2],
                sorted.len()
            )?;
        } else {
            writeln!(out, "  time                 {:.4} s", self.seconds)?;
        }
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
            let r = run(&AllreduceBenchArgs {
                world: 3,
                elements: 30_000,
                codec,
                segment: 4096,
                seed: 1,
                repeat: 1,
            })
            .unwrap();
            assert!(r.replicas_identical);
            assert!(r.seconds > 0.0);
            let limit = if codec == CodecKind::Fp32 { 1e-6 } else { 0.03 };
            assert!(r.rel_rms_error < limit, "{codec}: {}", r.rel_rms_error);
            // Exactly the schedule's bytes: the ring formula plus one 1 KiB table per uint8
            // segment.
            let planned = (0..3)
                .map(|rank| {
                    loco_core::allreduce::schedule::bytes_sent_per_rank(
                        30_000,
                        3,
                        rank,
                        4096,
                        |k| codec.codec().encoded_len(k),
                    )
                })
                .max()
                .unwrap();
            assert_eq!(r.bytes_sent_per_rank, planned, "{codec}");
            assert!(r.bytes_sent_per_rank as f64 >= r.ring_formula_bytes, "{codec}");
        }
    }

    #[test]
    fn rank_takes_ports_or_addrs_but_not_both() {
        use clap::Parser;
        let parse = |extra: &[&str]| {
            let mut argv = vec!["loco", "bench", "allreduce-rank", "--rank", "1"];
            argv.extend_from_slice(extra);
            argv.extend_from_slice(&["--elements", "8", "--codec", "fp32", "--segment", "4"]);
            argv.extend_from_slice(&["--streams", "1", "--seed", "0"]);
            let cli = crate::cli::Cli::try_parse_from(argv).expect("parses");
            match cli.command {
                crate::cli::Command::Bench(crate::cli::BenchCommand::AllreduceRank(a)) => {
                    rank_addrs(&a)
                }
                other => panic!("parsed as {other:?}"),
            }
        };
        let ports = parse(&["--ports", "5000,5001"]).unwrap();
        assert_eq!(ports[1], "127.0.0.1:5001".parse().unwrap());
        let addrs = parse(&["--addrs", "198.18.0.2:7000,198.18.0.3:7000"]).unwrap();
        assert_eq!(
            addrs,
            vec!["198.18.0.2:7000".parse().unwrap(), "198.18.0.3:7000".parse().unwrap()]
        );
        let both = parse(&["--ports", "5000,5001", "--addrs", "198.18.0.2:7000,198.18.0.3:7000"]);
        assert!(both.unwrap_err().to_string().contains("not both"));
        assert!(parse(&[]).unwrap_err().to_string().contains("--addrs"));
        assert!(
            parse(&["--addrs", "198.18.0.2:7000"])
                .unwrap_err()
                .to_string()
                .contains("out of range")
        );
        assert!(parse(&["--addrs", "198.18.0.2:7000,198.18.0.2:7000"]).is_err());
    }
}

/// What one rank of the TCP benchmark prints (one JSON line on stdout).
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub(crate) struct RankResult {
    pub(crate) rank: usize,
    /// This rank's time of each timed repetition.
    pub(crate) seconds: Vec<f64>,
    /// The process's CPU time (user and system, all threads) of each timed repetition.
    pub(crate) cpu_seconds: Vec<f64>,
    /// Body bytes sent in one repetition.
    pub(crate) body_bytes_sent: u64,
    /// Hash of the result's bits, to compare replicas across processes.
    pub(crate) result_hash: loco_core::digest::WeightsDigest,
    /// Rank 0 only: relative RMS error against the exact average.
    pub(crate) rel_rms_error: Option<f64>,
    /// Peak resident memory of the process, bytes.
    pub(crate) peak_rss_bytes: Option<u64>,
}

fn rank_input(seed: u64, rank: usize, n: usize) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed.wrapping_mul(1000).wrapping_add(rank as u64));
    (0..n)
        .map(|_| {
            let v: f64 = StandardNormal.sample(&mut rng);
            10.0 * v as f32
        })
        .collect()
}

/// This process's CPU time so far (user and system, every thread), in seconds.
pub(crate) fn cpu_seconds() -> f64 {
    use nix::sys::resource::{UsageWho, getrusage};
    getrusage(UsageWho::RUSAGE_SELF).map_or(0.0, |u| {
        let t = |v: nix::sys::time::TimeVal| v.tv_sec() as f64 + v.tv_usec() as f64 * 1e-6;
        t(u.user_time()) + t(u.system_time())
    })
}

/// Every rank's listen address, in rank order: `--ports` on 127.0.0.1 or `--addrs`, exactly one
/// of the two, and `rank` one of them.
fn rank_addrs(a: &crate::cli::AllreduceRank) -> Result<Vec<std::net::SocketAddr>> {
    let addrs: Vec<std::net::SocketAddr> = match (a.ports.is_empty(), a.addrs.is_empty()) {
        (false, true) => {
            a.ports.iter().map(|&p| std::net::SocketAddr::from(([127, 0, 0, 1], p))).collect()
        }
        (true, false) => a.addrs.clone(),
        (false, false) => bail!("give either --ports or --addrs, not both"),
        (true, true) => bail!(
            "give every rank's listen address: --addrs IP:PORT,IP:PORT,... (or --ports \
             PORT,PORT,... on 127.0.0.1)"
        ),
    };
    if a.rank >= addrs.len() {
        bail!("--rank {} out of range for {} ranks", a.rank, addrs.len());
    }
    if let Some(i) = (1..addrs.len()).find(|&i| addrs[..i].contains(&addrs[i])) {
        bail!("rank {i}'s address {} is also an earlier rank's", addrs[i]);
    }
    Ok(addrs)
}

/// Runs one rank: listen on its address, connect to the others, a small warm-up all-reduce
/// (which also lines the ranks up), then the timed one.
pub(crate) fn run_rank(a: &crate::cli::AllreduceRank) -> Result<RankResult> {
    use loco_real::tcp::{TcpConfig, TcpTransport};
    let addrs = rank_addrs(a)?;
    let world = addrs.len();
    // The runtime a real worker runs on: the connections' reader and writer tasks go on while
    // the ring reduces, as they do in training.
    let rt = crate::real_cmd::runtime()?;
    let input = rank_input(a.seed, a.rank, a.elements);
    let mut data = input.clone();
    rt.block_on(async {
        let cfg = TcpConfig {
            streams: a.streams.max(1),
            secret: a.secret.as_ref().map(|k| k.as_bytes().to_vec()),
            ..TcpConfig::default()
        };
        let me = NodeId(a.rank as u32);
        let mut t = TcpTransport::bind(me, addrs[a.rank], cfg).await?;
        let ring: Vec<NodeId> = (0..world as u32).map(NodeId).collect();
        for (i, &addr) in addrs.iter().enumerate() {
            t.set_peer_addr(NodeId(i as u32), addr);
        }
        let right = ring[(a.rank + 1) % world];
        t.connect_within(right, std::time::Duration::from_secs(30)).await?;
        // Frames of a collective may arrive before this rank finished the one before.
        let mut stash = Vec::new();
        let mut seconds = Vec::with_capacity(a.repeat);
        let mut cpu = Vec::with_capacity(a.repeat);
        let mut stats = None;
        for rep in 0..a.repeat.max(1) as u64 {
            // The inputs first (a pass over the whole buffer, which must not overlap another
            // rank's timed all-reduce), then a small all-reduce: a barrier (and, the first time,
            // the connections' warm-up); then the timed one, of the same inputs every time.
            data.copy_from_slice(&input);
            let mut warm = vec![1.0f32; world * 16];
            let warm_len = warm.len();
            let cfg0 = RingConfig::new(Epoch(1), 2 * rep, ring.clone(), me, a.codec);
            run_ring_stashed(&mut t, cfg0, Some(&mut warm), warm_len, Weight::ONE, &mut stash)
                .await?;
            let mut cfg1 = RingConfig::new(Epoch(1), 2 * rep + 1, ring.clone(), me, a.codec);
            cfg1.segment_elems = a.segment.max(1);
            let started = crate::clock::now();
            let cpu0 = cpu_seconds();
            let s = run_ring_stashed(
                &mut t,
                cfg1,
                Some(&mut data),
                a.elements,
                Weight::ONE,
                &mut stash,
            )
            .await?;
            seconds.push(crate::clock::now().duration_since(started).as_secs_f64());
            cpu.push(cpu_seconds() - cpu0);
            stats = Some(s);
        }
        // Let the last frames drain before the process exits.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        anyhow::Ok((seconds, cpu, stats.expect("at least one repetition")))
    })
    .map(|(seconds, cpu, stats)| {
        let mut h = blake3::Hasher::new();
        for v in &data {
            h.update(&v.to_bits().to_le_bytes());
        }
        let rel_rms_error = (a.rank == 0).then(|| {
            let inputs: Vec<Vec<f32>> =
                (0..world).map(|r| rank_input(a.seed, r, a.elements)).collect();
            let (mut num, mut den) = (0.0f64, 0.0f64);
            for (i, g) in data.iter().enumerate() {
                let w = inputs.iter().map(|x| f64::from(x[i])).sum::<f64>() / world as f64;
                num += (f64::from(*g) - w).powi(2);
                den += w * w;
            }
            (num / den.max(f64::MIN_POSITIVE)).sqrt()
        });
        RankResult {
            rank: a.rank,
            seconds,
            cpu_seconds: cpu,
            body_bytes_sent: stats.body_bytes_sent,
            result_hash: loco_core::digest::WeightsDigest::from_blake3(&h.finalize()),
            rel_rms_error,
            peak_rss_bytes: loco_real::node::peak_rss_bytes(),
        }
    })
}

/// Runs the TCP benchmark: one child process per rank on loopback.
pub(crate) fn run_tcp(
    args: &AllreduceBenchArgs,
    streams: usize,
    secure: bool,
) -> Result<AllreduceBenchReport> {
    if args.world == 0 {
        bail!("--world: expected at least 1 rank");
    }
    let ports = super::free_loopback_ports(args.world)?;
    let ports_arg = ports.iter().map(u16::to_string).collect::<Vec<_>>().join(",");
    let exe = std::env::current_exe()?;
    let secret = secure.then(super::fresh_secret);
    let children: Vec<std::process::Child> = (0..args.world)
        .map(|r| {
            std::process::Command::new(&exe)
                .args(["bench", "allreduce-rank", "--rank", &r.to_string(), "--ports", &ports_arg])
                .args(secret.as_ref().map(|k| ["--secret", k.as_str()]).into_iter().flatten())
                .args(["--elements", &args.elements.to_string(), "--codec", args.codec.name()])
                .args(["--segment", &args.segment.to_string(), "--streams", &streams.to_string()])
                .args(["--repeat", &args.repeat.max(1).to_string()])
                .args(["--seed", &args.seed.to_string()])
                .stdout(std::process::Stdio::piped())
                .spawn()
        })
        .collect::<Result<_, _>>()?;
    let mut results = Vec::new();
    for (r, c) in children.into_iter().enumerate() {
        let out = c.wait_with_output()?;
        if !out.status.success() {
            bail!("rank {r} failed ({})", out.status);
        }
        let line = String::from_utf8_lossy(&out.stdout);
        let res: RankResult = serde_json::from_str(line.trim())
            .map_err(|e| anyhow::anyhow!("rank {r} printed no result: {e}"))?;
        results.push(res);
    }
    // A repetition takes as long as its slowest rank.
    let repetitions: Vec<f64> = (0..args.repeat.max(1))
        .map(|i| {
            results.iter().map(|r| r.seconds.get(i).copied().unwrap_or(0.0)).fold(0.0, f64::max)
        })
        .collect();
    let seconds = repetitions.iter().copied().fold(f64::INFINITY, f64::min);
    let mut cpu: Vec<f64> = (0..args.repeat.max(1))
        .map(|i| {
            results.iter().map(|r| r.cpu_seconds.get(i).copied().unwrap_or(0.0)).sum::<f64>()
                / results.len().max(1) as f64
        })
        .collect();
    cpu.sort_by(f64::total_cmp);
    let per_value = args.codec.codec().encoded_len(1 << 20) as f64 / f64::from(1 << 20);
    Ok(AllreduceBenchReport {
        backend: if secure { "tcp+noise" } else { "tcp" },
        codec: args.codec.to_string(),
        world: args.world,
        elements: args.elements,
        segment_elems: args.segment,
        seconds,
        repetitions,
        cpu_seconds_per_rank: cpu.get(cpu.len() / 2).copied(),
        bytes_sent_per_rank: results.iter().map(|r| r.body_bytes_sent).max().unwrap_or(0),
        ring_formula_bytes: 2.0 * (args.world as f64 - 1.0) / args.world as f64
            * args.elements as f64
            * per_value,
        rel_rms_error: results[0].rel_rms_error.unwrap_or(f64::NAN),
        replicas_identical: results.iter().all(|r| r.result_hash == results[0].result_hash),
        algbw_gbytes_per_s: (args.world * args.elements * 4) as f64 / seconds.max(1e-12) / 1e9,
    })
}
