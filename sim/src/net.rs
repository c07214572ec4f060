//! The message transport over turmoil: one TCP connection per ordered pair of hosts, frames
//! length-prefixed, bodies charged to the [`BandwidthModel`] before their header goes out.
//!
//! A frame to a peer goes through one of its *lanes*: control messages with an empty body skip
//! the bandwidth model (their 64 bytes cost microseconds); every other frame (collective
//! segments, probes, state pieces) first waits for its flow of `wire_len` bytes to finish in
//! the model, then its header (and its bytes, for a real body) is written to turmoil, which adds
//! the latency and drops it across a partition. Lanes are per (peer, shard): the `G` rings of a
//! node with `G` GPUs run as `G` concurrent flows, as PRIME's 8 connections per node did (and
//! the pieces of a state transfer likewise), and frames of one lane arrive in order. Frames of different lanes may overtake each other.
//!
//! A peer that cannot be reached (crashed, partitioned away, or its flow cancelled) shows up in
//! [`SimTransport::recv`] as [`TransportError::Unreachable`]; the frames to it are dropped.
//! A partition or its healing bumps the pair's connection generation in [`NetShared`], so both
//! ends drop their connection and open a new one: turmoil's TCP would otherwise wait forever for
//! a segment lost in the cut.

use crate::bandwidth::{BandwidthModel, FlowId, FlowStatus};
use crate::clock;
use bytes::Bytes;
use loco_core::transport::{Body, Frame, Header, Transport, TransportError};
use loco_core::{NodeId, Time};
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use turmoil::net::{TcpListener, TcpStream};

/// The TCP port every host listens on.
pub const PORT: u16 = 7000;

/// Largest accepted header, bytes (a corrupt length fails the connection instead).
const MAX_HEADER: u32 = 16 << 20;

/// The turmoil host name of a node (`n3`) or of the coordinator (`coord`).
pub fn host_name(node: NodeId) -> String {
    if node == NodeId::COORDINATOR { "coord".to_owned() } else { format!("n{}", node.0) }
}

/// State shared by every host of one simulation (all hosts run on one thread).
#[derive(Default)]
pub struct NetShared {
    /// The bandwidth model.
    pub bandwidth: Rc<RefCell<BandwidthModel>>,
    /// Connection generation per unordered pair; a change makes both ends reconnect.
    generations: RefCell<BTreeMap<(NodeId, NodeId), u64>>,
    /// Pairs currently cut by a partition, per direction (sender, receiver).
    cut: RefCell<BTreeMap<(NodeId, NodeId), u32>>,
    /// Hosts whose software is not running (crashed, or exited).
    down: RefCell<std::collections::BTreeSet<NodeId>>,
    /// Connections take the real transport's round trips before their first frame
    /// ([`connect`]); off with `[sim] tcp = "none"`, the fluid model without TCP's dynamics.
    handshake: Cell<bool>,
}

fn unordered(a: NodeId, b: NodeId) -> (NodeId, NodeId) {
    if a <= b { (a, b) } else { (b, a) }
}

impl NetShared {
    /// A fresh network with an empty bandwidth model.
    pub fn new() -> Rc<NetShared> {
        Rc::new(NetShared::default())
    }

    /// Whether a connection takes the real transport's handshake ([`connect`]).
    pub fn set_handshake(&self, on: bool) {
        self.handshake.set(on);
    }

    /// The connection generation of the pair.
    pub fn generation(&self, a: NodeId, b: NodeId) -> u64 {
        self.generations.borrow().get(&unordered(a, b)).copied().unwrap_or(0)
    }

    /// Makes both ends of the pair drop their connection (partition, heal, crash).
    pub fn reset_pair(&self, a: NodeId, b: NodeId) {
        *self.generations.borrow_mut().entry(unordered(a, b)).or_insert(0) += 1;
    }

    /// Records that traffic from `from` to `to` is cut (counted: overlapping partitions nest).
    pub fn cut(&self, from: NodeId, to: NodeId) {
        *self.cut.borrow_mut().entry((from, to)).or_insert(0) += 1;
        self.reset_pair(from, to);
    }

    /// Undoes one [`cut`](Self::cut); returns true when the direction is open again.
    pub fn uncut(&self, from: NodeId, to: NodeId) -> bool {
        let mut cut = self.cut.borrow_mut();
        let open = match cut.get_mut(&(from, to)) {
            Some(n) if *n > 1 => {
                *n -= 1;
                false
            }
            Some(_) => {
                cut.remove(&(from, to));
                true
            }
            None => true,
        };
        drop(cut);
        self.reset_pair(from, to);
        open
    }

    /// Whether traffic from `from` to `to` is cut.
    pub fn is_cut(&self, from: NodeId, to: NodeId) -> bool {
        self.cut.borrow().contains_key(&(from, to))
    }

