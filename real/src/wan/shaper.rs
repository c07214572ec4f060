//! When a packet between two emulated hosts arrives, or that it is dropped: the scenario's links
//! as queues, with time injected (no clock, no I/O).
//!
//! A packet from node `a` to node `b` crosses, in the order of a real path:
//!
//! 1. `a`'s egress NIC (`nic`, when the node has one);
//! 2. its connection's queue, served at the link's `bandwidth` (the rate of one connection);
//! 3. the pair's queue, served at `bandwidth x streams` (binding only when more connections than
//!    `streams` share the pair);
//! 4. the link's one-way latency, plus a jitter drawn uniformly in `[0, jitter]` from the run's
//!    seed;
//! 5. `b`'s ingress NIC (`nic`, when the node has one).
//!
//! Arrivals keep their order on a pair (jitter never reorders a TCP stream: real paths rarely
//! do, and the simulator's messages do not). Each queue holds at most about one round trip of
//! its rate (a buffer of one bandwidth-delay product, at least [`MIN_BUFFER`]): a packet that
//! would wait longer is dropped, as a router's tail-drop would, so TCP finds the link's rate the
//! way it does on the internet.
//!
//! The shaper is asked about a packet when its sender hands it over, so the stages that only
//! one sender feeds (1-3) see their packets in the order they arrive and serve them first come,
//! first served. The receiver's NIC is fed by every pair, each after its own queues and
//! latency: packets reach it in another order than they are handed over, so it keeps the
//! intervals it is busy ([`Calendar`]) and serves each packet in the first gap at or after its
//! arrival. Served in hand-over order instead, a packet still queued upstream (or still on a
//! long link) would hold the NIC before it got there, and another pair's packets that reach
//! the NIC first would wait behind it, or be dropped (a receiver's acknowledgements, behind the
//! queue of the data it receives on another link).
//!
//! Traffic to and from the coordinator takes the latency only, as in the simulator (control
//! messages skip its bandwidth model). A cut (`partition`) drops every packet it covers until
//! its `heal`; `degrade` and `restore` change the links as [`Links`] does for the simulator,
//! from the same seed, so a uniformly drawn rate is the same number in both backends.

use loco_core::rng::{Purpose, pair_subject, stream};
use loco_core::scenario::links::Links;
use loco_core::scenario::{ChurnAction, Cut, RegionId, Scenario};
use loco_core::{NodeId, Time};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// The least time a queue buffers, whatever the round trip.
pub const MIN_BUFFER: Duration = Duration::from_millis(5);

/// What becomes of a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// It reaches its receiver at this time.
    Deliver(Time),
    /// A cut covers the pair.
    Cut,
    /// A queue on its way is full.
    Full,
    /// The pair has no link (it is not in the scenario).
    NoLink,
}

/// One packet, as the shaper sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packet {
    /// Sender.
    pub from: NodeId,
    /// Receiver.
    pub to: NodeId,
    /// The connection it belongs to (any stable key of its 5-tuple).
    pub flow: u64,
    /// Bytes on the wire.
    pub len: usize,
}

/// A FIFO server: when it is next free.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Server {
    free: Time,
}

/// A packet on its way through the servers: when its first byte may start at the next one and
/// when its last byte has left the previous ones. Servers pass it on cut-through (a server as
/// fast as the one before it adds no delay), so only the slowest one on the way serialises it.
#[derive(Clone, Copy, Debug)]
struct Passage {
    start: Time,
    done: Time,
}

impl Server {
    /// Serves `len` bytes at `rate` (bytes per second); `None` when the packet would wait more
    /// than `buffer` for this server.
    fn serve(&mut self, p: Passage, len: usize, rate: f64, buffer: Duration) -> Option<Passage> {
        if !rate.is_finite() {
            return Some(p);
        }
        let start = self.free.max(p.start);
        if start - p.start > buffer {
            return None;
        }
        // Lengths are at most 64 KiB: exact in f64.
        self.free = start + Duration::from_secs_f64(len as f64 / rate.max(1.0));
        Some(Passage { start, done: p.done.max(self.free) })
    }
}

/// A server fed out of arrival order (the receiver's NIC): the intervals it is busy from the
/// earliest that may still matter, sorted and disjoint. A packet takes the first gap, at or
/// after its arrival, that holds its serialisation.
#[derive(Clone, Debug, Default, PartialEq)]
struct Calendar {
    busy: std::collections::VecDeque<(Time, Time)>,
}

