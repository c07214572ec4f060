//! Codecs for the all-reduce: how a slice of f32 travels as bytes.
//!
//! Every codec has the same slice-based interface ([`Codec`]): `encode` into a caller-provided
//! buffer of exactly [`Codec::encoded_len`] bytes, and `decode_accumulate` / `decode` into a
//! caller-provided f32 slice. None allocates per call. Every input, including all zeros, a single
//! element and NaN/inf, gives a defined result (documented per codec) and never panics.
//!
//! Bytes from the network are checked before they are decoded ([`Codec::check`]): a value that
//! would decode to NaN or an infinity is refused, so no replica takes one.
//!
//! | kind | bytes per value | relative RMS error on N(0,1) | notes |
//! |---|---|---|---|
//! | `fp32` | 4 | 0 | exact |
//! | `fp16` / `bf16` | 2 | 2.1e-4 / 1.7e-3 | round to nearest even; NaN/inf pass through |
//! | `uint8` | 1 + 1 KiB per call | 1.6e-2 | PRIME's codebook scheme (reference.md) |
//! | `int8-block` | 1 + 4 per 256 values (1.016) | 7.0e-3 | blockwise absmax, beats `uint8` |
//! | `int4-block` | 0.5 + 4 per 256 values (0.516) | 1.3e-1 | the same with 4-bit codes -7..7 |
//! | `sparse` | 0.0195 (1% of values, 2 bits, 12-bit indices) | drops 99% of the values | top-k per chunk, all-gathered; for error feedback |
//!
//! `loco bench codec` measures their throughput and prints these errors.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

mod blockwise;
mod fp32;
mod half16;
mod int4block;
mod int8block;
mod sparse;
#[cfg(target_arch = "x86_64")]
mod stream;
#[cfg(test)]
mod tests;
mod uint8;

pub use fp32::Fp32;
pub use half16::{Bf16, Fp16};
pub use int4block::Int4Block;
pub use int8block::Int8Block;
pub use sparse::{Sparse, SparseSpec};
pub use uint8::Uint8;

/// The codecs loco knows, by name (as written in scenario files and on the command line).
/// Serialised as its [`Display`](fmt::Display) text (`"sparse"` with the default parameters,
/// `"sparse:BITS:KEEP:CHUNK"` with others).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum CodecKind {
    /// 32-bit floats, exact.
    Fp32,
    /// IEEE half precision.
    Fp16,
    /// bfloat16.
    Bf16,
    /// PRIME's 8-bit codebook: 256 bins of width 6s/256 around zero, decoded by per-bin means.
    Uint8,
    /// Blockwise absmax int8: one f32 scale per block of values.
    Int8Block,
    /// Blockwise absmax int4: one f32 scale per block of values, two values per byte.
    Int4Block,
    /// The largest values of every chunk, in a few bits each, with their indices ([`Sparse`]).
    /// A sum of them is not sparse: the all-reduce gathers every contribution instead of
    /// reducing hop by hop ([`CodecKind::sums_in_ring`]).
    Sparse(SparseSpec),
}

impl CodecKind {
    /// Every codec, in a fixed order.
    pub const ALL: [CodecKind; 7] = [
        CodecKind::Fp32,
        CodecKind::Fp16,
        CodecKind::Bf16,
        CodecKind::Uint8,
        CodecKind::Int8Block,
        CodecKind::Int4Block,
        CodecKind::Sparse(SparseSpec { chunk: 4096, keep: 41, bits: 2 }),
    ];

    /// Whether partial sums travel the ring (every codec but `sparse`, whose contributions are
    /// gathered whole and summed at every node).
    pub fn sums_in_ring(self) -> bool {
        !matches!(self, CodecKind::Sparse(_))
    }

    /// Encoded bytes per value of a long input (what a ring's bodies weigh per value).
    pub fn bytes_per_value(self) -> f64 {
        let n = 1 << 20;
        self.codec().encoded_len(n) as f64 / n as f64
    }

