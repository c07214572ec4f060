//! The joiner's side: pieces held before the fetch is known, and the bounded assembly of the
//! two parts.
//!
//! See [`StateAssembly`] for the rules a piece must pass.
//!
//! Size: the rules a piece must pass and the bounded buffers they protect are one memory
//! contract; the early-piece holding area and the assembly share its counters.

use super::format::{SHARED_HEADER_LEN, encoded_len};
use super::part::PartBytes;
use super::plan::virtual_part_lens;
use super::verify::{Received, ReceivedPart, VerifyFailed};
use super::wire::{PieceDigest, part_digest, piece_digest};
use super::{PART_OWN, PART_SHARED};
use crate::digest::{Blake3Digest, HexOrEmpty};
use crate::ids::{Epoch, NodeId};
use crate::mesh::Held;
use crate::node::fair::{FairHold, Keep};
use crate::transport::{Body, StateAsk, StateHeader};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

/// Bytes of pieces held before they can be assembled, by default (1 GiB).
pub const DEFAULT_EARLY_BYTES: u64 = 1 << 30;

/// Why a piece was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// The sender is not assigned to send this part.
    #[error("{from} is not assigned to send part {part}")]
    NotAssigned {
        /// The sender.
        from: NodeId,
        /// The part.
        part: u32,
    },
    /// The piece belongs to an assignment older than this fetch.
    #[error("piece of epoch {got} predates this fetch ({first})")]
    OldEpoch {
        /// The piece's epoch.
        got: Epoch,
        /// The fetch's first epoch.
        first: Epoch,
    },
    /// No such part.
    #[error("no state part {part}")]
    BadPart {
        /// The part named.
        part: u32,
    },
    /// The replicated part's length is not the one this node's model has.
    #[error("replicated part of {got} bytes; this node's model needs exactly {expected}")]
    SharedTotal {
        /// The piece's total.
        got: u64,
        /// The length expected.
        expected: u64,
    },
    /// The own part is longer than allowed.
    #[error("own part of {got} bytes, more than the {max} allowed")]
    OwnTotal {
        /// The piece's total.
        got: u64,
        /// The bound.
        max: u64,
    },
    /// The piece names another length for the copy being assembled.
    #[error("part {part} of this copy is {held} bytes; the piece says {got}")]
    TotalChanged {
        /// The part.
        part: u32,
        /// The copy's length.
        held: u64,
        /// The piece's total.
        got: u64,
    },
    /// `offset + len` lies outside the part (or overflows).
    #[error("piece at {offset} of {len} bytes lies outside part {part} of {total}")]
    OutOfRange {
        /// The part.
        part: u32,
        /// The piece's offset.
        offset: u64,
        /// The piece's length.
        len: u64,
        /// The part's length.
        total: u64,
    },
    /// The piece's bytes do not hash to the digest its header gives (damaged after its sender
    /// hashed it): dropped, and asked for again.
    #[error("piece at {offset} of {len} bytes of part {part} does not match its digest")]
    PieceDigest {
        /// The part.
        part: u32,
        /// The piece's offset.
        offset: u64,
        /// The piece's length.
        len: u64,
    },
    /// An empty piece of a part that is not empty.
    #[error("empty piece of part {part} of {total} bytes")]
    EmptyPiece {
        /// The part.
        part: u32,
        /// The part's length.
        total: u64,
    },
    /// The piece overlaps pieces held without being one of them.
    #[error("piece at {offset} of {len} bytes overlaps pieces of part {part} held")]
    Overlap {
        /// The part.
        part: u32,
        /// The piece's offset.
        offset: u64,
        /// The piece's length.
        len: u64,
    },
    /// The piece is of an older state than the copy held.
    #[error("piece of part {part} as of outer step {got}, older than the copy held ({held})")]
    StaleDigest {
        /// The part.
        part: u32,
        /// The piece's outer step.
        got: u64,
        /// The copy's outer step.
        held: u64,
    },
    /// The piece is of a replicated copy already refused as not the state the members vouch
    /// for ([`PartFault::NotVouched`](super::PartFault::NotVouched)): sent again, it is not
    /// assembled again.
    #[error(
        "piece of a replicated copy refused as not the one the members hold (outer step {got})"
    )]
    RefusedCopy {
        /// The piece's outer step.
        got: u64,
    },
    /// The piece is of a state beyond the outer step the mesh can be at (a sender can be one
    /// commit ahead of what this node has heard, no more): refused, so that a made-up step
    /// cannot make every honest piece look stale.
    #[error("piece of part {part} as of outer step {got}, beyond the mesh's ({ceiling} at most)")]
    FutureStep {
        /// The part.
        part: u32,
        /// The piece's outer step.
        got: u64,
        /// The latest step a state can be at.
        ceiling: u64,
    },
    /// Two replicated copies of one outer step disagree.
    #[error(
        "replicated copies of outer step {outer_step} disagree: digest {}, held {}",
        HexOrEmpty(got),
        HexOrEmpty(held)
    )]
    DigestConflict {
        /// The outer step.
        outer_step: u64,
        /// The piece's digest.
        got: Option<Blake3Digest>,
        /// The copy's digest.
        held: Option<Blake3Digest>,
    },
    /// Real bytes where virtual numerics expect lengths only.
    #[error("a body of bytes where lengths only were expected")]
    UnexpectedBytes,
    /// A virtual body where bytes were expected.
    #[error("a virtual body where bytes were expected")]
    UnexpectedVirtual,
    /// The holding area is full.
    #[error("holding area full: {held} of {max} bytes")]
    HoldingFull {
        /// Bytes held.
        held: u64,
        /// The bound.
        max: u64,
    },
}