impl Calendar {
    /// Serves `len` bytes at `rate` (bytes per second) for a packet whose first byte arrives at
    /// `p.start` and last at `p.done`, handed over at `now` (no arrival is earlier): `None`,
    /// and nothing booked, when it would wait more than `buffer` for a gap.
    fn serve(
        &mut self,
        now: Time,
        p: Passage,
        len: usize,
        rate: f64,
        buffer: Duration,
    ) -> Option<Passage> {
        if !rate.is_finite() {
            return Some(p);
        }
        // Arrivals are never earlier than the hand-over: what ended before it is past.
        while self.busy.front().is_some_and(|&(_, end)| end <= now) {
            self.busy.pop_front();
        }
        // Lengths are at most 64 KiB: exact in f64.
        let took = Duration::from_secs_f64(len as f64 / rate.max(1.0));
        let mut start = p.start;
        // Sorted and disjoint: those over before it arrives are skipped in one search (a
        // receiver of a gigabit holds thousands of them), and it usually goes last.
        let first = self.busy.partition_point(|&(_, b)| b <= start);
        let mut at = self.busy.len();
        for (i, &(a, b)) in self.busy.range(first..).enumerate() {
            if start + took <= a {
                at = first + i;
                break;
            }
            start = b;
        }
        if start - p.start > buffer {
            return None;
        }
        let end = start + took;
        // Merge with the neighbours it touches: back-to-back packets keep one interval.
        let joins_prev = at > 0 && self.busy.get(at - 1).is_some_and(|&(_, b)| b == start);
        let joins_next = self.busy.get(at).is_some_and(|&(a, _)| a == end);
        match (joins_prev, joins_next) {
            (true, true) => {
                let next_end = self.busy.remove(at).map_or(end, |(_, b)| b);
                if let Some(prev) = self.busy.get_mut(at - 1) {
                    prev.1 = next_end;
                }
            }
            (true, false) => {
                if let Some(prev) = self.busy.get_mut(at - 1) {
                    prev.1 = end;
                }
            }
            (false, true) => {
                if let Some(next) = self.busy.get_mut(at) {
                    next.0 = start;
                }
            }
            (false, false) => self.busy.insert(at, (start, end)),
        }
        Some(Passage { start, done: p.done.max(end) })
    }
}

/// The scenario's links as queues. See the module documentation.
pub struct Shaper {
    links: Links,
    regions: BTreeMap<NodeId, RegionId>,
    nodes: Vec<NodeId>,
    hosts: Vec<NodeId>,
    nic: BTreeMap<NodeId, f64>,
    cuts: Vec<Cut>,
    steps: u64,
    /// The time at which the scenario's clock reads 0 (its traces count from there).
    origin: Time,
    flows: HashMap<(NodeId, NodeId, u64), Server>,
    pairs: BTreeMap<(NodeId, NodeId), Server>,
    egress: BTreeMap<NodeId, Server>,
    ingress: BTreeMap<NodeId, Calendar>,
    last_arrival: BTreeMap<(NodeId, NodeId), Time>,
    jitter: ChaCha8Rng,
}

impl std::fmt::Debug for Shaper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shaper").field("hosts", &self.hosts).field("cuts", &self.cuts).finish()
    }
}

impl Shaper {
    /// The links of `scenario`, drawn from `seed` (the run's seed, as the simulator's).
    pub fn new(scenario: &Scenario, seed: u64) -> Self {
        let mut regions: BTreeMap<NodeId, RegionId> =
            scenario.nodes().iter().map(|n| (n.id, n.region)).collect();
        regions.insert(NodeId::COORDINATOR, scenario.coordinator_region());
        let nodes: Vec<NodeId> = scenario.nodes().iter().map(|n| n.id).collect();
        let mut hosts = nodes.clone();
        hosts.push(NodeId::COORDINATOR);
        let nic = scenario
            .nodes()
            .iter()
            .filter_map(|n| n.nic.map(|r| (n.id, r.bytes_per_sec())))
            .collect();
        let mut links = Links::new(scenario, seed);
        links.refresh(Time::ZERO, 0, &nodes, &hosts);
        Shaper {
            links,
            regions,
            nodes,
            hosts,
            nic,
            cuts: Vec::new(),
            steps: 0,
            origin: Time::ZERO,
            flows: HashMap::new(),
            pairs: BTreeMap::new(),
            egress: BTreeMap::new(),
            ingress: BTreeMap::new(),
            last_arrival: BTreeMap::new(),
            jitter: stream(seed, pair_subject(u32::MAX, u32::MAX), Purpose::Turmoil),
        }
    }

    /// The outer steps done so far (a uniform rate without `resample` is drawn again at each).
    pub fn set_outer_steps(&mut self, steps: u64) {
        self.steps = self.steps.max(steps);
    }

    /// Applies a churn event's network part (`partition`, `heal`, `degrade`, `restore`); other
    /// events are not the network's and change nothing. Returns whether it was the network's.
    pub fn apply(&mut self, action: &ChurnAction) -> bool {
        match action {
            ChurnAction::Partition(_) | ChurnAction::Heal(_) => action.update_cuts(&mut self.cuts),
            ChurnAction::Degrade { from, to, oneway, bandwidth, latency, jitter } => {
                self.links.degrade(
                    *from,
                    *to,
                    *oneway,
                    bandwidth.as_ref(),
                    latency.as_ref(),
                    *jitter,
                );
            }
            ChurnAction::Restore { from, to, oneway } => self.links.restore(*from, *to, *oneway),
            _ => return false,
        }
        true
    }

    /// Whether a cut drops traffic from `a` to `b` now.
    pub fn is_cut(&self, a: NodeId, b: NodeId) -> bool {
        self.cuts.iter().any(|c| c.covers(&self.regions, a, b))
    }

