//! The bandwidth probe a member runs against its peers, measured on its own clock only.
//!
//! For each peer in turn: two `Probe`s with an empty body (the lesser round trip is the base
//! latency: the first may carry the connection's set-up), then `Probe`s whose body grows by 4x from [`PROBE_START_BYTES`] until one transfer takes at
//! least a quarter of [`MeshConfig::probe_duration`](super::MeshConfig::probe_duration) or the body
//! reaches [`PROBE_MAX_BYTES`]. The peer echoes each with an empty `ProbeAck`. Bandwidth =
//! body length / (round trip - base round trip). Both round trips are measured by the prober, so
//! no remote clock is involved; the simulator's bandwidth model and real links feed it alike.

use super::ProbeResult;
use super::ring::BandwidthMatrix;
use crate::ids::NodeId;
use crate::time::Time;
use std::collections::{BTreeSet, VecDeque};
use std::time::Duration;

/// First padded probe body, bytes.
pub const PROBE_START_BYTES: u64 = 256 * 1024;
/// Largest probe body, bytes.
pub const PROBE_MAX_BYTES: u64 = 64 * 1024 * 1024;

#[derive(Clone, Debug, PartialEq)]
struct Outstanding {
    peer: NodeId,
    seq: u32,
    sent_at: Time,
    padding: u64,
}

/// What the prober wants done.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum ProbeOut {
    /// Send `Probe { round, seq }` with this much padding to `to`.
    Send { to: NodeId, round: u64, seq: u32, padding: u64 },
    /// All peers done: report.
    Report { round: u64, results: Vec<ProbeResult> },
}

#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Prober {
    round: u64,
    peers: VecDeque<NodeId>,
    current: Option<Outstanding>,
    base_rtt: Option<Duration>,
    best: Option<f64>,
    results: Vec<ProbeResult>,
    seq: u32,
}

impl Prober {
    /// Starts a new round (abandoning any running one).
    pub(crate) fn start(
        &mut self,
        now: Time,
        round: u64,
        peers: Vec<NodeId>,
        target: Duration,
    ) -> Vec<ProbeOut> {
        *self = Prober { round, peers: peers.into(), seq: self.seq, ..Prober::default() };
        self.next_peer(now, target)
    }

    /// When the outstanding probe is given up.
    pub(crate) fn deadline(&self, target: Duration) -> Option<Time> {
        self.current.as_ref().map(|c| c.sent_at + timeout(target))
    }

    fn send(&mut self, now: Time, peer: NodeId, padding: u64) -> ProbeOut {
        self.seq = self.seq.wrapping_add(1);
        self.current = Some(Outstanding { peer, seq: self.seq, sent_at: now, padding });
        ProbeOut::Send { to: peer, round: self.round, seq: self.seq, padding }
    }

    fn next_peer(&mut self, now: Time, _target: Duration) -> Vec<ProbeOut> {
        self.base_rtt = None;
        self.best = None;
        self.current = None;
        match self.peers.pop_front() {
            Some(peer) => vec![self.send(now, peer, 0)],
            None if self.round > 0 => {
                let results = std::mem::take(&mut self.results);
                let round = self.round;
                self.round = 0;
                vec![ProbeOut::Report { round, results }]
            }
            None => Vec::new(),
        }
    }

    fn finish_peer(&mut self, now: Time, target: Duration) -> Vec<ProbeOut> {
        if let (Some(c), Some(bw)) = (&self.current, self.best) {
            self.results.push(ProbeResult { peer: c.peer, bytes_per_sec: bw });
        }
        self.next_peer(now, target)
    }

    /// An echo arrived.
    pub(crate) fn on_ack(
        &mut self,
        now: Time,
        from: NodeId,
        round: u64,
        seq: u32,
        target: Duration,
    ) -> Vec<ProbeOut> {
        let Some(c) = self.current.clone() else { return Vec::new() };
        if round != self.round || seq != c.seq || from != c.peer {
            return Vec::new(); // an echo of an abandoned probe
        }
        let rtt = now - c.sent_at;
        if c.padding == 0 {
            // Two empty probes: the least of their round trips is the base latency. The first
            // to a peer may carry its connection's set-up (the transport's handshake, two round
            // trips more), which would read as latency and make every transfer after look
            // instantaneous.
            let first = self.base_rtt.is_none();
            self.base_rtt = Some(self.base_rtt.map_or(rtt, |b| b.min(rtt)));
            let next = if first { 0 } else { PROBE_START_BYTES };
            return vec![self.send(now, c.peer, next)];
        }
        let Some(base) = self.base_rtt else { return Vec::new() };
        let transfer = rtt.saturating_sub(base).max(Duration::from_nanos(1));
        self.best = Some(c.padding as f64 / transfer.as_secs_f64());
        if transfer < target / 4 && c.padding < PROBE_MAX_BYTES {
            let padding = (c.padding * 4).min(PROBE_MAX_BYTES);
            return vec![self.send(now, c.peer, padding)];
        }
        self.finish_peer(now, target)
    }

