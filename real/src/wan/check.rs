//! The emulation's self-test (`loco net check`): for each pair of regions, one connection
//! between two of its hosts, its achieved rate and round trip against the scenario's figures.
//!
//! Each side runs on a thread of its own that has entered its host's namespace, so the bytes
//! cross the router exactly as a worker's would. The rate is read from the router's count of
//! delivered bytes (IP packets, as the links count them) over the second half of the transfer,
//! after TCP's slow start; the goodput (payload bytes the receiver read) is given beside it.

use super::{Network, Shaper, WanError, netns};
use loco_core::scenario::Scenario;
use loco_core::{NodeId, Time};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// One link's measurement.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct LinkCheck {
    /// `region -> region`.
    pub link: String,
    /// The sending node's name.
    pub from: String,
    /// The receiving node's name.
    pub to: String,
    /// The rate one connection should get, bytes per second (link, streams share, NICs).
    pub configured_rate: f64,
    /// The rate it got, bytes per second on the wire.
    pub achieved_rate: f64,
    /// Payload bytes per second the receiver read.
    pub goodput: f64,
    /// The round trip the links give (both one-way latencies, plus the mean jitter), seconds.
    pub configured_rtt: f64,
    /// The median round trip of a one-byte exchange, seconds.
    pub measured_rtt: f64,
    /// Packets the link's queues dropped during the transfer (TCP probing for the rate).
    pub dropped: u64,
}

impl LinkCheck {
    /// `achieved / configured - 1`.
    pub fn rate_error(&self) -> f64 {
        self.achieved_rate / self.configured_rate - 1.0
    }

    /// `measured / configured - 1` of the round trip.
    pub fn rtt_error(&self) -> f64 {
        self.measured_rtt / self.configured_rtt - 1.0
    }
}

/// Round trips timed per link.
const PINGS: usize = 21;
/// The port the receiving side listens on.
const PORT: u16 = 5201;

/// Which pairs of nodes stand for the scenario's links: for each ordered pair of regions with
/// a link, the first node of the one and another node of the other.
pub fn pairs(s: &Scenario) -> Vec<(NodeId, NodeId, String)> {
    let mut out = Vec::new();
    for ra in s.regions() {
        for rb in s.regions() {
            if s.link(ra.id, rb.id).is_none() {
                continue;
            }
            let a = s.nodes().iter().find(|n| n.region == ra.id);
            let b = s.nodes().iter().find(|n| n.region == rb.id && a.is_none_or(|a| a.id != n.id));
            if let (Some(a), Some(b)) = (a, b) {
                out.push((a.id, b.id, format!("{} -> {}", ra.name, rb.name)));
            }
        }
    }
    out
}

#[allow(clippy::disallowed_methods)] // a measurement's own clock; nothing decides on it
fn now() -> Instant {
    Instant::now()
}

fn io(what: &str) -> impl FnOnce(std::io::Error) -> WanError + '_ {
    move |source| WanError::Spawn { what: what.to_string(), source }
}

/// Runs `f` on a thread inside `host`'s namespace.
fn in_host<T: Send + 'static>(
    net: &Network,
    host: NodeId,
    f: impl FnOnce() -> Result<T, WanError> + Send + 'static,
) -> Result<std::thread::JoinHandle<Result<T, WanError>>, WanError> {
    let path = net.hosts().netns_path(host).ok_or(WanError::NodeOutOfRange { node: host })?;
    std::thread::Builder::new()
        .name("loco-net-check".into())
        .spawn(move || {
            netns::enter_path(&path)?;
            f()
        })
        .map_err(io("a measuring thread"))
}

fn join<T>(h: std::thread::JoinHandle<Result<T, WanError>>) -> Result<T, WanError> {
    h.join().unwrap_or_else(|_| {
        Err(WanError::Spawn {
            what: "a measuring thread".into(),
            source: std::io::Error::other("it panicked"),
        })
    })
}

