//! `loco bench recovery`: what live recovery costs on the real transport. K sender processes and
//! one joiner on loopback; each sender holds the same replicated state (outer weights and
//! momentum, 8 bytes per parameter) and, at the joiner's signal, prepares and sends its share as
//! a worker does (a snapshot of its outer state, `StateJob::prepare`, `PreparedState::frames`, the
//! TCP transport); the joiner
//! assembles the pieces and verifies the state (`StateAssembly`, `Received::verify`) as a worker
//! does. Reported: the time from the signal to the verified state, throughput, each process's
//! CPU time and peak memory against the state's size, and this machine's memcpy rate.

use super::allreduce::cpu_seconds;
use anyhow::{Context, Result, bail};
use bytes::Bytes;
use loco_core::diloco::{OuterConfig, OuterState};
use loco_core::mesh::MeshMsg;
use loco_core::node::machine::StateJob;
use loco_core::node::state::{Expect, PieceRule, SharedState, StateAssembly, share_of};
use loco_core::transport::{Body, Frame, Header, Transport};
use loco_core::{Epoch, NodeId};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::time::Duration;

/// The joiner's id; the senders are 1..=K.
const JOINER: NodeId = NodeId(100);

/// The benchmark's settings.
#[derive(Clone, Debug)]
pub(crate) struct RecoveryBenchArgs {
    /// Bytes of state (rounded down to whole parameters of 8 bytes).
    pub(crate) bytes: u64,
    /// Sender processes.
    pub(crate) senders: usize,
    /// Connections per sender for the state.
    pub(crate) streams: usize,
    /// Encrypt and authenticate the connections.
    pub(crate) secure: bool,
    /// Senders digest their snapshot after the signal, not ahead.
    pub(crate) cold: bool,
    /// Run in this scenario's emulated network (else on loopback).
    pub(crate) scenario: Option<loco_core::scenario::Scenario>,
}

/// What one process of the benchmark prints (one JSON line on stdout).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct NodeResult {
    /// "joiner" or "sender".
    pub(crate) role: String,
    /// Sender: encoding and digesting its state; joiner: 0.
    pub(crate) prepare_seconds: f64,
    /// Sender: from the signal to its last piece queued; joiner: to its last piece received.
    pub(crate) transfer_seconds: f64,
    /// Joiner: from the signal to the verified state; sender: to the joiner's word that it
    /// holds it.
    pub(crate) total_seconds: f64,
    /// CPU time (user and system, every thread) from the signal on.
    pub(crate) cpu_seconds: f64,
    /// Peak resident memory of the process.
    pub(crate) peak_rss_bytes: Option<u64>,
    /// Resident memory before the signal (the state it holds anyway, the runtime).
    pub(crate) base_rss_bytes: Option<u64>,
    /// Joiner: peak resident memory when the last piece had arrived, before verification.
    pub(crate) transfer_peak_rss_bytes: Option<u64>,
    /// State bytes this process sent or received.
    pub(crate) state_bytes: u64,
}

/// The benchmark's report.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct RecoveryBenchReport {
    /// State bytes (both parts).
    pub(crate) state_bytes: u64,
    /// Sender processes.
    pub(crate) senders: usize,
    /// Connections per sender.
    pub(crate) streams: usize,
    /// Whether the connections were encrypted.
    pub(crate) secure: bool,
    /// Whether the senders digested their snapshot after the signal (else ahead, as workers
    /// do after each outer step).
    pub(crate) cold: bool,
    /// "loopback", or the scenario whose emulated network the processes ran in.
    pub(crate) network: String,
    /// From the joiner's signal to its verified state.
    pub(crate) seconds: f64,
    /// `state_bytes / seconds`, GB/s (decimal).
    pub(crate) gbps: f64,
    /// A single-core memcpy of the same bytes (up to 512 MB) in this run, GB/s.
    pub(crate) memcpy_gbps: f64,
    /// `gbps / memcpy_gbps`.
    pub(crate) vs_memcpy: f64,
    /// Writing the same bytes (up to 512 MB) into memory freshly allocated, GB/s: the rate at
    /// which this machine hands a process new pages, which bounds a joiner writing the state
    /// into buffers it did not hold before.
    pub(crate) first_touch_gbps: f64,
    /// Emulated network: what the links give the connections from each sender to the joiner,
    /// summed, in payload GB/s (the wire's rate less TCP/IP headers).
    pub(crate) link_gbps: Option<f64>,
    /// `gbps / link_gbps`.
    pub(crate) vs_link: Option<f64>,
    /// On loopback with `--cold`, the terms for the simulator (`[sim] state_prepare_cost`):
    /// the slowest sender's preparation, seconds per byte of the state.
    pub(crate) sim_prepare_cost: Option<f64>,
    /// On loopback, `[sim] state_receive_cost`: the joiner's time from the signal to the
    /// verified state, seconds per byte.
    pub(crate) sim_receive_cost: Option<f64>,
    /// The joiner, then the senders.
    pub(crate) nodes: Vec<NodeResult>,
}

