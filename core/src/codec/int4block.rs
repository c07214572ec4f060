//! Blockwise absmax int4: one f32 scale per block of 256 values, two values per byte.
//!
//! # Scheme
//!
//! The input is cut into blocks of [`BLOCK`] values (the last one shorter), as in `int8-block`.
//! For a block with largest finite magnitude `a`, `scale = a / 7` and each value is sent as
//! `q = clamp(round_half_even(x * 7 / a), -7, 7)`, a signed 4-bit code (15 symmetric levels; the
//! code -8 is never written); it decodes to `q * scale`. The error of a finite value is at most
//! `scale / 2 = a / 14` (up to f32 rounding: about `1e-6 * scale`, and for subnormal scales the
//! f32 spacing `2^-149`). On N(0,1) data (`a` about 2.9 per block of 256) that is a relative RMS
//! error of about 0.126, for about half of `int8-block`'s bytes. Rounding is to nearest, never
//! stochastic: the same input always gives the same bytes.
//!
//! # Defined results on degenerate input
//!
//! The same rules as `int8-block`, with 7 in place of 127:
//!
//! - Empty input: nothing is written (`encoded_len(0) = 0`).
//! - A block of zeros (or with no finite non-zero value): scale 0, codes 0, decodes to 0.
//! - One element (or a block whose values are all equal in magnitude): decodes to `+-a` within
//!   one ulp (`7 * (a / 7)` rounds back to `a` for most `a`). Near `f32::MAX` the scale is rounded
//!   down one ulp so that `7 * scale` stays finite. Below `a = 7 * 2^-126` the scale is subnormal
//!   and the error up to `7 * 2^-150`.
//! - NaN is sent as 0; `+inf` as 7 and `-inf` as -7, so they decode to `+-a` of the finite values
//!   of their block (0 when there are none). Non-finite values never enter `a`, so a decode never
//!   yields NaN or inf.
//! - Blocks of tiny values (`a < 2^-120`, where `7 / a` may not fit an f32 or loses bits) are
//!   multiplied by 2^64 (exactly) before binning; their f32 scale may be subnormal and then carries
//!   fewer bits.
//!
//! # Layout (little endian)
//!
//! Block after block, each one `f32` scale followed by the block's codes packed two per byte:
//! value `2k` of the block in the low nibble of byte `k`, value `2k + 1` in its high nibble, each
//! code in 4-bit two's complement (`-7` is `0x9`, `7` is `0x7`). A block of odd length (only the
//! last one can be) leaves the high nibble of its last byte 0. A full block is 4 + 128 bytes and
//! `encoded_len(n) = ceil(n / 2) + 4 * ceil(n / 256)`, that is 0.5 + 4/256 = 0.516 bytes per
//! value. Blocks can be decoded independently. Decoding arbitrary bytes reads the code `0x8` as
//! -8.

use super::blockwise::{self, BLOCK, Format, LANES, code};
use super::{BadEncoding, Codec, CodecKind};

/// Encoded bytes of a full block: the f32 scale, then the codes, two per byte.
const BLOCK_BYTES: usize = 4 + BLOCK / 2;
/// The largest code magnitude (-8 is never written).
const LEVELS: f32 = 7.0;

/// Blockwise absmax int4: blocks of 256 values, each with one f32 scale (`absmax / 7`) and one
/// signed nibble per value, two per byte (see the module documentation for the rules and layout).
#[derive(Clone, Copy, Debug, Default)]
pub struct Int4Block;

/// The 4-bit code of one value (in the low nibble, high nibble 0).
#[inline(always)]
fn nibble(x: f32, inv: f32) -> u8 {
    code(x, inv, LEVELS) & 0x0f
}

/// The signed code in the low nibble of `b`.
#[inline(always)]
fn low(b: u8) -> f32 {
    f32::from(((b << 4) as i8) >> 4)
}

/// The signed code in the high nibble of `b`.
#[inline(always)]
fn high(b: u8) -> f32 {
    f32::from((b as i8) >> 4)
}

impl Format for Int4Block {
    const LEVELS: f32 = LEVELS;
    const BLOCK_BYTES: usize = BLOCK_BYTES;