/// Measures one link: round trips, then `seconds` of one connection's bulk transfer.
fn measure(
    net: &Network,
    a: NodeId,
    b: NodeId,
    seconds: Duration,
    cc: Option<&'static str>,
) -> Result<(f64, f64, f64, u64), WanError> {
    let b_addr = net.hosts().host(b).ok_or(WanError::NodeOutOfRange { node: b })?.addr;
    let addr = SocketAddr::from((b_addr, PORT));
    let received = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let (rx_count, rx_done) = (Arc::clone(&received), Arc::clone(&done));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let server = in_host(net, b, move || {
        let l = TcpListener::bind(addr).map_err(io("listening"))?;
        let _ = ready_tx.send(());
        // The ping connection: echo each byte.
        let (mut s, _) = l.accept().map_err(io("accepting"))?;
        s.set_nodelay(true).map_err(io("TCP_NODELAY"))?;
        let mut one = [0u8; 1];
        for _ in 0..PINGS {
            s.read_exact(&mut one).map_err(io("reading a ping"))?;
            s.write_all(&one).map_err(io("answering a ping"))?;
        }
        // The bulk connection: count what arrives.
        let (mut s, _) = l.accept().map_err(io("accepting"))?;
        crate::tcp::set_congestion(&s, cc);
        s.set_read_timeout(Some(Duration::from_secs(5))).map_err(io("a read timeout"))?;
        let mut buf = vec![0u8; 1 << 16];
        while !rx_done.load(Ordering::Relaxed) {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    rx_count.fetch_add(n as u64, Ordering::Relaxed);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(io("receiving")(e)),
            }
        }
        Ok(())
    })?;
    ready_rx.recv_timeout(Duration::from_secs(10)).map_err(|_| WanError::Spawn {
        what: "the receiving side".into(),
        source: std::io::Error::other("did not start listening"),
    })?;
    let tx_done = Arc::clone(&done);
    let client = in_host(net, a, move || {
        let mut s =
            TcpStream::connect_timeout(&addr, Duration::from_secs(10)).map_err(io("connecting"))?;
        s.set_nodelay(true).map_err(io("TCP_NODELAY"))?;
        let mut rtts = Vec::with_capacity(PINGS);
        let mut one = [7u8; 1];
        for _ in 0..PINGS {
            let t = now();
            s.write_all(&one).map_err(io("pinging"))?;
            s.read_exact(&mut one).map_err(io("reading a ping's answer"))?;
            rtts.push(t.elapsed().as_secs_f64());
        }
        rtts.sort_by(f64::total_cmp);
        let mut s =
            TcpStream::connect_timeout(&addr, Duration::from_secs(10)).map_err(io("connecting"))?;
        s.set_write_timeout(Some(Duration::from_secs(5))).map_err(io("a write timeout"))?;
        let buf = vec![0x5au8; 1 << 16];
        while !tx_done.load(Ordering::Relaxed) {
            if s.write_all(&buf).is_err() {
                break;
            }
        }
        Ok(rtts.get(PINGS / 2).copied().unwrap_or(f64::NAN))
    })?;
    // Measure over the second half of the transfer (after slow start).
    let start = now();
    let half = seconds / 2;
    while start.elapsed() < half {
        std::thread::sleep(Duration::from_millis(5));
    }
    let (w0, stats0) = net.router().stats();
    let wire0 = stats0.get(&(a, b)).map_or(0, |p| p.bytes);
    let (good0, t0) = (received.load(Ordering::Relaxed), now());
    while start.elapsed() < seconds {
        std::thread::sleep(Duration::from_millis(5));
    }
    let (w1, stats1) = net.router().stats();
    let wire1 = stats1.get(&(a, b)).map_or(0, |p| p.bytes);
    let (good1, dt) = (received.load(Ordering::Relaxed), t0.elapsed().as_secs_f64());
    done.store(true, Ordering::Relaxed);
    let rtt = join(client)?;
    join(server)?;
    // On the wire: over the router's own times of the two readings.
    let wire_dt = w1.saturating_since(w0).as_secs_f64();
    let wire = (wire1.saturating_sub(wire0)) as f64 / wire_dt;
    let good = (good1.saturating_sub(good0)) as f64 / dt;
    let dropped = stats1.get(&(a, b)).map_or(0, |p| p.dropped_full);
    Ok((rtt, wire, good, dropped))
}

/// Checks every link of `s` (see [`pairs`]), `seconds` of transfer each, one after the other;
/// `progress` hears of each as it ends.
pub fn check(
    s: &Scenario,
    seed: u64,
    seconds: Duration,
    mut progress: impl FnMut(&LinkCheck),
) -> Result<Vec<LinkCheck>, WanError> {
    let net = Network::start(s, seed)?;
    // The congestion control the scenario's workers run (`[sim] tcp`).
    let cc = s.sim().tcp.linux_name();
    let mut shaper = Shaper::new(s, seed);
    let name = |id: NodeId| s.node(id).map_or_else(|| id.to_string(), |n| n.name.clone());
    let mut out = Vec::new();
    for (a, b, link) in pairs(s) {
        let configured_rate = shaper.one_connection_rate(Time::ZERO, a, b).unwrap_or(f64::NAN);
        let one_way = |sh: &mut Shaper, x, y| {
            sh.link(Time::ZERO, x, y).map_or(f64::NAN, |(_, lo, hi)| {
                lo.as_secs_f64() + (hi.saturating_sub(lo)).as_secs_f64() / 2.0
            })
        };
        let configured_rtt = one_way(&mut shaper, a, b) + one_way(&mut shaper, b, a);
        let (measured_rtt, achieved_rate, goodput, dropped) = measure(&net, a, b, seconds, cc)?;
        let c = LinkCheck {
            link,
            from: name(a),
            to: name(b),
            configured_rate,
            achieved_rate,
            goodput,
            configured_rtt,
            measured_rtt,
            dropped,
        };
        progress(&c);
        out.push(c);
    }
    Ok(out)
}
