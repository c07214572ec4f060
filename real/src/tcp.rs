//! The [`Transport`] over TCP: length-prefixed, checksummed frames between processes.
//!
//! Connections are one-way: a node dials each peer it sends to (lazily, on the first send, in
//! the background: the frames wait in the connection's queue, and a dial that fails is heard
//! from [`TcpTransport::unreachable`]) and accepts the connections of the peers that send to it.
//! Every connection starts with a handshake that carries the protocol version and the dialer's
//! node id; a mismatch is refused with a reason the dialer logs. When the run has a shared secret, a Noise handshake under
//! it follows, and everything after it travels in encrypted, authenticated records
//! ([`secure`]): a recorded connection cannot be replayed, and a byte changed on the path
//! closes the connection. Several connections per peer ([`TcpConfig::streams`]) carry the collective
//! frames round-robin (the ring all-reduce accepts its frames in any order); control frames always
//! use the first, so their order is kept.
//!
//! The handshake also carries the port the dialer listens on, so the acceptor learns where to
//! reach it; the coordinator passes what it learned on to the members as a *directory* (a
//! transport-level message, invisible to the mesh protocol), so that only the coordinator's
//! address has to be configured.
//!
//! Wire format of a frame, after the handshake (little endian):
//!
//! | bytes | field |
//! |---|---|
//! | 1 | kind: 0 = a core frame, 1 = a directory of peer addresses, 2 = a state piece |
//! | 4 | header length H |
//! | 8 | body length B |
//! | H | header, `postcard`-encoded [`Header`] (or the directory) |
//! | B | body |
//! | 8 | XXH3-64 of header and body (kind 2: of the header only) |
//!
//! The checksum comes last so that both ends hash a large body piece by piece, each piece just
//! before it is written to the socket or just after it was read from it, while it is in the
//! cache ([`PIECE`] bytes at a time): hashing a whole body first, and then having the kernel copy
//! it, read every byte from memory twice.
//!
//! A state piece (kind 2, a [`Header::State`] with real bytes) carries the BLAKE3 digest of its
//! body in its header, which the joiner checks before it takes the piece: the checksum covers
//! the header only, so that the transfer's bytes are hashed once at each end, not twice.
//!
//! A frame's header, once its first byte has arrived, and then its body must each come within
//! [`TcpConfig::frame_timeout`]; a connection may be idle for any time between frames (DiLoCo's
//! rings are idle during inner steps). A body is read only once its share of the receive
//! queue's byte budget is taken, and only up to its kind's limit (none for control messages, a
//! probe's 64 MiB, [`TcpConfig::max_body`] for ring segments and state pieces). A message a
//! peer does not take within the same limit fails the connection, with its queue. A corrupt frame (bad checksum, impossible length, undecodable header) is dropped,
//! logged and counted, and its connection closed; the dialer reconnects on its next send.
//!
//! Size: one connection's life (dial, handshake, read, write, close) under one set of bounds;
//! the Noise records and the fuzzing entry points are modules of their own.

use admission::{Admission, Backoff, HELLO_TIMEOUT};
pub use admission::{MAX_HANDSHAKES, raise_fd_limit};
use loco_core::ids::NodeId;
use loco_core::mesh::{MeshMsg, PROBE_MAX_BYTES};
use loco_core::transport::{Body, Frame, Header, Transport, TransportError, pool};
use std::collections::BTreeMap;
use std::hash::Hasher;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Version of the wire protocol; peers with another version are refused at the handshake.
/// 2: state pieces carry the part they belong to (the state travels in two parts).
/// 3: frames are checksummed with XXH3-64 instead of CRC-32 (twice as fast, and 64 bits).
/// 4: a barrier arrival and heartbeats say whether the sender withholds a non-finite
/// pseudo-gradient; views, syncs and releases name the incarnations they are meant for; with a
/// secret, a Noise handshake and encrypted records replace the keyed tag.
/// 5: state pieces carry their body's BLAKE3 digest, and their frames' checksum covers only
/// the header (frame kind 2).
/// 6: the hello's last byte says how the dialer secures the connection (none, the secret, or
/// the secret and its node key: Noise IKpsk1), and a refusal for a key has its own answer.
/// 7: a failure report says how many frames of the attempt its sender received, and names a
/// neighbour that sent nothing for the progress timeout.
pub const PROTOCOL_VERSION: u16 = 7;
/// Bytes of the handshake's answer: a [`HelloStatus`], then the answering side's version (LE).
pub const HELLO_REPLY_LEN: usize = 3;
const MAGIC: [u8; 4] = *b"LOCO";
const HELLO_LEN: usize = 4 + 2 + 4 + 2 + 1;
const PREFIX_LEN: usize = 13;
const CHECKSUM_LEN: usize = 8;
/// Largest piece of a body hashed and written (or read and hashed) at a time: it stays in the
/// core's L2 cache between the two.
pub const PIECE: usize = 128 << 10;
const KIND_FRAME: u8 = 0;
const KIND_DIRECTORY: u8 = 1;
/// A state piece: the checksum covers the header, which holds the body's own digest.
const KIND_STATE: u8 = 2;
/// Bytes of a state piece's body read or written at a time (no checksum between the two).
const STATE_CHUNK: usize = 1 << 20;
const MAX_HEADER: u32 = 1 << 20;
/// Most bytes reserved for a body before any of it arrived: a frame's length prefix is the
/// peer's word, so a larger body's buffer grows (doubling) with the bytes that do arrive. Ring
/// segments of up to this size are read into one buffer from the pool, as before.
const BODY_RESERVE: u64 = 64 << 20;
/// The frame checksum: XXH3-64 (with the AVX2 kernel where the processor has it, chosen at run
/// time), about twice as fast as CRC-32 with carry-less multiplication on the all-reduce's
/// megabyte bodies, and with a 64-bit result.
type Checksum = twox_hash::XxHash3_64;

/// Settings of the TCP transport.
#[derive(Clone, Debug)]
pub struct TcpConfig {
    /// Connections per peer for collective frames (default 1). More connections help on links
    /// where one TCP stream cannot fill the pipe (PRIME opened one per GPU ring).
    pub streams: usize,
    /// Connections per peer for live-recovery state frames, opened at the first one (default
    /// 1): the pieces go round them, so that a link capped per connection carries the state at
    /// this many times the cap.
    pub state_streams: usize,
    /// Limit for establishing a connection and its handshake (default 10 s).
    pub connect_timeout: Duration,
    /// Limit for the rest of a frame's header once its first byte arrived, for its body once
    /// the receive queue has room for it, and for a peer to take one message this endpoint
    /// writes (default 120 s).
    pub frame_timeout: Duration,
    /// The run's shared secret; when set, peers must prove they know it.
    pub secret: Option<Vec<u8>>,
    /// This node's key and the run's roster (with a secret only): each peer must then also
    /// prove it holds the key the roster gives the id it claims, and so must each peer this
    /// node dials ([`crate::identity`]).
    pub identity: Option<Arc<crate::identity::Identity>>,
    /// Largest body accepted (default 4 GiB).
    pub max_body: u64,
    /// Capacity of the receive queue, in frames (default 4096).
    pub inbox_frames: usize,
    /// Bytes of frame bodies the receive queue may hold, for state pieces and again for all other
    /// frames (default 256 MiB each): a connection's reader whose next body would go beyond
    /// waits, before reading it, until the node takes frames, and TCP's window then holds the
    /// sender back, so that a peer sending faster than this node consumes (a state transfer of
    /// gigabytes) cannot fill its memory, and a state transfer never holds up the ring. A body
    /// larger than the bound waits for an empty queue.
    pub inbox_bytes: u64,
    /// The TCP congestion control of every connection (`[sim] tcp`: "cubic" or "bbr"); `None`
    /// keeps the host's default. Set per socket, which a process with `CAP_NET_ADMIN` may do
    /// for any algorithm the kernel has, and others for those the host allows.
    pub congestion: Option<String>,
    /// How long data sent on a connection may stay unacknowledged before the kernel gives the
    /// connection up (`TCP_USER_TIMEOUT`); `None` keeps the kernel's retransmission schedule,
    /// which backs off exponentially for about 15 minutes. A node sets its mesh's heartbeat
    /// timeout: across a partition its connections fail within it, and the next send dials
    /// again (in the background), so that it is connected again within about a second of the
    /// heal instead of at TCP's next backed-off retransmission (up to two minutes later).
    pub user_timeout: Option<Duration>,
    /// Peers to reach through another address than the one they listen on (the relays of a
    /// launch that relays the scenario's links in userspace, [`crate::wan::Relays`]).
    pub dial_via: BTreeMap<NodeId, SocketAddr>,
    /// A send to a peer whose connection failed never waits for the redial either (default
    /// false; a first dial never waits in any case): the frame waits in the connection's queue
    /// while the dial runs in the background (within `connect_timeout`); a dial that fails drops
    /// what waited and the next send reports the peer unreachable (and dials again after that).
    /// For an endpoint whose sends need no answer (the coordinator's). Without it a redial to a
    /// peer that was connected waits for one attempt (100 ms to 1 s), so that a sender learns
    /// of a partition at once.
    pub dial_in_background: bool,
}

