//! Property tests of the membership function: random event sequences against the coordinator,
//! and random churn scripts against the whole mesh in the harness. Invariants: no member in two
//! epochs at once, no joiner admitted twice, the ring always a permutation of the members,
//! replicas never disagree on an outer step's outcome, a running mesh always has a member that
//! holds the state (else the run stops), and nothing hangs.

use loco_core::mesh::{
    BandwidthMatrix, Coordinator, CoordinatorAction, LeaveReason, MemberAction, MemberPhase,
    MeshConfig, MeshEvent, MeshMsg, Phase, UpdateNorms, op_id, ring_order,
};
use loco_core::testing::{Network, TraceKind, Workload};
use loco_core::{Epoch, NodeId, Time};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

#[derive(Clone, Debug)]
enum Ev {
    Join(u32, u64),
    /// A heartbeat reporting one of six phases.
    Heartbeat(u32, u8),
    /// Barrier for the current step plus this offset (-1, 0, +1).
    Barrier(u32, i8),
    /// Done for the current round, or a stale one, with the update's norms (own, average; a
    /// negative average stands for NaN), or none.
    Done(u32, bool, Option<(f64, f64)>),
    /// Failed for the current round, naming another node (any, member or not) or none, with
    /// some frames received.
    Failed(u32, Option<u32>, u64),
    Synced(u32),
    Leave(u32),
    Advance(u64),
}

fn ev() -> impl Strategy<Value = Ev> {
    let node = 0u32..6;
    prop_oneof![
        (node.clone(), 0u64..2).prop_map(|(n, i)| Ev::Join(n, i)),
        (node.clone(), 0u8..6).prop_map(|(n, p)| Ev::Heartbeat(n, p)),
        (node.clone(), -1i8..=1).prop_map(|(n, o)| Ev::Barrier(n, o)),
        (node.clone(), any::<bool>(), proptest::option::of((0.0f64..10.0, -1.0f64..1e3)))
            .prop_map(|(n, s, norms)| Ev::Done(n, s, norms)),
        (node.clone(), proptest::option::of(0u32..7), 0u64..4)
            .prop_map(|(n, a, r)| Ev::Failed(n, a, r)),
        node.clone().prop_map(Ev::Synced),
        node.prop_map(Ev::Leave),
        (0u64..20_000).prop_map(Ev::Advance),
    ]
}

fn is_permutation(ring: &[NodeId], members: &[NodeId]) -> bool {
    let mut r = ring.to_vec();
    r.sort();
    r == members
}

