//! The membership decision: one pure function of (now, state, config), in the style of torchft's
//! `quorum_compute`. The [`Coordinator`](super::Coordinator) records events into a
//! [`MeshState`], asks [`decide`] what to do, applies the [`Decision`] and asks again until the
//! answer is [`Decision::Wait`].
//!
//! Rules, in order, per phase:
//!
//! - **Always** (after the first epoch): a change of membership that would leave no member
//!   holding the training state (synced) stops the run instead ([`Decision::NoSyncedMember`]):
//!   going on would train from a joiner's fresh weights. A new epoch whose all-reduce would have
//!   weight 0 on every member (those left have no pseudo-gradient for the step) skips the step
//!   instead of running it.
//! - **Forming**: wait for [`MeshConfig::min_members`] live joiners and the join window after the
//!   first of them; then form the first epoch with all of them (they all hold the same initial
//!   state, so nothing can be lost before it).
//! - **Compute**: a dead member (deathrattle, restart, heartbeat timeout) forms a new epoch
//!   without it at once. When every member has reached the barrier, or the barrier deadline has
//!   passed (the missing ones are evicted), the step's boundary: the queued joiners are admitted,
//!   then, in blocking mode with joiners, the state transfers run (**Sync**), else the all-reduce
//!   is released (**Reduce**). The barrier deadline is [`MeshConfig::barrier_timeout`] after the
//!   first arrival, or [`MeshConfig::compute_timeout`] after the step began while nobody has
//!   arrived.
//! - **Sync**: a death forms a new epoch and reassigns the senders; when every joiner holds the
//!   state the all-reduce is released; past the sync deadline the joiners still without it are
//!   evicted.
//! - **Reduce**: when every member is done, commit. A death, or a reported failure (after the
//!   retry backoff), forms a new epoch and retries the same step; past `max_retries`, every member
//!   skips the step. Past the all-reduce deadline with nobody dead, every member skips the step
//!   at once (retrying the ring that just stalled for the whole deadline would stall again).
//!   A member named by two others in failed attempts since the last commit (their ring
//!   successor: nothing came from it for the progress timeout, or its values were not finite)
//!   is evicted at the retry ([`EvictReason::Accused`]); each retry gives a named member a
//!   successor that has not named it. A member that alone reported [`BLAME_LIMIT`] attempts in
//!   a row failed, with nobody dead, is evicted at the retry
//!   ([`EvictReason::Uncorroborated`]); a commit clears its count. In a ring of two, a member
//!   it named is blamed beside it, and the two are evicted together
//!   ([`EvictReason::Disputed`]).
//!
//! A joiner is admitted only at a boundary of the Compute phase, so one that arrives during a
//! Sync or Reduce waits for the next step.

use super::blame;
use super::guard::Refusal;
use super::guard::{diverged, guard};
use super::state::{Joiner, MeshState, Phase};
use super::timer::{TimerKind, TimerTable};
use super::{
    BLAME_LIMIT, EvictReason, JoinMode, MeshConfig, RingOrder, Transfer, ring::ring_order,
};
use crate::ids::{Epoch, NodeId, Weight};
use crate::time::Time;
use std::fmt;

/// What the coordinator should do now.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Nothing until the next event or deadline.
    Wait(Reason),
    /// Drop queued joiners that have gone silent (no epoch change).
    ForgetJoiners(Vec<NodeId>),
    /// Form a new epoch.
    NewEpoch(EpochPlan),
    /// Release the all-reduce in the current epoch (nothing changed at the boundary).
    Release(Round),
    /// Every member finished the all-reduce of this step, but its update fails the guard
    /// ([`MeshConfig::max_update_ratio`]): skip it (or stop the run at the limit).
    RefuseUpdate(Refusal),
    /// Every member finished the all-reduce of this step: commit it.
    Commit {
        /// The step committed.
        outer_step: u64,
    },
    /// No member holding the training state is left (after these evictions): stop the run, which
    /// must be resumed from checkpoints.
    NoSyncedMember {
        /// Members removed now, with the reason, in id order.
        evicted: Vec<(NodeId, EvictReason)>,
        /// The members left, none of which holds the state, in id order.
        unsynced: Vec<NodeId>,
    },
}

