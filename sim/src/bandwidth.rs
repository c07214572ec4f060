//! Bandwidth, which turmoil lacks: a deterministic fluid model of every transfer in flight.
//!
//! Every frame body is a *flow* from a sender to a receiver. A flow crosses three shared
//! resources, each with a capacity in bytes per second:
//!
//! - the sender's egress NIC (`nic` of the node; unlimited when absent),
//! - the directed node pair (`bandwidth x streams` of the link between their regions; unlimited
//!   when `streams` is absent),
//! - the receiver's ingress NIC,
//!
//! and is itself capped at the rate of one connection (the link's `bandwidth`). Rates are the
//! max-min fair allocation (progressive filling): all unfrozen flows grow at the same pace until a
//! resource saturates or a flow reaches its cap, then the flows on it freeze, and so on. Rates are
//! recomputed whenever a flow starts or ends or a capacity changes, and the model is advanced
//! lazily to the time of each call, processing completions in time order on the way.
//!
//! With [`TcpParams`] set, a flow on a new connection, or on one idle past its retransmission
//! timeout (cubic), gets no share until slow start's extra round trips have passed
//! ([`slow_start_extra`]); docs/fidelity.md gives the sources and the measured effect.
//!
//! The model owns no clock and no task: callers pass the simulated time. Calls with a time
//! earlier than the model's (two turmoil hosts run one after the other through the same tick)
//! are taken at the model's time, so the model never goes backwards; the error is at most one
//! tick. Waiters learn about a completion that moved earlier through [`BandwidthModel::eta_changed`].
//!
//! Size: one algorithm (flows, the three resources they cross, progressive filling, TCP's
//! window growth and losses, the timers that wake senders) whose invariants span all of it.

use loco_core::{NodeId, Time};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// Identifies one flow of a [`BandwidthModel`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FlowId(u64);

/// Where a flow stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlowStatus {
    /// The last byte left at this time.
    Done(Time),
    /// Still sending; at the current rates it will be done at `eta` (`Time::MAX` when its rate
    /// is zero).
    Pending {
        /// Predicted completion.
        eta: Time,
    },
    /// The flow was cancelled (its sender or receiver crashed) or is unknown.
    Cancelled,
}

pub use loco_core::scenario::links::PairCaps;

#[derive(Clone, Copy, Debug)]
enum ResKey {
    Egress(NodeId),
    Ingress(NodeId),
    Pair(NodeId, NodeId),
}

/// A queue of flows sent one after the other (one connection's frames): the next starts the
/// instant the previous one ends, whatever the sender's timer resolution.
pub type LaneKey = (NodeId, NodeId, u64);

struct Flow {
    from: NodeId,
    to: NodeId,
    /// TCP slow start after idle: the flow gets no rate before this time.
    hold: Time,
    /// Its sender's CPU work on it is done at this time (the codec's): no rate before it.
    ready: Time,
    /// Waiting behind another flow of its lane (no rate yet).
    queued: bool,
    /// It is not delivered before this time, whenever its bytes are through: a burst lost
    /// its tail, which a retransmission repairs then ([`Burst`]).
    deliver_after: Time,
    lane: Option<LaneKey>,
    res: [usize; 3],
    remaining: f64,
    rate: f64,
    eta: Time,
    /// Bumped when the predicted completion moves earlier (or the flow ends).
    generation: u64,
    waker: Option<Waker>,
}

/// A flow whose bytes are through, waiting to be delivered.
struct Delivering {
    at: Time,
    /// Its connection (whose sender and receiver are its first two fields).
    conn: LaneKey,
    waker: Option<Waker>,
}

/// The fluid model. See the module documentation.
#[derive(Default)]
pub struct BandwidthModel {
    now: Time,
    /// Capacity of each resource, bytes per second (`INFINITY` for none).
    capacity: Vec<f64>,
    /// Resource index by key.
    index: BTreeMap<(u8, NodeId, NodeId), usize>,
    nic: BTreeMap<NodeId, Option<f64>>,
    pairs: BTreeMap<(NodeId, NodeId), PairCaps>,
    flows: BTreeMap<FlowId, Flow>,
    finished: BTreeMap<FlowId, Time>,
    /// Flows whose bytes are through but which wait for a repair (their `deliver_after`, or
    /// an earlier flow's of their connection: TCP delivers in order), by id; and by time.
    delivering: BTreeMap<FlowId, Delivering>,
    deliveries: BTreeSet<(Time, FlowId)>,
    /// Per connection, the latest time a flow of it waits for (while one waits).
    conn_floor: BTreeMap<LaneKey, Time>,
    /// Per lane, the flows waiting behind its active one, in order.
    lanes: BTreeMap<LaneKey, std::collections::VecDeque<FlowId>>,
    next_id: u64,
    /// Every rate must be recomputed (a capacity changed).
    dirty_all: bool,
    /// Flows whose share may have changed (started, their turn or their hold came), and
    /// resources a flow left: the rates of their connected flows are recomputed.
    seed_flows: Vec<FlowId>,
    seed_res: Vec<usize>,
    /// The flows on each resource (queued and held ones too).
    users: Vec<Vec<FlowId>>,
    /// Every flow's predicted completion (or hold's end), but `Time::MAX`: the next change
    /// without a scan.
    etas: BTreeSet<(Time, FlowId)>,
    /// Per resource, the [`component`](Self::component) search that last reached it.
    res_mark: Vec<u64>,
    searches: u64,
    /// Scratch for the progressive filling.
    residual: Vec<f64>,
    count: Vec<u32>,
    recomputes: u64,
    bytes_done: f64,
    /// TCP's slow start, when modelled.
    tcp: Option<TcpParams>,
    /// Per directed pair: the round trip, and the bottleneck's queue in seconds of its rate.
    rtt: BTreeMap<(NodeId, NodeId), (f64, f64)>,
    /// Congestion state per connection.
    conns: BTreeMap<LaneKey, Conn>,
}

