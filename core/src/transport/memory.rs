//! An in-memory [`Transport`] over unbounded channels, for tests and benchmarks.
//!
//! [`network`] builds one endpoint per node; every endpoint can reach every other. Dropping an
//! endpoint makes sends to it fail with [`TransportError::Unreachable`], like a crashed process.

use super::{Frame, Transport, TransportError};
use crate::ids::NodeId;
use futures::StreamExt;
use futures::channel::mpsc;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

type Inbox = mpsc::UnboundedSender<(NodeId, Frame)>;

/// One node's endpoint of an in-memory network.
pub struct MemoryTransport {
    id: NodeId,
    peers: Arc<Mutex<BTreeMap<NodeId, Inbox>>>,
    inbox: mpsc::UnboundedReceiver<(NodeId, Frame)>,
    sent_bytes: u64,
}

impl MemoryTransport {
    /// Bytes (header allowance plus body) this endpoint has sent.
    pub fn sent_bytes(&self) -> u64 {
        self.sent_bytes
    }

    /// Adds a new endpoint to the same network (a joiner).
    pub fn join(&self, id: NodeId) -> MemoryTransport {
        let (tx, rx) = mpsc::unbounded();
        self.peers.lock().expect("poisoned").insert(id, tx);
        MemoryTransport { id, peers: self.peers.clone(), inbox: rx, sent_bytes: 0 }
    }
}

impl Drop for MemoryTransport {
    fn drop(&mut self) {
        if let Ok(mut p) = self.peers.lock() {
            p.remove(&self.id);
        }
    }
}

/// Builds a fully connected in-memory network with one endpoint per id, in the order given.
pub fn network(ids: &[NodeId]) -> Vec<MemoryTransport> {
    let peers = Arc::new(Mutex::new(BTreeMap::new()));
    let mut out = Vec::with_capacity(ids.len());
    for &id in ids {
        let (tx, rx) = mpsc::unbounded();
        peers.lock().expect("poisoned").insert(id, tx);
        out.push(MemoryTransport { id, peers: peers.clone(), inbox: rx, sent_bytes: 0 });
    }
    out
}

impl Transport for MemoryTransport {
    fn local_id(&self) -> NodeId {
        self.id
    }

    async fn send(&mut self, to: NodeId, frame: Frame) -> Result<(), TransportError> {
        let len = frame.wire_len();
        let tx = self.peers.lock().expect("poisoned").get(&to).cloned();
        let tx = tx.ok_or(TransportError::Unreachable(to))?;
        tx.unbounded_send((self.id, frame)).map_err(|_| TransportError::Unreachable(to))?;
        self.sent_bytes += len;
        Ok(())
    }

    async fn recv(&mut self) -> Result<(NodeId, Frame), TransportError> {
        self.inbox.next().await.ok_or(TransportError::Closed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Epoch;
    use crate::transport::{Body, CollectiveHeader, Header, Phase};

    fn frame(i: u64) -> Frame {
        let header = Header::Collective(CollectiveHeader {
            epoch: Epoch(1),
            op: i,
            shard: 0,
            phase: Phase::ReduceScatter,
            step: 0,
            chunk: 0,
            segment: 0,
            weight_sum: 1.0,
        });
        Frame { header, body: Body::Virtual(i) }
    }

    #[tokio::test]
    async fn frames_arrive_in_order_and_dropped_peers_are_unreachable() {
        let mut eps = network(&[NodeId(0), NodeId(1)]);
        let b = eps.pop().unwrap();
        let mut a = eps.pop().unwrap();
        let mut b = b;
        for i in 0..3u64 {
            let f = frame(i);
            a.send(NodeId(1), f).await.unwrap();
        }
        for i in 0..3u64 {
            let (from, f) = b.recv().await.unwrap();
            assert_eq!(from, NodeId(0));
            assert_eq!(f.body, Body::Virtual(i));
        }
        assert_eq!(a.sent_bytes(), 3 * crate::transport::HEADER_WIRE_BYTES + 3);
        drop(b);
        let f = frame(9);
        assert_eq!(a.send(NodeId(1), f).await, Err(TransportError::Unreachable(NodeId(1))));
    }
}