/// A new epoch: who is in it, who came and went, and what the members do next.
#[derive(Clone, Debug, PartialEq)]
pub struct EpochPlan {
    /// The new epoch (the current one plus one).
    pub epoch: Epoch,
    /// Its members, in id order.
    pub members: Vec<NodeId>,
    /// Joiners admitted into it, in queue order.
    pub admitted: Vec<NodeId>,
    /// Members removed, with the reason, in id order.
    pub evicted: Vec<(NodeId, EvictReason)>,
    /// What the members do in it.
    pub then: Then,
}

/// What follows the formation of an epoch.
#[derive(Clone, Debug, PartialEq)]
pub enum Then {
    /// Compute the current outer step (formation, or a member left while computing).
    Compute,
    /// Blocking mode: the joiners receive the state first.
    Sync {
        /// Who sends the state to whom.
        transfers: Vec<Transfer>,
    },
    /// Release (or retry) the all-reduce.
    Reduce(Round),
    /// Retries are exhausted: every member skips the outer update of the current step.
    Skip {
        /// Attempts made.
        attempts: u32,
    },
}

/// One try of the all-reduce of an outer step.
#[derive(Clone, Debug, PartialEq)]
pub struct Round {
    /// The outer step.
    pub outer_step: u64,
    /// 0 for the first try.
    pub attempt: u32,
    /// The ring order: a permutation of the epoch's members.
    pub ring: Vec<NodeId>,
    /// Weights aligned with `ring`: 0 for a member that has no pseudo-gradient for this step.
    pub weights: Vec<Weight>,
    /// Non-blocking mode: state transfers to run alongside.
    pub transfers: Vec<Transfer>,
}

/// Why the coordinator waits.
#[derive(Clone, Debug, PartialEq)]
pub enum Reason {
    /// No epoch and nobody queued.
    NoJoiners,
    /// No epoch yet: fewer live joiners than `min_members`.
    TooFewJoiners {
        /// Live joiners queued.
        joined: usize,
        /// `min_members`.
        need: usize,
    },
    /// No epoch yet: none of the live joiners holds a training state to found the mesh on, at
    /// least as new as the steps some joiner knows were finished.
    NoStateHolder {
        /// Live joiners queued.
        joined: usize,
        /// The outer steps finished in the run, as the joiners know.
        finished: u64,
    },
    /// No epoch yet: nodes that were members of an epoch before this coordinator started (it
    /// restarted) still beat and are about to join again with their state.
    AwaitingMembers {
        /// Those nodes.
        nodes: Vec<NodeId>,
    },
    /// No epoch yet: the join window after the first join is still open.
    JoinWindow {
        /// When it closes.
        until: Time,
    },
    /// Members compute; waiting for the barrier.
    Barrier {
        /// The step.
        outer_step: u64,
        /// Members at the barrier.
        arrived: usize,
        /// Members in all.
        of: usize,
        /// The barrier deadline: [`MeshConfig::barrier_timeout`] after the first arrival, or
        /// [`MeshConfig::compute_timeout`] after the step began while nobody has arrived.
        deadline: Option<Time>,
    },
    /// Blocking mode: joiners receive the state.
    Syncing {
        /// Joiners that do not hold the state yet.
        pending: Vec<NodeId>,
        /// When they are evicted.
        deadline: Time,
    },
    /// The all-reduce runs.
    Reducing {
        /// The step.
        outer_step: u64,
        /// The attempt.
        attempt: u32,
        /// Members done.
        done: usize,
        /// Members in all.
        of: usize,
    },
    /// A member reported a failure: waiting for a dead peer to time out before retrying.
    RetryBackoff {
        /// When the retry happens anyway.
        until: Time,
    },
}