/// What the model takes of TCP's congestion control: the window a connection starts with, and
/// restarts from after an idle time longer than its retransmission timeout (Linux's
/// `tcp_slow_start_after_idle`, on by default; RFC 5681 section 4.1), and that timeout's floor.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TcpParams {
    /// Initial (and restart) window, bytes: 10 segments (RFC 6928).
    pub initial_window: f64,
    /// The retransmission timeout's floor, seconds (Linux: 200 ms); the timeout is a round trip
    /// more.
    pub rto_min: f64,
    /// Whether an idle connection starts over (loss-based congestion control such as cubic;
    /// BBR resumes at its measured rate).
    pub restart_after_idle: bool,
    /// A paced congestion control's start-up gain (BBR: `2 / ln 2`), when the connection paces
    /// its bursts at that multiple of the rate it measured until it leaves start-up
    /// ([`Burst`]); `None` for cubic, which the window alone describes here.
    pub startup_gain: Option<f64>,
}

/// BBR's start-up pacing and window gain, `2 / ln 2` (Linux's `bbr_high_gain`, 2.885).
pub const BBR_STARTUP_GAIN: f64 = 2.0 / std::f64::consts::LN_2;

impl TcpParams {
    /// Linux's defaults for segments of `mss` bytes: cubic when an idle connection restarts,
    /// else BBR.
    pub fn linux(mss: f64, restart_after_idle: bool) -> TcpParams {
        TcpParams {
            initial_window: 10.0 * mss,
            rto_min: 0.2,
            restart_after_idle,
            startup_gain: (!restart_after_idle).then_some(BBR_STARTUP_GAIN),
        }
    }
}

/// A paced connection's bursts while it is in start-up, against the bottleneck's queue.
///
/// BBR leaves start-up after three round trips whose deliveries were not limited by the sender
/// and did not raise its bandwidth estimate by a quarter (Linux's `bbr_check_full_bw_reached`
/// skips application-limited samples and keeps its count across them). A ring's connection
/// gets its bytes a frame at a time and sends each at 2.885 times the rate it measured, so it
/// has nothing left to send most of the time and may stay in start-up for good. Each frame
/// goes out as a burst: the bottleneck's queue (one round trip of the link's rate, as the
/// emulated links and many routers have) grows by `(g - 1) / g` of what the burst sends, and
/// drains at the link's rate. A burst that would fill it loses its tail, which is repaired a
/// round trip later: the frame (and every later one, TCP delivering in order) arrives no
/// sooner than when the retransmission of its last lost byte has passed the bottleneck, one
/// queue and one round trip after the burst was sent. The link stays busy meanwhile (with the
/// burst's later bytes and the next frames), so what the loss costs is the wait for the hole,
/// not the link's time.
///
/// In the recovery the sender is held to what the acknowledgements clock out, the link's rate:
/// a frame that takes the link more than a round trip keeps it sending, not limited by the
/// application, for as many round trips as it fills; three such rounds end start-up, and in
/// BBR's steady state its window of twice the pipe fits the pipe and its queue, so no loss is
/// modelled after that. Measured on `scenarios/fidelity/`: a 500 kB frame over a 50 Mbit/s,
/// 42 ms link (1.9 pipes) leaves start-up after its first losses, a 300 kB frame over
/// 30 Mbit/s and 140 ms (0.6 pipes) never does and loses every all-reduce (`ss -tin`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Burst {
    /// Bytes written and not yet sent.
    unsent: f64,
    /// Bytes in the bottleneck's queue.
    queued: f64,
    /// When the state was last brought forward, in nanoseconds.
    at: u64,
    /// A loss was charged since the queue was last empty (one recovery repairs every hole of
    /// the episode).
    charged: bool,
    /// Round trips its recoveries spent not limited by the sender.
    rounds: u32,
    /// It left start-up (three such round trips).
    left: bool,
}

impl Burst {
    /// Brings the state forward to `t` (nanoseconds): unsent bytes go out at `gain x rate`
    /// into the queue, which drains at `rate` and holds at most `queue` bytes.
    fn advance(&mut self, t: u64, gain: f64, rate: f64, queue: f64) {
        if t <= self.at {
            return;
        }
        let dt = (t - self.at) as f64 * 1e-9;
        let sending = (self.unsent / (gain * rate)).min(dt);
        self.unsent -= sending * gain * rate;
        self.queued = (self.queued + sending * (gain - 1.0) * rate).min(queue);
        if self.unsent <= EPS_BYTES {
            self.unsent = 0.0;
        }
        self.queued = (self.queued - (dt - sending) * rate).max(0.0);
        if self.queued <= EPS_BYTES && self.unsent == 0.0 {
            self.queued = 0.0;
            self.charged = false;
        }
        self.at = t;
    }

    /// `bytes` are written at `t` (nanoseconds, not before the last write): when their burst
    /// loses its tail, the time (nanoseconds) before which they cannot all have arrived in
    /// order.
    fn write(&mut self, t: u64, bytes: f64, gain: f64, path: Path) -> Option<u64> {
        let Path { rate, rtt, queue, .. } = path;
        if !(rate.is_finite() && rate > 0.0 && gain > 1.0) {
            return None;
        }
        let queue = rate * queue.max(MIN_QUEUE_SECS);
        let t = t.max(self.at);
        self.advance(t, gain, rate, queue);
        self.unsent += bytes;
        if self.left || self.charged {
            return None;
        }
        // The queue when the last unsent byte has gone out, were it unbounded.
        let peak = self.queued + self.unsent * (gain - 1.0) / gain;
        if peak <= queue {
            return None;
        }
        self.charged = true;
        // Whole round trips of this frame at the link's rate, in the recovery.
        let rounds = (bytes / (rate * rtt)).floor();
        self.rounds = self.rounds.saturating_add(rounds.min(3.0) as u32);
        if self.rounds >= 3 {
            // It leaves start-up once this episode is repaired.
            self.left = true;
        }
        let sent = self.unsent / (gain * rate);
        Some(t.saturating_add(((sent + queue / rate + rtt) * 1e9).ceil() as u64))
    }
}

