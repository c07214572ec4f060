//! 16-bit codecs: IEEE half precision ([`Fp16`]) and bfloat16 ([`Bf16`]).
//!
//! # Scheme and defined results
//!
//! Each value is rounded to the nearest 16-bit float, ties to even, and decodes to that float
//! exactly (widening is exact). Relative error per value is at most 2^-11 for fp16 (normal range
//! `6.1e-5 ..= 65504`) and 2^-8 for bf16 (the whole f32 range). Special values behave as IEEE
//! conversions do: NaN stays NaN, `+-inf` stays `+-inf`, fp16 turns finite values beyond 65504
//! (beyond 65520 after rounding) into `+-inf` and values below its subnormal range into `+-0`. These
//! codecs are for data known to be in range; `uint8`, `int8-block` and `int4-block` map every
//! input to finite values.
//!
//! # Layout (little endian)
//!
//! One `u16` per value in input order: `encoded_len(n) = 2 n`, 2 bytes per value.
//!
//! # Cost
//!
//! fp16 uses the `half` crate's slice conversions (F16C instructions when the CPU has them,
//! detected at run time) on stack buffers of [`CHUNK`] values; bf16 is a branch-free bit
//! manipulation the compiler vectorises, bit-identical to `half::bf16::from_f32` / `to_f32`.

use super::{BadEncoding, Codec, CodecKind};
use half::f16;
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};

/// Values converted per stack buffer.
const CHUNK: usize = 512;

/// IEEE half precision (binary16), round to nearest even; 2 bytes per value.
#[derive(Clone, Copy, Debug, Default)]
pub struct Fp16;

/// bfloat16 (the top half of an f32), round to nearest even; 2 bytes per value.
#[derive(Clone, Copy, Debug, Default)]
pub struct Bf16;

/// Decodes fp16 bytes and applies `f(dst value, decoded value)`, [`CHUNK`] values at a time:
/// bytes to a stack buffer of `u16` (a flat loop the compiler vectorises), then the `half`
/// crate's slice conversion (F16C when available) into a stack buffer of f32.
#[inline(always)]
fn fp16_decode_with(src: &[u8], dst: &mut [f32], f: impl Fn(&mut f32, f32)) {
    let mut bits = [0u16; CHUNK];
    let mut floats = [0.0f32; CHUNK];
    for (s, d) in src.chunks(2 * CHUNK).zip(dst.chunks_mut(CHUNK)) {
        let n = d.len();
        for (h, b) in bits[..n].iter_mut().zip(s.chunks_exact(2)) {
            *h = u16::from_le_bytes([b[0], b[1]]);
        }
        bits[..n].reinterpret_cast::<f16>().convert_to_f32_slice(&mut floats[..n]);
        for (o, &v) in d.iter_mut().zip(&floats[..n]) {
            f(o, v);
        }
    }
}

impl Codec for Fp16 {
    fn kind(&self) -> CodecKind {
        CodecKind::Fp16
    }

    fn encoded_len(&self, n: usize) -> usize {
        2 * n
    }

    fn check(&self, src: &[u8]) -> Result<(), BadEncoding> {
        let value = |s: [u8; 2]| f16::from_le_bytes(s).to_f32();
        super::check_floats(src, half_magnitude, 0x7c00, value, "value")
    }

    fn encode(&self, src: &[f32], dst: &mut [u8]) {
        assert_eq!(dst.len(), self.encoded_len(src.len()), "fp16 encode: wrong buffer length");
        let mut halves = [f16::ZERO; CHUNK];
        for (s, d) in src.chunks(CHUNK).zip(dst.chunks_mut(2 * CHUNK)) {
            let halves = &mut halves[..s.len()];
            halves.convert_from_f32_slice(s);
            for (o, h) in d.chunks_exact_mut(2).zip(halves.iter()) {
                o.copy_from_slice(&h.to_le_bytes());
            }
        }
    }

    fn decode_accumulate(&self, src: &[u8], dst: &mut [f32]) {
        assert_eq!(src.len(), self.encoded_len(dst.len()), "fp16 decode: wrong buffer length");
        fp16_decode_with(src, dst, |d, v| *d += v);
    }

    fn decode(&self, src: &[u8], dst: &mut [f32]) {
        assert_eq!(src.len(), self.encoded_len(dst.len()), "fp16 decode: wrong buffer length");
        fp16_decode_with(src, dst, |d, v| *d = v);
    }
}

/// The bits of a 16-bit float's magnitude (sign cleared), from its little-endian bytes.
#[inline(always)]
fn half_magnitude(s: [u8; 2]) -> u32 {
    u32::from(u16::from_le_bytes(s) & 0x7fff)
}

/// f32 -> bf16 bits, round to nearest even; NaN stays NaN (quieted, sign and top payload kept).
#[inline(always)]
fn to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    let is_nan = b & 0x7fff_ffff > 0x7f80_0000;
    // Adding 0x7fff plus the lowest kept bit rounds half to even; it carries into the exponent
    // when needed (up to inf), and cannot overflow for non-NaN inputs.
    let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16;
    let nan = (b >> 16) | 0x40;
    // Truncation intended: both are 16-bit values in a u32.
    (if is_nan { nan } else { rounded }) as u16
}

