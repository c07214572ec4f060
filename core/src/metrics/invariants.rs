//! The run invariants both backends check, in one place.
//!
//! An executor feeds an [`InvariantChecker`] the memberships the coordinator formed
//! ([`InvariantChecker::epoch_formed`]) and every node's [`Check`](crate::node::machine::Check)
//! ([`InvariantChecker::check`]); the checker keeps the violations (at most
//! [`MAX_VIOLATIONS`] verbatim, the rest counted) for the run's `invariants`. The simulator
//! feeds it as it runs; the real launch feeds it from the workers' and the coordinator's
//! metrics lines after the run. The invariants:
//!
//! - **members agree on each epoch**: every member's view of an epoch must equal the membership
//!   the coordinator formed (so the epoch must be formed before the views are checked);
//! - **bit-identical outer weights**: every synced member's outer weights after outer step `k`
//!   must hash the same;
//! - **no contribution lost or counted twice**: every chunk of every finished all-reduce must
//!   carry a weight sum equal to the ring's total weight;
//! - whatever the node machine itself saw broken ([`Check::Violation`]).

use crate::digest::WeightsDigest;
use crate::ids::{Epoch, NodeId};
use std::collections::BTreeMap;

/// Largest number of violations kept verbatim (the rest are counted).
pub const MAX_VIOLATIONS: usize = 100;

/// The invariant checks of a run. See the module documentation.
#[derive(Debug, Default, Clone)]
pub struct InvariantChecker {
    names: BTreeMap<NodeId, String>,
    violations: Vec<String>,
    dropped_violations: u64,
    /// Memberships formed by the coordinator (sorted).
    epochs: BTreeMap<Epoch, Vec<NodeId>>,
    /// First hash reported per outer step, and by whom.
    hashes: BTreeMap<u64, (WeightsDigest, NodeId)>,
    stale_frames: u64,
    allreduces_checked: u64,
}

fn fmt_nodes(v: &[NodeId]) -> String {
    let s: Vec<String> = v.iter().map(ToString::to_string).collect();
    format!("[{}]", s.join(" "))
}

impl InvariantChecker {
    /// A checker that names node `id` by `names[id]` in its messages.
    pub fn new(names: BTreeMap<NodeId, String>) -> Self {
        InvariantChecker { names, ..InvariantChecker::default() }
    }

    /// The name of a node in messages (its id when it has no name).
    pub fn name(&self, id: NodeId) -> String {
        self.names.get(&id).cloned().unwrap_or_else(|| id.to_string())
    }

