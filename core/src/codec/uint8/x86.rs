//! The plain path's kernel ([`super::plain_kernel`]) written with AVX2 intrinsics, for x86-64
//! processors that have AVX2 (checked at run time; otherwise the portable kernel runs).
//!
//! Same arithmetic, operation for operation, as the portable kernel (the same f32 multiply,
//! min, max, add and subtract per value, and the same f32 adds into the same histogram bins in
//! the same order), so its codes and histograms are identical bit for bit; a property test checks
//! this against the portable kernel. What differs is how the work is laid out: the codes of eight
//! values leave the vector unit as one 64-bit integer, whose bytes index the histograms directly,
//! and each value's `[x - centre, 1]` pair is taken from a vector register instead of a buffer in
//! memory, so the histogram update of a value costs one load (the bin) instead of three (code,
//! pair, bin). The quantisation of the next 16 values is issued before the histogram update of
//! the previous 16, so that the bin addresses are known early.
//!
//! The only `unsafe` is the call into the `#[target_feature(enable = "avx2")]` function, after
//! `is_x86_feature_detected!("avx2")`; the function body is safe code (no pointers).

#![allow(unsafe_code)]

use super::{HISTS, Hists32, ROUND_MAGIC};
use std::arch::x86_64::{
    __m256, __m256i, _mm_add_ps, _mm_castpd_ps, _mm_castps_pd, _mm_cvtsd_f64, _mm_cvtsi128_si64,
    _mm_movehl_ps, _mm_set_sd, _mm256_add_ps, _mm256_castps_si256, _mm256_castps256_ps128,
    _mm256_castsi256_si128, _mm256_extractf128_ps, _mm256_max_ps, _mm256_min_ps, _mm256_mul_ps,
    _mm256_permutevar8x32_epi32, _mm256_set1_ps, _mm256_setr_epi8, _mm256_setr_epi32,
    _mm256_setr_ps, _mm256_shuffle_epi8, _mm256_sub_ps, _mm256_unpackhi_ps, _mm256_unpacklo_ps,
};

/// Values per step of the kernel's loop: two vectors of eight.
pub(super) const STEP: usize = 16;

/// Runs the kernel with AVX2 where the processor has it and returns true; returns false (having
/// done nothing) where it does not.
///
/// Same contract as [`super::plain_kernel`]: `src` and `codes` of the same length, a multiple of
/// [`STEP`], starting at a value whose index is a multiple of 4.
pub(super) fn plain_kernel(
    src: &[f32],
    codes: &mut [u8],
    inv: f32,
    scale: f32,
    h: &mut Hists32,
) -> bool {
    assert!(
        src.len() == codes.len() && src.len().is_multiple_of(STEP),
        "uint8 kernel: bad lengths"
    );
    if !std::arch::is_x86_feature_detected!("avx2") {
        return false;
    }
    // SAFETY: the only requirement for calling a `#[target_feature(enable = "avx2")]` function is
    // that the processor supports AVX2, which was checked just above.
    unsafe { kernel(src, codes, inv, scale, h) };
    true
}

/// Broadcast constants of the kernel.
struct Consts {
    /// Reciprocal of the bin width.
    inv: __m256,
    /// Bin width (centres are `(q - 128) * scale`).
    scale: __m256,
    /// Upper clamp of `x * inv`.
    hi: __m256,
    /// Lower clamp of `x * inv`.
    lo: __m256,
    /// `ROUND_MAGIC + 128`.
    magic: __m256,
    /// The count half of a pair.
    one: __m256,
    /// Picks the low byte of each 32-bit lane into the low four bytes of each 128-bit half.
    low_bytes: __m256i,
    /// Brings the two halves' four bytes together into the low eight bytes.
    join: __m256i,
}

