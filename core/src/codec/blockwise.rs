//! What the blockwise absmax codecs (`int8-block`, `int4-block`) share: the input cut into blocks
//! of [`BLOCK`] values, each sent as a little-endian f32 scale (its largest finite magnitude over
//! the format's [`Format::LEVELS`]) followed by its codes, so that blocks encode and decode
//! independently, and the reduce steps of the ring run fused one block at a time while it is in
//! registers and the L1 cache. A format says only how one block's values become codes and back.

use super::{BadEncoding, Codec};

/// Values per block (the last block of a chunk may be shorter).
pub(crate) const BLOCK: usize = 256;
/// Vector lanes the loops are written for (the compiler maps them onto SIMD registers).
pub(crate) const LANES: usize = 16;
/// Adding 1.5 * 2^23 to a float in (-2^22, 2^22) rounds it to an integer (half to even), which
/// then sits, two's complement, in the low mantissa bits.
const ROUND_MAGIC: f32 = 12_582_912.0;
/// Blocks whose largest magnitude is below this are pre-multiplied by [`TINY_PRE`].
const TINY: f32 = f32::from_bits(0x0380_0000); // 2^-120
/// 2^64.
const TINY_PRE: f32 = 18_446_744_073_709_551_616.0;

/// How one block's values become codes and back.
pub(crate) trait Format {
    /// The largest code magnitude: the scale is `absmax / LEVELS`.
    const LEVELS: f32;
    /// Encoded bytes of a full block: the f32 scale, then the codes.
    const BLOCK_BYTES: usize;
    /// Writes the codes of `src` (at most [`BLOCK`] values) into `dst`, each value `x` coded as
    /// [`code`]`(x, inv)` (after `x * pre` with `PRE`).
    fn quantise<const PRE: bool>(src: &[f32], dst: &mut [u8], pre: f32, inv: f32);
    /// Applies `f(dst value, code * scale)` over one block's codes.
    fn decode_block(codes: &[u8], scale: f32, dst: &mut [f32], f: &impl Fn(&mut f32, f32));
}

/// Largest magnitude among the finite values of `block` (0 when there is none).
#[inline(always)]
fn absmax(block: &[f32]) -> f32 {
    let mut m = [0.0f32; LANES];
    let mut body = block.chunks_exact(LANES);
    let keep = |m: f32, x: f32| {
        let a = x.abs();
        // NaN and inf fail the first comparison.
        let a = if a < f32::INFINITY { a } else { 0.0 };
        if a > m { a } else { m }
    };
    for c in &mut body {
        for i in 0..LANES {
            m[i] = keep(m[i], c[i]);
        }
    }
    let tail = body.remainder().iter().fold(0.0f32, |acc, &x| keep(acc, x));
    m.iter().fold(tail, |acc, &x| if x > acc { x } else { acc })
}

/// The scale of a block with largest magnitude `a`: `a / levels`, one ulp lower when `levels`
/// times it would overflow (a decode never yields inf).
#[inline(always)]
fn block_scale(a: f32, levels: f32) -> f32 {
    let s = a / levels;
    if s * levels < f32::INFINITY { s } else { f32::from_bits(s.to_bits() - 1) }
}

/// The code of `x` given the multiplier `inv` (finite, positive): `round_half_even(x * inv)`
/// clamped to `[-levels, levels]`, two's complement in the low bits (NaN codes as 0).
#[inline(always)]
pub(crate) fn code(x: f32, inv: f32, levels: f32) -> u8 {
    #[allow(clippy::eq_op)]
    let x = if x == x { x } else { 0.0 };
    let y = x * inv;
    let y = if y < levels { y } else { levels };
    let y = if y > -levels { y } else { -levels };
    // Truncation intended: the low byte of the mantissa is round(y) as two's complement.
    (y + ROUND_MAGIC).to_bits() as u8
}

/// Encodes one block (at most [`BLOCK`] values) into its scale and codes.
#[inline(always)]
fn encode_block<F: Format>(s: &[f32], d: &mut [u8]) {
    let a = absmax(s);
    let (head, codes) = d.split_at_mut(4);
    head.copy_from_slice(&block_scale(a, F::LEVELS).to_le_bytes());
    if a >= TINY {
        F::quantise::<false>(s, codes, 1.0, F::LEVELS / a);
    } else if a > 0.0 {
        F::quantise::<true>(s, codes, TINY_PRE, F::LEVELS / (a * TINY_PRE));
    } else {
        // No finite non-zero value: zeros and NaN to 0, +-inf to +-LEVELS (decoded as 0).
        F::quantise::<false>(s, codes, 1.0, 1.0);
    }
}

/// Applies `f(dst value, decoded value)` over every block of `src`.
#[inline(always)]
fn decode_with<F: Format>(src: &[u8], dst: &mut [f32], f: impl Fn(&mut f32, f32)) {
    for (s, d) in src.chunks(F::BLOCK_BYTES).zip(dst.chunks_mut(BLOCK)) {
        let (scale, codes) = s.split_at(4);
        let scale = f32::from_le_bytes([scale[0], scale[1], scale[2], scale[3]]);
        F::decode_block(codes, scale, d, &f);
    }
}

