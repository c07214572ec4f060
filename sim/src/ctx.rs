//! What every host of one replay shares: the scenario, the network, the recorder, and a control
//! block per node through which the driver plays churn (hang, resume, leave).

use crate::net::NetShared;
use crate::record::Recorder;
use loco_core::mesh::MeshConfig;
use loco_core::scenario::{NodeSpec, Scenario};
use loco_core::{NodeId, Time};
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use tokio::sync::Notify;

/// Real numerics settings.
pub struct RealSetup {
    /// The initial outer weights of every founding member.
    pub initial: Vec<f32>,
}

/// The driver's handle on one node.
pub struct NodeCtl {
    /// The node as declared.
    pub spec: NodeSpec,
    /// Bumped at every restart: each process of the node has its own.
    pub incarnation: Cell<u64>,
    /// Hung: computes nothing, takes part in nothing, but keeps beating.
    pub hung: Cell<bool>,
    /// Asked to leave gracefully.
    pub leave: Cell<bool>,
    /// Wakes the node when `hung` or `leave` changes.
    pub wake: Notify,
    /// Whether the node is a member of the mesh now (for the end-of-run events).
    pub member: Cell<bool>,
    /// A crash armed by a `crash` event with `during`: it strikes when the node next enters
    /// this phase in this outer step or a later one.
    pub armed: Cell<Option<(loco_core::scenario::FaultPhase, u64)>>,
    /// The armed crash struck: the node froze there, and the driver kills it at its next tick.
    pub struck: Cell<bool>,
}

/// Everything the hosts of one replay share.
pub struct RunCtx {
    /// The scenario.
    pub scenario: Scenario,
    /// The run's seed.
    pub seed: u64,
    /// The network (bandwidth model, connection generations).
    pub net: Rc<NetShared>,
    /// Rows, events, invariants.
    pub rec: Rc<RefCell<Recorder>>,
    /// One control block per node, by id.
    pub nodes: Vec<NodeCtl>,
    /// Real numerics, or `None` for sizes only.
    pub real: Option<RealSetup>,
    /// The mesh settings.
    pub mesh: MeshConfig,
    /// Parameters of the model (virtual numerics).
    pub params: u64,
    /// The event executor models each all-reduce whole (`[sim] collectives = "modelled"`).
    pub modelled_collectives: bool,
    /// Frames handed to the network by every host (a cost counter).
    pub frames: Cell<u64>,
    /// Set when the coordinator stopped the run because no member held the training state any
    /// more: why, for the summary's `stop_reason`.
    pub mesh_stopped: RefCell<Option<String>>,
    /// The coordinator's turmoil host is stopped (`coordinator-pause`): it reads and sends
    /// nothing. (The event executor holds the coordinator's inputs itself.)
    pub coordinator_paused: Cell<bool>,
    /// Wakes the coordinator when `coordinator_paused` changes.
    pub coordinator_wake: Notify,
}

impl RunCtx {
    /// The control block of `id`.
    pub fn node(&self, id: NodeId) -> &NodeCtl {
        &self.nodes[id.0 as usize]
    }

    /// Records an event.
    pub fn event(
        &self,
        now: Time,
        kind: loco_core::metrics::EventKind,
        node: Option<NodeId>,
        epoch: Option<loco_core::Epoch>,
        detail: impl Into<String>,
    ) {
        self.rec.borrow_mut().event(now, kind, node, epoch, detail);
    }
}