/// Sets the congestion control of socket `s` to `cc`; a refusal is logged once per process and
/// the connection keeps the host's default.
pub fn set_congestion(s: &impl std::os::fd::AsFd, cc: Option<&str>) {
    use std::sync::atomic::{AtomicBool, Ordering};
    static WARNED: AtomicBool = AtomicBool::new(false);
    let Some(cc) = cc else { return };
    let opt = std::ffi::OsString::from(cc);
    if let Err(e) = nix::sys::socket::setsockopt(s, nix::sys::socket::sockopt::TcpCongestion, &opt)
        && !WARNED.swap(true, Ordering::Relaxed)
    {
        tracing::warn!("TCP congestion control {cc:?} refused ({e}); the host's default runs");
    }
}

/// Sets `TCP_USER_TIMEOUT` on `s` (see [`TcpConfig::user_timeout`]); best effort.
fn set_user_timeout(s: &impl std::os::fd::AsFd, t: Option<Duration>) {
    let Some(t) = t else { return };
    let ms = u32::try_from(t.as_millis()).unwrap_or(u32::MAX).max(1);
    if let Err(e) = nix::sys::socket::setsockopt(s, nix::sys::socket::sockopt::TcpUserTimeout, &ms)
    {
        tracing::debug!("TCP_USER_TIMEOUT refused: {e}");
    }
}

/// Keepalive probes on an accepted connection, so that its reader ends once the dialer's end is
/// gone (a dialer that gave its connection up during a partition dials a new one; the old one's
/// reader would otherwise wait forever): after [`ACCEPTED_IDLE_PROBE`] of silence, three probes
/// 10 s apart. Best effort.
fn set_keepalive(s: &impl std::os::fd::AsFd) {
    use nix::sys::socket::{setsockopt, sockopt};
    let idle = u32::try_from(ACCEPTED_IDLE_PROBE.as_secs()).unwrap_or(u32::MAX);
    let r = setsockopt(s, sockopt::KeepAlive, &true)
        .and_then(|()| setsockopt(s, sockopt::TcpKeepIdle, &idle))
        .and_then(|()| setsockopt(s, sockopt::TcpKeepInterval, &10))
        .and_then(|()| setsockopt(s, sockopt::TcpKeepCount, &3));
    if let Err(e) = r {
        tracing::debug!("keepalive refused: {e}");
    }
}

/// Silence after which an accepted connection is probed (see [`set_keepalive`]).
const ACCEPTED_IDLE_PROBE: Duration = Duration::from_secs(60);
/// How long a send waits for a redial that an earlier send started and that has not connected
/// yet (its SYNs are being lost: a partition). The send that starts a redial waits for its first
/// attempt (three dial times: a reachable peer is connected within it). Either way a redial that
/// takes longer goes on in the background, the send reports the peer unreachable, and a later
/// send finds the new connection.
const REDIAL_WAIT: Duration = Duration::from_millis(50);
/// Bounds of one attempt of a background redial (see [`Dialer::redial`]); the upper one is Linux's
/// initial SYN retransmission timeout.
const REDIAL_ATTEMPT_MIN: Duration = Duration::from_millis(100);
const REDIAL_ATTEMPT_MAX: Duration = Duration::from_secs(1);
/// Connection attempts of a dial that sends its own SYNs again (see [`dial`]).
const SYN_ATTEMPTS: u32 = 60;

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            streams: 1,
            state_streams: 1,
            connect_timeout: Duration::from_secs(10),
            frame_timeout: Duration::from_secs(120),
            secret: None,
            identity: None,
            max_body: 4 << 30,
            inbox_frames: 4096,
            inbox_bytes: 256 << 20,
            congestion: None,
            user_timeout: None,
            dial_via: BTreeMap::new(),
            dial_in_background: false,
        }
    }
}

/// Counters of one endpoint.
#[derive(Debug, Default)]
pub struct TcpStats {
    /// Frames queued for sending.
    pub frames_sent: AtomicU64,
    /// Bytes written (frame prefixes, headers and bodies).
    pub bytes_sent: AtomicU64,
    /// Frames received and delivered.
    pub frames_received: AtomicU64,
    /// Frames dropped as corrupt (checksum, length, header).
    pub corrupt_frames: AtomicU64,
    /// Incoming connections refused at the handshake (version, secret, garbage).
    pub rejected_handshakes: AtomicU64,
    /// Incoming connections accepted (their handshake passed).
    pub accepted_connections: AtomicU64,
    /// Incoming connections closed during their handshake to make room for a newer one (more
    /// than [`MAX_HANDSHAKES`] in flight: a flood of connections that do not authenticate).
    pub evicted_handshakes: AtomicU64,
    /// Authenticated incoming connections closed to make room for a newer one of the same peer
    /// (more than [`MAX_CONNECTIONS_PER_PEER`] open: a member opening connections without end).
    pub evicted_connections: AtomicU64,
    /// Messages refused for their sender: a directory from anyone but the coordinator.
    pub unauthorised: AtomicU64,
    /// Incoming connections refused for their key: one the roster does not give the id the
    /// dialer claims (another node's, or an unknown one), or none where the run has a roster.
    pub refused_identities: AtomicU64,
    /// Bytes written to each peer (as `bytes_sent`); one entry per peer this endpoint sent to.
    pub sent_to: std::sync::Mutex<BTreeMap<NodeId, u64>>,
}

impl TcpStats {
    /// Counts `n` bytes written to `peer`.
    fn sent(&self, peer: NodeId, n: u64) {
        self.bytes_sent.fetch_add(n, Ordering::Relaxed);
        let mut m = self.sent_to.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let e = m.entry(peer).or_default();
        *e = e.saturating_add(n);
    }

    /// Bytes written to each peer so far.
    pub fn sent_by_peer(&self) -> BTreeMap<NodeId, u64> {
        self.sent_to.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

/// Errors of setting up the transport.
#[derive(Debug, thiserror::Error)]
pub enum TcpError {
    /// Binding the listening socket failed.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
}

/// The first byte of the handshake's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum HelloStatus {
    /// Accepted.
    Ok = 0,
    /// Refused: another protocol version.
    BadVersion = 1,
    /// Refused: the run's secret was not shown.
    BadSecret = 2,
    /// Refused: not a loco peer.
    BadMagic = 3,
    /// Refused: the dialer's key is not the one the roster gives the id it claims, or one side
    /// runs with a roster and the other without.
    BadIdentity = 4,
}

/// How a dialer secures its connection, as its hello says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Security {
    /// Plaintext.
    None = 0,
    /// The run secret (Noise NNpsk0).
    Secret = 1,
    /// The run secret and per-node keys (Noise IKpsk1).
    Keyed = 2,
}

impl Security {
    fn of(cfg: &TcpConfig) -> Security {
        match (&cfg.secret, &cfg.identity) {
            (None, _) => Security::None,
            (Some(_), None) => Security::Secret,
            (Some(_), Some(_)) => Security::Keyed,
        }
    }
}

/// The plaintext hello: magic, protocol `version`, the dialer's id, the port it listens on
/// (0: none), and how it secures the connection.
fn plain_hello(version: u16, from: NodeId, listen_port: u16, security: Security) -> Vec<u8> {
    let mut h = Vec::with_capacity(HELLO_LEN);
    h.extend_from_slice(&MAGIC);
    h.extend_from_slice(&version.to_le_bytes());
    h.extend_from_slice(&from.0.to_le_bytes());
    h.extend_from_slice(&listen_port.to_le_bytes());
    h.push(security as u8);
    h
}

/// What a dialer sends before the acceptor's reply: the hello and, with a secret, the first
/// Noise message under it ([`secure`]). Public for diagnostics and fault-injection tests (a peer
/// speaking an older version, or guessing the secret).
pub fn hello(version: u16, from: NodeId, listen_port: u16, secret: Option<&[u8]>) -> Vec<u8> {
    let security = if secret.is_some() { Security::Secret } else { Security::None };
    let mut h = plain_hello(version, from, listen_port, security);
    if let Some(Ok((_, first))) = secret.map(|k| secure::first_flight(&h, k, None)) {
        h.extend_from_slice(&first);
    }
    h
}

/// [`hello`] of a run with a roster: claiming to be `from`, with the static key `key`, to the
/// node whose public key is `to_key`. Public for fault-injection tests (a member claiming
/// another member's id, an unknown key).
pub fn hello_keyed(
    from: NodeId,
    listen_port: u16,
    secret: &[u8],
    key: &crate::identity::NodeKey,
    to_key: &crate::identity::PublicKey,
) -> Vec<u8> {
    let mut h = plain_hello(PROTOCOL_VERSION, from, listen_port, Security::Keyed);
    let keys = secure::Keys { local: key.private(), remote: Some(&to_key.0) };
    if let Ok((_, first)) = secure::first_flight(&h, secret, Some(keys)) {
        h.extend_from_slice(&first);
    }
    h
}