/// What the joiner knows of the state before any piece arrives: from its own model's layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expect {
    /// Exact length of the replicated part ([`encoded_len`] of the parameter count).
    pub shared_len: u64,
    /// Largest own part accepted.
    pub own_max: u64,
    /// Virtual numerics: bodies are lengths only.
    pub virtual_bodies: bool,
    /// Bound on the bytes of pieces held for an assignment not known yet.
    pub hold_bytes: u64,
}

impl Expect {
    /// Real bytes for a model of `n` parameters, own parts up to `own_max` bytes.
    pub fn real(n: usize, own_max: u64) -> Expect {
        Expect {
            shared_len: encoded_len(n as u64),
            own_max,
            virtual_bodies: false,
            hold_bytes: DEFAULT_EARLY_BYTES,
        }
    }

    /// Virtual numerics for a model of `params` parameters ([`virtual_part_lens`]).
    pub fn virtual_params(params: u64) -> Expect {
        let (shared_len, own_max) = virtual_part_lens(params);
        Expect { shared_len, own_max, virtual_bodies: true, hold_bytes: DEFAULT_EARLY_BYTES }
    }
}

/// What a piece did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Stored. `restarted`: it began a newer copy of its part, dropping the older one;
    /// `complete`: both parts are now complete ([`StateAssembly::take_complete`]).
    Stored {
        /// A newer copy replaced the one held.
        restarted: bool,
        /// Both parts are complete.
        complete: bool,
    },
    /// The same range is held already: ignored.
    Duplicate,
    /// From a sender of a newer assignment than this assembly knows: held until
    /// [`StateAssembly::reassign`] names it.
    Held,
}

impl Progress {
    /// True when both parts are complete after this piece.
    pub fn is_complete(&self) -> bool {
        matches!(self, Progress::Stored { complete: true, .. })
    }
}

/// What feeding held pieces did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fed {
    /// Pieces stored (or duplicates of pieces held).
    pub stored: usize,
    /// Pieces held again (their assignment is still not known).
    pub held: usize,
    /// Pieces refused, and why.
    pub refused: Vec<Refused>,
    /// Both parts are complete.
    pub complete: bool,
}

/// What a reassignment did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reassigned {
    /// Bytes of parts held and kept.
    pub kept_bytes: u64,
    /// Bytes of own parts dropped (incomplete, from senders no longer assigned).
    pub dropped_bytes: u64,
    /// The pieces held for this assignment, fed.
    pub fed: Fed,
}

fn hold_cost(b: &Body) -> u64 {
    let body = match b {
        Body::Bytes(x) => x.len() as u64,
        Body::Virtual(_) => 0,
    };
    let fixed = std::mem::size_of::<(NodeId, StateHeader, Body)>() as u64;
    fixed.saturating_add(body)
}

