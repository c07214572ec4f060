//! The `G` per-shard ring all-reduces of one attempt, and the one place collective frames are
//! sorted on arrival.
//!
//! A node with `G` local GPU shards runs `G` rings of [`RingAllReduce`] in parallel, one per
//! shard, all under the attempt's epoch and op ([`AllReduceStart::shards`]); shard `s` reduces
//! [`chunk_range`]`(len, G, s)` of the pseudo-gradient and every frame names its shard in
//! [`CollectiveHeader::shard`]. [`ShardRings`] owns them for one attempt.
//!
//! Every collective frame a node receives goes through [`classify`] first, against the member's
//! epoch and the collective running here (stale frames are rejected in one function, and
//! counted, so that no other path can let one through):
//!
//! - [`FrameClass::Current`]: it belongs to the running collective: feed it
//!   ([`ShardRings::handle_frame`]);
//! - [`FrameClass::Stale`]: an epoch this node has left: rejected and counted
//!   ([`RingCounters::stale`], summary.json's `stale_frames_rejected`);
//! - [`FrameClass::Early`]: a collective that has not started here (a neighbour's `Release`
//!   arrived first): held in [`EarlyFrames`], bounded, and fed when it starts;
//! - [`FrameClass::Drop`]: an older collective of the running epoch, finished or abandoned.
//!
//! [`Inbox`] ties the three together so that the executors do the same thing with a frame:
//!
//! ```text
//! match inbox.admit(member.epoch(), rings.as_ref().map(ShardRings::collective), from, frame) {
//!     Admission::Feed(frame) => rings.handle_frame(from, &frame)?,   // then drain poll_send
//!     _ => {}                                                         // held, counted
//! }
//! // on StartAllReduce(start):
//! let rings = ShardRings::new(start, me, codec, values, segment)?;
//! for (from, frame) in inbox.take_for(rings.collective()) { rings.handle_frame(from, &frame)? }
//! // on AbortAllReduce { epoch, op }: inbox.abort(epoch, op)
//! ```

use crate::allreduce::schedule::chunk_range;
use crate::allreduce::{
    DEFAULT_SEGMENT_ELEMS, Payload, RingAllReduce, RingConfig, RingError, RingStats,
};
use crate::codec::CodecKind;
use crate::ids::{Epoch, NodeId};
use crate::mesh::AllReduceStart;
use crate::node::fair::{FairHold, Full, Keep};
use crate::transport::{Body, CollectiveHeader, Frame, Header, Phase};
use std::fmt;

/// The values one attempt reduces.
pub enum Values {
    /// The whole pseudo-gradient; on success it holds the weighted average.
    Real(Vec<f32>),
    /// Only its length (virtual numerics: the same schedule moves lengths).
    Virtual(usize),
}

impl Values {
    /// Number of values.
    pub fn len(&self) -> usize {
        match self {
            Values::Real(v) => v.len(),
            Values::Virtual(n) => *n,
        }
    }

    /// True when there are no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl fmt::Debug for Values {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print a pseudo-gradient: its length is what matters in a message.
        match self {
            Values::Real(v) => write!(f, "Real({} values)", v.len()),
            Values::Virtual(n) => write!(f, "Virtual({n} values)"),
        }
    }
}

/// The pipelining unit of one shard's ring, in values.
///
/// `configured` (a scenario's or a worker's setting, at least 1) wins. Otherwise real values use
/// [`DEFAULT_SEGMENT_ELEMS`], and virtual ones a quarter of a chunk, at least
/// [`DEFAULT_SEGMENT_ELEMS`]: a few segments per chunk keep the pipelining without a flood of
/// frames (a 10B ring would otherwise send ~100 frames per chunk).
pub fn segment_elems(
    configured: Option<usize>,
    real: bool,
    shard_len: usize,
    world: usize,
) -> usize {
    match configured {
        Some(s) => s.max(1),
        None if real => DEFAULT_SEGMENT_ELEMS,
        None => (shard_len / world.max(1)).div_ceil(4).max(DEFAULT_SEGMENT_ELEMS),
    }
}

/// Why the rings of an attempt could not start. The values come back unchanged.
#[derive(thiserror::Error)]
#[error("cannot start the all-reduce: {source}")]
pub struct StartError {
    /// What was wrong with the ring.
    #[source]
    pub source: RingError,
    /// The values that were to be reduced, as given.
    pub values: Values,
}

impl fmt::Debug for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StartError")
            .field("source", &self.source)
            .field("values", &self.values)
            .finish()
    }
}

