//! The coordinator's view of the mesh, as plain data: what [`decide`](super::decide) reads.

use super::{LeaveReason, Transfer, ring::BandwidthMatrix};
use crate::ids::{Epoch, NodeId, Weight};
use crate::time::Time;
use std::collections::{BTreeMap, BTreeSet};

/// What the coordinator knows about one member of the current epoch.
#[derive(Clone, Debug, PartialEq)]
pub struct MemberInfo {
    /// The incarnation it joined with.
    pub incarnation: u64,
    /// When the coordinator last received anything from it, on the coordinator's own clock.
    pub last_seen: Time,
    /// The epoch it was admitted in.
    pub joined_epoch: Epoch,
    /// The first outer step for which it has a pseudo-gradient: the step being computed when it
    /// joined a forming mesh, the step after the boundary it was admitted at otherwise (it
    /// contributes weight 0 to that boundary's all-reduce).
    pub first_step: u64,
    /// Whether it holds the training state (always true for members of the first epoch).
    pub synced: bool,
    /// The last outer step whose barrier it reached.
    pub arrived: Option<u64>,
    /// An outer step whose pseudo-gradient it withholds (weight 0 in that step's rounds).
    pub withheld: Option<u64>,
    /// Its deathrattle, if it sent one.
    pub leaving: Option<LeaveReason>,
    /// It joined again (another incarnation, or the same one once `confirmed`): the process this
    /// record describes is gone.
    pub restarted: bool,
    /// It sent a message only an admitted process sends (a heartbeat with an epoch, a barrier
    /// arrival, `Done`, `Failed`, `Synced`, a probe report): its process knows it is a member, so
    /// a later `Join` with its incarnation comes from a restarted process, not a repeat.
    pub confirmed: bool,
    /// It reported the current all-reduce attempt done.
    pub done: bool,
    /// It reported the current all-reduce attempt failed.
    pub failed: bool,
    /// The member it named when it reported the current attempt failed.
    pub accuses: Option<NodeId>,
    /// Frames of the current attempt it had received from its ring neighbour when it reported
    /// the attempt failed.
    pub received: u64,
    /// The update's norms it reported with `Done` for the current attempt.
    pub norms: Option<super::UpdateNorms>,
    /// The state it said it held at its last barrier arrival.
    pub held_at_barrier: Option<super::Held>,
    /// Attempts in a row that it alone reported failed, with nobody dead (cleared at a commit):
    /// at [`BLAME_LIMIT`](super::BLAME_LIMIT) it is evicted.
    pub blamed: u32,
    /// The members that named it when they reported an attempt failed, since the last commit
    /// (a member evicted is taken out): at two it is evicted
    /// ([`EvictReason::Accused`](super::EvictReason::Accused)).
    pub accusers: BTreeSet<NodeId>,
}

impl MemberInfo {
    /// Forgets what it reported of an attempt (done, failed and whom it named, the norms), at
    /// the start of a round or of a step.
    pub fn forget_attempt(&mut self) {
        self.done = false;
        self.failed = false;
        self.accuses = None;
        self.received = 0;
        self.norms = None;
    }

    /// A member admitted now.
    pub fn new(incarnation: u64, last_seen: Time, epoch: Epoch, step: u64, synced: bool) -> Self {
        MemberInfo {
            incarnation,
            last_seen,
            joined_epoch: epoch,
            first_step: step,
            synced,
            arrived: None,
            withheld: None,
            leaving: None,
            restarted: false,
            confirmed: false,
            done: false,
            failed: false,
            accuses: None,
            received: 0,
            norms: None,
            held_at_barrier: None,
            blamed: 0,
            accusers: BTreeSet::new(),
        }
    }
}

/// A node waiting in the join queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Joiner {
    /// The node.
    pub id: NodeId,
    /// The incarnation it joins with.
    pub incarnation: u64,
    /// When its join arrived (coordinator's clock).
    pub queued_at: Time,
    /// When the coordinator last heard from it.
    pub last_seen: Time,
    /// The state it holds (its latest `Join`'s).
    pub held: Option<super::Held>,
    /// The outer steps it knows were finished in the run (its latest `Join`'s).
    pub finished: u64,
}

/// Where the mesh is in its cycle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Phase {
    /// No epoch yet: waiting for enough joiners. (After the first epoch, a mesh left without a
    /// member holding the state stops instead of forming again.)
    Forming,
    /// Members compute the current outer step; the barrier opens at the first arrival.
    Compute {
        /// When the step began (formation, or the commit or skip of the step before): the
        /// barrier deadline while nobody has arrived counts from it.
        since: Time,
        /// When the first member reached the barrier of the current step.
        barrier_opened: Option<Time>,
    },
    /// Blocking mode: joiners receive the state before the all-reduce.
    Sync {
        /// When the transfers (of this epoch) started.
        since: Time,
    },
    /// The all-reduce of the current step runs.
    Reduce {
        /// 0, then 1, 2, ... for retries.
        attempt: u32,
        /// When it was released.
        since: Time,
        /// When a member first reported this attempt failed.
        failed_at: Option<Time>,
    },
}