/// Applies `ev` to the coordinator and checks the invariants on everything it emitted.
fn apply(c: &mut Coordinator, now: &mut Time, ev: &Ev, admitted: &mut BTreeSet<(NodeId, u64)>) {
    let before_epoch = c.epoch();
    let before_members = c.members();
    let s = c.state().clone();
    let (round_epoch, attempt) = match s.phase {
        Phase::Reduce { attempt, .. } => (s.epoch, attempt),
        _ => (s.epoch, 0),
    };
    let from = |n: u32| NodeId(n);
    match *ev {
        Ev::Join(n, inc) => c.handle_message(
            *now,
            from(n),
            MeshMsg::Join {
                incarnation: inc,
                held: Some(loco_core::mesh::Held::default()),
                finished: 0,
            },
        ),
        Ev::Heartbeat(n, p) => {
            let phase = match p {
                0 => MemberPhase::Joining,
                1 => MemberPhase::Computing { outer_step: s.outer_step },
                2 => MemberPhase::AtBarrier { outer_step: s.outer_step },
                3 => MemberPhase::AtBarrier { outer_step: s.outer_step.saturating_sub(1) },
                4 => MemberPhase::Reducing { outer_step: s.outer_step, attempt, done: true },
                _ => MemberPhase::Reducing {
                    outer_step: s.outer_step.saturating_sub(1),
                    attempt: 0,
                    done: true,
                },
            };
            let msg = MeshMsg::Heartbeat {
                seq: 0,
                epoch: Some(s.epoch),
                phase,
                synced: p % 2 == 0,
                withheld: None,
            };
            c.handle_message(*now, from(n), msg);
        }
        Ev::Barrier(n, o) => {
            let outer_step = s.outer_step.saturating_add_signed(i64::from(o));
            c.handle_message(
                *now,
                from(n),
                MeshMsg::Barrier { outer_step, withheld: false, held: None },
            );
        }
        Ev::Done(n, stale, norms) => {
            let epoch = if stale { Epoch(round_epoch.0.saturating_sub(1)) } else { round_epoch };
            let norms = norms.map(|(own, average)| UpdateNorms {
                own: Some(own),
                average: if average < 0.0 { f64::NAN } else { average },
            });
            let msg = MeshMsg::Done { epoch, outer_step: s.outer_step, attempt, norms };
            c.handle_message(*now, from(n), msg);
        }
        Ev::Failed(n, a, received) => {
            let (epoch, outer_step, accused) = (round_epoch, s.outer_step, a.map(from));
            let msg = MeshMsg::Failed { epoch, outer_step, attempt, accused, received };
            c.handle_message(*now, from(n), msg);
        }
        Ev::Synced(n) => c.handle_message(*now, from(n), MeshMsg::Synced { epoch: s.epoch }),
        Ev::Leave(n) => {
            c.handle_message(*now, from(n), MeshMsg::Leave { reason: LeaveReason::Graceful })
        }
        Ev::Advance(ms) => {
            *now += Duration::from_millis(ms);
            c.handle_timeout(*now);
        }
    }
    // Walk the outputs, following the epochs they form.
    let mut epoch = before_epoch;
    let mut members = before_members;
    while let Some(a) = c.poll_action() {
        match a {
            CoordinatorAction::Event(MeshEvent::EpochFormed {
                epoch: e,
                members: m,
                admitted: adm,
                evicted,
            }) => {
                assert_eq!(e, epoch.next(), "epochs advance one at a time");
                // No member in two epochs at once: the new epoch is the old one, minus the
                // evicted, plus the admitted, each node once.
                let mut expect: BTreeSet<NodeId> = members.iter().copied().collect();
                for (id, _) in &evicted {
                    assert!(expect.remove(id), "{id} evicted but not a member");
                }
                for id in &adm {
                    assert!(expect.insert(*id), "{id} admitted while a member");
                }
                let got: BTreeSet<NodeId> = m.iter().copied().collect();
                assert_eq!(got.len(), m.len(), "a node twice in {m:?}");
                assert_eq!(got, expect);
                for id in &adm {
                    let inc = c.state().members.get(id).map(|i| i.incarnation);
                    if let Some(inc) = inc {
                        assert!(admitted.insert((*id, inc)), "{id}#{inc} admitted twice");
                    }
                }
                epoch = e;
                members = m;
            }
            CoordinatorAction::Event(MeshEvent::NoSyncedMember {
                epoch: e,
                evicted,
                unsynced,
                ..
            }) => {
                // The run stops: the evicted leave, and none of the members left holds the state.
                assert_eq!(e, epoch);
                for (id, _) in &evicted {
                    assert!(members.contains(id), "{id} evicted but not a member");
                }
                members.retain(|id| !evicted.iter().any(|(g, _)| g == id));
                assert_eq!(unsynced, members);
                assert!(members.iter().all(|id| !c.state().members[id].synced));
                assert!(c.is_stopped());
            }
            CoordinatorAction::Event(MeshEvent::UpdateRefused { epoch: e, stopping, .. }) => {
                // Only an attempt every member finished is judged, and only with the guard on.
                assert_eq!(e, epoch);
                assert!(c.config().max_update_ratio > 0.0);
                assert_eq!(stopping, c.is_stopped());
            }
            CoordinatorAction::Send {
                to,
                msg: MeshMsg::Release { epoch: e, ring, weights, .. },
            } => {
                assert_eq!(e, epoch);
                assert!(members.contains(&to));
                assert!(is_permutation(&ring, &members), "ring {ring:?} members {members:?}");
                assert_eq!(ring.len(), weights.len());
            }
            CoordinatorAction::Send { to, msg: MeshMsg::View { epoch: e, members: m, .. } }
            | CoordinatorAction::Send { to, msg: MeshMsg::Sync { epoch: e, members: m, .. } }
            | CoordinatorAction::Send { to, msg: MeshMsg::Skip { epoch: e, members: m, .. } } => {
                assert_eq!((e, &m), (epoch, &members));
                assert!(m.contains(&to));
            }
            _ => {}
        }
    }
    assert_eq!(c.epoch(), epoch);
    assert_eq!(c.members(), members);
    let st = c.state();
    if let (Phase::Reduce { .. }, false) = (&st.phase, c.is_stopped()) {
        assert!(is_permutation(&st.ring, &members));
    }
    for j in &st.queue {
        assert!(!st.members.contains_key(&j.id) || st.members[&j.id].restarted);
    }
    // After the first epoch, a running mesh always has a member that holds the state.
    if !c.is_stopped() && st.phase != Phase::Forming {
        assert!(st.members.values().any(|m| m.synced), "no synced member: {st:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The coordinator under any sequence of messages and timeouts.
    #[test]
    fn membership_invariants_hold_for_any_event_sequence(
        events in proptest::collection::vec(ev(), 1..200),
        blocking in any::<bool>(),
        min_members in 1usize..4,
        guarded in any::<bool>(),
    ) {
        let cfg = MeshConfig {
            min_members,
            max_update_ratio: if guarded { 3.0 } else { 0.0 },
            join_window: Duration::from_secs(1),
            barrier_timeout: Duration::from_secs(30),
            sync_timeout: Duration::from_secs(20),
            allreduce_timeout: Duration::from_secs(25),
            join_mode: if blocking {
                loco_core::mesh::JoinMode::Blocking
            } else {
                loco_core::mesh::JoinMode::NonBlocking
            },
            ..MeshConfig::default()
        };
        let mut c = Coordinator::new(cfg);
        let mut now = Time::ZERO;
        let mut admitted = BTreeSet::new();
        for e in &events {
            apply(&mut c, &mut now, e, &mut admitted);
        }
    }

    /// The ring is a permutation of the members for any measured matrix.
    #[test]
    fn ring_order_is_a_permutation(
        ids in proptest::collection::btree_set(0u32..100, 0..20),
        entries in proptest::collection::vec((0u32..100, 0u32..100, 1u32..1000), 0..200),
    ) {
        let mut m = BandwidthMatrix::new();
        for (a, b, v) in entries {
            m.set(NodeId(a), NodeId(b), f64::from(v));
        }
        let nodes: Vec<NodeId> = ids.into_iter().map(NodeId).collect();
        let ring = ring_order(&nodes, &m);
        prop_assert!(is_permutation(&ring, &nodes));
    }
}

#[derive(Clone, Debug)]
enum Fault {
    Add,
    Crash(u32),
    Leave(u32),
    Hang(u32),
    Restart(u32),
    Isolate(u32),
    Recover,
}

fn fault() -> impl Strategy<Value = Fault> {
    let node = 0u32..8;
    prop_oneof![
        2 => Just(Fault::Add),
        2 => node.clone().prop_map(Fault::Crash),
        2 => node.clone().prop_map(Fault::Leave),
        1 => node.clone().prop_map(Fault::Hang),
        2 => node.clone().prop_map(Fault::Restart),
        1 => node.prop_map(Fault::Isolate),
        1 => Just(Fault::Recover),
    ]
}

/// Checks the trace of a harness run.
fn check_trace(net: &Network) {
    // (epoch, op) -> (ring, total weight), equal on every node.
    let mut rounds: BTreeMap<(Epoch, u64), (Vec<NodeId>, f32)> = BTreeMap::new();
    // outer step -> outcome (Some(epoch) = committed in it, None = skipped), equal everywhere.
    let mut outcomes: BTreeMap<u64, Option<Epoch>> = BTreeMap::new();
    let mut admitted: BTreeSet<(NodeId, usize)> = BTreeSet::new();
    for id in net.node_ids() {
        let mut running: Option<(Epoch, u64)> = None;
        let mut epoch = Epoch(0);
        let mut incarnation = 0usize;
        for t in net.trace().iter().filter(|t| t.node == id) {
            let a = match &t.what {
                TraceKind::Fault(f) if f.starts_with("start") => {
                    // A new process: its collectives start afresh.
                    incarnation += 1;
                    running = None;
                    epoch = Epoch(0);
                    continue;
                }
                TraceKind::Member(a) => a,
                _ => continue,
            };
            match a {
                MemberAction::Admitted { epoch: e, .. } => {
                    assert!(
                        admitted.insert((id, incarnation)),
                        "{id} incarnation {incarnation} admitted twice"
                    );
                    assert!(*e >= epoch);
                    epoch = *e;
                }
                MemberAction::EpochChanged { epoch: e, .. } => {
                    assert!(*e >= epoch, "{id}: epoch went back from {epoch} to {e}");
                    epoch = *e;
                }
                MemberAction::StartAllReduce(s) => {
                    assert!(running.is_none(), "{id}: two collectives at once");
                    assert!(s.epoch >= epoch);
                    epoch = s.epoch;
                    assert_eq!(s.op, op_id(s.outer_step, s.attempt));
                    let mut sorted = s.ring.clone();
                    sorted.sort();
                    sorted.dedup();
                    assert_eq!(sorted.len(), s.ring.len(), "ring with a duplicate");
                    assert!(s.ring.contains(&id));
                    let entry =
                        rounds.entry((s.epoch, s.op)).or_insert((s.ring.clone(), s.total_weight));
                    assert_eq!(
                        *entry,
                        (s.ring.clone(), s.total_weight),
                        "nodes disagree on a round"
                    );
                    running = Some((s.epoch, s.op));
                }
                MemberAction::AbortAllReduce { epoch: e, op } => {
                    assert_eq!(running, Some((*e, *op)), "{id}: abort of a collective not running");
                    running = None;
                }
                MemberAction::Commit { epoch: e, outer_step } => {
                    assert!(
                        running.is_some_and(|(re, _)| re == *e),
                        "{id}: commit without its collective"
                    );
                    running = None;
                    let o = outcomes.entry(*outer_step).or_insert(Some(*e));
                    assert_eq!(*o, Some(*e), "replicas disagree on step {outer_step}");
                }
                MemberAction::SkipStep { outer_step, .. } => {
                    assert!(running.is_none());
                    let o = outcomes.entry(*outer_step).or_insert(None);
                    assert_eq!(*o, None, "replicas disagree on step {outer_step}");
                }
                MemberAction::Stop(_) => running = None,
                _ => {}
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random churn against the whole mesh: the invariants hold, nothing livelocks, and after a
    /// quiet period the mesh is exactly the live, working nodes, all at the same step.
    #[test]
    fn churn_keeps_replicas_in_agreement(
        faults in proptest::collection::vec((1u64..400, fault()), 0..30),
        seed in any::<u64>(),
        lossy in any::<bool>(),
    ) {
        let w = Workload::new(Duration::from_secs(60), Duration::from_secs(10), Duration::from_secs(15));
        let cfg = MeshConfig {
            barrier_timeout: Duration::from_secs(120),
            sync_timeout: Duration::from_secs(120),
            allreduce_timeout: Duration::from_secs(300),
            compute_timeout: Duration::from_secs(600),
            ..MeshConfig::default()
        };
        let mut net = Network::formed(cfg, 4, &w, seed);
        net.set_max_steps(200_000);
        if lossy {
            // The transport may lose frames ("in order, or not at all").
            net.set_drop_rate(0.01);
        }
        let mut next_id = 4u32;
        let mut hung = BTreeSet::new();
        for (gap, f) in faults {
            let r = net.run_for(Duration::from_secs(gap));
            prop_assert!(r.is_ok(), "{:?}", r);
            match f {
                Fault::Add => {
                    net.add_node(NodeId(next_id), w.clone());
                    next_id += 1;
                }
                Fault::Crash(n) => net.crash(NodeId(n)),
                Fault::Leave(n) => net.leave(NodeId(n), LeaveReason::Graceful),
                Fault::Hang(n) if n < next_id => {
                    net.hang(NodeId(n));
                    hung.insert(NodeId(n));
                }
                Fault::Hang(_) => {}
                Fault::Restart(n) if n < next_id && !hung.contains(&NodeId(n)) => {
                    net.restart(NodeId(n), w.clone());
                }
                Fault::Restart(_) => {}
                Fault::Isolate(n) => net.isolate(NodeId(n)),
                Fault::Recover => net.recover(),
            }
        }
        net.recover();
        // Quiet period: evictions (heartbeat 6 s, barrier 120 s) and admissions settle.
        let r = net.run_for(Duration::from_secs(1500));
        prop_assert!(r.is_ok(), "{:?}", r);
        check_trace(&net);
        let Some(c) = net.coordinator() else { return Ok(()) };
        if c.is_stopped() {
            // No member holding the state was left (every synced one crashed, left, restarted
            // or hung): the run stopped rather than train on from fresh weights, and every node
            // still running has been told.
            let halted = net.events().iter().any(|(_, e)| matches!(e, MeshEvent::NoSyncedMember { .. }));
            prop_assert!(halted);
            for id in net.node_ids() {
                prop_assert!(net.member(id).is_none_or(|m| m.is_stopped()), "{} still runs", id);
            }
            return Ok(());
        }
        prop_assert!(c.state().phase != Phase::Forming, "a formed mesh never forms again");
        let working: Vec<NodeId> = net
            .node_ids()
            .into_iter()
            .filter(|id| !hung.contains(id))
            .filter(|&id| net.member(id).is_some_and(|m| !m.is_stopped()))
            .collect();
        // Hung members are evicted at the barrier deadline even if nobody arrives.
        prop_assert_eq!(c.members(), working.clone());
        let steps: BTreeSet<Option<u64>> =
            working.iter().map(|&id| net.member(id).unwrap().last_committed()).collect();
        let lo = steps.iter().next().copied().flatten();
        let hi = steps.iter().last().copied().flatten();
        prop_assert!(steps.len() <= 2 && hi.unwrap_or(0) - lo.unwrap_or(0) <= 1, "{:?}", steps);
    }
}
