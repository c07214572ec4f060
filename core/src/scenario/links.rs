//! The links of a scenario over time: what the simulator's bandwidth model and turmoil's
//! latencies are set to, and what the real backend's emulated network shapes its packets by.
//!
//! Each directed pair of regions has a link in force: the declared one, or the one a `degrade`
//! event made of it until `restore`. Each directed pair of *nodes* takes its rate (of one
//! connection) and its latency from the link between their regions:
//!
//! - a fixed value is that value;
//! - a trace is its step function of simulated time;
//! - `uniform = [low, high]` is drawn per node pair from the stream of (seed, pair,
//!   [`Purpose::LinkBandwidth`] or [`Purpose::LinkLatency`]), keyed by the draw's index: the
//!   outer step (default) or `floor(t / resample)`. Each pair has its own draw, so the links of
//!   a run vary from 500 Mbit/s to 4 Gbit/s as the report's did, reproducibly.
//!
//! turmoil has one latency per *unordered* pair of hosts: the lower id's direction is used, with
//! `jitter` as turmoil's spread (`min = latency`, `max = latency + jitter`). Links to the
//! coordinator matter only for latency (control messages skip the bandwidth model).

use crate::rng::{Purpose, mix64, pair_subject, stream};
use crate::scenario::{LinkSpec, RegionId, Scenario, Varying};
use crate::{NodeId, Time};
use rand::Rng;
use std::collections::BTreeMap;
use std::time::Duration;

/// The MTU of the real backend's emulated links (jumbo frames: the router handles six times
/// fewer packets than at 1500 bytes for the same rate).
pub const EMULATED_MTU: u16 = 9000;
/// The TCP payload of one segment on those links: the MTU less the IPv4 and TCP headers and
/// TCP's timestamp option (20 + 20 + 12 bytes).
pub const EMULATED_MSS: u32 = EMULATED_MTU as u32 - 52;

/// Capacities of the connections from one node to another.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PairCaps {
    /// Rate of one connection, bytes per second (> 0, finite).
    pub per_stream: f64,
    /// How many concurrent connections each get `per_stream`; `None` for no limit.
    pub streams: Option<u32>,
}

impl PairCaps {
    /// The pair's total: `per_stream x streams`, unlimited when `streams` is absent.
    pub fn total(&self) -> f64 {
        match self.streams {
            Some(s) => self.per_stream * f64::from(s.max(1)),
            None => f64::INFINITY,
        }
    }
}

/// A latency to set in turmoil between two hosts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LatencySetting {
    /// One host.
    pub a: NodeId,
    /// The other host.
    pub b: NodeId,
    /// Smallest latency.
    pub min: Duration,
    /// Largest latency (`min + jitter`).
    pub max: Duration,
}

/// The links in force. See the module documentation.
pub struct Links {
    seed: u64,
    declared: BTreeMap<(RegionId, RegionId), LinkSpec>,
    current: BTreeMap<(RegionId, RegionId), LinkSpec>,
    regions: BTreeMap<NodeId, RegionId>,
    bandwidth: BTreeMap<(NodeId, NodeId), PairCaps>,
    latency: BTreeMap<(NodeId, NodeId), (Duration, Duration)>,
    next_change: Time,
    step_index: u64,
    dirty: bool,
}

fn draw_u(seed: u64, subject: u64, index: u64, purpose: Purpose) -> f64 {
    let mut rng = stream(seed, mix64(subject) ^ mix64(index.wrapping_add(0x5eed)), purpose);
    rng.random::<f64>()
}

/// The index of the draw in force at `t` for a resampling period, or the outer step.
fn draw_index(resample: Option<Duration>, t: Time, step: u64) -> u64 {
    match resample {
        Some(d) if !d.is_zero() => {
            t.as_nanos() / u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1)
        }
        _ => step,
    }
}

/// Whether `v` is drawn again at every outer step ([`draw_index`] by step).
fn redrawn_per_step<T>(v: &Varying<T>) -> bool {
    matches!(v, Varying::Uniform { resample, .. } if resample.is_none_or(|d| d.is_zero()))
}

