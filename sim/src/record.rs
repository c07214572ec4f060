//! What a run leaves behind (rows, events) and the invariants checked as it goes.
//!
//! Every host writes into one [`Recorder`] (all hosts run on one thread). The invariants of
//! issue 4:
//!
//! - **members agree on each epoch**: every member's view of an epoch (from `View`, `Sync`,
//!   `Release`, `Skip`) must equal the membership the coordinator formed;
//! - **bit-identical outer weights**: with real numerics, every synced member's outer weights
//!   after outer step `k` must hash the same;
//! - **no contribution lost or counted twice**: every chunk of every finished all-reduce must
//!   carry a weight sum equal to the sum of the ring's weights, and each node's weight must be 1
//!   exactly when it has a pseudo-gradient for the step;
//! - **no deadlock**: checked by the driver (no progress within a bound derived from the mesh's
//!   deadlines, or the duration limit reached).

use loco_core::metrics::{EventKind, EventRow, OuterStepRow};
use loco_core::{Epoch, NodeId, Time};
use std::collections::{BTreeMap, BTreeSet};

/// Largest number of violations kept verbatim (the rest are counted).
const MAX_VIOLATIONS: usize = 100;

/// The run's record. See the module documentation.
#[derive(Default)]
pub struct Recorder {
    names: BTreeMap<NodeId, String>,
    /// Events, in the order recorded.
    pub events: Vec<EventRow>,
    /// Rows, in the order recorded.
    pub rows: Vec<OuterStepRow>,
    violations: Vec<String>,
    dropped_violations: u64,
    /// Memberships formed by the coordinator.
    epochs: BTreeMap<Epoch, Vec<NodeId>>,
    /// First hash reported per outer step, and by whom.
    hashes: BTreeMap<u64, (String, NodeId)>,
    /// Outer steps committed or skipped by the coordinator, and when the last one was.
    steps_done: u64,
    last_step: Option<u64>,
    last_progress: Time,
    /// Rows recorded per outer step.
    rows_per_step: BTreeMap<u64, BTreeSet<NodeId>>,
    /// Members that stopped because the coordinator went silent.
    coordinator_lost: BTreeSet<NodeId>,
    stale_frames: u64,
    allreduces_checked: u64,
}

fn fmt_nodes(v: &[NodeId]) -> String {
    let s: Vec<String> = v.iter().map(ToString::to_string).collect();
    format!("[{}]", s.join(" "))
}

impl Recorder {
    /// A recorder that names node `id` by `names[id]`.
    pub fn new(names: BTreeMap<NodeId, String>) -> Self {
        Recorder { names, ..Recorder::default() }
    }

    /// The scenario name of a node (`coordinator` for the coordinator).
    pub fn name(&self, id: NodeId) -> String {
        self.names.get(&id).cloned().unwrap_or_else(|| id.to_string())
    }

    /// Records an event at `now`.
    pub fn event(
        &mut self,
        now: Time,
        kind: EventKind,
        node: Option<NodeId>,
        epoch: Option<Epoch>,
        detail: impl Into<String>,
    ) {
        let mut e = EventRow::new(now.as_secs_f64(), kind).detail(detail);
        if let Some(n) = node {
            e = e.node(self.name(n));
        }
        if let Some(ep) = epoch {
            e = e.epoch(ep.0);
        }
        self.events.push(e);
    }

    /// Records an event row as it is.
    pub fn push_event(&mut self, e: EventRow) {
        self.events.push(e);
    }

    /// Records a violated invariant.
    pub fn violation(&mut self, msg: String) {
        tracing::warn!(target: "loco_sim", "invariant violated: {msg}");
        if self.violations.len() < MAX_VIOLATIONS {
            self.violations.push(msg);
        } else {
            self.dropped_violations += 1;
        }
    }

    /// The violations so far (with a last line counting those not kept).
    pub fn violations(&self) -> Vec<String> {
        let mut v = self.violations.clone();
        if self.dropped_violations > 0 {
            v.push(format!("... and {} more violations", self.dropped_violations));
        }
        v
    }

    /// Whether any invariant was violated.
    pub fn has_violations(&self) -> bool {
        !self.violations.is_empty()
    }

    /// The coordinator formed `epoch` with `members`.
    pub fn epoch_formed(&mut self, epoch: Epoch, members: &[NodeId]) {
        let mut m = members.to_vec();
        m.sort();
        if let Some(prev) = self.epochs.get(&epoch) {
            if *prev != m {
                let msg = format!(
                    "epoch {epoch} formed twice with different members: {} and {}",
                    fmt_nodes(prev),
                    fmt_nodes(&m)
                );
                self.violation(msg);
            }
            return;
        }
        self.epochs.insert(epoch, m);
    }

    /// Member `node` holds `members` as the membership of `epoch` (`what` names the message).
    pub fn member_view(&mut self, node: NodeId, epoch: Epoch, members: &[NodeId], what: &str) {
        let mut m = members.to_vec();
        m.sort();
        m.dedup();
        let msg = match self.epochs.get(&epoch) {
            None => format!(
                "{} holds {what} membership {} for epoch {epoch}, which the coordinator never formed",
                self.name(node),
                fmt_nodes(&m)
            ),
            Some(formed) if *formed != m => format!(
                "members disagree on epoch {epoch}: {} holds {} ({what}), the coordinator formed {}",
                self.name(node),
                fmt_nodes(&m),
                fmt_nodes(formed)
            ),
            Some(_) => return,
        };
        self.violation(msg);
    }

