//! `summary.json` and the pure functions that compute it (and the series the report draws) from
//! the rows and events of a run.
//!
//! Every function here sorts its input first (outer step, node id, node; events by time), so the
//! same rows in any order give the same numbers, bit for bit.

use super::csv_format::{sort_events, sort_outer_steps};
use super::schema::{EventKind, EventRow, OuterStepRow};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// What [`summarize`] needs besides the rows and events: what the backend knows about the run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunMeta {
    /// The scenario's name.
    pub scenario: String,
    /// The run's seed.
    pub seed: u64,
    /// `"sim"` or `"real"`.
    pub backend: String,
    /// Host wall-clock seconds the backend took (see [`Summary::wall_seconds`]).
    pub wall_seconds: f64,
    /// The Table-2 setting this run reproduces (a [`super::PublishedRow::key`]), if any.
    pub published: Option<String>,
    /// Inner steps per outer step (DiLoCo's H), when known; gives [`Summary::inner_step_seconds`].
    pub inner_steps_per_outer: Option<u64>,
    /// What MFU needs; without it [`Summary::mfu`] is `None`.
    pub mfu_basis: Option<MfuBasis>,
    /// Invariant violations found while the run went (empty: all held).
    pub violations: Vec<String>,
    /// The DiLoCo schedule the run used.
    pub diloco: DilocoFacts,
    /// Backend-specific figures, copied to [`Summary::extra`].
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// The model and hardware figures that turn tokens per second into MFU (reference.md, "MFU as
/// PRIME computed it"); a run's is its scenario's
/// [`mfu_basis`](crate::scenario::Scenario::mfu_basis).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct MfuBasis {
    /// Training flops per token (see [`flops_per_token`]).
    pub flops_per_token: f64,
    /// Peak dense flops of one accelerator per second (H100 SXM bf16: 989e12).
    pub peak_flops_per_gpu: f64,
    /// Accelerators per node (INTELLECT-1: 8).
    pub gpus_per_node: u32,
}

/// PRIME's training flops per token: `6 * n_non_embedding + 12 * layers * heads * head_dim *
/// seq_len` (reference.md).
pub fn flops_per_token(
    n_non_embedding: f64,
    layers: u32,
    heads: u32,
    head_dim: u32,
    seq_len: u32,
) -> f64 {
    6.0 * n_non_embedding
        + 12.0 * f64::from(layers) * f64::from(heads) * f64::from(head_dim) * f64::from(seq_len)
}

/// The DiLoCo schedule of a run, as its summary reports it (both backends take it from the
/// scenario's `[diloco]` table).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DilocoFacts {
    /// Sync, overlap or streaming.
    pub mode: crate::diloco::Mode,
    /// Streaming's fragments (1 in the other modes).
    pub fragments: u32,
    /// Inner steps of one round (the mesh's step).
    pub sync_delay: u64,
    /// Rounds (all-reduces) per outer step of `inner_steps`.
    pub rounds_per_step: u64,
}

