//! The scenario's network for real runs.
//!
//! `loco launch` puts each process of a run (the coordinator and every worker) in a network
//! namespace of its own ([`netns`]), whose only way out is a TUN device read by one [`Router`]
//! thread in the launcher. The router delays and drops each packet as the scenario's links
//! would ([`shaper`]: per-connection rate, `streams`, NIC caps, latency, jitter, partitions,
//! degrades), from the same links and the same seed as the simulator, so that `replay` and
//! `launch` see the same network and kernel TCP carries every byte.

pub mod addr;
pub mod check;
pub mod netns;
pub mod relay;
pub mod router;
pub mod shaper;

pub use netns::{Host, Hosts};
pub use relay::Relays;
pub use router::{PairStats, Router, Stats};
pub use shaper::{Packet, Shaper, Verdict};

/// Why an emulated network could not be built or run.
#[derive(Debug, thiserror::Error)]
pub enum WanError {
    /// This process lacks what the emulation needs.
    #[error("the emulated network is unavailable: {why}")]
    Unavailable {
        /// What is missing.
        why: String,
    },
    /// A node id past the address range.
    #[error("node {node} has no address in 198.18.0.0/15")]
    NodeOutOfRange {
        /// The node.
        node: loco_core::NodeId,
    },
    /// A command or system call could not be started.
    #[error("{what}: {source}")]
    Spawn {
        /// What was attempted.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// A command failed.
    #[error("`{what}` failed ({status}): {stderr}")]
    Command {
        /// The command.
        what: String,
        /// Its exit status.
        status: String,
        /// What it printed on stderr.
        stderr: String,
    },
    /// A TUN device could not be made.
    #[error("cannot create the TUN device {device}: {message}")]
    Tun {
        /// The device's name.
        device: String,
        /// Why.
        message: String,
    },
}

/// A run's emulated network: its namespaces and the router between them. Dropping it stops
/// the router and removes the namespaces.
#[derive(Debug)]
pub struct Network {
    // Field order is drop order: the router stops before the namespaces go.
    router: Router,
    hosts: Hosts,
}

/// The MTU of the emulated links ([`loco_core::scenario::links::EMULATED_MTU`]).
pub const MTU: u16 = loco_core::scenario::links::EMULATED_MTU;

impl Network {
    /// The network of `scenario` (every node it names, and the coordinator), its links drawn
    /// from `seed` (the processes set the scenario's TCP congestion control on
    /// their own sockets).
    pub fn start(scenario: &loco_core::scenario::Scenario, seed: u64) -> Result<Network, WanError> {
        let mut ids: Vec<loco_core::NodeId> = scenario.nodes().iter().map(|n| n.id).collect();
        ids.push(loco_core::NodeId::COORDINATOR);
        let (hosts, devices) = Hosts::create(&ids, MTU)?;
        let router = Router::start(ids, devices, Shaper::new(scenario, seed), MTU)?;
        Ok(Network { router, hosts })
    }

    /// The router (churn, outer steps, figures).
    pub fn router(&self) -> &Router {
        &self.router
    }

    /// The hosts.
    pub fn hosts(&self) -> &Hosts {
        &self.hosts
    }
}
