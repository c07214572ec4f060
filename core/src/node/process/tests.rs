//! Tests of the process around a node, driven through the harness of whole node machines.

use super::*;
use crate::mesh::MeshConfig;
use crate::testing::nodes::{NodeNet, Seen};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// Three nodes that formed a mesh and committed a step.
fn formed() -> NodeNet {
    let cfg = MeshConfig { min_members: 3, join_window: Duration::ZERO, ..MeshConfig::default() };
    let mut net = NodeNet::new(cfg, 8, secs(1), 7);
    for n in 0..3 {
        net.add(NodeId(n));
    }
    let ok =
        net.run_until_cond(Time::ZERO + secs(120), |net| net.hashes().contains_key(&0)).unwrap();
    assert!(ok, "the mesh formed and committed step 0");
    net
}

fn stops(net: &NodeNet, id: NodeId) -> Vec<(String, bool)> {
    net.record()
        .iter()
        .filter(|r| r.node == id)
        .filter_map(|r| match &r.what {
            Seen::Stop { reason, rejoin } => Some((reason.clone(), *rejoin)),
            _ => None,
        })
        .collect()
}

fn restarts(net: &NodeNet, id: NodeId) -> usize {
    net.record().iter().filter(|r| r.node == id && r.what == Seen::Fault("restart".into())).count()
}

#[test]
fn a_frame_belongs_to_the_phase_it_is_sent_in() {
    use crate::mesh::MeshMsg;
    assert_eq!(
        fault_phase(&Header::Mesh(MeshMsg::Join {
            incarnation: 0,
            held: Some(crate::mesh::Held::default()),
            finished: 0,
        })),
        None
    );
}

#[test]
fn an_incarnation_without_room_for_its_memberships_is_refused() {
    let net = formed();
    let cfg = net.node(NodeId(0)).unwrap().config().clone();
    assert!(matches!(
        Process::new(cfg.clone(), (u64::MAX >> 16) + 1),
        Err(ProcessError::Incarnation(_))
    ));
    let p = Process::new(cfg, 3).unwrap();
    assert_eq!(p.incarnation(), 3 << 16);
    assert_eq!(p.node().member().incarnation(), 3 << 16);
}

#[test]
fn an_evicted_node_rejoins_as_a_new_membership_of_its_process() {
    let mut net = formed();
    let id = NodeId(2);
    // Cut from everyone long enough to be evicted and to lose the coordinator.
    for other in [NodeId::COORDINATOR, NodeId(0), NodeId(1)] {
        net.cut(id, other);
    }
    net.run_for(secs(30)).unwrap();
    net.recover();
    let ok = net
        .run_until_cond(net.now() + secs(300), |net| {
            net.node(id).is_some_and(|n| n.member().incarnation() == 1 && n.is_synced())
        })
        .unwrap();
    assert!(ok, "node 2 came back as membership 1 of its process: {:?}", stops(&net, id));
    let s = stops(&net, id);
    assert!(s.first().is_some_and(|(_, rejoin)| *rejoin), "its first stop rejoins: {s:?}");
    assert_eq!(restarts(&net, id), 1);
}

#[test]
fn without_a_coordinator_a_process_gives_up_and_exits() {
    let mut net = formed();
    net.crash_coordinator();
    let m = MeshConfig::default();
    // Noticed after the coordinator timeout, then waiting, still members, until `rejoin_for`.
    let bound = m.rejoin_for + m.heartbeat_interval * 2;
    let ok = net
        .run_until_cond(net.now() + bound, |net| (0..3).all(|n| net.node(NodeId(n)).is_none()))
        .unwrap();
    assert!(ok, "every process exited within {bound:?}");
    for n in 0..3 {
        let s = stops(&net, NodeId(n));
        assert!(s.last().is_some_and(|(_, rejoin)| !rejoin), "the last stop is final: {s:?}");
        assert_eq!(s.len(), 1, "one membership, kept until it gave up: {s:?}");
    }
}

/// Node `id` cut from everyone past the coordinator timeout (it lost the coordinator, which
/// evicted it), then reconnected until its membership stopped: the coordinator answered its
/// next heartbeat with "not a member".
fn cut_until_stopped(net: &mut NodeNet, id: NodeId) {
    for other in [NodeId::COORDINATOR, NodeId(0), NodeId(1), NodeId(2)] {
        if other != id {
            net.cut(id, other);
        }
    }
    net.run_for(MeshConfig::default().coordinator_timeout + secs(2)).unwrap();
    assert!(stops(net, id).is_empty(), "node {id} waits for the coordinator, still a member");
    net.recover();
    let stopped =
        net.run_until_cond(net.now() + secs(120), |net| !stops(net, id).is_empty()).unwrap();
    assert!(stopped, "node {id} stopped");
}

#[test]
fn a_late_eviction_of_a_stopped_membership_does_not_stop_the_next() {
    use crate::mesh::{EvictReason, MeshMsg};
    let mut net = formed();
    let id = NodeId(1);
    cut_until_stopped(&mut net, id);
    assert_eq!(stops(&net, id).len(), 1);
    // The coordinator's answer to the old member's last heartbeat, arriving after it stopped.
    let stale = MeshMsg::Evicted { reason: EvictReason::NotAMember };
    net.send_as(NodeId::COORDINATOR, id, Frame::control(stale));
    let ok = net
        .run_until_cond(net.now() + secs(300), |net| {
            net.node(id).is_some_and(|n| n.member().incarnation() == 1 && n.is_synced())
        })
        .unwrap();
    assert!(ok, "the next membership is admitted and synced: {:?}", stops(&net, id));
    assert_eq!(stops(&net, id).len(), 1, "one stop, the first: {:?}", stops(&net, id));
    assert_eq!(restarts(&net, id), 1);
    assert!(net.node(id).is_some() && net.violations().is_empty(), "{:?}", net.violations());
}

#[test]
fn a_node_that_hangs_between_memberships_comes_back_hung() {
    let mut net = formed();
    let id = NodeId(1);
    cut_until_stopped(&mut net, id);
    assert!(stops(&net, id)[0].1, "to rejoin");
    net.hang(id, true);
    let interval = MeshConfig::default().heartbeat_interval;
    net.run_for(interval - Duration::from_millis(1)).unwrap();
    assert_eq!(restarts(&net, id), 0, "not before a heartbeat interval");
    net.run_for(Duration::from_millis(2)).unwrap();
    assert_eq!(restarts(&net, id), 1, "a heartbeat interval after it stopped");
    assert!(net.node(id).unwrap().is_suspended(), "the new member's application side hangs too");
    net.hang(id, false);
    let ok = net
        .run_until_cond(net.now() + secs(300), |net| net.node(id).is_some_and(Node::is_synced))
        .unwrap();
    assert!(ok, "once resumed it is admitted and receives the state");
}

#[test]
fn a_leave_between_memberships_ends_the_process() {
    let mut net = formed();
    let id = NodeId(1);
    cut_until_stopped(&mut net, id);
    net.leave(id);
    let s = stops(&net, id);
    assert_eq!(s.len(), 2, "{s:?}");
    assert!(s[1].0.starts_with("left the mesh") && !s[1].1, "{s:?}");
    net.run_for(EXIT_GRACE).unwrap();
    assert!(net.node(id).is_none(), "the process exited after its grace");
}