/// Eight values, one vector: writes their codes and returns them as one little-endian u64, with
/// the pairs `[x - centre, 1]` interleaved in two vectors: `[p0, p1 | p4, p5]` and
/// `[p2, p3 | p6, p7]`.
#[inline]
#[target_feature(enable = "avx2")]
fn quantise8(x: &[f32; 8], codes: &mut [u8; 8], k: &Consts) -> (u64, __m256, __m256) {
    let x = _mm256_setr_ps(x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7]);
    // magic(x * inv): `min` and `max` return their second operand when the first is NaN, as
    // the portable `if y < 127 { y } else { 127 }` does.
    let y = _mm256_mul_ps(x, k.inv);
    let t = _mm256_max_ps(_mm256_min_ps(y, k.hi), k.lo);
    let m = _mm256_add_ps(t, k.magic);
    // x - centre(m - (ROUND_MAGIC + 128), scale).
    let d = _mm256_sub_ps(x, _mm256_mul_ps(_mm256_sub_ps(m, k.magic), k.scale));
    let b = _mm256_shuffle_epi8(_mm256_castps_si256(m), k.low_bytes);
    let b = _mm256_permutevar8x32_epi32(b, k.join);
    // Bit reinterpretation intended: eight code bytes.
    let w = _mm_cvtsi128_si64(_mm256_castsi256_si128(b)) as u64;
    *codes = w.to_le_bytes();
    (w, _mm256_unpacklo_ps(d, k.one), _mm256_unpackhi_ps(d, k.one))
}

/// Adds the eight pairs of [`quantise8`] into their bins, value `j` into histogram `j % 4`.
#[inline]
#[target_feature(enable = "avx2")]
fn scatter8(h: &mut Hists32, w: u64, lo: __m256, hi: __m256) {
    let (l0, h0) = (_mm256_castps256_ps128(lo), _mm256_castps256_ps128(hi));
    let (l1, h1) = (_mm256_extractf128_ps::<1>(lo), _mm256_extractf128_ps::<1>(hi));
    // Pair j in the low 64 bits of pairs[j] (the high 64 bits are ignored).
    let pairs = [
        l0,
        _mm_movehl_ps(l0, l0),
        h0,
        _mm_movehl_ps(h0, h0),
        l1,
        _mm_movehl_ps(l1, l1),
        h1,
        _mm_movehl_ps(h1, h1),
    ];
    for (j, p) in pairs.into_iter().enumerate() {
        let bin = &mut h[j % HISTS][usize::from((w >> (8 * j)) as u8)];
        let old = u64::from(bin[0].to_bits()) | (u64::from(bin[1].to_bits()) << 32);
        let sum = _mm_add_ps(_mm_castpd_ps(_mm_set_sd(f64::from_bits(old))), p);
        let new = _mm_cvtsd_f64(_mm_castps_pd(sum)).to_bits();
        // Truncation intended: the two f32 halves.
        *bin = [f32::from_bits(new as u32), f32::from_bits((new >> 32) as u32)];
    }
}

/// The kernel: quantises 16 values, then adds the 16 before them into the histograms.
#[target_feature(enable = "avx2")]
fn kernel(src: &[f32], codes: &mut [u8], inv: f32, scale: f32, h: &mut Hists32) {
    let k = Consts {
        inv: _mm256_set1_ps(inv),
        scale: _mm256_set1_ps(scale),
        hi: _mm256_set1_ps(127.0),
        lo: _mm256_set1_ps(-128.0),
        magic: _mm256_set1_ps(ROUND_MAGIC + 128.0),
        one: _mm256_set1_ps(1.0),
        low_bytes: _mm256_setr_epi8(
            0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, //
            0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
        ),
        join: _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1),
    };
    let mut pending = None;
    for (s, c) in src.chunks_exact(STEP).zip(codes.chunks_exact_mut(STEP)) {
        let (s0, s1) = s.split_at(8);
        let (c0, c1) = c.split_at_mut(8);
        let a = quantise8(s0.try_into().expect("8 values"), c0.try_into().expect("8 codes"), &k);
        let b = quantise8(s1.try_into().expect("8 values"), c1.try_into().expect("8 codes"), &k);
        if let Some(((wa, la, ha), (wb, lb, hb))) = pending {
            scatter8(h, wa, la, ha);
            scatter8(h, wb, lb, hb);
        }
        pending = Some((a, b));
    }
    if let Some(((wa, la, ha), (wb, lb, hb))) = pending {
        scatter8(h, wa, la, ha);
        scatter8(h, wb, lb, hb);
    }
}
