//! The scenario's network in userspace, for machines where the emulation cannot run (no root, no
//! TUN devices): every process listens on loopback, and every connection from one node to
//! another goes through a relay of the launcher's for that directed pair, which holds each piece
//! of the stream as the link would.
//!
//! A node dials its peers through their relays ([`crate::tcp::TcpConfig::dial_via`]); a relay
//! accepts, dials the receiver's real address, copies the receiver's replies back as they come
//! (the handshake's answer: connections are one-way) and passes the sender's bytes on in pieces
//! of one segment ([`EMULATED_MSS`]), each handed to the same [`Shaper`] the emulated network
//! uses: per-connection rate, `streams`, NIC caps, latency and jitter from the run's seed,
//! partitions, degrades. Where the shaper's queues are full the relay stops reading, so the
//! sender's socket fills and TCP's flow control slows it to the link's rate; a cut holds the
//! bytes until its heal. Nothing is lost, so TCP's own dynamics (slow start, losses,
//! retransmission timeouts) are not the link's: the simulator's TCP term does not apply here.
//! Traffic with the coordinator goes through relays too, with the latency only (its messages skip
//! the simulator's bandwidth model), so that a partition cuts it as it cuts the nodes' links.

use super::WanError;
use super::router::{Clock, PairStats, Stats};
use super::shaper::{Packet, Shaper, Verdict};
use loco_core::scenario::ChurnAction;
use loco_core::scenario::links::EMULATED_MSS;
use loco_core::{NodeId, Time};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How long a relay waits before asking again for a piece the shaper's queues had no room for
/// (they hold at least 5 ms).
const FULL_RETRY: Duration = Duration::from_millis(1);
/// How long a relay waits before asking again for a piece a cut holds.
const CUT_RETRY: Duration = Duration::from_millis(5);
/// Pieces on their way (released by the shaper, not yet due) per connection, at most.
const IN_FLIGHT: usize = 4096;

/// The shaper and the figures, shared by every relay.
struct Shared {
    shaper: Mutex<Shaper>,
    clock: Mutex<Clock>,
    stats: Mutex<Stats>,
    flows: AtomicU64,
}

impl Shared {
    fn now(&self) -> Time {
        self.clock.lock().map(|c| c.now()).unwrap_or(Time::ZERO)
    }

    /// The tokio instant of router time `t`.
    fn instant(&self, t: Time) -> tokio::time::Instant {
        let c = self.clock.lock().map(|c| *c).unwrap_or_else(|_| Clock::start());
        tokio::time::Instant::from_std(c.instant(t))
    }
}

/// A run's relays. Dropping it stops them (their connections close).
pub struct Relays {
    runtime: Option<tokio::runtime::Runtime>,
    shared: Arc<Shared>,
    listen: BTreeMap<NodeId, SocketAddr>,
    via: BTreeMap<(NodeId, NodeId), SocketAddr>,
}

impl std::fmt::Debug for Relays {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relays").field("listen", &self.listen).finish_non_exhaustive()
    }
}

