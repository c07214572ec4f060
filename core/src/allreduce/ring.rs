//! The sans-IO ring all-reduce state machine.

use super::schedule::{
    ag_recv_chunk, ag_send_chunk, chunk_range, owned_chunk, rs_recv_chunk, segment_count,
    segment_range, sum_over_chunks,
};
use super::scratch::Scratch;
use crate::codec::{BadEncoding, Codec, CodecKind};
use crate::ids::{Epoch, NodeId, Weight};
use crate::transport::{Body, CollectiveHeader, Frame, Header, Phase, pool};
use std::collections::VecDeque;
use std::ops::Range;

/// Default pipelining unit: 1 Mi values (4 MiB of fp32, 1 MiB of uint8).
pub const DEFAULT_SEGMENT_ELEMS: usize = 1 << 20;

/// What one all-reduce runs over.
#[derive(Clone, Debug, PartialEq)]
pub struct RingConfig {
    /// Membership epoch; frames of other epochs are rejected.
    pub epoch: Epoch,
    /// Identifies this collective within the epoch (outer step and attempt).
    pub op: u64,
    /// Which of the node's parallel rings.
    pub shard: u16,
    /// The ring order: each member sends to the next and receives from the previous.
    pub ring: Vec<NodeId>,
    /// This node.
    pub me: NodeId,
    /// How values travel.
    pub codec: CodecKind,
    /// Pipelining unit in values.
    pub segment_elems: usize,
}

impl RingConfig {
    /// A configuration with shard 0 and the default segment size.
    pub fn new(epoch: Epoch, op: u64, ring: Vec<NodeId>, me: NodeId, codec: CodecKind) -> Self {
        RingConfig { epoch, op, shard: 0, ring, me, codec, segment_elems: DEFAULT_SEGMENT_ELEMS }
    }
}

/// The values to reduce: real values, reduced in place, or only their number (virtual numerics).
#[derive(Debug)]
pub enum Payload<'a> {
    /// Real values; on success they hold the weighted average. On failure their content is
    /// unspecified: callers keep or recompute their contribution for a retry.
    Real(&'a mut [f32]),
    /// Real values owned by the collective (reduced in place; take them back with
    /// [`RingAllReduce::into_payload`]). For drivers that keep the machine across awaits.
    Owned(Vec<f32>),
    /// Only a length: the same schedule moves virtual bodies.
    Virtual(usize),
}

impl Payload<'_> {
    fn len(&self) -> usize {
        match self {
            Payload::Real(d) => d.len(),
            Payload::Owned(d) => d.len(),
            Payload::Virtual(n) => *n,
        }
    }

    fn values(&self) -> Option<&[f32]> {
        match self {
            Payload::Real(d) => Some(d),
            Payload::Owned(d) => Some(d),
            Payload::Virtual(_) => None,
        }
    }

    fn values_mut(&mut self) -> Option<&mut [f32]> {
        match self {
            Payload::Real(d) => Some(d),
            Payload::Owned(d) => Some(d),
            Payload::Virtual(_) => None,
        }
    }
}

/// Why a frame was refused or the collective cannot go on.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RingError {
    /// This node is not in the ring.
    #[error("{me} is not a member of the ring")]
    NotAMember {
        /// This node.
        me: NodeId,
    },
    /// The ring names a node twice.
    #[error("ring names {node} twice")]
    DuplicateMember {
        /// The repeated node.
        node: NodeId,
    },
    /// A frame of an older epoch: rejected, never mixed in.
    #[error("stale frame of epoch {got} (current {current})")]
    StaleEpoch {
        /// Epoch of the frame.
        got: Epoch,
        /// Epoch of this collective.
        current: Epoch,
    },
    /// A frame of a newer epoch: this node has not heard of the change yet.
    #[error("frame of future epoch {got} (current {current})")]
    FutureEpoch {
        /// Epoch of the frame.
        got: Epoch,
        /// Epoch of this collective.
        current: Epoch,
    },
    /// A frame of another collective of the same epoch.
    #[error("frame for op {got}/shard {got_shard}, expected op {expected}/shard {expected_shard}")]
    WrongOp {
        /// Op of the frame.
        got: u64,
        /// Shard of the frame.
        got_shard: u16,
        /// Op of this collective.
        expected: u64,
        /// Shard of this collective.
        expected_shard: u16,
    },
    /// A frame that does not fit the schedule (wrong sender, chunk, segment, length, or twice).
    #[error("unexpected frame from {from}: {reason}")]
    Unexpected {
        /// Sender.
        from: NodeId,
        /// What did not fit.
        reason: String,
    },
    /// Values from the left neighbour that are not finite, or that made the sum not finite:
    /// refused before anything is decoded from them or sent on, so no replica takes them. The
    /// neighbour named either sent them or (in the all-gather) forwarded them unchecked, which
    /// an honest node never does.
    #[error("{what} from {from}: {source}")]
    BadValues {
        /// The left neighbour the bytes came from.
        from: NodeId,
        /// Which: the values received, or the sum made with them.
        what: &'static str,
        /// The first value that is not finite.
        #[source]
        source: BadEncoding,
    },
    /// A non-collective frame was handed to the collective.
    #[error("not a collective frame")]
    NotCollective,
    /// The transport failed (a peer is gone).
    #[error("transport: {0}")]
    Transport(#[from] crate::transport::TransportError),
}