    /// Two codes per byte, the first value's in the low nibble (`ceil(src.len() / 2)` bytes).
    #[inline(always)]
    fn quantise<const PRE: bool>(src: &[f32], dst: &mut [u8], pre: f32, inv: f32) {
        let c = |x: f32| {
            if PRE { nibble(x * pre, inv) } else { nibble(x, inv) }
        };
        // Split both sides at the last whole step, so that their remainders match.
        let whole = src.len() / (2 * LANES);
        let (src_body, src_tail) = src.split_at(whole * 2 * LANES);
        let (dst_body, dst_tail) = dst.split_at_mut(whole * LANES);
        for (sc, dc) in src_body.chunks_exact(2 * LANES).zip(dst_body.chunks_exact_mut(LANES)) {
            for i in 0..LANES {
                dc[i] = c(sc[2 * i]) | c(sc[2 * i + 1]) << 4;
            }
        }
        let mut pairs = src_tail.chunks_exact(2);
        let mut out = dst_tail.iter_mut();
        for (p, q) in (&mut pairs).zip(&mut out) {
            *q = c(p[0]) | c(p[1]) << 4;
        }
        if let (Some(&x), Some(q)) = (pairs.remainder().first(), out.next()) {
            *q = c(x);
        }
    }

    #[inline(always)]
    fn decode_block(codes: &[u8], scale: f32, d: &mut [f32], f: &impl Fn(&mut f32, f32)) {
        // Split both sides at the last whole step, so that their remainders match.
        let whole = d.len() / (2 * LANES);
        let (code_body, code_tail) = codes.split_at(whole * LANES);
        let (d_body, d_tail) = d.split_at_mut(whole * 2 * LANES);
        for (c, o) in code_body.chunks_exact(LANES).zip(d_body.chunks_exact_mut(2 * LANES)) {
            for i in 0..LANES {
                f(&mut o[2 * i], low(c[i]) * scale);
                f(&mut o[2 * i + 1], high(c[i]) * scale);
            }
        }
        let mut pairs = d_tail.chunks_exact_mut(2);
        let mut bytes = code_tail.iter();
        for (o, c) in (&mut pairs).zip(&mut bytes) {
            f(&mut o[0], low(*c) * scale);
            f(&mut o[1], high(*c) * scale);
        }
        if let (Some(o), Some(c)) = (pairs.into_remainder().first_mut(), bytes.next()) {
            f(o, low(*c) * scale);
        }
    }
}

impl Codec for Int4Block {
    fn kind(&self) -> CodecKind {
        CodecKind::Int4Block
    }

    fn encoded_len(&self, n: usize) -> usize {
        n.div_ceil(2) + 4 * n.div_ceil(BLOCK)
    }

    fn check(&self, src: &[u8]) -> Result<(), BadEncoding> {
        blockwise::check::<Self>(src)
    }

    fn encode(&self, src: &[f32], dst: &mut [u8]) {
        blockwise::encode::<Self>(self, src, dst);
    }

    fn decode_accumulate(&self, src: &[u8], dst: &mut [f32]) {
        blockwise::decode::<Self>(self, src, dst, true);
    }

    fn decode(&self, src: &[u8], dst: &mut [f32]) {
        blockwise::decode::<Self>(self, src, dst, false);
    }

    /// Fused, block by block (each block reduced, scaled and quantised while it is in the L1
    /// cache): the same bytes as the default.
    fn reduce_encode(
        &self,
        src: &[u8],
        own: &[f32],
        weight: f32,
        _scratch: &mut [f32],
        dst: &mut [u8],
    ) {
        blockwise::reduce_encode::<Self>(self, src, own, weight, dst);
    }