impl Relays {
    /// Relays for every ordered pair of `scenario`'s nodes and the coordinator, its links drawn
    /// from `seed` (the simulator's), and a loopback address for each of them to listen on.
    pub fn start(scenario: &loco_core::scenario::Scenario, seed: u64) -> Result<Relays, WanError> {
        let mut ids: Vec<NodeId> = scenario.nodes().iter().map(|n| n.id).collect();
        ids.push(NodeId::COORDINATOR);
        let spawn_err = |what: &str| {
            let what = what.to_owned();
            move |source| WanError::Spawn { what, source }
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("loco-relay")
            .enable_all()
            .build()
            .map_err(spawn_err("the relays' runtime"))?;
        let shared = Arc::new(Shared {
            shaper: Mutex::new(Shaper::new(scenario, seed)),
            clock: Mutex::new(Clock::start()),
            stats: Mutex::new(Stats::new()),
            flows: AtomicU64::new(0),
        });
        // Each node's own address: a free port, released for the worker to bind (as `loco
        // bench allreduce` does for its ranks). The reservations are held until every relay
        // listens, so that no relay's own port is one of them (a worker then failed to listen).
        let mut listen = BTreeMap::new();
        let mut reserved = Vec::with_capacity(ids.len());
        for &id in &ids {
            let l = std::net::TcpListener::bind(("127.0.0.1", 0))
                .map_err(spawn_err("reserving a loopback port"))?;
            listen.insert(id, l.local_addr().map_err(spawn_err("reserving a loopback port"))?);
            reserved.push(l);
        }
        let mut via = BTreeMap::new();
        for &from in &ids {
            for &to in &ids {
                if from == to {
                    continue;
                }
                let l = runtime
                    .block_on(TcpListener::bind(("127.0.0.1", 0)))
                    .map_err(spawn_err("a relay's listener"))?;
                let addr = l.local_addr().map_err(spawn_err("a relay's listener"))?;
                via.insert((from, to), addr);
                let (shared, target) = (Arc::clone(&shared), listen[&to]);
                runtime.spawn(accept(l, from, to, target, shared));
            }
        }
        drop(reserved);
        Ok(Relays { runtime: Some(runtime), shared, listen, via })
    }

    /// Where node `id` listens.
    pub fn listen_addr(&self, id: NodeId) -> Option<SocketAddr> {
        self.listen.get(&id).copied()
    }

    /// The relay node `from` dials to reach each other node.
    pub fn dial_via(&self, from: NodeId) -> Vec<(NodeId, SocketAddr)> {
        self.via.iter().filter(|((f, _), _)| *f == from).map(|((_, t), a)| (*t, *a)).collect()
    }

    /// Applies a churn event's network part; see [`Shaper::apply`].
    pub fn apply(&self, action: &ChurnAction) {
        if let Ok(mut s) = self.shared.shaper.lock() {
            s.apply(action);
        }
    }

    /// The outer steps done so far (uniform rates are drawn again at each).
    pub fn set_outer_steps(&self, steps: u64) {
        if let Ok(mut s) = self.shared.shaper.lock() {
            s.set_outer_steps(steps);
        }
    }

    /// The scenario's clock starts now (its traces are read from here).
    pub fn start_clock(&self) {
        let now = self.shared.now();
        if let Ok(mut s) = self.shared.shaper.lock() {
            s.set_origin(now);
        }
    }

    /// What each pair has carried so far (payload bytes; `packets` counts pieces), and the
    /// relays' time.
    pub fn stats(&self) -> (Time, Stats) {
        let s = self.shared.stats.lock().map(|s| s.clone()).unwrap_or_default();
        (self.shared.now(), s)
    }
}

impl Drop for Relays {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

async fn accept(l: TcpListener, from: NodeId, to: NodeId, target: SocketAddr, shared: Arc<Shared>) {
    loop {
        let Ok((inbound, _)) = l.accept().await else { continue };
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            if let Err(e) = relay(inbound, from, to, target, shared).await {
                tracing::debug!(%from, %to, "relay connection ended: {e}");
            }
        });
    }
}