impl RecoveryBenchReport {
    /// The table `loco bench recovery` prints.
    pub(crate) fn print_table(&self, out: &mut impl Write) -> std::io::Result<()> {
        let mb = |b: u64| b as f64 / 1e6;
        writeln!(
            out,
            "live recovery of {:.0} MB from {} sender(s) x {} connection(s) on {}{}: {:.3} s, \
             {:.3} GB/s end to end, verified{}",
            mb(self.state_bytes),
            self.senders,
            self.streams,
            self.network,
            if self.secure { ", encrypted" } else { "" },
            self.seconds,
            self.gbps,
            if self.cold { " (senders digesting after the signal)" } else { "" },
        )?;
        if let (Some(link), Some(vs)) = (self.link_gbps, self.vs_link) {
            writeln!(out, "the links give {link:.3} GB/s of payload: {:.1}% of it", vs * 100.0)?;
        }
        writeln!(
            out,
            "this machine: single-core memcpy {:.2} GB/s ({:.2}x), first touch of new memory \
             {:.2} GB/s",
            self.memcpy_gbps, self.vs_memcpy, self.first_touch_gbps,
        )?;
        match (self.sim_prepare_cost, self.sim_receive_cost) {
            (Some(p), Some(r)) => writeln!(
                out,
                "for the simulator: [sim] state_prepare_cost = {p:.3e}, state_receive_cost = \
                 {r:.3e} (seconds per byte)"
            )?,
            (None, Some(r)) => writeln!(
                out,
                "for the simulator: [sim] state_receive_cost = {r:.3e} (seconds per byte; \
                 --cold measures state_prepare_cost)"
            )?,
            _ => {}
        }
        writeln!(
            out,
            "{:<8} {:>10} {:>10} {:>10} {:>9} {:>12} {:>14}",
            "process", "prepare s", "transfer s", "total s", "cpu s", "peak MB", "beyond base MB"
        )?;
        for n in &self.nodes {
            let beyond = match (n.peak_rss_bytes, n.base_rss_bytes) {
                (Some(p), Some(b)) => format!("{:.0}", mb(p.saturating_sub(b))),
                _ => "-".into(),
            };
            writeln!(
                out,
                "{:<8} {:>10.3} {:>10.3} {:>10.3} {:>9.3} {:>12} {:>14}",
                n.role,
                n.prepare_seconds,
                n.transfer_seconds,
                n.total_seconds,
                n.cpu_seconds,
                n.peak_rss_bytes.map_or("-".into(), |p| format!("{:.0}", mb(p))),
                beyond,
            )?;
        }
        Ok(())
    }
}

/// The state every sender holds: deterministic, so that the joiner can check what it verified.
fn state(params: usize) -> Result<SharedState> {
    let outer = (0..params).map(|i| (i % 1000) as f32 * 1e-3 - 0.5).collect();
    let momentum = (0..params).map(|i| -((i % 777) as f32) * 1e-4).collect();
    SharedState::new(7, outer, momentum).context("the benchmark's state")
}