    /// The rate of one connection from `a` to `b` (bytes per second) and their one-way latency
    /// `(min, max)` in force at `now`.
    pub fn link(&mut self, now: Time, a: NodeId, b: NodeId) -> Option<(f64, Duration, Duration)> {
        self.refresh(now);
        let (lo, hi) = self.links.latency(a, b)?;
        let rate = self.links.pair_caps(a, b).map_or(f64::INFINITY, |c| c.per_stream);
        Some((rate, lo, hi))
    }

    /// The scenario's clock reads 0 at `at`: traces are read from there.
    pub fn set_origin(&mut self, at: Time) {
        self.origin = at;
        self.links.refresh(Time::ZERO, self.steps, &self.nodes, &self.hosts);
    }

    /// The rate one connection from `a` to `b` can reach at `now` (bytes per second): the
    /// link's, capped by the pair's `streams` share and the two NICs.
    pub fn one_connection_rate(&mut self, now: Time, a: NodeId, b: NodeId) -> Option<f64> {
        self.connections_rate(now, a, b, 1)
    }

    /// The rate `k` connections from `a` to `b` can reach together at `now` (bytes per
    /// second): `k` times the link's, capped by the pair's total and the two NICs.
    pub fn connections_rate(&mut self, now: Time, a: NodeId, b: NodeId, k: u32) -> Option<f64> {
        self.refresh(now);
        let caps = self.links.pair_caps(a, b)?;
        let mut r = (caps.per_stream * f64::from(k.max(1))).min(caps.total());
        for n in [a, b] {
            if let Some(&nic) = self.nic.get(&n) {
                r = r.min(nic);
            }
        }
        Some(r)
    }

    fn refresh(&mut self, now: Time) {
        let t = Time::ZERO + now.saturating_since(self.origin);
        if self.links.due(t, self.steps) {
            self.links.refresh(t, self.steps, &self.nodes, &self.hosts);
        }
    }

    /// What becomes of `p`, handed to the network at `now`.
    pub fn admit(&mut self, now: Time, p: Packet) -> Verdict {
        if p.from == p.to {
            return Verdict::NoLink;
        }
        if self.is_cut(p.from, p.to) {
            return Verdict::Cut;
        }
        self.refresh(now);
        let Some((lo, hi)) = self.links.latency(p.from, p.to) else { return Verdict::NoLink };
        let buffer = (lo * 2).max(MIN_BUFFER);
        let mut t = Passage { start: now, done: now };
        let control = p.from == NodeId::COORDINATOR || p.to == NodeId::COORDINATOR;
        let nic = |n: NodeId| self.nic.get(&n).copied();
        let mut stages = None;
        if !control {
            let Some(caps) = self.links.pair_caps(p.from, p.to) else { return Verdict::NoLink };
            // Every server on the way serves a copy; only a packet that all of them take is
            // charged to them (a packet dropped downstream must not hold an upstream queue).
            let mut servers: [(Server, f64); 3] = [
                (
                    self.egress.get(&p.from).copied().unwrap_or_default(),
                    nic(p.from).unwrap_or(f64::INFINITY),
                ),
                (
                    self.flows.get(&(p.from, p.to, p.flow)).copied().unwrap_or_default(),
                    caps.per_stream,
                ),
                (self.pairs.get(&(p.from, p.to)).copied().unwrap_or_default(), caps.total()),
            ];
            for (server, rate) in &mut servers {
                let Some(x) = server.serve(t, p.len, *rate, buffer) else {
                    return Verdict::Full;
                };
                t = x;
            }
            stages = Some(servers.map(|(s, _)| s));
        }
        let spread = hi.saturating_sub(lo);
        let jitter =
            if spread.is_zero() { Duration::ZERO } else { spread.mul_f64(self.jitter.random()) };
        let last = self.last_arrival.get(&(p.from, p.to)).copied().unwrap_or(Time::ZERO);
        let done = (t.done + lo + jitter).max(last);
        let mut reach = Passage { start: (t.start + lo + jitter).min(done), done };
        if let (Some(rate), false) = (nic(p.to), control) {
            let cal = self.ingress.entry(p.to).or_default();
            let Some(x) = cal.serve(now, reach, p.len, rate, buffer) else {
                return Verdict::Full;
            };
            reach = x;
        }
        if let Some([egress, flow, pair]) = stages {
            self.flows.insert((p.from, p.to, p.flow), flow);
            self.pairs.insert((p.from, p.to), pair);
            if nic(p.from).is_some() {
                self.egress.insert(p.from, egress);
            }
        }
        let arrival = reach.done.max(last);
        self.last_arrival.insert((p.from, p.to), arrival);
        Verdict::Deliver(arrival)
    }

    /// Forgets the connections that have been idle since before `now - idle` (bounds the
    /// per-connection state of a long run).
    pub fn forget_idle(&mut self, now: Time, idle: Duration) {
        self.flows.retain(|_, s| now.saturating_since(s.free) < idle);
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
