//! The coordinator's two verdicts on what the members report of their values: the guard on the
//! averaged update (from the norms members send with `Done`) and the comparison of the
//! replicas' digests (from the state members say they hold at the barrier). Pure functions of
//! the mesh's state, as every decision is.

use super::state::MeshState;
use super::{EvictReason, MeshConfig};
use crate::ids::NodeId;

/// Why the guard refused an update ([`Decision::RefuseUpdate`](super::decide::Decision::RefuseUpdate)).
#[derive(Clone, Debug, PartialEq)]
pub struct Refusal {
    /// The largest norm of the average that a member reported (infinite for NaN).
    pub norm: f64,
    /// The median of the committed norms kept, when there are enough to judge by.
    pub median: Option<f64>,
    /// The member whose own pseudo-gradient norm is beyond the ratio of the others' median.
    pub outlier: Option<NodeId>,
}

/// Members whose weights differ from a strict majority's: of those that arrived at this step's
/// barrier holding a state of exactly this many applied steps with a digest, the digest most of
/// them reported, when more than half did; every other one of them has diverged. Id order.
pub(super) fn diverged(s: &MeshState) -> Vec<(NodeId, EvictReason)> {
    let reports: Vec<(NodeId, crate::digest::WeightsDigest)> = s
        .members
        .iter()
        .filter(|(_, m)| m.arrived == Some(s.outer_step))
        .filter_map(|(&id, m)| {
            let h = m.held_at_barrier?;
            (h.outer_step == s.outer_step).then_some(())?;
            h.digest.map(|d| (id, d))
        })
        .collect();
    let mut counts: std::collections::BTreeMap<_, usize> = std::collections::BTreeMap::new();
    for (_, d) in &reports {
        *counts.entry(*d).or_default() += 1;
    }
    let Some((&top, &n)) = counts.iter().max_by_key(|(_, n)| **n) else { return Vec::new() };
    if n * 2 <= reports.len() {
        return Vec::new();
    }
    reports
        .into_iter()
        .filter(|(_, d)| *d != top)
        .map(|(id, _)| (id, EvictReason::Diverged))
        .collect()
}

/// The state a strict majority of the members that arrived at this step's barrier reported
/// holding (outer steps applied and weights digest, `None` digests counted as one more value):
/// what a joiner must receive at this boundary ([`MeshMsg::Sync`](super::MeshMsg::Sync)'s
/// `vouched`). `None` without a strict majority, or when any of them reported a state of
/// another step than the mesh's.
pub(super) fn vouched(s: &MeshState) -> Option<super::Held> {
    let held: Vec<super::Held> = s
        .members
        .values()
        .filter(|m| m.synced && m.arrived == Some(s.outer_step))
        .filter_map(|m| m.held_at_barrier)
        .collect();
    // Members at this barrier hold exactly this many applied steps; a report of another (a
    // state lent, or one behind a restarted coordinator's count) vouches for nothing.
    if held.iter().any(|h| h.outer_step != s.outer_step) {
        return None;
    }
    let mut counts: std::collections::BTreeMap<_, usize> = std::collections::BTreeMap::new();
    for h in &held {
        *counts.entry((h.outer_step, h.digest)).or_default() += 1;
    }
    let (&(outer_step, digest), &n) = counts.iter().max_by_key(|(_, n)| **n)?;
    (n * 2 > held.len()).then_some(super::Held { outer_step, digest })
}

/// The norm of the current attempt's average as the members reported it: the largest (every
/// replica holds the same bits, so they agree unless one lies or errs; NaN counts as
/// infinite). `None` when nobody reported one (values that are not real, or the guard off).
pub(super) fn reported_norm(s: &MeshState) -> Option<f64> {
    s.members.values().filter_map(|m| m.norms.map(|n| nan_as_infinite(n.average))).reduce(f64::max)
}

/// A norm as the guard compares it: NaN (a value that is not finite) counts as infinite.
fn nan_as_infinite(x: f64) -> f64 {
    if x.is_nan() { f64::INFINITY } else { x }
}

/// The median of `xs` (the mean of the middle two for an even count; `None` when empty).
fn median(mut xs: Vec<f64>) -> Option<f64> {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(xs[n / 2]),
        _ => Some((xs[n / 2 - 1] + xs[n / 2]) / 2.0),
    }
}

/// The guard on the averaged update ([`MeshConfig::max_update_ratio`]): refused when its norm
/// is not finite, or, once [`UPDATE_MIN_HISTORY`](super::UPDATE_MIN_HISTORY) committed norms
/// are kept, above the ratio times their median. Names the member whose own pseudo-gradient
/// norm is above the ratio times the median of the others', if one is.
pub(super) fn guard(s: &MeshState, cfg: &MeshConfig) -> Option<Refusal> {
    let ratio = cfg.max_update_ratio;
    if ratio <= 0.0 {
        return None;
    }
    let norm = reported_norm(s)?;
    let kept = s.update_norms.iter().copied().collect::<Vec<_>>();
    let typical = (kept.len() >= super::UPDATE_MIN_HISTORY).then(|| median(kept)).flatten();
    let refused = !norm.is_finite() || typical.is_some_and(|m| norm > ratio * m);
    if !refused {
        return None;
    }
    let own: Vec<(NodeId, f64)> = s
        .members
        .iter()
        .filter_map(|(&id, m)| m.norms.and_then(|n| n.own).map(|o| (id, nan_as_infinite(o))))
        .collect();
    let top = own.iter().copied().max_by(|a, b| a.1.total_cmp(&b.1));
    let outlier = top.and_then(|(id, o)| {
        let others = own.iter().filter(|(i, _)| *i != id).map(|&(_, x)| x).collect();
        median(others).filter(|m| o > ratio * m).map(|_| id)
    });
    Some(Refusal { norm, median: typical, outlier })
}