    /// The name used in files and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            CodecKind::Fp32 => "fp32",
            CodecKind::Fp16 => "fp16",
            CodecKind::Bf16 => "bf16",
            CodecKind::Uint8 => "uint8",
            CodecKind::Int8Block => "int8-block",
            CodecKind::Int4Block => "int4-block",
            CodecKind::Sparse(_) => "sparse",
        }
    }

    /// Seconds per value of one `encode` and of one [`Codec::check`] and `decode_accumulate`
    /// (a ring checks every body it receives before it decodes it) on one core: what
    /// `loco bench codec` measured on a 2-core AMD EPYC VM (best of 5 runs of 16 Mi values). The
    /// simulator's default `[sim] encode_cost` and `decode_cost` for this codec. The check reads
    /// every value of the float codecs (0.24 ns a value for fp32, 0.26 for fp16, 0.27 for bf16, added
    /// here to the decode figures measured before it existed) and only the scales or the table
    /// of the others (under 0.02 ns a value, left out).
    pub fn measured_cost(self) -> (f64, f64) {
        match self {
            CodecKind::Fp32 => (0.30e-9, 0.49e-9),
            CodecKind::Fp16 => (0.23e-9, 0.62e-9),
            CodecKind::Bf16 => (0.27e-9, 0.47e-9),
            CodecKind::Uint8 => (0.59e-9, 0.27e-9),
            CodecKind::Int8Block => (0.37e-9, 0.22e-9),
            CodecKind::Int4Block => (0.44e-9, 0.32e-9),
            CodecKind::Sparse(_) => (SPARSE_ENCODE_COST, SPARSE_DECODE_COST),
        }
    }

    /// How many values an encoding of `bytes` bytes holds: the least `n` whose
    /// [`Codec::encoded_len`] reaches `bytes` (for a whole encoding: its values, or one fewer
    /// where two lengths share a size, as int4-block packs two values a byte). For `sparse`
    /// the most `n` whose encoding fits: a last chunk of `keep` values or more weighs what a
    /// whole one does, and a body of whole chunks holds whole chunks.
    pub fn values_in(self, bytes: u64) -> u64 {
        let c = self.codec();
        let len = |n: u64| c.encoded_len(usize::try_from(n).unwrap_or(usize::MAX)) as u64;
        // Every codec takes at least half a byte a value, but the sparse one (a chunk takes 9
        // bytes or more).
        let per_byte = match self {
            CodecKind::Sparse(s) => u64::from(s.chunk.div_ceil(9)).max(2),
            _ => 2,
        };
        let (mut lo, mut hi) = (0u64, bytes.saturating_mul(per_byte));
        if !self.sums_in_ring() {
            // The largest n with len(n) <= bytes.
            while lo < hi {
                let mid = lo + (hi - lo).div_ceil(2);
                if len(mid) <= bytes {
                    lo = mid;
                } else {
                    hi = mid - 1;
                }
            }
            return lo;
        }
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if len(mid) < bytes {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// The codec implementation.
    pub fn codec(self) -> &'static dyn Codec {
        match self {
            CodecKind::Fp32 => &Fp32,
            CodecKind::Fp16 => &Fp16,
            CodecKind::Bf16 => &Bf16,
            CodecKind::Uint8 => &Uint8,
            CodecKind::Int8Block => &Int8Block,
            CodecKind::Int4Block => &Int4Block,
            CodecKind::Sparse(spec) => sparse_codec(spec),
        }
    }
}

/// Seconds per value of the sparse codec's encode (the top-k selection) and decode: `loco bench
/// codec` on the same VM, scaled by `int8-block`'s figures measured in the same run (the VM was
/// busier than when the others were measured).
const SPARSE_ENCODE_COST: f64 = 1.7e-9;
const SPARSE_DECODE_COST: f64 = 0.06e-9;

/// The sparse codec of `spec`, one per distinct parameters for the process's life (a run uses
/// one or a few).
fn sparse_codec(spec: SparseSpec) -> &'static dyn Codec {
    use std::sync::{Mutex, PoisonError};
    static MADE: Mutex<Vec<&'static Sparse>> = Mutex::new(Vec::new());
    let mut made = MADE.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(c) = made.iter().find(|c| c.0 == spec) {
        return *c;
    }
    let c: &'static Sparse = Box::leak(Box::new(Sparse(spec)));
    made.push(c);
    c
}

impl fmt::Display for CodecKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CodecKind::Sparse(s) if *s != SparseSpec::default() => {
                write!(f, "sparse:{}:{}:{}", s.bits, s.keep, s.chunk)
            }
            _ => f.write_str(self.name()),
        }
    }
}

