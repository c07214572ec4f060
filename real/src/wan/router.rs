//! The router of an emulated network: one thread that reads every IP packet the hosts' kernels
//! send into their TUN devices, asks the [`Shaper`] when it arrives (or that it is dropped), and
//! writes it into the receiver's device at that time. Kernel TCP on both ends carries every byte;
//! the router only delays and drops, as the links of the scenario would.
//!
//! The thread waits in `ppoll` on the devices and a wake-up pipe (control messages), with a
//! timeout at the next due delivery, so deliveries are late by the kernel's timer slack (tens of
//! microseconds), not by a tick.

use super::WanError;
use super::addr::host_of;
use super::shaper::{Packet, Shaper, Verdict};
use loco_core::scenario::ChurnAction;
use loco_core::{NodeId, Time};
use nix::poll::{PollFd, PollFlags, ppoll};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a directed pair of hosts carried.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PairStats {
    /// Packets delivered (counted when they reach the receiver's device).
    pub packets: u64,
    /// Their bytes (IP packets, headers included).
    pub bytes: u64,
    /// Packets dropped by a full queue.
    pub dropped_full: u64,
    /// Packets dropped by a cut.
    pub dropped_cut: u64,
}

/// Every pair's figures, by (sender, receiver).
pub type Stats = BTreeMap<(NodeId, NodeId), PairStats>;

enum Ctl {
    Apply(ChurnAction),
    OuterSteps(u64),
    /// Scenario time 0 is now.
    StartClock,
    Stop,
}

/// A running router; dropping it stops the thread.
pub struct Router {
    ctl: mpsc::Sender<Ctl>,
    wake: OwnedFd,
    stats: Arc<Mutex<Stats>>,
    published: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router").finish_non_exhaustive()
    }
}

/// The clock of the emulated network and of the relays: the one place in them that reads one.
#[derive(Clone, Copy)]
pub(crate) struct Clock(Instant);

impl Clock {
    #[allow(clippy::disallowed_methods)] // the emulated network's clock adapter
    pub(crate) fn start() -> Clock {
        Clock(Instant::now())
    }

