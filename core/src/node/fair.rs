//! A holding area shared fairly among its senders: the one bound behind the frames held before
//! their collective starts ([`EarlyFrames`](super::rings::EarlyFrames)) and the state pieces held
//! before their fetch ([`EarlyPieces`](super::state::EarlyPieces)).
//!
//! A fixed per-sender quota cannot serve both cases a holding area meets: an honest ring
//! neighbour alone may need nearly all of it (its first chunk of the next collective at the 10B
//! preset is hundreds of megabytes), while a peer that floods it must not crowd that neighbour
//! out. [`FairHold`] gives each sender max-min fairness instead: while there is room anyone may
//! use it; when an item does not fit, the newest items of the sender holding the most are pushed
//! out for it, as long as that sender holds more than the newcomer would after taking it. A lone
//! sender can use the whole area; against `k` others it keeps at least a `1 / (k + 1)` share,
//! however much they send and whoever came first. Whom to push out is decided in id order on
//! ties, so the simulator's replays stay byte-identical.

use crate::ids::NodeId;
use std::collections::{BTreeMap, VecDeque};

/// What one sender holds.
#[derive(Clone, Debug, Default, PartialEq)]
struct Share {
    bytes: u64,
    /// Its items' sequence numbers, oldest first.
    seqs: VecDeque<u64>,
}

#[derive(Clone, Debug, PartialEq)]
struct Slot<T> {
    from: NodeId,
    cost: u64,
    item: T,
}

/// Items could not be taken: holding them would pass a bound, and no sender holds more than the
/// newcomer would.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Full {
    /// Items held.
    pub items: usize,
    /// Bytes held.
    pub bytes: u64,
}

/// What [`FairHold::filter`] does with an item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    /// Leave it held.
    Keep,
    /// Hand it out.
    Take,
    /// Drop it (counted by the caller from the returned number).
    Drop,
}

/// Items from senders, in arrival order, bounded by a count and by their cost in bytes, shared
/// fairly among the senders (module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct FairHold<T> {
    slots: BTreeMap<u64, Slot<T>>,
    senders: BTreeMap<NodeId, Share>,
    next: u64,
    bytes: u64,
    max_items: usize,
    max_bytes: u64,
}

impl<T> FairHold<T> {
    /// An empty area of at most `max_items` items and `max_bytes` bytes of cost.
    pub fn new(max_items: usize, max_bytes: u64) -> Self {
        FairHold {
            slots: BTreeMap::new(),
            senders: BTreeMap::new(),
            next: 0,
            bytes: 0,
            max_items,
            max_bytes,
        }
    }

    /// Holds `item` from `from`, costing `cost` bytes. It may push out the newest items of the
    /// sender holding the most (returned, in the order pushed out, for the caller to count);
    /// refused when it cannot fit without taking from a sender that holds no more than `from`
    /// would. Nothing changes on a refusal.
    pub fn push(&mut self, from: NodeId, cost: u64, item: T) -> Result<Vec<(NodeId, T)>, Full> {
        let full = Full { items: self.slots.len(), bytes: self.bytes };
        if self.max_items == 0 || cost > self.max_bytes {
            return Err(full);
        }
        let mine = self.senders.get(&from).map_or((0, 0), |s| (s.bytes, s.seqs.len()));
        let (mine_bytes, mine_items) = (mine.0.saturating_add(cost), mine.1 + 1);
        // Planned evictions per sender: (items from the back, their bytes).
        let mut taken: BTreeMap<NodeId, (usize, u64)> = BTreeMap::new();
        let (mut items, mut bytes) = (self.slots.len(), self.bytes);
        let mut victims = Vec::new();
        while items >= self.max_items || bytes.saturating_add(cost) > self.max_bytes {
            let by_count = items >= self.max_items;
            let heaviest = self
                .senders
                .iter()
                .filter(|(id, _)| **id != from)
                .map(|(&id, s)| {
                    let (n, b) = taken.get(&id).copied().unwrap_or((0, 0));
                    (id, s.seqs.len() - n, s.bytes - b)
                })
                .max_by(|a, b| {
                    let key = |x: &(NodeId, usize, u64)| {
                        if by_count { (x.1 as u64, x.2) } else { (x.2, x.1 as u64) }
                    };
                    // Ties: the lower id is pushed out first.
                    key(a).cmp(&key(b)).then(b.0.cmp(&a.0))
                });
            let Some((id, n, b)) = heaviest else { return Err(full) };
            let more = if by_count { n > mine_items } else { b > mine_bytes };
            if !more || n == 0 {
                return Err(full);
            }
            let t = taken.entry(id).or_insert((0, 0));
            let seqs = &self.senders[&id].seqs;
            let seq = seqs[seqs.len() - 1 - t.0];
            let c = self.slots[&seq].cost;
            t.0 += 1;
            t.1 += c;
            items -= 1;
            bytes -= c;
            victims.push(seq);
        }
        let mut out = Vec::with_capacity(victims.len());
        for seq in victims {
            if let Some(s) = self.slots.remove(&seq) {
                self.bytes -= s.cost;
                if let Some(share) = self.senders.get_mut(&s.from) {
                    share.seqs.pop_back();
                    share.bytes -= s.cost;
                }
                out.push((s.from, s.item));
            }
        }
        self.senders.retain(|_, s| !s.seqs.is_empty());
        let seq = self.next;
        self.next += 1;
        self.bytes += cost;
        self.slots.insert(seq, Slot { from, cost, item });
        let share = self.senders.entry(from).or_default();
        share.bytes += cost;
        share.seqs.push_back(seq);
        Ok(out)
    }