    /// Marks a host's software as stopped (`true`) or running again.
    pub fn set_down(&self, node: NodeId, down: bool) {
        if down {
            self.down.borrow_mut().insert(node);
        } else {
            self.down.borrow_mut().remove(&node);
        }
    }

    /// Whether a connection from `from` to `to` cannot be opened now: the pair is cut or the
    /// peer's software is not running. Checked before connecting, because turmoil keeps the
    /// socket of every failed connect (a long partition would exhaust the ephemeral ports) and
    /// a connect to a host that stopped without crashing never completes.
    pub fn unreachable(&self, from: NodeId, to: NodeId) -> bool {
        self.is_cut(from, to) || self.down.borrow().contains(&to)
    }
}

/// What arrives at a host: a frame, or news that a peer cannot be reached.
#[derive(Debug)]
enum Incoming {
    Frame(NodeId, Frame),
    Unreachable(NodeId),
}

impl Lane {
    /// The lane a frame travels in.
    pub(crate) fn of(frame: &Frame) -> Lane {
        match &frame.header {
            Header::Mesh(_) | Header::StateAsk(_) if frame.body.is_empty() => Lane::Control,
            Header::StateAsk(_) => Lane::Bulk(u16::MAX),
            Header::Mesh(_) => Lane::Bulk(u16::MAX),
            Header::Collective(h) => Lane::Bulk(h.shard),
            Header::State(h) => Lane::State(h.part, h.offset),
        }
    }

    /// The lane's key in the bandwidth model.
    pub(crate) fn key(self) -> u64 {
        match self {
            Lane::Control => 0,
            Lane::Bulk(s) => 1 + u64::from(s),
            // Offsets of a part are below 2^62 (parts of up to 4 EiB).
            Lane::State(part, o) => (1 << 63) | (u64::from(part & 1) << 62) | (o & ((1 << 62) - 1)),
        }
    }
}

/// The queue a frame waits in on its way to one peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Lane {
    /// A control message with an empty body: no bandwidth wait.
    Control,
    /// Everything else, per shard (mesh frames with a body use shard `u16::MAX`).
    Bulk(u16),
    /// A piece of a state transfer, by its part and offset: the pieces travel in parallel.
    State(u32, u64),
}

/// Byte counters of one endpoint.
#[derive(Clone, Debug, Default)]
pub struct NetCounters {
    /// Wire bytes (header allowance plus body) handed to the network.
    pub bytes_sent: Rc<Cell<u64>>,
    /// Frames handed to the network.
    pub frames_sent: Rc<Cell<u64>>,
}

/// One host's endpoint: implements [`Transport`] over turmoil TCP plus the bandwidth model.
pub struct SimTransport {
    me: NodeId,
    shared: Rc<NetShared>,
    inbox: mpsc::UnboundedReceiver<Incoming>,
    inbox_tx: mpsc::UnboundedSender<Incoming>,
    lanes: BTreeMap<(NodeId, Lane), mpsc::UnboundedSender<(FlowId, Frame)>>,
    writers: BTreeMap<NodeId, mpsc::UnboundedSender<Frame>>,
    counters: NetCounters,
}

impl SimTransport {
    /// Binds this host's listener and starts accepting connections. Must be called from inside
    /// a turmoil host.
    pub async fn bind(me: NodeId, shared: Rc<NetShared>) -> std::io::Result<SimTransport> {
        let listener = TcpListener::bind(("0.0.0.0", PORT)).await?;
        let (inbox_tx, inbox) = mpsc::unbounded_channel();
        let tx = inbox_tx.clone();
        tokio::task::spawn_local(accept_loop(listener, tx, shared.handshake.get()));
        Ok(SimTransport {
            me,
            shared,
            inbox,
            inbox_tx,
            lanes: BTreeMap::new(),
            writers: BTreeMap::new(),
            counters: NetCounters::default(),
        })
    }

    /// This endpoint's byte counters (shared handles: they keep counting).
    pub fn counters(&self) -> NetCounters {
        self.counters.clone()
    }

    /// Queues `frame` for `to` without waiting. Frames to this node itself are delivered
    /// locally at once.
    pub fn enqueue(&mut self, to: NodeId, frame: Frame) {
        self.enqueue_ready(to, frame, Time::ZERO);
    }