/// One block of a reduce step: `acc[..own.len()] = weight * own + decode(src)` (the block's
/// received bytes), in a working block on the stack that stays in the L1 cache.
#[inline(always)]
fn reduce_block<'a, F: Format>(
    src: &[u8],
    own: &[f32],
    weight: f32,
    acc: &'a mut [f32; BLOCK],
) -> &'a mut [f32] {
    let acc = &mut acc[..own.len()];
    super::load_weighted(acc, own, weight);
    decode_with::<F>(src, acc, |a, v| *a += v);
    acc
}

/// [`Codec::check`] of a blockwise format: every block's scale is one [`block_scale`] can
/// write (finite, not negative, and `LEVELS` times it finite), so every code an encoder writes
/// decodes to a finite value. A code one beyond `-LEVELS` (which no encoder writes, but a byte
/// can hold) could still overflow under a scale within a 128th of the largest: such a block,
/// which no pseudo-gradient comes near, is decoded to be sure.
pub(crate) fn check<F: Format>(src: &[u8]) -> Result<(), BadEncoding> {
    for (index, block) in src.chunks(F::BLOCK_BYTES).enumerate() {
        let Some((head, codes)) = block.split_first_chunk::<4>() else {
            // A short tail holds no scale: the length check refuses it before this.
            continue;
        };
        let value = f32::from_le_bytes(*head);
        let bad = BadEncoding { what: "block scale", index, value };
        if !(value >= 0.0 && value * F::LEVELS < f32::INFINITY) {
            return Err(bad);
        }
        if value * (F::LEVELS + 1.0) == f32::INFINITY {
            let n = (codes.len() * BLOCK).div_ceil(F::BLOCK_BYTES - 4).min(BLOCK);
            let mut values = [0.0f32; BLOCK];
            F::decode_block(codes, value, &mut values[..n], &|d, v| *d = v);
            if values[..n].iter().any(|v| !v.is_finite()) {
                return Err(bad);
            }
        }
    }
    Ok(())
}

/// [`Codec::encode`] of a blockwise format.
pub(crate) fn encode<F: Format>(c: &dyn Codec, src: &[f32], dst: &mut [u8]) {
    let want = c.encoded_len(src.len());
    assert_eq!(dst.len(), want, "{} encode: wrong buffer length", c.kind());
    for (s, d) in src.chunks(BLOCK).zip(dst.chunks_mut(F::BLOCK_BYTES)) {
        encode_block::<F>(s, d);
    }
}

/// [`Codec::decode_accumulate`] (`accumulate`) or [`Codec::decode`] of a blockwise format.
pub(crate) fn decode<F: Format>(c: &dyn Codec, src: &[u8], dst: &mut [f32], accumulate: bool) {
    let want = c.encoded_len(dst.len());
    assert_eq!(src.len(), want, "{} decode: wrong buffer length", c.kind());
    if accumulate {
        decode_with::<F>(src, dst, |d, v| *d += v);
    } else {
        decode_with::<F>(src, dst, |d, v| *d = v);
    }
}

/// [`Codec::reduce_encode`], fused block by block: each block is reduced, scaled and quantised
/// while it is in registers and the L1 cache (the default's scratch pass over the segment is not
/// needed: blocks are encoded independently). Same arithmetic, so the same bytes.
pub(crate) fn reduce_encode<F: Format>(
    c: &dyn Codec,
    src: &[u8],
    own: &[f32],
    weight: f32,
    dst: &mut [u8],
) {
    super::assert_reduce_lengths(c, src, own.len(), dst);
    let mut acc = [0.0f32; BLOCK];
    let blocks =
        src.chunks(F::BLOCK_BYTES).zip(own.chunks(BLOCK)).zip(dst.chunks_mut(F::BLOCK_BYTES));
    for ((s, o), d) in blocks {
        encode_block::<F>(reduce_block::<F>(s, o, weight, &mut acc), d);
    }
}

/// [`Codec::reduce_average`], fused like [`reduce_encode`]: average, encode and decode back into
/// `own`, one block at a time. Same bytes and values as the default.
pub(crate) fn reduce_average<F: Format>(
    c: &dyn Codec,
    src: &[u8],
    own: &mut [f32],
    weight: f32,
    weight_sum: f64,
    dst: &mut [u8],
) {
    super::assert_reduce_lengths(c, src, own.len(), dst);
    // No weight at all (`None`): the average is zeros, whatever the values.
    let ws = (weight_sum > 0.0).then_some(weight_sum as f32);
    let mut acc = [0.0f32; BLOCK];
    let blocks =
        src.chunks(F::BLOCK_BYTES).zip(own.chunks_mut(BLOCK)).zip(dst.chunks_mut(F::BLOCK_BYTES));
    for ((s, o), d) in blocks {
        let avg = match ws {
            Some(ws) => {
                let a = reduce_block::<F>(s, o, weight, &mut acc);
                for v in a.iter_mut() {
                    *v /= ws;
                }
                a
            }
            None => {
                let a = &mut acc[..o.len()];
                a.fill(0.0);
                a
            }
        };
        encode_block::<F>(avg, d);
        decode_with::<F>(d, o, |x, v| *x = v);
    }
}
