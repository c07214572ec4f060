//! Blockwise absmax int8 codec. (Being built.)

use super::{Codec, CodecKind};

/// Blockwise absmax int8.
#[derive(Clone, Copy, Debug, Default)]
pub struct Int8Block;

impl Codec for Int8Block {
    fn kind(&self) -> CodecKind { CodecKind::Int8Block }
    fn encoded_len(&self, n: usize) -> usize { n + 4 * n.div_ceil(256) }
    fn encode(&self, _src: &[f32], _dst: &mut [u8]) { todo!() }
    fn decode_accumulate(&self, _src: &[u8], _dst: &mut [f32]) { todo!() }
    fn decode(&self, _src: &[u8], _dst: &mut [f32]) { todo!() }
}