/// The writing end of a dialled connection: the socket, or its encrypted records.
type WireOut = Box<dyn AsyncWrite + Send + Unpin>;
/// The reading end of an accepted connection.
type WireIn = Box<dyn AsyncRead + Send + Unpin>;

/// One entry of a directory: a node, where it listens, and (in a run with a roster) its key.
type DirEntry = (NodeId, SocketAddr, Option<crate::identity::PublicKey>);

/// What a writer task sends.
enum Outgoing {
    Frame(Frame),
    Directory(Vec<DirEntry>),
}

/// What a reader task delivers.
#[derive(Debug)]
enum Incoming {
    Frame(Frame),
    Directory(Vec<DirEntry>),
}

type Directory = Arc<std::sync::Mutex<BTreeMap<NodeId, SocketAddr>>>;

struct Peer {
    addr: SocketAddr,
    streams: Vec<mpsc::UnboundedSender<Outgoing>>,
    /// The connection for live-recovery state, opened when the first state frame goes to this
    /// peer: a state of gigabytes must not hold up the collective and mesh frames queued
    /// behind it (a non-blocking joiner's ring would wait for its whole state otherwise).
    bulk: Vec<mpsc::UnboundedSender<Outgoing>>,
    next: usize,
    /// The bulk connection of the next state frame.
    next_bulk: usize,
    failed: Arc<AtomicBool>,
    /// How long dialling this peer took (its round trips), in nanoseconds, 0 while a background
    /// dial is under way: sets a redial's attempts.
    dial_time: Arc<AtomicU64>,
}

impl Peer {
    /// How long its dial took, once it is connected.
    fn dialled_in(&self) -> Option<Duration> {
        match self.dial_time.load(Ordering::Relaxed) {
            0 => None,
            n => Some(Duration::from_nanos(n)),
        }
    }
}

/// Peers whose first dial, in the background, failed, for the owner of the endpoint to hear
/// ([`TcpTransport::unreachable`]): what was sent to them was dropped.
#[derive(Clone, Default)]
pub struct Unreachable {
    peers: Arc<std::sync::Mutex<std::collections::BTreeSet<NodeId>>>,
    notify: Arc<tokio::sync::Notify>,
}

/// At most this many unreachable peers wait to be heard (an endpoint that never asks, the
/// coordinator's, keeps no more).
const UNREACHABLE_HELD: usize = 4096;

impl Unreachable {
    /// The next peer whose first dial failed (refused, or no answer within `connect_timeout`):
    /// what was sent to it was dropped. Sends never wait for a first dial, so a peer that
    /// announces an address that drops SYNs holds up no loop; this is how the sender hears of it.
    pub async fn next(&self) -> NodeId {
        loop {
            let next = self.peers.lock().expect("poisoned").pop_first();
            if let Some(peer) = next {
                return peer;
            }
            self.notify.notified().await;
        }
    }

    fn report(&self, peer: NodeId) {
        let mut peers = self.peers.lock().expect("poisoned");
        if peers.len() < UNREACHABLE_HELD {
            peers.insert(peer);
        }
        drop(peers);
        self.notify.notify_one();
    }
}

/// One node's TCP endpoint. Needs a tokio runtime.
pub struct TcpTransport {
    id: NodeId,
    local_addr: SocketAddr,
    cfg: Arc<TcpConfig>,
    addrs: Directory,
    peers: BTreeMap<NodeId, Peer>,
    /// Peers this endpoint had a connection to: after a failure they are dialled again in the
    /// background ([`REDIAL_WAIT`]).
    known: BTreeMap<NodeId, Duration>,
    /// Background dials to peers whose connection failed.
    redials: BTreeMap<NodeId, JoinHandle<Result<Peer, TransportError>>>,
    /// Peers whose first dial, in the background, failed.
    unreachable: Unreachable,
    inbox: mpsc::Receiver<Inbound>,
    stats: Arc<TcpStats>,
    accept_task: JoinHandle<()>,
    inbound: OpenInbound,
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        self.accept_task.abort();
        for h in self.redials.values() {
            h.abort();
        }
    }
}

impl TcpTransport {
    /// Listens on `addr` (port 0 picks a free port) as node `id`.
    pub async fn bind(id: NodeId, addr: SocketAddr, cfg: TcpConfig) -> Result<Self, TcpError> {
        raise_fd_limit();
        let listener =
            TcpListener::bind(addr).await.map_err(|source| TcpError::Bind { addr, source })?;
        let local_addr = listener.local_addr().map_err(|source| TcpError::Bind { addr, source })?;
        let cfg = Arc::new(cfg);
        let stats = Arc::new(TcpStats::default());
        let (tx, inbox) = mpsc::channel(cfg.inbox_frames.max(1));
        let addrs = Directory::default();
        let budget = Budgets::new(cfg.inbox_bytes);
        let inbound = OpenInbound::default();
        let ctx = AcceptCtx {
            me: id,
            cfg: cfg.clone(),
            stats: stats.clone(),
            addrs: addrs.clone(),
            budget,
            inbound: inbound.clone(),
        };
        let accept_task = tokio::spawn(accept_loop(listener, ctx, tx));
        Ok(TcpTransport {
            id,
            local_addr,
            cfg,
            addrs,
            peers: BTreeMap::new(),
            known: Default::default(),
            redials: BTreeMap::new(),
            unreachable: Unreachable::default(),
            inbox,
            stats,
            accept_task,
            inbound,
        })
    }

    /// The address peers dial to reach this node.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Tells this endpoint where `peer` listens (replacing an older address, e.g. a restart).
    pub fn set_peer_addr(&mut self, peer: NodeId, addr: SocketAddr) {
        let old = self.addrs.lock().expect("poisoned").insert(peer, addr);
        if old != Some(addr) {
            self.forget(peer);
        }
    }

    /// The key this endpoint knows for `id` (its roster's, or one the coordinator vouched
    /// for); `None` without node keys.
    pub fn key_of(&self, id: NodeId) -> Option<crate::identity::PublicKey> {
        self.cfg.identity.as_ref().and_then(|i| i.key_of(id))
    }

    /// Where each known peer listens: set by hand, learned from their handshakes, or received
    /// in a directory.
    pub fn peer_addrs(&self) -> BTreeMap<NodeId, SocketAddr> {
        self.addrs.lock().expect("poisoned").clone()
    }

    /// Forgets the address (and the connections) of every peer that `keep` does not name and
    /// that has no authenticated connection to this endpoint open now; returns how many. The
    /// coordinator keeps those of its members and queued joiners, so that ids that connect and
    /// never join (up to one per handshake) do not accumulate.
    pub fn retain_peer_addrs(&mut self, keep: impl Fn(NodeId) -> bool) -> usize {
        let open: Vec<NodeId> =
            self.inbound.lock().unwrap_or_else(|e| e.into_inner()).keys().copied().collect();
        let gone: Vec<NodeId> = self
            .addrs
            .lock()
            .expect("poisoned")
            .keys()
            .copied()
            .filter(|&id| !keep(id) && open.binary_search(&id).is_err())
            .collect();
        let mut addrs = self.addrs.lock().expect("poisoned");
        for id in &gone {
            addrs.remove(id);
        }
        drop(addrs);
        for &id in &gone {
            self.forget(id);
        }
        gone.len()
    }

    /// Sends `to` a directory of peer addresses (the coordinator tells members where the others
    /// listen), with each peer's key where this endpoint has a roster (so that members need
    /// only the coordinator's key in theirs). Travels on the control stream, so it arrives
    /// before later control frames.
    pub async fn send_directory(
        &mut self,
        to: NodeId,
        entries: Vec<(NodeId, SocketAddr)>,
    ) -> Result<(), TransportError> {
        let id = self.cfg.identity.clone();
        let entries: Vec<DirEntry> = entries
            .into_iter()
            .map(|(n, a)| (n, a, id.as_ref().and_then(|i| i.key_of(n))))
            .collect();
        let peer = self.connect(to).await?;
        if peer.streams[0].send(Outgoing::Directory(entries)).is_err() {
            self.drop_peer(to);
            return Err(TransportError::Unreachable(to));
        }
        Ok(())
    }

    /// Forgets the connections to `peer` (it left or was evicted).
    pub fn disconnect(&mut self, peer: NodeId) {
        self.forget(peer);
    }

    /// Gives up the connections to `peer` (the coordinator does, for a node it evicted after
    /// its silence: a connection through a partition waits for TCP's backed-off
    /// retransmissions after the heal); the next send dials again in the background
    /// ([`REDIAL_WAIT`]).
    pub fn reset(&mut self, peer: NodeId) {
        self.drop_peer(peer);
    }

