//! Unit tests of the `member` module (a sibling file keeps the module short).

use super::*;

fn t(s: u64) -> Time {
    Time::ZERO + Duration::from_secs(s)
}

/// `now - d`: the past, faked.
fn ago(now: Time, d: Duration) -> Time {
    Time::from_nanos(now.as_nanos() - d.as_nanos() as u64)
}

fn drain(m: &mut Member) -> Vec<MemberAction> {
    std::iter::from_fn(|| m.poll_action()).collect()
}

fn joined(id: u32) -> Member {
    let mut m = Member::new(NodeId(id), 0, MeshConfig::default(), 1);
    m.join(t(0)).unwrap();
    m.handle_message(
        t(0),
        NodeId::COORDINATOR,
        MeshMsg::View {
            epoch: Epoch(1),
            outer_step: 0,
            members: vec![NodeId(0), NodeId(id)],
            incarnation: 0,
        },
    );
    drain(&mut m);
    m
}

fn release(epoch: u64, attempt: u32, ring: &[u32]) -> MeshMsg {
    MeshMsg::Release {
        epoch: Epoch(epoch),
        outer_step: 0,
        attempt,
        ring: ring.iter().map(|&i| NodeId(i)).collect(),
        weights: vec![Weight::ONE; ring.len()],
        incarnations: vec![0; ring.len()],
        transfers: vec![],
    }
}

/// A restarted process (incarnation 1) still joining gets the release and the sync its
/// predecessor (incarnation 0) was sent: neither admits it (found by the chaos suite, seed 230:
/// the new process reduced a step it never computed).
#[test]
fn a_release_or_sync_for_the_previous_incarnation_admits_nothing() {
    let mut m = Member::new(NodeId(3), 1, MeshConfig::default(), 1);
    m.join(t(0)).unwrap();
    drain(&mut m);
    let mut old = release(2, 0, &[0, 3]);
    if let MeshMsg::Release { incarnations, .. } = &mut old {
        *incarnations = vec![0, 0];
    }
    m.handle_message(t(1), NodeId::COORDINATOR, old);
    let sync = MeshMsg::Sync {
        epoch: Epoch(2),
        outer_step: 0,
        members: vec![NodeId(0), NodeId(3)],
        incarnations: vec![0, 0],
        transfers: vec![],
        vouched: None,
    };
    m.handle_message(t(1), NodeId::COORDINATOR, sync);
    assert_eq!(drain(&mut m), vec![]);
    assert_eq!((m.phase(), m.epoch()), (MemberPhase::Joining, None));
}

#[test]
fn join_then_view_admits_and_computes() {
    let mut m = Member::new(NodeId(3), 0, MeshConfig::default(), 1);
    m.join(t(0)).unwrap();
    assert_eq!(
        drain(&mut m),
        vec![MemberAction::Send {
            to: NodeId::COORDINATOR,
            msg: MeshMsg::Join {
                incarnation: 0,
                held: Some(crate::mesh::Held::default()),
                finished: 0
            },
            padding: 0
        }]
    );
    // A view meant for this node's previous process (another incarnation) admits nothing.
    let view = |incarnation| MeshMsg::View {
        epoch: Epoch(1),
        outer_step: 0,
        members: vec![NodeId(3)],
        incarnation,
    };
    m.handle_message(t(1), NodeId::COORDINATOR, view(7));
    assert_eq!(drain(&mut m), vec![]);
    assert_eq!(m.phase(), MemberPhase::Joining);
    m.handle_message(t(1), NodeId::COORDINATOR, view(0));
    let a = drain(&mut m);
    assert_eq!(a[0], MemberAction::Admitted { epoch: Epoch(1), outer_step: 0 });
    assert!(a.contains(&MemberAction::Compute { epoch: Epoch(1), outer_step: 0 }));
    assert_eq!(m.phase(), MemberPhase::Computing { outer_step: 0 });
    assert_eq!(m.epoch(), Some(Epoch(1)));
}