/// Counters of one all-reduce.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingStats {
    /// Body bytes sent.
    pub body_bytes_sent: u64,
    /// Frames sent.
    pub frames_sent: u64,
    /// Frames received and applied.
    pub frames_received: u64,
    /// Frames of older epochs rejected.
    pub stale_rejected: u64,
}

enum Pending {
    /// Encode this node's own weighted contribution of a segment (reduce-scatter step 0).
    Own { chunk: usize, seg: usize },
    /// A frame ready to go.
    Ready(Frame),
}

/// The ring all-reduce of one node, as a state machine. See the module docs.
pub struct RingAllReduce<'a> {
    cfg: RingConfig,
    codec: &'static dyn Codec,
    payload: Payload<'a>,
    weight: f32,
    world: usize,
    rank: usize,
    left: NodeId,
    right: NodeId,
    /// Received (phase, step, segment) flags: index = step * max_segs + seg, per phase.
    got_rs: Vec<bool>,
    got_ag: Vec<bool>,
    remaining: usize,
    max_segs: usize,
    queue: VecDeque<Pending>,
    /// Working space of one segment (see the `scratch` module).
    scratch: Scratch,
    stats: RingStats,
    /// A gathering ring ([`CodecKind::sums_in_ring`] false): every contribution travels whole.
    gather: Option<Gathered>,
}

/// What a gathering ring has collected: per contributor (ring rank) its weight and the encoded
/// segments of its contribution.
struct Gathered {
    weights: Vec<Option<f64>>,
    parts: Vec<Vec<Option<Body>>>,
    /// The contributions are summed into the payload.
    finished: bool,
}