impl FromStr for CodecKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(rest) = s.strip_prefix("sparse:") {
            let bad = || format!("codec `{s}`: expected sparse:BITS:KEEP:CHUNK");
            let mut it = rest.split(':');
            let (Some(b), Some(k), Some(c), None) = (it.next(), it.next(), it.next(), it.next())
            else {
                return Err(bad());
            };
            let spec = SparseSpec {
                bits: b.parse().map_err(|_| bad())?,
                keep: k.parse().map_err(|_| bad())?,
                chunk: c.parse().map_err(|_| bad())?,
            };
            if let Some(p) = spec.problem() {
                return Err(format!("codec `{s}`: {p}"));
            }
            return Ok(CodecKind::Sparse(spec));
        }
        CodecKind::ALL.into_iter().find(|k| k.name() == s).ok_or_else(|| {
            let names: Vec<_> = CodecKind::ALL.iter().map(|k| k.name()).collect();
            format!("unknown codec `{s}`, expected one of {}", names.join(", "))
        })
    }
}

impl From<CodecKind> for String {
    fn from(k: CodecKind) -> String {
        k.to_string()
    }
}

impl TryFrom<String> for CodecKind {
    type Error = String;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

/// Why received bytes were refused before decoding: they are not something this codec's
/// `encode` writes, and would decode to a value that is not finite.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error("{what} {index} is {value}, which no encoding holds")]
pub struct BadEncoding {
    /// What holds it: a value, a block's scale, a table entry.
    pub what: &'static str,
    /// Its index among those.
    pub index: usize,
    /// What it is.
    pub value: f32,
}

/// A way to send f32 values as bytes. Implementations are stateless and thread-safe.
pub trait Codec: Send + Sync {
    /// Which codec this is.
    fn kind(&self) -> CodecKind;

    /// Exact number of bytes `encode` writes for `n` values.
    fn encoded_len(&self, n: usize) -> usize;

    /// Checks bytes from the network before they are decoded: every value they decode to is
    /// finite (and every scale or table entry is one `encode` can write). `encode` of finite
    /// values always passes; an encoding of a NaN or an infinity passes where the codec maps
    /// them to finite values (the quantised codecs do) and fails where it sends them as they
    /// are (`fp32`, `fp16`, `bf16`). One pass over the bytes (over the scales or the table
    /// only, for the blockwise codecs and `uint8`).
    ///
    /// # Errors
    /// The first value, scale or table entry that is not finite (or out of range).
    fn check(&self, src: &[u8]) -> Result<(), BadEncoding>;

    /// Encodes `src` into `dst`.
    ///
    /// # Panics
    /// When `dst.len() != self.encoded_len(src.len())` (a caller bug, not a data condition).
    fn encode(&self, src: &[f32], dst: &mut [u8]);

    /// Adds the decoded values of `src` to `dst`: `dst[i] += decode(src)[i]`.
    ///
    /// # Panics
    /// When `src.len() != self.encoded_len(dst.len())`.
    fn decode_accumulate(&self, src: &[u8], dst: &mut [f32]);

    /// Writes the decoded values of `src` into `dst`: `dst[i] = decode(src)[i]`.
    ///
    /// # Panics
    /// When `src.len() != self.encoded_len(dst.len())`.
    fn decode(&self, src: &[u8], dst: &mut [f32]);

    /// `dst[i] += scale * decode(src)[i]`, with `scratch` (at least `dst.len()` values) as
    /// working space: how a gathering ring sums the contributions. Codecs may fuse the passes
    /// (the sparse one touches only the values it holds); the result must equal this default's.
    ///
    /// # Panics
    /// When the lengths do not match as for `decode`.
    fn decode_accumulate_scaled(
        &self,
        src: &[u8],
        dst: &mut [f32],
        scale: f32,
        scratch: &mut [f32],
    ) {
        let tmp = &mut scratch[..dst.len()];
        self.decode(src, tmp);
        for (d, x) in dst.iter_mut().zip(tmp.iter()) {
            *d += scale * *x;
        }
    }

    /// One reduce-scatter hop: `dst = encode(weight * own + decode(src))`, with `scratch` (at
    /// least `own.len()` values) as working space. Weight 0 ignores `own` (even NaN). Codecs may
    /// fuse the passes; the result must equal this default's.
    ///
    /// # Panics
    /// When the lengths do not match as for `encode` and `decode`.
    fn reduce_encode(
        &self,
        src: &[u8],
        own: &[f32],
        weight: f32,
        scratch: &mut [f32],
        dst: &mut [u8],
    ) {
        let acc = &mut scratch[..own.len()];
        load_weighted(acc, own, weight);
        self.decode_accumulate(src, acc);
        self.encode(acc, dst);
    }