/// One connection from `from` to `to`: the receiver's bytes back as they come, the sender's
/// through the shaper.
async fn relay(
    inbound: TcpStream,
    from: NodeId,
    to: NodeId,
    target: SocketAddr,
    shared: Arc<Shared>,
) -> std::io::Result<()> {
    let outbound = TcpStream::connect(target).await?;
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let (mut in_r, mut in_w) = inbound.into_split();
    let (mut out_r, mut out_w) = outbound.into_split();
    let back = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut out_r, &mut in_w).await;
        let _ = in_w.shutdown().await;
    });
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(Time, Vec<u8>)>(IN_FLIGHT);
    let sh = Arc::clone(&shared);
    let writer = tokio::spawn(async move {
        while let Some((at, piece)) = rx.recv().await {
            tokio::time::sleep_until(sh.instant(at)).await;
            if out_w.write_all(&piece).await.is_err() {
                return;
            }
        }
        let _ = out_w.shutdown().await;
    });
    let flow = shared.flows.fetch_add(1, Ordering::Relaxed);
    let mut buf = vec![0u8; EMULATED_MSS as usize];
    loop {
        let n = in_r.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        let p = Packet { from, to, flow, len: n };
        let at = loop {
            let now = shared.now();
            let v = shared.shaper.lock().ok().map(|mut s| s.admit(now, p));
            match v {
                Some(Verdict::Deliver(at)) => break at,
                Some(Verdict::Full) => tokio::time::sleep(FULL_RETRY).await,
                Some(Verdict::Cut) => tokio::time::sleep(CUT_RETRY).await,
                Some(Verdict::NoLink) | None => break now,
            }
        };
        {
            let st = shared.stats.lock();
            if let Ok(mut st) = st {
                let e: &mut PairStats = st.entry((from, to)).or_default();
                e.packets += 1;
                e.bytes += n as u64;
            }
        }
        if tx.send((at, buf[..n].to_vec())).await.is_err() {
            break;
        }
    }
    drop(tx);
    let _ = writer.await;
    back.abort();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scenario() -> loco_core::scenario::Scenario {
        let text = r#"
name = "relay"
seed = 5
[model]
preset = "tiny"
[[regions]]
name = "r"
[[links]]
from = "r"
to = "r"
bandwidth = "20Mbit/s"
latency = "25ms"
[[nodes]]
name = "n"
count = 2
step_time = "1s"
[stop]
outer_steps = 1
"#;
        loco_core::scenario::Scenario::from_toml_str(text, "relay.toml").unwrap()
    }

    /// A stream through a relay takes the link's latency and rate: one byte arrives after about
    /// 25 ms, 1 MB at about 20 Mbit/s.
    #[test]
    fn a_relay_gives_a_connection_the_links_latency_and_rate() {
        let s = scenario();
        let relays = Relays::start(&s, 5).unwrap();
        let (a, b) = (NodeId(0), NodeId(1));
        let target = relays.listen_addr(b).unwrap();
        let via: Vec<SocketAddr> =
            relays.dial_via(a).into_iter().filter(|(n, _)| *n == b).map(|(_, v)| v).collect();
        assert_eq!(via.len(), 1);
        assert_eq!(relays.dial_via(a).len(), 2, "the other node and the coordinator");
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let (latency, rate) = rt.block_on(async move {
            let l = TcpListener::bind(target).await.unwrap();
            let mut c = TcpStream::connect(via[0]).await.unwrap();
            let (mut s, _) = l.accept().await.unwrap();
            let mut one = [0u8; 1];
            let t0 = tokio::time::Instant::now();
            c.write_all(&[7]).await.unwrap();
            s.read_exact(&mut one).await.unwrap();
            let latency = t0.elapsed();
            let n = 1_000_000usize;
            let t1 = tokio::time::Instant::now();
            let send = tokio::spawn(async move {
                c.write_all(&vec![1u8; n]).await.unwrap();
                c
            });
            let mut got = vec![0u8; n];
            tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut got))
                .await
                .expect("1 MB within 10 s")
                .unwrap();
            let secs = t1.elapsed().as_secs_f64();
            drop(send.await);
            (latency, n as f64 * 8.0 / secs)
        });
        assert!(
            latency >= Duration::from_millis(25) && latency < Duration::from_millis(60),
            "{latency:?}"
        );
        // 1 MB at 20 Mbit/s is 0.4 s, plus the latency once.
        assert!(rate > 16e6 && rate < 20.5e6, "{rate}");
        let (_, st) = relays.stats();
        assert_eq!(st[&(a, b)].bytes, 1_000_001);
    }
}