/// The least a bottleneck's queue holds, in seconds of its rate (the emulation's floor).
const MIN_QUEUE_SECS: f64 = 0.005;

/// What a connection meets: one connection's rate, the round trip, and for its bursts the
/// bottleneck's rate and queue (seconds of its rate: the emulation's is the round trip without
/// jitter).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Path {
    /// One connection's rate on the pair, bytes per second (slow start's pipe).
    pub per_stream: f64,
    /// The bottleneck's rate: `per_stream` capped by the two NICs, bytes per second.
    pub rate: f64,
    /// Seconds.
    pub rtt: f64,
    /// Seconds of `rate`.
    pub queue: f64,
}

/// One connection's congestion window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Conn {
    window: f64,
    /// When its last flow ended (`None` while one is under way).
    idle_since: Option<Time>,
    /// Whether its slow start has met a loss (and so has a threshold to stop at).
    threshold: bool,
    /// Its bursts, for a paced congestion control in start-up.
    burst: Burst,
}

impl Conn {
    /// A new connection.
    fn new(tcp: &TcpParams) -> Conn {
        Conn {
            window: tcp.initial_window,
            idle_since: None,
            threshold: false,
            burst: Burst::default(),
        }
    }

    /// `bytes` are written to this connection at `t`, over `path`: the time before which they
    /// cannot have all arrived, in order, when their burst overflows the bottleneck's queue
    /// ([`Burst`]); `None` when it does not, or the congestion control paces no start-up. A new
    /// connection's bursts count from when its window has grown to the pipe (its measured rate
    /// is the link's).
    pub(crate) fn write(
        &mut self,
        tcp: &TcpParams,
        t: Time,
        path: Path,
        bytes: f64,
    ) -> Option<Time> {
        let gain = tcp.startup_gain?;
        let grown = self.window >= path.rate * path.rtt;
        let floor = self.burst.write(t.as_nanos(), bytes, gain, path);
        floor.filter(|_| grown).map(Time::from_nanos)
    }

    /// Its last flow ended at `t`.
    pub(crate) fn idle_from(&mut self, t: Time) {
        self.idle_since = Some(t);
    }

    /// The time TCP's start-up adds to a flow of `bytes` that begins on this connection at
    /// `now`, over a round trip of `rtt` seconds at `per_stream` bytes per second, in seconds;
    /// the window grows (or restarts, after an idle time, for a loss-based congestion control)
    /// as it does.
    pub(crate) fn extra(
        &mut self,
        tcp: &TcpParams,
        now: Time,
        rtt: f64,
        per_stream: f64,
        bytes: f64,
    ) -> f64 {
        if let Some(t) = self.idle_since.filter(|_| tcp.restart_after_idle) {
            // In nanoseconds: this runs for every frame of a modelled ring.
            let idle = now.as_nanos().saturating_sub(t.as_nanos()) as f64;
            self.window =
                restarted_window(self.window, tcp.initial_window, idle, (rtt + tcp.rto_min) * 1e9);
        }
        self.idle_since = None;
        let bdp = per_stream * rtt;
        let (mut extra, window) = slow_start_extra(bytes, self.window, per_stream, rtt);
        let outgrows = self.window + bytes > bdp;
        self.window = window;
        // A loss-based connection's first slow start has no threshold yet: it outgrows the pipe
        // and the bottleneck's buffer, loses the tail of a window, and waits out a
        // retransmission timeout (RFC 6298; Linux's floor 200 ms, plus the round trip) before
        // it goes on (once the window would outgrow the pipe, whichever flow that is). Later
        // restarts stop at the threshold that loss set.
        if !self.threshold && outgrows && tcp.restart_after_idle {
            extra += tcp.rto_min + rtt;
            self.threshold = true;
        }
        extra
    }
}

/// The window of a connection idle for `idle` after its last send, with a retransmission
/// timeout of `rto` (both in the same unit), as Linux restarts it (`tcp_cwnd_restart`, with
/// `tcp_slow_start_after_idle`): nothing within one timeout; past it, halved once for every
/// timeout of the idle time after the first, down to the initial window (or the window, when
/// smaller). An idle time of seconds (an outer step's compute) brings any window back to the
/// initial one; the gaps of a ring between two chunks cost a halving or two.
pub(crate) fn restarted_window(window: f64, initial: f64, idle: f64, rto: f64) -> f64 {
    if idle.is_nan() || idle <= rto || rto <= 0.0 {
        return window;
    }
    let floor = initial.min(window);
    let halvings = ((idle / rto).ceil() - 1.0).clamp(1.0, 64.0);
    (window / 2f64.powf(halvings)).max(floor)
}

/// TCP's start-up on a modelled ring's lanes: the congestion control, and per lane its path
/// (`None`: a pair without a rate or round trip, no start-up) and its connection.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct LaneTcp {
    /// The congestion control.
    pub tcp: TcpParams,
    /// Per lane: what its connection meets.
    pub paths: Vec<Option<Path>>,
    /// Per lane: its connection's state.
    pub conns: Vec<Conn>,
}

/// The extra time slow start adds to sending `bytes` at `rate` over a round trip `rtt` from a
/// window of `w0` bytes (doubling each round trip until it covers the bandwidth-delay product),
/// against sending them at `rate` from the start; and the window after.
pub fn slow_start_extra(bytes: f64, w0: f64, rate: f64, rtt: f64) -> (f64, f64) {
    let bdp = rate * rtt;
    let (mut sent, mut w, mut t) = (0.0, w0.max(1.0), 0.0);
    while sent < bytes {
        if w >= bdp {
            t += (bytes - sent) / rate;
            break;
        }
        let chunk = w.min(bytes - sent);
        // A whole window takes a round trip; the last, partial one its share of it.
        t += rtt * chunk / w;
        sent += chunk;
        w *= 2.0;
    }
    let window = (w0 + bytes).min(bdp.max(w0));
    ((t - bytes / rate).max(0.0), window)
}