fn list(ids: &[NodeId]) -> String {
    let v: Vec<String> = ids.iter().map(ToString::to_string).collect();
    format!("[{}]", v.join(","))
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::NoJoiners => write!(f, "no joiners"),
            Reason::TooFewJoiners { joined, need } => {
                write!(f, "forming: {joined} of {need} joiners")
            }
            Reason::NoStateHolder { joined, finished } => write!(
                f,
                "forming: none of the {joined} joiners holds the training state after the \
                 {finished} outer steps finished (resume from checkpoints)"
            ),
            Reason::AwaitingMembers { nodes } => {
                write!(f, "forming: waiting for earlier members {} to join again", list(nodes))
            }
            Reason::JoinWindow { until } => write!(f, "forming: join window open until {until}"),
            Reason::Barrier { outer_step, arrived, of, deadline } => {
                write!(f, "barrier of step {outer_step}: {arrived}/{of} arrived")?;
                if let Some(d) = deadline {
                    write!(f, ", deadline {d}")?;
                }
                Ok(())
            }
            Reason::Syncing { pending, deadline } => {
                write!(f, "joiners {} receive the state, deadline {deadline}", list(pending))
            }
            Reason::Reducing { outer_step, attempt, done, of } => {
                write!(f, "all-reduce of step {outer_step} attempt {attempt}: {done}/{of} done")
            }
            Reason::RetryBackoff { until } => write!(f, "all-reduce failed, retry at {until}"),
        }
    }
}

impl fmt::Display for Then {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Then::Compute => write!(f, "compute"),
            Then::Sync { transfers } => write!(f, "sync {} joiner(s)", transfers.len()),
            Then::Reduce(r) => write!(f, "{r}"),
            Then::Skip { attempts } => write!(f, "skip the step after {attempts} attempts"),
        }
    }
}

impl fmt::Display for Round {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total: f32 = self.weights.iter().map(|w| w.get()).sum();
        write!(
            f,
            "all-reduce step {} attempt {} ring {} weight {total}",
            self.outer_step,
            self.attempt,
            list(&self.ring)
        )
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Decision::Wait(r) => write!(f, "wait: {r}"),
            Decision::ForgetJoiners(ids) => write!(f, "forget silent joiners {}", list(ids)),
            Decision::NewEpoch(p) => {
                write!(f, "new epoch {}: members {}", p.epoch, list(&p.members))?;
                if !p.admitted.is_empty() {
                    write!(f, ", admitted {}", list(&p.admitted))?;
                }
                for (id, why) in &p.evicted {
                    write!(f, ", evicted {id} ({why})")?;
                }
                write!(f, "; then {}", p.then)
            }
            Decision::Release(r) => write!(f, "release {r}"),
            Decision::Commit { outer_step } => write!(f, "commit step {outer_step}"),
            Decision::RefuseUpdate(r) => {
                write!(f, "refuse the update: norm {:.3e}", r.norm)?;
                if let Some(m) = r.median {
                    write!(f, " against a median of {m:.3e}")?;
                }
                match r.outlier {
                    Some(o) => write!(f, ", {o} stands out"),
                    None => Ok(()),
                }
            }
            Decision::NoSyncedMember { evicted, unsynced } => {
                write!(f, "stop: no member holds the state")?;
                for (id, why) in evicted {
                    write!(f, ", evicted {id} ({why})")?;
                }
                write!(f, "; left without it: {}", list(unsynced))
            }
        }
    }
}

/// The coordinator's deadlines, one per kind (quinn's timer table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CoordTimer {
    /// The first epoch forms when the join window closes.
    JoinWindow,
    /// The earliest heartbeat expiry of a member or queued joiner.
    HeartbeatExpiry,
    /// The barrier deadline of the current step.
    BarrierDeadline,
    /// The state transfer deadline (blocking mode).
    SyncDeadline,
    /// Retry after a reported failure.
    RetryBackoff,
    /// The all-reduce deadline.
    AllReduceDeadline,
    /// The current bandwidth probe round's deadline (set by the coordinator, not by `decide`).
    ProbeRound,
    /// The end of the coordinator's own isolation: `rejoin_for` after it last heard anyone.
    Isolation,
}