/// Why [`ShardRings::handle_frame`] refused a frame. Nothing changed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FeedError {
    /// Not a collective frame.
    #[error("not a collective frame")]
    NotCollective,
    /// A frame of another collective (sort frames with [`classify`] before feeding them).
    #[error("frame of {epoch} op {op} fed to the all-reduce of {current_epoch} op {current_op}")]
    OtherCollective {
        /// The frame's epoch.
        epoch: Epoch,
        /// The frame's op.
        op: u64,
        /// The running collective's epoch.
        current_epoch: Epoch,
        /// The running collective's op.
        current_op: u64,
    },
    /// The frame names a shard this node does not run.
    #[error("frame for shard {shard} of an all-reduce with {shards} shards")]
    ShardOutOfRange {
        /// The frame's shard.
        shard: u16,
        /// Shards of this all-reduce.
        shards: u16,
    },
    /// The shard's ring refused it (wrong sender, chunk, segment, length, or twice).
    #[error("shard {shard}: {source}")]
    Ring {
        /// The shard.
        shard: u16,
        /// The ring's reason.
        #[source]
        source: RingError,
    },
}

/// The `G` ring all-reduces of one attempt, one per local shard, under one epoch and op.
///
/// Created ready to go: drain [`poll_send`](Self::poll_send) after construction and after every
/// [`handle_frame`](Self::handle_frame) until it returns `None`.
pub struct ShardRings {
    start: AllReduceStart,
    rings: Vec<RingAllReduce<'static>>,
    real: bool,
    /// Where [`poll_send`](Self::poll_send) asks first, so that the shards progress together.
    next: usize,
    left: NodeId,
    right: NodeId,
    sums: Vec<f64>,
}