    /// Drops the connections to `to`, remembering how long its dial took if it connected (a
    /// redial then gets attempts of that length).
    fn drop_peer(&mut self, to: NodeId) {
        if let Some(d) = self.peers.remove(&to).and_then(|p| p.dialled_in()) {
            self.known.insert(to, d);
        }
    }

    /// Drops the connections to `peer` and any dial under way: the next send dials afresh and
    /// waits for it, as the first send to a peer does.
    fn forget(&mut self, peer: NodeId) {
        self.peers.remove(&peer);
        self.known.remove(&peer);
        if let Some(h) = self.redials.remove(&peer) {
            h.abort();
        }
    }

    /// This endpoint's counters.
    pub fn stats(&self) -> &TcpStats {
        &self.stats
    }

    /// This endpoint's counters, shared (for a reader on another task, as the metrics server).
    pub fn stats_handle(&self) -> Arc<TcpStats> {
        self.stats.clone()
    }

    /// Connects to `peer` now, retrying until `deadline` passes (peers that start at about the
    /// same time may not listen yet). Sends connect lazily anyway; this only front-loads it.
    pub async fn connect_within(
        &mut self,
        peer: NodeId,
        within: Duration,
    ) -> Result<(), TransportError> {
        let give_up = tokio::time::Instant::now() + within;
        loop {
            let connected = match self.connect(peer).await {
                Ok(p) => p.dialled_in().is_some(),
                Err(TransportError::Unreachable(_)) => false,
                Err(e) => return Err(e),
            };
            if connected {
                return Ok(());
            }
            if tokio::time::Instant::now() >= give_up {
                return Err(TransportError::Unreachable(peer));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Where the peers whose first dial failed are heard (see [`Unreachable::next`]).
    pub fn unreachable(&self) -> Unreachable {
        self.unreachable.clone()
    }

    async fn connect(&mut self, to: NodeId) -> Result<&mut Peer, TransportError> {
        let current = self.addrs.lock().expect("poisoned").get(&to).copied();
        // A peer that moved (a restarted process): dial it as a new one.
        if self.peers.get(&to).is_some_and(|p| Some(p.addr) != current) {
            self.forget(to);
        }
        if self.cfg.dial_in_background {
            if self.peers.get(&to).is_some_and(|p| p.failed.load(Ordering::Relaxed)) {
                self.drop_peer(to);
                return Err(TransportError::Unreachable(to));
            }
            if !self.peers.contains_key(&to) {
                let addr = current.ok_or(TransportError::Unreachable(to))?;
                let peer = self.dialer().dialling_peer(to, addr, self.unreachable.clone());
                self.peers.insert(to, peer);
            }
            return self.peers.get_mut(&to).ok_or(TransportError::Unreachable(to));
        }
        // A failed connection to a peer this endpoint was connected to: dial again in the
        // background, and wait for it only briefly (a partition must not hold the sender up).
        if self.peers.get(&to).is_some_and(|p| p.failed.load(Ordering::Relaxed)) {
            self.drop_peer(to);
        }
        if let (false, Some(&dialled_in)) = (self.peers.contains_key(&to), self.known.get(&to)) {
            let addr = current.ok_or(TransportError::Unreachable(to))?;
            // A new dial gets one attempt's time (a reachable peer answers within it); one
            // already under way, whose attempts are failing, only a moment.
            let (mut handle, wait) = match self.redials.remove(&to) {
                Some(h) => (h, REDIAL_WAIT),
                None => {
                    let d = self.dialer();
                    let h = tokio::spawn(async move { d.redial(to, addr, dialled_in).await });
                    (h, redial_attempt(dialled_in, &self.cfg))
                }
            };
            match tokio::time::timeout(wait, &mut handle).await {
                Ok(Ok(Ok(peer))) => {
                    self.peers.insert(to, peer);
                }
                Ok(Ok(Err(e))) => return Err(e),
                Ok(Err(_)) => return Err(TransportError::Unreachable(to)),
                Err(_) => {
                    self.redials.insert(to, handle);
                    return Err(TransportError::Unreachable(to));
                }
            }
        }
        if !self.peers.contains_key(&to) {
            // A first dial never holds the sender up (a peer announcing an address that drops
            // SYNs would hold it for `connect_timeout`, past everyone's heartbeat timeout): the
            // frames wait in the connection's queue, and a failure is heard from `unreachable`.
            let addr = current.ok_or(TransportError::Unreachable(to))?;
            let peer = self.dialer().dialling_peer(to, addr, self.unreachable.clone());
            self.peers.insert(to, peer);
        }
        let peer = self.peers.get_mut(&to).expect("inserted");
        if let Some(d) = peer.dialled_in() {
            self.known.insert(to, d);
        }
        Ok(peer)
    }

    /// What a dial needs of this endpoint (owned: a background redial outlives the borrow).
    fn dialer(&self) -> Dialer {
        Dialer {
            me: self.id,
            port: self.local_addr.port(),
            cfg: self.cfg.clone(),
            stats: self.stats.clone(),
        }
    }
}

/// This endpoint as a dialer: its id and listening port (for the handshake), settings, counters.
struct Dialer {
    me: NodeId,
    port: u16,
    cfg: Arc<TcpConfig>,
    stats: Arc<TcpStats>,
}

impl Dialer {
    /// Dials `streams` connections to `to` at `addr` and starts their writer tasks.
    async fn peer(&self, to: NodeId, addr: SocketAddr) -> Result<Peer, TransportError> {
        let started = tokio::time::Instant::now();
        let failed = Arc::new(AtomicBool::new(false));
        let n = self.cfg.streams.max(1);
        let mut streams = Vec::with_capacity(n);
        for _ in 0..n {
            streams.push(self.stream(to, addr, &failed).await?);
        }
        let per_stream = started.elapsed() / u32::try_from(n).unwrap_or(u32::MAX);
        let dial_time = Arc::new(AtomicU64::new(nanos(per_stream)));
        Ok(Peer { addr, streams, bulk: Vec::new(), next: 0, next_bulk: 0, failed, dial_time })
    }

    /// A peer whose connections are dialled by their own writer tasks
    /// ([`TcpConfig::dial_in_background`]): frames sent meanwhile wait in their queues, and a
    /// dial that fails or times out marks the peer failed and is reported to `unreachable`.
    fn dialling_peer(&self, to: NodeId, addr: SocketAddr, unreachable: Unreachable) -> Peer {
        let failed = Arc::new(AtomicBool::new(false));
        let dial_time = Arc::new(AtomicU64::new(0));
        let streams = (0..self.cfg.streams.max(1))
            .map(|_| self.background_stream(to, addr, &failed, &dial_time, &unreachable))
            .collect();
        Peer { addr, streams, bulk: Vec::new(), next: 0, next_bulk: 0, failed, dial_time }
    }

    /// One connection to `to` at `addr`, dialled by its own writer task (within
    /// `connect_timeout`): frames sent meanwhile wait in its queue. The first of the peer's
    /// connections to connect sets `dial_time`; a dial that fails marks the peer `failed` and,
    /// the first time, reports it to `unreachable` (handshake refusals are logged as warnings:
    /// a wrong secret or version is the operator's to fix).
    fn background_stream(
        &self,
        to: NodeId,
        addr: SocketAddr,
        failed: &Arc<AtomicBool>,
        dial_time: &Arc<AtomicU64>,
        unreachable: &Unreachable,
    ) -> mpsc::UnboundedSender<Outgoing> {
        let (tx, rx) = mpsc::unbounded_channel();
        let (me, port, cfg) = (self.me, self.port, self.cfg.clone());
        let (stats, failed) = (self.stats.clone(), failed.clone());
        let (dial_time, unreachable) = (dial_time.clone(), unreachable.clone());
        tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            let dialled =
                tokio::time::timeout(cfg.connect_timeout, dial(me, port, to, addr, &cfg, true));
            match dialled.await {
                Ok(Ok(stream)) => {
                    let took = nanos(started.elapsed());
                    let _ =
                        dial_time.compare_exchange(0, took, Ordering::Relaxed, Ordering::Relaxed);
                    return write_loop(to, stream, rx, failed, stats, cfg.frame_timeout).await;
                }
                Ok(Err(e @ TransportError::Unreachable(_))) => {
                    tracing::debug!(peer = %to, %addr, "dial failed: {e}");
                }
                Ok(Err(e)) => tracing::warn!(peer = %to, %addr, "connection refused: {e}"),
                Err(_) => tracing::debug!(peer = %to, %addr, "dial timed out"),
            }
            if !failed.swap(true, Ordering::Relaxed) {
                unreachable.report(to);
            }
        });
        tx
    }

    /// Dials `to` again after its connection failed, in attempts of three times what the last
    /// successful dial took (`dialled_in`, two round trips), within [`REDIAL_ATTEMPT_MIN`] and
    /// [`REDIAL_ATTEMPT_MAX`]: a SYN lost in a partition is not waited for (its own
    /// retransmissions back off: 1, 3, 7 s), a new attempt sends a new one. Until one connects,
    /// the peer refuses (its process is gone, or the handshake is refused), or
    /// [`TcpConfig::connect_timeout`] has passed.
    async fn redial(
        &self,
        to: NodeId,
        addr: SocketAddr,
        dialled_in: Duration,
    ) -> Result<Peer, TransportError> {
        let give_up = tokio::time::Instant::now() + self.cfg.connect_timeout;
        let attempt = redial_attempt(dialled_in, &self.cfg);
        loop {
            match tokio::time::timeout(attempt, self.peer(to, addr)).await {
                Ok(r) => return r,
                Err(_) if tokio::time::Instant::now() < give_up => {}
                Err(_) => return Err(TransportError::Unreachable(to)),
            }
        }
    }

    /// Dials one connection to `to` at `addr` and starts its writer task.
    async fn stream(
        &self,
        to: NodeId,
        addr: SocketAddr,
        failed: &Arc<AtomicBool>,
    ) -> Result<mpsc::UnboundedSender<Outgoing>, TransportError> {
        let stream = dial(self.me, self.port, to, addr, &self.cfg, false).await?;
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(write_loop(
            to,
            stream,
            rx,
            failed.clone(),
            self.stats.clone(),
            self.cfg.frame_timeout,
        ));
        Ok(tx)
    }
}

/// `d` in nanoseconds, at least 1 (0 means "not connected yet" in [`Peer::dial_time`]).
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1)
}