impl TimerKind for CoordTimer {
    const COUNT: usize = 8;
    fn all() -> &'static [Self] {
        &[
            CoordTimer::JoinWindow,
            CoordTimer::HeartbeatExpiry,
            CoordTimer::BarrierDeadline,
            CoordTimer::SyncDeadline,
            CoordTimer::RetryBackoff,
            CoordTimer::AllReduceDeadline,
            CoordTimer::ProbeRound,
            CoordTimer::Isolation,
        ]
    }
    fn index(self) -> usize {
        self as usize
    }
}

pub(crate) fn timers(s: &MeshState, cfg: &MeshConfig) -> TimerTable<CoordTimer> {
    let mut t = TimerTable::new();
    let hb = s
        .members
        .values()
        .map(|m| m.last_seen)
        .chain(s.queue.iter().map(|j| j.last_seen))
        .chain(s.expected.values().copied())
        .min()
        .map(|seen| seen + cfg.heartbeat_timeout);
    t.set_opt(CoordTimer::HeartbeatExpiry, hb);
    if !s.members.is_empty() {
        t.set_opt(CoordTimer::Isolation, s.last_heard.map(|h| h + cfg.rejoin_for));
    }
    match &s.phase {
        Phase::Forming if s.queue.len() >= cfg.min_members => {
            let first = s.queue.iter().map(|j| j.queued_at).min();
            t.set_opt(CoordTimer::JoinWindow, first.map(|q| q + cfg.join_window));
        }
        Phase::Forming => {}
        Phase::Compute { since, barrier_opened } => {
            t.set(CoordTimer::BarrierDeadline, barrier_deadline(*since, *barrier_opened, cfg));
        }
        Phase::Sync { since } => t.set(CoordTimer::SyncDeadline, *since + cfg.sync_timeout),
        Phase::Reduce { since, failed_at, .. } => {
            t.set(CoordTimer::AllReduceDeadline, *since + cfg.allreduce_timeout);
            t.set_opt(CoordTimer::RetryBackoff, failed_at.map(|f| f + cfg.retry_backoff));
        }
    }
    t
}

/// The next time at which [`decide`] may answer differently without a new event.
pub fn next_deadline(s: &MeshState, cfg: &MeshConfig) -> Option<Time> {
    timers(s, cfg).next_timeout()
}

/// The barrier deadline of a step that began at `since`: `barrier_timeout` after the first
/// arrival, or `compute_timeout` after the start while nobody has arrived.
fn barrier_deadline(since: Time, opened: Option<Time>, cfg: &MeshConfig) -> Time {
    match opened {
        Some(o) => o + cfg.barrier_timeout,
        None => since + cfg.compute_timeout,
    }
}

fn is_silent(now: Time, last_seen: Time, cfg: &MeshConfig) -> bool {
    now >= last_seen + cfg.heartbeat_timeout
}

/// The coordinator itself is cut off: it has heard nobody (member or joiner, each beating every
/// heartbeat interval) for one and a half intervals, and for less than `rejoin_for`. A silence
/// it cannot tell from its own (its uplink down) evicts nobody: the members wait for it, still
/// members, until their own `rejoin_for`; when it hears again it credits the gap to everyone
/// (see `Coordinator::credit_absence`). Past `rejoin_for` the members have given up, and their
/// silence is judged.
pub(crate) fn isolated(now: Time, s: &MeshState, cfg: &MeshConfig) -> bool {
    let interval = cfg.heartbeat_interval;
    s.last_heard.is_some_and(|h| {
        let quiet = now.saturating_since(h);
        quiet > interval + interval / 2 && quiet < cfg.rejoin_for
    })
}