impl ShardRings {
    /// The rings of `start` at node `me`. Shard `s` of `max(start.shards, 1)` reduces
    /// [`chunk_range`]`(values.len(), G, s)`, in its own buffer (`G = 1`: the given `Vec`,
    /// without a copy), with the segment of [`segment_elems`]`(segment, ..)`.
    pub fn new(
        start: AllReduceStart,
        me: NodeId,
        codec: CodecKind,
        values: Values,
        segment: Option<usize>,
    ) -> Result<ShardRings, StartError> {
        // Check the ring before the values are split, so that they come back whole on error
        // (after these checks `RingAllReduce::new` cannot fail).
        let (left, right) = match neighbours_in(&start.ring, me) {
            Ok(n) => n,
            Err(source) => return Err(StartError { source, values }),
        };
        let g = usize::from(start.shards.max(1));
        let world = start.ring.len();
        let len = values.len();
        let real = matches!(values, Values::Real(_));
        let payloads: Vec<Payload<'static>> = match values {
            Values::Virtual(n) => {
                (0..g).map(|s| Payload::Virtual(chunk_range(n, g, s).len())).collect()
            }
            Values::Real(mut v) => {
                // Split from the end: shard 0 keeps the original allocation (and its capacity,
                // which `into_values` fills again without a reallocation).
                let mut tails = Vec::with_capacity(g);
                for s in (1..g).rev() {
                    tails.push(Payload::Owned(v.split_off(chunk_range(len, g, s).start)));
                }
                tails.push(Payload::Owned(v));
                tails.reverse();
                tails
            }
        };
        let mut rings = Vec::with_capacity(g);
        for (s, payload) in payloads.into_iter().enumerate() {
            let shard_len = chunk_range(len, g, s).len();
            let mut cfg = RingConfig::new(start.epoch, start.op, start.ring.clone(), me, codec);
            cfg.shard = s as u16; // s < G <= u16::MAX
            cfg.segment_elems = segment_elems(segment, real, shard_len, world);
            match RingAllReduce::new(cfg, payload, start.weight) {
                Ok(r) => rings.push(r),
                // Unreachable after the checks above; the values already split are not
                // reassembled for it.
                Err(source) => return Err(StartError { source, values: Values::Virtual(len) }),
            }
        }
        Ok(ShardRings { start, rings, real, next: 0, left, right, sums: Vec::new() })
    }

    /// The release this attempt runs.
    pub fn start(&self) -> &AllReduceStart {
        &self.start
    }

    /// The collective's `(epoch, op)`: what [`classify`] and [`EarlyFrames::take_for`] take.
    pub fn collective(&self) -> (Epoch, u64) {
        (self.start.epoch, self.start.op)
    }

    /// Number of shards (rings).
    pub fn shards(&self) -> usize {
        self.rings.len()
    }

    /// `(left, right)`: the ring neighbour frames come from, and the one they go to.
    pub fn neighbours(&self) -> (NodeId, NodeId) {
        (self.left, self.right)
    }

    /// True when every shard holds its result and has nothing left to send.
    pub fn is_done(&self) -> bool {
        self.rings.iter().all(RingAllReduce::is_done)
    }

    /// The next frame to send, over all shards in turn (one frame of each shard that has one,
    /// then again), so that the shards progress together. Drain until `None` after
    /// construction and after every [`handle_frame`](Self::handle_frame).
    pub fn poll_send(&mut self) -> Option<(NodeId, Frame)> {
        let g = self.rings.len();
        for k in 0..g {
            let s = (self.next + k) % g;
            if let Some((to, f)) = self.rings[s].poll_send() {
                self.next = (s + 1) % g;
                if let Header::Collective(h) = &f.header
                    && h.phase == Phase::AllGather
                    && h.step == 0
                {
                    self.sums.push(h.weight_sum);
                }
                return Some((to, f));
            }
        }
        None
    }

    /// Applies a received frame of this collective to its shard's ring. Refused frames change
    /// nothing; a [`FeedError::Ring`] means the sender does not follow the schedule (the
    /// attempt cannot finish with it: report it failed).
    pub fn handle_frame(&mut self, from: NodeId, frame: &Frame) -> Result<(), FeedError> {
        let Header::Collective(h) = &frame.header else {
            return Err(FeedError::NotCollective);
        };
        if (h.epoch, h.op) != self.collective() {
            return Err(FeedError::OtherCollective {
                epoch: h.epoch,
                op: h.op,
                current_epoch: self.start.epoch,
                current_op: self.start.op,
            });
        }
        let shards = self.rings.len() as u16;
        let ring = self
            .rings
            .get_mut(usize::from(h.shard))
            .ok_or(FeedError::ShardOutOfRange { shard: h.shard, shards })?;
        ring.handle_frame(from, frame)
            .map_err(|source| FeedError::Ring { shard: h.shard, source })?;
        if h.phase == Phase::AllGather {
            self.sums.push(h.weight_sum);
        }
        Ok(())
    }

    /// The weight sums carried by the all-gather frames seen: sent at step 0 (this node's own
    /// chunks) and received (accepted ones), and a gathering ring's total of the contributions'
    /// weights. Each must equal the release's total weight: the simulator's check that no
    /// contribution was counted twice or lost.
    pub fn weight_sums(&self) -> Vec<f64> {
        let mut sums = self.sums.clone();
        sums.extend(self.rings.iter().filter_map(RingAllReduce::gathered_weight));
        sums
    }

    /// What this node's codec sent of its contribution, for error feedback: `None` unless the
    /// codec gathers ([`CodecKind::sums_in_ring`] false), the values are real and the node's
    /// weight counted.
    pub fn own_sent(&self) -> Option<crate::diloco::SentContribution> {
        if !self.real || self.start.weight.get() <= 0.0 {
            return None;
        }
        let codec = self.rings.first()?.config().codec;
        if codec.sums_in_ring() {
            return None;
        }
        let (len, g) = (self.rings.iter().map(RingAllReduce::len).sum(), self.rings.len());
        let mut parts = Vec::new();
        for (s, r) in self.rings.iter().enumerate() {
            let at = chunk_range(len, g, s).start;
            for (range, b) in r.own_sent() {
                parts.push((range.start + at..range.end + at, b));
            }
        }
        Some(crate::diloco::SentContribution { codec, parts })
    }

    /// Whether the values are real (not lengths only).
    pub fn is_real(&self) -> bool {
        self.real
    }

    /// Each shard's values and pipelining unit: what an executor that models the collective's
    /// time needs of its schedule.
    pub fn plan(&self) -> Vec<(usize, usize)> {
        self.rings.iter().map(|r| (r.len(), r.config().segment_elems)).collect()
    }

    /// Finishes every shard of a virtual attempt at once ([`RingAllReduce::complete_virtual`]):
    /// the executor modelled its time. No frame carried a weight sum, so there are none to
    /// check. `false`, changing nothing, for real values or once frames have moved.
    pub fn complete_virtual(&mut self) -> bool {
        if self.real || self.rings.iter().any(|r| r.stats().frames_sent > 0) {
            return false;
        }
        self.rings.iter_mut().all(RingAllReduce::complete_virtual)
    }

    /// Counters summed over the shards.
    pub fn stats(&self) -> RingStats {
        let mut t = RingStats::default();
        for s in self.rings.iter().map(RingAllReduce::stats) {
            t.body_bytes_sent += s.body_bytes_sent;
            t.frames_sent += s.frames_sent;
            t.frames_received += s.frames_received;
            t.stale_rejected += s.stale_rejected;
        }
        t
    }

    /// Ends the attempt and returns the values, shards concatenated in order (`G = 1`: the
    /// given `Vec`; `G > 1`: shard 0's buffer, which kept the capacity of the whole, extended).
    /// After [`is_done`](Self::is_done) they are the weighted average. Before that (a failure or
    /// an abort) their content is unspecified, a mix of own values, partial sums and results:
    /// recompute the contribution for a retry. `None` for virtual values.
    pub fn into_values(self) -> Option<Vec<f32>> {
        if !self.real {
            return None;
        }
        let mut parts = self.rings.into_iter().filter_map(RingAllReduce::into_payload);
        let mut out = parts.next().unwrap_or_default();
        for p in parts {
            out.extend_from_slice(&p);
        }
        Some(out)
    }
}

