//! Settings of the elastic mesh, with the defaults of the INTELLECT-1 report in one place.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// How a joiner receives the training state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum JoinMode {
    /// The others wait while the joiner receives the state (PRIME's production mode).
    #[default]
    Blocking,
    /// The others go on; the joiner contributes weight 0 until it has caught up.
    NonBlocking,
}

/// Settings of the elastic mesh. `Default` gives the values of the INTELLECT-1 report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MeshConfig {
    /// How often a member sends a heartbeat to the coordinator (default 2 s).
    pub heartbeat_interval: Duration,
    /// A member with no heartbeat for this long, by the coordinator's own clock, is evicted
    /// (default 6 s, as in the report; PRIME's code defaulted to 10 s).
    pub heartbeat_timeout: Duration,
    /// Deadline of the barrier before each all-reduce; a member that misses it is evicted even if
    /// it still sends heartbeats (default 600 s).
    pub barrier_timeout: Duration,
    /// How many times a failed all-reduce is retried on a new epoch (default 3).
    pub max_retries: u32,
    /// How joiners receive the state (default blocking).
    pub join_mode: JoinMode,
    /// Duration of the bandwidth probe between two members when the ring order is measured
    /// (default 1 s, like PRIME's iperf runs).
    pub probe_duration: Duration,
    /// Members notice a dead coordinator after this long without any message from it
    /// (default 3 x heartbeat_timeout).
    pub coordinator_timeout: Duration,
}

impl Default for MeshConfig {
    fn default() -> Self {
        MeshConfig {
            heartbeat_interval: Duration::from_secs(2),
            heartbeat_timeout: Duration::from_secs(6),
            barrier_timeout: Duration::from_secs(600),
            max_retries: 3,
            join_mode: JoinMode::Blocking,
            probe_duration: Duration::from_secs(1),
            coordinator_timeout: Duration::from_secs(18),
        }
    }
}