/// Members to evict now regardless of the phase: deathrattle, restart, heartbeat timeout (not
/// while the coordinator is [`isolated`]).
fn dead_members(now: Time, s: &MeshState, cfg: &MeshConfig) -> Vec<(NodeId, EvictReason)> {
    let cut_off = isolated(now, s, cfg);
    s.members
        .iter()
        .filter_map(|(&id, m)| {
            if m.restarted {
                Some((id, EvictReason::Restarted))
            } else if let Some(r) = m.leaving {
                Some((id, EvictReason::Deathrattle(r)))
            } else if is_silent(now, m.last_seen, cfg) && !cut_off {
                Some((id, EvictReason::HeartbeatTimeout))
            } else {
                None
            }
        })
        .collect()
}

fn live_joiners<'a>(now: Time, s: &'a MeshState, cfg: &MeshConfig) -> Vec<&'a Joiner> {
    let free = |id: &NodeId| s.barred.get(id).is_none_or(|&(_, until)| now >= until);
    s.queue.iter().filter(|j| !is_silent(now, j.last_seen, cfg) && free(&j.id)).collect()
}

/// How long a node evicted as uncorroborated for the `times`-th time waits before it is admitted
/// again: the heartbeat timeout, doubled with each such eviction, at most an hour. A member that
/// fails every attempt on purpose costs the mesh its three attempts less and less often; one
/// whose link was broken is back once it works.
pub(crate) fn barred_for(times: u32, cfg: &MeshConfig) -> std::time::Duration {
    let doubled = cfg.heartbeat_timeout.saturating_mul(1u32 << times.min(20));
    doubled.min(std::time::Duration::from_secs(3600))
}

/// Weights for a round of `outer_step` among `members`: 1, or 0 for a member without the state or
/// admitted at this step's boundary (it has no pseudo-gradient for it).
fn weights(s: &MeshState, ring: &[NodeId], outer_step: u64) -> Vec<Weight> {
    ring.iter()
        .map(|id| match s.members.get(id) {
            Some(m) if m.synced && m.first_step <= outer_step && m.withheld != Some(outer_step) => {
                Weight::ONE
            }
            _ => Weight::ZERO,
        })
        .collect()
}

fn round(
    s: &MeshState,
    cfg: &MeshConfig,
    members: &[NodeId],
    attempt: u32,
    transfers: Vec<Transfer>,
) -> Round {
    let ring = match cfg.ring_order {
        RingOrder::Measured => ring_order(members, &s.bandwidth),
        RingOrder::Ids => {
            let mut ring = members.to_vec();
            ring.sort_unstable();
            ring
        }
    };
    let mut ring = ring;
    super::blame::separate(&mut ring, s);
    let weights = weights(s, &ring, s.outer_step);
    Round { outer_step: s.outer_step, attempt, ring, weights, transfers }
}

/// State senders for each joiner: `k` of the `pool`, rotating so that joiners spread over it,
/// leaving out the senders whose state the joiner refused ([`MeshState::refused`]) while others
/// are left.
fn assign_transfers(s: &MeshState, joiners: &[NodeId], pool: &[NodeId], k: usize) -> Vec<Transfer> {
    if pool.is_empty() {
        return Vec::new();
    }
    joiners
        .iter()
        .enumerate()
        .map(|(i, &joiner)| {
            let refused = s.refused.get(&joiner);
            let left: Vec<NodeId> =
                pool.iter().copied().filter(|x| refused.is_none_or(|r| !r.contains(x))).collect();
            let pool = if left.is_empty() { pool } else { &left };
            let mut senders: Vec<NodeId> =
                (0..k.min(pool.len())).map(|j| pool[(i * k + j) % pool.len()]).collect();
            senders.sort();
            senders.dedup();
            Transfer { joiner, senders }
        })
        .collect()
}

fn without(members: &[NodeId], gone: &[(NodeId, EvictReason)]) -> Vec<NodeId> {
    members.iter().copied().filter(|id| !gone.iter().any(|(g, _)| g == id)).collect()
}

