//! The senders' plan: which byte ranges of a part each sender sends.
//!
//! A part of `total` bytes is cut into a grid of equal pieces (the last one shorter) whose size
//! depends on `total` and a [`PieceRule`] only. Sender `i` of `k` sends grid pieces `i, i + k,
//! i + 2k, ...`; the ranges of all `k` senders tile `[0, total)` exactly once. A part of 0 bytes
//! is one empty piece (`0..0`), sent by sender 0, so that the joiner learns of it.

use super::format::encoded_len;
use super::{PART_OWN, PART_SHARED};
use crate::ids::NodeId;
use std::ops::Range;

/// Smallest piece of a [`PieceRule::Clamped`] plan.
pub const PIECE_MIN: u64 = 64 << 10;
/// Largest piece of a [`PieceRule::Clamped`] plan.
pub const PIECE_MAX: u64 = 4 << 20;
/// Pieces a [`PieceRule::Clamped`] plan aims at before clamping.
const CLAMPED_PIECES: u64 = 16;
/// Bytes of training state per parameter with virtual numerics: fp32 outer weights, outer
/// momentum, inner weights, and AdamW's two moments. 160 GB for 10B parameters.
pub const VIRTUAL_BYTES_PER_PARAM: u64 = 16;

/// How a part is cut into pieces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PieceRule {
    /// About `total / 16` bytes, clamped to [`PIECE_MIN`]..[`PIECE_MAX`] (real bytes: pieces
    /// small enough to interleave with other frames, few enough to be cheap).
    Clamped,
    /// At most this many pieces of `ceil(total / count)` bytes (virtual states of hundreds of
    /// GB, or one flow per joiner GPU). It must not change within one fetch: a reassignment's
    /// pieces have to line up with those already held. 0 counts as 1.
    Count(u64),
    /// [`Count`](Self::Count) pieces, cut smaller where they would exceed `max_len` bytes (real
    /// bytes: as many flows as asked, none holding more than a piece's worth in a buffer).
    CountAtMost {
        /// Pieces at least.
        count: u64,
        /// Bytes per piece at most (0 counts as 1).
        max_len: u64,
    },
}

impl PieceRule {
    /// Bytes per piece for a part of `total` bytes (at least 1).
    pub fn piece_len(self, total: u64) -> u64 {
        match self {
            PieceRule::Clamped => (total / CLAMPED_PIECES).clamp(PIECE_MIN, PIECE_MAX),
            PieceRule::Count(c) => total.div_ceil(c.max(1)).max(1),
            PieceRule::CountAtMost { count, max_len } => {
                total.div_ceil(count.max(1)).min(max_len).max(1)
            }
        }
    }

    /// Pieces of the grid of a part of `total` bytes (at least 1: an empty part is one empty
    /// piece).
    pub fn piece_count(self, total: u64) -> u64 {
        total.div_ceil(self.piece_len(total)).max(1)
    }
}

/// The ranges sender `i` of `k` sends of a part of `total` bytes: grid pieces `i, i + k, ...`.
/// Empty when `k` is 0 or `i >= k`.
pub fn pieces(total: u64, k: u64, i: u64, rule: PieceRule) -> Pieces {
    let count = if k == 0 || i >= k { 0 } else { rule.piece_count(total) };
    Pieces { next: i, step: k.max(1), count, len: rule.piece_len(total), total }
}

/// The ranges of one sender's pieces, in order (see [`pieces`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pieces {
    next: u64,
    step: u64,
    count: u64,
    len: u64,
    total: u64,
}

impl Iterator for Pieces {
    type Item = Range<u64>;

    fn next(&mut self) -> Option<Range<u64>> {
        if self.next >= self.count {
            return None;
        }
        // next < count = ceil(total / len), so next * len < total (or both are 0).
        let lo = self.next.saturating_mul(self.len).min(self.total);
        let hi = lo.saturating_add(self.len).min(self.total);
        self.next = self.next.saturating_add(self.step);
        Some(lo..hi)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left =
            if self.next >= self.count { 0 } else { (self.count - self.next).div_ceil(self.step) };
        let left = usize::try_from(left).unwrap_or(usize::MAX);
        (left, Some(left))
    }
}

/// What one sender sends of a state, from its place in the assignment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Share {
    /// This sender's index among those sharing the replicated part.
    pub index: u64,
    /// How many share it (1: a whole copy).
    pub of: u64,
    /// Whether this sender sends its own part (the first sender of the assignment does).
    pub sends_own: bool,
}

impl Share {
    /// The ranges of `part` (of `total` bytes) this sender sends; none of an unknown part.
    pub fn pieces(&self, part: u32, total: u64, rule: PieceRule) -> Pieces {
        match part {
            PART_SHARED => pieces(total, self.of, self.index, rule),
            PART_OWN if self.sends_own => pieces(total, 1, 0, rule),
            _ => pieces(total, 0, 0, rule),
        }
    }
}