/// State pieces kept before they can be assembled (they arrived before this node learnt it is
/// to fetch), within a bound on the memory they take (bodies, headers and digests), shared fairly
/// among their senders ([`FairHold`]): a peer sending pieces nobody asked for cannot crowd out
/// the senders the coordinator is about to assign.
#[derive(Clone, Debug, PartialEq)]
pub struct EarlyPieces {
    pieces: FairHold<(StateHeader, Body)>,
    /// Pieces pushed out for a sender with a smaller share.
    dropped: u64,
}

impl Default for EarlyPieces {
    fn default() -> Self {
        EarlyPieces::new(DEFAULT_EARLY_BYTES)
    }
}

impl EarlyPieces {
    /// An empty area holding up to `max_bytes`.
    pub fn new(max_bytes: u64) -> EarlyPieces {
        EarlyPieces { pieces: FairHold::new(usize::MAX, max_bytes), dropped: 0 }
    }

    /// Keeps a piece; refused when its part is unknown or the area would exceed its bound and
    /// no sender holding more than `from` can make room.
    pub fn hold(&mut self, from: NodeId, h: StateHeader, body: Body) -> Result<(), Refused> {
        if h.part > PART_OWN {
            return Err(Refused::BadPart { part: h.part });
        }
        let cost = hold_cost(&body);
        match self.pieces.push(from, cost, (h, body)) {
            Ok(out) => {
                self.dropped += out.len() as u64;
                Ok(())
            }
            Err(full) => Err(Refused::HoldingFull { held: full.bytes, max: self.max_bytes() }),
        }
    }

    fn max_bytes(&self) -> u64 {
        self.pieces.max_bytes()
    }

    /// Pieces held.
    pub fn len(&self) -> usize {
        self.pieces.len()
    }

    /// True when none is held.
    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    /// Memory the pieces take, as counted against the bound.
    pub fn bytes(&self) -> u64 {
        self.pieces.bytes()
    }

    /// Pieces pushed out so far for a sender holding less.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Drops every piece.
    pub fn clear(&mut self) {
        self.pieces.clear();
    }

    /// Drops the pieces of epochs before `epoch`.
    pub fn drop_before(&mut self, epoch: Epoch) {
        self.pieces.filter(|_, (h, _)| if h.epoch >= epoch { Keep::Keep } else { Keep::Drop });
    }

    /// Takes every piece, in arrival order.
    pub fn take(&mut self) -> Vec<(NodeId, StateHeader, Body)> {
        self.pieces.take_all().into_iter().map(|(from, (h, b))| (from, h, b)).collect()
    }
}

enum Data {
    Bytes(PartBytes),
    Virtual,
    /// Handed out for verification.
    Taken,
}

/// One copy of one part being assembled.
struct PartCopy {
    outer_step: u64,
    digest: Option<Blake3Digest>,
    total: u64,
    data: Data,
    /// Pieces held, `offset -> end`, disjoint.
    ranges: BTreeMap<u64, u64>,
    /// Each real piece's digest, checked against its bytes when it was stored, by offset.
    digests: BTreeMap<u64, PieceDigest>,
    held: u64,
    /// The part's digest from its pieces' digests, once complete (real bytes): verification
    /// ends with the last piece instead of reading the whole part again.
    hashed: Option<Blake3Digest>,
}

impl PartCopy {
    fn is(&self, outer_step: u64, digest: Option<Blake3Digest>) -> bool {
        self.outer_step == outer_step && self.digest == digest
    }

    fn complete(&self) -> bool {
        self.held == self.total && !self.ranges.is_empty()
    }

    fn available(&self) -> bool {
        self.complete() && !matches!(self.data, Data::Taken)
    }

    fn taken(&self) -> bool {
        matches!(self.data, Data::Taken)
    }

    fn take(&mut self) -> ReceivedPart {
        let bytes = match std::mem::replace(&mut self.data, Data::Taken) {
            Data::Bytes(v) => Some(v),
            Data::Virtual | Data::Taken => None,
        };
        ReceivedPart {
            outer_step: self.outer_step,
            digest: self.digest,
            total: self.total,
            hashed: bytes.as_ref().and(self.hashed),
            bytes,
        }
    }

    /// Once complete (real bytes), the part's digest from its pieces' checked digests.
    fn seal(&mut self) {
        if !self.complete() || self.hashed.is_some() || !matches!(self.data, Data::Bytes(_)) {
            return;
        }
        let pieces = self
            .ranges
            .iter()
            .map(|(&lo, &hi)| (lo, hi - lo, self.digests.get(&lo).copied().unwrap_or_default()));
        self.hashed = Some(part_digest(self.total, pieces));
    }