/// Bytes below which a flow counts as finished (floating-point residue).
const EPS_BYTES: f64 = 1e-3;

impl BandwidthModel {
    /// An empty model at time zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// The model's time (the latest time it was advanced to).
    pub fn now(&self) -> Time {
        self.now
    }

    /// Flows in flight.
    pub fn active_flows(&self) -> usize {
        self.flows.len()
    }

    /// How many times rates were recomputed (a cost counter).
    pub fn recomputes(&self) -> u64 {
        self.recomputes
    }

    /// Sets a node's NIC cap per direction, in bytes per second (`None`: unlimited).
    pub fn set_nic(&mut self, now: Time, node: NodeId, bytes_per_sec: Option<f64>) {
        self.advance(now);
        self.nic.insert(node, bytes_per_sec);
        let cap = bytes_per_sec.unwrap_or(f64::INFINITY);
        let e = self.resource(ResKey::Egress(node));
        let i = self.resource(ResKey::Ingress(node));
        self.capacity[e] = cap;
        self.capacity[i] = cap;
        self.dirty_all = true;
        self.refresh();
    }

    /// Sets the connections from `from` to `to`.
    pub fn set_pair(&mut self, now: Time, from: NodeId, to: NodeId, caps: PairCaps) {
        self.advance(now);
        self.pairs.insert((from, to), caps);
        let p = self.resource(ResKey::Pair(from, to));
        self.capacity[p] = caps.total();
        self.dirty_all = true;
        self.refresh();
    }

    /// Sets many pairs at once (one recomputation of the rates).
    pub fn set_pairs(
        &mut self,
        now: Time,
        pairs: impl IntoIterator<Item = (NodeId, NodeId, PairCaps)>,
    ) {
        self.advance(now);
        for (from, to, caps) in pairs {
            self.pairs.insert((from, to), caps);
            let p = self.resource(ResKey::Pair(from, to));
            self.capacity[p] = caps.total();
        }
        self.dirty_all = true;
        self.refresh();
    }

    /// The connections from `from` to `to`, if set.
    pub fn pair(&self, from: NodeId, to: NodeId) -> Option<PairCaps> {
        self.pairs.get(&(from, to)).copied()
    }

    /// Models TCP's slow start after idle with `tcp` (`None`: flows run at their share from
    /// their first byte).
    pub fn set_tcp(&mut self, tcp: Option<TcpParams>) {
        self.tcp = tcp;
    }

    /// Sets the round trip between `a` and `b` (both directions).
    pub fn set_rtt(&mut self, a: NodeId, b: NodeId, rtt: Duration) {
        self.set_path(a, b, rtt, rtt);
    }

    /// Sets the round trip between `a` and `b` (both directions), and the bottleneck's queue
    /// on their path in seconds of its rate.
    pub fn set_path(&mut self, a: NodeId, b: NodeId, rtt: Duration, queue: Duration) {
        for pair in [(a, b), (b, a)] {
            self.rtt.insert(pair, (rtt.as_secs_f64(), queue.as_secs_f64()));
        }
    }

    /// What a connection from `from` to `to` meets, for its bursts.
    fn path(&self, from: NodeId, to: NodeId) -> Option<Path> {
        let caps = self.pairs.get(&(from, to))?;
        let &(rtt, queue) = self.rtt.get(&(from, to))?;
        Some(Path {
            per_stream: caps.per_stream,
            rate: self.bottleneck(from, to, *caps),
            rtt,
            queue,
        })
    }

    /// When a flow of `bytes` from `from` to `to` that starts being served at `now` on
    /// connection `conn` gets its first share: `now`, or later by slow start's extra time when
    /// the connection is new or was idle longer than its retransmission timeout.
    fn hold_for(&mut self, conn: LaneKey, from: NodeId, to: NodeId, bytes: f64) -> Time {
        let now = self.now;
        let (Some(tcp), Some(p)) = (self.tcp, self.path(from, to)) else {
            return now;
        };
        let c = self.conns.entry(conn).or_insert_with(|| Conn::new(&tcp));
        now + Duration::from_secs_f64(c.extra(&tcp, now, p.rtt, p.per_stream, bytes))
    }

    /// [`hold_for`](Self::hold_for) for a flow whose bytes are ready at `ready`: TCP's hold
    /// counts from then (slow start begins when there is something to send).
    fn hold_after(
        &mut self,
        ready: Time,
        conn: LaneKey,
        from: NodeId,
        to: NodeId,
        bytes: f64,
    ) -> Time {
        let now = self.now;
        let extra = self.hold_for(conn, from, to, bytes).saturating_since(now);
        ready.max(now) + extra
    }

    /// The bytes of a flow are written to connection `conn` (from `conn.0` to `conn.1`) at
    /// `ready`: the time before which they cannot be delivered, when their burst overflows the
    /// bottleneck's queue ([`Conn::write`]), else `Time::ZERO`.
    fn write_burst(&mut self, ready: Time, conn: LaneKey, bytes: f64) -> Time {
        let (from, to, _) = conn;
        let (Some(tcp), Some(path)) = (self.tcp, self.path(from, to)) else {
            return Time::ZERO;
        };
        if tcp.startup_gain.is_none() {
            return Time::ZERO;
        }
        let c = self.conns.entry(conn).or_insert_with(|| Conn::new(&tcp));
        let at = ready.max(self.now);
        let floor = c.write(&tcp, at, path, bytes);
        if let Some(f) = floor {
            tracing::trace!(?at, %from, %to, repaired = ?f, "a burst overflows the queue");
        }
        floor.unwrap_or(Time::ZERO)
    }