/// `me`'s share of a transfer assigned to `senders`: in blocking mode the state is frozen, so
/// sender `i` of `k` sends every `k`-th piece of the replicated part; in non-blocking mode a
/// sender may commit a step mid-transfer, so each sends a whole copy. The own part comes whole
/// from the first sender only. `None` when `me` is not among `senders`.
pub fn share_of(senders: &[NodeId], me: NodeId, blocking: bool) -> Option<Share> {
    let i = senders.iter().position(|&s| s == me)?;
    let (index, of) = if blocking { (i as u64, senders.len() as u64) } else { (0, 1) };
    Some(Share { index, of, sends_own: i == 0 })
}

/// The lengths of the two parts, `(shared, own)`, of a virtual state of `params` parameters:
/// [`VIRTUAL_BYTES_PER_PARAM`] per parameter in all, of which the replicated part is
/// [`encoded_len`]`(params)` and the own part the rest (0 when the header alone is more).
pub fn virtual_part_lens(params: u64) -> (u64, u64) {
    let shared = encoded_len(params);
    (shared, params.saturating_mul(VIRTUAL_BYTES_PER_PARAM).saturating_sub(shared))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The ranges of all `k` senders, sorted, tile `[0, total)` exactly once.
    fn assert_tiles(total: u64, k: u64, rule: PieceRule) -> Result<(), TestCaseError> {
        let mut all: Vec<Range<u64>> = (0..k).flat_map(|i| pieces(total, k, i, rule)).collect();
        for i in 0..k {
            let p = pieces(total, k, i, rule);
            prop_assert_eq!(p.size_hint().0, p.clone().count());
        }
        all.sort_by_key(|r| r.start);
        let mut at = 0;
        for r in &all {
            prop_assert_eq!(r.start, at, "total {} k {} {:?}", total, k, rule);
            prop_assert!(r.end > r.start || total == 0);
            at = r.end;
        }
        prop_assert_eq!(at, total);
        if total == 0 {
            prop_assert_eq!(all, vec![0..0]);
        }
        Ok(())
    }

    #[test]
    fn clamped_pieces_are_between_the_bounds() {
        assert_eq!(PieceRule::Clamped.piece_len(0), PIECE_MIN);
        assert_eq!(PieceRule::Clamped.piece_len(32 << 20), 2 << 20);
        assert_eq!(PieceRule::Clamped.piece_len(1 << 40), PIECE_MAX);
        assert_eq!(PieceRule::Clamped.piece_count(32 << 20), 16);
        assert_eq!(PieceRule::Count(6).piece_count(600 << 30), 6);
        assert_eq!(PieceRule::Count(0).piece_count(10), 1);
    }

    #[test]
    fn blocking_shares_the_replicated_part_and_the_first_sends_its_own() {
        let senders = [NodeId(4), NodeId(2), NodeId(9)];
        let b = share_of(&senders, NodeId(2), true).unwrap();
        assert_eq!(b, Share { index: 1, of: 3, sends_own: false });
        let r: Vec<_> = b.pieces(PART_SHARED, 100, PieceRule::Count(6)).collect();
        assert_eq!(r, vec![17..34, 68..85]);
        assert_eq!(b.pieces(PART_OWN, 100, PieceRule::Count(6)).count(), 0);
        let first = share_of(&senders, NodeId(4), true).unwrap();
        let own: Vec<_> = first.pieces(PART_OWN, 100, PieceRule::Count(2)).collect();
        assert_eq!(own, vec![0..50, 50..100]);
        assert_eq!(first.pieces(7, 100, PieceRule::Count(2)).count(), 0);
        // Non-blocking: each sends a whole copy; only the first its own part.
        let nb = share_of(&senders, NodeId(9), false).unwrap();
        assert_eq!(nb, Share { index: 0, of: 1, sends_own: false });
        assert_eq!(nb.pieces(PART_SHARED, 100, PieceRule::Count(3)).count(), 3);
        assert_eq!(share_of(&senders, NodeId(1), true), None);
        // An empty part is one empty piece, from sender 0 only.
        assert_eq!(first.pieces(PART_OWN, 0, PieceRule::Clamped).collect::<Vec<_>>(), vec![0..0]);
        assert_eq!(b.pieces(PART_SHARED, 0, PieceRule::Clamped).count(), 0);
    }

    #[test]
    fn virtual_lengths_add_up_to_sixteen_bytes_a_parameter() {
        let (s, o) = virtual_part_lens(10_000_000_000);
        assert_eq!(s, encoded_len(10_000_000_000));
        assert_eq!(s + o, 160_000_000_000);
        assert_eq!(virtual_part_lens(1), (32, 0));
        assert_eq!(virtual_part_lens(u64::MAX).1, 0);
    }

    proptest! {
        #[test]
        fn ranges_of_all_senders_tile_the_part(
            total in prop_oneof![0u64..1000, 0u64..(64 << 20)],
            k in 1u64..9,
        ) {
            assert_tiles(total, k, PieceRule::Clamped)?;
        }

        #[test]
        fn counted_ranges_tile_huge_parts(
            total in prop_oneof![0u64..100, any::<u64>()],
            k in 1u64..9,
            count in 0u64..64,
        ) {
            assert_tiles(total, k, PieceRule::Count(count))?;
        }
    }
}
