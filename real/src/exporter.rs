//! A running process's metrics in Prometheus's exposition format, served over HTTP on
//! `--metrics-addr` (`GET /metrics`).
//!
//! The figures come from the rows and events the process writes to its metrics file (the same
//! [`MetricsLine`]s the launch and the report read: no second accounting), and, on the
//! coordinator, from the mesh's state. Names follow Prometheus's conventions: a `loco_` prefix,
//! units in names, counters ending in `_total`.
//!
//! The metrics and what each means are listed in `docs/real-worker.md` ("Metrics for
//! Prometheus").

use crate::metrics::MetricsLine;
use crate::tcp::TcpStats;
use loco_core::ids::NodeId;
use loco_core::mesh::MeshState;
use loco_core::metrics::EventKind;
use loco_core::time::Time;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

type Labels = Vec<(&'static str, String)>;
type FloatGauge = Gauge<f64, AtomicU64>;
type FloatCounter = Counter<f64, AtomicU64>;

/// The metrics of one process, shared between the loop that updates them and the server that
/// encodes them. Clones share one registry.
#[derive(Clone)]
pub struct Exporter(Arc<Inner>);

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporter").field("inner_steps", &self.0.inner_steps).finish()
    }
}

struct Inner {
    registry: Registry,
    /// Inner steps per outer step (for the mean inner-step time); 0 on the coordinator.
    inner_steps: u64,
    events: Family<Labels, Counter>,
    epoch: Gauge,
    members: Gauge,
    outer_step: Gauge,
    outer_steps: Counter,
    tokens: Counter,
    loss: FloatGauge,
    allreduce: Histogram,
    sent: Counter,
    compute: FloatCounter,
    step: FloatCounter,
    utilization: FloatGauge,
    inner_step: FloatGauge,
    recovery: FloatCounter,
    retries: Counter,
    queued: Gauge,
    heartbeat_age: Family<Labels, FloatGauge>,
    peer_sent: Family<Labels, Counter>,
    recovery_received: Counter,
    recovery_progress: FloatGauge,
    /// The bytes of the transfer under way last seen (to count what came since).
    recovery_held: AtomicU64,
    /// The transport whose bytes per peer are read at each scrape, and the peers' names.
    transport: std::sync::OnceLock<(Arc<TcpStats>, BTreeMap<NodeId, String>)>,
}

impl Exporter {
    /// The metrics of worker `node`, whose outer steps have `inner_steps` inner steps.
    pub fn worker(node: &str, inner_steps: u64) -> Exporter {
        Exporter::new(Some(node), inner_steps)
    }

    /// The coordinator's metrics.
    pub fn coordinator() -> Exporter {
        Exporter::new(None, 0)
    }

    fn new(node: Option<&str>, inner_steps: u64) -> Exporter {
        let mut r = Registry::with_prefix("loco");
        let events = Family::<Labels, Counter>::default();
        r.register("events", "Events seen, by kind", events.clone());
        let epoch = Gauge::default();
        r.register("epoch", "The epoch of the last outer step or formed epoch", epoch.clone());
        let members = Gauge::default();
        r.register("members", "Members of that epoch", members.clone());
        let outer_step = Gauge::default();
        r.register("outer_step", "The outer step last finished or under way", outer_step.clone());
        let allreduce = Histogram::new(exponential_buckets(0.01, 2.0, 20));
        let (outer_steps, tokens, sent, retries) = Default::default();
        let (loss, utilization, inner_step) = Default::default();
        let (compute, step, recovery) = Default::default();
        let queued = Gauge::default();
        let heartbeat_age = Family::<Labels, FloatGauge>::default();
        let peer_sent = Family::<Labels, Counter>::default();
        let recovery_received = Counter::default();
        let recovery_progress = FloatGauge::default();
        let p = peer_sent.clone();
        r.register_with_unit("peer_sent", "Bytes written to each peer", Unit::Bytes, p);
        match node {
            Some(name) => {
                let info = Info::new(vec![("node", name.to_string())]);
                r.register("node", "The node this process runs", info);
                r.register("outer_steps", "Outer steps finished", Counter::clone(&outer_steps));
                r.register("tokens", "Tokens trained on", Counter::clone(&tokens));
                r.register("loss", "Loss of the last outer step", FloatGauge::clone(&loss));
                let s = Unit::Seconds;
                r.register_with_unit("allreduce", "All-reduce time", s.clone(), allreduce.clone());
                r.register_with_unit("sent", "Bytes sent", Unit::Bytes, Counter::clone(&sent));
                let c = FloatCounter::clone(&compute);
                r.register_with_unit("compute", "Inner-step compute time", s.clone(), c);
                let w = FloatCounter::clone(&step);
                r.register_with_unit("step", "Wall time of finished outer steps", s.clone(), w);
                let u = FloatGauge::clone(&utilization);
                r.register("compute_utilization_ratio", "Compute / wall of the last step", u);
                let i = FloatGauge::clone(&inner_step);
                r.register_with_unit("inner_step", "Mean inner-step time", s.clone(), i);
                let rc = FloatCounter::clone(&recovery);
                r.register_with_unit("recovery", "Time receiving the state", s, rc);
                r.register("retries", "All-reduce attempts retried", Counter::clone(&retries));
                let rr = Counter::clone(&recovery_received);
                r.register_with_unit("recovery_received", "State bytes received", Unit::Bytes, rr);
                let rp = FloatGauge::clone(&recovery_progress);
                let help = "Share of the state transfer under way received (0 when none)";
                r.register("recovery_progress_ratio", help, rp);
            }
            None => {
                r.register("queued_joiners", "Joiners waiting for a boundary", queued.clone());
                let h = heartbeat_age.clone();
                r.register_with_unit(
                    "heartbeat_age",
                    "Since each member was heard",
                    Unit::Seconds,
                    h,
                );
            }
        }
        Exporter(Arc::new(Inner {
            registry: r,
            inner_steps,
            events,
            epoch,
            members,
            outer_step,
            outer_steps,
            tokens,
            loss,
            allreduce,
            sent,
            compute,
            step,
            utilization,
            inner_step,
            recovery,
            retries,
            queued,
            heartbeat_age,
            peer_sent,
            recovery_received,
            recovery_progress,
            recovery_held: AtomicU64::new(0),
            transport: std::sync::OnceLock::new(),
        }))
    }