/// The next time after `t` at which `v` changes by time (not by outer step).
fn next_change<T>(v: &Varying<T>, t: Time) -> Time {
    match v {
        Varying::Fixed(_) | Varying::Uniform { resample: None, .. } => Time::MAX,
        Varying::Uniform { resample: Some(d), .. } => {
            let d = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1);
            Time::from_nanos((t.as_nanos() / d).saturating_add(1).saturating_mul(d))
        }
        Varying::Trace(points) => {
            points.iter().map(|(at, _)| Time::ZERO + *at).find(|at| *at > t).unwrap_or(Time::MAX)
        }
    }
}

impl Links {
    /// The links of `scenario`, drawn from `seed`.
    pub fn new(scenario: &Scenario, seed: u64) -> Self {
        let mut declared = BTreeMap::new();
        for a in scenario.regions() {
            for b in scenario.regions() {
                if let Some(l) = scenario.link(a.id, b.id) {
                    declared.insert((a.id, b.id), l.clone());
                }
            }
        }
        let mut regions: BTreeMap<NodeId, RegionId> =
            scenario.nodes().iter().map(|n| (n.id, n.region)).collect();
        regions.insert(NodeId::COORDINATOR, scenario.coordinator_region());
        Links {
            seed,
            current: declared.clone(),
            declared,
            regions,
            bandwidth: BTreeMap::new(),
            latency: BTreeMap::new(),
            next_change: Time::ZERO,
            step_index: 0,
            dirty: true,
        }
    }

    /// The link in force from region `from` to region `to`.
    pub fn link(&self, from: RegionId, to: RegionId) -> Option<&LinkSpec> {
        self.current.get(&(from, to))
    }

    /// Replaces fields of the link(s) between two regions (a `degrade` event).
    pub fn degrade(
        &mut self,
        from: RegionId,
        to: RegionId,
        oneway: bool,
        bandwidth: Option<&Varying<crate::scenario::Rate>>,
        latency: Option<&Varying<Duration>>,
        jitter: Option<Duration>,
    ) {
        let mut dirs = vec![(from, to)];
        if !oneway {
            dirs.push((to, from));
        }
        for d in dirs {
            if let Some(l) = self.current.get_mut(&d) {
                if let Some(b) = bandwidth {
                    l.bandwidth = b.clone();
                }
                if let Some(x) = latency {
                    l.latency = x.clone();
                }
                if let Some(j) = jitter {
                    l.jitter = j;
                }
            }
        }
        self.dirty = true;
    }

    /// Puts the link(s) between two regions back as declared (a `restore` event).
    pub fn restore(&mut self, from: RegionId, to: RegionId, oneway: bool) {
        let mut dirs = vec![(from, to)];
        if !oneway {
            dirs.push((to, from));
        }
        for d in dirs {
            if let Some(l) = self.declared.get(&d) {
                self.current.insert(d, l.clone());
            }
        }
        self.dirty = true;
    }

    /// When the links change by themselves next (a trace's or a time-drawn figure's next value;
    /// `Time::MAX` for never): the replay loop refreshes them then.
    pub fn next_change(&self) -> Time {
        if self.dirty { Time::ZERO } else { self.next_change }
    }

    /// Whether the values may have changed since the last [`refresh`](Self::refresh).
    pub fn due(&self, now: Time, steps_done: u64) -> bool {
        self.dirty
            || now >= self.next_change
            || (steps_done != self.step_index && self.varies_per_step())
    }

    /// Whether a link in force is redrawn at every outer step (`uniform` without `resample`):
    /// only then does a new step call for a refresh (of every pair: O(nodes^2)).
    fn varies_per_step(&self) -> bool {
        self.current
            .values()
            .any(|l| redrawn_per_step(&l.bandwidth) || redrawn_per_step(&l.latency))
    }

    fn rate(&self, a: NodeId, b: NodeId, now: Time) -> Option<PairCaps> {
        let l = self.current.get(&(*self.regions.get(&a)?, *self.regions.get(&b)?))?;
        let bps = match &l.bandwidth {
            Varying::Fixed(r) => r.bytes_per_sec(),
            Varying::Trace(_) => l.bandwidth.at(now - Time::ZERO)?.bytes_per_sec(),
            Varying::Uniform { low, high, resample } => {
                let i = draw_index(*resample, now, self.step_index);
                let u = draw_u(self.seed, pair_subject(a.0, b.0), i, Purpose::LinkBandwidth);
                low.bytes_per_sec() + u * (high.bytes_per_sec() - low.bytes_per_sec())
            }
        };
        Some(PairCaps { per_stream: bps.max(1.0), streams: Some(l.streams.max(1)) })
    }

