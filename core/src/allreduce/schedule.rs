//! The ring schedule as pure functions of (world, rank, length, segment size).
//!
//! With `W` ranks, the buffer of `len` values is cut into `W` chunks; chunk `c` covers
//! `[c*len/W, (c+1)*len/W)`, so any length works (chunks may be empty when `len < W`). Rank `r`
//! sends to rank `r+1` and receives from rank `r-1` (mod `W`).
//!
//! - Reduce-scatter step `s` (0..W-1): rank `r` sends its partial sum of chunk `r-s` and
//!   receives the partial sum of chunk `r-s-1`. After the last step it owns chunk `r+1`.
//! - All-gather step `s` (0..W-1): rank `r` sends chunk `r+1-s` (its own at step 0) and
//!   receives chunk `r-s`.

use std::ops::Range;

/// Index range of chunk `c` of a buffer of `len` values split over `world` ranks.
pub fn chunk_range(len: usize, world: usize, c: usize) -> Range<usize> {
    debug_assert!(c < world);
    let lo = (c as u128 * len as u128 / world as u128) as usize;
    let hi = ((c as u128 + 1) * len as u128 / world as u128) as usize;
    lo..hi
}

/// `f` summed over the lengths of the `world` chunks of a buffer of `len` values, in O(1): the
/// chunks have `len / world` or one more values, and `len % world` of them the longer length.
pub fn sum_over_chunks(len: usize, world: usize, f: impl Fn(usize) -> u64) -> u64 {
    if world == 0 {
        return 0;
    }
    let (short, long) = (len / world, len % world);
    let mut total = (world - long) as u64 * f(short);
    if long > 0 {
        total += long as u64 * f(short + 1);
    }
    total
}

/// Number of segments of a chunk of `chunk_len` values (0 for an empty chunk).
pub fn segment_count(chunk_len: usize, segment_elems: usize) -> usize {
    chunk_len.div_ceil(segment_elems.max(1))
}

/// Index range of segment `j` within `chunk` (absolute indices into the buffer).
pub fn segment_range(chunk: &Range<usize>, segment_elems: usize, j: usize) -> Range<usize> {
    let seg = segment_elems.max(1);
    let lo = chunk.start + j * seg;
    lo..(lo + seg).min(chunk.end)
}

/// `(a - b) mod w` for ranks.
pub fn sub_mod(a: usize, b: usize, w: usize) -> usize {
    (a + w - (b % w)) % w
}

/// The chunk rank `r` sends at reduce-scatter step `s`.
pub fn rs_send_chunk(world: usize, r: usize, s: usize) -> usize {
    sub_mod(r, s, world)
}

/// The chunk rank `r` receives at reduce-scatter step `s`.
pub fn rs_recv_chunk(world: usize, r: usize, s: usize) -> usize {
    sub_mod(r, s + 1, world)
}

/// The chunk rank `r` owns after the reduce-scatter.
pub fn owned_chunk(world: usize, r: usize) -> usize {
    (r + 1) % world
}

/// The chunk rank `r` receives at all-gather step `s`.
pub fn ag_recv_chunk(world: usize, r: usize, s: usize) -> usize {
    sub_mod(r, s, world)
}

/// The chunk rank `r` sends at all-gather step `s`.
pub fn ag_send_chunk(world: usize, r: usize, s: usize) -> usize {
    sub_mod(r + 1, s, world)
}

/// Bytes one rank sends in a full all-reduce with a codec whose encoding of `n` values takes
/// `encoded_len(n)` bytes (bodies only): each of the `2(W-1)` steps moves one chunk's segments.
pub fn bytes_sent_per_rank(
    len: usize,
    world: usize,
    rank: usize,
    segment_elems: usize,
    encoded_len: impl Fn(usize) -> usize,
) -> u64 {
    let mut total = 0u64;
    for s in 0..world.saturating_sub(1) {
        for c in [rs_send_chunk(world, rank, s), ag_send_chunk(world, rank, s)] {
            let ch = chunk_range(len, world, c);
            for j in 0..segment_count(ch.len(), segment_elems) {
                total += encoded_len(segment_range(&ch, segment_elems, j).len()) as u64;
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn chunks_partition_the_buffer(len in 0usize..10_000, world in 1usize..17, seg in 1usize..300) {
            let mut next = 0;
            for c in 0..world {
                let ch = chunk_range(len, world, c);
                prop_assert_eq!(ch.start, next);
                let mut inner = ch.start;
                for j in 0..segment_count(ch.len(), seg) {
                    let sr = segment_range(&ch, seg, j);
                    prop_assert_eq!(sr.start, inner);
                    prop_assert!(!sr.is_empty() && sr.len() <= seg);
                    inner = sr.end;
                }
                prop_assert_eq!(inner, ch.end);
                next = ch.end;
            }
            prop_assert_eq!(next, len);
        }

        #[test]
        fn every_chunk_is_reduced_through_every_rank(world in 1usize..17) {
            // Follow each chunk through the reduce-scatter: it starts at rank c and visits
            // c+1, ..., ending at its owner c-1 after W-1 hops, having collected all W ranks.
            for c in 0..world {
                let mut visited = vec![false; world];
                visited[c] = true;
                let mut holder = c;
                for s in 0..world - 1 {
                    prop_assert_eq!(rs_send_chunk(world, holder, s), c);
                    holder = (holder + 1) % world;
                    prop_assert_eq!(rs_recv_chunk(world, holder, s), c);
                    prop_assert!(!visited[holder]);
                    visited[holder] = true;
                }
                prop_assert!(visited.iter().all(|v| *v));
                prop_assert_eq!(owned_chunk(world, holder), c);
                // All-gather: the owner's bytes reach every other rank once.
                let mut got = vec![false; world];
                got[holder] = true;
                for s in 0..world - 1 {
                    prop_assert_eq!(ag_send_chunk(world, holder, s), c);
                    holder = (holder + 1) % world;
                    prop_assert_eq!(ag_recv_chunk(world, holder, s), c);
                    got[holder] = true;
                }
                prop_assert!(got.iter().all(|v| *v));
            }
        }
    }

    proptest! {
        #[test]
        fn sums_over_chunks_match_the_chunks(len in 0usize..5_000, world in 1usize..40, seg in 1usize..300) {
            let f = |n: usize| segment_count(n, seg) as u64 * 7 + n as u64;
            let direct: u64 = (0..world).map(|c| f(chunk_range(len, world, c).len())).sum();
            prop_assert_eq!(sum_over_chunks(len, world, f), direct);
        }
    }

    #[test]
    fn bytes_on_the_wire_match_the_ring_formula() {
        // fp32, no per-segment overhead: exactly 2(W-1)/W of the payload when W divides len.
        for world in [1usize, 2, 4, 8] {
            let len = 8 * 1000;
            for r in 0..world {
                let b = bytes_sent_per_rank(len, world, r, 333, |n| 4 * n);
                assert_eq!(b, (2 * (world - 1) * 4 * len / world) as u64);
            }
        }
    }
}