    /// Counts what the process wrote to its metrics file.
    pub fn observe(&self, line: &MetricsLine) {
        let m = &self.0;
        match line {
            MetricsLine::Row(row) => {
                m.epoch.set(clamp(row.epoch));
                m.members.set(i64::from(row.world));
                m.outer_step.set(clamp(row.outer_step));
                m.outer_steps.inc();
                m.tokens.inc_by(row.tokens);
                if let Some(l) = row.loss.filter(|l| l.is_finite()) {
                    m.loss.set(l);
                }
                m.allreduce.observe(row.allreduce_s.max(0.0));
                m.sent.inc_by(row.bytes_sent);
                let wall = (row.end_s - row.start_s).max(0.0);
                m.compute.inc_by(row.compute_s.max(0.0));
                m.step.inc_by(wall);
                if wall > 0.0 {
                    m.utilization.set((row.compute_s / wall).clamp(0.0, 1.0));
                }
                if m.inner_steps > 0 {
                    m.inner_step.set(row.compute_s.max(0.0) / m.inner_steps as f64);
                }
                m.recovery.inc_by(row.recovery_s.max(0.0));
                m.retries.inc_by(u64::from(row.retries));
            }
            MetricsLine::Event(e) => {
                m.events.get_or_create(&vec![("kind", e.kind.as_str().to_string())]).inc();
                if e.kind == EventKind::Epoch
                    && let Some(ep) = e.epoch
                {
                    m.epoch.set(clamp(ep));
                }
            }
            MetricsLine::EpochFormed { epoch, members } => {
                m.epoch.set(clamp(epoch.0));
                m.members.set(clamp(members.len() as u64));
            }
            MetricsLine::Counters { .. }
            | MetricsLine::Resources { .. }
            | MetricsLine::Check { .. } => {}
        }
    }

    /// A worker's state transfer: `(received, of)` bytes of the transfer under way, `None` when
    /// there is none. Received bytes are counted once each; a transfer that starts over counts
    /// from its new start.
    pub fn recovery(&self, progress: Option<(u64, u64)>) {
        let m = &self.0;
        let (held, total) = progress.unwrap_or((0, 0));
        let last = m.recovery_held.swap(held, std::sync::atomic::Ordering::Relaxed);
        m.recovery_received.inc_by(held.checked_sub(last).unwrap_or(held));
        let ratio = if total > 0 { (held as f64 / total as f64).clamp(0.0, 1.0) } else { 0.0 };
        m.recovery_progress.set(ratio);
    }

    /// The coordinator's view at `now`: its outer step, members, queue, and how long ago each
    /// member was heard (`names` gives the nodes' names).
    pub fn mesh(&self, s: &MeshState, now: Time, name: impl Fn(loco_core::ids::NodeId) -> String) {
        let m = &self.0;
        m.outer_step.set(clamp(s.outer_step));
        m.members.set(clamp(s.members.len() as u64));
        m.queued.set(clamp(s.queue.len() as u64));
        m.heartbeat_age.clear();
        for (&id, info) in &s.members {
            let age = (now - info.last_seen).as_secs_f64();
            m.heartbeat_age.get_or_create(&vec![("node", name(id))]).set(age);
        }
    }