/// A new epoch of `members`, unless it would leave no member holding the state (after the first
/// epoch): then the run stops. A round in which every member has weight 0 is a skip.
fn plan(
    s: &MeshState,
    members: Vec<NodeId>,
    admitted: Vec<NodeId>,
    evicted: Vec<(NodeId, EvictReason)>,
    then: Then,
) -> Decision {
    if s.phase != Phase::Forming && !members.iter().any(|&id| s.is_synced(id)) {
        // Joiners being admitted are not members of `s` yet: they are not reported as members.
        let unsynced = members.into_iter().filter(|id| s.members.contains_key(id)).collect();
        return Decision::NoSyncedMember { evicted, unsynced };
    }
    let then = match then {
        Then::Reduce(r) if r.weights.iter().all(|w| w.get() == 0.0) => {
            // Nobody left has a pseudo-gradient for this step: nothing to average.
            Then::Skip { attempts: r.attempt }
        }
        then => then,
    };
    Decision::NewEpoch(EpochPlan { epoch: s.epoch.next(), members, admitted, evicted, then })
}

/// The coordinator's decision at `now`. Pure: the same inputs give the same decision.
pub fn decide(now: Time, s: &MeshState, cfg: &MeshConfig) -> Decision {
    // Forgetting silent joiners never changes an epoch, so it comes first.
    let silent: Vec<NodeId> =
        s.queue.iter().filter(|j| is_silent(now, j.last_seen, cfg)).map(|j| j.id).collect();
    if !silent.is_empty() {
        return Decision::ForgetJoiners(silent);
    }
    let dead = dead_members(now, s, cfg);
    let ids = s.member_ids();
    if s.phase != Phase::Forming && !s.members.values().any(|m| m.synced) {
        // Not reachable through `plan`, which never forms such an epoch; kept for any state.
        return Decision::NoSyncedMember { unsynced: without(&ids, &dead), evicted: dead };
    }
    match &s.phase {
        Phase::Forming => form(now, s, cfg),
        Phase::Compute { since, barrier_opened } => {
            compute(now, s, cfg, (dead, ids), *since, *barrier_opened)
        }
        Phase::Sync { since } => {
            let pending: Vec<NodeId> =
                s.members.iter().filter(|(_, m)| !m.synced).map(|(&id, _)| id).collect();
            let deadline = *since + cfg.sync_timeout;
            if !dead.is_empty() {
                let members = without(&ids, &dead);
                let pending = without(&pending, &dead);
                let pool: Vec<NodeId> =
                    members.iter().copied().filter(|id| !pending.contains(id)).collect();
                let then = if pending.is_empty() || pool.is_empty() {
                    Then::Reduce(round(s, cfg, &members, 0, Vec::new()))
                } else {
                    Then::Sync {
                        transfers: assign_transfers(s, &pending, &pool, cfg.state_senders),
                    }
                };
                return plan(s, members, Vec::new(), dead, then);
            }
            // A joiner refused what its senders sent: others send, where there are others.
            if s.transfers.iter().any(|t| {
                s.refused.get(&t.joiner).is_some_and(|r| t.senders.iter().any(|x| r.contains(x)))
            }) {
                let pool: Vec<NodeId> =
                    ids.iter().copied().filter(|id| !pending.contains(id)).collect();
                let transfers = assign_transfers(s, &pending, &pool, cfg.state_senders);
                if transfers != s.transfers {
                    return plan(s, ids, Vec::new(), Vec::new(), Then::Sync { transfers });
                }
            }
            if pending.is_empty() {
                return Decision::Release(round(s, cfg, &ids, 0, Vec::new()));
            }
            if now >= deadline {
                let evicted: Vec<(NodeId, EvictReason)> =
                    pending.iter().map(|&id| (id, EvictReason::SyncTimeout)).collect();
                let members = without(&ids, &evicted);
                let then = Then::Reduce(round(s, cfg, &members, 0, Vec::new()));
                return plan(s, members, Vec::new(), evicted, then);
            }
            Decision::Wait(Reason::Syncing { pending, deadline })
        }
        Phase::Reduce { attempt, since, failed_at } => {
            let done = s.members.values().filter(|m| m.done).count();
            if done == s.members.len() {
                // Everyone holds the same result, even a member that died since sending Done.
                if let Some(r) = guard(s, cfg) {
                    return Decision::RefuseUpdate(r);
                }
                return Decision::Commit { outer_step: s.outer_step };
            }
            let backoff = failed_at.map(|f| f + cfg.retry_backoff);
            // An all-reduce that made no progress for the whole timeout is not retried on the
            // same members: the step is skipped, and a member whose application hangs is then
            // evicted at the next barrier.
            let timed_out = now >= *since + cfg.allreduce_timeout;
            let retry = !dead.is_empty() || backoff.is_some_and(|b| now >= b) || timed_out;
            if retry {
                let mut dead = dead;
                if dead.is_empty() {
                    // Named by two ring successors: it is the cause.
                    let named = s.accusers_now().into_iter().filter(|(_, by)| by.len() >= 2);
                    dead.extend(named.map(|(id, _)| (id, EvictReason::Accused)));
                }
                if dead.is_empty() {
                    let why = match blame::sole_reporter(s).and_then(|id| s.members.get(&id)) {
                        Some(m) if m.accuses.is_some() && s.members.len() < 3 => {
                            EvictReason::Disputed
                        }
                        _ => EvictReason::Uncorroborated,
                    };
                    let parties = blame::blamed_parties(s);
                    // Both sides of a dispute reach the limit together: both go, or neither.
                    if parties
                        .iter()
                        .all(|id| s.members.get(id).is_some_and(|m| m.blamed + 1 >= BLAME_LIMIT))
                    {
                        dead.extend(parties.into_iter().map(|id| (id, why)));
                    }
                }
                let members = without(&ids, &dead);
                let then = if *attempt >= cfg.max_retries || (timed_out && dead.is_empty()) {
                    Then::Skip { attempts: attempt + 1 }
                } else {
                    Then::Reduce(round(s, cfg, &members, attempt + 1, Vec::new()))
                };
                return plan(s, members, Vec::new(), dead, then);
            }
            if let Some(until) = backoff {
                return Decision::Wait(Reason::RetryBackoff { until });
            }
            Decision::Wait(Reason::Reducing {
                outer_step: s.outer_step,
                attempt: *attempt,
                done,
                of: s.members.len(),
            })
        }
    }
}