    /// Sorts every item with `f`: the ones it takes come back in arrival order, the ones it
    /// drops are counted in the returned number, the others stay.
    pub fn filter(&mut self, mut f: impl FnMut(NodeId, &T) -> Keep) -> (Vec<(NodeId, T)>, u64) {
        let (mut out, mut dropped) = (Vec::new(), 0);
        for (seq, s) in std::mem::take(&mut self.slots) {
            match f(s.from, &s.item) {
                Keep::Keep => {
                    self.slots.insert(seq, s);
                }
                Keep::Take => out.push((s.from, s.item)),
                Keep::Drop => dropped += 1,
            }
        }
        self.recount();
        (out, dropped)
    }

    /// Takes every item, in arrival order.
    pub fn take_all(&mut self) -> Vec<(NodeId, T)> {
        self.filter(|_, _| Keep::Take).0
    }

    /// Drops every item.
    pub fn clear(&mut self) {
        self.slots.clear();
        self.senders.clear();
        self.bytes = 0;
    }

    fn recount(&mut self) {
        self.senders.clear();
        self.bytes = 0;
        for (&seq, s) in &self.slots {
            self.bytes += s.cost;
            let share = self.senders.entry(s.from).or_default();
            share.bytes += s.cost;
            share.seqs.push_back(seq);
        }
    }

    /// Items held.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// True when none is held.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Bytes of cost held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The bound on items.
    pub fn max_items(&self) -> usize {
        self.max_items
    }

    /// The bound on bytes of cost.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// Bytes of cost `from` holds.
    pub fn bytes_of(&self, from: NodeId) -> u64 {
        self.senders.get(&from).map_or(0, |s| s.bytes)
    }

    /// The items held, in arrival order.
    pub fn iter(&self) -> impl Iterator<Item = (NodeId, &T)> {
        self.slots.values().map(|s| (s.from, &s.item))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const A: NodeId = NodeId(1);
    const B: NodeId = NodeId(2);

    #[test]
    fn a_lone_sender_uses_the_whole_area() {
        let mut h = FairHold::new(100, 1000);
        for i in 0..10 {
            assert_eq!(h.push(A, 100, i), Ok(vec![]));
        }
        assert_eq!(h.push(A, 1, 10), Err(Full { items: 10, bytes: 1000 }));
        assert_eq!(h.bytes(), 1000);
    }

    #[test]
    fn a_flood_that_came_first_gives_way_to_a_newcomer_down_to_an_even_share() {
        let mut h = FairHold::new(100, 1000);
        for i in 0..10 {
            h.push(B, 100, i).unwrap();
        }
        // A takes from B's newest items while B holds more than A would.
        for i in 0..5 {
            let out = h.push(A, 100, 100 + i).unwrap();
            assert_eq!(out, vec![(B, 9 - i)]);
        }
        assert_eq!(h.push(A, 100, 105), Err(Full { items: 10, bytes: 1000 }));
        assert_eq!((h.bytes_of(A), h.bytes_of(B)), (500, 500));
        // B cannot take back what it lost either.
        assert!(h.push(B, 100, 50).is_err());
    }

    #[test]
    fn filter_takes_in_arrival_order_and_counts_the_dropped() {
        let mut h = FairHold::new(100, 1000);
        for (i, from) in [A, B, A, B, A].into_iter().enumerate() {
            h.push(from, 10, i).unwrap();
        }
        let (out, dropped) = h.filter(|_, &i| match i {
            0 | 3 => Keep::Take,
            1 => Keep::Drop,
            _ => Keep::Keep,
        });
        assert_eq!((out, dropped), (vec![(A, 0), (B, 3)], 1));
        assert_eq!((h.len(), h.bytes(), h.bytes_of(A), h.bytes_of(B)), (2, 20, 20, 0));
        assert_eq!(h.take_all(), vec![(A, 2), (A, 4)]);
        assert!(h.is_empty());
    }

    #[test]
    fn a_count_bound_is_shared_as_the_byte_bound_is() {
        let mut h = FairHold::new(4, u64::MAX);
        for i in 0..4 {
            h.push(B, 0, i).unwrap();
        }
        assert_eq!(h.push(A, 0, 10).unwrap(), vec![(B, 3)]);
        assert_eq!(h.push(A, 0, 11).unwrap(), vec![(B, 2)]);
        assert!(h.push(A, 0, 12).is_err());
    }

    proptest! {
        /// Whatever the senders push, the bounds hold, the totals agree with the items, and a
        /// sender that pushes without pause keeps at least an even share of the bytes among
        /// the senders that compete.
        #[test]
        fn bounds_totals_and_an_even_share_hold(
            pushes in proptest::collection::vec((0u32..4, 1u64..200), 1..300),
            max_bytes in 200u64..3000,
        ) {
            let mut h = FairHold::new(64, max_bytes);
            let mut honest_refused_over_share = false;
            for (i, &(from, cost)) in pushes.iter().enumerate() {
                let from = NodeId(from);
                let senders = h.senders.len().max(1) as u64 + 1;
                let before = h.bytes_of(from);
                if h.push(from, cost, i).is_err()
                    && before + cost <= max_bytes / senders / 2
                    && h.len() < 64
                {
                    honest_refused_over_share = true;
                }
                prop_assert!(h.len() <= 64 && h.bytes() <= max_bytes);
                let sum: u64 = h.senders.values().map(|s| s.bytes).sum();
                prop_assert_eq!(sum, h.bytes());
                let items: usize = h.senders.values().map(|s| s.seqs.len()).sum();
                prop_assert_eq!(items, h.len());
            }
            prop_assert!(!honest_refused_over_share);
        }
    }
}
