//! The message-level transport: frames between nodes named by [`NodeId`].
//!
//! A [`Frame`] is a small typed [`Header`] plus a [`Body`] that is either real bytes or *virtual*
//! (a length only). The real backend serialises frames onto TCP and never sees a virtual body; the
//! simulator sends the header through its network and charges the body's length to its bandwidth
//! model, which is how a 10B-parameter all-reduce is simulated without 40 GB of memory.
//!
//! [`memory`] is an in-memory implementation over channels, for tests and benchmarks; [`pool`]
//! recycles the memory of large bodies.

use crate::digest::Blake3Digest;
use crate::ids::{Epoch, NodeId};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::future::Future;

pub mod memory;
pub mod pool;

/// The body of a frame: real bytes, or only a length.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    /// Real payload bytes. Cloning is cheap (reference counted), so forwarding does not copy.
    Bytes(Bytes),
    /// A payload that exists only as a length (simulated numerics).
    Virtual(u64),
}

impl Body {
    /// An empty body.
    pub fn empty() -> Body {
        Body::Bytes(Bytes::new())
    }

    /// Length in bytes, real or virtual.
    pub fn len(&self) -> u64 {
        match self {
            Body::Bytes(b) => b.len() as u64,
            Body::Virtual(n) => *n,
        }
    }

    /// True when the body has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True for a virtual body.
    pub fn is_virtual(&self) -> bool {
        matches!(self, Body::Virtual(_))
    }
}

/// Which half of a ring all-reduce a collective frame belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Phase {
    /// Partial sums travel round the ring and are accumulated in fp32.
    ReduceScatter,
    /// The owners' encoded averages travel round the ring, forwarded unchanged.
    AllGather,
    /// Every member's whole encoded contribution travels round the ring, forwarded unchanged,
    /// and each member sums them all (codecs whose sums are not sparse: `sparse`). The
    /// header's `chunk` is the contributor's rank and its `weight_sum` the contributor's weight.
    Gather,
}

/// Header of one segment of a ring all-reduce.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CollectiveHeader {
    /// Membership epoch the collective runs in; frames of another epoch are rejected.
    pub epoch: Epoch,
    /// Identifies the collective within the epoch (for DiLoCo: outer step and attempt).
    pub op: u64,
    /// Which of a node's parallel rings (one per local GPU shard).
    pub shard: u16,
    /// Reduce-scatter or all-gather.
    pub phase: Phase,
    /// Step within the phase, 0..world-1.
    pub step: u16,
    /// Chunk index, 0..world.
    pub chunk: u32,
    /// Segment index within the chunk (pipelining unit).
    pub segment: u32,
    /// Sum of the contribution weights folded into this partial sum (reduce-scatter), or the total
    /// weight of the average (all-gather).
    pub weight_sum: f64,
}

/// Header of one piece of a training-state transfer to a joiner (live recovery). The body is
/// `[offset, offset + body.len())` of one part of the serialised state; `piece` is the body's
/// BLAKE3 digest and `digest` the part's
/// ([`part_digest`](crate::node::state::part_digest) of all its pieces' digests).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateHeader {
    /// Epoch of the transfer assignment.
    pub epoch: Epoch,
    /// The last committed outer step the state belongs to.
    pub outer_step: u64,
    /// Where this piece starts in the serialised state.
    pub offset: u64,
    /// Length of the whole serialised state.
    pub total: u64,
    /// The part's digest ([`part_digest`](crate::node::state::part_digest)): names the copy the
    /// piece belongs to (`None` for virtual numerics).
    pub digest: Option<Blake3Digest>,
    /// The BLAKE3 digest of this piece's body, as its sender computed it from the buffers it
    /// sent (zeros for a virtual body): the joiner checks the body against it on arrival.
    pub piece: Blake3Digest,
    /// Which serialised part this piece belongs to, when the state travels in several parts
    /// (the real backend: 0 is the replicated outer state, 1 the sender's own inner state).
    pub part: u32,
}

