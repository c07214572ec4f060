//! The fixed facts of the state's format that the other files build on: the replicated part's
//! magic, header length and encoded length, and the one digest of a part's bytes. [`super::wire`]
//! has the encoding itself; this module depends on none of its siblings, so that the joiner's
//! buffer (`part`), the senders' plan (`plan`) and the encoding (`wire`) can all use it.

use crate::digest::Blake3Digest;

/// The first 8 bytes of an encoded [`SharedState`](super::SharedState): the format and its version.
pub const SHARED_MAGIC: [u8; 8] = *b"locoSS01";
/// Bytes before the floats: magic, outer steps, parameter count.
pub const SHARED_HEADER_LEN: u64 = 24;

/// Bytes of an encoded [`SharedState`](super::SharedState) of `n` parameters (saturating: a length that does not
/// fit in u64 is `u64::MAX`, which no transfer can have).
pub const fn encoded_len(n: u64) -> u64 {
    n.saturating_mul(8).saturating_add(SHARED_HEADER_LEN)
}

/// Parts this long or longer are hashed on every core (BLAKE3 is a tree: the digest is the same
/// however it is computed).
pub(crate) const PARALLEL_DIGEST_BYTES: usize = 1 << 20;

/// The one digest of a state part: BLAKE3, full length.
pub fn state_digest(bytes: &[u8]) -> Blake3Digest {
    segments_digest([bytes])
}

/// [`state_digest`] of the concatenation of `segments`, without concatenating them.
pub fn segments_digest<'a>(segments: impl IntoIterator<Item = &'a [u8]>) -> Blake3Digest {
    let mut h = blake3::Hasher::new();
    for s in segments {
        if s.len() >= PARALLEL_DIGEST_BYTES {
            h.update_rayon(s);
        } else {
            h.update(s);
        }
    }
    Blake3Digest::from_blake3(&h.finalize())
}