    /// The rate one connection from `from` to `to` meets: the pair's per connection, capped by
    /// the two NICs.
    fn bottleneck(&self, from: NodeId, to: NodeId, caps: PairCaps) -> f64 {
        let nic = |n: NodeId| self.nic.get(&n).copied().flatten().unwrap_or(f64::INFINITY);
        caps.per_stream.min(nic(from)).min(nic(to))
    }

    /// The connection a flow's lane travels on: its own for a collective shard or the mesh's
    /// bulk frames; one for every piece of a state transfer (lanes of `1 << 63` and above, as
    /// the real backend sends them on one connection), and one for flows without a lane.
    fn conn_of(from: NodeId, to: NodeId, lane: Option<LaneKey>) -> LaneKey {
        match lane {
            Some((a, b, k)) if k < (1 << 63) => (a, b, k),
            Some((a, b, _)) => (a, b, 1 << 63),
            None => (from, to, u64::MAX),
        }
    }

    /// Marks the connection of a flow that ended at `t` idle from then.
    fn conn_idle(&mut self, from: NodeId, to: NodeId, lane: Option<LaneKey>, t: Time) {
        // Another flow on the connection keeps it busy (state pieces share one).
        let conn = Self::conn_of(from, to, lane);
        let busy =
            self.flows.values().any(|f| !f.queued && Self::conn_of(f.from, f.to, f.lane) == conn);
        if let (false, Some(c)) = (busy, self.conns.get_mut(&conn)) {
            c.idle_since = Some(t);
        }
    }

    /// Starts a flow of `bytes` from `from` to `to` at `now`. A pair never set gets an unlimited
    /// rate (the flow completes at once).
    pub fn start(&mut self, now: Time, from: NodeId, to: NodeId, bytes: u64) -> FlowId {
        self.start_in(now, None, from, to, bytes, Time::ZERO)
    }

    /// Queues a flow on `lane` (whose sender and receiver are `lane.0` and `lane.1`): it starts
    /// at `now` if the lane is idle, else the instant the lane's previous flow ends.
    pub fn start_in_lane(&mut self, now: Time, lane: LaneKey, bytes: u64) -> FlowId {
        self.start_in(now, Some(lane), lane.0, lane.1, bytes, Time::ZERO)
    }

    /// [`start_in_lane`](Self::start_in_lane) for a flow whose sender is still making its bytes
    /// until `ready` (the codec's work): it gets no rate before then, whenever its turn in the
    /// lane comes. A pair never set still completes at once.
    pub fn start_in_lane_ready(
        &mut self,
        now: Time,
        lane: LaneKey,
        bytes: u64,
        ready: Time,
    ) -> FlowId {
        self.start_in(now, Some(lane), lane.0, lane.1, bytes, ready)
    }

    fn start_in(
        &mut self,
        now: Time,
        lane: Option<LaneKey>,
        from: NodeId,
        to: NodeId,
        bytes: u64,
        ready: Time,
    ) -> FlowId {
        self.advance(now);
        let id = FlowId(self.next_id);
        self.next_id += 1;
        let busy = lane.is_some_and(|l| self.lanes.contains_key(&l));
        if !busy && (bytes == 0 || !self.pairs.contains_key(&(from, to))) {
            self.finished.insert(id, self.now);
            return id;
        }
        let res = [
            self.resource(ResKey::Egress(from)),
            self.resource(ResKey::Pair(from, to)),
            self.resource(ResKey::Ingress(to)),
        ];
        if let Some(l) = lane {
            // A lane with an entry has an active (or queued) flow; an idle lane has none.
            self.lanes.entry(l).or_default().push_back(id);
        }
        for &r in &res {
            self.users[r].push(id);
        }
        let conn = Self::conn_of(from, to, lane);
        let deliver_after = self.write_burst(ready, conn, bytes as f64);
        let hold =
            if busy { Time::ZERO } else { self.hold_after(ready, conn, from, to, bytes as f64) };
        self.flows.insert(
            id,
            Flow {
                from,
                to,
                hold,
                ready,
                queued: busy,
                deliver_after,
                lane,
                res,
                remaining: bytes as f64,
                rate: 0.0,
                eta: Time::MAX,
                generation: 0,
                waker: None,
            },
        );
        if !busy {
            self.seed_flows.push(id);
            self.refresh();
        }
        id
    }

    /// The max-min fair rates, bytes per second, that flows from `from` to `to` for each pair
    /// of `flows` would get were they alone on the network (no slow start): what the event
    /// executor's modelled all-reduce runs its ring at. A pair never set is unlimited
    /// (`INFINITY`), as its flows complete at once.
    pub fn fair_rates(&self, flows: &[(NodeId, NodeId)]) -> Vec<f64> {
        let mut index: BTreeMap<(u8, NodeId, NodeId), usize> = BTreeMap::new();
        let mut capacity: Vec<f64> = Vec::new();
        let mut resource = |key: (u8, NodeId, NodeId), cap: f64| {
            *index.entry(key).or_insert_with(|| {
                capacity.push(cap);
                capacity.len() - 1
            })
        };
        let nic = |n: NodeId| self.nic.get(&n).copied().flatten().unwrap_or(f64::INFINITY);
        let mut set: Vec<Filling> = Vec::with_capacity(flows.len());
        for &(from, to) in flows {
            let res = [
                resource((0, from, from), nic(from)),
                resource(
                    (2, from, to),
                    self.pairs.get(&(from, to)).map_or(f64::INFINITY, PairCaps::total),
                ),
                resource((1, to, to), nic(to)),
            ];
            match self.pairs.get(&(from, to)) {
                Some(p) => set.push((res, p.per_stream, 0.0, false)),
                None => set.push((res, f64::INFINITY, f64::INFINITY, true)),
            }
        }
        let mut residual = capacity.clone();
        let mut count = vec![0u32; capacity.len()];
        progressive_fill(&mut set, &capacity, &mut residual, &mut count);
        set.iter().map(|s| s.2).collect()
    }

