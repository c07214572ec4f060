//! Blockwise absmax int8: one f32 scale per block of 256 values.
//!
//! # Scheme
//!
//! The input is cut into blocks of [`BLOCK`] values (the last one shorter). For a block with
//! largest finite magnitude `a`, `scale = a / 127` and each value is sent as
//! `q = clamp(round_half_even(x * 127 / a), -127, 127)`, one signed byte; it decodes to
//! `q * scale`. The error of a finite value is at most `scale / 2` (up to f32 rounding: about
//! `1e-4 * scale`, and for subnormal scales the f32 spacing `2^-149`), which is much less than
//! `uint8`'s on the same bytes, because the bins follow each block's range instead of one RMS for
//! the whole chunk, and nothing is clipped.
//!
//! # Defined results on degenerate input
//!
//! - Empty input: nothing is written (`encoded_len(0) = 0`).
//! - A block of zeros (or with no finite non-zero value): scale 0, codes 0, decodes to 0.
//! - One element (or a block whose values are all equal in magnitude): decodes to `+-a` within
//!   one ulp (`127 * (a / 127)` rounds back to `a` exactly for 99.2% of normal `a`). Near
//!   `f32::MAX` the scale is rounded down one ulp so that `127 * scale` stays finite. Below
//!   `a = 127 * 2^-126` (1.5e-36) the scale is subnormal and the error up to `127 * 2^-150`.
//! - NaN is sent as 0; `+inf` as 127 and `-inf` as -127, so they decode to `+-a` of the finite
//!   values of their block (0 when there are none). Non-finite values never enter `a`, so a
//!   decode never yields NaN or inf.
//! - Blocks of tiny values (`a < 2^-120`, where `127 / a` does not fit an f32) are multiplied by
//!   2^64 (exactly) before binning; their f32 scale may be subnormal and then carries fewer bits.
//!
//! # Layout (little endian)
//!
//! Block after block, each one `f32` scale followed by one `i8` code per value:
//! `encoded_len(n) = n + 4 * ceil(n / 256)`, that is 1 + 4/256 = 1.016 bytes per value. Blocks can
//! be decoded independently.

use super::blockwise::{self, BLOCK, Format, LANES, code};
use super::{BadEncoding, Codec, CodecKind};

/// Encoded bytes of a full block: the f32 scale, then the codes.
const BLOCK_BYTES: usize = 4 + BLOCK;

/// Blockwise absmax int8: blocks of 256 values, each with one f32 scale (`absmax / 127`) and one
/// signed byte per value (see the module documentation for the rules and layout).
#[derive(Clone, Copy, Debug, Default)]
pub struct Int8Block;

impl Format for Int8Block {
    const LEVELS: f32 = 127.0;
    const BLOCK_BYTES: usize = BLOCK_BYTES;

    /// One signed byte per value.
    #[inline(always)]
    fn quantise<const PRE: bool>(src: &[f32], dst: &mut [u8], pre: f32, inv: f32) {
        let c = |x: f32| {
            if PRE { code(x * pre, inv, 127.0) } else { code(x, inv, 127.0) }
        };
        let mut s = src.chunks_exact(LANES);
        let mut d = dst.chunks_exact_mut(LANES);
        for (sc, dc) in (&mut s).zip(&mut d) {
            for i in 0..LANES {
                dc[i] = c(sc[i]);
            }
        }
        for (x, q) in s.remainder().iter().zip(d.into_remainder()) {
            *q = c(*x);
        }
    }

    #[inline(always)]
    fn decode_block(codes: &[u8], scale: f32, d: &mut [f32], f: &impl Fn(&mut f32, f32)) {
        let mut cs = codes.chunks_exact(LANES);
        let mut ds = d.chunks_exact_mut(LANES);
        for (c, o) in (&mut cs).zip(&mut ds) {
            for i in 0..LANES {
                f(&mut o[i], f32::from(c[i] as i8) * scale);
            }
        }
        for (c, o) in cs.remainder().iter().zip(ds.into_remainder()) {
            f(o, f32::from(*c as i8) * scale);
        }
    }
}

impl Codec for Int8Block {
    fn kind(&self) -> CodecKind {
        CodecKind::Int8Block
    }