/// bf16 bits -> f32 (exact).
#[inline(always)]
fn from_bf16(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

impl Codec for Bf16 {
    fn kind(&self) -> CodecKind {
        CodecKind::Bf16
    }

    fn encoded_len(&self, n: usize) -> usize {
        2 * n
    }

    fn check(&self, src: &[u8]) -> Result<(), BadEncoding> {
        let value = |s: [u8; 2]| from_bf16(u16::from_le_bytes(s));
        super::check_floats(src, half_magnitude, 0x7f80, value, "value")
    }

    fn encode(&self, src: &[f32], dst: &mut [u8]) {
        assert_eq!(dst.len(), self.encoded_len(src.len()), "bf16 encode: wrong buffer length");
        for (o, &x) in dst.chunks_exact_mut(2).zip(src) {
            o.copy_from_slice(&to_bf16(x).to_le_bytes());
        }
    }

    fn decode_accumulate(&self, src: &[u8], dst: &mut [f32]) {
        assert_eq!(src.len(), self.encoded_len(dst.len()), "bf16 decode: wrong buffer length");
        for (d, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
            *d += from_bf16(u16::from_le_bytes([b[0], b[1]]));
        }
    }

    fn decode(&self, src: &[u8], dst: &mut [f32]) {
        assert_eq!(src.len(), self.encoded_len(dst.len()), "bf16 decode: wrong buffer length");
        for (d, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
            *d = from_bf16(u16::from_le_bytes([b[0], b[1]]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Random bit patterns (every class: normals, subnormals, zeros, inf, NaN), plus the edges.
    fn patterns() -> Vec<f32> {
        let mut rng = ChaCha8Rng::seed_from_u64(16);
        let mut v: Vec<f32> = (0..200_000).map(|_| f32::from_bits(rng.random())).collect();
        v.extend([
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MAX,
            f32::MIN,
            f32::MIN_POSITIVE,
            1e-45,
            65504.0,
            65519.0,
            65520.0,
            1.0 + f32::EPSILON,
            f32::from_bits(0x3f80_8000), // a bf16 tie, even below
            f32::from_bits(0x3f81_8000), // a bf16 tie, even above
            f32::from_bits(0x7f7f_ffff),
        ]);
        v
    }

    fn round_trip(c: &dyn Codec, x: &[f32]) -> Vec<f32> {
        let mut e = vec![0u8; c.encoded_len(x.len())];
        c.encode(x, &mut e);
        let mut d = vec![0.0; x.len()];
        c.decode(&e, &mut d);
        d
    }

    /// Same bits (NaN payloads included) as the `half` crate's scalar conversions.
    #[test]
    fn bit_identical_to_half_scalar_conversions() {
        let x = patterns();
        let fp16 = round_trip(&Fp16, &x);
        let bf = round_trip(&Bf16, &x);
        for (i, &v) in x.iter().enumerate() {
            let want16 = f16::from_f32(v).to_f32();
            let wantbf = bf16::from_f32(v).to_f32();
            assert!(
                fp16[i].to_bits() == want16.to_bits() || (v.is_nan() && fp16[i].is_nan()),
                "fp16 {v:e}"
            );
            assert_eq!(bf[i].to_bits(), wantbf.to_bits(), "bf16 {v:e} ({:#x})", v.to_bits());
        }
    }

    #[test]
    fn encoded_bytes_are_little_endian_bits() {
        let x = [1.0f32, -2.0, 0.5];
        let mut e = [0u8; 6];
        Fp16.encode(&x, &mut e);
        assert_eq!(e, [0x00, 0x3c, 0x00, 0xc0, 0x00, 0x38]);
        Bf16.encode(&x, &mut e);
        assert_eq!(e, [0x80, 0x3f, 0x00, 0xc0, 0x00, 0x3f]);
    }

    #[test]
    fn relative_error_bounds() {
        let mut rng = ChaCha8Rng::seed_from_u64(17);
        let x: Vec<f32> = (0..100_003).map(|_| rng.random_range(-60000.0f32..60000.0)).collect();
        for (c, bound) in [(&Fp16 as &dyn Codec, 2f32.powi(-11)), (&Bf16, 2f32.powi(-8))] {
            let d = round_trip(c, &x);
            let mut worst = 0.0f32;
            for (a, b) in x.iter().zip(&d) {
                if a.abs() >= 6.2e-5 {
                    worst = worst.max((a - b).abs() / a.abs());
                }
            }
            assert!(worst <= bound, "{}: {worst}", c.kind());
            // The bound is tight: round to nearest uses most of it.
            assert!(worst > bound * 0.9, "{}: {worst}", c.kind());
        }
    }

    #[test]
    fn special_values() {
        let x = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e6, -1e6, 1e-9, -0.0];
        let d = round_trip(&Fp16, &x);
        assert!(d[0].is_nan());
        assert_eq!(
            &d[1..],
            &[f32::INFINITY, f32::NEG_INFINITY, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0]
        );
        assert!(d[6].is_sign_negative());
        let d = round_trip(&Bf16, &x);
        assert!(d[0].is_nan());
        assert_eq!(d[1], f32::INFINITY);
        assert!((d[3] - 1e6).abs() <= 1e6 / 256.0 && d[5] > 0.0);
    }
}
