//! The one translation of a scenario into a node's settings ([`NodeConfig::for_node`]), which
//! the simulator's hosts, the real worker and the test harness all call, so that a node is the
//! same node in every backend. What a scenario cannot say (the values the executor trains, its
//! clock's offset, what its transport pads) comes in [`ExecutorSide`].

use crate::diloco::OuterConfig;
use crate::ids::NodeId;
use crate::node::acct::RowIdentity;
use crate::node::machine::{NodeConfig, Numerics, StatePieces};
use crate::scenario::Scenario;
use std::collections::BTreeMap;

/// What the executor knows and the scenario does not.
#[derive(Clone, Debug)]
pub struct ExecutorSide {
    /// The values the node trains (real weights, or lengths only).
    pub numerics: Numerics,
    /// The lengths of the model's parameter tensors, in order (empty: fragments may cut
    /// anywhere, as for the synthetic model and virtual lengths).
    pub layers: Vec<usize>,
    /// Largest inner optimiser state a joiner accepts from a sender, in bytes (0: none).
    pub own_max: u64,
    /// Seconds added to the node's clock in its rows (a real launch's common time base).
    pub offset_s: f64,
    /// Whether this node writes checkpoints (a checkpoint directory is set).
    pub checkpoints: bool,
    /// Mesh probe padding is virtual (the simulator) or real zero bytes.
    pub virtual_padding: bool,
    /// The executor models virtual all-reduces itself ([`NodeConfig::modelled_collectives`]).
    pub modelled_collectives: bool,
}

/// The node `id` is not in the scenario.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("node {0} is not in the scenario (it has nodes 0 to {1})")]
pub struct UnknownNode(pub NodeId, pub usize);

/// The outer optimiser of a scenario's `[diloco]` table.
pub fn outer_config(s: &Scenario) -> OuterConfig {
    let d = s.diloco();
    OuterConfig {
        lr: d.outer_lr as f32,
        momentum: d.outer_momentum as f32,
        nesterov: d.nesterov,
        feedback: d.error_feedback.map(|b| b as f32),
    }
}

/// Local shards (GPUs) of a node spec, as the rings count them.
fn shards_of(gpus: u32) -> u16 {
    u16::try_from(gpus.max(1)).unwrap_or(u16::MAX)
}

impl NodeConfig {
    /// The settings of node `id` of scenario `s`, with what only the executor knows.
    ///
    /// One rule for state pieces in every backend: a sender cuts each part into as many pieces
    /// as the joiner has GPUs times the mesh's `state_senders` (parallel flows), and with real
    /// values into pieces of at most [`PIECE_MAX`](crate::node::state::PIECE_MAX) bytes
    /// besides (see [`StatePieces::PerJoinerShard`]).
    pub fn for_node(s: &Scenario, id: NodeId, exec: ExecutorSide) -> Result<Self, UnknownNode> {
        let spec = s.node(id).ok_or(UnknownNode(id, s.nodes().len()))?;
        let d = s.diloco();
        let len = match &exec.numerics {
            Numerics::Real { initial } => initial.len(),
            Numerics::Virtual { params } => usize::try_from(*params).unwrap_or(usize::MAX),
        };
        let shards: BTreeMap<NodeId, u16> =
            s.nodes().iter().map(|n| (n.id, shards_of(n.gpus))).collect();
        Ok(NodeConfig {
            id,
            mesh: s.mesh().clone(),
            shards: shards_of(spec.gpus),
            codec: d.codec,
            segment: d.segment_elems(),
            outer: outer_config(s),
            inner_steps: d.round_steps(),
            schedule: d.schedule(len, &exec.layers),
            numerics: exec.numerics,
            // An executor whose inner loop counts its tokens reports them
            // ([`Node::computed_tokens`](crate::node::machine::Node::computed_tokens)).
            batch_tokens: d.batch_tokens,
            checkpoint_every: exec.checkpoints.then(|| s.real().checkpoint_every.max(1)),
            state_pieces: StatePieces::PerJoinerShard { shards },
            own_max: exec.own_max,
            row: RowIdentity { node: spec.name.clone(), node_id: id.0, offset_s: exec.offset_s },
            virtual_padding: exec.virtual_padding,
            modelled_collectives: exec.modelled_collectives,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scenario() -> Scenario {
        Scenario::from_toml_str(
            r#"
name = "t"
[model]
preset = "tiny"
[diloco]
inner_steps = 4
[[regions]]
name = "r"
[[links]]
from = "r"
to = "r"
bandwidth = "1Gbit/s"
latency = "10ms"
[[nodes]]
name = "a"
count = 2
gpus = 2
step_time = "1s"
[[nodes]]
name = "b"
step_time = "1s"
[stop]
outer_steps = 2
"#,
            "t.toml",
        )
        .unwrap()
    }

    fn side(initial: Vec<f32>) -> ExecutorSide {
        ExecutorSide {
            numerics: Numerics::Real { initial },
            layers: Vec::new(),
            own_max: 0,
            offset_s: 0.0,
            checkpoints: false,
            virtual_padding: false,
            modelled_collectives: false,
        }
    }

    #[test]
    fn every_node_gets_the_scenario_settings_and_one_piece_rule() {
        let s = scenario();
        let c = NodeConfig::for_node(&s, NodeId(2), side(vec![0.0; 10])).unwrap();
        assert_eq!(c.id, NodeId(2));
        assert_eq!(c.shards, 1);
        assert_eq!(c.row.node, "b");
        assert_eq!(c.inner_steps, 4);
        assert_eq!(c.mesh, *s.mesh());
        assert_eq!(c.checkpoint_every, None);
        match &c.state_pieces {
            StatePieces::PerJoinerShard { shards } => {
                assert_eq!(shards.get(&NodeId(0)), Some(&2));
                assert_eq!(shards.get(&NodeId(2)), Some(&1));
            }
            other => panic!("the one rule is per joiner shard, got {other:?}"),
        }
        let e = NodeConfig::for_node(&s, NodeId(3), side(Vec::new())).unwrap_err();
        assert_eq!(e, UnknownNode(NodeId(3), 3));
    }
}