    /// The outstanding probe timed out: keep the last estimate for that peer, if any, and go on.
    pub(crate) fn on_timeout(&mut self, now: Time, target: Duration) -> Vec<ProbeOut> {
        match self.deadline(target) {
            Some(d) if now >= d => self.finish_peer(now, target),
            _ => Vec::new(),
        }
    }
}

fn timeout(target: Duration) -> Duration {
    (target * 10).max(Duration::from_secs(1))
}

/// The coordinator's probe schedule. Links are measured in rounds; in each round a node takes
/// part in at most one probe (as prober or as target), so that no two probes share a node's link
/// or NIC (a shared link reads as a slow one, and an echo queued behind a reverse probe reads as
/// a very slow one). The next round starts when every prober has reported or the round's
/// deadline has passed.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct ProbePlan {
    /// The links waiting, in the order they were queued, as runs of links from one prober
    /// (`plan` queues a prober's links together): a round skips a busy prober's whole run at
    /// once instead of looking at each of its links (a thousand members queue a million links,
    /// and a round picks at most one link per prober).
    queue: Vec<(NodeId, Vec<NodeId>)>,
    /// The links in `queue`, for lookups (a thousand members queue a million links).
    queued: BTreeSet<(NodeId, NodeId)>,
    round: u64,
    outstanding: BTreeSet<NodeId>,
    deadline: Option<Time>,
}

impl ProbePlan {
    /// Queues every unmeasured directed link among `members` not queued yet.
    pub(crate) fn plan(&mut self, members: &[NodeId], measured: &BandwidthMatrix) {
        for &a in members {
            // Start with the peer after `a`, so that rounds mix the nodes.
            let mut peers = measured.unmeasured_from(a, members);
            let split = peers.iter().position(|&p| p > a).unwrap_or(peers.len());
            peers.rotate_left(split);
            peers.retain(|&b| self.queued.insert((a, b)));
            if !peers.is_empty() {
                self.queue.push((a, peers));
            }
        }
    }

    /// A prober reported on `round`.
    pub(crate) fn on_report(&mut self, from: NodeId, round: u64) {
        if round == self.round {
            self.outstanding.remove(&from);
        }
    }

    /// `id` left the mesh: drop its links.
    pub(crate) fn forget(&mut self, id: NodeId) {
        self.queue.retain_mut(|(a, bs)| {
            bs.retain(|&b| b != id);
            *a != id && !bs.is_empty()
        });
        self.queued.retain(|&(a, b)| a != id && b != id);
        self.outstanding.remove(&id);
    }

    /// The current round's deadline, while one runs.
    pub(crate) fn deadline(&self) -> Option<Time> {
        if self.outstanding.is_empty() { None } else { self.deadline }
    }

    /// Starts the next round if the current one is over: the requests to send.
    pub(crate) fn next_round(&mut self, now: Time, target: Duration) -> Vec<(NodeId, u64, NodeId)> {
        if !self.outstanding.is_empty() && self.deadline.is_some_and(|d| now < d) {
            return Vec::new();
        }
        self.outstanding.clear();
        if self.queue.is_empty() {
            return Vec::new();
        }
        self.round += 1;
        // Greedy in queue order: a link is taken when neither end is busy yet this round. Within
        // a prober's run that is its first link to a free target; after it (or when the prober
        // is busy) none of the run can be.
        let mut busy = BTreeSet::new();
        let mut out = Vec::new();
        for (a, bs) in &mut self.queue {
            if busy.contains(a) {
                continue;
            }
            if let Some(i) = bs.iter().position(|b| !busy.contains(b)) {
                let b = bs.remove(i);
                busy.insert(*a);
                busy.insert(b);
                out.push((*a, self.round, b));
            }
        }
        self.queue.retain(|(_, bs)| !bs.is_empty());
        for (a, _, b) in &out {
            self.queued.remove(&(*a, *b));
        }
        self.outstanding = out.iter().map(|&(a, _, _)| a).collect();
        self.deadline = Some(now + round_timeout(target));
        out
    }
}