/// `(left, right)` of `me` in `ring`, checking it the way [`RingAllReduce::new`] does.
fn neighbours_in(ring: &[NodeId], me: NodeId) -> Result<(NodeId, NodeId), RingError> {
    let pos = ring.iter().position(|n| *n == me).ok_or(RingError::NotAMember { me })?;
    let mut seen = ring.to_vec();
    seen.sort_unstable();
    if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
        return Err(RingError::DuplicateMember { node: w[0] });
    }
    let w = ring.len();
    Ok((ring[(pos + w - 1) % w], ring[(pos + 1) % w]))
}

/// What to do with an arriving collective frame. See [`classify`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameClass {
    /// Of an epoch this node has left: reject it and count it ([`RingCounters::stale`]).
    Stale,
    /// Of the collective running here: feed it.
    Current,
    /// Of a collective that has not started here (a newer epoch, or a later op of the running
    /// epoch): keep it ([`EarlyFrames`]) until it starts.
    Early,
    /// Of an older collective of the running epoch (finished or abandoned): drop it.
    Drop,
}

/// Sorts a collective frame with header `h`, at a member of epoch `member_epoch` (`None`: not
/// admitted yet) where the collective `running` (`(epoch, op)`) runs, if any. The one place
/// where stale frames are told apart.
///
/// The running collective's frames are [`Current`](FrameClass::Current) even when the
/// membership has moved on since it started. Otherwise a frame of an epoch older than both the
/// member's and the running one's is [`Stale`](FrameClass::Stale); of the running epoch but an
/// older op, [`Drop`](FrameClass::Drop); anything newer, [`Early`](FrameClass::Early) (ops order
/// by outer step, then attempt: [`op_id`](crate::mesh::op_id)).
pub fn classify(
    h: &CollectiveHeader,
    member_epoch: Option<Epoch>,
    running: Option<(Epoch, u64)>,
) -> FrameClass {
    if running == Some((h.epoch, h.op)) {
        return FrameClass::Current;
    }
    let floor = member_epoch.max(running.map(|(e, _)| e));
    if floor.is_some_and(|f| h.epoch < f) {
        return FrameClass::Stale;
    }
    match running {
        Some((e, op)) if h.epoch == e && h.op < op => FrameClass::Drop,
        _ => FrameClass::Early,
    }
}

/// Default bound on the number of [`EarlyFrames`] held.
pub const EARLY_MAX_FRAMES: usize = 1 << 16;
/// Default bound on the body bytes [`EarlyFrames`] hold (1 GiB).
pub const EARLY_MAX_BYTES: u64 = 1 << 30;

/// Why [`EarlyFrames::push`] refused a frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EarlyRefused {
    /// Not a collective frame.
    #[error("not a collective frame")]
    NotCollective,
    /// Holding it would pass a bound.
    #[error("early frames full: {frames} frames and {bytes} bytes held")]
    Full {
        /// Frames held.
        frames: usize,
        /// Body bytes held.
        bytes: u64,
    },
}

/// Frames of collectives that have not started here, in arrival order, bounded by a count and
/// by the bytes of their bodies (a virtual body holds none), shared fairly among their senders
/// ([`FairHold`]): a peer that floods the area cannot crowd out the ring neighbour whose frames
/// the next collective needs.
pub struct EarlyFrames {
    held: FairHold<((Epoch, u64), Frame)>,
    refused: u64,
    dropped: u64,
}