    /// [`enqueue`](Self::enqueue) for a frame whose body this node is still making until
    /// `ready` (the codec's CPU time): its flow gets no bandwidth before then.
    pub fn enqueue_ready(&mut self, to: NodeId, frame: Frame, ready: Time) {
        self.counters.bytes_sent.set(self.counters.bytes_sent.get() + frame.wire_len());
        self.counters.frames_sent.set(self.counters.frames_sent.get() + 1);
        if to == self.me {
            let _ = self.inbox_tx.send(Incoming::Frame(to, frame));
            return;
        }
        let lane = Lane::of(&frame);
        let writer = self.writer(to);
        if lane == Lane::Control {
            let _ = writer.send(frame);
            return;
        }
        // The flow is queued in the model now, so that frames of one lane follow each other
        // exactly; the lane's task waits for each in turn and then writes its header.
        let key = (self.me, to, lane.key());
        let id = self.shared.bandwidth.borrow_mut().start_in_lane_ready(
            clock::now(),
            key,
            frame.wire_len(),
            ready,
        );
        let (shared, inbox) = (self.shared.clone(), self.inbox_tx.clone());
        let tx = self.lanes.entry((to, lane)).or_insert_with(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::task::spawn_local(lane_loop(to, shared, rx, writer, inbox));
            tx
        });
        let _ = tx.send((id, frame));
    }

    fn writer(&mut self, to: NodeId) -> mpsc::UnboundedSender<Frame> {
        let (me, shared, inbox) = (self.me, self.shared.clone(), self.inbox_tx.clone());
        self.writers
            .entry(to)
            .or_insert_with(|| {
                let (tx, rx) = mpsc::unbounded_channel();
                tokio::task::spawn_local(writer_loop(me, to, shared, rx, inbox));
                tx
            })
            .clone()
    }

    /// The next frame, or the news that a peer is unreachable.
    pub async fn next(&mut self) -> Result<(NodeId, Frame), TransportError> {
        match self.inbox.recv().await {
            Some(Incoming::Frame(from, f)) => Ok((from, f)),
            Some(Incoming::Unreachable(peer)) => Err(TransportError::Unreachable(peer)),
            None => Err(TransportError::Closed),
        }
    }
}

impl Transport for SimTransport {
    fn local_id(&self) -> NodeId {
        self.me
    }

    async fn send(&mut self, to: NodeId, frame: Frame) -> Result<(), TransportError> {
        self.enqueue(to, frame);
        Ok(())
    }

    async fn recv(&mut self) -> Result<(NodeId, Frame), TransportError> {
        self.next().await
    }
}

/// Cancels a flow when its sender goes away (a crash drops the task mid-wait).
struct FlowGuard {
    model: Rc<RefCell<BandwidthModel>>,
    id: FlowId,
    armed: bool,
}

impl Drop for FlowGuard {
    fn drop(&mut self) {
        if self.armed
            && let Ok(mut m) = self.model.try_borrow_mut()
        {
            let now = m.now();
            m.cancel(now, self.id);
        }
    }
}

/// Waits in simulated time until flow `id` is done; false when it was cancelled.
pub async fn wait_flow(model: &Rc<RefCell<BandwidthModel>>, id: FlowId) -> bool {
    let mut guard = FlowGuard { model: model.clone(), id, armed: true };
    loop {
        let status = model.borrow_mut().poll(clock::now(), id);
        match status {
            FlowStatus::Done(_) => {
                guard.armed = false;
                return true;
            }
            FlowStatus::Cancelled => {
                guard.armed = false;
                return false;
            }
            FlowStatus::Pending { eta } => {
                let changed = BandwidthModel::eta_changed(model, id);
                // `biased`: tokio's default picks a branch at random (an unseeded RNG).
                tokio::select! {
                    biased;
                    () = clock::sleep_until(eta) => {}
                    () = changed => {}
                }
            }
        }
    }
}

async fn lane_loop(
    to: NodeId,
    shared: Rc<NetShared>,
    mut rx: mpsc::UnboundedReceiver<(FlowId, Frame)>,
    writer: mpsc::UnboundedSender<Frame>,
    inbox: mpsc::UnboundedSender<Incoming>,
) {
    while let Some((id, frame)) = rx.recv().await {
        if wait_flow(&shared.bandwidth, id).await {
            let _ = writer.send(frame);
        } else {
            let _ = inbox.send(Incoming::Unreachable(to));
        }
    }
}

