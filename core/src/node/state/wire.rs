//! The one encoding of the replicated state, and the one digest of a state part.
//!
//! Layout (all little-endian), [`encoded_len`]`(n)` bytes:
//!
//! | bytes               | field                                   |
//! |---------------------|-----------------------------------------|
//! | `0..8`              | [`SHARED_MAGIC`] (format and version)   |
//! | `8..16`             | `outer_steps`, u64                      |
//! | `16..24`            | `n`, the parameter count, u64           |
//! | `24..24+4n`         | the outer weights, `n` f32              |
//! | `24+4n..24+8n`      | the outer momentum, `n` f32             |
//!
//! Every field sits at an offset known from `n` alone, so a sender can later produce any piece
//! straight from its buffers, without a serialisation pass.

use super::format::{SHARED_HEADER_LEN, SHARED_MAGIC, encoded_len, segments_digest};
use super::part::PartBytes;
use super::plan::{PieceRule, pieces};
use crate::digest::Blake3Digest;
use crate::diloco::{Bucket, DilocoError, OuterConfig, OuterState};
use bytes::Bytes;
use std::sync::Arc;

/// Errors of decoding a state and of replaying steps onto one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    /// Fewer bytes than the layout needs.
    #[error("state of {got} bytes is truncated: the layout needs {need}")]
    Truncated {
        /// Bytes the layout needs.
        need: u64,
        /// Bytes given.
        got: u64,
    },
    /// The bytes do not start with [`SHARED_MAGIC`].
    #[error("not a loco state of this version (magic {got:02x?})")]
    BadMagic {
        /// The first 8 bytes.
        got: [u8; 8],
    },
    /// The state is of another model size.
    #[error("state holds {got} parameters, this node's model has {expected}")]
    WrongParams {
        /// This node's parameter count.
        expected: u64,
        /// The count in the bytes.
        got: u64,
    },
    /// Bytes after the end of the layout.
    #[error("state has {extra} bytes after its end")]
    Trailing {
        /// How many.
        extra: u64,
    },
    /// Outer weights and momentum of different lengths.
    #[error("outer weights ({outer}) and momentum ({momentum}) differ in length")]
    Mismatched {
        /// Outer weights.
        outer: usize,
        /// Momentum.
        momentum: usize,
    },
    /// The replay log lacks the first step the state needs.
    #[error("replay needs outer step {need}, but the log's next step is {next}")]
    Gap {
        /// The state's outer step count (the step to apply next).
        need: u64,
        /// The first step the log holds at or after it.
        next: u64,
    },
    /// A logged pseudo-gradient of another length than the state.
    #[error("replay of outer step {step}: {got} values, the state has {expected}")]
    ReplayLength {
        /// The logged step.
        step: u64,
        /// The state's parameter count.
        expected: usize,
        /// The logged length.
        got: usize,
    },
}

/// The BLAKE3 digest of one piece of a part, as its sender computed it from its buffers: the
/// joiner checks each piece against it on arrival.
pub type PieceDigest = Blake3Digest;

/// The digest of a part sent as pieces: BLAKE3 of a fixed tag, the part's length, then
/// each piece's offset, length and [`PieceDigest`] in the order of their offsets. A joiner that
/// verified every piece on arrival knows the part's digest without reading its bytes again, and
/// each sender hashes only the pieces it sends (or none, when it prepared them ahead).
pub fn part_digest(
    total: u64,
    pieces: impl IntoIterator<Item = (u64, u64, PieceDigest)>,
) -> Blake3Digest {
    let mut h = blake3::Hasher::new();
    h.update(b"locoPD01");
    h.update(&total.to_le_bytes());
    for (offset, len, d) in pieces {
        h.update(&offset.to_le_bytes());
        h.update(&len.to_le_bytes());
        h.update(d.as_bytes());
    }
    Blake3Digest::from_blake3(&h.finalize())
}

/// The digest of one piece's bytes.
pub fn piece_digest(bytes: &[u8]) -> PieceDigest {
    Blake3Digest::from_blake3(&blake3::hash(bytes))
}

