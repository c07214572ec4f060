//! Non-temporal (streaming) stores for decoders that write large outputs.
//!
//! A decoder's output in the all-gather is the final result of the all-reduce: megabytes that
//! nothing reads again soon. Ordinary stores first read every cache line they write (the
//! processor must own the line before it can change part of it), so a decode into memory costs
//! a read and a write of the output; on a machine short of memory bandwidth that read is a third
//! of the decoder's traffic. Streaming stores write whole lines without reading them, and leave
//! the caches to the data that is used again (the encoded bytes, the scratch segment).
//!
//! [`fill`] writes a slice through them on x86-64 processors with AVX (checked at run time),
//! 16 values (two 32-byte vectors, one 64-byte line) at a time from 32-byte-aligned addresses;
//! the unaligned head and the short tail get ordinary stores. Where AVX is missing, or the slice
//! is shorter than [`MIN_VALUES`], it returns `false` having written nothing, and the caller
//! takes its ordinary path. The values written are the caller's, bit for bit: only how they reach
//! memory differs.
//!
//! The module is one of the codecs' two places with `unsafe` (the other is the uint8 AVX2
//! kernel): the streaming store intrinsic takes a raw pointer, and the call into the
//! `target_feature` function needs the feature check before it.

#![allow(unsafe_code)]

use std::arch::x86_64::{_mm_sfence, _mm256_loadu_ps, _mm256_stream_ps};

/// Shorter outputs take the ordinary stores (they may well be read again while in cache).
pub(crate) const MIN_VALUES: usize = 1 << 15;

/// Values per streamed block: one 64-byte cache line.
pub(crate) const BLOCK: usize = 16;

/// Writes `dst[i] = one(i)` for every `i`, with streaming stores for the 32-byte-aligned blocks
/// of 16 values (`block(i, out)` fills `out[k] = one(i + k)`), when the processor has AVX and
/// `dst` holds at least [`MIN_VALUES`] values. Returns `false`, having written nothing,
/// otherwise. `block` is `one` for 16 values at once: built from `one`, the lookups' bounds
/// checks per value took about a quarter more time.
#[inline]
pub(crate) fn fill(
    dst: &mut [f32],
    one: impl Fn(usize) -> f32,
    block: impl Fn(usize, &mut [f32; BLOCK]),
) -> bool {
    if dst.len() < MIN_VALUES || !std::arch::is_x86_feature_detected!("avx") {
        return false;
    }
    // SAFETY: the only requirement for calling a `#[target_feature(enable = "avx")]` function is
    // that the processor supports AVX, which was checked just above.
    unsafe { fill_avx(dst, one, block) };
    true
}

#[target_feature(enable = "avx")]
fn fill_avx(dst: &mut [f32], one: impl Fn(usize) -> f32, block: impl Fn(usize, &mut [f32; BLOCK])) {
    // f32 slices are 4-byte aligned: the head is 0 to 7 values.
    let head = ((32 - dst.as_ptr() as usize % 32) % 32 / 4).min(dst.len());
    let body = (dst.len() - head) / BLOCK * BLOCK;
    let (first, rest) = dst.split_at_mut(head);
    let (middle, tail) = rest.split_at_mut(body);
    for (i, d) in first.iter_mut().enumerate() {
        *d = one(i);
    }
    let mut v = [0.0f32; BLOCK];
    for (j, line) in middle.chunks_exact_mut(BLOCK).enumerate() {
        block(head + j * BLOCK, &mut v);
        let p = line.as_mut_ptr();
        // SAFETY: `line` is 16 values of `dst`, starting at a 32-byte-aligned address (the head
        // brought the first one there, and every block is 64 bytes): both 8-value stores are in
        // bounds and aligned, as `_mm256_stream_ps` requires. `v` is 16 readable values.
        unsafe {
            _mm256_stream_ps(p, _mm256_loadu_ps(v.as_ptr()));
            _mm256_stream_ps(p.add(8), _mm256_loadu_ps(v.as_ptr().add(8)));
        }
    }
    // Streaming stores are weakly ordered: make them visible before anything that follows (the
    // caller may hand the values to another thread).
    _mm_sfence();
    for (i, d) in tail.iter_mut().enumerate() {
        *d = one(head + body + i);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_is_written_whatever_the_alignment_and_length() {
        let n = MIN_VALUES + 37;
        let mut buf = vec![f32::NAN; n + 8];
        for offset in 0..8 {
            for len in [MIN_VALUES, MIN_VALUES + 1, MIN_VALUES + 15, MIN_VALUES + 29] {
                let dst = &mut buf[offset..offset + len];
                dst.fill(f32::NAN);
                let value = |i: usize| i as f32 * 0.5 - 3.0;
                let done = fill(dst, value, |i, out| {
                    for (k, o) in out.iter_mut().enumerate() {
                        *o = value(i + k);
                    }
                });
                if !done {
                    // No AVX here: nothing was written.
                    assert!(dst.iter().all(|v| v.is_nan()));
                    return;
                }
                for (i, v) in dst.iter().enumerate() {
                    assert_eq!(v.to_bits(), value(i).to_bits(), "offset {offset} len {len} i {i}");
                }
            }
        }
    }

    #[test]
    fn short_outputs_are_left_to_the_caller() {
        let mut dst = vec![1.0f32; MIN_VALUES - 1];
        assert!(!fill(&mut dst, |_| 2.0, |_, out| out.fill(2.0)));
        assert!(dst.iter().all(|&v| v == 1.0));
    }
}