impl Default for EarlyFrames {
    /// Bounded by [`EARLY_MAX_FRAMES`] and [`EARLY_MAX_BYTES`].
    fn default() -> Self {
        EarlyFrames::new(EARLY_MAX_FRAMES, EARLY_MAX_BYTES)
    }
}

impl EarlyFrames {
    /// An empty holding area of at most `max_frames` frames and `max_bytes` body bytes.
    pub fn new(max_frames: usize, max_bytes: u64) -> Self {
        EarlyFrames { held: FairHold::new(max_frames, max_bytes), refused: 0, dropped: 0 }
    }

    /// Holds a collective frame, or refuses it (counted in [`refused`](Self::refused)) when it
    /// is not one or would pass a bound that no sender holding more than `from` can make room
    /// for. Frames it pushes out of the area are counted in [`dropped`](Self::dropped).
    pub fn push(&mut self, from: NodeId, frame: Frame) -> Result<(), EarlyRefused> {
        let Header::Collective(h) = &frame.header else {
            self.refused += 1;
            return Err(EarlyRefused::NotCollective);
        };
        let key = (h.epoch, h.op);
        let bytes = match &frame.body {
            Body::Bytes(b) => b.len() as u64,
            Body::Virtual(_) => 0,
        };
        match self.held.push(from, bytes, (key, frame)) {
            Ok(out) => {
                self.dropped += out.len() as u64;
                Ok(())
            }
            Err(Full { items, bytes }) => {
                self.refused += 1;
                Err(EarlyRefused::Full { frames: items, bytes })
            }
        }
    }

    /// The frames of the collective `(epoch, op)` that just started, in arrival order. Frames
    /// of older collectives can never be fed any more: they are dropped (counted in
    /// [`dropped`](Self::dropped)); newer ones stay.
    pub fn take_for(&mut self, (epoch, op): (Epoch, u64)) -> Vec<(NodeId, Frame)> {
        let (out, dropped) = self.held.filter(|_, (key, _)| match key.cmp(&(epoch, op)) {
            std::cmp::Ordering::Equal => Keep::Take,
            std::cmp::Ordering::Less => Keep::Drop,
            std::cmp::Ordering::Greater => Keep::Keep,
        });
        self.dropped += dropped;
        out.into_iter().map(|(from, (_, f))| (from, f)).collect()
    }

    /// Keeps only frames of epochs after `epoch` (the others are dropped and counted).
    pub fn retain_newer_than(&mut self, epoch: Epoch) {
        self.retain(|key| key.0 > epoch);
    }

    /// Keeps only frames of collectives after `(epoch, op)`, as on its abort: a retry in the
    /// same epoch (a later op) keeps its frames (the others are dropped and counted).
    pub fn retain_after(&mut self, epoch: Epoch, op: u64) {
        self.retain(|key| key > (epoch, op));
    }

    fn retain(&mut self, keep: impl Fn((Epoch, u64)) -> bool) {
        let (_, dropped) =
            self.held.filter(|_, (key, _)| if keep(*key) { Keep::Keep } else { Keep::Drop });
        self.dropped += dropped;
    }

    /// Frames held.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// True when none is held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Body bytes held.
    pub fn bytes(&self) -> u64 {
        self.held.bytes()
    }

    /// Body bytes held from `from`.
    pub fn bytes_of(&self, from: NodeId) -> u64 {
        self.held.bytes_of(from)
    }

    /// Frames refused so far.
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// Frames held and then dropped unused so far (their collective was overtaken or aborted,
    /// or a sender with a smaller share needed the room).
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

/// What a node's collective frames came to, for the metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingCounters {
    /// Frames of older epochs rejected (summary.json's `stale_frames_rejected`).
    pub stale: u64,
    /// Frames of an older collective of the running epoch, dropped.
    pub dropped: u64,
    /// Frames held for a collective that had not started.
    pub early_held: u64,
    /// Held frames dropped unused (their collective was overtaken or aborted).
    pub early_dropped: u64,
    /// Early frames refused over the bounds of [`EarlyFrames`].
    pub refused: u64,
    /// Frames of the running collective from a node other than the ring neighbour that sends to
    /// this one: dropped, the attempt unaffected.
    pub foreign: u64,
}

/// What [`Inbox::admit`] did with a frame.
#[derive(Debug, PartialEq)]
pub enum Admission {
    /// Of the running collective: feed it to [`ShardRings::handle_frame`].
    Feed(Frame),
    /// Held until its collective starts.
    Held,
    /// Early, but over the bounds: refused.
    Refused,
    /// Of an epoch left: rejected.
    Stale,
    /// Of no collective to come (or not a collective frame): dropped.
    Dropped,
}