/// A queued joiner whose state changes (a commit's job came back after its join left) says so
/// with its join again; an unchanged state sends nothing, and a member's is kept for its next
/// join.
#[test]
fn a_queued_joiner_tells_a_changed_state_once() {
    use crate::mesh::Held;
    let mut m = Member::new(NodeId(1), 3, MeshConfig::default(), 1);
    m.set_held(None, 0);
    m.join(t(0)).unwrap();
    let sent = drain(&mut m);
    assert!(matches!(sent[..], [MemberAction::Send { msg: MeshMsg::Join { held: None, .. }, .. }]));
    m.handle_message(t(0), NodeId::COORDINATOR, MeshMsg::Queued { position: 0 });
    drain(&mut m);
    let held = Some(Held { outer_step: 4, digest: None });
    m.set_held(held, 0);
    let sent = drain(&mut m);
    assert!(
        matches!(&sent[..], [MemberAction::Send { msg: MeshMsg::Join { held: h, incarnation: 3, finished: 0 }, .. }] if *h == held),
        "{sent:?}"
    );
    m.set_held(held, 0);
    assert!(drain(&mut m).is_empty(), "unchanged: nothing sent");
    let mut member = joined(2);
    member.set_held(None, 0);
    assert!(drain(&mut member).is_empty(), "a member sends no join");
}

/// A joiner told the queue is full is not queued: its next heartbeat is its join again.
#[test]
fn a_joiner_told_the_queue_is_full_sends_its_join_again_with_the_next_heartbeat() {
    let cfg = MeshConfig::default();
    let mut m = Member::new(NodeId(1), 2, cfg.clone(), 1);
    m.join(t(0)).unwrap();
    drain(&mut m);
    m.handle_message(t(0), NodeId::COORDINATOR, MeshMsg::QueueFull);
    assert!(drain(&mut m).is_empty());
    m.handle_timeout(t(0) + cfg.heartbeat_interval);
    let sent = drain(&mut m);
    assert!(matches!(sent[..], [MemberAction::Send { msg: MeshMsg::Join { .. }, .. }]), "{sent:?}");
}

#[test]
fn heartbeats_repeat_join_until_queued_then_beat() {
    let cfg = MeshConfig::default();
    let mut m = Member::new(NodeId(1), 7, cfg.clone(), 1);
    m.join(t(0)).unwrap();
    drain(&mut m);
    let due = m.poll_timeout().unwrap();
    assert_eq!(due, t(0) + cfg.heartbeat_interval);
    m.handle_timeout(ago(due, Duration::from_millis(1))); // early: no-op
    assert!(drain(&mut m).is_empty());
    m.handle_timeout(due);
    assert!(matches!(
        drain(&mut m)[..],
        [MemberAction::Send {
            msg: MeshMsg::Join {
                incarnation: 7,
                held: Some(crate::mesh::Held { outer_step: 0, digest: None }),
                finished: 0,
            },
            ..
        }]
    ));
    m.handle_message(due, NodeId::COORDINATOR, MeshMsg::Queued { position: 0 });
    let due = m.poll_timeout().unwrap();
    m.handle_timeout(due);
    assert!(matches!(
        drain(&mut m)[..],
        [MemberAction::Send {
            msg: MeshMsg::Heartbeat {
                seq: 1,
                epoch: None,
                phase: MemberPhase::Joining,
                synced: false,
                withheld: None
            },
            ..
        }]
    ));
}

#[test]
fn a_silent_coordinator_is_noticed_then_the_member_waits_and_stops_at_rejoin_for() {
    let cfg = MeshConfig::default();
    let mut m = joined(1);
    let mut silent = Vec::new();
    let now = loop {
        let now = m.poll_timeout().expect("a member always has a deadline until it stops");
        m.handle_timeout(now);
        for a in drain(&mut m) {
            match a {
                MemberAction::CoordinatorSilent { .. } => silent.push((now, a)),
                MemberAction::Stop(r) => {
                    assert_eq!(
                        r,
                        StopReason::CoordinatorLost {
                            silent_for: cfg.rejoin_for,
                            last_committed: None,
                            pending: None
                        }
                    );
                    assert!(r.to_string().starts_with("coordinator lost"), "{r}");
                    assert!(m.is_stopped());
                    assert_eq!(m.poll_timeout(), None);
                }
                _ => {}
            }
        }
        if m.is_stopped() {
            break now;
        }
    };
    assert_eq!(now, t(0) + cfg.rejoin_for);
    // Noticed once, at the coordinator timeout; heartbeats went on until the stop.
    assert_eq!(
        silent,
        vec![(
            t(0) + cfg.coordinator_timeout,
            MemberAction::CoordinatorSilent {
                silent_for: cfg.coordinator_timeout,
                last_committed: None,
                waits: cfg.rejoin_for - cfg.coordinator_timeout,
            }
        )]
    );
}

