//! Unit tests of the `decide` module (a sibling file keeps the module short).

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
    s.phase = Phase::Compute { since: seen, barrier_opened: None };
    for &i in ids {
        s.members.insert(NodeId(i), MemberInfo::new(0, seen, Epoch(1), 0, true));
    }
    s
}

fn arrive(s: &mut MeshState, ids: &[u32], at: Time) {
    for &i in ids {
        s.members.get_mut(&NodeId(i)).unwrap().arrived = Some(s.outer_step);
    }
    if let Phase::Compute { barrier_opened, .. } = &mut s.phase {
        barrier_opened.get_or_insert(at);
    }
}

fn queue(s: &mut MeshState, id: u32, at: Time) {
    s.queue.push(Joiner {
        id: NodeId(id),
        incarnation: 0,
        queued_at: at,
        last_seen: at,
        held: Some(crate::mesh::Held::default()),
        finished: 0,
    });
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
    assert_eq!(decide(t(1), &s, &c), Decision::Wait(Reason::TooFewJoiners { joined: 1, need: 2 }));
    queue(&mut s, 0, t(1));
    assert_eq!(decide(t(2), &s, &c), Decision::Wait(Reason::JoinWindow { until: t(5) }));
    let p = expect_epoch(decide(t(5), &s, &c));
    assert_eq!(p.epoch, Epoch(1));
    assert_eq!(p.members, n(&[0, 1]));
    assert_eq!(p.admitted, n(&[1, 0]));
    assert_eq!(p.then, Then::Compute);
}

