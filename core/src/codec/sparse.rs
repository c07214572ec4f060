//! `sparse`: the top `keep` values of every chunk of `chunk` values, each in `bits` bits (a sign
//! and `bits - 1` bits of magnitude between the chunk's smallest and largest kept magnitude),
//! with its index in the chunk. SparseLoCo's scheme (top-k per chunk, 2-bit values), meant for
//! pseudo-gradients with error feedback ([`crate::diloco::OuterState`] keeps what it drops).
//!
//! Layout of one chunk of `m` values (`m = chunk` but for the last, shorter one):
//!
//! ```text
//! lo: f32 LE | hi: f32 LE | e = min(keep, m) entries of w = idx_bits + bits bits, LSB first,
//!                           padded to a byte; entry = index | code << idx_bits
//! ```
//!
//! `idx_bits = ceil(log2(chunk))`; `code = sign << (bits - 1) | level`, and the value is
//! `±(lo + level * (hi - lo) / (2^(bits-1) - 1))`. Indices are strictly increasing, so an
//! encoding is canonical and the bytes of one input are the same on every machine.
//!
//! Which values are kept: the `keep` largest magnitudes, ties to the lower index; a NaN or an
//! infinity counts as (and is sent as) zero. A sum of such encodings is not sparse, so the ring
//! does not reduce them hop by hop: it gathers every contribution and each node sums them
//! (`crate::allreduce`).

use super::{BadEncoding, Codec, CodecKind};
use serde::{Deserialize, Serialize};
use std::cell::RefCell;

/// The parameters of the sparse codec.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SparseSpec {
    /// Values per chunk, [`SparseSpec::MIN_CHUNK`]..=[`SparseSpec::MAX_CHUNK`].
    pub chunk: u32,
    /// Values kept per chunk, `1..=chunk`.
    pub keep: u32,
    /// Bits per kept value (sign and magnitude), 2..=8.
    pub bits: u8,
}

impl Default for SparseSpec {
    /// 1% of every 4,096 values (41), 2 bits each: 51x fewer bytes than `uint8`.
    fn default() -> Self {
        SparseSpec { chunk: 4096, keep: 41, bits: 2 }
    }
}

impl SparseSpec {
    /// The least chunk: with at least 8 index bits an entry is wider than a byte's padding, so
    /// the number of entries follows from the length.
    pub const MIN_CHUNK: u32 = 256;
    /// The largest chunk (16-bit indices).
    pub const MAX_CHUNK: u32 = 1 << 16;

    /// `keep` from a density (the fraction of values kept, rounded, at least one).
    pub fn with_density(chunk: u32, density: f64, bits: u8) -> SparseSpec {
        let keep = (f64::from(chunk) * density).round().clamp(1.0, f64::from(chunk)) as u32;
        SparseSpec { chunk, keep, bits }
    }

    /// Why these parameters cannot be used, if they cannot.
    pub fn problem(&self) -> Option<String> {
        if !(Self::MIN_CHUNK..=Self::MAX_CHUNK).contains(&self.chunk) {
            return Some(format!(
                "chunk {} is out of range {}..={}",
                self.chunk,
                Self::MIN_CHUNK,
                Self::MAX_CHUNK
            ));
        }
        if self.keep == 0 || self.keep > self.chunk {
            return Some(format!("keep {} must be in 1..={}", self.keep, self.chunk));
        }
        if !(2..=8).contains(&self.bits) {
            return Some(format!("bits {} must be in 2..=8", self.bits));
        }
        None
    }

    /// The fraction of values kept.
    pub fn density(&self) -> f64 {
        f64::from(self.keep) / f64::from(self.chunk.max(1))
    }

    fn idx_bits(&self) -> u32 {
        32 - (self.chunk.max(2) - 1).leading_zeros()
    }

    /// Bits of one entry.
    fn width(&self) -> u32 {
        self.idx_bits() + u32::from(self.bits)
    }

    /// Magnitude levels.
    fn levels(&self) -> u32 {
        1 << (self.bits - 1)
    }

    /// Bytes of one chunk of `m` values.
    fn chunk_bytes(&self, m: usize) -> usize {
        let e = m.min(self.keep as usize);
        8 + (e * self.width() as usize).div_ceil(8)
    }
}

