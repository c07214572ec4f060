//! 16-bit codecs. (Being built.)

use super::{Codec, CodecKind};

/// IEEE half precision.
#[derive(Clone, Copy, Debug, Default)]
pub struct Fp16;
/// bfloat16.
#[derive(Clone, Copy, Debug, Default)]
pub struct Bf16;

impl Codec for Fp16 {
    fn kind(&self) -> CodecKind { CodecKind::Fp16 }
    fn encoded_len(&self, n: usize) -> usize { 2 * n }
    fn encode(&self, _src: &[f32], _dst: &mut [u8]) { todo!() }
    fn decode_accumulate(&self, _src: &[u8], _dst: &mut [f32]) { todo!() }
    fn decode(&self, _src: &[u8], _dst: &mut [f32]) { todo!() }
}
impl Codec for Bf16 {
    fn kind(&self) -> CodecKind { CodecKind::Bf16 }
    fn encoded_len(&self, n: usize) -> usize { 2 * n }
    fn encode(&self, _src: &[f32], _dst: &mut [u8]) { todo!() }
    fn decode_accumulate(&self, _src: &[u8], _dst: &mut [f32]) { todo!() }
    fn decode(&self, _src: &[u8], _dst: &mut [f32]) { todo!() }
}