fn signal(msg: MeshMsg) -> Frame {
    Frame { header: Header::Mesh(msg), body: Body::Bytes(Bytes::new()) }
}

fn tcp_config(secret: Option<&str>) -> loco_real::tcp::TcpConfig {
    loco_real::tcp::TcpConfig {
        secret: secret.map(|k| k.as_bytes().to_vec()),
        ..loco_real::tcp::TcpConfig::default()
    }
}

/// One process of the benchmark (`loco bench recovery-node`, started by [`run`]).
pub(crate) fn run_node(a: &crate::cli::RecoveryNode) -> Result<NodeResult> {
    let senders: Vec<NodeId> = (1..=a.senders as u32).map(NodeId).collect();
    if a.addrs.len() != senders.len() + 1 {
        bail!("--addrs: expected the joiner's address and {} senders'", senders.len());
    }
    let rt = crate::real_cmd::runtime()?;
    let cfg = loco_real::tcp::TcpConfig {
        congestion: a.congestion.clone(),
        state_streams: a.streams,
        ..tcp_config(a.secret.as_deref())
    };
    if a.index == 0 { run_joiner(a, &senders, cfg, &rt) } else { run_sender(a, &senders, cfg, &rt) }
}

/// The joiner's process of the benchmark: receives the senders' state and verifies it.
fn run_joiner(
    a: &crate::cli::RecoveryNode,
    senders: &[NodeId],
    cfg: loco_real::tcp::TcpConfig,
    rt: &tokio::runtime::Runtime,
) -> Result<NodeResult> {
    use loco_real::tcp::TcpTransport;
    let addr = |i: usize| a.addrs[i];
    // The joiner. It holds an outer state as a fresh worker does (its model's initial
    // weights, a momentum of zeros), whose buffers receive the state, as the node machine
    // lends them; and the senders' state, to check what it verified.
    let expected = state(a.params)?;
    let mut held = OuterState::new(OuterConfig::default(), vec![0.01f32; a.params], vec![])
        .context("the joiner's outer state")?;
    let base = loco_real::node::peak_rss_bytes();
    rt.block_on(async {
        let mut t = TcpTransport::bind(JOINER, addr(0), cfg).await?;
        for (i, &s) in senders.iter().enumerate() {
            t.set_peer_addr(s, addr(i + 1));
            t.connect_within(s, Duration::from_secs(60)).await?;
        }
        let mut assembly =
            StateAssembly::new(Epoch(1), senders.to_vec(), true, Expect::real(a.params, 0));
        let [outer, momentum] = held.take_buffers().context("the joiner's buffers")?;
        assembly.lend(outer, momentum);
        let (start, cpu0) = (crate::clock::now(), cpu_seconds());
        for &s in senders {
            t.send(
                s,
                signal(MeshMsg::Join {
                    incarnation: 0,
                    held: Some(loco_core::mesh::Held::default()),
                    finished: 0,
                }),
            )
            .await?;
        }
        let mut bytes = 0u64;
        let received = loop {
            let (from, f) = tokio::time::timeout(Duration::from_secs(600), t.recv())
                .await
                .context("no state piece for 10 minutes")??;
            let Header::State(h) = &f.header else { continue };
            bytes += f.body.len();
            let p = assembly
                .put(from, h, &f.body)
                .map_err(|r| anyhow::anyhow!("a piece from {from} was refused: {r}"))?;
            if p.is_complete() {
                break assembly.take_complete().context("complete, yet nothing to take")?;
            }
        };
        let transfer = start.elapsed().as_secs_f64();
        let transfer_peak = loco_real::node::peak_rss_bytes();
        let params = a.params;
        let verified = tokio::task::spawn_blocking(move || received.verify(params))
            .await?
            .map_err(|e| anyhow::anyhow!("the state did not verify: {e:?}"))?;
        let total = start.elapsed().as_secs_f64();
        let cpu = cpu_seconds() - cpu0;
        if verified.shared.as_ref() != Some(&expected) {
            bail!("the verified state is not the senders'");
        }
        for &s in senders {
            t.send(s, signal(MeshMsg::Shutdown)).await?;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        Ok(NodeResult {
            role: "joiner".into(),
            prepare_seconds: 0.0,
            transfer_seconds: transfer,
            total_seconds: total,
            cpu_seconds: cpu,
            peak_rss_bytes: loco_real::node::peak_rss_bytes(),
            base_rss_bytes: base,
            transfer_peak_rss_bytes: transfer_peak,
            state_bytes: bytes,
        })
    })
}

/// A sender's process of the benchmark: sends its share of the state when the joiner asks.
fn run_sender(
    a: &crate::cli::RecoveryNode,
    senders: &[NodeId],
    cfg: loco_real::tcp::TcpConfig,
    rt: &tokio::runtime::Runtime,
) -> Result<NodeResult> {
    use loco_real::tcp::TcpTransport;
    let addr = |i: usize| a.addrs[i];
    let me = senders.get(a.index - 1).copied().context("--index beyond the senders")?;
    // The outer state a worker holds; it sends a snapshot of it, taken as the node machine
    // takes one (shared buffers, no copy).
    let (steps, outer, momentum) = state(a.params)?.into_parts();
    let held = OuterState::restore(OuterConfig::default(), outer, momentum, vec![], steps)
        .context("the benchmark's outer state")?;
    let share = share_of(senders, me, true).context("a sender without a share")?;
    let job = |held: &OuterState| {
        let shared = SharedState::from_outer(held);
        StateJob::real(Epoch(1), JOINER, share, PieceRule::Clamped, shared)
    };
    // As a worker does after each outer step, in the background: the snapshot's pieces are
    // digested before any joiner comes (unless --cold).
    let ahead = if a.cold { None } else { job(&held).shared_digests() };
    let base = loco_real::node::peak_rss_bytes();
    rt.block_on(async {
        let mut t = TcpTransport::bind(me, addr(a.index), cfg).await?;
        t.set_peer_addr(JOINER, addr(0));
        let go =
            |f: &Frame, want: fn(&MeshMsg) -> bool| matches!(&f.header, Header::Mesh(m) if want(m));
        loop {
            let (_, f) = tokio::time::timeout(Duration::from_secs(120), t.recv())
                .await
                .context("no signal from the joiner")??;
            if go(&f, |m| matches!(m, MeshMsg::Join { .. })) {
                break;
            }
        }
        let (start, cpu0) = (crate::clock::now(), cpu_seconds());
        let job = match ahead {
            Some(d) => job(&held).with_known(d),
            None => job(&held),
        };
        let prepared = tokio::task::spawn_blocking(move || job.prepare(None)).await?;
        let prepare = start.elapsed().as_secs_f64();
        let mut bytes = 0u64;
        for f in prepared.frames() {
            bytes += f.body.len();
            t.send(JOINER, f).await?;
        }
        let transfer = start.elapsed().as_secs_f64();
        drop(prepared);
        loop {
            let (_, f) = tokio::time::timeout(Duration::from_secs(600), t.recv())
                .await
                .context("the joiner never said it holds the state")??;
            if go(&f, |m| matches!(m, MeshMsg::Shutdown)) {
                break;
            }
        }
        drop(held);
        Ok(NodeResult {
            role: "sender".into(),
            prepare_seconds: prepare,
            transfer_seconds: transfer,
            total_seconds: start.elapsed().as_secs_f64(),
            cpu_seconds: cpu_seconds() - cpu0,
            peak_rss_bytes: loco_real::node::peak_rss_bytes(),
            base_rss_bytes: base,
            transfer_peak_rss_bytes: None,
            state_bytes: bytes,
        })
    })
}

/// A single-core memcpy of `bytes` (up to 512 MB), best of three, GB/s.
fn memcpy_gbps(bytes: u64) -> f64 {
    let n = (bytes.min(512 << 20) / 4).max(1) as usize;
    let src = vec![1.0f32; n];
    let mut dst = vec![0.0f32; n];
    dst.copy_from_slice(&src);
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t = crate::clock::now();
        dst.copy_from_slice(&src);
        std::hint::black_box(&mut dst);
        best = best.min(t.elapsed().as_secs_f64());
    }
    (4 * n) as f64 / best.max(1e-9) / 1e9
}