    /// Appends the ranges of `[0, total)` not held (an empty part not yet received: its one
    /// empty piece).
    fn gaps(&self, part: u32, out: &mut Vec<(u32, u64, u64)>) {
        if self.complete() {
            return;
        }
        let mut at = 0;
        for (&s, &e) in &self.ranges {
            if s > at {
                out.push((part, at, s));
            }
            at = at.max(e);
        }
        if at < self.total || self.total == 0 {
            out.push((part, at, self.total));
        }
    }

    /// Puts back a part handed out; false when it is not the one handed out.
    fn restore(&mut self, p: ReceivedPart, virtual_bodies: bool) -> bool {
        if !self.taken() || !self.is(p.outer_step, p.digest) || p.total != self.total {
            return false;
        }
        self.data = match p.bytes {
            Some(v) if !virtual_bodies && v.len() as u64 == self.total => Data::Bytes(v),
            None if virtual_bodies => Data::Virtual,
            _ => return false,
        };
        self.hashed = p.hashed;
        true
    }
}

enum Overlap {
    None,
    Same,
    Other,
}

fn overlap(ranges: &BTreeMap<u64, u64>, lo: u64, hi: u64) -> Overlap {
    if let Some((&s, &e)) = ranges.range(..=lo).next_back() {
        if s == lo && e == hi {
            return Overlap::Same;
        }
        if e > lo || s == lo {
            return Overlap::Other;
        }
    }
    match ranges.range((Bound::Excluded(lo), Bound::Unbounded)).next() {
        Some((&s, _)) if s < hi => Overlap::Other,
        _ => Overlap::None,
    }
}

/// Stores a checked piece into `slot` (left as it was on an error). Returns whether it
/// restarted the copy, or `None` for a duplicate.
fn put_into(
    slot: &mut Option<PartCopy>,
    floor: u64,
    same_step_restarts: bool,
    h: &StateHeader,
    body: &Body,
    spare: &mut Option<PartBytes>,
) -> Result<Option<bool>, Refused> {
    let part = h.part;
    let len = body.len();
    let (lo, hi) = (h.offset, h.offset.saturating_add(len));
    let restarted = match slot.as_ref() {
        Some(c) if c.is(h.outer_step, h.digest) => {
            if c.total != h.total {
                return Err(Refused::TotalChanged { part, held: c.total, got: h.total });
            }
            match overlap(&c.ranges, lo, hi) {
                Overlap::Same => return Ok(None),
                Overlap::Other => return Err(Refused::Overlap { part, offset: lo, len }),
                Overlap::None => false,
            }
        }
        Some(c) => {
            if h.outer_step < c.outer_step {
                return Err(Refused::StaleDigest { part, got: h.outer_step, held: c.outer_step });
            }
            if h.outer_step == c.outer_step && !same_step_restarts {
                return Err(Refused::DigestConflict {
                    outer_step: h.outer_step,
                    got: h.digest,
                    held: c.digest,
                });
            }
            true
        }
        None if h.outer_step < floor => {
            return Err(Refused::StaleDigest { part, got: h.outer_step, held: floor });
        }
        None => false,
    };
    if slot.as_ref().is_none_or(|c| !c.is(h.outer_step, h.digest)) {
        // A new copy, allocated once at its checked length (or the old buffer reused: every
        // byte of a complete copy is written by its pieces).
        let data = match body {
            Body::Virtual(_) => Data::Virtual,
            Body::Bytes(_) => {
                let total = usize::try_from(h.total).map_err(|_| Refused::OutOfRange {
                    part,
                    offset: lo,
                    len,
                    total: h.total,
                })?;
                let old = slot
                    .take()
                    .and_then(|c| match c.data {
                        Data::Bytes(v) if v.len() == total => Some(v),
                        _ => None,
                    })
                    .or_else(|| spare.take_if(|s| s.len() == total));
                // The replicated part in the vectors it decodes to (the pieces land in their
                // final buffers); the own part in one vector (the inner loop takes it so).
                let fresh = || {
                    let n = (h.total.checked_sub(SHARED_HEADER_LEN))
                        .filter(|b| b % 8 == 0)
                        .and_then(|b| usize::try_from(b / 8).ok());
                    match n {
                        Some(n) if part == PART_SHARED => PartBytes::shared(n),
                        _ => PartBytes::zeroed(total),
                    }
                };
                Data::Bytes(old.unwrap_or_else(fresh))
            }
        };
        *slot = Some(PartCopy {
            outer_step: h.outer_step,
            digest: h.digest,
            total: h.total,
            data,
            ranges: BTreeMap::new(),
            digests: BTreeMap::new(),
            held: 0,
            hashed: None,
        });
    }
    let Some(c) = slot.as_mut() else { return Ok(None) };
    match (&mut c.data, body) {
        (Data::Bytes(buf), Body::Bytes(b)) => {
            let at = usize::try_from(lo).ok();
            if !at.is_some_and(|at| buf.write(at, b)) {
                return Err(Refused::OutOfRange { part, offset: lo, len, total: c.total });
            }
            c.digests.insert(lo, h.piece);
        }
        (Data::Virtual, Body::Virtual(_)) => {}
        // A complete copy (handed out) overlaps every piece; kinds were checked before.
        (Data::Taken, _) => return Err(Refused::Overlap { part, offset: lo, len }),
        (_, Body::Bytes(_)) => return Err(Refused::UnexpectedBytes),
        (_, Body::Virtual(_)) => return Err(Refused::UnexpectedVirtual),
    }
    c.ranges.insert(lo, hi);
    c.held = c.held.saturating_add(len);
    c.seal();
    Ok(Some(restarted))
}