/// How long one attempt of a redial lasts (see [`Dialer::redial`]).
fn redial_attempt(dialled_in: Duration, cfg: &TcpConfig) -> Duration {
    (dialled_in * 3).clamp(REDIAL_ATTEMPT_MIN, REDIAL_ATTEMPT_MAX).min(cfg.connect_timeout)
}

impl Transport for TcpTransport {
    fn local_id(&self) -> NodeId {
        self.id
    }

    async fn send(&mut self, to: NodeId, frame: Frame) -> Result<(), TransportError> {
        if frame.body.is_virtual() {
            return Err(TransportError::Corrupt {
                from: self.id,
                reason: "a virtual body cannot be sent over TCP".into(),
            });
        }
        let stats = self.stats.clone();
        let peer = self.connect(to).await?;
        if matches!(frame.header, Header::State(_)) && peer.bulk.is_empty() {
            // Dialled in the background, as a first dial is: a joiner whose address drops SYNs
            // holds up no sender's loop (its heartbeats).
            let (addr, failed, dial_time) =
                (peer.addr, peer.failed.clone(), peer.dial_time.clone());
            let d = self.dialer();
            let bulk = (0..self.cfg.state_streams.max(1))
                .map(|_| d.background_stream(to, addr, &failed, &dial_time, &self.unreachable))
                .collect();
            self.peers.get_mut(&to).ok_or(TransportError::Unreachable(to))?.bulk = bulk;
        }
        let peer = self.peers.get_mut(&to).ok_or(TransportError::Unreachable(to))?;
        let queue = match &frame.header {
            Header::Collective(_) => {
                peer.next = (peer.next + 1) % peer.streams.len();
                &peer.streams[peer.next]
            }
            Header::State(_) => {
                peer.next_bulk = (peer.next_bulk + 1) % peer.bulk.len().max(1);
                peer.bulk.get(peer.next_bulk).ok_or(TransportError::Unreachable(to))?
            }
            Header::Mesh(_) | Header::StateAsk(_) => &peer.streams[0],
        };
        if queue.send(Outgoing::Frame(frame)).is_err() || peer.failed.load(Ordering::Relaxed) {
            self.drop_peer(to);
            return Err(TransportError::Unreachable(to));
        }
        stats.frames_sent.fetch_add(1, Ordering::Relaxed);
        // Let the writer tasks run now: on a current-thread runtime a receiver that always has
        // frames waiting would otherwise starve them, and the ring's pipeline would stall.
        tokio::task::yield_now().await;
        Ok(())
    }

    async fn recv(&mut self) -> Result<(NodeId, Frame), TransportError> {
        // The frame's share of the queue's byte budget is given back as it leaves the queue.
        let (from, frame, _budget) = self.inbox.recv().await.ok_or(TransportError::Closed)?;
        Ok((from, frame))
    }
}

/// Dials `to` at `addr` and runs the handshake. With `resend_syn`, a connection attempt that has
/// had no answer after [`REDIAL_ATTEMPT_MAX`] is replaced by a new one (a new SYN), at most
/// [`SYN_ATTEMPTS`] times, rather than waiting for the kernel's retransmissions (1, 3, 7 s
/// apart): through a partition that heals, the connection follows within that interval. The
/// caller bounds the whole.
async fn dial(
    me: NodeId,
    listen_port: u16,
    to: NodeId,
    addr: SocketAddr,
    cfg: &TcpConfig,
    resend_syn: bool,
) -> Result<WireOut, TransportError> {
    let unreachable = |_| TransportError::Unreachable(to);
    let addr = cfg.dial_via.get(&to).copied().unwrap_or(addr);
    let s = if resend_syn {
        let mut connected = None;
        for _ in 0..SYN_ATTEMPTS {
            if let Ok(r) = tokio::time::timeout(REDIAL_ATTEMPT_MAX, TcpStream::connect(addr)).await
            {
                connected = Some(r);
                break;
            }
        }
        connected.ok_or(TransportError::Unreachable(to))?.map_err(unreachable)?
    } else {
        TcpStream::connect(addr).await.map_err(unreachable)?
    };
    s.set_nodelay(true).map_err(unreachable)?;
    set_congestion(&s, cfg.congestion.as_deref());
    set_user_timeout(&s, cfg.user_timeout);
    let out = dial_handshake(s, me, listen_port, to, cfg).await;
    if let Err(TransportError::Corrupt { reason, .. }) = &out {
        tracing::warn!(peer = %to, %addr, "{reason}");
    }
    out
}

/// The dialer's handshake on a connected stream: the hello, and with a secret the Noise
/// handshake and the confirmation record ([`secure`]). Gives the connection's writing end.
async fn dial_handshake<S: AsyncRead + AsyncWrite + Send + Unpin + 'static>(
    mut s: S,
    me: NodeId,
    listen_port: u16,
    to: NodeId,
    cfg: &TcpConfig,
) -> Result<WireOut, TransportError> {
    let unreachable = |_| TransportError::Unreachable(to);
    let hello = plain_hello(PROTOCOL_VERSION, me, listen_port, Security::of(cfg));
    let corrupt = |reason: String| TransportError::Corrupt { from: to, reason };
    let remote = match &cfg.identity {
        Some(id) => match id.wait_for_key(to, crate::identity::VOUCH_WAIT).await {
            Some(k) => Some(k),
            None => return Err(corrupt(format!("no key for node {to} (roster or directory)"))),
        },
        None => None,
    };
    let keys = match (&cfg.identity, &remote) {
        (Some(id), Some(r)) => Some(secure::Keys { local: id.key.private(), remote: Some(&r.0) }),
        _ => None,
    };
    let noise = match cfg.secret.as_deref() {
        Some(k) => {
            let (hs, first) = secure::first_flight(&hello, k, keys).map_err(corrupt)?;
            s.write_all(&[hello.as_slice(), &first].concat()).await.map_err(unreachable)?;
            Some(hs)
        }
        None => {
            s.write_all(&hello).await.map_err(unreachable)?;
            None
        }
    };
    let mut reply = [0u8; HELLO_REPLY_LEN];
    s.read_exact(&mut reply).await.map_err(unreachable)?;
    let theirs = u16::from_le_bytes([reply[1], reply[2]]);
    let reason = match reply[0] {
        x if x == HelloStatus::Ok as u8 => {
            let Some(hs) = noise else { return Ok(Box::new(s)) };
            let transport = secure::dial_second(&mut s, hs).await.map_err(corrupt)?;
            let mut w = secure::SecureWriter::new(s, transport);
            // The confirmation: only the holder of this handshake's keys can write it.
            w.write_all(&hello).await.map_err(unreachable)?;
            w.flush().await.map_err(unreachable)?;
            return Ok(Box::new(w));
        }
        x if x == HelloStatus::BadVersion as u8 => {
            format!("refused: protocol version {PROTOCOL_VERSION}, peer speaks {theirs}")
        }
        x if x == HelloStatus::BadSecret as u8 => {
            if keys.is_some() {
                "refused: wrong run secret, or the peer's key is not the one the roster gives it \
                 (or one side runs without a secret)"
                    .to_string()
            } else {
                "refused: wrong run secret (or one side runs without one)".to_string()
            }
        }
        x if x == HelloStatus::BadIdentity as u8 => {
            "refused: this node's key is not the one the peer's roster gives its id (or one \
             side runs with a roster and the other without)"
                .to_string()
        }
        _ => "refused the handshake".to_string(),
    };
    Err(corrupt(reason))
}