/// The founders of a mesh: the joiners at the highest step holding a state, the largest group
/// with one digest among them; a joiner without a state, or behind, or in the smaller group,
/// stays queued; a queue where nobody holds a state waits.
#[test]
fn a_mesh_is_founded_on_the_state_most_joiners_hold_at_the_highest_step() {
    use crate::digest::WeightsDigest;
    use crate::mesh::Held;
    let c = MeshConfig { min_members: 1, join_window: secs(0), ..cfg() };
    let d = |b: u8| Some(WeightsDigest::from_bytes([b; 8]));
    let at = |outer_step, digest| Some(Held { outer_step, digest });
    let mut s = MeshState::default();
    let holds = [
        (0, at(7, d(1))), // the majority's digest at the highest step
        (1, at(7, d(2))), // another digest at that step
        (2, at(7, d(1))),
        (3, at(5, d(1))), // behind
        (4, None),        // was receiving the state
        (5, at(7, None)), // that step, digest unknown
    ];
    for (id, held) in holds {
        queue(&mut s, id, t(0));
        s.queue.last_mut().unwrap().held = held;
    }
    let p = expect_epoch(decide(t(0), &s, &c));
    assert_eq!(p.admitted, n(&[0, 2]));
    assert_eq!(p.members, n(&[0, 2]));
    // A tie between groups goes to a known digest, then to the smaller one.
    s.queue.retain(|j| [1, 2, 5].contains(&j.id.0));
    assert_eq!(expect_epoch(decide(t(0), &s, &c)).admitted, n(&[2]));
    s.queue.retain(|j| j.id.0 != 2);
    assert_eq!(expect_epoch(decide(t(0), &s, &c)).admitted, n(&[1]));
    // Nobody holds a state: nothing to found a mesh on.
    for j in &mut s.queue {
        j.held = None;
    }
    assert_eq!(
        decide(t(0), &s, &c),
        Decision::Wait(Reason::NoStateHolder { joined: 2, finished: 0 })
    );
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
fn the_ring_follows_the_measured_bandwidth_unless_it_is_told_to_go_in_id_order() {
    let mut s = mesh(&[0, 1, 2], t(10));
    arrive(&mut s, &[0, 1, 2], t(10));
    // 0 -> 2 -> 1 -> 0 is fast; every link of 0 -> 1 -> 2 -> 0 is slow.
    for (a, b, bw) in [(0, 2, 9e9), (2, 1, 9e9), (1, 0, 9e9), (0, 1, 1e9), (1, 2, 1e9), (2, 0, 1e9)]
    {
        s.bandwidth.set(NodeId(a), NodeId(b), bw);
    }
    let ring = |c: &MeshConfig| match decide(t(10), &s, c) {
        Decision::Release(r) => r.ring,
        d => panic!("{d}"),
    };
    assert_eq!(ring(&cfg()), n(&[0, 2, 1]));
    assert_eq!(ring(&MeshConfig { ring_order: RingOrder::Ids, ..cfg() }), n(&[0, 1, 2]));
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
fn silent_joiners_are_forgotten_and_everyone_gone_stops_the_run() {
    let mut s = mesh(&[0], t(0));
    queue(&mut s, 4, t(0));
    assert_eq!(decide(t(6), &s, &cfg()), Decision::ForgetJoiners(n(&[4])));
    s.queue.clear();
    // The last member is dead: nobody holds the state, the mesh does not form again from
    // fresh weights.
    assert_eq!(
        decide(t(6), &s, &cfg()),
        Decision::NoSyncedMember {
            evicted: vec![(NodeId(0), EvictReason::HeartbeatTimeout)],
            unsynced: vec![]
        }
    );
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

/// A joiner admitted at a boundary (no state yet, first step `first_step`).
fn joiner(s: &mut MeshState, id: u32, seen: Time, first_step: u64) {
    s.members.insert(NodeId(id), MemberInfo::new(0, seen, s.epoch, first_step, false));
}

fn dead(s: &mut MeshState, ids: &[u32], now: Time) {
    for &i in ids {
        s.members.get_mut(&NodeId(i)).unwrap().last_seen = ago(now, secs(10));
    }
}

/// Case 1, non-blocking: the synced members die during the all-reduce of the step their
/// joiner was admitted at; the joiner (weight 0, no state) must not go on alone.
#[test]
fn the_last_synced_members_dying_leaves_a_non_blocking_joiner_alone_and_stops_the_run() {
    let c = MeshConfig { join_mode: JoinMode::NonBlocking, ..cfg() };
    let now = t(100);
    let mut s = reducing(&[0, 1], now, 0);
    joiner(&mut s, 5, now, 1);
    dead(&mut s, &[0, 1], now);
    assert_eq!(
        decide(now, &s, &c),
        Decision::NoSyncedMember {
            evicted: vec![
                (NodeId(0), EvictReason::HeartbeatTimeout),
                (NodeId(1), EvictReason::HeartbeatTimeout)
            ],
            unsynced: n(&[5]),
        }
    );
    // The same while computing the next step (the joiner still fetching the state).
    let mut s = mesh(&[0, 1], now);
    s.outer_step = 1;
    joiner(&mut s, 5, now, 1);
    s.members.get_mut(&NodeId(1)).unwrap().leaving = Some(LeaveReason::Panic);
    dead(&mut s, &[0], now);
    let d = decide(now, &s, &c);
    assert!(matches!(d, Decision::NoSyncedMember { ref unsynced, .. } if *unsynced == n(&[5])));
    assert_eq!(
        d.to_string(),
        "stop: no member holds the state, evicted n0 (heartbeat timeout), evicted n1 \
         (deathrattle (panic)); left without it: [n5]"
    );
    // One synced member left is enough to go on.
    let mut s2 = s.clone();
    s2.members.get_mut(&NodeId(1)).unwrap().leaving = None;
    let p = expect_epoch(decide(now, &s2, &c));
    assert_eq!(p.members, n(&[1, 5]));
    // And once the joiner holds the state, it carries the mesh alone.
    s.members.get_mut(&NodeId(5)).unwrap().synced = true;
    let p = expect_epoch(decide(now, &s, &c));
    assert_eq!((p.members, p.then), (n(&[5]), Then::Compute));
}

/// Case 1, blocking: every sender of the joiners dies during the state transfer. Before, the
/// joiners were released into an all-reduce of total weight 0 and trained on from there.
#[test]
fn blocking_joiners_whose_senders_all_died_stop_the_run() {
    let now = t(100);
    let mut s = mesh(&[0], now);
    joiner(&mut s, 7, now, 1);
    joiner(&mut s, 8, now, 1);
    s.phase = Phase::Sync { since: now };
    s.members.get_mut(&NodeId(0)).unwrap().leaving = Some(LeaveReason::Signal);
    assert_eq!(
        decide(now, &s, &cfg()),
        Decision::NoSyncedMember {
            evicted: vec![(NodeId(0), EvictReason::Deathrattle(LeaveReason::Signal))],
            unsynced: n(&[7, 8]),
        }
    );
    // With a sender left, the transfers move to it.
    let mut s = mesh(&[0, 1], now);
    joiner(&mut s, 7, now, 1);
    s.phase = Phase::Sync { since: now };
    dead(&mut s, &[0], now);
    let p = expect_epoch(decide(now, &s, &cfg()));
    assert_eq!(
        p.then,
        Then::Sync { transfers: vec![Transfer { joiner: NodeId(7), senders: n(&[1]) }] }
    );
}

/// Case 1: the members left hold the state but have no pseudo-gradient for this step (they
/// were admitted at its boundary): the retry would average nothing, so the step is skipped.
#[test]
fn a_retry_with_weight_zero_on_every_member_skips_the_step() {
    let c = MeshConfig { join_mode: JoinMode::NonBlocking, ..cfg() };
    let now = t(100);
    let mut s = reducing(&[0], now, 0);
    joiner(&mut s, 5, now, 1);
    s.members.get_mut(&NodeId(5)).unwrap().synced = true;
    dead(&mut s, &[0], now);
    let p = expect_epoch(decide(now, &s, &c));
    assert_eq!(p.members, n(&[5]));
    assert_eq!(p.then, Then::Skip { attempts: 1 });
}

/// Case 1: before the first epoch no member holds anything yet, and none needs to: the
/// founding members all start from the same initial state.
#[test]
fn before_the_first_epoch_joiners_form_the_mesh() {
    let c = MeshConfig { join_window: Duration::ZERO, ..cfg() };
    let mut s = MeshState::default();
    queue(&mut s, 3, t(0));
    let p = expect_epoch(decide(t(0), &s, &c));
    assert_eq!((p.members, p.then), (n(&[3]), Then::Compute));
}

/// Case 2: every member hangs while still beating. The barrier never opens, but the wait is
/// bounded by `compute_timeout` from the step's start; all are evicted, which leaves nobody
/// holding the state.
#[test]
fn a_barrier_nobody_reaches_has_a_deadline_from_the_steps_start() {
    let c = MeshConfig { compute_timeout: secs(500), ..cfg() };
    let start = t(1000);
    let deadline = start + secs(500);
    let mut s = mesh(&[0, 1, 2], deadline); // everyone beats
    s.phase = Phase::Compute { since: start, barrier_opened: None };
    queue(&mut s, 9, deadline);
    assert_eq!(
        decide(ago(deadline, secs(1)), &s, &c),
        Decision::Wait(Reason::Barrier {
            outer_step: 0,
            arrived: 0,
            of: 3,
            deadline: Some(deadline)
        })
    );
    assert_eq!(next_deadline(&s, &c), Some(deadline));
    assert_eq!(
        decide(deadline, &s, &c),
        Decision::NoSyncedMember {
            evicted: [0, 1, 2].iter().map(|&i| (NodeId(i), EvictReason::BarrierMissed)).collect(),
            unsynced: vec![],
        }
    );
}

/// Case 2: once a member arrives, the deadline is `barrier_timeout` after that arrival, even
/// past `compute_timeout` (a slow step is not cut short).
#[test]
fn after_the_first_arrival_the_barrier_timeout_applies() {
    let c = MeshConfig { compute_timeout: secs(100), barrier_timeout: secs(300), ..cfg() };
    let start = t(1000);
    let mut s = mesh(&[0, 1], t(1500));
    s.phase = Phase::Compute { since: start, barrier_opened: None };
    arrive(&mut s, &[0], start + secs(90));
    let deadline = start + secs(390);
    assert_eq!(next_deadline(&s, &c), Some(deadline.min(t(1500) + c.heartbeat_timeout)));
    assert!(matches!(
        decide(ago(deadline, secs(1)), &s, &c),
        Decision::Wait(Reason::Barrier { arrived: 1, deadline: Some(d), .. }) if d == deadline
    ));
    let p = expect_epoch(decide(deadline, &s, &c));
    assert_eq!(p.evicted, vec![(NodeId(1), EvictReason::BarrierMissed)]);
}

/// A decision depends on nothing but its inputs.
#[test]
fn decide_is_a_pure_function() {
    let now = t(100);
    let mut s = mesh(&[0, 1], now);
    joiner(&mut s, 5, now, 1);
    dead(&mut s, &[0, 1], now);
    let before = s.clone();
    let a = decide(now, &s, &cfg());
    assert_eq!(a, decide(now, &s, &cfg()));
    assert_eq!(s, before);
}