/// Every piece's digest of a part cut by one grid, and the part's [`part_digest`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartDigests {
    /// The part's length.
    pub total: u64,
    /// The grid's piece length ([`PieceRule::piece_len`] of `total`).
    pub piece_len: u64,
    /// Each grid piece's digest, in order.
    pub pieces: Vec<PieceDigest>,
    /// [`part_digest`] of the grid; `None` for a virtual part.
    pub digest: Option<Blake3Digest>,
}

impl PartDigests {
    /// The digests of `bytes` cut by `rule`, its pieces hashed in parallel on the thread pool.
    pub fn of(bytes: &Segments, rule: PieceRule) -> PartDigests {
        use rayon::prelude::*;
        let total = bytes.len();
        let grid: Vec<std::ops::Range<u64>> = pieces(total, 1, 0, rule).collect();
        let digests: Vec<PieceDigest> =
            grid.par_iter().map(|r| piece_digest(&bytes.slice(r.clone()))).collect();
        let digest = part_digest(
            total,
            grid.iter().zip(&digests).map(|(r, d)| (r.start, r.end - r.start, *d)),
        );
        PartDigests {
            total,
            piece_len: rule.piece_len(total),
            pieces: digests,
            digest: Some(digest),
        }
    }

    /// A virtual part's stand-in (lengths only, no digests): it marks that the part's
    /// digests were computed, for a simulator to charge as the real bytes would be.
    pub fn virtual_len(total: u64, rule: PieceRule) -> PartDigests {
        PartDigests { total, piece_len: rule.piece_len(total), pieces: vec![], digest: None }
    }

    /// Whether these are the digests of a part of `total` bytes cut by `rule`.
    pub fn fits(&self, total: u64, rule: PieceRule) -> bool {
        self.total == total && self.piece_len == rule.piece_len(total)
    }

    /// The digest of the grid piece that starts at `offset`, if there is one.
    pub fn piece_at(&self, offset: u64) -> Option<PieceDigest> {
        let i = usize::try_from(offset.checked_div(self.piece_len)?).ok()?;
        offset.is_multiple_of(self.piece_len).then(|| self.pieces.get(i).copied()).flatten()
    }
}

/// A part's bytes as consecutive buffers, as they lie in memory (an encoded header, then the
/// values' own buffers): sent piece by piece without first copying them into one.
#[derive(Clone, Debug, Default)]
pub struct Segments {
    /// Each buffer with its offset in the part.
    bufs: Vec<(u64, Bytes)>,
    len: u64,
}

impl Segments {
    /// The concatenation of `bufs`.
    pub fn new(bufs: impl IntoIterator<Item = Bytes>) -> Segments {
        let mut out = Segments::default();
        for b in bufs {
            let n = b.len() as u64;
            out.bufs.push((out.len, b));
            out.len = out.len.saturating_add(n);
        }
        out
    }

    /// Total bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The digest of the whole ([`state_digest`](super::state_digest) of the concatenation).
    pub fn digest(&self) -> Blake3Digest {
        segments_digest(self.bufs.iter().map(|(_, b)| b.as_ref()))
    }

    /// The bytes of `range` (clamped to the whole): a slice of one buffer when it lies within
    /// one (no copy), else a copy of the pieces of the buffers it spans.
    pub fn slice(&self, range: std::ops::Range<u64>) -> Bytes {
        let (lo, hi) = (range.start.min(self.len), range.end.min(self.len));
        if lo >= hi {
            return Bytes::new();
        }
        // The last buffer starting at or before `lo`.
        let first = self.bufs.partition_point(|(start, _)| *start <= lo).saturating_sub(1);
        let mut out = Vec::new();
        for (start, b) in &self.bufs[first..] {
            let end = start + b.len() as u64;
            if *start >= hi {
                break;
            }
            let (a, z) = (lo.max(*start) - start, hi.min(end) - start);
            if a >= z {
                continue;
            }
            let piece = b.slice(a as usize..z as usize);
            if out.is_empty() && lo >= *start && hi <= end {
                return piece; // within one buffer
            }
            out.extend_from_slice(&piece);
        }
        Bytes::from(out)
    }
}