    /// Records a violated invariant (logged as a warning).
    pub fn violation(&mut self, msg: String) {
        tracing::warn!("invariant violated: {msg}");
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

    /// The membership the coordinator formed for `epoch` (sorted).
    pub fn epoch_members(&self, epoch: Epoch) -> Option<&[NodeId]> {
        self.epochs.get(&epoch).map(Vec::as_slice)
    }

    /// The latest epoch formed.
    pub fn latest_epoch(&self) -> Option<(Epoch, &[NodeId])> {
        self.epochs.iter().next_back().map(|(e, m)| (*e, m.as_slice()))
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
    pub fn weights_after(&mut self, node: NodeId, step: u64, hash: &WeightsDigest) {
        match self.hashes.get(&step) {
            None => {
                self.hashes.insert(step, (*hash, node));
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

    /// Counts `n` collective frames of older epochs that were rejected (not a violation).
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
    use crate::node::machine::{Check, Violation};

    fn checker() -> InvariantChecker {
        InvariantChecker::new((0..4).map(|i| (NodeId(i), format!("n-{i}"))).collect())
    }

    #[test]
    fn epoch_views_must_match_the_coordinator() {
        let mut r = checker();
        r.epoch_formed(Epoch(1), &[NodeId(1), NodeId(0)]);
        r.member_view(NodeId(0), Epoch(1), &[NodeId(0), NodeId(1)], "view");
        assert!(!r.has_violations());
        r.member_view(NodeId(1), Epoch(1), &[NodeId(1)], "release");
        r.member_view(NodeId(1), Epoch(2), &[NodeId(1)], "view");
        let v = r.violations();
        assert_eq!(v.len(), 2, "{v:?}");
        assert_eq!(
            v[0],
            "members disagree on epoch e1: n-1 holds [n1] (release), the coordinator formed [n0 n1]"
        );
        assert_eq!(
            v[1],
            "n-1 holds view membership [n1] for epoch e2, which the coordinator never formed"
        );
    }

    #[test]
    fn an_epoch_formed_twice_differently_is_a_violation() {
        let mut r = checker();
        r.epoch_formed(Epoch(1), &[NodeId(0), NodeId(1)]);
        r.epoch_formed(Epoch(1), &[NodeId(1), NodeId(0)]);
        assert!(!r.has_violations());
        r.epoch_formed(Epoch(1), &[NodeId(0)]);
        assert_eq!(
            r.violations(),
            vec!["epoch e1 formed twice with different members: [n0 n1] and [n0]".to_owned()]
        );
        assert_eq!(r.latest_epoch(), Some((Epoch(1), &[NodeId(0), NodeId(1)][..])));
    }

    #[test]
    fn differing_hashes_and_weight_sums_are_violations() {
        let mut r = checker();
        let (aa, ab) = (WeightsDigest::from_bytes([0xaa; 8]), WeightsDigest::from_bytes([0xab; 8]));
        r.weights_after(NodeId(0), 3, &aa);
        r.weights_after(NodeId(1), 3, &aa);
        assert!(!r.has_violations());
        r.weights_after(NodeId(2), 3, &ab);
        r.allreduce_weights(NodeId(0), "step 3", &[3.0, 3.0, 3.0], 3.0);
        assert_eq!(r.violations().len(), 1);
        r.allreduce_weights(NodeId(0), "step 4", &[3.0, 4.0, 3.0], 3.0);
        let v = r.violations();
        assert_eq!(v.len(), 2);
        assert_eq!(
            v[0],
            "outer weights differ after outer step 3: n-2 has abababababababab, n-0 has \
             aaaaaaaaaaaaaaaa"
        );
        assert_eq!(
            v[1],
            "step 4: n-0 saw a chunk with weight sum 4 but the ring's weights sum to 3: a \
             contribution was lost or counted twice"
        );
        assert_eq!(r.allreduces_checked(), 2);
    }

    #[test]
    fn checks_feed_the_same_logic() {
        let mut r = checker();
        r.epoch_formed(Epoch(2), &[NodeId(0), NodeId(1)]);
        r.check(
            NodeId(0),
            &Check::View { epoch: Epoch(2), members: vec![NodeId(0)], what: "view" },
        );
        r.check(NodeId(1), &Check::StaleFrame);
        r.check(
            NodeId(1),
            &Check::AllReduceWeights { what: "s".into(), sums: vec![2.0, 1.0], total: 2.0 },
        );
        let (x, y) = (WeightsDigest::from_bytes([1; 8]), WeightsDigest::from_bytes([2; 8]));
        r.check(NodeId(0), &Check::WeightsAfter { outer_step: 1, hash: x });
        r.check(NodeId(1), &Check::WeightsAfter { outer_step: 1, hash: y });
        let v = Violation::CommitWithoutResult { outer_step: 1, epoch: Epoch(2) };
        r.check(NodeId(3), &Check::Violation(v.clone()));
        let got = r.violations();
        assert_eq!(got.len(), 4, "{got:?}");
        assert!(got[0].starts_with("members disagree on epoch e2: n-0 holds [n0] (view)"));
        assert!(got[1].contains("n-1 saw a chunk with weight sum 1"));
        assert!(got[2].contains("n-1 has 0202020202020202, n-0 has 0101010101010101"));
        assert_eq!(got[3], v.describe(NodeId(3), &|n| r.name(n)));
        assert_eq!(r.stale_frames(), 1);
    }

    #[test]
    fn only_the_first_hundred_violations_are_kept() {
        let mut r = checker();
        for i in 0..(MAX_VIOLATIONS + 3) {
            r.violation(format!("v{i}"));
        }
        let v = r.violations();
        assert_eq!(v.len(), MAX_VIOLATIONS + 1);
        assert_eq!(v[MAX_VIOLATIONS], "... and 3 more violations");
    }
}