/// The joiner's assembly of one fetch: made at `FetchState`, told of reassignments, fed every
/// state piece.
///
/// Rules of [`put`](Self::put), every one checked before anything is stored or allocated:
///
/// 1. the part is [`PART_SHARED`] or [`PART_OWN`]; the body is real bytes, or virtual (a length)
///    when the assembly was made for virtual numerics;
/// 2. the replicated part is exactly [`Expect::shared_len`] bytes, the own part at most
///    [`Expect::own_max`]; `offset + len` (checked) lies within the part; a piece is empty only
///    when its part is;
/// 3. the piece's epoch is not older than the fetch's first assignment;
/// 4. the sender is assigned: in blocking mode any sender of the current or an earlier
///    assignment of this fetch (they all send the same frozen state), in non-blocking mode a
///    sender of the current assignment. The own part is taken from the current first sender, or
///    from a sender whose own copy is already being assembled. A piece of a newer epoch from a
///    sender not (yet) assigned is held, within a bound, until [`StateAssembly::reassign`] names
///    it (the coordinator tells senders and joiner separately);
/// 5. a piece of another copy (digest or outer step) than the one held: a newer outer step
///    starts the copy over (a non-blocking sender may commit mid-transfer), an older one is
///    refused. At the same outer step, two replicated copies that disagree are refused (the
///    replicas are bit-identical, so one of them is wrong); a sender's own part restarts (its
///    inner state moved on within the step);
/// 6. a piece overlapping pieces held is refused, unless it is the same range (a duplicate,
///    ignored: two non-blocking senders, or a sender of a reassignment, send the same grid).
///
/// The replicated part is one copy pooled from every sender: its pieces are identified by the
/// digest, not by who sent them, so a reassignment (blocking or not) keeps every piece held. Own
/// parts are kept per sender; a reassignment drops the incomplete own copies of the senders it
/// no longer names (they will not be finished), and keeps complete ones. Each copy's buffer is
/// allocated once, at its checked length, when its first piece arrives.
pub struct StateAssembly {
    first_epoch: Epoch,
    epoch: Epoch,
    senders: Vec<NodeId>,
    /// Every sender of this fetch's assignments.
    ever: BTreeSet<NodeId>,
    blocking: bool,
    expect: Expect,
    shared: Option<PartCopy>,
    /// Replicated copies older than this are refused (a copy of this step failed verification).
    shared_floor: u64,
    own: BTreeMap<NodeId, PartCopy>,
    /// Pieces from senders of a newer assignment than `epoch`.
    pending: EarlyPieces,
    /// Buffers lent for the replicated part ([`StateAssembly::lend`]).
    spare: Option<PartBytes>,
    /// Pieces of a later outer step are refused ([`StateAssembly::set_ceiling`]).
    ceiling: u64,
    /// The state the members vouch for ([`StateAssembly::set_vouched`]).
    vouched: Option<Held>,
    /// Replicated copies refused as not the state vouched for: `(outer step, digest)`.
    refused_copies: BTreeSet<(u64, Option<Blake3Digest>)>,
}