/// The bytes of `v` in the encoding's order (little-endian): on a little-endian machine the
/// vector's own memory, shared, not copied.
fn le_bytes(v: Arc<Vec<f32>>) -> Bytes {
    #[cfg(target_endian = "little")]
    {
        struct Floats(Arc<Vec<f32>>);
        impl AsRef<[u8]> for Floats {
            fn as_ref(&self) -> &[u8] {
                bytemuck::cast_slice(&self.0)
            }
        }
        Bytes::from_owner(Floats(v))
    }
    #[cfg(not(target_endian = "little"))]
    {
        Bytes::from(v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())
    }
}

/// The replicated part of the training state: the same on every member (their outer states are
/// bit-identical), so several senders can each send a share of its bytes. Its buffers are
/// shared with the [`OuterState`] it was taken from, which copies them before it changes them.
#[derive(Clone, Debug, PartialEq)]
pub struct SharedState {
    outer_steps: u64,
    outer: Arc<Vec<f32>>,
    momentum: Arc<Vec<f32>>,
}

impl SharedState {
    /// A state; the two vectors must be of one length.
    pub fn new(
        outer_steps: u64,
        outer: Vec<f32>,
        momentum: Vec<f32>,
    ) -> Result<SharedState, StateError> {
        if outer.len() != momentum.len() {
            return Err(StateError::Mismatched { outer: outer.len(), momentum: momentum.len() });
        }
        Ok(SharedState { outer_steps, outer: Arc::new(outer), momentum: Arc::new(momentum) })
    }

    /// A snapshot of the replicated part of `o`, without copying it: the buffers are shared,
    /// and `o`'s next outer step copies those still shared before it writes.
    pub fn from_outer(o: &OuterState) -> SharedState {
        let [outer, momentum] = o.shared_buffers();
        SharedState { outer_steps: o.steps(), outer, momentum }
    }

    /// The outer state this restores (zero pseudo-gradient), moving the buffers.
    pub fn into_outer(
        self,
        cfg: OuterConfig,
        buckets: Vec<Bucket>,
    ) -> Result<OuterState, DilocoError> {
        OuterState::restore(cfg, self.outer, self.momentum, buckets, self.outer_steps)
    }

    /// Outer steps applied.
    pub fn outer_steps(&self) -> u64 {
        self.outer_steps
    }

    /// Outer weights.
    pub fn outer(&self) -> &[f32] {
        &self.outer
    }

    /// Outer momentum.
    pub fn momentum(&self) -> &[f32] {
        &self.momentum
    }

    /// Number of parameters.
    pub fn len(&self) -> usize {
        self.outer.len()
    }

    /// True for a model with no parameters.
    pub fn is_empty(&self) -> bool {
        self.outer.is_empty()
    }

    /// `(outer_steps, outer, momentum)`, moved out (copied only where still shared).
    pub fn into_parts(self) -> (u64, Vec<f32>, Vec<f32>) {
        (self.outer_steps, Arc::unwrap_or_clone(self.outer), Arc::unwrap_or_clone(self.momentum))
    }

    /// The encoding as [`Segments`]: its header, then the outer weights' and the momentum's own
    /// buffers, shared (no copy of the values on a little-endian machine).
    pub fn into_segments(self) -> Segments {
        let mut header = Vec::with_capacity(SHARED_HEADER_LEN as usize);
        header.extend_from_slice(&SHARED_MAGIC);
        header.extend_from_slice(&self.outer_steps.to_le_bytes());
        header.extend_from_slice(&(self.outer.len() as u64).to_le_bytes());
        Segments::new([Bytes::from(header), le_bytes(self.outer), le_bytes(self.momentum)])
    }