/// Runs the benchmark: the senders and the joiner as child processes on loopback.
pub(crate) fn run(args: &RecoveryBenchArgs) -> Result<RecoveryBenchReport> {
    if args.senders == 0 {
        bail!("--senders: expected at least 1");
    }
    let params = usize::try_from(args.bytes / 8).context("--bytes: too large for this machine")?;
    if params == 0 {
        bail!("--bytes: expected at least 8 (one parameter's outer weight and momentum)");
    }
    let first_touch = first_touch_gbps(args.bytes);
    let memcpy = memcpy_gbps(args.bytes);
    let net = (args.scenario.as_ref())
        .map(|s| Emulated::start(s, args.senders, args.streams))
        .transpose()?;
    let addrs: Vec<std::net::SocketAddr> = match &net {
        Some(n) => n.addrs.clone(),
        None => super::free_loopback_ports(args.senders + 1)?
            .into_iter()
            .map(|p| std::net::SocketAddr::from(([127, 0, 0, 1], p)))
            .collect(),
    };
    let addrs_arg = addrs.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(",");
    let secret = args.secure.then(super::fresh_secret);
    let exe = std::env::current_exe()?;
    let spawn = |index: usize| {
        let mut cmd = match &net {
            Some(n) => n.command(index, &exe)?,
            None => std::process::Command::new(&exe),
        };
        cmd.args(["bench", "recovery-node", "--index", &index.to_string()])
            .args(["--senders", &args.senders.to_string(), "--addrs", &addrs_arg])
            .args(["--params", &params.to_string(), "--streams", &args.streams.to_string()])
            .args(secret.as_ref().map(|k| ["--secret", k.as_str()]).into_iter().flatten())
            .args(args.cold.then_some("--cold"))
            .args(
                net.as_ref()
                    .and_then(|n| n.congestion)
                    .map(|c| ["--congestion", c])
                    .into_iter()
                    .flatten(),
            )
            .stdout(std::process::Stdio::piped());
        cmd.spawn().context("starting a benchmark process")
    };
    // Senders first: the joiner dials them.
    let mut children = Vec::new();
    for i in 1..=args.senders {
        children.push(spawn(i)?);
    }
    children.insert(0, spawn(0)?);
    let mut nodes = Vec::new();
    let mut failed = None;
    for (i, c) in children.into_iter().enumerate() {
        let out = c.wait_with_output()?;
        let line = String::from_utf8_lossy(&out.stdout);
        match serde_json::from_str::<NodeResult>(line.trim()) {
            Ok(r) if out.status.success() => nodes.push(r),
            _ => {
                let who = if i == 0 { "the joiner".to_string() } else { format!("sender {i}") };
                failed.get_or_insert(format!("{who} failed ({})", out.status));
            }
        }
    }
    if let Some(f) = failed {
        bail!("{f}");
    }
    let joiner = &nodes[0];
    let seconds = joiner.total_seconds;
    let state_bytes = joiner.state_bytes;
    let gbps = state_bytes as f64 / seconds.max(1e-9) / 1e9;
    let link_gbps = net.as_ref().map(|n| n.link_gbps);
    let per_byte =
        |secs: f64| (net.is_none() && state_bytes > 0).then(|| secs / state_bytes as f64);
    let prepare = nodes[1..].iter().map(|n| n.prepare_seconds).fold(0.0, f64::max);
    Ok(RecoveryBenchReport {
        state_bytes,
        senders: args.senders,
        streams: args.streams,
        secure: args.secure,
        cold: args.cold,
        network: args
            .scenario
            .as_ref()
            .map_or_else(|| "loopback".into(), |s| format!("the emulated network of {}", s.name())),
        seconds,
        gbps,
        memcpy_gbps: memcpy,
        vs_memcpy: gbps / memcpy,
        first_touch_gbps: first_touch,
        link_gbps,
        vs_link: link_gbps.map(|l| gbps / l),
        sim_prepare_cost: per_byte(prepare).filter(|_| args.cold),
        sim_receive_cost: per_byte(seconds),
        nodes,
    })
}