#[test]
fn a_coordinator_that_answers_a_member_it_lost_keeps_the_membership_or_its_state() {
    let cfg = MeshConfig::default();
    // Every deadline met on time until `until`; the actions.
    let run_until = |m: &mut Member, until: Time| {
        let mut out = Vec::new();
        while let Some(now) = m.poll_timeout().filter(|&d| d <= until) {
            m.handle_timeout(now);
            out.extend(drain(m));
        }
        out
    };
    // Back within `rejoin_for`: the membership goes on.
    let mut m = joined(1);
    let late = t(0) + cfg.coordinator_timeout + Duration::from_secs(1);
    let a = run_until(&mut m, late);
    assert!(a.iter().any(|a| matches!(a, MemberAction::CoordinatorSilent { .. })), "{a:?}");
    m.handle_message(late, NodeId::COORDINATOR, MeshMsg::HeartbeatAck);
    let a = run_until(&mut m, late + (cfg.rejoin_for - Duration::from_secs(1)));
    assert!(!m.is_stopped(), "{a:?}");
    // A coordinator that no longer knows it (restarted, or it evicted the member meanwhile):
    // a loss that keeps the state for the rejoin, not an eviction.
    let mut m = joined(1);
    run_until(&mut m, late);
    m.handle_message(
        late,
        NodeId::COORDINATOR,
        MeshMsg::Evicted { reason: EvictReason::NotAMember },
    );
    let stop = drain(&mut m).into_iter().find_map(|a| match a {
        MemberAction::Stop(r) => Some(r),
        _ => None,
    });
    assert!(matches!(stop, Some(StopReason::CoordinatorLost { .. })), "{stop:?}");
    // From a coordinator that was heard all along, "not a member" is an eviction.
    let mut m = joined(1);
    m.handle_message(
        t(1),
        NodeId::COORDINATOR,
        MeshMsg::Evicted { reason: EvictReason::NotAMember },
    );
    let stop = drain(&mut m).into_iter().find_map(|a| match a {
        MemberAction::Stop(r) => Some(r),
        _ => None,
    });
    assert_eq!(stop, Some(StopReason::Evicted(EvictReason::NotAMember)));
}

#[test]
fn a_retry_aborts_then_restarts_and_old_reports_are_refused() {
    let mut m = joined(1);
    m.barrier_arrive(t(1), 0).unwrap();
    m.handle_message(t(2), NodeId::COORDINATOR, release(1, 0, &[0, 1, 2]));
    let a = drain(&mut m);
    let MemberAction::StartAllReduce(s) = a.last().unwrap().clone() else { panic!("{a:?}") };
    assert_eq!((s.epoch, s.op, s.total_weight), (Epoch(1), op_id(0, 0), 3.0));
    m.handle_message(t(3), NodeId::COORDINATOR, release(2, 1, &[0, 1]));
    let a = drain(&mut m);
    assert_eq!(a[0], MemberAction::AbortAllReduce { epoch: Epoch(1), op: op_id(0, 0) });
    assert!(matches!(&a[1], MemberAction::EpochChanged { epoch: Epoch(2), .. }));
    let MemberAction::StartAllReduce(s) = a[2].clone() else { panic!("{a:?}") };
    assert_eq!((s.epoch, s.attempt, s.total_weight), (Epoch(2), 1, 2.0));
    assert_eq!(
        m.report_allreduce_done(t(4), Epoch(1), op_id(0, 0), None),
        Err(MeshError::StaleEpoch { got: Epoch(1), current: Some(Epoch(2)) })
    );
    m.report_allreduce_done(t(4), Epoch(2), op_id(0, 1), None).unwrap();
    // A stale release of the older epoch changes nothing.
    m.handle_message(t(5), NodeId::COORDINATOR, release(1, 0, &[0, 1]));
    assert!(matches!(
        drain(&mut m)[..],
        [MemberAction::Send { msg: MeshMsg::Done { epoch: Epoch(2), attempt: 1, .. }, .. }]
    ));
    m.handle_message(t(6), NodeId::COORDINATOR, MeshMsg::Commit { epoch: Epoch(2), outer_step: 0 });
    let a = drain(&mut m);
    assert_eq!(a[0], MemberAction::Commit { epoch: Epoch(2), outer_step: 0 });
    assert_eq!(a[1], MemberAction::Compute { epoch: Epoch(2), outer_step: 1 });
    assert_eq!(m.last_committed(), Some(0));
}