    /// The encoding ([`encoded_len`]`(n)` bytes).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_into(&mut out);
        out
    }

    /// Appends the encoding to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        write(self.outer_steps, &self.outer, &self.momentum, out);
    }

    /// Reads an encoding of exactly `expect_n` parameters. Every length is checked before
    /// anything is allocated; malformed bytes give an error, never a panic.
    pub fn decode(bytes: &[u8], expect_n: usize) -> Result<SharedState, StateError> {
        let steps = check_header(bytes, bytes.len() as u64, expect_n)?;
        // From here `bytes` is exactly 24 + 8n long, n == expect_n.
        let floats = bytes.get(SHARED_HEADER_LEN as usize..).unwrap_or_default();
        let (outer, momentum) = floats.split_at(floats.len() / 2);
        Ok(SharedState {
            outer_steps: steps,
            outer: Arc::new(read_f32s(outer)),
            momentum: Arc::new(read_f32s(momentum)),
        })
    }
}

impl SharedState {
    /// Checks the encoding held in `bytes` for a model of `expect_n` parameters (magic, count,
    /// exact length) and gives its outer step count, without reading the values.
    pub fn check_part(bytes: &PartBytes, expect_n: usize) -> Result<u64, StateError> {
        let mut head = Vec::with_capacity(SHARED_HEADER_LEN as usize);
        bytes.for_each(0..SHARED_HEADER_LEN as usize, |s| head.extend_from_slice(s));
        check_header(&head, bytes.len() as u64, expect_n)
    }

    /// The state in `bytes`: held as the vectors it decodes to, they are moved; else decoded.
    /// `None` when [`check_part`](Self::check_part) would fail.
    pub fn from_part(bytes: PartBytes, expect_n: usize) -> Option<SharedState> {
        let outer_steps = SharedState::check_part(&bytes, expect_n).ok()?;
        match bytes.into_floats() {
            Ok([outer, momentum]) => Some(SharedState {
                outer_steps,
                outer: Arc::new(outer),
                momentum: Arc::new(momentum),
            }),
            Err(bytes) => SharedState::decode(&bytes.into_vec(), expect_n).ok(),
        }
    }
}

/// Checks an encoding's header (`head`: its first bytes) and its length `got` for a model of
/// `expect_n` parameters; gives its outer step count.
fn check_header(head: &[u8], got: u64, expect_n: usize) -> Result<u64, StateError> {
    let (Some(magic), Some(steps), Some(n)) = (
        head.get(0..8).and_then(|b| <[u8; 8]>::try_from(b).ok()),
        head.get(8..16).and_then(|b| <[u8; 8]>::try_from(b).ok()),
        head.get(16..24).and_then(|b| <[u8; 8]>::try_from(b).ok()),
    ) else {
        return Err(StateError::Truncated { need: SHARED_HEADER_LEN, got });
    };
    if magic != SHARED_MAGIC {
        return Err(StateError::BadMagic { got: magic });
    }
    let n = u64::from_le_bytes(n);
    if n != expect_n as u64 {
        return Err(StateError::WrongParams { expected: expect_n as u64, got: n });
    }
    let need = encoded_len(n);
    if got < need {
        return Err(StateError::Truncated { need, got });
    }
    if got > need {
        return Err(StateError::Trailing { extra: got - need });
    }
    Ok(u64::from_le_bytes(steps))
}