#[derive(Clone)]
struct AcceptCtx {
    me: NodeId,
    cfg: Arc<TcpConfig>,
    stats: Arc<TcpStats>,
    addrs: Directory,
    /// The receive queue's byte budgets.
    budget: Budgets,
    /// Authenticated incoming connections open now, per peer.
    inbound: OpenInbound,
}

/// Authenticated incoming connections a peer may hold open at once; a newer one closes the
/// oldest. An honest peer holds its collective streams, its state streams and, for a moment,
/// the connections a partition left behind: far fewer.
pub const MAX_CONNECTIONS_PER_PEER: usize = 64;

/// Authenticated incoming connections open now, per peer, oldest first, each with what closes
/// it (their learned addresses are kept while any is open).
type OpenInbound = Arc<std::sync::Mutex<BTreeMap<NodeId, std::collections::VecDeque<Open>>>>;

/// One open incoming connection: its number, and what tells its reader to close it.
type Open = (u64, Arc<tokio::sync::Notify>);

/// Counts one open incoming connection of a peer for as long as it lives; past
/// [`MAX_CONNECTIONS_PER_PEER`] the peer's oldest is told to close.
struct InboundGuard {
    from: NodeId,
    number: u64,
    close: Arc<tokio::sync::Notify>,
    inbound: OpenInbound,
}

impl InboundGuard {
    fn new(from: NodeId, inbound: &OpenInbound, stats: &TcpStats) -> InboundGuard {
        static NUMBER: AtomicU64 = AtomicU64::new(0);
        let number = NUMBER.fetch_add(1, Ordering::Relaxed);
        let close = Arc::new(tokio::sync::Notify::new());
        let mut open = inbound.lock().unwrap_or_else(|e| e.into_inner());
        let list = open.entry(from).or_default();
        while list.len() >= MAX_CONNECTIONS_PER_PEER {
            let Some((_, oldest)) = list.pop_front() else { break };
            oldest.notify_one();
            stats.evicted_connections.fetch_add(1, Ordering::Relaxed);
        }
        list.push_back((number, close.clone()));
        InboundGuard { from, number, close, inbound: inbound.clone() }
    }

    /// Resolves when a newer connection of the same peer made this one close.
    async fn evicted(&self) {
        self.close.notified().await;
    }
}

impl Drop for InboundGuard {
    fn drop(&mut self) {
        let mut open = self.inbound.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(list) = open.get_mut(&self.from) {
            list.retain(|(n, _)| *n != self.number);
            if list.is_empty() {
                open.remove(&self.from);
            }
        }
    }
}

/// A frame in the receive queue, with its share of the queue's byte budget.
type Inbound = (NodeId, Frame, Option<tokio::sync::OwnedSemaphorePermit>);

/// Bytes per permit of the receive queue's budget.
const INBOX_UNIT: u64 = 1 << 10;

fn inbox_permits(bytes: u64) -> usize {
    usize::try_from(bytes.div_ceil(INBOX_UNIT).clamp(1, u64::from(u32::MAX >> 4))).unwrap_or(1)
}

async fn accept_loop(listener: TcpListener, ctx: AcceptCtx, inbox: mpsc::Sender<Inbound>) {
    let admission = Admission::new(MAX_HANDSHAKES);
    let mut backoff = Backoff::default();
    loop {
        let (stream, addr) = match listener.accept().await {
            Ok(accepted) => {
                backoff.succeeded();
                accepted
            }
            Err(e) => {
                let (pause, first) = backoff.failed();
                if first {
                    tracing::warn!("accepting a connection failed: {e}; retrying with back-off");
                }
                tokio::time::sleep(pause).await;
                continue;
            }
        };
        let (mut slot, evicted) = admission.admit();
        if evicted {
            ctx.stats.evicted_handshakes.fetch_add(1, Ordering::Relaxed);
        }
        let (ctx, inbox) = (ctx.clone(), inbox.clone());
        tokio::spawn(async move {
            let _ = stream.set_nodelay(true);
            set_congestion(&stream, ctx.cfg.congestion.as_deref());
            set_keepalive(&stream);
            let hs =
                tokio::time::timeout(ctx.cfg.connect_timeout, accept_handshake(stream, &ctx.cfg));
            let outcome = tokio::select! {
                outcome = hs => outcome,
                () = slot.evicted() => {
                    tracing::debug!(%addr, "closed a handshake in flight to make room for a newer one");
                    return;
                }
            };
            drop(slot);
            match outcome {
                Ok(Ok((from, port, stream))) => {
                    ctx.stats.accepted_connections.fetch_add(1, Ordering::Relaxed);
                    let open = InboundGuard::new(from, &ctx.inbound, &ctx.stats);
                    if port != 0 {
                        let learned = SocketAddr::new(addr.ip(), port);
                        ctx.addrs.lock().expect("poisoned").insert(from, learned);
                    }
                    tokio::select! {
                        () = read_loop(from, stream, &ctx, &inbox) => {}
                        () = open.evicted() => {
                            tracing::debug!(peer = %from, %addr, "closed: a newer connection of this peer made room");
                        }
                    }
                }
                Ok(Err(refused)) => {
                    ctx.stats.rejected_handshakes.fetch_add(1, Ordering::Relaxed);
                    if refused.identity {
                        ctx.stats.refused_identities.fetch_add(1, Ordering::Relaxed);
                    }
                    tracing::warn!(%addr, "refused a connection: {}", refused.reason);
                }
                Err(_) => {
                    ctx.stats.rejected_handshakes.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%addr, "handshake timed out");
                }
            }
        });
    }
}

/// Why an incoming connection was refused at its handshake.
#[derive(Debug)]
struct Refusal {
    reason: String,
    /// For the dialer's key (or its lack of one): counted as `refused_identities`.
    identity: bool,
}

impl From<String> for Refusal {
    fn from(reason: String) -> Refusal {
        Refusal { reason, identity: false }
    }
}

/// The hello's answer, and the Noise state that follows an `Ok` one with a secret.
async fn hello_status<S: AsyncRead + Unpin>(
    s: &mut S,
    hello: &[u8; HELLO_LEN],
    cfg: &TcpConfig,
) -> Result<(HelloStatus, Option<snow::HandshakeState>, Option<Refusal>), String> {
    let version = u16::from_le_bytes([hello[4], hello[5]]);
    let from = NodeId(u32::from_le_bytes([hello[6], hello[7], hello[8], hello[9]]));
    if hello[..4] != MAGIC {
        return Ok((HelloStatus::BadMagic, None, Some("not a loco peer".to_string().into())));
    }
    if version != PROTOCOL_VERSION {
        let why = format!("{from} speaks protocol version {version}, this node {PROTOCOL_VERSION}");
        return Ok((HelloStatus::BadVersion, None, Some(why.into())));
    }
    let theirs = hello[12];
    let identity = |reason: String| Some(Refusal { reason, identity: true });
    let secret = |reason: String| Some(Refusal::from(reason));
    let (ours, k) = (Security::of(cfg), cfg.secret.as_deref());
    Ok(match (ours, theirs, k) {
        (Security::None, 0, _) => (HelloStatus::Ok, None, None),
        (Security::None, _, _) => (
            HelloStatus::BadSecret,
            None,
            secret(format!("{from} runs with a secret, this node without one")),
        ),
        (_, 0, _) => {
            (HelloStatus::BadSecret, None, secret(format!("{from} does not know the run secret")))
        }
        (Security::Secret, 2, _) => (
            HelloStatus::BadIdentity,
            None,
            identity(format!("{from} runs with a node key, this node without a roster")),
        ),
        (Security::Keyed, 1, _) => (
            HelloStatus::BadIdentity,
            None,
            identity(format!(
                "{from} runs without a node key, and this run binds ids to keys (a roster)"
            )),
        ),
        (Security::Secret, 1, Some(k)) => match secure::accept_first(s, hello, k, None).await? {
            Ok(hs) => (HelloStatus::Ok, Some(hs), None),
            Err(_) => (
                HelloStatus::BadSecret,
                None,
                secret(format!("{from} does not know the run secret")),
            ),
        },
        (Security::Keyed, 2, Some(k)) => {
            let Some(me) = cfg.identity.as_deref() else {
                return Err("a keyed run without an identity".into());
            };
            match secure::accept_first(s, hello, k, Some(me.key.private())).await? {
                Ok(hs) => match check_key(from, &hs, me).await {
                    None => (HelloStatus::Ok, Some(hs), None),
                    Some(why) => (HelloStatus::BadIdentity, None, identity(why)),
                },
                Err(_) => (
                    HelloStatus::BadSecret,
                    None,
                    secret(format!(
                        "{from} does not know the run secret, or dialled this node with another \
                         key than its own"
                    )),
                ),
            }
        }
        (_, t, _) => (HelloStatus::BadMagic, None, secret(format!("{from}: no security mode {t}"))),
    })
}

