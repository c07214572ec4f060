//! Seeded random streams, one per (seed, subject, purpose).
//!
//! Every random choice of a run comes from a ChaCha8 stream whose key is derived from the run's
//! seed, the node (or link) it concerns and what it is for, so that adding a node or a purpose
//! does not reshuffle the draws of the others (STYLE.md item 5). Both backends draw from these
//! streams: the simulator for everything it randomises, the real backend's emulated network
//! for its links.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// What a stream is for. The discriminant is part of the key: never reorder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Purpose {
    /// Inner-step durations of a node.
    StepTime = 1,
    /// The synthetic objective of a node (its target, its noise).
    Objective = 2,
    /// Draws of a link's varying bandwidth (subject = directed node pair).
    LinkBandwidth = 3,
    /// Draws of a link's varying latency (subject = node pair).
    LinkLatency = 4,
    /// The initial weights (subject 0) and the synthetic objective's targets' centre (subject 1).
    InitialWeights = 5,
    /// turmoil's own RNG (message latency jitter).
    Turmoil = 6,
    /// A `[[failures]]` process (subject = node id << 32 | entry).
    Failures = 7,
    /// A `[[diurnal]]` window's jitter (subject = node id << 32 | entry).
    Diurnal = 8,
    /// An `[[arrivals]]` process (subject = entry).
    Arrivals = 9,
    /// The latencies of a modelled ring all-reduce's frames (subject = its epoch and op).
    RingModel = 10,
    /// A scenario of `loco fidelity --random` (subject = its index in the draw).
    RandomScenario = 11,
}

/// SplitMix64's finaliser: a bijective mix of 64 bits.
pub fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The 64-bit key of the stream of (`seed`, `subject`, `purpose`).
pub fn derive(seed: u64, subject: u64, purpose: Purpose) -> u64 {
    mix64(mix64(mix64(seed) ^ subject) ^ (purpose as u64).wrapping_mul(0xd6e8_feb8_6659_fd93))
}

/// The ChaCha8 stream of (`seed`, `subject`, `purpose`), keyed by [`derive`]. The synthetic
/// objective shared with the real backend ([`crate::node::synthetic`]) draws from it too.
pub fn stream(seed: u64, subject: u64, purpose: Purpose) -> ChaCha8Rng {
    let k = derive(seed, subject, purpose);
    let mut key = [0u8; 32];
    for (i, chunk) in key.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(&mix64(k ^ i as u64).to_le_bytes());
    }
    ChaCha8Rng::from_seed(key)
}

/// A subject id for a directed pair of nodes.
pub fn pair_subject(a: u32, b: u32) -> u64 {
    (u64::from(a) << 32) | u64::from(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    #[test]
    fn streams_are_reproducible_and_independent() {
        let a1: u64 = stream(7, 3, Purpose::StepTime).random();
        let a2: u64 = stream(7, 3, Purpose::StepTime).random();
        assert_eq!(a1, a2);
        let other_node: u64 = stream(7, 4, Purpose::StepTime).random();
        let other_purpose: u64 = stream(7, 3, Purpose::Objective).random();
        let other_seed: u64 = stream(8, 3, Purpose::StepTime).random();
        assert_ne!(a1, other_node);
        assert_ne!(a1, other_purpose);
        assert_ne!(a1, other_seed);
    }
}