/// The Compute phase: a death forms a new epoch; when every member arrived (or at the barrier
/// deadline, without those that did not), the boundary, where diverged replicas are evicted.
fn compute(
    now: Time,
    s: &MeshState,
    cfg: &MeshConfig,
    (dead, ids): (Vec<(NodeId, EvictReason)>, Vec<NodeId>),
    since: Time,
    barrier_opened: Option<Time>,
) -> Decision {
    if !dead.is_empty() {
        let members = without(&ids, &dead);
        return plan(s, members, Vec::new(), dead, Then::Compute);
    }
    let missing: Vec<NodeId> = s
        .members
        .iter()
        .filter(|(_, m)| m.arrived != Some(s.outer_step))
        .map(|(&id, _)| id)
        .collect();
    let deadline = barrier_deadline(since, barrier_opened, cfg);
    if missing.is_empty() {
        return boundary(now, s, cfg, diverged(s));
    }
    if now >= deadline {
        // With nobody arrived, that is every member: then no member holding the state is
        // left, and `plan` stops the run.
        let evicted = missing.into_iter().map(|id| (id, EvictReason::BarrierMissed));
        let mut evicted: Vec<_> = evicted.chain(diverged(s)).collect();
        evicted.sort();
        return boundary(now, s, cfg, evicted);
    }
    Decision::Wait(Reason::Barrier {
        outer_step: s.outer_step,
        arrived: ids.len() - missing.len(),
        of: ids.len(),
        deadline: Some(deadline),
    })
}