impl std::fmt::Debug for StateAssembly {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // A summary: the buffers may be gigabytes.
        f.debug_struct("StateAssembly")
            .field("epoch", &self.epoch)
            .field("senders", &self.senders)
            .field("blocking", &self.blocking)
            .field("expect", &self.expect)
            .field("shared_step", &self.shared.as_ref().map(|c| c.outer_step))
            .field("shared_held", &self.shared_held())
            .field("own_held", &self.own.iter().map(|(s, c)| (*s, c.held)).collect::<Vec<_>>())
            .field("pending", &self.pending.len())
            .finish()
    }
}

impl StateAssembly {
    /// A fetch from `senders`, assigned at `epoch`. `blocking`: the senders share one frozen
    /// state (the mesh waits); otherwise each sends a whole copy of its latest state.
    pub fn new(epoch: Epoch, senders: Vec<NodeId>, blocking: bool, expect: Expect) -> Self {
        StateAssembly {
            first_epoch: epoch,
            epoch,
            ever: senders.iter().copied().collect(),
            senders,
            blocking,
            shared: None,
            shared_floor: 0,
            own: BTreeMap::new(),
            pending: EarlyPieces::new(expect.hold_bytes),
            expect,
            spare: None,
            ceiling: u64::MAX,
            vouched: None,
            refused_copies: BTreeSet::new(),
        }
    }

    /// The state the members vouch for ([`Held`]): a complete state of another outer step or
    /// other weights fails verification ([`Received::verify`]). `None`: any.
    pub fn set_vouched(&mut self, vouched: Option<Held>) {
        self.vouched = vouched;
    }

    /// Refuses pieces of a state beyond outer step `ceiling` from now on (the mesh's step as
    /// this node knows it, plus the one commit a sender can be ahead of it).
    pub fn set_ceiling(&mut self, ceiling: u64) {
        self.ceiling = ceiling;
    }

    /// Lends the replicated part's buffers: outer weights and momentum the joiner holds anyway
    /// (its own outer state, which the one received replaces). The first replicated copy is
    /// written into them instead of memory allocated (and first touched) for it. Ignored
    /// unless they have the expected parameter count.
    pub fn lend(&mut self, outer: Vec<f32>, momentum: Vec<f32>) {
        let n = outer.len() as u64;
        if self.expect.virtual_bodies || encoded_len(n) != self.expect.shared_len {
            return;
        }
        self.spare = PartBytes::shared_from(outer, momentum);
    }

    /// Takes back the buffers lent, from wherever they are (unused, or holding a replicated
    /// copy not handed out): for a fetch that ends without its state. Their values are
    /// whatever was written into them.
    pub fn reclaim(&mut self) -> Option<[Vec<f32>; 2]> {
        if let Some(s) = self.spare.take() {
            return s.into_floats().ok();
        }
        let c = self.shared.take_if(|c| matches!(c.data, Data::Bytes(_)))?;
        match c.data {
            Data::Bytes(b) => b.into_floats().ok(),
            Data::Virtual | Data::Taken => None,
        }
    }

    /// The epoch of the current assignment.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// The current senders, the first of which sends the own part.
    pub fn senders(&self) -> &[NodeId] {
        &self.senders
    }

    /// Blocking mode.
    pub fn blocking(&self) -> bool {
        self.blocking
    }

    /// The lengths this assembly accepts.
    pub fn expect(&self) -> Expect {
        self.expect
    }

    /// Bytes of the replicated part held, of [`Expect::shared_len`].
    pub fn shared_held(&self) -> u64 {
        self.shared.as_ref().map_or(0, |c| c.held)
    }

    /// Bytes held of both parts (every own copy counted).
    pub fn held_bytes(&self) -> u64 {
        self.own.values().fold(self.shared_held(), |a, c| a.saturating_add(c.held))
    }