/// The sparse codec of one [`SparseSpec`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sparse(pub SparseSpec);

thread_local! {
    /// Selection keys of one chunk: reused, so that `encode` allocates once per thread.
    static KEYS: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// The selection key of value `x` at index `i`: larger for a larger magnitude, then for a lower
/// index. A non-finite value has magnitude 0.
fn key(x: f32, i: usize) -> u64 {
    let mag = if x.is_finite() { x.abs().to_bits() } else { 0 };
    (u64::from(mag) << 32) | u64::from(!(i as u32))
}

struct Bits<'a> {
    out: &'a mut [u8],
    pos: usize,
    acc: u64,
    n: u32,
}

impl Bits<'_> {
    fn put(&mut self, v: u32, w: u32) {
        self.acc |= u64::from(v) << self.n;
        self.n += w;
        while self.n >= 8 {
            self.out[self.pos] = self.acc as u8;
            self.pos += 1;
            self.acc >>= 8;
            self.n -= 8;
        }
    }

    fn flush(self) {
        if self.n > 0 {
            self.out[self.pos] = self.acc as u8;
        }
    }
}

/// The `e` entries of `w` bits packed LSB first in `src`.
fn entries(src: &[u8], e: usize, w: u32) -> impl Iterator<Item = u32> + '_ {
    let mask = (1u64 << w) - 1;
    (0..e).map(move |k| {
        let bit = k * w as usize;
        let (byte, shift) = (bit / 8, (bit % 8) as u32);
        let mut word = 0u64;
        for (j, b) in src.iter().skip(byte).take(4).enumerate() {
            word |= u64::from(*b) << (8 * j);
        }
        ((word >> shift) & mask) as u32
    })
}

impl Sparse {
    fn spec(&self) -> &SparseSpec {
        &self.0
    }

    /// `(lo, hi)` of a chunk's header.
    fn scales(head: &[u8]) -> (f32, f32) {
        let f = |b: &[u8]| f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        (f(&head[0..4]), f(&head[4..8]))
    }

    /// Calls `f(index, value)` for every entry of one chunk's encoding of `m` values.
    fn each(&self, enc: &[u8], m: usize, mut f: impl FnMut(usize, f32)) {
        let s = self.spec();
        let (lo, hi) = Sparse::scales(enc);
        let step = (hi - lo) / (s.levels() - 1).max(1) as f32;
        let e = m.min(s.keep as usize);
        let (ib, mag_mask) = (s.idx_bits(), s.levels() - 1);
        for v in entries(&enc[8..], e, s.width()) {
            let idx = (v & ((1 << ib) - 1)) as usize;
            let code = v >> ib;
            let mag = lo + (code & mag_mask) as f32 * step;
            let val = if code > mag_mask { -mag } else { mag };
            f(idx, val);
        }
    }

    fn encode_chunk(&self, x: &[f32], keys: &mut Vec<u64>, dst: &mut [u8]) {
        let s = self.spec();
        let e = x.len().min(s.keep as usize);
        keys.clear();
        keys.extend(x.iter().enumerate().map(|(i, v)| key(*v, i)));
        if e < keys.len() {
            keys.select_nth_unstable_by(e - 1, |a, b| b.cmp(a));
        }
        let kept = &mut keys[..e];
        // By index: the low 32 bits hold !index.
        kept.sort_unstable_by_key(|k| !(*k as u32));
        let mag = |k: u64| f32::from_bits((k >> 32) as u32);
        let lo = kept.iter().map(|k| mag(*k)).fold(f32::INFINITY, f32::min);
        let hi = kept.iter().map(|k| mag(*k)).fold(0.0f32, f32::max);
        let lo = if lo.is_finite() { lo } else { 0.0 };
        dst[0..4].copy_from_slice(&lo.to_le_bytes());
        dst[4..8].copy_from_slice(&hi.to_le_bytes());
        let top = (s.levels() - 1) as f32;
        let step = (hi - lo) / top.max(1.0);
        let ib = s.idx_bits();
        let mut bits = Bits { out: &mut dst[8..], pos: 0, acc: 0, n: 0 };
        for k in kept.iter() {
            let i = !(*k as u32);
            let x = x[i as usize];
            let m = mag(*k);
            let level =
                if step > 0.0 { ((m - lo) / step).round().clamp(0.0, top) as u32 } else { 0 };
            let sign = u32::from(x.is_finite() && x < 0.0);
            let code = (sign << (s.bits - 1)) | level;
            bits.put(i | (code << ib), s.width());
        }
        bits.flush();
    }

