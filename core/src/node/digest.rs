//! The digest of a float vector, for the `weights_hash` column and the invariant checks.

use crate::digest::WeightsDigest;

/// BLAKE3 of the little-endian bits of `v`, its first 8 bytes kept (64 bits: collisions among a
/// run's few thousand rows are out of reach, and the CSV stays readable). Both backends write
/// this for the same weights, so their rows compare.
pub fn weights_digest(v: &[f32]) -> WeightsDigest {
    digest(v, false)
}

/// [`weights_digest`] with BLAKE3's tree split over the global thread pool where the vector is
/// large (4 MiB or more): the same digest, in a fraction of the time on several cores.
pub fn weights_digest_parallel(v: &[f32]) -> WeightsDigest {
    digest(v, true)
}

fn digest(v: &[f32], parallel: bool) -> WeightsDigest {
    let mut h = blake3::Hasher::new();
    if cfg!(target_endian = "little") {
        // The little-endian bits are the values' own bytes: hashed in place and whole, so that
        // BLAKE3 works on many chunks at once.
        let bytes: &[u8] = bytemuck::cast_slice(v);
        if parallel && bytes.len() >= 1 << 22 {
            h.update_rayon(bytes);
        } else {
            h.update(bytes);
        }
    } else {
        // In blocks: a 10B-parameter vector goes through without a copy of itself.
        let mut buf = [0u8; 4096];
        for chunk in v.chunks(buf.len() / 4) {
            for (i, x) in chunk.iter().enumerate() {
                buf[4 * i..4 * i + 4].copy_from_slice(&x.to_bits().to_le_bytes());
            }
            h.update(&buf[..4 * chunk.len()]);
        }
    }
    WeightsDigest::from_blake3(&h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_depends_on_every_bit_and_the_order() {
        assert_eq!(weights_digest(&[1.0, 2.0]), weights_digest(&[1.0, 2.0]));
        assert_ne!(weights_digest(&[1.0, 2.0]), weights_digest(&[2.0, 1.0]));
        assert_ne!(weights_digest(&[0.0]), weights_digest(&[-0.0]));
        assert_eq!(weights_digest(&[]).to_string().len(), WeightsDigest::HEX_LEN);
    }

    #[test]
    fn digest_is_blake3_of_the_little_endian_bits() {
        // The same bytes hashed at once: the block loop must not change the digest.
        let v: Vec<f32> = (0..5000).map(|i| i as f32 * 0.5 - 7.0).collect();
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect();
        let whole = &blake3::hash(&bytes).to_hex()[..WeightsDigest::HEX_LEN];
        assert_eq!(weights_digest(&v).to_string(), whole);
        // On the thread pool, past the size where it is used: the same digest.
        let big: Vec<f32> = (0..(3 << 20) + 5).map(|i| (i % 977) as f32 * 0.25).collect();
        let one = weights_digest(&big);
        assert_eq!(weights_digest_parallel(&big), one);
        let bytes: Vec<u8> = big.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect();
        assert_eq!(one.to_string(), blake3::hash(&bytes).to_hex()[..WeightsDigest::HEX_LEN]);
    }
}