    /// TCP's state on `lanes` (a modelled ring's), for [`crate::ring_model`]; `None` when the
    /// model charges no start-up (`[sim] tcp = "none"`).
    pub(crate) fn lane_tcp(&self, lanes: &[LaneKey]) -> Option<LaneTcp> {
        let tcp = self.tcp?;
        let paths = lanes.iter().map(|&(a, b, _)| self.path(a, b)).collect();
        let conns = lanes
            .iter()
            .map(|&(a, b, k)| {
                self.conns
                    .get(&Self::conn_of(a, b, Some((a, b, k))))
                    .copied()
                    .unwrap_or_else(|| Conn::new(&tcp))
            })
            .collect();
        Some(LaneTcp { tcp, paths, conns })
    }

    /// Writes back the connections of `lanes` after a modelled ring ran on them.
    pub(crate) fn set_lane_conns(&mut self, lanes: &[LaneKey], conns: &[Conn]) {
        for (&(a, b, k), c) in lanes.iter().zip(conns) {
            self.conns.insert(Self::conn_of(a, b, Some((a, b, k))), *c);
        }
    }

    /// Forgets `id` in its lane and starts the next flow of the lane, if any.
    fn release_lane(&mut self, id: FlowId, lane: Option<LaneKey>) {
        let Some(l) = lane else { return };
        let Some(q) = self.lanes.get_mut(&l) else { return };
        q.retain(|x| *x != id);
        loop {
            let Some(&next) = q.front() else {
                self.lanes.remove(&l);
                return;
            };
            match self.flows.get_mut(&next) {
                Some(f) if f.queued => {
                    f.queued = false;
                    if f.remaining <= EPS_BYTES || !self.pairs.contains_key(&(f.from, f.to)) {
                        // Nothing to send: done at once.
                        if let Some(mut f) = self.flows.remove(&next) {
                            // As `forget` (the lane's queue is borrowed).
                            self.etas.remove(&(f.eta, next));
                            for &r in &f.res {
                                self.users[r].retain(|x| *x != next);
                                self.seed_res.push(r);
                            }
                            if let Some(w) = f.waker.take() {
                                w.wake();
                            }
                        }
                        self.finished.insert(next, self.now);
                        q.pop_front();
                        continue;
                    }
                    let (from, to, bytes, ready) = (f.from, f.to, f.remaining, f.ready);
                    let hold =
                        self.hold_after(ready, Self::conn_of(from, to, Some(l)), from, to, bytes);
                    if let Some(f) = self.flows.get_mut(&next) {
                        f.hold = hold;
                    }
                    self.seed_flows.push(next);
                    return;
                }
                Some(_) => return,
                None => {
                    q.pop_front();
                }
            }
        }
    }

    /// Where flow `id` stands at `now`. A finished flow is forgotten once reported `Done`.
    pub fn poll(&mut self, now: Time, id: FlowId) -> FlowStatus {
        self.advance(now);
        if let Some(t) = self.finished.remove(&id) {
            return FlowStatus::Done(t);
        }
        if let Some(d) = self.delivering.get(&id) {
            return FlowStatus::Pending { eta: d.at };
        }
        match self.flows.get(&id) {
            Some(f) => FlowStatus::Pending { eta: f.eta },
            None => FlowStatus::Cancelled,
        }
    }

    /// The current rate of flow `id`, bytes per second (0 when not in flight).
    pub fn rate(&self, id: FlowId) -> f64 {
        self.flows.get(&id).map_or(0.0, |f| f.rate)
    }

    /// Cancels flow `id` (its sender gave up). Unknown ids are ignored.
    pub fn cancel(&mut self, now: Time, id: FlowId) {
        self.advance(now);
        self.finished.remove(&id);
        if let Some(d) = self.delivering.remove(&id) {
            self.deliveries.remove(&(d.at, id));
        }
        if let Some(mut f) = self.flows.remove(&id) {
            self.forget(id, &f);
            if let Some(w) = f.waker.take() {
                w.wake();
            }
            let now = self.now;
            self.conn_idle(f.from, f.to, f.lane, now);
            self.release_lane(id, f.lane);
            self.refresh();
        }
    }

    /// Cancels every flow from or to `node` (it crashed).
    pub fn cancel_node(&mut self, now: Time, node: NodeId) {
        self.advance(now);
        let ids: Vec<FlowId> = self
            .flows
            .iter()
            .filter(|(_, f)| f.from == node || f.to == node)
            .map(|(i, _)| *i)
            .collect();
        for id in ids {
            if let Some(mut f) = self.flows.remove(&id) {
                self.forget(id, &f);
                if let Some(w) = f.waker.take() {
                    w.wake();
                }
            }
        }
        // Those through but waiting for a repair are cancelled with them.
        let (gone, kept): (BTreeMap<_, _>, BTreeMap<_, _>) = std::mem::take(&mut self.delivering)
            .into_iter()
            .partition(|(_, d)| d.conn.0 == node || d.conn.1 == node);
        self.delivering = kept;
        for (id, mut d) in gone {
            self.deliveries.remove(&(d.at, id));
            if let Some(w) = d.waker.take() {
                w.wake();
            }
        }
        self.lanes.retain(|l, _| l.0 != node && l.1 != node);
        self.conns.retain(|l, _| l.0 != node && l.1 != node);
        self.conn_floor.retain(|l, _| l.0 != node && l.1 != node);
        self.refresh();
    }

    /// A future that resolves when flow `id`'s predicted completion moves earlier than what
    /// the caller last saw, or the flow ends. Pair it with a timer at the last `eta`.
    pub fn eta_changed(model: &std::rc::Rc<std::cell::RefCell<Self>>, id: FlowId) -> EtaChanged {
        let generation = model.borrow().flows.get(&id).map(|f| f.generation);
        EtaChanged { model: model.clone(), id, generation }
    }