/// Forming: the first epoch, of every live joiner, once enough have joined and the join window
/// since the first of them has passed.
fn form(now: Time, s: &MeshState, cfg: &MeshConfig) -> Decision {
    let live = live_joiners(now, s, cfg);
    if live.is_empty() {
        return Decision::Wait(Reason::NoJoiners);
    }
    if live.len() < cfg.min_members {
        return Decision::Wait(Reason::TooFewJoiners { joined: live.len(), need: cfg.min_members });
    }
    let first = live.iter().map(|j| j.queued_at).min().unwrap_or(now);
    let until = first + cfg.join_window;
    if now < until {
        return Decision::Wait(Reason::JoinWindow { until });
    }
    // A restarted coordinator's old members are about to join again, with their state.
    let awaited: Vec<NodeId> = s
        .expected
        .iter()
        .filter(|&(&id, &seen)| !is_silent(now, seen, cfg) && !s.is_queued(id))
        .map(|(&id, _)| id)
        .collect();
    if !awaited.is_empty() {
        return Decision::Wait(Reason::AwaitingMembers { nodes: awaited });
    }
    let finished = live.iter().map(|j| j.finished).max().unwrap_or(0);
    let admitted = founders(&live, finished);
    if admitted.is_empty() {
        return Decision::Wait(Reason::NoStateHolder { joined: live.len(), finished });
    }
    let mut members = admitted.clone();
    members.sort();
    plan(s, members, admitted, Vec::new(), Then::Compute)
}

/// The joiners a mesh is founded on: of those that hold a state, the ones at the highest outer
/// step, and of those the largest group with one digest (on a tie, a known digest before an
/// unknown one, then the smaller digest). The others fetch the state once the mesh runs. None
/// when the highest state is behind `finished` steps (the newest state is gone).
pub(super) fn founders(joiners: &[&Joiner], finished: u64) -> Vec<NodeId> {
    let holding = || joiners.iter().filter_map(|j| Some((j.id, j.held?)));
    let Some(top) = holding().map(|(_, h)| h.outer_step).max() else { return Vec::new() };
    if top < finished {
        return Vec::new();
    }
    let mut groups: std::collections::BTreeMap<_, Vec<NodeId>> = Default::default();
    for (id, h) in holding().filter(|(_, h)| h.outer_step == top) {
        groups.entry(h.digest).or_default().push(id);
    }
    let best = groups
        .into_iter()
        .min_by_key(|(digest, ids)| (std::cmp::Reverse(ids.len()), digest.is_none(), *digest));
    best.map(|(_, ids)| ids).unwrap_or_default()
}

/// The boundary of the current step: every member arrived or the rest is evicted. Admits all
/// live queued joiners.
fn boundary(
    now: Time,
    s: &MeshState,
    cfg: &MeshConfig,
    evicted: Vec<(NodeId, EvictReason)>,
) -> Decision {
    let survivors = without(&s.member_ids(), &evicted);
    let admitted: Vec<NodeId> = live_joiners(now, s, cfg)
        .iter()
        .map(|j| j.id)
        .filter(|id| !survivors.contains(id))
        .take(cfg.max_admissions)
        .collect();
    if admitted.is_empty() && evicted.is_empty() {
        return Decision::Release(round(s, cfg, &survivors, 0, Vec::new()));
    }
    let mut members = survivors.clone();
    members.extend(admitted.iter().copied());
    members.sort();
    // Senders: survivors that hold the state.
    let pool: Vec<NodeId> = survivors
        .iter()
        .copied()
        .filter(|id| s.members.get(id).is_some_and(|m| m.synced))
        .collect();
    let transfers = assign_transfers(s, &admitted, &pool, cfg.state_senders);
    let then = if cfg.join_mode == JoinMode::Blocking && !transfers.is_empty() {
        Then::Sync { transfers }
    } else {
        // Joiners are not members of `s` yet, so `weights` gives them 0.
        Then::Reduce(round(s, cfg, &members, 0, transfers))
    };
    plan(s, members, admitted, evicted, then)
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