/// A joiner's request to a sender of its state: send again the pieces of these byte ranges
/// (pieces lost with a dropped connection, or a copy that failed verification). Empty body.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateAsk {
    /// Epoch of the assignment the joiner fetches under.
    pub epoch: Epoch,
    /// `(part, start, end)`: the bytes wanted, at most [`StateAsk::MAX_RANGES`] ranges; the
    /// sender sends the pieces of its share that overlap them.
    pub ranges: Vec<(u32, u64, u64)>,
}

impl StateAsk {
    /// The most ranges one ask may name (a sender ignores an ask with more).
    pub const MAX_RANGES: usize = 1024;
}

/// The typed header of a frame.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Header {
    /// Control plane of the elastic mesh (membership, heartbeats, barriers, probes).
    Mesh(crate::mesh::MeshMsg),
    /// One segment of a ring all-reduce.
    Collective(CollectiveHeader),
    /// One piece of the training state sent to a joiner.
    State(StateHeader),
    /// A joiner asks a sender for pieces again.
    StateAsk(StateAsk),
}

/// A message between two nodes.
#[derive(Clone, Debug, PartialEq)]
pub struct Frame {
    /// Typed header.
    pub header: Header,
    /// Payload, real or virtual.
    pub body: Body,
}

impl Frame {
    /// A control frame with an empty body.
    pub fn control(msg: crate::mesh::MeshMsg) -> Frame {
        Frame { header: Header::Mesh(msg), body: Body::empty() }
    }

    /// Bytes this frame occupies on a link (body plus a fixed header allowance).
    pub fn wire_len(&self) -> u64 {
        HEADER_WIRE_BYTES + self.body.len()
    }
}

/// The frame for a mesh message to send ([`MemberAction::Send`](crate::mesh::MemberAction::Send),
/// [`CoordinatorAction::Send`](crate::mesh::CoordinatorAction::Send)): `msg` with a body of
/// `padding` bytes, virtual (a length only, for the simulator) or real zeros (for TCP). The
/// padding is capped at [`PROBE_MAX_BYTES`](crate::mesh::PROBE_MAX_BYTES). Here rather than in
/// [`crate::mesh`] so that the mesh protocol knows nothing of frames: the transport depends on
/// the mesh (its [`Header::Mesh`]), not the other way round.
pub fn padded_frame(msg: crate::mesh::MeshMsg, padding: u64, virtual_body: bool) -> Frame {
    let padding = padding.min(crate::mesh::PROBE_MAX_BYTES);
    let body = if padding == 0 {
        Body::empty()
    } else if virtual_body {
        Body::Virtual(padding)
    } else {
        Body::Bytes(bytes::Bytes::from(vec![0u8; usize::try_from(padding).unwrap_or(0)]))
    };
    Frame { header: Header::Mesh(msg), body }
}

/// Bytes charged for a header on the wire (length prefix, checksum, serialised header).
pub const HEADER_WIRE_BYTES: u64 = 64;

/// Failure of a transport operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    /// The peer is unknown, gone, or its connection closed.
    #[error("peer {0} unreachable")]
    Unreachable(NodeId),
    /// This endpoint has been shut down.
    #[error("transport closed")]
    Closed,
    /// A frame could not be decoded or failed its checksum.
    #[error("corrupt frame from {from}: {reason}")]
    Corrupt {
        /// Sender.
        from: NodeId,
        /// What was wrong.
        reason: String,
    },
}

/// One endpoint of the message transport. Implemented by the in-memory channels ([`memory`]), the
/// simulator (turmoil) and the real backend (TCP).
///
/// `send` may return before the frame is delivered (it queues); frames from one sender to one
/// receiver arrive in the order they were sent, or not at all.
pub trait Transport {
    /// This endpoint's node id.
    fn local_id(&self) -> NodeId;

    /// Queue `frame` for `to`.
    fn send(
        &mut self,
        to: NodeId,
        frame: Frame,
    ) -> impl Future<Output = Result<(), TransportError>>;

    /// The next frame from any peer.
    fn recv(&mut self) -> impl Future<Output = Result<(NodeId, Frame), TransportError>>;
}