    /// Walks the chunks of an encoding of `n` values: `f(start, m, bytes)`.
    fn chunks(&self, src: &[u8], n: usize, mut f: impl FnMut(usize, usize, &[u8])) {
        let c = self.spec().chunk as usize;
        let mut at = 0;
        let mut start = 0;
        while start < n {
            let m = c.min(n - start);
            let b = self.spec().chunk_bytes(m);
            f(start, m, &src[at..at + b]);
            at += b;
            start += m;
        }
    }
}

impl Codec for Sparse {
    fn kind(&self) -> CodecKind {
        CodecKind::Sparse(self.0)
    }

    fn encoded_len(&self, n: usize) -> usize {
        let s = self.spec();
        let c = s.chunk.max(1) as usize;
        let (full, rest) = (n / c, n % c);
        full * s.chunk_bytes(c) + if rest > 0 { s.chunk_bytes(rest) } else { 0 }
    }

    fn check(&self, src: &[u8]) -> Result<(), BadEncoding> {
        let s = self.spec();
        let full = s.chunk_bytes(s.chunk as usize);
        let (ib, w) = (s.idx_bits(), s.width());
        let mut at = 0;
        let mut chunk = 0;
        while at < src.len() {
            let b = full.min(src.len() - at);
            let enc = &src[at..at + b];
            if b < 8 {
                return Err(BadEncoding { what: "chunk", index: chunk, value: b as f32 });
            }
            let (lo, hi) = Sparse::scales(enc);
            if !(lo.is_finite() && hi.is_finite() && lo >= 0.0 && lo <= hi) {
                let value = if lo.is_finite() && lo >= 0.0 { hi } else { lo };
                return Err(BadEncoding { what: "chunk scale", index: chunk, value });
            }
            // Entries wider than a byte: the count follows from the length.
            let e = (b - 8) * 8 / w as usize;
            let mut prev: Option<u32> = None;
            for v in entries(&enc[8..], e, w) {
                let idx = v & ((1 << ib) - 1);
                if idx >= s.chunk || prev.is_some_and(|p| idx <= p) {
                    return Err(BadEncoding {
                        what: "chunk index",
                        index: chunk,
                        value: idx as f32,
                    });
                }
                prev = Some(idx);
            }
            at += b;
            chunk += 1;
        }
        Ok(())
    }

    fn encode(&self, src: &[f32], dst: &mut [u8]) {
        let want = self.encoded_len(src.len());
        assert_eq!(dst.len(), want, "sparse encode: {} bytes for {} values", dst.len(), src.len());
        let c = self.spec().chunk as usize;
        KEYS.with_borrow_mut(|keys| {
            let mut at = 0;
            for x in src.chunks(c) {
                let b = self.spec().chunk_bytes(x.len());
                self.encode_chunk(x, keys, &mut dst[at..at + b]);
                at += b;
            }
        });
    }

    fn decode_accumulate(&self, src: &[u8], dst: &mut [f32]) {
        // `1 * v` is `v`: the same values as an unscaled sum.
        self.decode_accumulate_scaled(src, dst, 1.0, &mut [])
    }

    fn decode_accumulate_scaled(&self, src: &[u8], dst: &mut [f32], scale: f32, _: &mut [f32]) {
        let want = self.encoded_len(dst.len());
        assert_eq!(src.len(), want, "sparse decode: {} bytes for {} values", src.len(), dst.len());
        let n = dst.len();
        self.chunks(src, n, |start, m, enc| {
            let out = &mut dst[start..start + m];
            // An index past a short last chunk is not something `encode` writes: dropped.
            self.each(enc, m, |i, v| {
                if let Some(o) = out.get_mut(i) {
                    *o += scale * v;
                }
            });
        });
    }

    fn decode(&self, src: &[u8], dst: &mut [f32]) {
        dst.fill(0.0);
        self.decode_accumulate(src, dst);
    }
}
