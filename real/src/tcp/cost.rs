//! The handshake's cost, for `loco bench handshake`: both ends of a connection's handshake on
//! one thread over an in-memory pipe, so that the time measured is the CPU of the two ends
//! together, with no network in it.

use super::*;
use crate::identity::{Identity, NodeKey, Roster};

/// How the connections are secured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandshakeMode {
    /// No secret: the hello alone.
    Plain,
    /// The run secret: Noise NNpsk0 and the confirmation record.
    Secret,
    /// The run secret and node keys: Noise IKpsk1, the roster check and the confirmation.
    Keyed,
}

/// Both ends' configurations for `mode`: node 0 dials the coordinator.
fn configs(mode: HandshakeMode) -> (TcpConfig, TcpConfig) {
    let secret = (mode != HandshakeMode::Plain).then(|| b"a benchmark's run secret".to_vec());
    let (dialer, acceptor) = (NodeKey::generate(), NodeKey::generate());
    let roster = Roster::new(
        [(NodeId(0), dialer.public()), (NodeId::COORDINATOR, acceptor.public())].into(),
    )
    .unwrap_or_default();
    let with = |me: NodeId, key: NodeKey| TcpConfig {
        secret: secret.clone(),
        identity: (mode == HandshakeMode::Keyed)
            .then(|| Identity::new(me, key, roster.clone()).ok().map(Arc::new))
            .flatten(),
        ..TcpConfig::default()
    };
    (with(NodeId(0), dialer), with(NodeId::COORDINATOR, acceptor))
}

/// Runs `count` handshakes in `mode`, both ends on this thread (the caller times them); `Err`
/// when one failed.
pub fn handshakes(mode: HandshakeMode, count: usize) -> Result<(), String> {
    let (dial_cfg, accept_cfg) = configs(mode);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        for _ in 0..count {
            let (d, a) = tokio::io::duplex(1 << 16);
            let dial = dial_handshake(d, NodeId(0), 7000, NodeId::COORDINATOR, &dial_cfg);
            let accept = accept_handshake(a, &accept_cfg);
            let (dialled, accepted) = tokio::join!(dial, accept);
            dialled.map_err(|e| format!("the dialer: {e}"))?;
            let (from, ..) = accepted.map_err(|e| format!("the acceptor: {}", e.reason))?;
            if from != NodeId(0) {
                return Err(format!("the acceptor took {from} for node 0"));
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mode_completes_its_handshakes() {
        for mode in [HandshakeMode::Plain, HandshakeMode::Secret, HandshakeMode::Keyed] {
            assert_eq!(handshakes(mode, 3), Ok(()), "{mode:?}");
        }
    }
}