#[test]
fn commands_in_the_wrong_phase_are_errors_not_panics() {
    let mut m = Member::new(NodeId(1), 0, MeshConfig::default(), 1);
    assert!(matches!(m.barrier_arrive(t(0), 0), Err(MeshError::WrongPhase { .. })));
    assert!(matches!(m.report_sync_done(t(0)), Err(MeshError::WrongPhase { .. })));
    let mut m = joined(1);
    assert_eq!(m.barrier_arrive(t(0), 5), Err(MeshError::WrongStep { got: 5, expected: Some(0) }));
    assert_eq!(
        m.report_allreduce_done(t(0), Epoch(1), 0, None),
        Err(MeshError::UnknownOp { got: 0, running: None })
    );
}

#[test]
fn probes_are_echoed_and_measured_on_the_local_clock() {
    let mut a = joined(1);
    let mut b = joined(2);
    a.handle_message(
        t(10),
        NodeId::COORDINATOR,
        MeshMsg::ProbeRequest { round: 1, peers: vec![NodeId(2), NodeId(1)] },
    );
    let bw = 100e6; // bytes/s
    let mut now = t(10);
    for _ in 0..20 {
        let acts = drain(&mut a);
        let mut sent = false;
        for act in acts {
            match act {
                MemberAction::Send { to: NodeId(2), msg, padding } => {
                    sent = true;
                    now += Duration::from_millis(5) + Duration::from_secs_f64(padding as f64 / bw);
                    b.handle_message(now, NodeId(1), msg);
                    let echo = drain(&mut b);
                    let [MemberAction::Send { to: NodeId(1), msg, padding: 0 }] = &echo[..] else {
                        panic!("{echo:?}")
                    };
                    now += Duration::from_millis(5);
                    a.handle_message(now, NodeId(2), msg.clone());
                }
                MemberAction::Send {
                    to: NodeId::COORDINATOR,
                    msg: MeshMsg::ProbeReport { round, results },
                    ..
                } => {
                    assert_eq!(round, 1);
                    assert_eq!(results.len(), 1);
                    assert_eq!(results[0].peer, NodeId(2));
                    assert!((results[0].bytes_per_sec / bw - 1.0).abs() < 1e-3);
                    return;
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(sent);
    }
    panic!("no report");
}

/// A member (or anyone speaking under a member's id) cannot tell another member that it was
/// evicted, that the run is over, to commit, skip, or start an all-reduce: only the
/// coordinator's messages are taken.
#[test]
fn membership_messages_from_a_member_are_ignored() {
    let mut m = joined(2);
    let before = m.phase();
    let forged = [
        MeshMsg::Evicted { reason: EvictReason::NotAMember },
        MeshMsg::Shutdown,
        MeshMsg::Commit { epoch: Epoch(1), outer_step: 0 },
        release(1, 0, &[0, 2]),
        MeshMsg::View { epoch: Epoch(9), outer_step: 5, members: vec![NodeId(2)], incarnation: 0 },
    ];
    for msg in forged {
        m.handle_message(t(1), NodeId(0), msg.clone());
        assert_eq!(drain(&mut m), vec![], "{msg:?}");
        assert_eq!((m.phase(), m.epoch()), (before, Some(Epoch(1))), "{msg:?}");
    }
}