impl<'a> RingAllReduce<'a> {
    /// Starts an all-reduce of `payload` with this node's contribution `weight`.
    pub fn new(cfg: RingConfig, payload: Payload<'a>, weight: Weight) -> Result<Self, RingError> {
        let world = cfg.ring.len();
        let rank = cfg
            .ring
            .iter()
            .position(|n| *n == cfg.me)
            .ok_or(RingError::NotAMember { me: cfg.me })?;
        let mut seen = cfg.ring.clone();
        seen.sort_unstable();
        if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
            return Err(RingError::DuplicateMember { node: w[0] });
        }
        let seg = cfg.segment_elems.max(1);
        let len = payload.len();
        // The longest chunk has the most segments (`len / world` values or one more).
        let max_segs = segment_count(len.div_ceil(world.max(1)), seg);
        let steps = world - 1;
        let mut m = RingAllReduce {
            codec: cfg.codec.codec(),
            left: cfg.ring[(rank + world - 1) % world],
            right: cfg.ring[(rank + 1) % world],
            weight: weight.get(),
            world,
            rank,
            got_rs: vec![false; steps * max_segs],
            got_ag: vec![false; steps * max_segs],
            remaining: 0,
            max_segs,
            queue: VecDeque::new(),
            scratch: Scratch::default(),
            stats: RingStats::default(),
            gather: None,
            payload,
            cfg,
        };
        m.cfg.segment_elems = seg;
        if !m.cfg.codec.sums_in_ring() {
            m.start_gather();
            return Ok(m);
        }
        if world == 1 {
            if m.weight == 0.0
                && let Some(d) = m.payload.values_mut()
            {
                d.fill(0.0);
            }
            return Ok(m);
        }
        // It receives every chunk but its own in the reduce-scatter (chunk r is the one it
        // starts), and every chunk but the one it owns in the all-gather.
        let segs = |c: usize| segment_count(m.chunk(c).len(), seg);
        let all = sum_over_chunks(len, world, |n| segment_count(n, seg) as u64) as usize;
        m.remaining = 2 * all - segs(rank) - segs(owned_chunk(world, rank));
        let own = rank; // reduce-scatter step 0 sends chunk r
        for j in 0..segment_count(m.chunk(own).len(), seg) {
            m.queue.push_back(Pending::Own { chunk: own, seg: j });
        }
        Ok(m)
    }

    /// A gathering ring: `W - 1` steps, at step `s` rank `r` sends contribution `r - s` (its
    /// own at step 0, encoded now) and receives contribution `r - s - 1`. A lone member takes
    /// its own contribution as encoded, as a larger ring would.
    fn start_gather(&mut self) {
        let (world, rank, seg) = (self.world, self.rank, self.cfg.segment_elems);
        let len = self.payload.len();
        let segs = segment_count(len, seg);
        self.max_segs = segs;
        self.got_rs = Vec::new();
        self.got_ag = vec![false; (world - 1) * segs];
        self.remaining = (world - 1) * segs;
        let mut g = Gathered {
            weights: vec![None; world],
            parts: vec![vec![None; segs]; world],
            finished: false,
        };
        g.weights[rank] = Some(f64::from(self.weight));
        for j in 0..segs {
            let range = segment_range(&(0..len), seg, j);
            let n = self.codec.encoded_len(range.len());
            let body = match self.payload.values() {
                Some(d) => {
                    let mut buf = pool::for_overwrite(n);
                    self.codec.encode(&d[range], &mut buf);
                    Body::Bytes(pool::freeze(buf))
                }
                None => Body::Virtual(n as u64),
            };
            g.parts[rank][j] = Some(body.clone());
            if world > 1 {
                let w = f64::from(self.weight);
                let f = self.frame(Phase::Gather, 0, rank, j, w, body);
                self.queue.push_back(Pending::Ready(f));
            }
        }
        self.gather = Some(g);
        if world == 1 {
            // Cannot fail: the own encoding is finite.
            let _ = self.finish_gather();
        }
    }

    /// Sums the gathered contributions once every one is here: `sum((w_i / sum(w)) *
    /// decode(c_i))` over the ring's ranks in order, the same operations on the same bytes at every
    /// member, so that the replicas are bit-identical. A result that is not finite (finite
    /// values that overflow together) is refused.
    fn finish_gather(&mut self) -> Result<(), BadEncoding> {
        let Some(g) = self.gather.as_mut() else { return Ok(()) };
        if g.finished || self.remaining > 0 {
            return Ok(());
        }
        g.finished = true;
        let Some(d) = self.payload.values_mut() else { return Ok(()) };
        let total: f64 = g.weights.iter().map(|w| w.unwrap_or(0.0)).sum();
        let seg = self.cfg.segment_elems;
        let len = d.len();
        for j in 0..segment_count(len, seg) {
            let range = segment_range(&(0..len), seg, j);
            let out = &mut d[range.clone()];
            out.fill(0.0);
            if total <= 0.0 {
                continue;
            }
            // Each contribution scaled by its share of the weight: no pass over the values but
            // the clearing, for a codec that touches only what it holds.
            for (w, parts) in g.weights.iter().zip(&g.parts) {
                let w = w.unwrap_or(0.0);
                let Some(Body::Bytes(b)) = &parts[j] else { continue };
                if w == 0.0 {
                    continue;
                }
                let share = (w / total) as f32;
                let tmp = self.scratch.get(out.len());
                self.codec.decode_accumulate_scaled(b, out, share, tmp);
            }
            if let Some(i) = out.iter().position(|v| !v.is_finite()) {
                let value = out[i];
                return Err(BadEncoding { what: "value", index: range.start + i, value });
            }
        }
        Ok(())
    }

    /// What a gathering ring sent of this node's own contribution: its encoded segments, each
    /// with its range of the values (empty for a summing ring or virtual values).
    pub fn own_sent(&self) -> Vec<(Range<usize>, bytes::Bytes)> {
        let Some(g) = self.gather.as_ref() else { return Vec::new() };
        let len = self.payload.len();
        let seg = self.cfg.segment_elems;
        g.parts[self.rank]
            .iter()
            .enumerate()
            .filter_map(|(j, b)| match b {
                Some(Body::Bytes(b)) => Some((segment_range(&(0..len), seg, j), b.clone())),
                _ => None,
            })
            .collect()
    }

    /// The total weight of a gathering ring's contributions, once they are all here.
    pub fn gathered_weight(&self) -> Option<f64> {
        let g = self.gather.as_ref()?;
        g.finished.then(|| g.weights.iter().map(|w| w.unwrap_or(0.0)).sum())
    }

    /// A received frame of a gathering ring (after the epoch, op and sender checks).
    fn handle_gather(
        &mut self,
        from: NodeId,
        h: &CollectiveHeader,
        frame: &Frame,
    ) -> Result<(), RingError> {
        let unexpected = |reason: String| RingError::Unexpected { from, reason };
        if h.phase != Phase::Gather {
            return Err(unexpected(format!("a {:?} frame in a gathering ring", h.phase)));
        }
        let step = usize::from(h.step);
        if step + 1 >= self.world {
            return Err(unexpected(format!("step {step} out of range")));
        }
        let chunk = h.chunk as usize;
        let expected = rs_recv_chunk(self.world, self.rank, step);
        if chunk != expected {
            return Err(unexpected(format!(
                "gather step {step} carries {chunk}, expected {expected}"
            )));
        }
        let seg = h.segment as usize;
        let len = self.payload.len();
        let nsegs = segment_count(len, self.cfg.segment_elems);
        if seg >= nsegs {
            return Err(unexpected(format!("segment {seg} of a contribution with {nsegs}")));
        }
        let range = segment_range(&(0..len), self.cfg.segment_elems, seg);
        let want = self.codec.encoded_len(range.len()) as u64;
        match (&frame.body, &self.payload) {
            (Body::Bytes(b), Payload::Real(_) | Payload::Owned(_)) if b.len() as u64 == want => {}
            (Body::Virtual(n), Payload::Virtual(_)) if *n == want => {}
            (b, _) => {
                return Err(unexpected(format!("body of {} bytes, expected {want}", b.len())));
            }
        }
        let w = h.weight_sum;
        let wf = w as f32;
        if !(w.is_finite() && w >= 0.0 && wf.is_finite()) {
            return Err(unexpected(format!("weight {w}")));
        }
        if let Body::Bytes(b) = &frame.body {
            let what = "values received";
            self.codec.check(b).map_err(|source| RingError::BadValues { from, what, source })?;
        }
        let idx = step * self.max_segs + seg;
        if self.got_ag[idx] {
            return Err(unexpected(format!("gather step {step} segment {seg} twice")));
        }
        let Some(g) = self.gather.as_mut() else { return Err(RingError::NotCollective) };
        match g.weights[chunk] {
            Some(prev) if prev != w => {
                return Err(unexpected(format!(
                    "contribution {chunk} with weights {prev} and {w}"
                )));
            }
            _ => g.weights[chunk] = Some(w),
        }
        g.parts[chunk][seg] = Some(frame.body.clone());
        self.got_ag[idx] = true;
        self.remaining -= 1;
        self.stats.frames_received += 1;
        if step + 2 < self.world {
            let f = self.frame(Phase::Gather, step + 1, chunk, seg, w, frame.body.clone());
            self.queue.push_back(Pending::Ready(f));
        }
        let what = "the sum of the contributions";
        self.finish_gather().map_err(|source| RingError::BadValues { from, what, source })
    }

    /// The configuration.
    pub fn config(&self) -> &RingConfig {
        &self.cfg
    }

    /// Ends the collective and returns an owned payload ([`Payload::Owned`]); `None` for
    /// borrowed or virtual payloads. After [`is_done`](Self::is_done) it holds the result.
    pub fn into_payload(self) -> Option<Vec<f32>> {
        match self.payload {
            Payload::Owned(v) => Some(v),
            _ => None,
        }
    }

    /// Number of values reduced.
    pub fn len(&self) -> usize {
        self.payload.len()
    }

    /// Whether there are no values.
    pub fn is_empty(&self) -> bool {
        self.payload.len() == 0
    }

    /// Counters so far.
    pub fn stats(&self) -> RingStats {
        self.stats
    }

    /// True when this node holds the final result and has nothing left to send.
    pub fn is_done(&self) -> bool {
        self.remaining == 0
            && self.queue.is_empty()
            && self.gather.as_ref().is_none_or(|g| g.finished)
    }

    /// Finishes a virtual all-reduce at once, as if every frame of its schedule had been sent
    /// and received: the executor models the collective's time itself (the simulator's modelled
    /// collectives) and no frame travels. The counters become the schedule's. Returns `false`,
    /// changing nothing, for real values or once frames have moved.
    pub fn complete_virtual(&mut self) -> bool {
        if self.payload.values().is_some() || self.stats.frames_sent > 0 {
            return false;
        }
        let (world, rank, seg) = (self.world, self.rank, self.cfg.segment_elems);
        let len = self.payload.len();
        let codec = self.codec;
        if let Some(g) = self.gather.as_mut() {
            // Every contribution but its own's last hop: W - 1 whole contributions sent.
            let segs = segment_count(len, seg) as u64;
            let bytes: u64 = (0..segs as usize)
                .map(|j| codec.encoded_len(segment_range(&(0..len), seg, j).len()) as u64)
                .sum();
            let hops = world.saturating_sub(1) as u64;
            self.stats.frames_sent = hops * segs;
            self.stats.body_bytes_sent = hops * bytes;
            self.stats.frames_received += self.remaining as u64;
            self.remaining = 0;
            self.queue.clear();
            g.finished = true;
            return true;
        }
        // A chunk's frames and body bytes; it sends every chunk but its owned one (`r + 1`) in
        // the reduce-scatter, and every chunk but `r + 2` in the all-gather.
        let frames = |n: usize| segment_count(n, seg) as u64;
        let bytes = |n: usize| {
            let (full, rest) = (n / seg, n % seg);
            full as u64 * codec.encoded_len(seg) as u64
                + if rest > 0 { codec.encoded_len(rest) as u64 } else { 0 }
        };
        let (a, b) = (
            chunk_range(len, world, (rank + 1) % world),
            chunk_range(len, world, (rank + 2) % world),
        );
        let per_rank =
            |f: &dyn Fn(usize) -> u64| 2 * sum_over_chunks(len, world, f) - f(a.len()) - f(b.len());
        if world > 1 {
            self.stats.frames_sent = per_rank(&frames);
            self.stats.body_bytes_sent = per_rank(&bytes);
        }
        self.stats.frames_received += self.remaining as u64;
        self.remaining = 0;
        self.queue.clear();
        true
    }

    /// The next frame to send, encoding it now if needed. Call until `None` after every
    /// [`handle_frame`](Self::handle_frame) and after construction.
    pub fn poll_send(&mut self) -> Option<(NodeId, Frame)> {
        let frame = match self.queue.pop_front()? {
            Pending::Ready(f) => f,
            Pending::Own { chunk, seg } => {
                let range = self.segment(chunk, seg);
                let body = match self.payload.values() {
                    // Weight 1: encode the values where they are, without a copy to scratch.
                    Some(d) if self.weight == 1.0 => {
                        let mut buf = pool::for_overwrite(self.codec.encoded_len(range.len()));
                        self.codec.encode(&d[range], &mut buf);
                        Body::Bytes(pool::freeze(buf))
                    }
                    _ => {
                        self.load_weighted_own(range.clone());
                        self.encode_scratch(range.len())
                    }
                };
                self.frame(Phase::ReduceScatter, 0, chunk, seg, f64::from(self.weight), body)
            }
        };
        self.stats.body_bytes_sent += frame.body.len();
        self.stats.frames_sent += 1;
        Some((self.right, frame))
    }

    /// Applies a received collective frame. A frame of an older epoch returns
    /// [`RingError::StaleEpoch`] and changes nothing (the caller counts and drops it).
    pub fn handle_frame(&mut self, from: NodeId, frame: &Frame) -> Result<(), RingError> {
        let Header::Collective(h) = &frame.header else {
            return Err(RingError::NotCollective);
        };
        if h.epoch < self.cfg.epoch {
            self.stats.stale_rejected += 1;
            return Err(RingError::StaleEpoch { got: h.epoch, current: self.cfg.epoch });
        }
        if h.epoch > self.cfg.epoch {
            return Err(RingError::FutureEpoch { got: h.epoch, current: self.cfg.epoch });
        }
        if h.op != self.cfg.op || h.shard != self.cfg.shard {
            return Err(RingError::WrongOp {
                got: h.op,
                got_shard: h.shard,
                expected: self.cfg.op,
                expected_shard: self.cfg.shard,
            });
        }
        let unexpected = |reason: String| RingError::Unexpected { from, reason };
        if from != self.left {
            return Err(unexpected(format!("expected frames only from {}", self.left)));
        }
        if self.gather.is_some() {
            return self.handle_gather(from, h, frame);
        }
        let step = usize::from(h.step);
        if step + 1 >= self.world {
            return Err(unexpected(format!("step {step} out of range")));
        }
        let chunk = h.chunk as usize;
        let expected_chunk = match h.phase {
            Phase::ReduceScatter => rs_recv_chunk(self.world, self.rank, step),
            Phase::AllGather => ag_recv_chunk(self.world, self.rank, step),
            Phase::Gather => return Err(unexpected("a gather frame in a summing ring".into())),
        };
        if chunk != expected_chunk {
            return Err(unexpected(format!(
                "{:?} step {step} carries chunk {chunk}, expected {expected_chunk}",
                h.phase
            )));
        }
        let seg = h.segment as usize;
        let nsegs = segment_count(self.chunk(chunk).len(), self.cfg.segment_elems);
        if seg >= nsegs {
            return Err(unexpected(format!("segment {seg} of a chunk with {nsegs}")));
        }
        let range = self.segment(chunk, seg);
        let want = self.codec.encoded_len(range.len()) as u64;
        match (&frame.body, &self.payload) {
            (Body::Bytes(b), Payload::Real(_) | Payload::Owned(_)) if b.len() as u64 == want => {}
            (Body::Virtual(n), Payload::Virtual(_)) if *n == want => {}
            (b, _) => {
                return Err(unexpected(format!(
                    "body of {} bytes ({}), expected {want}",
                    b.len(),
                    if b.is_virtual() { "virtual" } else { "real" }
                )));
            }
        }
        // Checked in the type the average divides in: a positive sum that is zero or
        // subnormal as an f32 would divide the values into infinities.
        let ws = h.weight_sum as f32;
        let usable = h.weight_sum == 0.0 || ws.is_finite() && ws >= f32::MIN_POSITIVE;
        if !h.weight_sum.is_finite() || h.weight_sum < 0.0 || !usable {
            return Err(unexpected(format!("weight sum {}", h.weight_sum)));
        }
        if let Body::Bytes(b) = &frame.body {
            let what = "values received";
            self.codec.check(b).map_err(|source| RingError::BadValues { from, what, source })?;
        }
        let idx = step * self.max_segs + seg;
        let got = match h.phase {
            Phase::ReduceScatter => &mut self.got_rs[idx],
            Phase::AllGather | Phase::Gather => &mut self.got_ag[idx],
        };
        if *got {
            return Err(unexpected(format!("{:?} step {step} segment {seg} twice", h.phase)));
        }
        *got = true;
        self.remaining -= 1;
        self.stats.frames_received += 1;
        match h.phase {
            Phase::ReduceScatter => {
                let sum = self.on_reduce_scatter(h, step, chunk, seg, range, &frame.body);
                let what = "the sum with the values received";
                sum.map_err(|source| RingError::BadValues { from, what, source })?;
            }
            Phase::AllGather | Phase::Gather => {
                self.on_all_gather(h, step, chunk, seg, range, &frame.body)
            }
        }
        Ok(())
    }

    /// Reduces a received segment with this node's own and queues what goes on. An encoded sum
    /// that is not finite (finite values that overflow together) is refused, not sent on.
    fn on_reduce_scatter(
        &mut self,
        h: &CollectiveHeader,
        step: usize,
        chunk: usize,
        seg: usize,
        range: Range<usize>,
        body: &Body,
    ) -> Result<(), BadEncoding> {
        let n = range.len();
        let weight_sum = h.weight_sum + f64::from(self.weight);
        if step + 2 < self.world {
            // A middle hop: reduce into the scratch segment and encode from there (fused where
            // the codec can). The values are only read: each chunk passes through a rank once in
            // the reduce-scatter and the all-gather overwrites it, so writing the partial sums
            // back would be memory traffic for nothing.
            let (codec, w) = (self.codec, self.weight);
            let body = match (body, self.payload.values()) {
                (Body::Bytes(b), Some(own)) => {
                    let mut out = pool::for_overwrite(codec.encoded_len(n));
                    codec.reduce_encode(b, &own[range], w, self.scratch.get(n), &mut out);
                    codec.check(&out)?;
                    Body::Bytes(pool::freeze(out))
                }
                _ => Body::Virtual(self.codec.encoded_len(n) as u64),
            };
            let f = self.frame(Phase::ReduceScatter, step + 1, chunk, seg, weight_sum, body);
            self.queue.push_back(Pending::Ready(f));
            return Ok(());
        }
        // Last reduce-scatter step: this node owns the chunk. Average, encode once, and take
        // the decoded bytes as its own result, exactly as every other rank will (one call: the
        // codec reads the values once and writes them once).
        debug_assert_eq!(chunk, owned_chunk(self.world, self.rank));
        let (codec, w) = (self.codec, self.weight);
        let body = match (self.payload.values_mut(), body) {
            (Some(d), Body::Bytes(b)) => {
                let mut buf = pool::for_overwrite(codec.encoded_len(n));
                let scratch = self.scratch.get(n);
                codec.reduce_average(b, &mut d[range], w, weight_sum, scratch, &mut buf);
                codec.check(&buf)?;
                Body::Bytes(pool::freeze(buf))
            }
            // Virtual numerics: only the length travels.
            _ => self.encode_scratch(n),
        };
        let f = self.frame(Phase::AllGather, 0, chunk, seg, weight_sum, body);
        self.queue.push_back(Pending::Ready(f));
        Ok(())
    }

    fn on_all_gather(
        &mut self,
        h: &CollectiveHeader,
        step: usize,
        chunk: usize,
        seg: usize,
        range: Range<usize>,
        body: &Body,
    ) {
        if let (Some(d), Body::Bytes(b)) = (self.payload.values_mut(), body) {
            self.codec.decode(b, &mut d[range]);
        }
        if step + 2 < self.world {
            debug_assert_eq!(ag_send_chunk(self.world, self.rank, step + 1), chunk);
            // Forward the owner's bytes unchanged (a reference-counted clone, no copy).
            let f = self.frame(Phase::AllGather, step + 1, chunk, seg, h.weight_sum, body.clone());
            self.queue.push_back(Pending::Ready(f));
        }
    }

    fn chunk(&self, c: usize) -> Range<usize> {
        chunk_range(self.payload.len(), self.world, c)
    }

    fn segment(&self, c: usize, j: usize) -> Range<usize> {
        segment_range(&self.chunk(c), self.cfg.segment_elems, j)
    }

    /// scratch[..n] = weight * own[range] (0 for weight 0, whatever the values).
    fn load_weighted_own(&mut self, range: Range<usize>) {
        let n = range.len();
        // Virtual payloads never touch values: no scratch (a 10B ring would allocate GBs).
        let Some(d) = self.payload.values() else {
            return;
        };
        crate::codec::load_weighted(self.scratch.get(n), &d[range], self.weight);
    }

    fn encode_scratch(&mut self, n: usize) -> Body {
        let len = self.codec.encoded_len(n);
        match self.payload {
            Payload::Virtual(_) => Body::Virtual(len as u64),
            Payload::Real(_) | Payload::Owned(_) => {
                let mut buf = pool::for_overwrite(len);
                self.codec.encode(self.scratch.get(n), &mut buf);
                Body::Bytes(pool::freeze(buf))
            }
        }
    }

    fn frame(
        &self,
        phase: Phase,
        step: usize,
        chunk: usize,
        seg: usize,
        weight_sum: f64,
        body: Body,
    ) -> Frame {
        let header = Header::Collective(CollectiveHeader {
            epoch: self.cfg.epoch,
            op: self.cfg.op,
            shard: self.cfg.shard,
            phase,
            step: step as u16,
            chunk: chunk as u32,
            segment: seg as u32,
            weight_sum,
        });
        Frame { header, body }
    }
}