/// How an outer step ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every member finished the all-reduce of `epoch` and applied it.
    Committed {
        /// The step.
        outer_step: u64,
        /// The epoch of the all-reduce.
        epoch: Epoch,
    },
    /// Every member skipped the step's outer update.
    Skipped {
        /// The step.
        outer_step: u64,
        /// Attempts made.
        attempts: u32,
    },
}

/// Everything the coordinator knows: plain data, cloned freely, compared in tests.
#[derive(Clone, Debug, PartialEq)]
pub struct MeshState {
    /// The current epoch (0 before the first one forms).
    pub epoch: Epoch,
    /// The outer step being computed or reduced.
    pub outer_step: u64,
    /// Where the mesh is.
    pub phase: Phase,
    /// Members of the current epoch.
    pub members: BTreeMap<NodeId, MemberInfo>,
    /// Nodes waiting to join, in arrival order.
    pub queue: Vec<Joiner>,
    /// The ring of the current (or last) all-reduce.
    pub ring: Vec<NodeId>,
    /// The weights of the current (or last) all-reduce, aligned with `ring`.
    pub weights: Vec<Weight>,
    /// How the last finished step ended (sent again to a member that missed it).
    pub last_outcome: Option<Outcome>,
    /// The state transfers of the current epoch.
    pub transfers: Vec<Transfer>,
    /// Senders whose state a joiner refused (not the one the members vouch for), per joiner:
    /// not assigned to it again (cleared by a commit).
    pub refused: BTreeMap<NodeId, BTreeSet<NodeId>>,
    /// Measured bandwidth between nodes.
    pub bandwidth: BandwidthMatrix,
    /// Every (node, incarnation) ever admitted, so that none is admitted twice.
    pub admitted: BTreeSet<(NodeId, u64)>,
    /// When the coordinator last received a message from anyone (its own receive clock).
    pub last_heard: Option<Time>,
    /// Before the first epoch: nodes that beat as members of an epoch this coordinator does not
    /// know (a restarted coordinator's old members, about to join again), with when they were
    /// last heard. The mesh waits for them while they beat.
    pub expected: BTreeMap<NodeId, Time>,
    /// Nodes evicted as [`Uncorroborated`](super::EvictReason::Uncorroborated): how many times,
    /// and when they may be admitted again (each such eviction doubles the wait).
    pub barred: BTreeMap<NodeId, (u32, Time)>,
    /// The norms of the last [`UPDATE_HISTORY`](super::UPDATE_HISTORY) committed updates, the
    /// oldest first (the guard's running median; empty on a restarted coordinator).
    pub update_norms: std::collections::VecDeque<f64>,
    /// Updates the guard refused in a row (cleared by a commit).
    pub refused_updates: u32,
}

impl Default for MeshState {
    fn default() -> Self {
        MeshState {
            epoch: Epoch(0),
            outer_step: 0,
            phase: Phase::Forming,
            members: BTreeMap::new(),
            queue: Vec::new(),
            ring: Vec::new(),
            weights: Vec::new(),
            last_outcome: None,
            transfers: Vec::new(),
            bandwidth: BandwidthMatrix::new(),
            barred: BTreeMap::new(),
            refused: BTreeMap::new(),
            expected: BTreeMap::new(),
            admitted: BTreeSet::new(),
            last_heard: None,
            update_norms: std::collections::VecDeque::new(),
            refused_updates: 0,
        }
    }
}

impl MeshState {
    /// The names that count in the current attempt's failure reports, as `(by, named)`: when
    /// a ring stalls, every member after the cause stalls in turn and names its own neighbour,
    /// and the first after the cause is the one that received least (a member `d` places after
    /// it received `d - 1` steps more), so only the names of the reporters that received least
    /// count. A reporter that lies about what it received names only its own neighbour, once.
    pub fn named_in_attempt(&self) -> Vec<(NodeId, NodeId)> {
        let naming =
            || self.members.iter().filter_map(|(&id, m)| Some((id, m.accuses?, m.received)));
        let Some(least) = naming().map(|(_, _, r)| r).min() else { return Vec::new() };
        naming().filter(|&(_, _, r)| r == least).map(|(by, named, _)| (by, named)).collect()
    }

    /// Who has named each member since the last commit, the current attempt's names included.
    pub fn accusers_now(&self) -> BTreeMap<NodeId, BTreeSet<NodeId>> {
        let mut out: BTreeMap<NodeId, BTreeSet<NodeId>> = self
            .members
            .iter()
            .filter(|(_, m)| !m.accusers.is_empty())
            .map(|(&id, m)| (id, m.accusers.clone()))
            .collect();
        for (by, named) in self.named_in_attempt() {
            out.entry(named).or_default().insert(by);
        }
        out
    }

    /// Whether `id` is a member that holds the training state.
    pub fn is_synced(&self, id: NodeId) -> bool {
        self.members.get(&id).is_some_and(|m| m.synced)
    }

    /// The members of the current epoch, in id order.
    pub fn member_ids(&self) -> Vec<NodeId> {
        self.members.keys().copied().collect()
    }

    /// Whether `id` is queued.
    pub fn is_queued(&self, id: NodeId) -> bool {
        self.queue.iter().any(|j| j.id == id)
    }

    /// The queued joiner `id`.
    pub fn joiner(&self, id: NodeId) -> Option<&Joiner> {
        self.queue.iter().find(|j| j.id == id)
    }
}
