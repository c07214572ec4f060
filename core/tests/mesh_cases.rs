//! The elastic mesh over the in-memory harness on a virtual clock: reference.md's test cases
//! 6 to 11, each citing the case and the PRIME defect it guards against; then the three edge
//! cases of the membership rules (no member holding the state, a barrier nobody reaches, a
//! restart that reuses its incarnation).

use loco_core::mesh::{
    Coordinator, CoordinatorAction, EvictReason, JoinMode, LeaveReason, MemberAction, MemberPhase,
    MeshConfig, MeshEvent, MeshMsg, Phase, StopReason, bottleneck,
};
use loco_core::testing::{Network, Workload};
use loco_core::{Epoch, NodeId, Time};
use std::time::Duration;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn at(s: u64) -> Time {
    Time::ZERO + secs(s)
}

/// 60 s of compute per outer step, 10 s per all-reduce, 20 s to receive the state.
fn workload() -> Workload {
    Workload::new(secs(60), secs(10), secs(20))
}

fn ids(v: &[u32]) -> Vec<NodeId> {
    v.iter().map(|&i| NodeId(i)).collect()
}

/// The epochs formed, in order: (time, epoch, members, admitted, evicted).
type Formed = (Time, Epoch, Vec<NodeId>, Vec<NodeId>, Vec<(NodeId, EvictReason)>);

fn formed(net: &Network) -> Vec<Formed> {
    net.events()
        .into_iter()
        .filter_map(|(t, e)| match e {
            MeshEvent::EpochFormed { epoch, members, admitted, evicted } => {
                Some((t, *epoch, members.clone(), admitted.clone(), evicted.clone()))
            }
            _ => None,
        })
        .collect()
}

/// The time of the first commit of `step`.
fn committed_at(net: &Network, step: u64) -> Option<Time> {
    net.events().into_iter().find_map(|(t, e)| match e {
        MeshEvent::Committed { outer_step, .. } if *outer_step == step => Some(t),
        _ => None,
    })
}

fn starts(net: &Network, id: NodeId) -> Vec<loco_core::mesh::AllReduceStart> {
    net.actions_of(id)
        .into_iter()
        .filter_map(|(_, a)| match a {
            MemberAction::StartAllReduce(s) => Some(s.clone()),
            _ => None,
        })
        .collect()
}

fn stops(net: &Network, id: NodeId) -> Vec<(Time, StopReason)> {
    net.actions_of(id)
        .into_iter()
        .filter_map(|(t, a)| match a {
            MemberAction::Stop(r) => Some((t, r.clone())),
            _ => None,
        })
        .collect()
}

/// Test case 6, first part: N nodes start and form one epoch.
#[test]
fn n_nodes_start_and_form_epoch_one() {
    let mut net = Network::formed(MeshConfig::default(), 4, &workload(), 1);
    net.run_for(secs(1)).unwrap();
    let c = net.coordinator().unwrap();
    assert_eq!(c.epoch(), Epoch(1));
    assert_eq!(c.members(), ids(&[0, 1, 2, 3]));
    for id in net.node_ids() {
        let m = net.member(id).unwrap();
        assert_eq!(m.epoch(), Some(Epoch(1)));
        assert_eq!(m.phase(), MemberPhase::Computing { outer_step: 0 });
    }
}

