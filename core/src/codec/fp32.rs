//! The exact codec: little-endian f32.
//!
//! # Scheme, layout and defined results
//!
//! Each value is sent as its four bytes, little endian, in input order: `encoded_len(n) = 4 n`,
//! 4 bytes per value. Decoding gives back the same bits, NaN payloads, infinities and signed zeros
//! included; `decode_accumulate` adds them with ordinary f32 addition (so a NaN or inf in the
//! input propagates into the sum, as it would without a codec). The loops compile to plain vector
//! copies and adds.

use super::{BadEncoding, Codec, CodecKind};

/// 32-bit floats, little endian; exact (4 bytes per value).
#[derive(Clone, Copy, Debug, Default)]
pub struct Fp32;

impl Codec for Fp32 {
    fn kind(&self) -> CodecKind {
        CodecKind::Fp32
    }

    fn encoded_len(&self, n: usize) -> usize {
        4 * n
    }

    fn check(&self, src: &[u8]) -> Result<(), BadEncoding> {
        super::check_f32s(src, "value")
    }

    fn encode(&self, src: &[f32], dst: &mut [u8]) {
        assert_eq!(dst.len(), self.encoded_len(src.len()), "fp32 encode: wrong buffer length");
        for (d, s) in dst.chunks_exact_mut(4).zip(src) {
            d.copy_from_slice(&s.to_le_bytes());
        }
    }

    fn decode_accumulate(&self, src: &[u8], dst: &mut [f32]) {
        assert_eq!(src.len(), self.encoded_len(dst.len()), "fp32 decode: wrong buffer length");
        for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
            *d += f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
        }
    }

    /// One pass instead of three: read both inputs, write the output bytes.
    fn reduce_encode(
        &self,
        src: &[u8],
        own: &[f32],
        weight: f32,
        _scratch: &mut [f32],
        dst: &mut [u8],
    ) {
        super::assert_reduce_lengths(self, src, own.len(), dst);
        let chunks = dst.chunks_exact_mut(4).zip(src.chunks_exact(4)).zip(own);
        if weight == 0.0 {
            for ((d, s), _) in chunks {
                let v = 0.0 + f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
                d.copy_from_slice(&v.to_le_bytes());
            }
        } else if weight == 1.0 {
            for ((d, s), o) in chunks {
                let v = o + f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
                d.copy_from_slice(&v.to_le_bytes());
            }
        } else {
            for ((d, s), o) in chunks {
                let v = weight * o + f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
                d.copy_from_slice(&v.to_le_bytes());
            }
        }
    }

    /// One pass: reads the values and the received bytes once, writes the average into both
    /// the output bytes and the values.
    fn reduce_average(
        &self,
        src: &[u8],
        own: &mut [f32],
        weight: f32,
        weight_sum: f64,
        _scratch: &mut [f32],
        dst: &mut [u8],
    ) {
        super::assert_reduce_lengths(self, src, own.len(), dst);
        if weight_sum <= 0.0 {
            dst.fill(0);
            own.fill(0.0);
            return;
        }
        let ws = weight_sum as f32;
        // The default's arithmetic: weigh (0 gives 0, 1 leaves the value), add, divide.
        if weight == 0.0 {
            average_pass(src, own, dst, ws, |_| 0.0);
        } else if weight == 1.0 {
            average_pass(src, own, dst, ws, |o| o);
        } else {
            average_pass(src, own, dst, ws, |o| weight * o);
        }
    }

    /// Large outputs are written with streaming stores where the processor has them (the same
    /// bits; see `stream`).
    fn decode(&self, src: &[u8], dst: &mut [f32]) {
        assert_eq!(src.len(), self.encoded_len(dst.len()), "fp32 decode: wrong buffer length");
        #[cfg(target_arch = "x86_64")]
        {
            let one = |i: usize| {
                let s = &src[4 * i..4 * i + 4];
                f32::from_le_bytes([s[0], s[1], s[2], s[3]])
            };
            let block = |i: usize, out: &mut [f32; super::stream::BLOCK]| {
                let bytes = &src[4 * i..4 * (i + super::stream::BLOCK)];
                for (o, s) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                    *o = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
                }
            };
            if super::stream::fill(dst, one, block) {
                return;
            }
        }
        for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
            *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
        }
    }
}

/// `v = (weigh(own) + decode(src)) / ws`, written into `dst` as bytes and into `own`.
#[inline(always)]
fn average_pass(src: &[u8], own: &mut [f32], dst: &mut [u8], ws: f32, weigh: impl Fn(f32) -> f32) {
    let values = dst.chunks_exact_mut(4).zip(src.chunks_exact(4)).zip(own.iter_mut());
    for ((d, s), o) in values {
        let v = (weigh(*o) + f32::from_le_bytes([s[0], s[1], s[2], s[3]])) / ws;
        d.copy_from_slice(&v.to_le_bytes());
        *o = v;
    }
}