    /// Node `node` finished outer step `step` with outer weights hashing to `hash`.
    pub fn weights_after(&mut self, node: NodeId, step: u64, hash: &str) {
        match self.hashes.get(&step) {
            None => {
                self.hashes.insert(step, (hash.to_owned(), node));
            }
            Some((h, first)) if h != hash => {
                let msg = format!(
                    "outer weights differ after outer step {step}: {} has {hash}, {} has {h}",
                    self.name(node),
                    self.name(*first)
                );
                self.violation(msg);
            }
            Some(_) => {}
        }
    }

    /// Node `node` finished an all-reduce whose chunks carried `sums` as their weight sums; the
    /// ring's weights sum to `total`.
    pub fn allreduce_weights(&mut self, node: NodeId, what: &str, sums: &[f64], total: f64) {
        self.allreduces_checked += 1;
        let tol = 1e-6 * total.abs().max(1.0);
        if let Some(bad) = sums.iter().find(|s| (*s - total).abs() > tol) {
            let msg = format!(
                "{what}: {} saw a chunk with weight sum {bad} but the ring's weights sum to {total}: \
                 a contribution was lost or counted twice",
                self.name(node)
            );
            self.violation(msg);
        }
    }

    /// The coordinator committed (or skipped) outer step `step` at `now`.
    pub fn step_done(&mut self, now: Time, step: u64) {
        self.steps_done += 1;
        self.last_step = Some(step);
        self.last_progress = now;
    }

    /// Outer steps committed or skipped so far.
    pub fn steps_done(&self) -> u64 {
        self.steps_done
    }

    /// The last outer step committed or skipped.
    pub fn last_step(&self) -> Option<u64> {
        self.last_step
    }

    /// When the last outer step was committed or skipped (zero before any).
    pub fn last_progress(&self) -> Time {
        self.last_progress
    }

    /// Resets the progress clock (e.g. when a mesh forms again).
    pub fn touch(&mut self, now: Time) {
        self.last_progress = self.last_progress.max(now);
    }

    /// Adds a row.
    pub fn row(&mut self, row: OuterStepRow) {
        self.rows_per_step.entry(row.outer_step).or_default().insert(NodeId(row.node_id));
        self.rows.push(row);
    }

    /// The nodes that recorded a row for `step`.
    pub fn rows_of(&self, step: u64) -> BTreeSet<NodeId> {
        self.rows_per_step.get(&step).cloned().unwrap_or_default()
    }

    /// The membership the coordinator formed for `epoch`.
    pub fn epoch_members(&self, epoch: Epoch) -> Option<&[NodeId]> {
        self.epochs.get(&epoch).map(Vec::as_slice)
    }

    /// The latest epoch formed.
    pub fn latest_epoch(&self) -> Option<(Epoch, &[NodeId])> {
        self.epochs.iter().next_back().map(|(e, m)| (*e, m.as_slice()))
    }

    /// A member stopped because the coordinator went silent; true when it had not already.
    pub fn coordinator_lost(&mut self, node: NodeId) -> bool {
        self.coordinator_lost.insert(node)
    }

    /// A node was admitted again after losing the coordinator.
    pub fn coordinator_found(&mut self, node: NodeId) {
        self.coordinator_lost.remove(&node);
    }

    /// Whether `node` lost the coordinator and has not been admitted since.
    pub fn has_lost_coordinator(&self, node: NodeId) -> bool {
        self.coordinator_lost.contains(&node)
    }

    /// How many nodes lost the coordinator and have not been admitted since.
    pub fn coordinator_lost_count(&self) -> usize {
        self.coordinator_lost.len()
    }

    /// Counts collective frames of older epochs that were rejected.
    pub fn stale(&mut self, n: u64) {
        self.stale_frames += n;
    }

    /// Stale frames rejected so far.
    pub fn stale_frames(&self) -> u64 {
        self.stale_frames
    }

    /// All-reduces whose weights were checked.
    pub fn allreduces_checked(&self) -> u64 {
        self.allreduces_checked
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec() -> Recorder {
        Recorder::new((0..4).map(|i| (NodeId(i), format!("n-{i}"))).collect())
    }

    #[test]
    fn epoch_views_must_match_the_coordinator() {
        let mut r = rec();
        r.epoch_formed(Epoch(1), &[NodeId(1), NodeId(0)]);
        r.member_view(NodeId(0), Epoch(1), &[NodeId(0), NodeId(1)], "view");
        assert!(!r.has_violations());
        r.member_view(NodeId(1), Epoch(1), &[NodeId(1)], "release");
        r.member_view(NodeId(1), Epoch(2), &[NodeId(1)], "view");
        let v = r.violations();
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(v[0].contains("members disagree on epoch e1: n-1 holds [n1]"), "{v:?}");
        assert!(v[1].contains("never formed"), "{v:?}");
    }

    #[test]
    fn differing_hashes_and_weight_sums_are_violations() {
        let mut r = rec();
        r.weights_after(NodeId(0), 3, "aa");
        r.weights_after(NodeId(1), 3, "aa");
        assert!(!r.has_violations());
        r.weights_after(NodeId(2), 3, "ab");
        r.allreduce_weights(NodeId(0), "step 3", &[3.0, 3.0, 3.0], 3.0);
        assert_eq!(r.violations().len(), 1);
        r.allreduce_weights(NodeId(0), "step 4", &[3.0, 4.0, 3.0], 3.0);
        let v = r.violations();
        assert_eq!(v.len(), 2);
        assert!(v[0].contains("outer weights differ after outer step 3: n-2 has ab, n-0 has aa"));
        assert!(v[1].contains("weight sum 4 but the ring's weights sum to 3"), "{v:?}");
    }
}