    /// The earliest of the next predicted completion and the next delivery of a repaired flow.
    fn next_event(&self) -> Time {
        let eta = self.etas.first().map_or(Time::MAX, |&(t, _)| t);
        let delivery = self.deliveries.first().map_or(Time::MAX, |&(t, _)| t);
        eta.min(delivery)
    }

    /// When the model next changes by itself: the earliest predicted completion, or the end of
    /// a flow's hold (`None` when no flow is under way). The event executor wakes then.
    pub fn next_change(&mut self) -> Option<Time> {
        self.refresh();
        Some(self.next_event()).filter(|&t| t != Time::MAX)
    }

    /// The flows finished and not yet reported, in id order, with the time each ended; they
    /// are forgotten (the event executor's way of [`poll`](Self::poll)ing every flow at once).
    pub fn take_finished(&mut self) -> Vec<(FlowId, Time)> {
        std::mem::take(&mut self.finished).into_iter().collect()
    }

    /// Advances the model to `now` (no-op when `now` is not later than the model's time).
    pub fn advance(&mut self, now: Time) {
        loop {
            self.refresh();
            let next = self.next_event();
            if next > now || next == Time::MAX {
                break;
            }
            self.step_to(next);
            while let Some(&(at, id)) = self.deliveries.first().filter(|&&(at, _)| at <= next) {
                self.deliveries.remove(&(at, id));
                if let Some(mut d) = self.delivering.remove(&id) {
                    if let Some(w) = d.waker.take() {
                        w.wake();
                    }
                    if self.conn_floor.get(&d.conn) == Some(&at) {
                        self.conn_floor.remove(&d.conn);
                    }
                }
                self.finished.insert(id, at);
            }
            // The flows due now: done, or (held by slow start, with no rate yet: their eta is
            // their hold's end) starting.
            let due: Vec<FlowId> =
                self.etas.range(..=(next, FlowId(u64::MAX))).map(|&(_, i)| i).collect();
            let mut done = Vec::new();
            for id in due {
                let Some(f) = self.flows.get(&id) else { continue };
                if f.queued {
                    continue;
                }
                if f.remaining <= EPS_BYTES || f.rate > 0.0 {
                    done.push(id);
                } else {
                    // Its hold ended: it takes a share now.
                    self.seed_flows.push(id);
                }
            }
            for id in done {
                if let Some(mut f) = self.flows.remove(&id) {
                    self.forget(id, &f);
                    self.bytes_done += f.remaining.max(0.0);
                    // TCP delivers in order: after its own repair and any earlier flow's on
                    // the connection.
                    let conn = Self::conn_of(f.from, f.to, f.lane);
                    let floor = self.conn_floor.get(&conn).copied().unwrap_or(Time::ZERO);
                    let at = f.deliver_after.max(floor);
                    if at > next {
                        self.conn_floor.insert(conn, at);
                        self.deliveries.insert((at, id));
                        let waker = f.waker.take();
                        self.delivering.insert(id, Delivering { at, conn, waker });
                    } else {
                        if let Some(w) = f.waker.take() {
                            w.wake();
                        }
                        self.finished.insert(id, next);
                    }
                    self.conn_idle(f.from, f.to, f.lane, next);
                    self.release_lane(id, f.lane);
                }
            }
        }
        if now > self.now {
            self.step_to(now);
        }
    }

    /// Moves every flow forward to `t` at its current rate (no event in between).
    fn step_to(&mut self, t: Time) {
        let dt = t.as_nanos().saturating_sub(self.now.as_nanos()) as f64 * 1e-9;
        if dt > 0.0 {
            for f in self.flows.values_mut() {
                let sent = (f.rate * dt).min(f.remaining);
                f.remaining -= sent;
                self.bytes_done += sent;
            }
        }
        self.now = self.now.max(t);
    }

    fn refresh(&mut self) {
        if self.dirty_all || !self.seed_flows.is_empty() || !self.seed_res.is_empty() {
            self.recompute();
        }
    }

    /// Takes flow `id` (removed) off its resources; the flows it shared them with get its
    /// share.
    fn forget(&mut self, id: FlowId, f: &Flow) {
        self.etas.remove(&(f.eta, id));
        for &r in &f.res {
            self.users[r].retain(|x| *x != id);
            self.seed_res.push(r);
        }
    }

    /// The flows whose rates may have changed: the seeds and every flow connected to them
    /// through a resource of finite capacity (max-min fairness couples nothing else), in id
    /// order.
    fn component(&mut self) -> Vec<FlowId> {
        let mut seen: BTreeSet<FlowId> = BTreeSet::new();
        self.searches += 1;
        let mark = self.searches;
        let mut stack: Vec<FlowId> = std::mem::take(&mut self.seed_flows);
        for r in std::mem::take(&mut self.seed_res) {
            if self.capacity[r].is_finite() && self.res_mark[r] != mark {
                self.res_mark[r] = mark;
                stack.extend(self.users[r].iter().copied());
            }
        }
        while let Some(id) = stack.pop() {
            let Some(f) = self.flows.get(&id) else { continue };
            if !seen.insert(id) {
                continue;
            }
            for &r in &f.res {
                if self.capacity[r].is_finite() && self.res_mark[r] != mark {
                    self.res_mark[r] = mark;
                    stack.extend(self.users[r].iter().copied());
                }
            }
        }
        seen.into_iter().collect()
    }

    fn resource(&mut self, key: ResKey) -> usize {
        let k = match key {
            ResKey::Egress(n) => (0u8, n, n),
            ResKey::Ingress(n) => (1u8, n, n),
            ResKey::Pair(a, b) => (2u8, a, b),
        };
        if let Some(&i) = self.index.get(&k) {
            return i;
        }
        let cap = match key {
            ResKey::Egress(n) | ResKey::Ingress(n) => {
                self.nic.get(&n).copied().flatten().unwrap_or(f64::INFINITY)
            }
            ResKey::Pair(a, b) => self.pairs.get(&(a, b)).map_or(f64::INFINITY, PairCaps::total),
        };
        let i = self.capacity.len();
        self.capacity.push(cap);
        self.residual.push(0.0);
        self.count.push(0);
        self.users.push(Vec::new());
        self.res_mark.push(0);
        self.index.insert(k, i);
        i
    }