/// `summary.json`: the figures of one run. Keys are written in this order; maps are sorted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// The scenario's name.
    pub scenario: String,
    /// The run's seed.
    pub seed: u64,
    /// `"sim"` or `"real"`.
    pub backend: String,
    /// Distinct outer steps with at least one row.
    pub outer_steps: u64,
    /// The run's duration on its own clock (simulated seconds for `sim`): the latest `end_s` or
    /// event time.
    pub simulated_seconds: f64,
    /// Host wall-clock seconds the backend took to produce the run. The one field that is not a
    /// function of the scenario and seed: a backend that wants byte-identical files writes 0.
    pub wall_seconds: f64,
    /// Compute utilisation, both definitions.
    pub utilization: Utilization,
    /// All-reduce durations, one sample per row that had one (see [`allreduce_samples`]).
    pub allreduce_seconds: AllreduceStats,
    /// Sum of `bytes_sent` over all rows.
    pub bytes_sent_total: u64,
    /// Membership changes counted from the events.
    pub membership: Membership,
    /// Whether the run's invariants held.
    pub invariants: Invariants,
    /// The Table-2 setting this run reproduces (a [`super::PublishedRow::key`]), if any.
    pub published: Option<String>,
    /// Model flops utilisation: `flops_per_token * tokens / (peak_flops_per_gpu * gpus_per_node *
    /// node-seconds)`, node-seconds being the sum of `end_s - start_s` over rows. `None` without
    /// an [`MfuBasis`] or tokens.
    pub mfu: Option<f64>,
    /// All nodes' tokens divided by `simulated_seconds`; `None` when no row counts tokens.
    pub tokens_per_second: Option<f64>,
    /// Mean loss over the nodes of the last outer step that has one.
    pub final_loss: Option<f64>,
    /// Mean held-out loss over the nodes of the last outer step that evaluated the global
    /// weights (`[real] eval_every`); `None` when none did.
    #[serde(default)]
    pub final_eval_loss: Option<f64>,
    /// Mean `compute_s` of rows that computed, divided by H; `None` when H is unknown.
    pub inner_step_seconds: Option<f64>,
    /// The DiLoCo schedule the run used.
    #[serde(default)]
    pub diloco: DilocoFacts,
    /// Backend-specific figures.
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// Compute utilisation under its two definitions.
///
/// - loco's (DESIGN.md): compute time / wall time, where a node's wall time is the sum of
///   `end_s - start_s` over its rows. Barriers, recovery, checkpoints and idling count against it.
/// - INTELLECT-1's Table 2: inner (compute) time / (inner time + all-reduce time), which ignores
///   everything else. Here it is aggregated over all rows: `sum compute / (sum compute + sum
///   allreduce)`; the report computed it from one outer step's compute and the median all-reduce.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Utilization {
    /// loco's definition over all nodes: sum of compute over sum of wall time (a mean of the
    /// nodes' utilisations weighted by their wall time). 0 when there is no wall time.
    pub mean: f64,
    /// loco's definition per node name.
    pub per_node: BTreeMap<String, f64>,
    /// Table 2's definition over all nodes. 0 when there is no compute nor all-reduce time.
    pub table2: f64,
    /// Table 2's definition per node name.
    pub table2_per_node: BTreeMap<String, f64>,
}

/// Order statistics of all-reduce durations, in seconds. Percentiles interpolate linearly between
/// the closest ranks (see [`percentile`]). All 0 when `count` is 0.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AllreduceStats {
    /// Number of samples.
    pub count: u64,
    /// 50th percentile.
    pub median: f64,
    /// 5th percentile.
    pub p5: f64,
    /// 95th percentile.
    pub p95: f64,
    /// Arithmetic mean.
    pub mean: f64,
}

/// Membership counts from the events.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Membership {
    /// The largest number of members at once: the maximum of [`active_nodes`] and of `world`.
    pub max_nodes: u32,
    /// `join` events.
    pub joins: u64,
    /// `leave` events (graceful).
    pub leaves: u64,
    /// `evict` events.
    pub evictions: u64,
    /// `crash` events.
    pub crashes: u64,
    /// Distinct epochs named by rows and events.
    pub epochs: u64,
}

/// The invariants' verdict.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Invariants {
    /// `true` when no invariant was violated.
    pub ok: bool,
    /// One line per violation, in the order found.
    pub violations: Vec<String>,
}

/// The time a node's rows account for, by where it went, and what it sent.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeTotals {
    /// The node's id (of its first row).
    pub node_id: u32,
    /// Rows (outer steps) of the node.
    pub rows: u64,
    /// Sum of `end_s - start_s`.
    pub wall_s: f64,
    /// Sum of `compute_s`.
    pub compute_s: f64,
    /// Sum of `allreduce_s`.
    pub allreduce_s: f64,
    /// Sum of `barrier_s`.
    pub barrier_s: f64,
    /// Sum of `recovery_s`.
    pub recovery_s: f64,
    /// Sum of `checkpoint_s`.
    pub checkpoint_s: f64,
    /// Sum of `outer_s`.
    pub outer_s: f64,
    /// Sum of `idle_s`.
    pub idle_s: f64,
    /// Sum of `bytes_sent`.
    pub bytes_sent: u64,
    /// Sum of `tokens`.
    pub tokens: u64,
}

impl NodeTotals {
    fn add(&mut self, r: &OuterStepRow) {
        self.rows += 1;
        self.wall_s += r.wall_s();
        self.compute_s += r.compute_s;
        self.allreduce_s += r.allreduce_s;
        self.barrier_s += r.barrier_s;
        self.recovery_s += r.recovery_s;
        self.checkpoint_s += r.checkpoint_s;
        self.outer_s += r.outer_s;
        self.idle_s += r.idle_s;
        self.bytes_sent = self.bytes_sent.saturating_add(r.bytes_sent);
        self.tokens = self.tokens.saturating_add(r.tokens);
    }