/// `None` when the dialer's static key in `hs` is the one `me` knows for `from`; else why not.
/// A member that knows no key for `from` yet waits a little for the coordinator's directory to
/// name one ([`crate::identity::VOUCH_WAIT`]): a node admitted a moment ago may dial first.
async fn check_key(
    from: NodeId,
    hs: &snow::HandshakeState,
    me: &crate::identity::Identity,
) -> Option<String> {
    let Some(key) = hs.get_remote_static().and_then(|k| <[u8; 32]>::try_from(k).ok()) else {
        return Some(format!("{from} showed no static key"));
    };
    let key = crate::identity::PublicKey(key);
    let wait =
        if me.me() == NodeId::COORDINATOR { Duration::ZERO } else { crate::identity::VOUCH_WAIT };
    match (me.wait_for_key(from, wait).await, me.id_of(&key)) {
        (Some(k), _) if k == key => None,
        (_, Some(owner)) => {
            Some(format!("a peer with {owner}'s key {} claimed to be {from}", key.short()))
        }
        (_, None) => Some(format!(
            "a peer claiming to be {from} has a key no node of the roster has ({})",
            key.short()
        )),
    }
}

/// The acceptor's handshake: the hello, and with a secret the Noise handshake and the dialer's
/// confirmation ([`secure`]). Gives the dialer's id, its listening port, and the connection's
/// reading end.
async fn accept_handshake<S: AsyncRead + AsyncWrite + Send + Unpin + 'static>(
    mut s: S,
    cfg: &TcpConfig,
) -> Result<(NodeId, u16, WireIn), Refusal> {
    let mut hello = [0u8; HELLO_LEN];
    match tokio::time::timeout(HELLO_TIMEOUT, s.read_exact(&mut hello)).await {
        Ok(read) => read.map_err(|e| format!("reading the handshake: {e}"))?,
        Err(_) => return Err(format!("no hello within {HELLO_TIMEOUT:?}").into()),
    };
    let from = NodeId(u32::from_le_bytes([hello[6], hello[7], hello[8], hello[9]]));
    let port = u16::from_le_bytes([hello[10], hello[11]]);
    let (status, noise, refused) = hello_status(&mut s, &hello, cfg).await?;
    let mut reply = [status as u8, 0, 0];
    debug_assert_eq!(reply.len(), HELLO_REPLY_LEN);
    reply[1..].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    s.write_all(&reply).await.map_err(|e| format!("answering the handshake: {e}"))?;
    if let Some(r) = refused {
        return Err(r);
    }
    let Some(hs) = noise else { return Ok((from, port, Box::new(s))) };
    let transport = secure::accept_second(&mut s, hs).await?;
    let mut r = secure::SecureReader::new(s, transport);
    let mut confirm = [0u8; HELLO_LEN];
    match r.read_exact(&mut confirm).await {
        Ok(_) if confirm == hello => Ok((from, port, Box::new(r))),
        _ => Err(format!(
            "{from} did not confirm the handshake (a replayed or forged first message)"
        )
        .into()),
    }
}

async fn read_loop(from: NodeId, mut s: WireIn, ctx: &AcceptCtx, inbox: &mpsc::Sender<Inbound>) {
    loop {
        match read_frame_charged(&mut s, &ctx.cfg, Some(&ctx.budget)).await {
            Ok(Some((Incoming::Frame(frame), permit))) => {
                ctx.stats.frames_received.fetch_add(1, Ordering::Relaxed);
                if inbox.send((from, frame, permit)).await.is_err() {
                    return; // this endpoint is gone
                }
            }
            Ok(Some((Incoming::Directory(entries), _))) => {
                // Only the coordinator tells a node where its peers listen: a member's directory
                // could point the others' traffic anywhere.
                if from != NodeId::COORDINATOR || ctx.me == NodeId::COORDINATOR {
                    ctx.stats.unauthorised.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(node = %ctx.me, peer = %from, "refused a directory from a peer that is not the coordinator; dropped its connection");
                    return;
                }
                let mut addrs = ctx.addrs.lock().expect("poisoned");
                for &(id, addr, _) in &entries {
                    // Nobody moves this node, nor the coordinator the node dialled itself.
                    if id != ctx.me && id != NodeId::COORDINATOR {
                        addrs.insert(id, addr);
                    }
                }
                drop(addrs);
                // The coordinator vouches for its members' keys (over its own authenticated
                // connection): a member's roster need not name them.
                if let Some(identity) = &ctx.cfg.identity {
                    identity.vouch(entries.iter().filter_map(|&(id, _, k)| Some((id, k?))));
                }
            }
            Ok(None) => return, // clean close between frames
            Err(reason) => {
                ctx.stats.corrupt_frames.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(node = %ctx.me, peer = %from, "dropped a corrupt frame and its connection: {reason}");
                return;
            }
        }
    }
}

/// Reads one frame; `Ok(None)` when the peer closed the connection between frames.
#[cfg(any(test, feature = "fuzzing"))]
async fn read_frame<R: AsyncRead + Unpin>(
    s: &mut R,
    cfg: &TcpConfig,
) -> Result<Option<Incoming>, String> {
    Ok(read_frame_charged(s, cfg, None).await?.map(|(i, _)| i))
}

/// The largest body a frame with `header` may carry: none for control messages but a probe's
/// padding, at most [`PROBE_MAX_BYTES`] for that, [`TcpConfig::max_body`] for ring segments and
/// state pieces. Checked before the body is read.
fn body_limit(header: &Header, cfg: &TcpConfig) -> u64 {
    match header {
        Header::Mesh(MeshMsg::Probe { .. }) => PROBE_MAX_BYTES.min(cfg.max_body),
        Header::Mesh(_) | Header::StateAsk(_) => 0,
        Header::Collective(_) | Header::State(_) => cfg.max_body,
    }
}

/// The receive queue's byte budgets, in permits of [`INBOX_UNIT`] bytes, each of
/// [`TcpConfig::inbox_bytes`]: one for state pieces, one for everything else, so that a joiner's
/// state transfer never holds up the ring's frames or the heartbeats behind it.
#[derive(Clone, Debug)]
struct Budgets {
    bulk: Arc<tokio::sync::Semaphore>,
    other: Arc<tokio::sync::Semaphore>,
}

impl Budgets {
    fn new(bytes: u64) -> Budgets {
        let each = || Arc::new(tokio::sync::Semaphore::new(inbox_permits(bytes)));
        Budgets { bulk: each(), other: each() }
    }

    /// The budget a frame of `kind` is charged to.
    fn of(&self, kind: u8) -> &Arc<tokio::sync::Semaphore> {
        if kind == KIND_STATE { &self.bulk } else { &self.other }
    }
}

/// Header bytes a frame may carry without being charged to the receive budget.
const HEADER_FREE: usize = 4096;
/// What one header byte may decode to, at most about (lists of ids and weights): a header above
/// [`HEADER_FREE`] is charged this many times its length.
const HEADER_DECODED: u64 = 16;

/// What a frame's parts read before its body tell.
struct Head {
    kind: u8,
    blen: u64,
    header: Vec<u8>,
}