    fn lat(&self, a: NodeId, b: NodeId, now: Time) -> Option<(Duration, Duration)> {
        let l = self.current.get(&(*self.regions.get(&a)?, *self.regions.get(&b)?))?;
        let base = match &l.latency {
            Varying::Fixed(d) => *d,
            Varying::Trace(_) => l.latency.at(now - Time::ZERO)?,
            Varying::Uniform { low, high, resample } => {
                let i = draw_index(*resample, now, self.step_index);
                let (x, y) = if a <= b { (a, b) } else { (b, a) };
                let u = draw_u(self.seed, pair_subject(x.0, y.0), i, Purpose::LinkLatency);
                low.mul_f64(1.0 - u).saturating_add(high.mul_f64(u))
            }
        };
        Some((base, base + l.jitter))
    }

    /// Recomputes every pair among `nodes` (the coordinator included for latency) at `now`,
    /// after `steps_done` outer steps. Returns the rates that changed (for the bandwidth model)
    /// and the latencies that changed among `hosts` (the hosts turmoil knows).
    pub fn refresh(
        &mut self,
        now: Time,
        steps_done: u64,
        nodes: &[NodeId],
        hosts: &[NodeId],
    ) -> (Vec<(NodeId, NodeId, PairCaps)>, Vec<LatencySetting>) {
        self.step_index = steps_done;
        self.dirty = false;
        let mut rates = Vec::new();
        for &a in nodes {
            for &b in nodes {
                if a == b {
                    continue;
                }
                if let Some(c) = self.rate(a, b, now)
                    && self.bandwidth.get(&(a, b)) != Some(&c)
                {
                    self.bandwidth.insert((a, b), c);
                    rates.push((a, b, c));
                }
            }
        }
        let mut lats = Vec::new();
        for (i, &a) in hosts.iter().enumerate() {
            for &b in &hosts[i + 1..] {
                let (x, y) = if a <= b { (a, b) } else { (b, a) };
                if let Some(v) = self.lat(x, y, now)
                    && self.latency.get(&(x, y)) != Some(&v)
                {
                    self.latency.insert((x, y), v);
                    lats.push(LatencySetting { a: x, b: y, min: v.0, max: v.1 });
                }
            }
        }
        let mut next = Time::MAX;
        for l in self.current.values() {
            next = next.min(next_change(&l.bandwidth, now)).min(next_change(&l.latency, now));
        }
        self.next_change = next;
        (rates, lats)
    }

    /// The latencies between a newly registered host and `hosts`, forgetting what was set for
    /// it before (a restarted host).
    pub fn host_latencies(
        &mut self,
        host: NodeId,
        hosts: &[NodeId],
        now: Time,
    ) -> Vec<LatencySetting> {
        let mut out = Vec::new();
        for &b in hosts {
            if b == host {
                continue;
            }
            let (x, y) = if host <= b { (host, b) } else { (b, host) };
            if let Some(v) = self.lat(x, y, now) {
                self.latency.insert((x, y), v);
                out.push(LatencySetting { a: x, b: y, min: v.0, max: v.1 });
            }
        }
        out
    }

    /// The one-way latency in force between `a` and `b` as `(min, max)` (`max = min + jitter`),
    /// as last refreshed for hosts that include both.
    pub fn latency(&self, a: NodeId, b: NodeId) -> Option<(Duration, Duration)> {
        let key = if a <= b { (a, b) } else { (b, a) };
        self.latency.get(&key).copied()
    }