    /// loco's utilisation: `compute_s / wall_s` (0 without wall time).
    pub fn utilization(&self) -> f64 {
        ratio(self.compute_s, self.wall_s)
    }

    /// Table 2's utilisation: `compute_s / (compute_s + allreduce_s)` (0 when both are 0).
    pub fn utilization_table2(&self) -> f64 {
        ratio(self.compute_s, self.compute_s + self.allreduce_s)
    }
}

/// `num / den`, or 0 when that is not a finite number (no time at all).
fn ratio(num: f64, den: f64) -> f64 {
    let r = num / den;
    if den > 0.0 && r.is_finite() { r } else { 0.0 }
}

fn finite(x: f64) -> Option<f64> {
    x.is_finite().then_some(x)
}

fn sorted_rows(rows: &[OuterStepRow]) -> Vec<OuterStepRow> {
    let mut v = rows.to_vec();
    sort_outer_steps(&mut v);
    v
}

/// Per node name, the totals of its rows.
pub fn node_totals(rows: &[OuterStepRow]) -> BTreeMap<String, NodeTotals> {
    let mut out: BTreeMap<String, NodeTotals> = BTreeMap::new();
    for r in sorted_rows(rows) {
        out.entry(r.node.clone())
            .or_insert_with(|| NodeTotals { node_id: r.node_id, ..NodeTotals::default() })
            .add(&r);
    }
    out
}

/// What all nodes did during one outer step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepTotals {
    /// The outer step.
    pub outer_step: u64,
    /// Rows (nodes) of the step.
    pub nodes: u32,
    /// The largest `world` among the rows.
    pub world: u32,
    /// The earliest `start_s`.
    pub start_s: f64,
    /// The latest `end_s`.
    pub end_s: f64,
    /// Sums over the nodes, in seconds: compute, all-reduce, barrier, recovery, checkpoint, idle.
    pub breakdown_s: [f64; 7],
    /// The longest all-reduce (`allreduce_wall_s`, or `allreduce_s` when larger) among the
    /// rows.
    pub allreduce_max_s: f64,
    /// Sum of `bytes_sent`.
    pub bytes_sent: u64,
    /// Sum of `tokens`.
    pub tokens: u64,
    /// Sum of `retries`.
    pub retries: u64,
    /// Mean of the rows' losses, when any row has one.
    pub mean_loss: Option<f64>,
}

/// Names of [`StepTotals::breakdown_s`]'s entries, in order.
pub const BREAKDOWN_NAMES: [&str; 7] =
    ["compute", "allreduce", "barrier", "recovery", "checkpoint", "outer", "idle"];

/// The breakdown of one row, in [`BREAKDOWN_NAMES`] order.
pub fn breakdown(r: &OuterStepRow) -> [f64; 7] {
    [r.compute_s, r.allreduce_s, r.barrier_s, r.recovery_s, r.checkpoint_s, r.outer_s, r.idle_s]
}

/// One entry per outer step with rows, in increasing order.
pub fn step_totals(rows: &[OuterStepRow]) -> Vec<StepTotals> {
    let mut out: Vec<StepTotals> = Vec::new();
    let mut losses: Vec<Vec<f64>> = Vec::new();
    for r in sorted_rows(rows) {
        if out.last().is_none_or(|s| s.outer_step != r.outer_step) {
            out.push(StepTotals {
                outer_step: r.outer_step,
                start_s: f64::INFINITY,
                end_s: f64::NEG_INFINITY,
                ..StepTotals::default()
            });
            losses.push(Vec::new());
        }
        let (Some(s), Some(l)) = (out.last_mut(), losses.last_mut()) else {
            continue;
        };
        s.nodes += 1;
        s.world = s.world.max(r.world);
        s.start_s = s.start_s.min(r.start_s);
        s.end_s = s.end_s.max(r.end_s);
        for (acc, x) in s.breakdown_s.iter_mut().zip(breakdown(&r)) {
            *acc += x;
        }
        s.allreduce_max_s = s.allreduce_max_s.max(r.allreduce_wall_s.max(r.allreduce_s));
        s.bytes_sent = s.bytes_sent.saturating_add(r.bytes_sent);
        s.tokens = s.tokens.saturating_add(r.tokens);
        s.retries += u64::from(r.retries);
        if let Some(loss) = r.loss.and_then(finite) {
            l.push(loss);
        }
    }
    for (s, l) in out.iter_mut().zip(&losses) {
        if !l.is_empty() {
            s.mean_loss = Some(l.iter().sum::<f64>() / l.len() as f64);
        }
        s.start_s = finite(s.start_s).unwrap_or(0.0);
        s.end_s = finite(s.end_s).unwrap_or(0.0);
    }
    out
}

