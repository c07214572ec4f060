use super::*;
use crate::ids::Epoch;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[test]
fn three_nodes_form_and_commit_steps() {
    let w = Workload::new(secs(60), secs(5), secs(30));
    let mut net = Network::formed(MeshConfig::default(), 3, &w, 1);
    net.run_for(secs(200)).unwrap();
    let c = net.coordinator().unwrap();
    assert_eq!(c.epoch(), Epoch(1));
    assert_eq!(c.members().len(), 3);
    // 65 s per step (plus milliseconds of latency): 3 steps committed in 200 s.
    assert_eq!(c.outer_step(), 3);
    for id in net.node_ids() {
        assert_eq!(net.member(id).unwrap().last_committed(), Some(2));
    }
}

#[test]
fn runs_are_deterministic() {
    let run = || {
        let w = Workload::new(secs(60), secs(5), secs(30));
        let mut net = Network::formed(MeshConfig::default(), 4, &w, 9);
        net.set_drop_rate(0.01);
        net.run_for(secs(100)).unwrap();
        net.add_node(NodeId(9), w.clone());
        net.run_for(secs(300)).unwrap();
        format!("{:?}", net.trace())
    };
    assert_eq!(run(), run());
}