    /// Pieces held for an assignment not known yet.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// The byte ranges not held, `(part, start, end)`, at most [`StateAsk::MAX_RANGES`]: what
    /// to ask the senders for again. The replicated copy's gaps (all of it when none is held);
    /// the own part's gaps in the current first sender's copy (all of it when none is held),
    /// unless a complete own copy is held. Nothing of a copy handed out for verification.
    pub fn missing(&self) -> Vec<(u32, u64, u64)> {
        let mut out = Vec::new();
        match &self.shared {
            None => out.push((PART_SHARED, 0, self.expect.shared_len)),
            Some(c) if !c.taken() => c.gaps(PART_SHARED, &mut out),
            Some(_) => {}
        }
        if self.pick_own().is_none() && !self.own.values().any(PartCopy::taken) {
            match self.senders.first().and_then(|f| self.own.get(f)) {
                Some(c) => c.gaps(PART_OWN, &mut out),
                None => out.push((PART_OWN, 0, u64::MAX)),
            }
        }
        if out.len() > StateAsk::MAX_RANGES {
            // Too many gaps to name: one range per part, from its first gap to its last.
            let mut merged: Vec<(u32, u64, u64)> = Vec::new();
            for (part, lo, hi) in out {
                match merged.iter_mut().find(|m| m.0 == part) {
                    Some(m) => (m.1, m.2) = (m.1.min(lo), m.2.max(hi)),
                    None => merged.push((part, lo, hi)),
                }
            }
            out = merged;
        }
        out
    }

    /// True when a replicated copy and an own copy are complete and not handed out.
    pub fn is_complete(&self) -> bool {
        self.shared.as_ref().is_some_and(PartCopy::available) && self.pick_own().is_some()
    }

    /// A new assignment (a sender died). Ignored when `epoch` is older than the current one.
    /// Every piece of the replicated part is kept; incomplete own copies of senders no longer
    /// named are dropped; pieces held for this assignment are fed.
    pub fn reassign(&mut self, epoch: Epoch, senders: Vec<NodeId>) -> Reassigned {
        if epoch < self.epoch {
            return Reassigned { kept_bytes: self.held_bytes(), ..Reassigned::default() };
        }
        self.epoch = epoch;
        self.ever.extend(senders.iter().copied());
        let mut dropped_bytes = 0u64;
        self.own.retain(|s, c| {
            let keep = senders.contains(s) || c.complete();
            if !keep {
                dropped_bytes = dropped_bytes.saturating_add(c.held);
            }
            keep
        });
        self.senders = senders;
        let kept_bytes = self.held_bytes();
        let pending = self.pending.take();
        let fed = self.feed_all(pending);
        Reassigned { kept_bytes, dropped_bytes, fed }
    }

    /// Feeds pieces kept before this assembly was made.
    pub fn feed(&mut self, early: &mut EarlyPieces) -> Fed {
        self.feed_all(early.take())
    }

    fn feed_all(&mut self, pieces: Vec<(NodeId, StateHeader, Body)>) -> Fed {
        let mut fed = Fed::default();
        for (from, h, b) in pieces {
            match self.put(from, &h, &b) {
                Ok(Progress::Held) => fed.held += 1,
                Ok(_) => fed.stored += 1,
                Err(e) => fed.refused.push(e),
            }
        }
        fed.complete = self.is_complete();
        fed
    }

    fn check(&self, h: &StateHeader, body: &Body) -> Result<(), Refused> {
        let part = h.part;
        if part > PART_OWN {
            return Err(Refused::BadPart { part });
        }
        match (self.expect.virtual_bodies, body) {
            (true, Body::Bytes(_)) => return Err(Refused::UnexpectedBytes),
            (false, Body::Virtual(_)) => return Err(Refused::UnexpectedVirtual),
            _ => {}
        }
        if part == PART_SHARED && h.total != self.expect.shared_len {
            return Err(Refused::SharedTotal { got: h.total, expected: self.expect.shared_len });
        }
        if part == PART_OWN && h.total > self.expect.own_max {
            return Err(Refused::OwnTotal { got: h.total, max: self.expect.own_max });
        }
        let len = body.len();
        if h.offset.checked_add(len).is_none_or(|end| end > h.total) {
            return Err(Refused::OutOfRange { part, offset: h.offset, len, total: h.total });
        }
        if len == 0 && h.total > 0 {
            return Err(Refused::EmptyPiece { part, total: h.total });
        }
        if h.epoch < self.first_epoch {
            return Err(Refused::OldEpoch { got: h.epoch, first: self.first_epoch });
        }
        Ok(())
    }