    /// The last reduce-scatter hop, at the chunk's owner: the average
    /// `x = (weight * own + decode(src)) / weight_sum` (all zeros when `weight_sum` is not
    /// positive) is encoded into `dst`, and `own` is replaced by `decode(dst)`, the values every
    /// other rank will decode from the same bytes. `scratch` (at least `own.len()` values) is
    /// working space. Codecs may fuse the passes; the result must equal this default's.
    ///
    /// # Panics
    /// When the lengths do not match as for `encode` and `decode`.
    fn reduce_average(
        &self,
        src: &[u8],
        own: &mut [f32],
        weight: f32,
        weight_sum: f64,
        scratch: &mut [f32],
        dst: &mut [u8],
    ) {
        let acc = &mut scratch[..own.len()];
        if weight_sum > 0.0 {
            load_weighted(acc, own, weight);
            self.decode_accumulate(src, acc);
            let ws = weight_sum as f32;
            for v in acc.iter_mut() {
                *v /= ws;
            }
        } else {
            acc.fill(0.0);
        }
        self.encode(acc, dst);
        self.decode(dst, own);
    }
}

/// [`Codec::check`] of little-endian IEEE floats of `W` bytes, named `what`: `magnitude`
/// gives a value's bits with the sign cleared, `not_finite` is the least magnitude that is
/// not finite (every exponent bit set), `value` the value. The largest magnitude of a block is
/// taken with no branch per value (an integer maximum, which vectorises), and a block that
/// holds an infinity or a NaN is searched again for the first one.
pub(crate) fn check_floats<const W: usize>(
    src: &[u8],
    magnitude: impl Fn([u8; W]) -> u32,
    not_finite: u32,
    value: impl Fn([u8; W]) -> f32,
    what: &'static str,
) -> Result<(), BadEncoding> {
    const PER_BLOCK: usize = 4096;
    fn values<const W: usize>(block: &[u8]) -> impl Iterator<Item = [u8; W]> + '_ {
        block.chunks_exact(W).map(|s| {
            let mut v = [0u8; W];
            v.copy_from_slice(s);
            v
        })
    }
    for (b, block) in src.chunks(W * PER_BLOCK).enumerate() {
        let top = values::<W>(block).fold(0u32, |m, s| m.max(magnitude(s)));
        if top < not_finite {
            continue;
        }
        if let Some((i, s)) =
            values::<W>(block).enumerate().find(|(_, s)| magnitude(*s) >= not_finite)
        {
            return Err(BadEncoding { what, index: b * PER_BLOCK + i, value: value(s) });
        }
    }
    Ok(())
}

/// [`check_floats`] of f32 values.
pub(crate) fn check_f32s(src: &[u8], what: &'static str) -> Result<(), BadEncoding> {
    let magnitude = |s: [u8; 4]| u32::from_le_bytes(s) & 0x7fff_ffff;
    check_floats(src, magnitude, 0x7f80_0000, f32::from_le_bytes, what)
}

/// The reduce steps' length contract: `src` and `dst` both hold the encoding of `n` values.
///
/// # Panics
/// When they do not (a caller bug, not a data condition).
pub(crate) fn assert_reduce_lengths(c: &dyn Codec, src: &[u8], n: usize, dst: &[u8]) {
    let want = c.encoded_len(n);
    assert!(
        src.len() == want && dst.len() == want,
        "{} reduce: wrong buffer length ({} and {} bytes for {n} values, expected {want})",
        c.kind(),
        src.len(),
        dst.len()
    );
}

/// `out = weight * own`, where weight 0 gives zeros whatever the values (even NaN) and weight 1
/// copies them. The ring's own contribution and the default reduce steps start from this.
///
/// # Panics
/// When the lengths differ.
pub(crate) fn load_weighted(out: &mut [f32], own: &[f32], weight: f32) {
    if weight == 0.0 {
        out.fill(0.0);
    } else if weight == 1.0 {
        out.copy_from_slice(own);
    } else {
        assert_eq!(out.len(), own.len(), "load_weighted: lengths");
        for (o, x) in out.iter_mut().zip(own) {
            *o = weight * x;
        }
    }
}