/// Writing `bytes` (up to 512 MB) into freshly allocated memory, once, GB/s: the first
/// allocation of the run (memory freed and taken again comes faster on some machines, a
/// virtual one's host having backed it already).
fn first_touch_gbps(bytes: u64) -> f64 {
    let n = bytes.clamp(1, 512 << 20) as usize;
    let t = crate::clock::now();
    let mut v = vec![0u8; n]; // zeroed pages the kernel hands out on first write
    v.fill(1);
    std::hint::black_box(&mut v);
    n as f64 / t.elapsed().as_secs_f64().max(1e-9) / 1e9
}

/// The port every process listens on in the emulated network (each has an address of its own).
const EMULATED_PORT: u16 = 7100;

/// TCP/IP headers on the emulated links: 40 bytes of IPv4 and TCP plus 12 of timestamps per
/// segment of the MTU.
fn payload_share() -> f64 {
    let mtu = f64::from(loco_real::wan::MTU);
    (mtu - 52.0) / mtu
}

/// The scenario's emulated network, its first K nodes the senders and the next the joiner.
struct Emulated {
    net: loco_real::wan::Network,
    /// The hosts in the benchmark's process order: the joiner, then the senders.
    hosts: Vec<NodeId>,
    addrs: Vec<std::net::SocketAddr>,
    link_gbps: f64,
    congestion: Option<&'static str>,
}