    fn encoded_len(&self, n: usize) -> usize {
        n + 4 * n.div_ceil(BLOCK)
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
        let mut e = vec![0u8; Int8Block.encoded_len(x.len())];
        Int8Block.encode(x, &mut e);
        let mut d = vec![0.0f32; x.len()];
        Int8Block.decode(&e, &mut d);
        (e, d)
    }

    fn scales(e: &[u8]) -> Vec<f32> {
        e.chunks(BLOCK_BYTES).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
    }

    #[test]
    fn layout_is_scale_then_codes_per_block() {
        let x: Vec<f32> = (0..300).map(|i| i as f32 - 100.0).collect();
        let (e, _) = round_trip(&x);
        assert_eq!(e.len(), 300 + 8);
        let s = scales(&e);
        // Block 0 holds -100..=155, block 1 holds 156..=199.
        assert_eq!(s, vec![155.0 / 127.0, 199.0 / 127.0]);
        // The largest value of each block is code 127; -100 is round(-100 * 127 / 155) = -82.
        assert_eq!(e[4 + 255] as i8, 127);
        assert_eq!(e[4] as i8, -82);
        assert_eq!(e[BLOCK_BYTES + 4 + 43] as i8, 127);
    }

    #[test]
    fn zeros_one_element_and_constants_are_exact() {
        for n in [1usize, 3, 255, 256, 257, 1000] {
            let (_, d) = round_trip(&vec![0.0; n]);
            assert!(d.iter().all(|&v| v == 0.0));
            let (_, d) = round_trip(&vec![-2.5e-3; n]);
            assert!(d.iter().all(|&v| v == -2.5e-3), "n {n}");
        }
        for v in [1.0f32, -3.5, 1e-30, 7.25e30] {
            assert_eq!(round_trip(&[v]).1, vec![v]);
        }
        // Not every a / 127 multiplies back exactly: within one ulp, never overflowing.
        for v in [f32::MAX, f32::MIN, f32::from_bits(0x3ffe_0001), -f32::from_bits(0x3ffe_0003)] {
            let d = round_trip(&[v]).1[0];
            assert!(d.is_finite() && (d - v).abs() <= v.abs() * f32::EPSILON, "{v} -> {d}");
        }
        // A subnormal scale carries fewer bits: 127 codes of at most 2^-150 error each.
        let v = f32::MIN_POSITIVE;
        let d = round_trip(&[v]).1[0];
        assert!(d != v && f64::from((d - v).abs()) <= 127.0 * 2f64.powi(-150), "{v} -> {d}");
    }

    #[test]
    fn non_finite_values_follow_the_documented_rule() {
        let mut x: Vec<f32> = (0..600).map(|i| (i as f32 * 0.37).sin()).collect();
        x[1] = f32::NAN;
        x[2] = f32::INFINITY;
        x[3] = f32::NEG_INFINITY;
        let (e, d) = round_trip(&x);
        let a = x[..256].iter().filter(|v| v.is_finite()).fold(0.0f32, |m, v| m.max(v.abs()));
        assert_eq!(scales(&e)[0], a / 127.0);
        assert_eq!((e[5] as i8, e[6] as i8, e[7] as i8), (0, 127, -127));
        assert_eq!(d[1], 0.0);
        assert!((d[2] - a).abs() <= a * 1e-6 && (d[3] + a).abs() <= a * 1e-6);
        // A block of nothing finite decodes to zeros.
        let (e, d) = round_trip(&[f32::NAN, f32::INFINITY, f32::NEG_INFINITY]);
        assert_eq!(scales(&e), vec![0.0]);
        assert_eq!(d, vec![0.0; 3]);
    }

    #[test]
    fn tiny_blocks_keep_their_shape() {
        // 2^-130 .. subnormals: 127 / a does not fit an f32.
        let x: Vec<f32> = (0..256).map(|i| (i as f32 - 128.0) * 1e-40).collect();
        let (e, d) = round_trip(&x);
        let scale = scales(&e)[0];
        assert!(scale > 0.0);
        for (a, b) in x.iter().zip(&d) {
            // A subnormal scale is rounded to a multiple of 2^-149: 127 codes of 2^-150 each.
            let bound = f64::from(scale) * 0.5 + 127.0 * 2f64.powi(-150);
            assert!(f64::from((a - b).abs()) <= bound, "{a} -> {b}, scale {scale}");
        }
    }
}