    /// Fused, block by block (averaged, encoded and decoded back while in the L1 cache): the
    /// same bytes and values as the default.
    fn reduce_average(
        &self,
        src: &[u8],
        own: &mut [f32],
        weight: f32,
        weight_sum: f64,
        _scratch: &mut [f32],
        dst: &mut [u8],
    ) {
        blockwise::reduce_average::<Self>(self, src, own, weight, weight_sum, dst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(x: &[f32]) -> (Vec<u8>, Vec<f32>) {
        let mut e = vec![0u8; Int4Block.encoded_len(x.len())];
        Int4Block.encode(x, &mut e);
        let mut d = vec![0.0f32; x.len()];
        Int4Block.decode(&e, &mut d);
        (e, d)
    }

    fn scales(e: &[u8]) -> Vec<f32> {
        e.chunks(BLOCK_BYTES).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
    }

    #[test]
    fn layout_is_scale_then_packed_nibbles_per_block() {
        // Block 0 holds -100..=155, block 1 holds 156..=200 (45 values, an odd count).
        let x: Vec<f32> = (0..301).map(|i| i as f32 - 100.0).collect();
        let (e, _) = round_trip(&x);
        assert_eq!(e.len(), 4 + 128 + 4 + 23);
        assert_eq!(scales(&e), vec![155.0 / 7.0, 200.0 / 7.0]);
        // -100 is round(-100 * 7 / 155) = round(-4.52) = -5 (0xb), -99 is round(-4.47) = -4
        // (0xc): low nibble first.
        assert_eq!(e[4], 0xcb);
        // 154 and 155 are both 7.
        assert_eq!(e[4 + 127], 0x77);
        // The last byte holds 200 (7) alone; 198 and 199 are both round(6.93..6.97) = 7.
        assert_eq!(e[BLOCK_BYTES + 4 + 22], 0x07);
        assert_eq!(e[BLOCK_BYTES + 4 + 21], 0x77);
        // Negative extremes: -7 is 0x9.
        let (e, d) = round_trip(&[-1.0, 1.0, -0.5]);
        // -0.5 * 7 = -3.5 rounds half to even: -4 (0xc).
        assert_eq!(&e[4..], &[0x79, 0x0c]);
        let s = 1.0f32 / 7.0;
        assert_eq!(d, vec![-7.0 * s, 7.0 * s, -4.0 * s]);
    }

    #[test]
    fn every_code_decodes_to_its_level() {
        let scale = 0.5f32;
        for b in 0..=255u8 {
            let mut e = scale.to_le_bytes().to_vec();
            e.push(b);
            let mut d = [0.0f32; 2];
            Int4Block.decode(&e, &mut d);
            let nib = |v: u8| if v < 8 { f32::from(v) } else { f32::from(v) - 16.0 };
            assert_eq!(d, [nib(b & 15) * scale, nib(b >> 4) * scale], "byte {b:#x}");
        }
    }

    #[test]
    fn zeros_one_element_and_constants_are_exact() {
        for n in [1usize, 3, 255, 256, 257, 1000] {
            let (e, d) = round_trip(&vec![0.0; n]);
            assert!(d.iter().all(|&v| v == 0.0));
            assert!(e.iter().all(|&b| b == 0), "zeros: scale 0, codes 0");
            let (_, d) = round_trip(&vec![-2.5e-3; n]);
            assert!(d.iter().all(|&v| (v + 2.5e-3).abs() <= 2.5e-3 * f32::EPSILON), "n {n}");
        }
        for v in [1.0f32, -3.5, 1e-30, 7.25e30] {
            let d = round_trip(&[v]).1[0];
            assert!((d - v).abs() <= v.abs() * f32::EPSILON, "{v} -> {d}");
        }
        // Near the top of the range: within one ulp, never overflowing.
        for v in [f32::MAX, f32::MIN, f32::from_bits(0x3ffe_0001), -f32::from_bits(0x3ffe_0003)] {
            let d = round_trip(&[v]).1[0];
            assert!(d.is_finite() && (d - v).abs() <= v.abs() * f32::EPSILON, "{v} -> {d}");
        }
        // A subnormal scale carries fewer bits: 7 codes of at most 2^-150 error each.
        let v = f32::MIN_POSITIVE;
        let d = round_trip(&[v]).1[0];
        assert!(f64::from((d - v).abs()) <= 7.0 * 2f64.powi(-150), "{v} -> {d}");
    }

    #[test]
    fn non_finite_values_follow_the_documented_rule() {
        let mut x: Vec<f32> = (0..600).map(|i| (i as f32 * 0.37).sin()).collect();
        x[1] = f32::NAN;
        x[2] = f32::INFINITY;
        x[3] = f32::NEG_INFINITY;
        let (e, d) = round_trip(&x);
        let a = x[..256].iter().filter(|v| v.is_finite()).fold(0.0f32, |m, v| m.max(v.abs()));
        assert_eq!(scales(&e)[0], a / 7.0);
        // Byte 4 + 0: values 0 (any) and 1 (NaN: 0); byte 4 + 1: values 2 (+inf: 7), 3 (-inf: -7).
        assert_eq!(e[4] >> 4, 0);
        assert_eq!(e[5], 0x97);
        assert_eq!(d[1], 0.0);
        assert!((d[2] - a).abs() <= a * 1e-6 && (d[3] + a).abs() <= a * 1e-6);
        // A block of nothing finite decodes to zeros.
        let (e, d) = round_trip(&[f32::NAN, f32::INFINITY, f32::NEG_INFINITY]);
        assert_eq!(scales(&e), vec![0.0]);
        assert_eq!(d, vec![0.0; 3]);
    }

    #[test]
    fn tiny_blocks_keep_their_shape() {
        // 2^-130 .. subnormals: 7 / a loses bits or does not fit an f32.
        let x: Vec<f32> = (0..256).map(|i| (i as f32 - 128.0) * 1e-40).collect();
        let (e, d) = round_trip(&x);
        let scale = scales(&e)[0];
        assert!(scale > 0.0);
        for (a, b) in x.iter().zip(&d) {
            // A subnormal scale is rounded to a multiple of 2^-149: 7 codes of 2^-150 each.
            let bound = f64::from(scale) * 0.5 + 7.0 * 2f64.powi(-150);
            assert!(f64::from((a - b).abs()) <= bound, "{a} -> {b}, scale {scale}");
        }
        assert!(d.iter().any(|&v| v != 0.0));
    }
}