    /// Reads the bytes per peer of `stats` at each scrape (`names` names the peers; an id not
    /// in it is shown as its number). The first transport given stays.
    pub fn watch_transport(&self, stats: Arc<TcpStats>, names: BTreeMap<NodeId, String>) {
        let _ = self.0.transport.set((stats, names));
    }

    /// The metrics in the OpenMetrics text format (which Prometheus reads).
    pub fn encode(&self) -> String {
        if let Some((stats, names)) = self.0.transport.get() {
            for (id, total) in stats.sent_by_peer() {
                let peer = names.get(&id).cloned().unwrap_or_else(|| id.to_string());
                let c = self.0.peer_sent.get_or_create(&vec![("peer", peer)]);
                // Counters only go up: add what was written since the last scrape.
                c.inc_by(total.saturating_sub(c.get()));
            }
        }
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.0.registry);
        out
    }
}

fn clamp(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The content type of [`Exporter::encode`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[cfg(test)]
mod tests {
    use super::*;
    use loco_core::metrics::{EventRow, OuterStepRow};

    fn row(outer_step: u64) -> OuterStepRow {
        OuterStepRow {
            outer_step,
            node: "a".into(),
            node_id: 0,
            epoch: 2,
            world: 3,
            start_s: 0.0,
            end_s: 10.0,
            compute_s: 8.0,
            allreduce_s: 1.5,
            barrier_s: 0.0,
            recovery_s: 0.0,
            checkpoint_s: 0.0,
            outer_s: 0.0,
            idle_s: 0.0,
            bytes_sent: 100,
            retries: 1,
            tokens: 256,
            loss: Some(2.5),
            weights_hash: None,
            weight: 1.0,
            allreduce_wall_s: 1.5,
            eval_loss: None,
        }
    }

    fn value(text: &str, name: &str) -> Option<f64> {
        text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
    }

    /// Rows and events move the counters and set the gauges; the text ends as OpenMetrics
    /// requires.
    #[test]
    fn rows_and_events_move_the_figures() {
        let e = Exporter::worker("a", 4);
        e.observe(&MetricsLine::Row(row(0)));
        e.observe(&MetricsLine::Row(row(1)));
        e.observe(&MetricsLine::Event(EventRow::new(1.0, EventKind::Evict)));
        let t = e.encode();
        assert_eq!(value(&t, "loco_outer_steps_total"), Some(2.0), "{t}");
        assert_eq!(value(&t, "loco_tokens_total"), Some(512.0), "{t}");
        assert_eq!(value(&t, "loco_sent_bytes_total"), Some(200.0), "{t}");
        assert_eq!(value(&t, "loco_outer_step"), Some(1.0), "{t}");
        assert_eq!(value(&t, "loco_members"), Some(3.0), "{t}");
        assert_eq!(value(&t, "loco_compute_utilization_ratio"), Some(0.8), "{t}");
        assert_eq!(value(&t, "loco_inner_step_seconds"), Some(2.0), "{t}");
        assert_eq!(value(&t, "loco_allreduce_seconds_count"), Some(2.0), "{t}");
        assert_eq!(value(&t, "loco_events_total{kind=\"evict\"}"), Some(1.0), "{t}");
        assert!(t.contains("loco_node_info{node=\"a\"} 1"), "{t}");
        assert!(t.ends_with("# EOF\n"), "{t}");
    }

    /// Received state bytes are counted once each, across a transfer that starts over; the
    /// ratio follows the transfer under way and is 0 without one.
    #[test]
    fn a_transfer_s_bytes_count_once_and_its_share_shows() {
        let e = Exporter::worker("a", 4);
        let seen = |e: &Exporter| {
            let t = e.encode();
            let got = value(&t, "loco_recovery_received_bytes_total");
            (got, value(&t, "loco_recovery_progress_ratio"))
        };
        e.recovery(Some((0, 100)));
        e.recovery(Some((40, 100)));
        assert_eq!(seen(&e), (Some(40.0), Some(0.4)));
        e.recovery(Some((40, 100)));
        e.recovery(Some((10, 100))); // started over
        e.recovery(Some((100, 100)));
        assert_eq!(seen(&e), (Some(140.0), Some(1.0)));
        e.recovery(None);
        assert_eq!(seen(&e), (Some(140.0), Some(0.0)));
    }
}