/// The `p`-th percentile (0 to 100, clamped) of `sorted` (ascending, finite): linear interpolation
/// between the closest ranks (numpy's default, Hyndman and Fan's type 7): with `h = (n - 1) * p /
/// 100`, `x[floor h] + (h - floor h) * (x[floor h + 1] - x[floor h])`. `None` when empty.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    let p = if p.is_nan() { 50.0 } else { p.clamp(0.0, 100.0) };
    let h = last as f64 * p / 100.0;
    let lo = h.floor() as usize;
    let hi = (lo + 1).min(last);
    let frac = h - lo as f64;
    Some(sorted[lo] + frac * (sorted[hi] - sorted[lo]))
}

/// The all-reduce durations of the rows that had one, ascending: `allreduce_wall_s` (the time
/// beside the inner steps counts), or `allreduce_s` when larger (rows that do not give the
/// wall time), when above 0 and finite. In an overlapped run (some row's all-reduce outlasted
/// the wait in it) only `allreduce_wall_s` counts: there a row's `allreduce_s` is the wait for
/// the round before's all-reduce, and a round between two syncs (`sync_delay`) has none of
/// its own.
pub fn allreduce_samples(rows: &[OuterStepRow]) -> Vec<f64> {
    let overlapped = rows.iter().any(|r| r.allreduce_wall_s > r.allreduce_s + 1e-9);
    let mut v: Vec<f64> = rows
        .iter()
        .map(
            |r| if overlapped { r.allreduce_wall_s } else { r.allreduce_wall_s.max(r.allreduce_s) },
        )
        .filter(|x| x.is_finite() && *x > 0.0)
        .collect();
    v.sort_by(f64::total_cmp);
    v
}

/// [`AllreduceStats`] of samples sorted ascending.
pub fn allreduce_stats(sorted: &[f64]) -> AllreduceStats {
    if sorted.is_empty() {
        return AllreduceStats::default();
    }
    let pct = |p| percentile(sorted, p).unwrap_or(0.0);
    AllreduceStats {
        count: sorted.len() as u64,
        median: pct(50.0),
        p5: pct(5.0),
        p95: pct(95.0),
        mean: sorted.iter().sum::<f64>() / sorted.len() as f64,
    }
}

/// How many nodes were members from a time on: one point per event that changed the count.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ActivePoint {
    /// Seconds since the run started.
    pub time_s: f64,
    /// Members from then on.
    pub active: u32,
}

/// Members over time, from the events: `start` (with a node), `admit` and `join` add the node;
/// `leave`, `crash`, `evict` and `stop` (with a node) remove it. A node is counted once however
/// many events name it. The first point is at time 0 with 0 members.
pub fn active_nodes(events: &[EventRow]) -> Vec<ActivePoint> {
    let mut ev = events.to_vec();
    sort_events(&mut ev);
    let mut members: BTreeSet<&str> = BTreeSet::new();
    let mut out = vec![ActivePoint { time_s: 0.0, active: 0 }];
    for e in &ev {
        let Some(node) = e.node.as_deref() else {
            continue;
        };
        let changed = match e.kind {
            EventKind::Start | EventKind::Admit | EventKind::Join => members.insert(node),
            EventKind::Leave | EventKind::Crash | EventKind::Evict | EventKind::Stop => {
                members.remove(node)
            }
            _ => false,
        };
        if changed {
            let active = u32::try_from(members.len()).unwrap_or(u32::MAX);
            let time_s = finite(e.time_s).unwrap_or(0.0).max(0.0);
            match out.last_mut() {
                Some(last) if last.time_s == time_s => last.active = active,
                _ => out.push(ActivePoint { time_s, active }),
            }
        }
    }
    out
}

