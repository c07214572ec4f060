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
//!
//! The first three are core's [`InvariantChecker`], which the real backend uses too.

use loco_core::metrics::{EventKind, EventRow, InvariantChecker, OuterStepRow};
use loco_core::node::machine::Check;
use loco_core::{Epoch, NodeId, Time};
use std::collections::{BTreeMap, BTreeSet};

/// The run's record. See the module documentation.
#[derive(Default)]
pub struct Recorder {
    /// The invariant checks (core's, shared with the real backend).
    checker: InvariantChecker,
    /// Events, in the order recorded.
    pub events: Vec<EventRow>,
    /// Rows, in the order recorded.
    pub rows: Vec<OuterStepRow>,
    /// Outer steps committed or skipped by the coordinator, and when the last one was.
    steps_done: u64,
    last_step: Option<u64>,
    last_progress: Time,
    /// Rows recorded per outer step.
    rows_per_step: BTreeMap<u64, BTreeSet<NodeId>>,
    /// Members that stopped because the coordinator went silent.
    coordinator_lost: BTreeSet<NodeId>,
}

impl Recorder {
    /// A recorder that names node `id` by `names[id]`.
    pub fn new(names: BTreeMap<NodeId, String>) -> Self {
        Recorder { checker: InvariantChecker::new(names), ..Recorder::default() }
    }

    /// The scenario name of a node (`coordinator` for the coordinator).
    pub fn name(&self, id: NodeId) -> String {
        self.checker.name(id)
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
        self.checker.violation(msg);
    }

    /// The violations so far (with a last line counting those not kept).
    pub fn violations(&self) -> Vec<String> {
        self.checker.violations()
    }

    /// Whether any invariant was violated.
    pub fn has_violations(&self) -> bool {
        self.checker.has_violations()
    }

    /// The coordinator formed `epoch` with `members`.
    pub fn epoch_formed(&mut self, epoch: Epoch, members: &[NodeId]) {
        self.checker.epoch_formed(epoch, members);
    }

    /// Feeds one check of node `node`'s machine to the invariant checker.
    pub fn check(&mut self, node: NodeId, c: &Check) {
        self.checker.check(node, c);
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
        self.checker.epoch_members(epoch)
    }

    /// The latest epoch formed.
    pub fn latest_epoch(&self) -> Option<(Epoch, &[NodeId])> {
        self.checker.latest_epoch()
    }

    /// A member noticed that the coordinator went silent.
    pub fn coordinator_lost(&mut self, node: NodeId) {
        self.coordinator_lost.insert(node);
    }

    /// How many nodes noticed the coordinator's silence at least once.
    pub fn coordinator_lost_count(&self) -> usize {
        self.coordinator_lost.len()
    }

    /// Stale frames rejected so far.
    pub fn stale_frames(&self) -> u64 {
        self.checker.stale_frames()
    }

    /// All-reduces whose weights were checked.
    pub fn allreduces_checked(&self) -> u64 {
        self.checker.allreduces_checked()
    }
}