    fn assigned(&self, from: NodeId, part: u32) -> bool {
        let named =
            if self.blocking { self.ever.contains(&from) } else { self.senders.contains(&from) };
        named
            && (part == PART_SHARED
                || self.senders.first() == Some(&from)
                || self.own.contains_key(&from))
    }

    /// Takes one piece from `from`, by the rules in the [type's docs](StateAssembly).
    pub fn put(&mut self, from: NodeId, h: &StateHeader, body: &Body) -> Result<Progress, Refused> {
        self.check(h, body)?;
        if !self.assigned(from, h.part) {
            if h.epoch > self.epoch {
                self.pending.hold(from, h.clone(), body.clone())?;
                return Ok(Progress::Held);
            }
            return Err(Refused::NotAssigned { from, part: h.part });
        }
        if h.outer_step > self.ceiling {
            let (part, got, ceiling) = (h.part, h.outer_step, self.ceiling);
            return Err(Refused::FutureStep { part, got, ceiling });
        }
        // The bytes are checked against the digest their sender computed before anything is
        // stored (an unassigned sender cannot make the joiner hash).
        if let Body::Bytes(b) = body
            && piece_digest(b) != h.piece
        {
            return Err(Refused::PieceDigest { part: h.part, offset: h.offset, len: body.len() });
        }
        if h.part == PART_SHARED && self.refused_copies.contains(&(h.outer_step, h.digest)) {
            return Err(Refused::RefusedCopy { got: h.outer_step });
        }
        let stored = if h.part == PART_SHARED {
            put_into(&mut self.shared, self.shared_floor, false, h, body, &mut self.spare)?
        } else {
            let mut slot = self.own.remove(&from);
            let r = put_into(&mut slot, 0, true, h, body, &mut None);
            if let Some(c) = slot {
                self.own.insert(from, c);
            }
            r?
        };
        Ok(match stored {
            None => Progress::Duplicate,
            Some(restarted) => Progress::Stored { restarted, complete: self.is_complete() },
        })
    }

    fn pick_own(&self) -> Option<NodeId> {
        let first = self.senders.first().filter(|f| self.own.get(f).is_some_and(|c| c.available()));
        first.copied().or_else(|| self.own.iter().find(|(_, c)| c.available()).map(|(&s, _)| s))
    }

    /// Hands out a complete state for verification ([`Received::verify`]): the replicated part
    /// and one own part (the current first sender's when complete). Its copies stay marked as
    /// handed out: give a failure back with [`retry`](Self::retry). Pieces of a newer state
    /// may meanwhile start a newer copy. `None` until both parts are complete.
    pub fn take_complete(&mut self) -> Option<Received> {
        let own_from = self.pick_own()?;
        let shared = self.shared.as_mut().filter(|c| c.available())?.take();
        let own = self.own.get_mut(&own_from)?.take();
        Some(Received { shared, own, own_from, vouched: self.vouched })
    }

    /// Gives back a state that failed verification: the parts that were right are kept, the
    /// copies that were wrong are dropped (their pieces are taken again; a replicated copy older
    /// than the one that failed is still refused). Parts of copies replaced meanwhile by newer
    /// ones are dropped. Returns whether a complete state is ready again.
    pub fn retry(&mut self, failed: VerifyFailed) -> bool {
        let VerifyFailed { shared, own, own_from } = failed;
        let v = self.expect.virtual_bodies;
        match shared {
            Ok(p) => {
                if let Some(c) = self.shared.as_mut() {
                    let ours = c.taken() && c.is(p.outer_step, p.digest);
                    if ours && !c.restore(p, v) {
                        self.shared = None;
                    }
                }
            }
            Err(r) => {
                if matches!(r.fault, super::PartFault::NotVouched { .. }) {
                    self.refused_copies.insert((r.outer_step, r.digest));
                }
                if self.shared.as_ref().is_some_and(|c| c.taken() && c.is(r.outer_step, r.digest)) {
                    self.shared = None;
                    self.shared_floor = self.shared_floor.max(r.outer_step);
                }
            }
        }
        if let Some(c) = self.own.get_mut(&own_from) {
            let keep = match own {
                Ok(p) => !(c.taken() && c.is(p.outer_step, p.digest)) || c.restore(p, v),
                Err(r) => !(c.taken() && c.is(r.outer_step, r.digest)),
            };
            if !keep {
                self.own.remove(&own_from);
            }
        }
        self.is_complete()
    }
}

#[cfg(test)]
mod tests;
