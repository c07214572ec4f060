//! The membership decision: one pure function of (now, state, config), in the style of torchft's
//! `quorum_compute`. The [`Coordinator`](super::Coordinator) records events into a
//! [`MeshState`], asks [`decide`] what to do, applies the [`Decision`] and asks again until the
//! answer is [`Decision::Wait`].
//!
//! Rules, in order, per phase:
//!
//! - **Forming**: wait for [`MeshConfig::min_members`] live joiners and the join window after the
//!   first of them; then form the first epoch with all of them.
//! - **Compute**: a dead member (deathrattle, restart, heartbeat timeout) forms a new epoch
//!   without it at once. When every member has reached the barrier, or the barrier deadline has
//!   passed (the missing ones are evicted), the step's boundary: the queued joiners are admitted,
//!   then, in blocking mode with joiners, the state transfers run (**Sync**), else the all-reduce
//!   is released (**Reduce**).
//! - **Sync**: a death forms a new epoch and reassigns the senders; when every joiner holds the
//!   state the all-reduce is released; past the sync deadline the joiners still without it are
//!   evicted.
//! - **Reduce**: when every member is done, commit. A death, or a reported failure (after the
//!   retry backoff), forms a new epoch and retries the same step; past `max_retries`, every member
//!   skips the step. Past the all-reduce deadline with nobody dead, every member skips the step
//!   at once (retrying the ring that just stalled for the whole deadline would stall again).
//!
//! A joiner is admitted only at a boundary of the Compute phase, so one that arrives during a
//! Sync or Reduce waits for the next step.

use super::state::{Joiner, MeshState, Phase};
use super::timer::{TimerKind, TimerTable};
use super::{EvictReason, JoinMode, MeshConfig, Transfer, ring::ring_order};
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
    /// Every member finished the all-reduce of this step: commit it.
    Commit {
        /// The step committed.
        outer_step: u64,
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
    /// Nobody is left: wait for joiners to form the mesh again.
    Forming,
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
        /// The barrier deadline, once the first member arrived.
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
            Then::Forming => write!(f, "forming again"),
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
}