async fn writer_loop(
    me: NodeId,
    to: NodeId,
    shared: Rc<NetShared>,
    mut rx: mpsc::UnboundedReceiver<Frame>,
    inbox: mpsc::UnboundedSender<Incoming>,
) {
    // Connect at once, while the first frame is still waiting for its bandwidth, as a
    // long-lived connection would already be open.
    let generation = shared.generation(me, to);
    let mut conn: Option<(u64, TcpStream)> = None;
    if !shared.unreachable(me, to) {
        conn = connect(me, to, shared.handshake.get()).await.ok().map(|s| (generation, s));
    }
    let mut buf = Vec::new();
    while let Some(frame) = rx.recv().await {
        let generation = shared.generation(me, to);
        if conn.as_ref().is_some_and(|(g, _)| *g != generation) {
            conn = None;
        }
        if conn.is_none() {
            if shared.unreachable(me, to) {
                let _ = inbox.send(Incoming::Unreachable(to));
                continue;
            }
            match connect(me, to, shared.handshake.get()).await {
                Ok(s) => conn = Some((generation, s)),
                Err(_) => {
                    let _ = inbox.send(Incoming::Unreachable(to));
                    continue;
                }
            }
        }
        encode(&frame, &mut buf);
        let Some((_, stream)) = conn.as_mut() else { continue };
        if stream.write_all(&buf).await.is_err() {
            conn = None;
            let _ = inbox.send(Incoming::Unreachable(to));
        }
    }
}

/// Opens a connection with the round trips the real transport's takes before its first frame
/// (`loco_real::tcp`): TCP's SYN and SYN-ACK (turmoil delivers the SYN with the link's latency
/// but answers it at once, so the acceptor's first byte stands for the SYN-ACK's way back), then
/// the hello and its answer. A node's first message to a peer (a joiner's request to the
/// coordinator, the first frame after a heal) arrives two and a half round trips after it was
/// sent, as on the wire. Without `handshake` (`[sim] tcp = "none"`) only the SYN's way and
/// the hello.
async fn connect(me: NodeId, to: NodeId, handshake: bool) -> std::io::Result<TcpStream> {
    let mut s = TcpStream::connect((host_name(to), PORT)).await?;
    let mut answer = [0u8; 1];
    if handshake {
        s.read_exact(&mut answer).await?;
    }
    s.write_all(&me.0.to_le_bytes()).await?;
    if handshake {
        s.read_exact(&mut answer).await?;
    }
    Ok(s)
}

async fn accept_loop(
    listener: TcpListener,
    inbox: mpsc::UnboundedSender<Incoming>,
    handshake: bool,
) {
    while let Ok((stream, _)) = listener.accept().await {
        tokio::task::spawn_local(read_loop(stream, inbox.clone(), handshake));
    }
}

async fn read_loop(mut stream: TcpStream, inbox: mpsc::UnboundedSender<Incoming>, handshake: bool) {
    // The SYN-ACK's way back, the hello, its answer (see `connect`).
    let mut id = [0u8; 4];
    if (handshake && stream.write_all(&[1]).await.is_err())
        || stream.read_exact(&mut id).await.is_err()
        || (handshake && stream.write_all(&[1]).await.is_err())
    {
        return;
    }
    let from = NodeId(u32::from_le_bytes(id));
    while let Ok(frame) = read_frame(&mut stream).await {
        if inbox.send(Incoming::Frame(from, frame)).is_err() {
            return;
        }
    }
}

/// Wire layout: `u32` header length, the header as JSON, `u8` body kind (0 bytes, 1 virtual),
/// `u64` body length, then the body's bytes when real. All integers little-endian.
fn encode(frame: &Frame, buf: &mut Vec<u8>) {
    buf.clear();
    let header = serde_json::to_vec(&frame.header).unwrap_or_default();
    buf.extend_from_slice(&(header.len() as u32).to_le_bytes());
    buf.extend_from_slice(&header);
    match &frame.body {
        Body::Bytes(b) => {
            buf.push(0);
            buf.extend_from_slice(&(b.len() as u64).to_le_bytes());
            buf.extend_from_slice(b);
        }
        Body::Virtual(n) => {
            buf.push(1);
            buf.extend_from_slice(&n.to_le_bytes());
        }
    }
}

async fn read_frame(s: &mut TcpStream) -> std::io::Result<Frame> {
    let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_owned());
    let mut n4 = [0u8; 4];
    s.read_exact(&mut n4).await?;
    let hlen = u32::from_le_bytes(n4);
    if hlen > MAX_HEADER {
        return Err(bad("header too long"));
    }
    let mut h = vec![0u8; hlen as usize];
    s.read_exact(&mut h).await?;
    let header: Header = serde_json::from_slice(&h).map_err(|e| bad(&e.to_string()))?;
    let mut kind = [0u8; 1];
    s.read_exact(&mut kind).await?;
    let mut n8 = [0u8; 8];
    s.read_exact(&mut n8).await?;
    let len = u64::from_le_bytes(n8);
    let body = match kind[0] {
        0 => {
            let len = usize::try_from(len).map_err(|_| bad("body too long"))?;
            let mut b = vec![0u8; len];
            s.read_exact(&mut b).await?;
            Body::Bytes(Bytes::from(b))
        }
        1 => Body::Virtual(len),
        _ => return Err(bad("unknown body kind")),
    };
    Ok(Frame { header, body })
}