    /// The rate in force from `a` to `b` (bytes per second of one connection).
    pub fn pair_caps(&self, a: NodeId, b: NodeId) -> Option<PairCaps> {
        self.bandwidth.get(&(a, b)).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCENARIO: &str = r#"
name = "links"
[model]
preset = "tiny"
[[regions]]
name = "us"
[[regions]]
name = "eu"
[[links]]
from = "us"
to = "us"
bandwidth = { uniform = ["1Gbit/s", "4Gbit/s"] }
latency = "30ms"
[[links]]
from = "us"
to = "eu"
bandwidth = { trace = [["0s", "800Mbit/s"], ["1h", "400Mbit/s"]] }
latency = "45ms"
jitter = "5ms"
[[links]]
from = "eu"
to = "eu"
bandwidth = "2Gbit/s"
latency = "15ms"
[[nodes]]
name = "us"
count = 2
region = "us"
step_time = "1s"
[[nodes]]
name = "eu"
region = "eu"
step_time = "1s"
[stop]
outer_steps = 1
"#;

    fn scenario() -> Scenario {
        Scenario::from_toml_str(SCENARIO, "links.toml").expect("valid scenario")
    }

    #[test]
    fn uniform_draws_are_per_pair_per_step_and_within_bounds() {
        let s = scenario();
        let nodes = [NodeId(0), NodeId(1), NodeId(2)];
        let mut l = Links::new(&s, 9);
        let (r0, _) = l.refresh(Time::ZERO, 0, &nodes, &[]);
        assert_eq!(r0.len(), 6);
        let c01 = l.pair_caps(NodeId(0), NodeId(1)).unwrap();
        let c10 = l.pair_caps(NodeId(1), NodeId(0)).unwrap();
        assert!(c01.per_stream >= 125e6 && c01.per_stream <= 500e6, "{c01:?}");
        assert_ne!(c01, c10);
        // Same step: nothing changes; next step: the us-us pairs are drawn again.
        assert!(!l.due(Time::from_secs_f64(10.0), 0));
        assert!(l.due(Time::from_secs_f64(10.0), 1));
        let (r1, _) = l.refresh(Time::from_secs_f64(10.0), 1, &nodes, &[]);
        assert_eq!(r1.len(), 2, "{r1:?}");
        // Reproducible from the seed.
        let mut again = Links::new(&s, 9);
        again.refresh(Time::ZERO, 0, &nodes, &[]);
        assert_eq!(again.pair_caps(NodeId(0), NodeId(1)), Some(c01));
    }

    #[test]
    fn traces_and_degradations_change_the_rates() {
        let s = scenario();
        let nodes = [NodeId(0), NodeId(2)];
        let mut l = Links::new(&s, 1);
        let (_, lat) =
            l.refresh(Time::ZERO, 0, &nodes, &[NodeId(0), NodeId(2), NodeId::COORDINATOR]);
        assert_eq!(l.pair_caps(NodeId(0), NodeId(2)).unwrap().per_stream, 100e6);
        let us_eu = lat.iter().find(|x| (x.a, x.b) == (NodeId(0), NodeId(2))).unwrap();
        assert_eq!((us_eu.min, us_eu.max), (Duration::from_millis(45), Duration::from_millis(50)));
        assert!(!l.due(Time::from_secs_f64(3599.0), 0));
        assert!(l.due(Time::from_secs_f64(3600.0), 0));
        l.refresh(Time::from_secs_f64(3600.0), 0, &nodes, &[]);
        assert_eq!(l.pair_caps(NodeId(0), NodeId(2)).unwrap().per_stream, 50e6);
        let slow = Varying::Fixed(crate::scenario::Rate::from_bits_per_sec(8e6).unwrap());
        let (us, eu) = (RegionId(0), RegionId(1));
        l.degrade(us, eu, true, Some(&slow), None, None);
        l.refresh(Time::from_secs_f64(3700.0), 0, &nodes, &[]);
        assert_eq!(l.pair_caps(NodeId(0), NodeId(2)).unwrap().per_stream, 1e6);
        assert_eq!(l.pair_caps(NodeId(2), NodeId(0)).unwrap().per_stream, 50e6);
        l.restore(us, eu, false);
        l.refresh(Time::from_secs_f64(3800.0), 0, &nodes, &[]);
        assert_eq!(l.pair_caps(NodeId(0), NodeId(2)).unwrap().per_stream, 50e6);
    }
}