/// How long a probe round may take: every probe of a silent peer times out after
/// `10 x probe_duration`; the round allows for that and the probes before it.
fn round_timeout(target: Duration) -> Duration {
    timeout(target) * 3
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// `now - d`: the past, faked.
    fn ago(now: Time, d: Duration) -> Time {
        Time::from_nanos(now.as_nanos() - d.as_nanos() as u64)
    }

    /// Simulates a link with a fixed latency and bandwidth, the ack path being free.
    fn run(peers: Vec<NodeId>, latency: Duration, bytes_per_sec: f64) -> (Vec<ProbeResult>, Time) {
        run_with_setup(peers, latency, bytes_per_sec, Duration::ZERO)
    }

    /// [`run`], the first message to each peer taking `setup` more (its connection's handshake).
    fn run_with_setup(
        peers: Vec<NodeId>,
        latency: Duration,
        bytes_per_sec: f64,
        setup: Duration,
    ) -> (Vec<ProbeResult>, Time) {
        let mut connected = BTreeSet::new();
        let mut p = Prober::default();
        let target = Duration::from_secs(1);
        let mut now = Time::ZERO;
        let mut out = p.start(now, 1, peers, target);
        loop {
            match out.pop() {
                Some(ProbeOut::Send { to, round, seq, padding }) => {
                    let transfer = Duration::from_secs_f64(padding as f64 / bytes_per_sec);
                    now = now + latency * 2 + transfer;
                    if connected.insert(to) {
                        now += setup;
                    }
                    out = p.on_ack(now, to, round, seq, target);
                }
                Some(ProbeOut::Report { round, results }) => {
                    assert_eq!(round, 1);
                    return (results, now);
                }
                None => panic!("prober stalled"),
            }
        }
    }

    #[test]
    fn measures_bandwidth_without_the_latency() {
        for bw in [62.5e6, 500e6, 10e6] {
            let (r, _) = run(vec![NodeId(1), NodeId(2)], ms(40), bw);
            assert_eq!(r.len(), 2);
            for x in r {
                assert!((x.bytes_per_sec / bw - 1.0).abs() < 1e-6, "{} vs {bw}", x.bytes_per_sec);
            }
        }
    }

    /// A first probe that waited for its connection's handshake does not inflate the base
    /// latency (which made every transfer after it read as instantaneous, and the probes grow
    /// to their largest body).
    #[test]
    fn a_connection_s_set_up_is_not_read_as_latency() {
        let bw = 10e6;
        let (r, _) = run_with_setup(vec![NodeId(1)], ms(40), bw, ms(160));
        assert!((r[0].bytes_per_sec / bw - 1.0).abs() < 1e-6, "{} vs {bw}", r[0].bytes_per_sec);
    }

    #[test]
    fn a_probe_takes_about_the_probe_duration() {
        let (_, end) = run(vec![NodeId(1)], ms(10), 500e6);
        assert!(end < Time::ZERO + Duration::from_secs(2), "{end}");
    }

    #[test]
    fn probe_rounds_never_share_a_node() {
        let members: Vec<NodeId> = (0..5).map(NodeId).collect();
        let mut plan = ProbePlan::default();
        plan.plan(&members, &BandwidthMatrix::new());
        let mut seen = BTreeSet::new();
        let mut now = Time::ZERO;
        let mut rounds = 0;
        loop {
            let r = plan.next_round(now, Duration::from_secs(1));
            if r.is_empty() {
                break;
            }
            rounds += 1;
            let mut nodes = BTreeSet::new();
            for &(a, round, b) in &r {
                assert_eq!(round, rounds);
                assert!(nodes.insert(a) && nodes.insert(b), "round {rounds} reuses a node: {r:?}");
                assert!(seen.insert((a, b)));
            }
            // Before everyone reported, no new round starts.
            assert!(plan.next_round(now, Duration::from_secs(1)).is_empty());
            for &(a, round, _) in &r {
                plan.on_report(a, round);
            }
            now += Duration::from_secs(1);
        }
        assert_eq!(seen.len(), 20);
        assert!(rounds <= 12, "{rounds} rounds for 5 nodes");
    }

    #[test]
    fn a_round_ends_at_its_deadline_and_forgotten_nodes_drop_out() {
        let members: Vec<NodeId> = (0..3).map(NodeId).collect();
        let mut plan = ProbePlan::default();
        plan.plan(&members, &BandwidthMatrix::new());
        let r = plan.next_round(Time::ZERO, Duration::from_secs(1));
        assert_eq!(r, vec![(NodeId(0), 1, NodeId(1))]);
        let d = plan.deadline().unwrap();
        assert!(plan.next_round(ago(d, ms(1)), Duration::from_secs(1)).is_empty());
        plan.forget(NodeId(2));
        let r = plan.next_round(d, Duration::from_secs(1));
        assert_eq!(r, vec![(NodeId(1), 2, NodeId(0))]);
        plan.on_report(NodeId(1), 2);
        assert_eq!(plan.deadline(), None);
        assert!(plan.next_round(d, Duration::from_secs(1)).is_empty());
    }

    #[test]
    fn a_silent_peer_is_skipped_after_the_timeout() {
        let mut p = Prober::default();
        let target = Duration::from_secs(1);
        let out = p.start(Time::ZERO, 3, vec![NodeId(1), NodeId(2)], target);
        assert!(matches!(out[..], [ProbeOut::Send { to: NodeId(1), padding: 0, .. }]));
        let d = p.deadline(target).unwrap();
        assert!(p.on_timeout(ago(d, ms(1)), target).is_empty());
        let out = p.on_timeout(d, target);
        assert!(matches!(out[..], [ProbeOut::Send { to: NodeId(2), padding: 0, .. }]));
        // A late echo from n1 is ignored.
        assert!(p.on_ack(d, NodeId(1), 3, 1, target).is_empty());
    }
}