    /// Max-min fair rates by progressive filling, then the new completion times: of every
    /// flow after a capacity changed, else of the flows connected to what changed
    /// ([`component`](Self::component)); the others keep their rates.
    fn recompute(&mut self) {
        self.recomputes += 1;
        let now = self.now;
        let ids: Vec<FlowId> = if self.dirty_all {
            self.seed_flows.clear();
            self.seed_res.clear();
            self.flows.keys().copied().collect()
        } else {
            self.component()
        };
        self.dirty_all = false;
        // Per flow of the set, in id order: its resources, its rate cap, its rate, and whether
        // it is frozen (queued behind another of its lane, or held by slow start: no share).
        let mut set: Vec<Filling> = Vec::with_capacity(ids.len());
        for id in &ids {
            let Some(f) = self.flows.get(id) else { continue };
            let cap = self.pairs.get(&(f.from, f.to)).map_or(f64::INFINITY, |p| p.per_stream);
            set.push((f.res, cap, 0.0, f.queued || f.hold > now));
            for &r in &f.res {
                self.residual[r] = self.capacity[r];
                self.count[r] = 0;
            }
        }
        progressive_fill(&mut set, &self.capacity, &mut self.residual, &mut self.count);
        for (id, (_, _, rate, _)) in ids.iter().zip(&set) {
            let Some(f) = self.flows.get_mut(id) else { continue };
            f.rate = *rate;
            let old = f.eta;
            f.eta = if f.hold > now && !f.queued {
                f.hold
            } else if f.rate > 0.0 {
                let ns = (f.remaining / f.rate * 1e9).ceil();
                if ns >= (u64::MAX / 2) as f64 {
                    Time::MAX
                } else {
                    Time::from_nanos(now.as_nanos().saturating_add(ns as u64))
                }
            } else {
                Time::MAX
            };
            if f.eta != old {
                self.etas.remove(&(old, *id));
                if f.eta != Time::MAX {
                    self.etas.insert((f.eta, *id));
                }
            }
            if f.eta < old {
                f.generation += 1;
                if let Some(w) = f.waker.take() {
                    w.wake();
                }
            }
        }
    }
}

/// A flow of a max-min computation: its three resources, its rate cap, its rate, and whether
/// it is frozen (it takes no more).
type Filling = ([usize; 3], f64, f64, bool);

/// Max-min fair rates by progressive filling: every unfrozen flow of `set` grows alike until it
/// reaches its cap or one of its resources saturates. `residual[r]` must hold `capacity[r]` and
/// `count[r]` 0 for every resource of the set.
fn progressive_fill(
    set: &mut [Filling],
    capacity: &[f64],
    residual: &mut [f64],
    count: &mut [u32],
) {
    for (res, _, _, frozen) in &*set {
        if !frozen {
            for &r in res {
                count[r] += 1;
            }
        }
    }
    let mut unfrozen = set.iter().filter(|s| !s.3).count();
    while unfrozen > 0 {
        let mut delta = f64::INFINITY;
        for (res, cap, rate, frozen) in &*set {
            if *frozen {
                continue;
            }
            delta = delta.min(cap - rate);
            for &r in res {
                if residual[r].is_finite() {
                    delta = delta.min(residual[r] / f64::from(count[r]));
                }
            }
        }
        if !delta.is_finite() {
            // No cap anywhere: cannot happen with a finite per-connection rate; treat as
            // instantaneous.
            delta = f64::MAX / 4.0;
        }
        let delta = delta.max(0.0);
        // Grow every unfrozen flow by delta and charge its resources.
        for (res, _, rate, frozen) in &mut *set {
            if *frozen {
                continue;
            }
            *rate += delta;
            for &r in res.iter() {
                residual[r] -= delta;
            }
        }
        // Freeze flows at their cap or on a saturated resource.
        let mut any = false;
        for (res, cap, rate, frozen) in &mut *set {
            if *frozen {
                continue;
            }
            let at_cap = *rate >= *cap * (1.0 - 1e-12);
            let saturated =
                res.iter().any(|&r| capacity[r].is_finite() && residual[r] <= capacity[r] * 1e-12);
            if at_cap || saturated {
                *frozen = true;
                any = true;
            }
        }
        // Recount the unfrozen flows per resource.
        for (res, ..) in &*set {
            for &r in res {
                count[r] = 0;
            }
        }
        unfrozen = 0;
        for (res, _, _, frozen) in &*set {
            if !frozen {
                unfrozen += 1;
                for &r in res {
                    count[r] += 1;
                }
            }
        }
        if !any {
            // Numerical corner: nothing froze although delta was the minimum; stop here.
            break;
        }
    }
}

/// Resolves when a flow's predicted completion moved earlier or the flow ended; see
/// [`BandwidthModel::eta_changed`].
pub struct EtaChanged {
    model: std::rc::Rc<std::cell::RefCell<BandwidthModel>>,
    id: FlowId,
    generation: Option<u64>,
}

impl Future for EtaChanged {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut m = self.model.borrow_mut();
        if let Some(d) = m.delivering.get_mut(&self.id) {
            // Through, waiting for its repair: woken when delivered.
            d.waker = Some(cx.waker().clone());
            return Poll::Pending;
        }
        match (m.flows.get_mut(&self.id), self.generation) {
            (Some(f), Some(g)) if f.generation == g => {
                f.waker = Some(cx.waker().clone());
                Poll::Pending
            }
            _ => Poll::Ready(()),
        }
    }
}

#[cfg(test)]
mod tests;