/// A node's door for collective frames: [`classify`], the [`EarlyFrames`] and the
/// [`RingCounters`], so that every executor does the same with a frame.
#[derive(Default)]
pub struct Inbox {
    early: EarlyFrames,
    stale: u64,
    dropped: u64,
    held: u64,
    foreign: u64,
    /// The last collective started here ([`Inbox::take_for`]): early frames are held only
    /// within [`EARLY_EPOCHS_AHEAD`] epochs and [`EARLY_STEPS_AHEAD`] outer steps of it.
    last_started: Option<(Epoch, u64)>,
}

/// How many epochs past the member's (or the last collective's) an early frame may be and still
/// be held. Epochs advance one membership change at a time, and a node hears of each within a
/// message's latency, so an honest frame is at most a few ahead; one claiming a far epoch (up to
/// `u64::MAX`, which no collective here would ever overtake) would be held for good.
pub const EARLY_EPOCHS_AHEAD: u64 = 64;
/// How many outer steps past the last collective started here an early frame of the same epoch
/// may be and still be held (ring neighbours are never more than a step apart).
pub const EARLY_STEPS_AHEAD: u64 = 64;

impl Inbox {
    /// An inbox over `early`.
    pub fn new(early: EarlyFrames) -> Self {
        Inbox { early, stale: 0, dropped: 0, held: 0, foreign: 0, last_started: None }
    }

    /// Sorts `frame` from `from` ([`classify`]) and holds or counts it; a frame of the running
    /// collective comes back to be fed.
    pub fn admit(
        &mut self,
        member_epoch: Option<Epoch>,
        running: Option<(Epoch, u64)>,
        from: NodeId,
        frame: Frame,
    ) -> Admission {
        let Header::Collective(h) = &frame.header else {
            self.dropped += 1;
            return Admission::Dropped;
        };
        match classify(h, member_epoch, running) {
            FrameClass::Current => Admission::Feed(frame),
            FrameClass::Stale => {
                self.stale += 1;
                Admission::Stale
            }
            FrameClass::Drop => {
                self.dropped += 1;
                Admission::Dropped
            }
            FrameClass::Early if self.too_far_ahead(h, member_epoch) => {
                self.dropped += 1;
                Admission::Dropped
            }
            FrameClass::Early => match self.early.push(from, frame) {
                Ok(()) => {
                    self.held += 1;
                    Admission::Held
                }
                Err(_) => Admission::Refused,
            },
        }
    }

    /// The held frames of `collective`, which just started, in arrival order (older ones are
    /// dropped: [`EarlyFrames::take_for`]).
    pub fn take_for(&mut self, collective: (Epoch, u64)) -> Vec<(NodeId, Frame)> {
        self.last_started = self.last_started.max(Some(collective));
        self.early.take_for(collective)
    }

    /// Whether an early frame is further ahead than any honest neighbour can be
    /// ([`EARLY_EPOCHS_AHEAD`], [`EARLY_STEPS_AHEAD`]).
    fn too_far_ahead(&self, h: &CollectiveHeader, member_epoch: Option<Epoch>) -> bool {
        let floor = member_epoch.max(self.last_started.map(|(e, _)| e));
        if floor.is_some_and(|f| h.epoch.0 > f.0.saturating_add(EARLY_EPOCHS_AHEAD)) {
            return true;
        }
        match self.last_started {
            Some((e, op)) if h.epoch == e => (h.op >> 16) > (op >> 16) + EARLY_STEPS_AHEAD,
            _ => false,
        }
    }

    /// The collective `(epoch, op)` was aborted: drop what is held for it and older ones.
    pub fn abort(&mut self, epoch: Epoch, op: u64) {
        self.early.retain_after(epoch, op);
    }

    /// The holding area.
    pub fn early(&self) -> &EarlyFrames {
        &self.early
    }

    /// Counters so far.
    pub fn counters(&self) -> RingCounters {
        RingCounters {
            stale: self.stale,
            dropped: self.dropped,
            early_held: self.held,
            early_dropped: self.early.dropped(),
            refused: self.early.refused(),
            foreign: self.foreign,
        }
    }

    /// Counts a frame of the running collective dropped for its sender (not the ring neighbour
    /// that sends to this node).
    pub fn count_foreign(&mut self) {
        self.foreign += 1;
    }
}

#[cfg(test)]
mod tests;