/// Why the benchmark cannot run in `s`'s emulated network with `senders` senders, if it
/// cannot: the emulation unavailable here, too few nodes.
pub(crate) fn check_emulated(s: &loco_core::scenario::Scenario, senders: usize) -> Result<()> {
    if let Some(why) = loco_real::wan::netns::unavailable() {
        bail!("--scenario: the emulated network is unavailable: {why}");
    }
    let nodes = s.nodes().len();
    if nodes <= senders {
        bail!(
            "--scenario: {} has {nodes} node(s); {senders} sender(s) and a joiner need {}",
            s.name(),
            senders + 1
        );
    }
    Ok(())
}

impl Emulated {
    fn start(
        s: &loco_core::scenario::Scenario,
        senders: usize,
        streams: usize,
    ) -> Result<Emulated> {
        check_emulated(s, senders)?;
        let nodes: Vec<NodeId> = s.nodes().iter().map(|n| n.id).collect();
        let joiner = nodes[senders];
        let hosts: Vec<NodeId> =
            std::iter::once(joiner).chain(nodes[..senders].iter().copied()).collect();
        let mut shaper = loco_real::wan::Shaper::new(s, s.seed());
        let mut wire = 0.0;
        for &h in &nodes[..senders] {
            let k = u32::try_from(streams).unwrap_or(u32::MAX);
            wire += shaper
                .connections_rate(loco_core::Time::ZERO, h, joiner, k)
                .with_context(|| format!("--scenario: no link from node {h} to node {joiner}"))?;
        }
        let addrs = hosts
            .iter()
            .map(|&h| {
                loco_real::wan::addr::host_addr(h)
                    .map(|ip| std::net::SocketAddr::from((ip, EMULATED_PORT)))
                    .with_context(|| format!("node {h} has no emulated address"))
            })
            .collect::<Result<_>>()?;
        let net = loco_real::wan::Network::start(s, s.seed())?;
        Ok(Emulated {
            net,
            hosts,
            addrs,
            link_gbps: wire * payload_share() / 1e9,
            congestion: s.sim().tcp.linux_name(),
        })
    }

    /// A command running `exe` as the benchmark's process `index` in its host's namespace.
    fn command(&self, index: usize, exe: &std::path::Path) -> Result<std::process::Command> {
        let host = self.hosts.get(index).copied().context("a process beyond the hosts")?;
        self.net.hosts().command(host, exe).context("a host without a namespace")
    }
}
