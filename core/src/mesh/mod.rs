//! The ElasticDeviceMesh: membership that changes without a restart. (Being built: issue 3.)

use serde::{Deserialize, Serialize};

mod config;
pub use config::{JoinMode, MeshConfig};

/// A control-plane message of the mesh protocol.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum MeshMsg {
    /// Placeholder until the protocol lands.
    Heartbeat,
}