/// Test case 6: a joiner queued mid-step is admitted at the next boundary (size N+1, epoch+1)
/// and not before, with weight 0 for that step (it has no pseudo-gradient); the step's divisor
/// stays N. Blocking mode: it receives the state from an assigned sender first.
#[test]
fn a_joiner_queued_mid_step_is_admitted_at_the_next_boundary_and_not_before() {
    let mut net = Network::formed(MeshConfig::default(), 3, &workload(), 2);
    net.run_until(at(20)).unwrap(); // mid-compute of step 0
    net.add_node(NodeId(7), workload());
    net.run_until(at(59)).unwrap();
    // Queued, not admitted: the step has not ended.
    assert_eq!(net.coordinator().unwrap().members(), ids(&[0, 1, 2]));
    assert_eq!(net.coordinator().unwrap().epoch(), Epoch(1));
    assert_eq!(net.member(NodeId(7)).unwrap().phase(), MemberPhase::Joining);
    net.run_until(at(200)).unwrap();

    let f = formed(&net);
    assert_eq!(f.len(), 2, "{f:?}");
    let (t2, e2, members, admitted, evicted) = &f[1];
    assert_eq!(*e2, Epoch(2));
    assert_eq!(*members, ids(&[0, 1, 2, 7]));
    assert_eq!(*admitted, ids(&[7]));
    assert!(evicted.is_empty());
    // At the boundary: after the barrier of step 0 (60 s of compute), not before.
    assert!(*t2 >= at(60) && *t2 < at(61), "{t2}");

    // Blocking: the joiner fetched the state from one sender, and the all-reduce waited for it.
    let fetch: Vec<_> = net
        .actions_of(NodeId(7))
        .into_iter()
        .filter_map(|(t, a)| match a {
            MemberAction::FetchState { senders, .. } => Some((t, senders.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(fetch.len(), 1);
    assert_eq!(fetch[0].1.len(), 1);
    let sender = fetch[0].1[0];
    assert!(
        net.actions_of(sender)
            .iter()
            .any(|(_, a)| matches!(a, MemberAction::SendState { to, .. } if *to == NodeId(7)))
    );
    let s7 = starts(&net, NodeId(7));
    assert!(s7[0].outer_step == 0 && s7[0].weight.get() == 0.0, "{:?}", s7[0]);
    assert_eq!(s7[0].total_weight, 3.0, "the divisor of step 0 is the 3 old members");
    assert!(s7[0].ring.len() == 4);
    // Release after the 20 s transfer.
    let released = net
        .events()
        .into_iter()
        .find_map(|(t, e)| matches!(e, MeshEvent::Released { outer_step: 0, .. }).then_some(t))
        .unwrap();
    assert!(released >= *t2 + secs(20), "{released}");
    // From step 1 on it contributes with weight 1.
    assert_eq!(s7[1].outer_step, 1);
    assert_eq!((s7[1].weight.get(), s7[1].total_weight), (1.0, 4.0));
    // Admitted exactly once.
    let admitted = net
        .actions_of(NodeId(7))
        .into_iter()
        .filter(|(_, a)| matches!(a, MemberAction::Admitted { .. }))
        .count();
    assert_eq!(admitted, 1);
}

/// Test case 6: a graceful leave (deathrattle) shrinks the mesh at once, without waiting for
/// the heartbeat timeout.
#[test]
fn a_graceful_leave_shrinks_the_mesh_at_once() {
    let mut net = Network::formed(MeshConfig::default(), 4, &workload(), 3);
    net.run_until(at(30)).unwrap();
    net.leave(NodeId(2), LeaveReason::Signal);
    net.run_for(ms(10)).unwrap(); // one latency, not a timeout
    let c = net.coordinator().unwrap();
    assert_eq!(c.epoch(), Epoch(2));
    assert_eq!(c.members(), ids(&[0, 1, 3]));
    let f = formed(&net);
    assert_eq!(f[1].4, vec![(NodeId(2), EvictReason::Deathrattle(LeaveReason::Signal))]);
    assert_eq!(stops(&net, NodeId(2)), vec![(at(30), StopReason::Left(LeaveReason::Signal))]);
    // The others learn the new epoch and go on.
    net.run_until(at(75)).unwrap();
    for i in [0, 1, 3] {
        assert_eq!(net.member(NodeId(i)).unwrap().epoch(), Some(Epoch(2)));
        assert_eq!(net.member(NodeId(i)).unwrap().last_committed(), Some(0));
    }
}

/// Test case 6: a crash (SIGKILL, no deathrattle) is evicted after the heartbeat timeout, by the
/// coordinator's clock, and not before.
#[test]
fn a_crash_is_evicted_after_the_heartbeat_timeout() {
    let cfg = MeshConfig::default();
    let mut net = Network::formed(cfg.clone(), 3, &workload(), 4);
    net.run_until(at(31)).unwrap();
    net.crash(NodeId(1));
    // Its last heartbeat was sent at 30 s (every 2 s from 0): evicted at 36 s + latency.
    net.run_until(at(35)).unwrap();
    assert_eq!(net.coordinator().unwrap().members(), ids(&[0, 1, 2]));
    net.run_until(at(37)).unwrap();
    assert_eq!(net.coordinator().unwrap().members(), ids(&[0, 2]));
    let f = formed(&net);
    let (t, e, _, _, evicted) = &f[1];
    assert_eq!((*e, evicted.clone()), (Epoch(2), vec![(NodeId(1), EvictReason::HeartbeatTimeout)]));
    assert!(*t >= at(36) && *t <= at(36) + ms(10), "{t}");
}

/// Test case 6 (PRIME defect 3): an all-reduce in flight when a member crashes fails on every
/// survivor and is retried on the new epoch, with the survivors' weights as the divisor.
#[test]
fn an_allreduce_in_flight_is_retried_on_the_new_epoch_with_the_right_divisor() {
    let mut net = Network::formed(MeshConfig::default(), 4, &workload(), 5);
    net.run_until(at(65)).unwrap(); // the all-reduce of step 0 runs from 60 s to 70 s
    net.crash(NodeId(3));
    net.run_until(at(200)).unwrap();
    for i in 0..3 {
        let id = NodeId(i);
        let s = starts(&net, id);
        assert_eq!(s[0].epoch, Epoch(1));
        assert_eq!((s[0].attempt, s[0].total_weight), (0, 4.0));
        assert_eq!(s[1].epoch, Epoch(2));
        assert_eq!((s[1].outer_step, s[1].attempt, s[1].total_weight), (0, 1, 3.0));
        assert_eq!(s[1].ring, ids(&[0, 1, 2]));
        let aborted = net
            .actions_of(id)
            .into_iter()
            .any(|(_, a)| matches!(a, MemberAction::AbortAllReduce { epoch: Epoch(1), .. }));
        assert!(aborted, "{id} aborted the epoch-1 all-reduce");
        assert_eq!(net.member(id).unwrap().last_committed(), Some(1));
    }
    // Committed once, in epoch 2.
    let commits: Vec<_> = net
        .events()
        .into_iter()
        .filter_map(|(_, e)| match e {
            MeshEvent::Committed { epoch, outer_step: 0 } => Some(*epoch),
            _ => None,
        })
        .collect();
    assert_eq!(commits, vec![Epoch(2)]);
}

/// PRIME defect 4: past `max_retries`, every member skips the step (logged), none falls back to
/// its local pseudo-gradient. Here a second member dies during the retry.
#[test]
fn past_the_retry_bound_every_member_skips_the_step() {
    let cfg = MeshConfig { max_retries: 1, ..MeshConfig::default() };
    let mut net = Network::formed(cfg, 4, &workload(), 6);
    net.run_until(at(62)).unwrap();
    net.crash(NodeId(3)); // last heartbeat at 62 s: evicted at 68 s, attempt 1 released
    net.run_until(at(69)).unwrap();
    net.crash(NodeId(2)); // evicted at 74 s, before attempt 1 ends: the bound is reached
    net.run_until(at(100)).unwrap();
    let skipped: Vec<_> = net
        .events()
        .into_iter()
        .filter_map(|(t, e)| match e {
            MeshEvent::StepSkipped { outer_step, attempts, .. } => {
                Some((t, *outer_step, *attempts))
            }
            _ => None,
        })
        .collect();
    assert_eq!(skipped.len(), 1);
    assert_eq!((skipped[0].1, skipped[0].2), (0, 2));
    for i in 0..2 {
        let acts = net.actions_of(NodeId(i));
        let skip = acts
            .iter()
            .filter(|(_, a)| matches!(a, MemberAction::SkipStep { outer_step: 0, .. }))
            .count();
        let commit = acts
            .iter()
            .filter(|(_, a)| matches!(a, MemberAction::Commit { outer_step: 0, .. }))
            .count();
        assert_eq!((skip, commit), (1, 0), "n{i}");
        // It computes step 1 next, like everyone else.
        assert_eq!(
            net.member(NodeId(i)).unwrap().phase(),
            MemberPhase::Computing { outer_step: 1 }
        );
    }
    assert_eq!(net.coordinator().unwrap().members(), ids(&[0, 1]));
}

/// A member whose application hangs inside the all-reduce while its heartbeats go on: at the
/// all-reduce deadline every member skips the step (no retry of the stalled ring), and the hung
/// node is evicted at the next barrier deadline.
#[test]
fn an_allreduce_stalled_by_a_hung_member_is_skipped_then_the_member_evicted() {
    let cfg = MeshConfig {
        allreduce_timeout: secs(100),
        barrier_timeout: secs(300),
        ..MeshConfig::default()
    };
    let mut net = Network::formed(cfg, 3, &workload(), 13);
    net.run_until(at(61)).unwrap();
    net.hang(NodeId(2));
    net.run_until(at(161)).unwrap();
    let skipped: Vec<_> = net
        .events()
        .into_iter()
        .filter_map(|(t, e)| match e {
            MeshEvent::StepSkipped { outer_step, attempts, .. } => {
                Some((t, *outer_step, *attempts))
            }
            _ => None,
        })
        .collect();
    assert_eq!(skipped.len(), 1);
    assert!(skipped[0].0 >= at(160) && skipped[0].0 < at(161), "{:?}", skipped[0]);
    assert_eq!((skipped[0].1, skipped[0].2), (0, 1));
    // Barrier of step 1 opens at 220 s; the hung node is evicted at 520 s.
    net.run_until(at(519)).unwrap();
    assert_eq!(net.coordinator().unwrap().members(), ids(&[0, 1, 2]));
    net.run_until(at(521)).unwrap();
    assert_eq!(net.coordinator().unwrap().members(), ids(&[0, 1]));
    net.run_until(at(600)).unwrap();
    assert_eq!(net.member(NodeId(0)).unwrap().last_committed(), Some(1));
}

/// Test case 7 (PRIME defect 2): a node that hangs but keeps beating is evicted at the barrier
/// deadline, not before, and not by its heartbeats.
#[test]
fn a_hung_node_that_keeps_beating_is_evicted_at_the_barrier_deadline() {
    let cfg = MeshConfig { barrier_timeout: secs(300), ..MeshConfig::default() };
    let mut net = Network::formed(cfg, 3, &workload(), 7);
    net.run_until(at(30)).unwrap();
    net.hang(NodeId(1));
    // The others arrive at 60 s; the deadline is 360 s.
    net.run_until(at(359)).unwrap();
    assert_eq!(net.coordinator().unwrap().members(), ids(&[0, 1, 2]));
    assert_eq!(net.member(NodeId(1)).unwrap().phase(), MemberPhase::Computing { outer_step: 0 });
    net.run_until(at(361)).unwrap();
    let f = formed(&net);
    assert_eq!(f[1].4, vec![(NodeId(1), EvictReason::BarrierMissed)]);
    assert!(f[1].0 >= at(360), "{}", f[1].0);
    assert_eq!(net.coordinator().unwrap().members(), ids(&[0, 2]));
    assert!(matches!(
        stops(&net, NodeId(1))[..],
        [(_, StopReason::Evicted(EvictReason::BarrierMissed))]
    ));
    net.run_until(at(400)).unwrap();
    assert_eq!(net.member(NodeId(0)).unwrap().last_committed(), Some(0));
}

/// Test case 8 (PRIME defect 1): members whose clocks are 30 s ahead and 30 s behind are not
/// evicted: liveness is judged by the coordinator's receive time only.
#[test]
fn clock_skew_of_30_seconds_does_not_evict() {
    let cfg = MeshConfig { min_members: 3, join_window: Duration::ZERO, ..MeshConfig::default() };
    let mut net: Network = Network::new(cfg, 8);
    net.run_until(at(100)).unwrap();
    net.add_node_with(NodeId(0), workload(), 1, 0.0);
    net.add_node_with(NodeId(1), workload(), 1, 30.0);
    net.add_node_with(NodeId(2), workload(), 1, -30.0);
    net.run_until(at(1100)).unwrap();
    let f = formed(&net);
    assert_eq!(f.len(), 1, "no epoch change: {f:?}");
    assert_eq!(net.coordinator().unwrap().members(), ids(&[0, 1, 2]));
    let steps: Vec<_> = (0..3).map(|i| net.member(NodeId(i)).unwrap().last_committed()).collect();
    assert_eq!(steps, vec![Some(13); 3]);
}

/// Test case 9 (PRIME defect 6): two joiners at once are both admitted, once each, in one
/// epoch; a third that starts while that change is under way waits for the next boundary.
#[test]
fn two_joiners_at_once_are_both_admitted_once_each() {
    let cfg = MeshConfig::default();
    let mut net = Network::formed(cfg, 2, &workload(), 9);
    net.run_until(at(30)).unwrap();
    net.add_node(NodeId(5), workload());
    net.add_node(NodeId(6), workload());
    // The boundary is at 60 s; the joiners then receive the state for 20 s (blocking mode).
    net.run_until(at(70)).unwrap();
    assert!(matches!(net.coordinator().unwrap().state().phase, Phase::Sync { .. }));
    net.add_node(NodeId(7), workload()); // during the change
    net.run_until(at(300)).unwrap();
    let f = formed(&net);
    assert_eq!(f.len(), 3, "{f:?}");
    assert_eq!(f[1].3, ids(&[5, 6]));
    assert_eq!(f[1].2, ids(&[0, 1, 5, 6]));
    assert_eq!(f[2].3, ids(&[7]));
    assert!(f[2].0 > committed_at(&net, 0).unwrap(), "n7 waits for the boundary of step 1");
    for i in [5, 6, 7] {
        let n = net
            .actions_of(NodeId(i))
            .into_iter()
            .filter(|(_, a)| matches!(a, MemberAction::Admitted { .. }))
            .count();
        assert_eq!(n, 1, "n{i} admitted once");
    }
    let queued: Vec<_> = net
        .events()
        .into_iter()
        .filter_map(|(_, e)| match e {
            MeshEvent::JoinQueued { node, .. } => Some(*node),
            _ => None,
        })
        .collect();
    assert_eq!(queued, ids(&[0, 1, 5, 6, 7]));
    // The two senders split the joiners.
    let senders: Vec<NodeId> = [5, 6]
        .iter()
        .flat_map(|&i| {
            net.actions_of(NodeId(i)).into_iter().filter_map(|(_, a)| match a {
                MemberAction::FetchState { senders, .. } => Some(senders[0]),
                _ => None,
            })
        })
        .collect();
    assert_eq!(senders, ids(&[0, 1]));
}

/// A node that crashes and restarts before its heartbeat timeout: the old process is evicted as
/// restarted, the new one is admitted once at the next boundary.
#[test]
fn a_quick_restart_is_a_new_incarnation() {
    let mut net = Network::formed(MeshConfig::default(), 3, &workload(), 10);
    net.run_until(at(20)).unwrap();
    net.crash(NodeId(2));
    net.run_until(at(21)).unwrap();
    net.restart(NodeId(2), workload());
    net.run_until(at(200)).unwrap();
    let f = formed(&net);
    assert_eq!(f[1].4, vec![(NodeId(2), EvictReason::Restarted)]);
    assert!(f[1].0 < at(22), "evicted as soon as the new incarnation joined");
    assert_eq!(f[2].3, ids(&[2]));
    assert_eq!(net.coordinator().unwrap().members(), ids(&[0, 1, 2]));
    assert_eq!(net.member(NodeId(2)).unwrap().incarnation(), 1);
}

/// Test case 10 (PRIME defect 8): the coordinator dies; every member notices within the
/// coordinator timeout, waits for it (still a member) until `rejoin_for`, then stops with a clear
/// reason; nothing hangs.
#[test]
fn coordinator_death_stops_every_member_within_the_deadline() {
    for crash_at in [30, 65] {
        let cfg = MeshConfig::default();
        let mut net = Network::formed(cfg.clone(), 3, &workload(), 11);
        net.run_until(at(crash_at)).unwrap();
        net.crash_coordinator();
        net.run_until(at(crash_at + 600)).unwrap();
        assert_eq!(net.next_event(), None, "quiescent: nothing waits forever");
        for i in 0..3 {
            let noticed: Vec<Time> = net
                .actions_of(NodeId(i))
                .into_iter()
                .filter_map(|(t, a)| match a {
                    MemberAction::CoordinatorSilent { .. } => Some(t),
                    _ => None,
                })
                .collect();
            assert_eq!(noticed.len(), 1, "n{i} says so once: {noticed:?}");
            let deadline = at(crash_at) + cfg.coordinator_timeout;
            assert!(noticed[0] <= deadline, "n{i} noticed at {}", noticed[0]);
            assert!(noticed[0] + secs(3) >= deadline, "n{i} noticed at {}", noticed[0]);
            let s = stops(&net, NodeId(i));
            assert_eq!(s.len(), 1, "n{i}: {s:?}");
            let (t, reason) = &s[0];
            assert!(*t <= at(crash_at) + cfg.rejoin_for, "n{i} stopped at {t}");
            assert!(*t + secs(3) >= at(crash_at) + cfg.rejoin_for, "n{i} stopped at {t}");
            let StopReason::CoordinatorLost { last_committed, .. } = reason else {
                panic!("{reason}")
            };
            assert_eq!(*last_committed, None);
            assert!(reason.to_string().contains("coordinator lost"), "{reason}");
        }
    }
}

/// Test case 11, end to end: the members' probes measure the harness's links, and the ring of
/// the first all-reduce avoids the slow ones (the id-order ring would use both).
#[test]
fn the_ring_is_ordered_by_measured_bandwidth() {
    let mut net = Network::formed(MeshConfig::default(), 5, &workload(), 12);
    net.set_default_bandwidth(100e6);
    net.set_latency(ms(20));
    let slow = [(NodeId(0), NodeId(1)), (NodeId(3), NodeId(4))];
    for (a, b) in slow {
        net.set_bandwidth(a, b, 1e6);
    }
    net.run_until(at(75)).unwrap();
    let m = &net.coordinator().unwrap().state().bandwidth;
    assert_eq!(m.len(), 20, "every directed link measured");
    for a in 0..5 {
        for b in 0..5 {
            if a == b {
                continue;
            }
            let (a, b) = (NodeId(a), NodeId(b));
            let truth = if slow.contains(&(a, b)) { 1e6 } else { 100e6 };
            let got = m.get(a, b).unwrap();
            assert!((got / truth - 1.0).abs() < 0.1, "{a}->{b}: {got} vs {truth}");
        }
    }
    let ring = starts(&net, NodeId(0))[0].ring.clone();
    let idx: Vec<usize> = ring.iter().map(|n| n.0 as usize).collect();
    let w: Vec<Vec<f64>> = (0..5)
        .map(|a| {
            (0..5)
                .map(|b| if slow.contains(&(NodeId(a), NodeId(b))) { 1e6 } else { 100e6 })
                .collect()
        })
        .collect();
    assert_eq!(bottleneck(&idx, &w), 100e6, "ring {ring:?}");
    assert_eq!(bottleneck(&[0, 1, 2, 3, 4], &w), 1e6);
}

// ---- No member holding the state, a barrier nobody reaches, a reused incarnation ----

/// The coordinator's `NoSyncedMember` events: (time, outer step, evicted, unsynced).
type Halt = (Time, u64, Vec<(NodeId, EvictReason)>, Vec<NodeId>);

fn halts(net: &Network) -> Vec<Halt> {
    net.events()
        .into_iter()
        .filter_map(|(t, e)| match e {
            MeshEvent::NoSyncedMember { outer_step, evicted, unsynced, .. } => {
                Some((t, *outer_step, evicted.clone(), unsynced.clone()))
            }
            _ => None,
        })
        .collect()
}

/// Case 1, non-blocking: the members holding the state crash while the only joiner (weight 0)
/// still fetches it. The mesh must not train on from the joiner's fresh weights: the run stops
/// with a typed event, the joiner is told why, and so is a node that joins afterwards.
#[test]
fn non_blocking_joiner_left_without_any_synced_member_stops_the_run() {
    let cfg = MeshConfig { join_mode: JoinMode::NonBlocking, ..MeshConfig::default() };
    let slow_sync = Workload::new(secs(60), secs(10), secs(500));
    let mut net = Network::formed(cfg, 2, &slow_sync, 21);
    net.run_until(at(30)).unwrap();
    net.add_node(NodeId(2), slow_sync.clone());
    net.run_until(at(75)).unwrap(); // n2 admitted at 60 s with weight 0; step 0 committed
    assert_eq!(net.coordinator().unwrap().members(), ids(&[0, 1, 2]));
    net.crash(NodeId(0));
    net.crash(NodeId(1));
    net.run_until(at(100)).unwrap();
    let h = halts(&net);
    assert_eq!(h.len(), 1, "{h:?}");
    let (t, step, evicted, unsynced) = &h[0];
    assert!(*t >= at(80) && *t < at(81), "after the heartbeat timeout: {t}");
    assert_eq!(*step, 1);
    let hb = EvictReason::HeartbeatTimeout;
    assert_eq!(*evicted, vec![(NodeId(0), hb), (NodeId(1), hb)]);
    assert_eq!(*unsynced, ids(&[2]));
    assert!(net.coordinator().unwrap().is_stopped());
    assert_eq!(
        stops(&net, NodeId(2)).into_iter().map(|(_, r)| r).collect::<Vec<_>>(),
        vec![StopReason::NoSyncedMember { outer_step: 1, synced: false, last_committed: Some(0) }]
    );
    // It never trained on alone: no all-reduce of step 1, no epoch without a synced member.
    assert!(starts(&net, NodeId(2)).iter().all(|s| s.outer_step == 0));
    assert_eq!(formed(&net).len(), 2);
    // A node that joins later learns why at once.
    net.add_node(NodeId(3), workload());
    net.run_for(ms(10)).unwrap();
    let (_, r) = &stops(&net, NodeId(3))[0];
    assert!(matches!(r, StopReason::NoSyncedMember { outer_step: 1, synced: false, .. }));
    assert!(r.to_string().contains("resumed from checkpoints"), "{r}");
    assert_eq!(net.next_event(), None, "quiescent");
}

/// Case 1, blocking: the only sender dies while two joiners receive the state. Before, they were
/// released into an all-reduce of total weight 0 and trained on from their fresh weights.
#[test]
fn blocking_joiners_whose_sender_died_stop_the_run() {
    let mut net = Network::formed(MeshConfig::default(), 1, &workload(), 22);
    net.run_until(at(30)).unwrap();
    net.add_node(NodeId(5), workload());
    net.add_node(NodeId(6), workload());
    net.run_until(at(65)).unwrap(); // the boundary at 60 s: both fetch the state from n0
    assert!(matches!(net.coordinator().unwrap().state().phase, Phase::Sync { .. }));
    net.crash(NodeId(0));
    net.run_until(at(200)).unwrap();
    let h = halts(&net);
    assert_eq!(h.len(), 1, "{h:?}");
    assert_eq!((h[0].1, h[0].3.clone()), (0, ids(&[5, 6])));
    for i in [5, 6] {
        assert!(starts(&net, NodeId(i)).is_empty(), "n{i} never reduced");
        assert_eq!(
            stops(&net, NodeId(i)).into_iter().map(|(_, r)| r).collect::<Vec<_>>(),
            vec![StopReason::NoSyncedMember { outer_step: 0, synced: false, last_committed: None }]
        );
    }
}

/// Case 2: every member hangs while still beating. Nobody reaches the barrier, yet the wait ends
/// at `compute_timeout` after the step began: all are evicted as having missed the barrier, which
/// leaves no member holding the state, so the run stops; a queued joiner is told why.
#[test]
fn a_mesh_whose_members_all_hang_is_stopped_at_the_compute_deadline() {
    let cfg = MeshConfig { compute_timeout: secs(300), ..MeshConfig::default() };
    let mut net = Network::formed(cfg, 3, &workload(), 23);
    net.run_until(at(30)).unwrap();
    for i in 0..3 {
        net.hang(NodeId(i));
    }
    net.run_until(at(100)).unwrap();
    net.add_node(NodeId(7), workload());
    net.run_until(at(299)).unwrap();
    assert_eq!(net.coordinator().unwrap().members(), ids(&[0, 1, 2]), "they still beat");
    assert!(halts(&net).is_empty());
    net.run_until(at(301)).unwrap();
    let h = halts(&net);
    assert_eq!(h.len(), 1, "{h:?}");
    let missed: Vec<_> = (0..3).map(|i| (NodeId(i), EvictReason::BarrierMissed)).collect();
    assert_eq!((h[0].1, h[0].2.clone(), h[0].3.clone()), (0, missed, vec![]));
    for i in 0..3 {
        assert!(matches!(
            stops(&net, NodeId(i))[..],
            [(_, StopReason::Evicted(EvictReason::BarrierMissed))]
        ));
    }
    assert!(matches!(
        stops(&net, NodeId(7))[..],
        [(_, StopReason::NoSyncedMember { outer_step: 0, synced: false, last_committed: None })]
    ));
}

/// Case 2: the compute deadline only bounds a barrier nobody reached. Once a member arrives,
/// the deadline is `barrier_timeout` after that arrival, even past `compute_timeout`.
#[test]
fn the_compute_deadline_does_not_cut_short_a_barrier_that_opened() {
    let cfg = MeshConfig {
        compute_timeout: secs(100),
        barrier_timeout: secs(300),
        ..MeshConfig::default()
    };
    let mut net = Network::formed(cfg, 3, &workload(), 24);
    net.run_until(at(30)).unwrap();
    net.hang(NodeId(1));
    net.run_until(at(359)).unwrap();
    assert_eq!(net.coordinator().unwrap().members(), ids(&[0, 1, 2]));
    net.run_until(at(361)).unwrap();
    assert_eq!(net.coordinator().unwrap().members(), ids(&[0, 2]));
    assert_eq!(formed(&net)[1].4, vec![(NodeId(1), EvictReason::BarrierMissed)]);
}

/// Case 3: a member's process restarts with the incarnation of the one before. Its state died
/// with the old process: the old membership is evicted as restarted at once (it must not count
/// as holding the state, nor be waited for), the new process is refused (each incarnation is
/// admitted once), and the others go on.
#[test]
fn a_restart_that_reuses_its_incarnation_is_evicted_and_refused() {
    let mut net = Network::formed(MeshConfig::default(), 3, &workload(), 25);
    net.run_until(at(90)).unwrap(); // step 0 committed at 70 s, step 1 computing
    net.restart_same_incarnation(NodeId(1), workload());
    net.run_until(at(91)).unwrap();
    let f = formed(&net);
    assert_eq!(f.len(), 2, "{f:?}");
    assert_eq!(
        (f[1].2.clone(), f[1].4.clone()),
        (ids(&[0, 2]), vec![(NodeId(1), EvictReason::Restarted)])
    );
    assert!(f[1].0 < at(90) + ms(10), "evicted as soon as it joined: {}", f[1].0);
    let refused: Vec<_> = net
        .events()
        .into_iter()
        .filter_map(|(_, e)| match e {
            MeshEvent::JoinRefused { node, incarnation, reason } => {
                Some((*node, *incarnation, *reason))
            }
            _ => None,
        })
        .collect();
    assert_eq!(refused, vec![(NodeId(1), 0, EvictReason::IncarnationReused)]);
    let m1 = net.member(NodeId(1)).unwrap();
    assert_eq!(m1.incarnation(), 0);
    assert!(m1.is_stopped());
    let s1 = stops(&net, NodeId(1));
    assert_eq!(s1.last().unwrap().1, StopReason::Evicted(EvictReason::IncarnationReused));
    net.run_until(at(200)).unwrap();
    for i in [0, 2] {
        assert_eq!(net.member(NodeId(i)).unwrap().last_committed(), Some(1));
    }
    // A restart with a new incarnation is admitted again at the next boundary.
    net.restart(NodeId(1), workload());
    net.run_until(at(300)).unwrap();
    assert_eq!(net.coordinator().unwrap().members(), ids(&[0, 1, 2]));
}

/// Case 3 meets case 1: the only member restarts with its incarnation. Its state is gone and
/// nobody else holds it: the run stops rather than re-form from the new process's fresh weights.
#[test]
fn the_only_member_restarting_with_its_incarnation_stops_the_run() {
    let mut net = Network::formed(MeshConfig::default(), 1, &workload(), 26);
    net.run_until(at(90)).unwrap();
    net.restart_same_incarnation(NodeId(0), workload());
    net.run_until(at(100)).unwrap();
    let h = halts(&net);
    assert_eq!(h.len(), 1, "{h:?}");
    assert_eq!((h[0].1, h[0].2.clone()), (1, vec![(NodeId(0), EvictReason::Restarted)]));
    assert!(net.member(NodeId(0)).unwrap().is_stopped());
    assert_eq!(formed(&net).len(), 1, "no new epoch from fresh weights");
}

/// Case 3, the coordinator alone: a `Join` with a member's incarnation is a repeat while the
/// member has not shown it knows it was admitted (answered with the admission again, nothing
/// evicted), and a restart after that.
#[test]
fn a_repeated_join_is_a_repeat_only_until_the_member_confirms_its_admission() {
    let cfg = MeshConfig { min_members: 2, join_window: Duration::ZERO, ..MeshConfig::default() };
    let mut c = Coordinator::new(cfg);
    let drain = |c: &mut Coordinator| std::iter::from_fn(|| c.poll_action()).collect::<Vec<_>>();
    let n0 = NodeId(0);
    let n1 = NodeId(1);
    c.handle_message(
        at(0),
        n0,
        MeshMsg::Join { incarnation: 4, held: Some(loco_core::mesh::Held::default()), finished: 0 },
    );
    c.handle_message(
        at(0),
        n1,
        MeshMsg::Join { incarnation: 9, held: Some(loco_core::mesh::Held::default()), finished: 0 },
    );
    let a = drain(&mut c);
    let view = |to, incarnation| CoordinatorAction::Send {
        to,
        msg: MeshMsg::View { epoch: Epoch(1), outer_step: 0, members: ids(&[0, 1]), incarnation },
    };
    assert!(a.contains(&view(n0, 4)) && a.contains(&view(n1, 9)), "{a:?}");
    // The join repeated with the heartbeats crosses the view: a repeat, answered again.
    c.handle_message(
        at(1),
        n0,
        MeshMsg::Join { incarnation: 4, held: Some(loco_core::mesh::Held::default()), finished: 0 },
    );
    let a = drain(&mut c);
    assert!(a.contains(&view(n0, 4)), "{a:?}");
    assert_eq!(c.epoch(), Epoch(1));
    // n0's process shows that it knows it is a member.
    let beat = MeshMsg::Heartbeat {
        seq: 1,
        epoch: Some(Epoch(1)),
        phase: MemberPhase::Computing { outer_step: 0 },
        synced: true,
        withheld: None,
    };
    c.handle_message(at(2), n0, beat);
    assert!(c.state().members[&n0].confirmed);
    drain(&mut c);
    // Now the same incarnation joining again is a restarted process.
    c.handle_message(
        at(3),
        n0,
        MeshMsg::Join { incarnation: 4, held: Some(loco_core::mesh::Held::default()), finished: 0 },
    );
    let a = drain(&mut c);
    let reason = EvictReason::IncarnationReused;
    assert!(a.contains(&CoordinatorAction::Send { to: n0, msg: MeshMsg::Evicted { reason } }));
    assert!(a.contains(&CoordinatorAction::Event(MeshEvent::JoinRefused {
        node: n0,
        incarnation: 4,
        reason
    })));
    assert_eq!(c.members(), ids(&[1]));
    assert!(c.state().queue.is_empty(), "not queued");
    let formed = a.iter().find_map(|x| match x {
        CoordinatorAction::Event(MeshEvent::EpochFormed { evicted, .. }) => Some(evicted.clone()),
        _ => None,
    });
    assert_eq!(formed, Some(vec![(n0, EvictReason::Restarted)]));
    // It stays refused; a new incarnation is queued.
    c.handle_message(
        at(4),
        n0,
        MeshMsg::Join { incarnation: 4, held: Some(loco_core::mesh::Held::default()), finished: 0 },
    );
    assert!(
        drain(&mut c)
            .contains(&CoordinatorAction::Send { to: n0, msg: MeshMsg::Evicted { reason } })
    );
    c.handle_message(
        at(5),
        n0,
        MeshMsg::Join { incarnation: 5, held: Some(loco_core::mesh::Held::default()), finished: 0 },
    );
    assert!(c.state().is_queued(n0));
}

/// Who holds the state: a non-blocking joiner whose `Release` (its admission) was lost, and
/// whose step then ended, is never sent a `View`: a member that receives a `View` while waiting
/// for its admission takes itself for a founding member holding the initial state, and would
/// report itself synced with fresh weights.
#[test]
fn a_joiner_that_missed_its_admission_is_not_admitted_as_a_founding_member() {
    let cfg = MeshConfig {
        min_members: 2,
        join_window: Duration::ZERO,
        join_mode: JoinMode::NonBlocking,
        allreduce_timeout: secs(100),
        heartbeat_timeout: secs(1000), // nobody is silent here
        ..MeshConfig::default()
    };
    let mut c = Coordinator::new(cfg);
    let drain = |c: &mut Coordinator| std::iter::from_fn(|| c.poll_action()).collect::<Vec<_>>();
    let (n0, n1, n5) = (NodeId(0), NodeId(1), NodeId(5));
    c.handle_message(
        at(0),
        n0,
        MeshMsg::Join { incarnation: 0, held: Some(loco_core::mesh::Held::default()), finished: 0 },
    );
    c.handle_message(
        at(0),
        n1,
        MeshMsg::Join { incarnation: 0, held: Some(loco_core::mesh::Held::default()), finished: 0 },
    );
    c.handle_message(
        at(1),
        n5,
        MeshMsg::Join { incarnation: 0, held: Some(loco_core::mesh::Held::default()), finished: 0 },
    );
    let computing = |k| MemberPhase::Computing { outer_step: k };
    let beat =
        |epoch, phase| MeshMsg::Heartbeat { seq: 0, epoch, phase, synced: true, withheld: None };
    for n in [n0, n1] {
        c.handle_message(at(2), n, beat(Some(Epoch(1)), computing(0)));
        c.handle_message(at(2), n, MeshMsg::Barrier { outer_step: 0, withheld: false, held: None });
    }
    assert_eq!(c.members(), ids(&[0, 1, 5]), "admitted at the boundary");
    drain(&mut c); // n5's Release is lost
    // The all-reduce stalls (n5 never runs it; its heartbeats meanwhile are lost) and is skipped.
    let t = at(2) + secs(100);
    c.handle_timeout(t);
    assert!(matches!(c.state().phase, Phase::Compute { .. }), "{:?}", c.state().phase);
    c.handle_message(
        t + secs(1),
        n5,
        MeshMsg::Heartbeat {
            seq: 1,
            epoch: None,
            phase: MemberPhase::Joining,
            synced: false,
            withheld: None,
        },
    );
    // A member leaves mid-compute: the new epoch's `View` goes to the others only.
    c.handle_message(t + secs(2), n1, MeshMsg::Leave { reason: LeaveReason::Graceful });
    let sent: Vec<_> = drain(&mut c)
        .into_iter()
        .filter_map(|a| match a {
            CoordinatorAction::Send { to, msg: MeshMsg::View { .. } } => Some(to),
            _ => None,
        })
        .collect();
    assert_eq!(sent, ids(&[0]));
    assert!(!c.state().members[&n5].synced);
}

/// Bounded coordinator state: 40,000 ids that join (a flood of fake ids, or a planner's huge
/// run) fill the queue up to `max_queue` and no further; the rest are told the queue is full,
/// said once as an event. A boundary admits at most `max_admissions`, the longest queued first,
/// and the next joins are queued again as places free.
#[test]
fn forty_thousand_joins_fill_the_queue_to_its_cap_and_admissions_are_capped_per_boundary() {
    let cfg = MeshConfig {
        min_members: 1,
        join_window: Duration::ZERO,
        heartbeat_timeout: secs(100_000), // nobody is silent here
        ..MeshConfig::default()
    };
    let (max_queue, max_admissions) = (cfg.max_queue, cfg.max_admissions);
    let mut c = Coordinator::new(cfg);
    let held = Some(loco_core::mesh::Held::default());
    let drain = |c: &mut Coordinator| std::iter::from_fn(|| c.poll_action()).collect::<Vec<_>>();
    // The mesh forms with node 0 alone; then the flood.
    c.handle_message(at(0), NodeId(0), MeshMsg::Join { incarnation: 0, held, finished: 0 });
    c.handle_timeout(at(0));
    drain(&mut c);
    assert_eq!(c.members(), vec![NodeId(0)]);
    let mut full = 0;
    let mut events = 0;
    for i in 1..=40_000u32 {
        c.handle_message(at(1), NodeId(i), MeshMsg::Join { incarnation: 0, held, finished: 0 });
        for a in drain(&mut c) {
            match a {
                CoordinatorAction::Send { msg: MeshMsg::QueueFull, .. } => full += 1,
                CoordinatorAction::Event(MeshEvent::QueueFull { max }) => {
                    assert_eq!(max, max_queue);
                    events += 1;
                }
                _ => {}
            }
        }
    }
    assert_eq!(c.state().queue.len(), max_queue);
    assert_eq!(full, 40_000 - max_queue, "every join beyond the cap is told");
    assert_eq!(events, 1, "the queue filling is said once");
    // Node 0 reaches the barrier: the boundary admits the first `max_admissions` joiners.
    c.handle_message(
        at(70),
        NodeId(0),
        MeshMsg::Barrier { outer_step: 0, withheld: false, held: None },
    );
    let admitted: Vec<NodeId> = drain(&mut c)
        .into_iter()
        .find_map(|a| match a {
            CoordinatorAction::Event(MeshEvent::EpochFormed { admitted, .. }) => Some(admitted),
            _ => None,
        })
        .expect("a new epoch at the boundary");
    assert_eq!(admitted, (1..=max_admissions as u32).map(NodeId).collect::<Vec<_>>());
    assert_eq!(c.state().queue.len(), max_queue - max_admissions);
    // Places freed: a join that was refused is queued now.
    c.handle_message(at(71), NodeId(40_000), MeshMsg::Join { incarnation: 0, held, finished: 0 });
    assert!(c.state().is_queued(NodeId(40_000)));
}

/// A restarted coordinator (a new process that knows nobody): a node beating as a member of
/// epoch 7 is answered "not a member" and awaited, the mesh is founded on its state (a fresh
/// joiner behind it waits for the first boundary), and its epochs go on above 7; a joiner that
/// knows step 5 was finished keeps the mesh from being founded on a state of step 3; a forged
/// epoch at the end of the count is not taken.
#[test]
fn a_restarted_coordinator_awaits_its_old_members_and_numbers_its_epochs_above_theirs() {
    use loco_core::mesh::Held;
    let cfg = MeshConfig { min_members: 1, join_window: Duration::ZERO, ..MeshConfig::default() };
    let drain = |c: &mut Coordinator| std::iter::from_fn(|| c.poll_action()).collect::<Vec<_>>();
    let formed = |actions: &[CoordinatorAction]| {
        actions.iter().find_map(|a| match a {
            CoordinatorAction::Event(MeshEvent::EpochFormed { epoch, admitted, .. }) => {
                Some((*epoch, admitted.clone()))
            }
            _ => None,
        })
    };
    let beat = |epoch: u64| MeshMsg::Heartbeat {
        seq: 9,
        epoch: Some(Epoch(epoch)),
        phase: MemberPhase::Computing { outer_step: 5 },
        synced: true,
        withheld: None,
    };
    let fresh = Some(Held::default());
    let at_step = |s| Some(Held { outer_step: s, digest: None });
    let (n0, n1, n2, n3) = (NodeId(0), NodeId(1), NodeId(2), NodeId(3));

    let mut c = Coordinator::new(cfg.clone());
    c.handle_message(at(0), n0, beat(7));
    let refused = CoordinatorAction::Send {
        to: n0,
        msg: MeshMsg::Evicted { reason: EvictReason::NotAMember },
    };
    assert!(drain(&mut c).contains(&refused));
    c.handle_message(at(1), n1, MeshMsg::Join { incarnation: 0, held: fresh, finished: 0 });
    c.handle_timeout(at(1));
    assert_eq!(formed(&drain(&mut c)), None, "an old member still beats: it is awaited");
    c.handle_message(at(2), n0, MeshMsg::Join { incarnation: 1, held: at_step(5), finished: 5 });
    let (epoch, admitted) = formed(&drain(&mut c)).expect("formed once the old member joined");
    assert_eq!((epoch, admitted), (Epoch(8), vec![n0]));
    assert_eq!(c.outer_step(), 5);
    assert!(c.state().is_queued(n1), "the fresh joiner receives the state at the boundary");
    assert!(c.state().expected.is_empty(), "nobody is awaited once the mesh runs");

    // A state behind a step a joiner knows was finished founds nothing.
    let mut c = Coordinator::new(MeshConfig { min_members: 2, ..cfg.clone() });
    c.handle_message(at(0), n2, MeshMsg::Join { incarnation: 0, held: at_step(3), finished: 3 });
    c.handle_message(at(0), n3, MeshMsg::Join { incarnation: 0, held: None, finished: 5 });
    c.handle_timeout(at(0));
    assert_eq!(formed(&drain(&mut c)), None, "the newest state is gone: nothing is founded");

    // A forged epoch at the end of the count is not taken as the floor.
    let mut c = Coordinator::new(cfg);
    c.handle_message(at(0), n0, beat(u64::MAX));
    c.handle_message(at(0), n0, MeshMsg::Join { incarnation: 1, held: fresh, finished: 0 });
    c.handle_timeout(at(0));
    assert_eq!(formed(&drain(&mut c)).map(|f| f.0), Some(Epoch(1)));
}

/// A member's probe report is kept for links between members only: 40,000 made-up peer ids in
/// one report grow the coordinator's bandwidth matrix by nothing, and the real link is kept.
#[test]
fn a_probe_report_naming_made_up_peers_grows_nothing() {
    use loco_core::mesh::{Held, ProbeResult};
    let cfg = MeshConfig { min_members: 2, join_window: Duration::ZERO, ..MeshConfig::default() };
    let mut c = Coordinator::new(cfg);
    let held = Some(Held::default());
    for id in 0..2 {
        c.handle_message(at(0), NodeId(id), MeshMsg::Join { incarnation: 0, held, finished: 0 });
    }
    assert_eq!(c.members(), vec![NodeId(0), NodeId(1)]);
    let mut results: Vec<ProbeResult> =
        (100..40_100).map(|i| ProbeResult { peer: NodeId(i), bytes_per_sec: 1e9 }).collect();
    results.push(ProbeResult { peer: NodeId(1), bytes_per_sec: 5e8 });
    c.handle_message(at(1), NodeId(0), MeshMsg::ProbeReport { round: 1, results });
    assert_eq!(c.state().bandwidth.len(), 1);
    assert_eq!(c.state().bandwidth.get(NodeId(0), NodeId(1)), Some(5e8));
}

/// Members report the state they hold with their barrier arrival; one whose weights' digest
/// differs from a strict majority's after the same outer steps is evicted at the boundary
/// (`Diverged`), while a split with no strict majority evicts nobody.
#[test]
fn a_member_whose_weights_differ_from_the_majoritys_is_evicted() {
    use loco_core::digest::WeightsDigest;
    use loco_core::mesh::Held;
    for (digests, evicted) in [
        (vec![1u8, 1, 1, 1, 2], vec![4u32]),
        (vec![1, 1, 2, 2], vec![]),
        (vec![1, 1, 1, 1], vec![]),
        (vec![3, 1, 1, 2, 1], vec![0, 3]),
    ] {
        let n = digests.len() as u32;
        let cfg = MeshConfig {
            min_members: n as usize,
            join_window: Duration::ZERO,
            ..MeshConfig::default()
        };
        let mut c = Coordinator::new(cfg);
        for i in 0..n {
            let held = Some(Held::default());
            c.handle_message(at(0), NodeId(i), MeshMsg::Join { incarnation: 0, held, finished: 0 });
        }
        assert_eq!(c.members(), (0..n).map(NodeId).collect::<Vec<_>>());
        // Step 0: everyone arrives with the initial state and the step commits.
        for i in 0..n {
            let barrier =
                MeshMsg::Barrier { outer_step: 0, withheld: false, held: Some(Held::default()) };
            c.handle_message(at(60), NodeId(i), barrier);
        }
        let (epoch, attempt) = (c.epoch(), 0);
        for i in 0..n {
            let done = MeshMsg::Done { epoch, outer_step: 0, attempt, norms: None };
            c.handle_message(at(70), NodeId(i), done);
        }
        assert_eq!(c.outer_step(), 1);
        while c.poll_action().is_some() {}
        // Step 1: the digests of the weights after step 0.
        for (i, d) in digests.iter().enumerate() {
            let held = Held { outer_step: 1, digest: Some(WeightsDigest::from_bytes([*d; 8])) };
            let barrier = MeshMsg::Barrier { outer_step: 1, withheld: false, held: Some(held) };
            c.handle_message(at(130), NodeId(i as u32), barrier);
        }
        let got: Vec<(NodeId, EvictReason)> = std::iter::from_fn(|| c.poll_action())
            .find_map(|a| match a {
                CoordinatorAction::Event(MeshEvent::EpochFormed { evicted, .. }) => Some(evicted),
                _ => None,
            })
            .unwrap_or_default();
        let want: Vec<_> = evicted.iter().map(|&i| (NodeId(i), EvictReason::Diverged)).collect();
        assert_eq!(got, want, "digests {digests:?}");
    }
}