impl TimerKind for CoordTimer {
    const COUNT: usize = 7;
    fn all() -> &'static [Self] {
        &[
            CoordTimer::JoinWindow,
            CoordTimer::HeartbeatExpiry,
            CoordTimer::BarrierDeadline,
            CoordTimer::SyncDeadline,
            CoordTimer::RetryBackoff,
            CoordTimer::AllReduceDeadline,
            CoordTimer::ProbeRound,
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
        .min()
        .map(|seen| seen + cfg.heartbeat_timeout);
    t.set_opt(CoordTimer::HeartbeatExpiry, hb);
    match &s.phase {
        Phase::Forming if s.queue.len() >= cfg.min_members => {
            let first = s.queue.iter().map(|j| j.queued_at).min();
            t.set_opt(CoordTimer::JoinWindow, first.map(|q| q + cfg.join_window));
        }
        Phase::Forming => {}
        Phase::Compute { barrier_opened } => {
            t.set_opt(CoordTimer::BarrierDeadline, barrier_opened.map(|o| o + cfg.barrier_timeout));
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

fn is_silent(now: Time, last_seen: Time, cfg: &MeshConfig) -> bool {
    now >= last_seen + cfg.heartbeat_timeout
}

/// Members to evict now regardless of the phase: deathrattle, restart, heartbeat timeout.
fn dead_members(now: Time, s: &MeshState, cfg: &MeshConfig) -> Vec<(NodeId, EvictReason)> {
    s.members
        .iter()
        .filter_map(|(&id, m)| {
            if m.restarted {
                Some((id, EvictReason::Restarted))
            } else if let Some(r) = m.leaving {
                Some((id, EvictReason::Deathrattle(r)))
            } else if is_silent(now, m.last_seen, cfg) {
                Some((id, EvictReason::HeartbeatTimeout))
            } else {
                None
            }
        })
        .collect()
}

fn live_joiners<'a>(now: Time, s: &'a MeshState, cfg: &MeshConfig) -> Vec<&'a Joiner> {
    s.queue.iter().filter(|j| !is_silent(now, j.last_seen, cfg)).collect()
}

/// Weights for a round of `outer_step` among `members`: 1, or 0 for a member without the state or
/// admitted at this step's boundary (it has no pseudo-gradient for it).
fn weights(s: &MeshState, ring: &[NodeId], outer_step: u64) -> Vec<Weight> {
    ring.iter()
        .map(|id| match s.members.get(id) {
            Some(m) if m.synced && m.first_step <= outer_step => Weight::ONE,
            _ => Weight::ZERO,
        })
        .collect()
}

fn round(s: &MeshState, members: &[NodeId], attempt: u32, transfers: Vec<Transfer>) -> Round {
    let ring = ring_order(members, &s.bandwidth);
    let weights = weights(s, &ring, s.outer_step);
    Round { outer_step: s.outer_step, attempt, ring, weights, transfers }
}

/// State senders for each joiner: `k` of the `pool`, rotating so that joiners spread over it.
fn assign_transfers(joiners: &[NodeId], pool: &[NodeId], k: usize) -> Vec<Transfer> {
    if pool.is_empty() {
        return Vec::new();
    }
    joiners
        .iter()
        .enumerate()
        .map(|(i, &joiner)| {
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

fn plan(
    s: &MeshState,
    members: Vec<NodeId>,
    admitted: Vec<NodeId>,
    evicted: Vec<(NodeId, EvictReason)>,
    then: Then,
) -> Decision {
    let then = if members.is_empty() { Then::Forming } else { then };
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
    match &s.phase {
        Phase::Forming => {
            let live = live_joiners(now, s, cfg);
            if live.is_empty() {
                return Decision::Wait(Reason::NoJoiners);
            }
            if live.len() < cfg.min_members {
                return Decision::Wait(Reason::TooFewJoiners {
                    joined: live.len(),
                    need: cfg.min_members,
                });
            }
            let first = live.iter().map(|j| j.queued_at).min().unwrap_or(now);
            let until = first + cfg.join_window;
            if now < until {
                return Decision::Wait(Reason::JoinWindow { until });
            }
            let admitted: Vec<NodeId> = live.iter().map(|j| j.id).collect();
            let mut members = admitted.clone();
            members.sort();
            plan(s, members, admitted, Vec::new(), Then::Compute)
        }
        Phase::Compute { barrier_opened } => {
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
            let deadline = barrier_opened.map(|o| o + cfg.barrier_timeout);
            if missing.is_empty() {
                return boundary(now, s, cfg, Vec::new());
            }
            if deadline.is_some_and(|d| now >= d) {
                let evicted = missing.into_iter().map(|id| (id, EvictReason::BarrierMissed));
                return boundary(now, s, cfg, evicted.collect());
            }
            Decision::Wait(Reason::Barrier {
                outer_step: s.outer_step,
                arrived: ids.len() - missing.len(),
                of: ids.len(),
                deadline,
            })
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
                    Then::Reduce(round(s, &members, 0, Vec::new()))
                } else {
                    Then::Sync { transfers: assign_transfers(&pending, &pool, cfg.state_senders) }
                };
                return plan(s, members, Vec::new(), dead, then);
            }
            if pending.is_empty() {
                return Decision::Release(round(s, &ids, 0, Vec::new()));
            }
            if now >= deadline {
                let evicted: Vec<(NodeId, EvictReason)> =
                    pending.iter().map(|&id| (id, EvictReason::SyncTimeout)).collect();
                let members = without(&ids, &evicted);
                let then = Then::Reduce(round(s, &members, 0, Vec::new()));
                return plan(s, members, Vec::new(), evicted, then);
            }
            Decision::Wait(Reason::Syncing { pending, deadline })
        }
        Phase::Reduce { attempt, since, failed_at } => {
            let done = s.members.values().filter(|m| m.done).count();
            if done == s.members.len() {
                // Everyone holds the same result, even a member that died since sending Done.
                return Decision::Commit { outer_step: s.outer_step };
            }
            let backoff = failed_at.map(|f| f + cfg.retry_backoff);
            // An all-reduce that made no progress for the whole timeout is not retried on the
            // same members: the step is skipped, and a member whose application hangs is then
            // evicted at the next barrier.
            let timed_out = now >= *since + cfg.allreduce_timeout;
            let retry = !dead.is_empty() || backoff.is_some_and(|b| now >= b) || timed_out;
            if retry {
                let members = without(&ids, &dead);
                let then = if *attempt >= cfg.max_retries || (timed_out && dead.is_empty()) {
                    Then::Skip { attempts: attempt + 1 }
                } else {
                    Then::Reduce(round(s, &members, attempt + 1, Vec::new()))
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
        .collect();
    if admitted.is_empty() && evicted.is_empty() {
        return Decision::Release(round(s, &survivors, 0, Vec::new()));
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
    let transfers = assign_transfers(&admitted, &pool, cfg.state_senders);
    let then = if cfg.join_mode == JoinMode::Blocking && !transfers.is_empty() {
        Then::Sync { transfers }
    } else {
        // Joiners are not members of `s` yet, so `weights` gives them 0.
        Then::Reduce(round(s, &members, 0, transfers))
    };
    plan(s, members, admitted, evicted, then)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mesh::{LeaveReason, MemberInfo};
    use std::time::Duration;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn t(s: u64) -> Time {
        Time::ZERO + secs(s)
    }

    /// `now - d`: the past, faked.
    fn ago(now: Time, d: Duration) -> Time {
        Time::from_nanos(now.as_nanos() - d.as_nanos() as u64)
    }

    fn cfg() -> MeshConfig {
        MeshConfig::default()
    }

    /// A mesh in epoch 1 computing step 0, with members `ids`, all heard from at `seen`.
    fn mesh(ids: &[u32], seen: Time) -> MeshState {
        let mut s = MeshState { epoch: Epoch(1), ..MeshState::default() };
        s.phase = Phase::Compute { barrier_opened: None };
        for &i in ids {
            s.members.insert(NodeId(i), MemberInfo::new(0, seen, Epoch(1), 0, true));
        }
        s
    }

    fn arrive(s: &mut MeshState, ids: &[u32], at: Time) {
        for &i in ids {
            s.members.get_mut(&NodeId(i)).unwrap().arrived = Some(s.outer_step);
        }
        if let Phase::Compute { barrier_opened } = &mut s.phase {
            barrier_opened.get_or_insert(at);
        }
    }

    fn queue(s: &mut MeshState, id: u32, at: Time) {
        s.queue.push(Joiner { id: NodeId(id), incarnation: 0, queued_at: at, last_seen: at });
    }

    fn reducing(ids: &[u32], seen: Time, attempt: u32) -> MeshState {
        let mut s = mesh(ids, seen);
        s.phase = Phase::Reduce { attempt, since: seen, failed_at: None };
        s
    }

    fn expect_epoch(d: Decision) -> EpochPlan {
        match d {
            Decision::NewEpoch(p) => p,
            other => panic!("expected a new epoch, got {other}"),
        }
    }

    fn n(ids: &[u32]) -> Vec<NodeId> {
        ids.iter().map(|&i| NodeId(i)).collect()
    }

    #[test]
    fn forming_waits_for_min_members_and_the_window() {
        let c = MeshConfig { min_members: 2, join_window: secs(5), ..cfg() };
        let mut s = MeshState::default();
        assert_eq!(decide(t(0), &s, &c), Decision::Wait(Reason::NoJoiners));
        queue(&mut s, 1, t(0));
        assert_eq!(
            decide(t(1), &s, &c),
            Decision::Wait(Reason::TooFewJoiners { joined: 1, need: 2 })
        );
        queue(&mut s, 0, t(1));
        assert_eq!(decide(t(2), &s, &c), Decision::Wait(Reason::JoinWindow { until: t(5) }));
        let p = expect_epoch(decide(t(5), &s, &c));
        assert_eq!(p.epoch, Epoch(1));
        assert_eq!(p.members, n(&[0, 1]));
        assert_eq!(p.admitted, n(&[1, 0]));
        assert_eq!(p.then, Then::Compute);
    }

    #[test]
    fn all_arrived_releases_in_the_same_epoch_with_unit_weights() {
        let mut s = mesh(&[0, 1, 2], t(10));
        arrive(&mut s, &[0, 1, 2], t(10));
        match decide(t(10), &s, &cfg()) {
            Decision::Release(r) => {
                assert_eq!(r.ring, n(&[0, 1, 2]));
                assert_eq!(r.weights, vec![Weight::ONE; 3]);
                assert_eq!(r.attempt, 0);
            }
            d => panic!("{d}"),
        }
    }

    #[test]
    fn a_joiner_waits_for_the_boundary_then_is_admitted_once_with_weight_zero() {
        let c = MeshConfig { join_mode: JoinMode::NonBlocking, ..cfg() };
        let mut s = mesh(&[0, 1], t(10));
        queue(&mut s, 5, t(10));
        arrive(&mut s, &[0], t(10));
        assert!(matches!(decide(t(10), &s, &c), Decision::Wait(Reason::Barrier { .. })));
        arrive(&mut s, &[1], t(11));
        let p = expect_epoch(decide(t(11), &s, &c));
        assert_eq!(p.epoch, Epoch(2));
        assert_eq!(p.admitted, n(&[5]));
        assert_eq!(p.members, n(&[0, 1, 5]));
        match p.then {
            Then::Reduce(r) => {
                let w: Vec<f32> = r.weights.iter().map(|w| w.get()).collect();
                let pos = r.ring.iter().position(|&x| x == NodeId(5)).unwrap();
                assert_eq!(w[pos], 0.0);
                assert_eq!(w.iter().sum::<f32>(), 2.0);
                assert_eq!(r.transfers, vec![Transfer { joiner: NodeId(5), senders: n(&[0]) }]);
            }
            other => panic!("{other}"),
        }
    }

    #[test]
    fn blocking_mode_syncs_joiners_before_the_release() {
        let mut s = mesh(&[0, 1], t(10));
        queue(&mut s, 7, t(10));
        queue(&mut s, 8, t(10));
        arrive(&mut s, &[0, 1], t(10));
        let p = expect_epoch(decide(t(10), &s, &cfg()));
        assert_eq!(p.admitted, n(&[7, 8]));
        assert_eq!(
            p.then,
            Then::Sync {
                transfers: vec![
                    Transfer { joiner: NodeId(7), senders: n(&[0]) },
                    Transfer { joiner: NodeId(8), senders: n(&[1]) },
                ]
            }
        );
    }

    #[test]
    fn a_sender_dying_during_sync_reassigns_the_transfer() {
        let mut s = mesh(&[0, 1, 7], t(100));
        s.members.get_mut(&NodeId(7)).unwrap().synced = false;
        s.members.get_mut(&NodeId(7)).unwrap().first_step = 1;
        s.phase = Phase::Sync { since: t(100) };
        s.members.get_mut(&NodeId(0)).unwrap().last_seen = ago(t(100), secs(10));
        let p = expect_epoch(decide(t(100), &s, &cfg()));
        assert_eq!(p.evicted, vec![(NodeId(0), EvictReason::HeartbeatTimeout)]);
        assert_eq!(
            p.then,
            Then::Sync { transfers: vec![Transfer { joiner: NodeId(7), senders: n(&[1]) }] }
        );
    }

    #[test]
    fn a_joiner_that_does_not_sync_in_time_is_evicted_and_the_rest_reduce() {
        let mut s = mesh(&[0, 1, 7], t(5000));
        s.members.get_mut(&NodeId(7)).unwrap().synced = false;
        s.phase = Phase::Sync { since: t(1000) };
        let p = expect_epoch(decide(t(1000) + cfg().sync_timeout, &s, &cfg()));
        assert_eq!(p.evicted, vec![(NodeId(7), EvictReason::SyncTimeout)]);
        assert!(matches!(p.then, Then::Reduce(ref r) if r.ring == n(&[0, 1])));
    }

    #[test]
    fn a_dead_heartbeat_is_judged_by_the_coordinators_clock() {
        let now = t(100);
        let mut s = mesh(&[0, 1, 2], now);
        // Faked past: n1 was last heard 10 s ago.
        s.members.get_mut(&NodeId(1)).unwrap().last_seen = ago(now, secs(10));
        let p = expect_epoch(decide(now, &s, &cfg()));
        assert_eq!(p.evicted, vec![(NodeId(1), EvictReason::HeartbeatTimeout)]);
        assert_eq!(p.members, n(&[0, 2]));
        assert_eq!(p.then, Then::Compute);
        // 5.9 s is not yet dead.
        s.members.get_mut(&NodeId(1)).unwrap().last_seen = ago(now, Duration::from_millis(5900));
        assert!(matches!(decide(now, &s, &cfg()), Decision::Wait(_)));
    }

    #[test]
    fn a_deathrattle_shrinks_the_mesh_at_once() {
        let mut s = mesh(&[0, 1, 2], t(50));
        s.members.get_mut(&NodeId(2)).unwrap().leaving = Some(LeaveReason::Signal);
        let p = expect_epoch(decide(t(50), &s, &cfg()));
        assert_eq!(p.evicted, vec![(NodeId(2), EvictReason::Deathrattle(LeaveReason::Signal))]);
    }

    /// PRIME defect 2: a node that hangs but still beats must be evicted at the barrier deadline.
    #[test]
    fn a_hung_member_that_beats_is_evicted_at_the_barrier_deadline() {
        let c = cfg();
        let opened = t(1000);
        let deadline = opened + c.barrier_timeout;
        let mut s = mesh(&[0, 1, 2], deadline); // everyone beats
        arrive(&mut s, &[0, 2], opened);
        assert!(matches!(
            decide(ago(deadline, secs(1)), &s, &c),
            Decision::Wait(Reason::Barrier { arrived: 2, of: 3, .. })
        ));
        let p = expect_epoch(decide(deadline, &s, &c));
        assert_eq!(p.evicted, vec![(NodeId(1), EvictReason::BarrierMissed)]);
        assert!(matches!(p.then, Then::Reduce(ref r) if r.ring == n(&[0, 2])));
    }

    #[test]
    fn a_death_during_the_allreduce_retries_on_a_new_epoch_with_the_survivors_weights() {
        let now = t(200);
        let mut s = reducing(&[0, 1, 2, 3], now, 0);
        s.members.get_mut(&NodeId(3)).unwrap().last_seen = ago(now, secs(10));
        let p = expect_epoch(decide(now, &s, &cfg()));
        assert_eq!(p.epoch, Epoch(2));
        match p.then {
            Then::Reduce(r) => {
                assert_eq!(r.attempt, 1);
                assert_eq!(r.ring, n(&[0, 1, 2]));
                // PRIME defect 3: the divisor is the survivors' weight, 3, not the old 4.
                assert_eq!(r.weights.iter().map(|w| w.get()).sum::<f32>(), 3.0);
            }
            other => panic!("{other}"),
        }
    }

    /// PRIME defect 4: past the retry bound, every member skips (never a local fallback).
    #[test]
    fn past_max_retries_every_member_skips() {
        let now = t(300);
        let c = cfg();
        let mut s = reducing(&[0, 1, 2], now, c.max_retries);
        s.members.get_mut(&NodeId(2)).unwrap().leaving = Some(LeaveReason::Panic);
        let p = expect_epoch(decide(now, &s, &c));
        assert_eq!(p.then, Then::Skip { attempts: c.max_retries + 1 });
        assert_eq!(p.members, n(&[0, 1]));
    }

    #[test]
    fn a_reported_failure_waits_for_the_backoff_then_retries_with_the_same_members() {
        let c = cfg();
        let mut s = reducing(&[0, 1], t(400), 0);
        s.phase = Phase::Reduce { attempt: 0, since: t(400), failed_at: Some(t(401)) };
        let until = t(401) + c.retry_backoff;
        assert_eq!(decide(t(402), &s, &c), Decision::Wait(Reason::RetryBackoff { until }));
        let mut s2 = s.clone();
        for m in s2.members.values_mut() {
            m.last_seen = until;
        }
        let p = expect_epoch(decide(until, &s2, &c));
        assert!(p.evicted.is_empty());
        assert!(matches!(p.then, Then::Reduce(ref r) if r.attempt == 1 && r.ring.len() == 2));
    }

    #[test]
    fn an_allreduce_past_its_deadline_is_skipped_not_retried() {
        let c = cfg();
        let mut s = reducing(&[0, 1, 2], t(0), 0);
        let deadline = t(0) + c.allreduce_timeout;
        for m in s.members.values_mut() {
            m.last_seen = deadline;
        }
        assert!(matches!(decide(ago(deadline, secs(1)), &s, &c), Decision::Wait(_)));
        let p = expect_epoch(decide(deadline, &s, &c));
        assert_eq!(p.then, Then::Skip { attempts: 1 });
        assert_eq!(p.members, n(&[0, 1, 2]));
    }

    #[test]
    fn all_done_commits_even_if_one_died_after_reporting() {
        let now = t(500);
        let mut s = reducing(&[0, 1], now, 0);
        for m in s.members.values_mut() {
            m.done = true;
        }
        s.members.get_mut(&NodeId(1)).unwrap().last_seen = ago(now, secs(60));
        assert_eq!(decide(now, &s, &cfg()), Decision::Commit { outer_step: 0 });
    }

    #[test]
    fn a_joiner_queued_during_the_allreduce_waits_for_the_next_boundary() {
        let now = t(600);
        let mut s = reducing(&[0, 1], now, 0);
        queue(&mut s, 9, now);
        s.members.get_mut(&NodeId(1)).unwrap().leaving = Some(LeaveReason::Graceful);
        let p = expect_epoch(decide(now, &s, &cfg()));
        assert!(p.admitted.is_empty());
        assert_eq!(p.members, n(&[0]));
    }

    #[test]
    fn silent_joiners_are_forgotten_and_everyone_gone_forms_again() {
        let mut s = mesh(&[0], t(0));
        queue(&mut s, 4, t(0));
        assert_eq!(decide(t(6), &s, &cfg()), Decision::ForgetJoiners(n(&[4])));
        s.queue.clear();
        let p = expect_epoch(decide(t(6), &s, &cfg()));
        assert_eq!(p.then, Then::Forming);
        assert!(p.members.is_empty());
    }

    #[test]
    fn decisions_display() {
        let mut s = reducing(&[0, 1], t(0), 0);
        s.members.get_mut(&NodeId(1)).unwrap().leaving = Some(LeaveReason::Graceful);
        let d = decide(t(0), &s, &cfg());
        assert_eq!(
            d.to_string(),
            "new epoch e2: members [n0], evicted n1 (deathrattle (graceful exit)); then \
             all-reduce step 0 attempt 1 ring [n0] weight 1"
        );
    }

    #[test]
    fn next_deadline_is_the_earliest_timer() {
        let c = cfg();
        let mut s = mesh(&[0, 1], t(10));
        s.members.get_mut(&NodeId(0)).unwrap().last_seen = t(8);
        assert_eq!(next_deadline(&s, &c), Some(t(8) + c.heartbeat_timeout));
        arrive(&mut s, &[1], t(9));
        assert_eq!(next_deadline(&s, &c), Some(t(8) + c.heartbeat_timeout));
        s.phase = Phase::Reduce { attempt: 0, since: t(10), failed_at: Some(t(10)) };
        assert_eq!(
            next_deadline(&s, &c),
            Some((t(8) + c.heartbeat_timeout).min(t(10) + c.retry_backoff))
        );
    }
}