/// Copies little-endian floats from `src` (4 bytes each) into `dst`.
fn fill_f32s(dst: &mut [f32], src: &[u8]) {
    #[cfg(target_endian = "little")]
    {
        let n = dst.len() * 4;
        bytemuck::cast_slice_mut::<f32, u8>(dst).copy_from_slice(&src[..n]);
    }
    #[cfg(not(target_endian = "little"))]
    for (x, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *x = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
}

/// The encoding of `o`'s replicated part, without an intermediate [`SharedState`].
pub fn encode_outer_state(o: &OuterState) -> Vec<u8> {
    let mut out = Vec::new();
    write(o.steps(), o.outer(), o.momentum(), &mut out);
    out
}

fn write(outer_steps: u64, outer: &[f32], momentum: &[f32], out: &mut Vec<u8>) {
    debug_assert_eq!(outer.len(), momentum.len());
    let n = outer.len() as u64;
    out.reserve(usize::try_from(encoded_len(n)).unwrap_or(0));
    out.extend_from_slice(&SHARED_MAGIC);
    out.extend_from_slice(&outer_steps.to_le_bytes());
    out.extend_from_slice(&n.to_le_bytes());
    #[cfg(target_endian = "little")]
    for v in [outer, momentum] {
        out.extend_from_slice(bytemuck::cast_slice(v));
    }
    #[cfg(not(target_endian = "little"))]
    for x in outer.iter().chain(momentum) {
        out.extend_from_slice(&x.to_le_bytes());
    }
}

fn read_f32s(b: &[u8]) -> Vec<f32> {
    let mut v = vec![0f32; b.len() / 4];
    fill_f32s(&mut v, b);
    v
}

#[cfg(test)]
mod tests {
    use super::super::format::{PARALLEL_DIGEST_BYTES, state_digest};
    use super::*;
    use proptest::prelude::*;

    fn sample() -> SharedState {
        SharedState::new(7, vec![1.0, -2.5, f32::NAN, -0.0], vec![0.5, 0.0, -1.0, f32::INFINITY])
            .unwrap()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn round_trip_is_bit_exact_and_of_the_stated_length() {
        let s = sample();
        let b = s.encode();
        assert_eq!(b.len() as u64, encoded_len(4));
        assert_eq!(&b[..8], &SHARED_MAGIC);
        assert_eq!(u64::from_le_bytes(b[8..16].try_into().unwrap()), 7);
        assert_eq!(u64::from_le_bytes(b[16..24].try_into().unwrap()), 4);
        // The floats sit where the layout says: outer at 24, momentum at 24 + 4n.
        assert_eq!(&b[24..28], &1.0f32.to_le_bytes());
        assert_eq!(&b[40..44], &0.5f32.to_le_bytes());
        let d = SharedState::decode(&b, 4).unwrap();
        assert_eq!(d.outer_steps(), 7);
        assert_eq!(bits(d.outer()), bits(s.outer()));
        assert_eq!(bits(d.momentum()), bits(s.momentum()));
        let empty = SharedState::new(0, vec![], vec![]).unwrap();
        assert_eq!(SharedState::decode(&empty.encode(), 0).unwrap(), empty);
    }

    #[test]
    fn segments_are_the_encoding_without_the_copy() {
        let s = sample();
        let seg = s.clone().into_segments();
        assert_eq!(seg.len(), encoded_len(4));
        assert_eq!(seg.slice(0..seg.len()).as_ref(), s.encode().as_slice());
        assert_eq!(seg.digest(), state_digest(&s.encode()));
        // A long part: the parallel digest is the serial one.
        let n = 300_000;
        let big = SharedState::new(1, vec![0.25; n], (0..n).map(|i| i as f32).collect()).unwrap();
        let enc = big.encode();
        assert!(enc.len() >= PARALLEL_DIGEST_BYTES);
        assert_eq!(big.into_segments().digest().to_string(), blake3::hash(&enc).to_hex().as_str());
    }

    /// A part's digests name each grid piece (by its offset only) and the part; another grid
    /// or another byte gives another part digest.
    #[test]
    fn part_digests_name_every_piece_and_the_part() {
        let n = 300_000;
        let big = SharedState::new(1, vec![0.25; n], (0..n).map(|i| i as f32).collect()).unwrap();
        let seg = big.into_segments();
        let rule = PieceRule::Clamped;
        let d = PartDigests::of(&seg, rule);
        let grid: Vec<_> = pieces(seg.len(), 1, 0, rule).collect();
        assert!(grid.len() > 8);
        assert_eq!(d.pieces.len(), grid.len());
        for r in &grid {
            assert_eq!(d.piece_at(r.start), Some(piece_digest(&seg.slice(r.clone()))));
        }
        assert_eq!(d.piece_at(1), None, "not a piece's start");
        assert_eq!(d.piece_at(d.piece_len * grid.len() as u64), None, "beyond the part");
        let listed =
            grid.iter().map(|r| (r.start, r.end - r.start, piece_digest(&seg.slice(r.clone()))));
        assert_eq!(d.digest, Some(part_digest(seg.len(), listed)));
        assert!(d.fits(seg.len(), rule) && !d.fits(seg.len(), PieceRule::Count(3)));
        assert_ne!(PartDigests::of(&seg, PieceRule::Count(3)).digest, d.digest);
        let mut other = seg.slice(0..seg.len()).to_vec();
        other[100] ^= 1;
        assert_ne!(PartDigests::of(&Segments::new([Bytes::from(other)]), rule).digest, d.digest);
    }

    /// Decoding a part held in one vector or as floats gives what decoding the whole gives;
    /// checks refuse what `decode` refuses.
    #[test]
    fn a_part_decodes_as_the_whole_does() {
        let s =
            SharedState::new(9, (0..37).map(|i| i as f32 - 3.5).collect(), vec![-0.5; 37]).unwrap();
        let enc = s.encode();
        for mut p in [PartBytes::zeroed(enc.len()), PartBytes::shared(37)] {
            assert!(p.write(0, &enc));
            assert_eq!(SharedState::check_part(&p, 37), Ok(9));
            assert!(matches!(
                SharedState::check_part(&p, 36),
                Err(StateError::WrongParams { expected: 36, got: 37 })
            ));
            assert_eq!(SharedState::from_part(p, 37), Some(s.clone()));
        }
        let mut bad = PartBytes::from(enc.clone());
        assert!(bad.write(0, b"notloco!"));
        assert!(matches!(SharedState::check_part(&bad, 37), Err(StateError::BadMagic { .. })));
        assert_eq!(SharedState::from_part(bad, 37), None);
        let short = PartBytes::from(enc[..enc.len() - 4].to_vec());
        assert!(matches!(SharedState::check_part(&short, 37), Err(StateError::Truncated { .. })));
        let tiny = PartBytes::from(enc[..10].to_vec());
        assert!(matches!(SharedState::check_part(&tiny, 37), Err(StateError::Truncated { .. })));
    }

    proptest! {
        /// Any range of segments is the same range of their concatenation, whichever buffers
        /// it spans.
        #[test]
        fn a_slice_of_segments_is_the_slice_of_their_concatenation(
            bufs in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 0..6),
            a in 0u64..200, b in 0u64..200,
        ) {
            let whole: Vec<u8> = bufs.concat();
            let seg = Segments::new(bufs.into_iter().map(Bytes::from));
            prop_assert_eq!(seg.len(), whole.len() as u64);
            let (lo, hi) = (a.min(b), a.max(b));
            let want = &whole[(lo as usize).min(whole.len())..(hi as usize).min(whole.len())];
            let got = seg.slice(lo..hi);
            prop_assert_eq!(got.as_ref(), want);
            prop_assert_eq!(seg.digest(), state_digest(&whole));
        }
    }

    #[test]
    fn encode_outer_state_equals_the_shared_state_encoding() {
        let mut o = OuterState::new(OuterConfig::default(), vec![1.0, 2.0, 3.0], vec![]).unwrap();
        o.pseudo_gradient_mut().copy_from_slice(&[0.1, 0.2, 0.3]);
        o.apply_outer_step();
        let s = SharedState::from_outer(&o);
        assert_eq!(encode_outer_state(&o), s.encode());
        let back = s.into_outer(o.config(), vec![]).unwrap();
        assert_eq!(back.outer(), o.outer());
        assert_eq!(back.momentum(), o.momentum());
        assert_eq!(back.steps(), 1);
    }

    /// A sender's snapshot copies nothing, and stays what it was when the outer step that
    /// follows changes the node's state (that step copies the shared buffers, and only those).
    #[test]
    fn a_snapshot_is_free_and_the_next_outer_step_copies_on_write() {
        let mut o = OuterState::new(OuterConfig::default(), vec![1.0, 2.0, 3.0], vec![]).unwrap();
        o.pseudo_gradient_mut().copy_from_slice(&[0.1, 0.2, 0.3]);
        o.apply_outer_step();
        let (w0, m0) = (o.outer().as_ptr(), o.momentum().as_ptr());
        let snap = SharedState::from_outer(&o);
        assert_eq!((snap.outer().as_ptr(), snap.momentum().as_ptr()), (w0, m0));
        let before = snap.encode();
        let segments = snap.clone().into_segments();
        o.pseudo_gradient_mut().copy_from_slice(&[1.0, 1.0, 1.0]);
        o.apply_outer_step();
        assert_ne!(o.outer().as_ptr(), w0, "the step wrote into the snapshot's buffer");
        assert_eq!(snap.encode(), before);
        assert_eq!(segments.slice(0..segments.len()).as_ref(), before.as_slice());
        assert_ne!(encode_outer_state(&o), before);
        // With no snapshot left, a step writes in place.
        drop((snap, segments));
        let w1 = o.outer().as_ptr();
        o.apply_outer_step();
        assert_eq!(o.outer().as_ptr(), w1);
    }

    #[test]
    fn every_malformed_input_is_refused() {
        let b = sample().encode();
        assert_eq!(
            SharedState::decode(&b[..10], 4),
            Err(StateError::Truncated { need: 24, got: 10 })
        );
        let mut bad = b.clone();
        bad[0] ^= 1;
        assert!(matches!(SharedState::decode(&bad, 4), Err(StateError::BadMagic { .. })));
        assert_eq!(
            SharedState::decode(&b, 5),
            Err(StateError::WrongParams { expected: 5, got: 4 })
        );
        assert_eq!(
            SharedState::decode(&b[..b.len() - 1], 4),
            Err(StateError::Truncated { need: 56, got: 55 })
        );
        let mut long = b.clone();
        long.push(0);
        assert_eq!(SharedState::decode(&long, 4), Err(StateError::Trailing { extra: 1 }));
        // A huge count in the header is refused before anything is allocated.
        let mut huge = b[..24].to_vec();
        huge[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            SharedState::decode(&huge, usize::MAX),
            Err(StateError::Truncated { need: u64::MAX, .. })
        ));
        assert_eq!(
            SharedState::new(0, vec![1.0], vec![]),
            Err(StateError::Mismatched { outer: 1, momentum: 0 })
        );
    }

    #[test]
    fn digest_is_full_length_blake3() {
        let d = state_digest(b"abc");
        assert_eq!(d.to_string().len(), 64);
        assert_eq!(d.to_string(), blake3::hash(b"abc").to_hex().as_str());
        assert_ne!(d, state_digest(b"abd"));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic_decode(
            b in proptest::collection::vec(any::<u8>(), 0..200),
            n in 0usize..30,
            magic in any::<bool>(),
            count in any::<bool>(),
        ) {
            let mut b = b;
            if magic && b.len() >= 8 {
                b[..8].copy_from_slice(&SHARED_MAGIC);
            }
            if count && b.len() >= 24 {
                b[16..24].copy_from_slice(&(n as u64).to_le_bytes());
            }
            if let Ok(s) = SharedState::decode(&b, n) {
                prop_assert_eq!(s.len(), n);
                prop_assert_eq!(s.encode(), b);
            }
        }

        #[test]
        fn round_trip(steps in any::<u64>(), v in proptest::collection::vec(any::<u32>(), 0..64)) {
            let outer: Vec<f32> = v.iter().map(|&x| f32::from_bits(x)).collect();
            let momentum: Vec<f32> = v.iter().map(|&x| f32::from_bits(x.rotate_left(7))).collect();
            let s = SharedState::new(steps, outer, momentum).unwrap();
            let d = SharedState::decode(&s.encode(), v.len()).unwrap();
            prop_assert_eq!(d.outer_steps(), steps);
            prop_assert_eq!(bits(d.outer()), bits(s.outer()));
            prop_assert_eq!(bits(d.momentum()), bits(s.momentum()));
        }
    }
}