/// Reads one frame as [`read_frame`] does, and with a `budget` takes the body's share of it
/// before reading the body (all of it for a body beyond the whole budget), and a large header's
/// at its decoded size: a connection whose frame does not fit waits, unread, until the node
/// takes frames, so that the frames held in memory, read or being read, never exceed the
/// budget. The header is read and its body's
/// limit for its kind checked first ([`body_limit`]).
async fn read_frame_charged<R: AsyncRead + Unpin>(
    s: &mut R,
    cfg: &TcpConfig,
    budget: Option<&Budgets>,
) -> Result<Option<(Incoming, Option<tokio::sync::OwnedSemaphorePermit>)>, String> {
    let mut prefix = [0u8; PREFIX_LEN];
    // Idle for as long as the peer likes before the first byte ...
    let n = s.read(&mut prefix[..1]).await.map_err(|e| e.to_string())?;
    if n == 0 {
        return Ok(None);
    }
    // ... then the header must come in time ...
    let head = async {
        s.read_exact(&mut prefix[1..]).await.map_err(|e| e.to_string())?;
        let kind = prefix[0];
        let hlen = u32::from_le_bytes(prefix[1..5].try_into().expect("4 bytes"));
        let blen = u64::from_le_bytes(prefix[5..13].try_into().expect("8 bytes"));
        if !matches!(kind, KIND_FRAME | KIND_DIRECTORY | KIND_STATE) {
            return Err(format!("unknown frame kind {kind}"));
        }
        if hlen == 0 || hlen > MAX_HEADER {
            return Err(format!("header length {hlen}"));
        }
        if blen > cfg.max_body {
            return Err(format!("body length {blen} above the limit {}", cfg.max_body));
        }
        let mut header = vec![0u8; hlen as usize];
        s.read_exact(&mut header).await.map_err(|e| e.to_string())?;
        Ok(Head { kind, blen, header })
    };
    let Head { kind, blen, header } = within(cfg, head).await?;
    // The kind's limit, from the header (checksummed with the body: checked again below).
    let decoded = match kind {
        KIND_DIRECTORY => None,
        _ => Some(
            postcard::from_bytes::<Header>(&header)
                .map_err(|e| format!("undecodable header: {e}"))?,
        ),
    };
    let limit = decoded.as_ref().map_or(0, |h| body_limit(h, cfg));
    if blen > limit {
        return Err(format!("body length {blen} above the limit {limit} for its kind"));
    }
    // A large header is charged at what it may decode to; small ones (every heartbeat) are free,
    // so that control messages never wait behind bulk bodies.
    let charged = match header.len() {
        n if n > HEADER_FREE => blen.saturating_add(n as u64 * HEADER_DECODED),
        _ => blen,
    };
    let permit = match budget.map(|b| b.of(kind)) {
        Some(b) if charged > 0 => {
            let whole = inbox_permits(cfg.inbox_bytes);
            let n = u32::try_from(inbox_permits(charged).min(whole)).unwrap_or(u32::MAX);
            Some(b.clone().acquire_many_owned(n).await.map_err(|e| e.to_string())?)
        }
        _ => None,
    };
    // ... and the body once there is room for it.
    let rest = async {
        // A state piece's body is checked against its digest by its taker, not here.
        let (sum_body, chunk) =
            if kind == KIND_STATE { (false, STATE_CHUNK as u64) } else { (true, PIECE as u64) };
        // Read into uninitialised capacity (no zeroing of large bodies), of a recycled buffer
        // (no fresh pages for the kernel to zero either).
        let mut body = pool::with_capacity(blen.min(BODY_RESERVE) as usize);
        let mut h = Checksum::default();
        h.write(&header);
        while body.len() < blen as usize {
            let piece = (blen - body.len() as u64).min(chunk);
            if body.capacity() - body.len() < piece as usize {
                // At most double what arrived, never past the announced length.
                let left = blen as usize - body.len();
                body.reserve_exact(body.capacity().max(PIECE).min(left));
            }
            let mut limited = (&mut *s).take(piece);
            let start = body.len();
            if limited.read_buf(&mut body).await.map_err(|e| e.to_string())? == 0 {
                return Err("connection closed inside a frame".into());
            }
            // Checksum each piece while it is still in the cache the kernel copied it through.
            if sum_body {
                h.write(&body[start..]);
            }
        }
        let mut sum = [0u8; CHECKSUM_LEN];
        s.read_exact(&mut sum).await.map_err(|e| e.to_string())?;
        if h.finish() != u64::from_le_bytes(sum) {
            return Err("checksum mismatch".into());
        }
        Ok(body)
    };
    let body = within(cfg, rest).await?;
    let Some(header) = decoded else {
        let entries: Vec<(u32, String, Option<[u8; 32]>)> =
            postcard::from_bytes(&header).map_err(|e| format!("undecodable directory: {e}"))?;
        let entries = entries
            .into_iter()
            .map(|(id, a, k)| {
                let addr = a.parse().map_err(|_| format!("bad address {a}"))?;
                Ok((NodeId(id), addr, k.map(crate::identity::PublicKey)))
            })
            .collect::<Result<Vec<_>, String>>()?;
        return Ok(Some((Incoming::Directory(entries), None)));
    };
    if kind == KIND_STATE && !matches!(header, Header::State(_)) {
        return Err("a body without a checksum that is not a state piece".into());
    }
    let frame = Frame { header, body: Body::Bytes(pool::freeze(body)) };
    Ok(Some((Incoming::Frame(frame), permit)))
}

/// `part` of a frame, within [`TcpConfig::frame_timeout`].
async fn within<T>(
    cfg: &TcpConfig,
    part: impl Future<Output = Result<T, String>>,
) -> Result<T, String> {
    match tokio::time::timeout(cfg.frame_timeout, part).await {
        Ok(r) => r,
        Err(_) => Err(format!("frame incomplete after {:?}", cfg.frame_timeout)),
    }
}

/// The message's header bytes (or the directory) and body.
fn parts(msg: &Outgoing) -> Result<(u8, Vec<u8>, &[u8]), String> {
    Ok(match msg {
        Outgoing::Frame(frame) => {
            let Body::Bytes(body) = &frame.body else { return Err("virtual body".into()) };
            let kind =
                if matches!(frame.header, Header::State(_)) { KIND_STATE } else { KIND_FRAME };
            (kind, postcard::to_allocvec(&frame.header).map_err(|e| e.to_string())?, body)
        }
        Outgoing::Directory(entries) => {
            let list: Vec<(u32, String, Option<[u8; 32]>)> =
                entries.iter().map(|(n, a, k)| (n.0, a.to_string(), k.map(|k| k.0))).collect();
            (KIND_DIRECTORY, postcard::to_allocvec(&list).map_err(|e| e.to_string())?, &[])
        }
    })
}

/// Encodes a whole message into one buffer: prefix, header, body and checksum.
#[cfg(test)]
fn encode_msg(msg: &Outgoing) -> Result<Vec<u8>, String> {
    let (kind, header, body) = parts(msg)?;
    Ok(encode_parts(kind, &header, body))
}

/// [`encode_msg`] of a message already split by [`parts`].
fn encode_parts(kind: u8, header: &[u8], body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(PREFIX_LEN + header.len() + body.len() + CHECKSUM_LEN);
    push_prefix(&mut out, kind, header, body.len());
    out.extend_from_slice(body);
    let mut h = Checksum::default();
    h.write(header);
    if kind != KIND_STATE {
        h.write(body);
    }
    out.extend_from_slice(&h.finish().to_le_bytes());
    out
}

fn push_prefix(out: &mut Vec<u8>, kind: u8, header: &[u8], body_len: usize) {
    out.push(kind);
    out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    out.extend_from_slice(&(body_len as u64).to_le_bytes());
    out.extend_from_slice(header);
}

/// Writes one message; returns the bytes written. A message with a small body goes out in one
/// write; a large body is hashed and written [`PIECE`] bytes at a time, then the checksum.
async fn write_msg<W: AsyncWrite + Unpin>(w: &mut W, msg: &Outgoing) -> Result<u64, String> {
    let (kind, header, body) = parts(msg)?;
    if body.len() <= PIECE {
        let bytes = encode_parts(kind, &header, body);
        w.write_all(&bytes).await.map_err(|e| e.to_string())?;
        return Ok(bytes.len() as u64);
    }
    let mut head = Vec::with_capacity(PREFIX_LEN + header.len());
    push_prefix(&mut head, kind, &header, body.len());
    w.write_all(&head).await.map_err(|e| e.to_string())?;
    let mut h = Checksum::default();
    h.write(&header);
    if kind == KIND_STATE {
        // Covered by the digest in its header: written in large chunks, not hashed here.
        for piece in body.chunks(STATE_CHUNK) {
            w.write_all(piece).await.map_err(|e| e.to_string())?;
        }
    } else {
        for piece in body.chunks(PIECE) {
            h.write(piece);
            w.write_all(piece).await.map_err(|e| e.to_string())?;
        }
    }
    w.write_all(&h.finish().to_le_bytes()).await.map_err(|e| e.to_string())?;
    Ok((head.len() + body.len() + CHECKSUM_LEN) as u64)
}

/// Writes a connection's queue. A message not written within `limit` (a peer that stopped
/// reading, whose window stays shut) fails the connection: its queue is dropped with it, so a
/// peer that does not read holds no more than what was sent to it meanwhile, and the next send
/// dials again.
async fn write_loop(
    to: NodeId,
    mut s: WireOut,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    failed: Arc<AtomicBool>,
    stats: Arc<TcpStats>,
    limit: Duration,
) {
    while let Some(msg) = rx.recv().await {
        // A secured connection seals its last record of the message on the flush.
        let write = async {
            let n = write_msg(&mut s, &msg).await?;
            s.flush().await.map(|()| n).map_err(|e| e.to_string())
        };
        let written = match tokio::time::timeout(limit, write).await {
            Ok(r) => r,
            Err(_) => Err(format!("a message not taken by the peer within {limit:?}")),
        };
        match written {
            Ok(n) => stats.sent(to, n),
            Err(e) => {
                tracing::debug!(peer = %to, "connection lost: {e}");
                failed.store(true, Ordering::Relaxed);
                return;
            }
        }
    }
    let _ = s.shutdown().await;
}

mod admission;
pub mod cost;
mod secure;

#[cfg(feature = "fuzzing")]
pub mod fuzz;

#[cfg(test)]
mod tests;