/// Membership counts of the rows and events (see [`Membership`]).
pub fn membership(rows: &[OuterStepRow], events: &[EventRow]) -> Membership {
    let count = |k: EventKind| events.iter().filter(|e| e.kind == k).count() as u64;
    let from_events = active_nodes(events).iter().map(|p| p.active).max().unwrap_or(0);
    let from_rows = rows.iter().map(|r| r.world).max().unwrap_or(0);
    let epochs: BTreeSet<u64> =
        rows.iter().map(|r| r.epoch).chain(events.iter().filter_map(|e| e.epoch)).collect();
    Membership {
        max_nodes: from_events.max(from_rows),
        joins: count(EventKind::Join),
        leaves: count(EventKind::Leave),
        evictions: count(EventKind::Evict),
        crashes: count(EventKind::Crash),
        epochs: epochs.len() as u64,
    }
}

/// The [`Summary`] of a run: pure, and independent of the order of `rows` and `events`.
pub fn summarize(meta: &RunMeta, rows: &[OuterStepRow], events: &[EventRow]) -> Summary {
    let rows = sorted_rows(rows);
    let totals = node_totals(&rows);
    let mut all = NodeTotals::default();
    for r in &rows {
        all.add(r);
    }
    let utilization = Utilization {
        mean: all.utilization(),
        per_node: totals.iter().map(|(n, t)| (n.clone(), t.utilization())).collect(),
        table2: all.utilization_table2(),
        table2_per_node: totals.iter().map(|(n, t)| (n.clone(), t.utilization_table2())).collect(),
    };
    let simulated_seconds = rows
        .iter()
        .map(|r| r.end_s)
        .chain(events.iter().map(|e| e.time_s))
        .filter(|x| x.is_finite())
        .fold(0.0, f64::max);
    let tokens = all.tokens;
    let tokens_per_second =
        (tokens > 0).then(|| ratio(tokens as f64, simulated_seconds)).filter(|x| *x > 0.0);
    let mfu = meta.mfu_basis.and_then(|b| {
        let den = b.peak_flops_per_gpu * f64::from(b.gpus_per_node) * all.wall_s;
        (tokens > 0).then(|| ratio(b.flops_per_token * tokens as f64, den)).filter(|x| *x > 0.0)
    });
    let final_loss = step_totals(&rows).iter().rev().find_map(|s| s.mean_loss);
    let final_eval_loss = rows
        .iter()
        .filter_map(|r| r.eval_loss.filter(|l| l.is_finite()).map(|l| (r.outer_step, l)))
        .max_by_key(|(step, _)| *step)
        .map(|(last, _)| {
            let at: Vec<f64> = rows
                .iter()
                .filter(|r| r.outer_step == last)
                .filter_map(|r| r.eval_loss.filter(|l| l.is_finite()))
                .collect();
            at.iter().sum::<f64>() / at.len() as f64
        });
    let inner_step_seconds = meta.inner_steps_per_outer.filter(|h| *h > 0).and_then(|h| {
        let computed: Vec<f64> =
            rows.iter().map(|r| r.compute_s).filter(|c| c.is_finite() && *c > 0.0).collect();
        (!computed.is_empty())
            .then(|| computed.iter().sum::<f64>() / computed.len() as f64 / h as f64)
    });
    let outer_steps: BTreeSet<u64> = rows.iter().map(|r| r.outer_step).collect();
    Summary {
        scenario: meta.scenario.clone(),
        seed: meta.seed,
        backend: meta.backend.clone(),
        outer_steps: outer_steps.len() as u64,
        simulated_seconds,
        wall_seconds: finite(meta.wall_seconds).unwrap_or(0.0),
        utilization,
        allreduce_seconds: allreduce_stats(&allreduce_samples(&rows)),
        bytes_sent_total: all.bytes_sent,
        membership: membership(&rows, events),
        invariants: Invariants {
            ok: meta.violations.is_empty(),
            violations: meta.violations.clone(),
        },
        published: meta.published.clone(),
        mfu,
        tokens_per_second,
        final_loss,
        final_eval_loss,
        inner_step_seconds,
        diloco: meta.diloco,
        extra: meta.extra.clone(),
    }
}