    #[allow(clippy::disallowed_methods)] // the emulated network's clock adapter
    pub(crate) fn now(self) -> Time {
        Time::from_nanos(u64::try_from(self.0.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }

    /// The instant this clock reads `t` at.
    pub(crate) fn instant(self, t: Time) -> Instant {
        self.0 + Duration::from_nanos(t.as_nanos())
    }
}

/// A packet waiting for its arrival time.
struct Due {
    at: Time,
    seq: u64,
    from: NodeId,
    to: usize,
    bytes: Vec<u8>,
}

impl PartialEq for Due {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Due {}
impl PartialOrd for Due {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Due {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

/// The fields of an IPv4 packet the router needs: receiver and the connection's key.
fn parse(p: &[u8]) -> Option<(std::net::Ipv4Addr, u64)> {
    if p.len() < 20 || p[0] >> 4 != 4 {
        return None;
    }
    let ihl = usize::from(p[0] & 0x0f) * 4;
    let proto = p[9];
    let dst = std::net::Ipv4Addr::new(p[16], p[17], p[18], p[19]);
    let ports = match (proto, p.get(ihl..ihl + 4)) {
        (6 | 17, Some(x)) => u64::from(u32::from_be_bytes([x[0], x[1], x[2], x[3]])),
        _ => 0,
    };
    Some((dst, (u64::from(proto) << 32) | ports))
}

/// The descriptor of a TUN device, borrowed for a poll (the `tun` crate gives only its raw
/// number).
#[allow(unsafe_code)]
fn borrow(d: &tun::Device) -> std::os::fd::BorrowedFd<'_> {
    use std::os::fd::AsRawFd;
    // SAFETY: the descriptor belongs to `d`, which closes it only when dropped, and the borrow
    // cannot outlive `d`.
    unsafe { std::os::fd::BorrowedFd::borrow_raw(d.as_raw_fd()) }
}

/// Packets read from one device before the others get their turn.
const BURST: usize = 64;
/// How often the figures are published to [`Router::stats`].
const PUBLISH: Duration = Duration::from_millis(10);
/// How long a connection may be idle before its queue is forgotten.
const FLOW_IDLE: Duration = Duration::from_secs(10);

impl Router {
    /// Starts the router over `devices` (the TUN ends of `ids`' namespaces, in that order).
    pub fn start(
        ids: Vec<NodeId>,
        devices: Vec<tun::Device>,
        shaper: Shaper,
        mtu: u16,
    ) -> Result<Router, WanError> {
        let (ctl, rx) = mpsc::channel();
        let (wake_rx, wake) = nix::unistd::pipe()
            .map_err(|e| WanError::Spawn { what: "a pipe".into(), source: e.into() })?;
        let stats = Arc::new(Mutex::new(Stats::new()));
        let published = Arc::new(AtomicU64::new(0));
        let (st, pb) = (Arc::clone(&stats), Arc::clone(&published));
        let thread = std::thread::Builder::new()
            .name("loco-router".into())
            .spawn(move || route(ids, devices, shaper, usize::from(mtu), rx, wake_rx, st, pb))
            .map_err(|source| WanError::Spawn { what: "the router thread".into(), source })?;
        Ok(Router { ctl, wake, stats, published, thread: Some(thread) })
    }

    fn send(&self, c: Ctl) {
        let _ = self.ctl.send(c);
        let _ = nix::unistd::write(&self.wake, &[1]);
    }

    /// Applies a churn event's network part; see [`Shaper::apply`].
    pub fn apply(&self, action: &ChurnAction) {
        self.send(Ctl::Apply(action.clone()));
    }

    /// The outer steps done so far (uniform rates are drawn again at each).
    pub fn set_outer_steps(&self, steps: u64) {
        self.send(Ctl::OuterSteps(steps));
    }

    /// The scenario's clock starts now (its traces are read from here).
    pub fn start_clock(&self) {
        self.send(Ctl::StartClock);
    }

    /// What each pair has carried so far, and the router's time when it was counted (its
    /// figures are published every few milliseconds: a rate over two readings divides by the
    /// difference of their times, not of the reader's).
    pub fn stats(&self) -> (Time, Stats) {
        let s = self.stats.lock().map(|s| s.clone()).unwrap_or_default();
        (Time::from_nanos(self.published.load(Ordering::Relaxed)), s)
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        self.send(Ctl::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[allow(clippy::too_many_arguments)] // the thread's whole world, moved in once
fn route(
    ids: Vec<NodeId>,
    devices: Vec<tun::Device>,
    mut shaper: Shaper,
    mtu: usize,
    ctl: mpsc::Receiver<Ctl>,
    wake: OwnedFd,
    stats: Arc<Mutex<Stats>>,
    published: Arc<AtomicU64>,
) {
    // Deliveries are due to the microsecond: no slack on the router's timers (the default, 50
    // microseconds, would add up to 0.1 ms to every round trip).
    if let Err(e) = nix::sys::prctl::set_timerslack(1) {
        tracing::debug!("the router's timer slack stays as it was: {e}");
    }
    let clock = Clock::start();
    published.store(0, Ordering::Relaxed);
    let index: BTreeMap<NodeId, usize> = ids.iter().enumerate().map(|(i, &id)| (id, i)).collect();
    let mut heap: BinaryHeap<Reverse<Due>> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut local = Stats::new();
    let mut last_forget = Time::ZERO;
    let mut last_publish = Time::ZERO;
    let mut buf = vec![0u8; mtu.max(1500) + 64];
    loop {
        // Control first, so that a cut applies to the packets read after it.
        loop {
            match ctl.try_recv() {
                Ok(Ctl::Apply(a)) => {
                    shaper.apply(&a);
                }
                Ok(Ctl::OuterSteps(n)) => shaper.set_outer_steps(n),
                Ok(Ctl::StartClock) => shaper.set_origin(clock.now()),
                Ok(Ctl::Stop) | Err(mpsc::TryRecvError::Disconnected) => {
                    if let Ok(mut s) = stats.lock() {
                        s.clone_from(&local);
                    }
                    return;
                }
                Err(mpsc::TryRecvError::Empty) => break,
            }
        }
        let now = clock.now();
        while heap.peek().is_some_and(|d| d.0.at <= now) {
            let Some(Reverse(d)) = heap.pop() else { break };
            if let (Some(dev), Some(&to)) = (devices.get(d.to), ids.get(d.to)) {
                // A receiver whose device is gone (the namespace was removed) loses it.
                let _ = dev.send(&d.bytes);
                let st = local.entry((d.from, to)).or_default();
                st.packets += 1;
                st.bytes += d.bytes.len() as u64;
            }
        }
        let timeout = heap.peek().map(|d| d.0.at.saturating_since(now)).unwrap_or(Duration::MAX);
        let timeout = timeout.min(Duration::from_millis(200));
        let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(devices.len() + 1);
        fds.push(PollFd::new(wake.as_fd(), PollFlags::POLLIN));
        for d in &devices {
            fds.push(PollFd::new(borrow(d), PollFlags::POLLIN));
        }
        let ts = nix::sys::time::TimeSpec::from_duration(timeout);
        match ppoll(&mut fds, Some(ts), None) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => {
                tracing::error!("the emulated network's router stops: poll: {e}");
                return;
            }
        }
        let ready: Vec<bool> =
            fds.iter().map(|f| f.revents().is_some_and(|r| !r.is_empty())).collect();
        drop(fds);
        if ready.first().copied().unwrap_or(false) {
            let mut sink = [0u8; 64];
            let _ = nix::unistd::read(&wake, &mut sink);
        }
        let now = clock.now();
        for (i, dev) in devices.iter().enumerate() {
            if !ready.get(i + 1).copied().unwrap_or(false) {
                continue;
            }
            let Some(&from) = ids.get(i) else { continue };
            for _ in 0..BURST {
                let n = match dev.recv(&mut buf) {
                    Ok(n) => n,
                    Err(_) => break, // WouldBlock: drained
                };
                let Some(pkt) = buf.get(..n) else { break };
                let Some((dst, flow)) = parse(pkt) else { continue };
                let Some(to) = host_of(dst) else { continue };
                let Some(&ti) = index.get(&to) else { continue };
                let st = local.entry((from, to)).or_default();
                match shaper.admit(now, Packet { from, to, flow, len: n }) {
                    Verdict::Deliver(at) => {
                        seq += 1;
                        heap.push(Reverse(Due { at, seq, from, to: ti, bytes: pkt.to_vec() }));
                    }
                    Verdict::Full => {
                        st.dropped_full += 1;
                        tracing::trace!(at = ?now, %from, %to, flow, len = n, "a queue is full");
                    }
                    Verdict::Cut => st.dropped_cut += 1,
                    Verdict::NoLink => {}
                }
            }
        }
        if now.saturating_since(last_forget) > FLOW_IDLE {
            shaper.forget_idle(now, FLOW_IDLE);
            last_forget = now;
        }
        if now.saturating_since(last_publish) > PUBLISH {
            if let Ok(mut s) = stats.lock() {
                s.clone_from(&local);
                published.store(now.as_nanos(), Ordering::Relaxed);
            }
            last_publish = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_are_parsed_for_their_receiver_and_connection() {
        let mut p = vec![0u8; 40];
        p[0] = 0x45;
        p[9] = 6;
        p[16..20].copy_from_slice(&[198, 18, 0, 3]);
        p[20..24].copy_from_slice(&[0x1f, 0x90, 0x00, 0x50]);
        let (dst, flow) = parse(&p).expect("an IPv4 packet");
        assert_eq!(dst, std::net::Ipv4Addr::new(198, 18, 0, 3));
        assert_eq!(flow, (6 << 32) | 0x1f90_0050);
        assert_eq!(parse(&p[..19]), None, "too short");
        p[0] = 0x60;
        assert_eq!(parse(&p), None, "IPv6 is not routed");
        // A header length past the packet gives no ports, never a panic.
        p[0] = 0x4f;
        assert_eq!(parse(&p[..40]).map(|x| x.1), Some(6 << 32));
    }
}
