//! PRIME's uint8 codebook codec. (Being built.)

use super::{Codec, CodecKind};

/// PRIME's 8-bit codebook scheme.
#[derive(Clone, Copy, Debug, Default)]
pub struct Uint8;

impl Codec for Uint8 {
    fn kind(&self) -> CodecKind { CodecKind::Uint8 }
    fn encoded_len(&self, n: usize) -> usize { 1024 + n }
    fn encode(&self, _src: &[f32], _dst: &mut [u8]) { todo!() }
    fn decode_accumulate(&self, _src: &[u8], _dst: &mut [f32]) { todo!() }
    fn decode(&self, _src: &[u8], _dst: &mut [f32]) { todo!() }
}
