//! Tests of [`super`]: the shard rings over an in-memory pump (seeded, per-link FIFO), the
//! classification of frames, the early frames and their bounds.

use super::*;
use crate::ids::Weight;
use crate::mesh::op_id;
use bytes::Bytes;
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use std::collections::{BTreeMap, VecDeque};

const EPOCH: Epoch = Epoch(3);
const OP: u64 = 2 << 16 | 1; // op_id(2, 1), checked in `release`

fn ids(w: usize) -> Vec<NodeId> {
    // Not the identity order, to exercise the rank lookup.
    (0..w).map(|i| NodeId(((w - i) % w) as u32 + 10)).collect()
}

fn release(ring: &[NodeId], weights: &[f32], me: usize, shards: u16) -> AllReduceStart {
    assert_eq!(OP, op_id(2, 1));
    AllReduceStart {
        epoch: EPOCH,
        op: OP,
        outer_step: 2,
        attempt: 1,
        ring: ring.to_vec(),
        weight: Weight::new(weights[me]).unwrap(),
        total_weight: weights.iter().sum(),
        shards,
    }
}

fn gaussian(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let v: f64 = StandardNormal.sample(&mut rng);
            3.0 * v as f32
        })
        .collect()
}

fn weighted_average(inputs: &[Vec<f32>], weights: &[f32]) -> Vec<f64> {
    let total: f64 = weights.iter().map(|&w| f64::from(w)).sum();
    (0..inputs[0].len())
        .map(|i| {
            if total == 0.0 {
                return 0.0;
            }
            let s: f64 = inputs
                .iter()
                .zip(weights)
                .filter(|(_, w)| **w > 0.0)
                .map(|(x, &w)| f64::from(w) * f64::from(x[i]))
                .sum();
            s / total
        })
        .collect()
}

fn collective(body: Body, epoch: Epoch, op: u64, shard: u16) -> Frame {
    let header = Header::Collective(CollectiveHeader {
        epoch,
        op,
        shard,
        phase: Phase::ReduceScatter,
        step: 0,
        chunk: 0,
        segment: 0,
        weight_sum: 1.0,
    });
    Frame { header, body }
}

/// When the nodes start their rings.
#[derive(Clone, Copy, PartialEq)]
enum Starts {
    /// All before the first frame moves.
    AtOnce,
    /// Each at a random moment, between frame deliveries.
    Random,
    /// All but the last at once; the last when no frame is left to move (its left
    /// neighbour's frames wait in its inbox).
    LastHeldBack,
}

struct TestNode {
    start: AllReduceStart,
    values: Option<Values>,
    rings: Option<ShardRings>,
    inbox: Inbox,
}

struct Outcome {
    values: Vec<Option<Vec<f32>>>,
    stats: Vec<RingStats>,
    sums: Vec<Vec<f64>>,
    counters: Vec<RingCounters>,
    /// Frames the held-back node held when it started.
    held_at_start: usize,
}

fn start_node(n: &mut TestNode, me: NodeId, codec: CodecKind, segment: Option<usize>) {
    let values = n.values.take().expect("starts once");
    let mut r = ShardRings::new(n.start.clone(), me, codec, values, segment).unwrap();
    for (from, f) in n.inbox.take_for(r.collective()) {
        r.handle_frame(from, &f).expect("held frame accepted");
    }
    n.rings = Some(r);
}

/// How one attempt of the pump runs.
#[derive(Clone)]
struct Setup {
    weights: Vec<f32>,
    shards: u16,
    codec: CodecKind,
    segment: Option<usize>,
    seed: u64,
    starts: Starts,
}

impl Setup {
    /// `world` nodes of weight 1, one shard, fp32, segments of 7, all started at once.
    fn new(world: usize) -> Setup {
        Setup {
            weights: vec![1.0; world],
            shards: 1,
            codec: CodecKind::Fp32,
            segment: Some(7),
            seed: 1,
            starts: Starts::AtOnce,
        }
    }
}

/// Runs one attempt among `values.len()` nodes: frames travel on per-link FIFO queues, the
/// next link to deliver drawn from a seeded RNG, each frame through the node's [`Inbox`].
/// `before_last` sees the held-back node's inbox just before it starts.
fn run(s: &Setup, values: Vec<Values>, before_last: impl FnOnce(&mut Inbox)) -> Outcome {
    let (weights, codec, segment, starts) = (&s.weights, s.codec, s.segment, s.starts);
    let w = values.len();
    let ring = ids(w);
    let mut nodes: Vec<TestNode> = values
        .into_iter()
        .enumerate()
        .map(|(i, v)| TestNode {
            start: release(&ring, weights, i, s.shards),
            values: Some(v),
            rings: None,
            inbox: Inbox::default(),
        })
        .collect();
    let index = |id: NodeId| ring.iter().position(|&n| n == id).expect("known node");
    let mut before_last = Some(before_last);
    let mut held_at_start = 0;
    if starts != Starts::Random {
        let n = if starts == Starts::AtOnce { w } else { w - 1 };
        for (i, node) in nodes.iter_mut().enumerate().take(n) {
            start_node(node, ring[i], codec, segment);
        }
    }
    let mut links: BTreeMap<(NodeId, NodeId), VecDeque<Frame>> = BTreeMap::new();
    let mut rng = ChaCha8Rng::seed_from_u64(s.seed);
    let mut budget = 1_000_000usize;
    loop {
        for (i, n) in nodes.iter_mut().enumerate() {
            if let Some(r) = &mut n.rings {
                while let Some((to, f)) = r.poll_send() {
                    links.entry((ring[i], to)).or_default().push_back(f);
                }
            }
        }
        let busy: Vec<(NodeId, NodeId)> =
            links.iter().filter(|(_, q)| !q.is_empty()).map(|(k, _)| *k).collect();
        let idle: Vec<usize> = (0..w).filter(|&i| nodes[i].values.is_some()).collect();
        let startable = match starts {
            Starts::Random => idle.len(),
            _ => 0,
        };
        if busy.is_empty() && startable == 0 {
            let Some(&last) = idle.first() else { break };
            // Held back until now.
            if let Some(f) = before_last.take() {
                f(&mut nodes[last].inbox);
            }
            held_at_start = nodes[last].inbox.early().len();
            start_node(&mut nodes[last], ring[last], codec, segment);
            continue;
        }
        let c = rng.random_range(0..busy.len() + startable);
        if c >= busy.len() {
            let i = idle[c - busy.len()];
            start_node(&mut nodes[i], ring[i], codec, segment);
            continue;
        }
        let (from, to) = busy[c];
        let f = links.get_mut(&(from, to)).and_then(VecDeque::pop_front).unwrap();
        let n = &mut nodes[index(to)];
        let running = n.rings.as_ref().map(ShardRings::collective);
        match n.inbox.admit(Some(EPOCH), running, from, f) {
            Admission::Feed(f) => {
                n.rings.as_mut().unwrap().handle_frame(from, &f).expect("frame accepted")
            }
            Admission::Held => assert!(n.rings.is_none()),
            other => panic!("{other:?}"),
        }
        budget -= 1;
        assert!(budget > 0, "livelock");
    }
    let mut out = Outcome {
        values: Vec::new(),
        stats: Vec::new(),
        sums: Vec::new(),
        counters: Vec::new(),
        held_at_start,
    };
    for n in nodes {
        let r = n.rings.expect("started");
        assert!(r.is_done(), "every ring finished");
        out.stats.push(r.stats());
        out.sums.push(r.weight_sums());
        out.counters.push(n.inbox.counters());
        out.values.push(r.into_values());
    }
    out
}

fn real(inputs: &[Vec<f32>]) -> Vec<Values> {
    inputs.iter().cloned().map(Values::Real).collect()
}

fn check_result(out: &Outcome, want: &[f64], codec: CodecKind, what: &str) {
    let first = out.values[0].as_ref().unwrap();
    for v in &out.values {
        let v = v.as_ref().unwrap();
        let same =
            v.len() == first.len() && v.iter().zip(first).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{what}: replicas differ");
    }
    assert_eq!(first.len(), want.len(), "{what}");
    if codec == CodecKind::Fp32 {
        for (g, w) in first.iter().zip(want) {
            assert!((f64::from(*g) - w).abs() <= 1e-5 * (1.0 + w.abs()), "{what}: {g} vs {w}");
        }
    } else {
        let num: f64 = first.iter().zip(want).map(|(g, w)| (f64::from(*g) - w).powi(2)).sum();
        let den: f64 = want.iter().map(|w| w * w).sum();
        let err = if den == 0.0 { num.sqrt() } else { (num / den).sqrt() };
        assert!(
            err < crate::allreduce::tests::ring_error_bound(codec),
            "{what}: relative RMS error {err}"
        );
    }
}

fn check_sums(out: &Outcome, total: f32, codec: CodecKind, what: &str) {
    // A summing ring sees a sum per chunk, a gathering one the total of each shard.
    let least = if codec.sums_in_ring() { 2 } else { 1 };
    for s in &out.sums {
        assert!(s.len() >= least || out.sums.len() == 1, "{what}: sums seen");
        assert!(s.iter().all(|&x| x == f64::from(total)), "{what}: sums {s:?} vs {total}");
    }
}

#[test]
fn every_world_shard_count_and_codec_ends_bit_identical_on_the_weighted_average() {
    let all_weights = [1.0f32, 0.0, 2.0, 1.0, 0.5, 1.0];
    for w in 1..=6usize {
        for g in 1..=4u16 {
            for codec in CodecKind::ALL {
                let len = 2 * (40 * w + 7 * usize::from(g)) + 1; // odd
                let seed = (w * 100 + usize::from(g)) as u64;
                let setup = Setup {
                    weights: all_weights[..w].to_vec(),
                    shards: g,
                    codec,
                    segment: Some(5 + usize::from(g)),
                    seed,
                    starts: if seed.is_multiple_of(2) { Starts::AtOnce } else { Starts::Random },
                };
                let mut inputs: Vec<Vec<f32>> =
                    (0..w).map(|r| gaussian(len, (w * 10 + r) as u64)).collect();
                if w > 1 {
                    // The weight-0 contributor's garbage never reaches the average.
                    inputs[1].fill(f32::NAN);
                }
                let seg = 5 + usize::from(g);
                let sent: Vec<Vec<f32>> = inputs
                    .iter()
                    .map(|x| crate::allreduce::tests::as_sent(codec, x, usize::from(g), seg))
                    .collect();
                let want = weighted_average(&sent, &setup.weights);
                let what = format!("W {w} G {g} {codec} len {len}");
                let out = run(&setup, real(&inputs), |_| {});
                check_result(&out, &want, codec, &what);
                if w > 1 {
                    check_sums(&out, setup.weights.iter().sum(), codec, &what);
                }
                for c in &out.counters {
                    assert_eq!((c.stale, c.dropped, c.refused, c.early_dropped), (0, 0, 0, 0));
                }
            }
        }
    }
}

#[test]
fn all_weights_zero_give_zeros() {
    let inputs: Vec<Vec<f32>> = (0..3).map(|r| gaussian(31, r)).collect();
    let setup =
        Setup { weights: vec![0.0; 3], shards: 2, codec: CodecKind::Uint8, ..Setup::new(3) };
    let out = run(&setup, real(&inputs), |_| {});
    for v in &out.values {
        assert!(v.as_ref().unwrap().iter().all(|&x| x == 0.0));
    }
    check_sums(&out, 0.0, CodecKind::Uint8, "all zero");
}

#[test]
fn frames_arriving_before_the_start_are_held_then_fed() {
    for w in 2..=5usize {
        for g in [1u16, 3] {
            let inputs: Vec<Vec<f32>> = (0..w).map(|r| gaussian(203, r as u64)).collect();
            let held_back =
                Setup { shards: g, seed: 7, starts: Starts::LastHeldBack, ..Setup::new(w) };
            let want = weighted_average(&inputs, &held_back.weights);
            let what = format!("W {w} G {g}");
            let extra = |inbox: &mut Inbox| {
                // An older op of the same epoch (held: not started here, then overtaken) and a
                // newer epoch (held, and still held after the start).
                let old = collective(Body::Virtual(4), EPOCH, OP - 1, 0);
                let newer = collective(Body::Virtual(4), EPOCH.next(), 0, 0);
                assert_eq!(inbox.admit(Some(EPOCH), None, NodeId(10), old), Admission::Held);
                assert_eq!(inbox.admit(Some(EPOCH), None, NodeId(10), newer), Admission::Held);
            };
            let out = run(&held_back, real(&inputs), extra);
            check_result(&out, &want, CodecKind::Fp32, &what);
            let c = out.counters[w - 1];
            assert!(out.held_at_start > 2, "{what}: {} held", out.held_at_start);
            assert_eq!(c.early_held as usize, out.held_at_start, "{what}");
            assert_eq!(c.early_dropped, 1, "{what}: the older op");
            // Random starts hold frames too, and finish all the same.
            let random = Setup { seed: 3, starts: Starts::Random, ..held_back };
            let out = run(&random, real(&inputs), |_| {});
            check_result(&out, &want, CodecKind::Fp32, &what);
        }
    }
}

#[test]
fn virtual_values_move_the_same_frames_and_bytes_as_real_ones() {
    for w in 1..=6usize {
        for g in 1..=4u16 {
            for codec in CodecKind::ALL {
                let len = 1001 + 2 * w;
                let inputs: Vec<Vec<f32>> = (0..w).map(|r| gaussian(len, r as u64)).collect();
                let setup = Setup { shards: g, codec, segment: Some(13), ..Setup::new(w) };
                let r = run(&setup, real(&inputs), |_| {});
                let virt: Vec<Values> = (0..w).map(|_| Values::Virtual(len)).collect();
                let shuffled = Setup { seed: 9, starts: Starts::Random, ..setup };
                let v = run(&shuffled, virt, |_| {});
                assert_eq!(r.stats, v.stats, "W {w} G {g} {codec}");
                assert!(v.values.iter().all(Option::is_none));
                if w > 1 {
                    check_sums(&v, w as f32, codec, "virtual");
                }
            }
        }
    }
}

#[test]
fn the_default_segment_keeps_a_ten_billion_ring_to_a_few_frames_per_chunk() {
    assert_eq!(segment_elems(Some(0), true, 10, 2), 1);
    assert_eq!(segment_elems(Some(77), false, 1 << 40, 2), 77);
    assert_eq!(segment_elems(None, true, 1 << 40, 2), DEFAULT_SEGMENT_ELEMS);
    assert_eq!(segment_elems(None, false, 1000, 4), DEFAULT_SEGMENT_ELEMS);
    assert_eq!(segment_elems(None, false, 16 << 30, 4), 1 << 30);
    let (w, g) = (4usize, 2u16);
    let n = 10_000_000_000usize;
    let virt: Vec<Values> = (0..w).map(|_| Values::Virtual(n)).collect();
    let setup = Setup { shards: g, codec: CodecKind::Uint8, segment: None, ..Setup::new(w) };
    let out = run(&setup, virt, |_| {});
    for s in &out.stats {
        // 2 (W - 1) steps of at most 4 segments, per shard.
        assert!(s.frames_sent <= (2 * (w - 1) * 4 * usize::from(g)) as u64, "{s:?}");
        assert!(s.body_bytes_sent >= (2 * (w - 1) * n / w) as u64, "{s:?}");
    }
}

#[test]
fn frames_are_classified_against_the_member_and_the_running_collective() {
    use FrameClass::*;
    let h = |e: u64, op: u64| CollectiveHeader {
        epoch: Epoch(e),
        op,
        shard: 0,
        phase: Phase::AllGather,
        step: 0,
        chunk: 0,
        segment: 0,
        weight_sum: 1.0,
    };
    // Not admitted yet: everything may be of a collective to come.
    assert_eq!(classify(&h(0, 0), None, None), Early);
    // Nothing running.
    assert_eq!(classify(&h(4, 9), Some(Epoch(5)), None), Stale);
    assert_eq!(classify(&h(5, 0), Some(Epoch(5)), None), Early);
    assert_eq!(classify(&h(6, 0), Some(Epoch(5)), None), Early);
    // Running (5, 10).
    let run = Some((Epoch(5), 10));
    assert_eq!(classify(&h(5, 10), Some(Epoch(5)), run), Current);
    assert_eq!(classify(&h(5, 9), Some(Epoch(5)), run), Drop);
    assert_eq!(classify(&h(5, 11), Some(Epoch(5)), run), Early);
    assert_eq!(classify(&h(6, 0), Some(Epoch(5)), run), Early);
    assert_eq!(classify(&h(4, 10), Some(Epoch(5)), run), Stale);
    // The membership moved on while (5, 10) runs: its frames still count, others of epoch 5
    // are of an epoch left.
    assert_eq!(classify(&h(5, 10), Some(Epoch(6)), run), Current);
    assert_eq!(classify(&h(5, 11), Some(Epoch(6)), run), Stale);
    assert_eq!(classify(&h(6, 0), Some(Epoch(6)), run), Early);
}

#[test]
fn stale_frames_are_rejected_counted_and_change_nothing() {
    let ring = ids(3);
    let weights = [1.0; 3];
    let start = |i| release(&ring, &weights, i, 2);
    let mut a =
        ShardRings::new(start(0), ring[0], CodecKind::Fp32, Values::Real(vec![1.0; 20]), Some(3))
            .unwrap();
    let mut b =
        ShardRings::new(start(1), ring[1], CodecKind::Fp32, Values::Real(vec![2.0; 20]), Some(3))
            .unwrap();
    assert_eq!(a.neighbours(), (ring[2], ring[1]));
    let (to, f) = a.poll_send().unwrap();
    assert_eq!(to, ring[1]);
    let mut stale = f.clone();
    let Header::Collective(h) = &mut stale.header else { panic!() };
    h.epoch = Epoch(2);
    let mut inbox = Inbox::default();
    let running = Some(b.collective());
    assert_eq!(inbox.admit(Some(EPOCH), running, ring[0], stale.clone()), Admission::Stale);
    assert_eq!(inbox.admit(Some(EPOCH), None, ring[0], stale.clone()), Admission::Stale);
    assert_eq!(inbox.counters().stale, 2);
    assert!(inbox.early().is_empty());
    // Fed anyway: refused before any ring sees it.
    let before = b.stats();
    assert!(matches!(b.handle_frame(ring[0], &stale), Err(FeedError::OtherCollective { .. })));
    assert_eq!(b.stats(), before);
    assert_eq!(inbox.admit(Some(EPOCH), running, ring[0], f.clone()), Admission::Feed(f.clone()));
    b.handle_frame(ring[0], &f).unwrap();
    assert_eq!(b.stats().frames_received, 1);
    assert_eq!(b.stats().stale_rejected, 0);
}

#[test]
fn bad_shards_and_other_frames_are_refused_without_panic() {
    let ring = ids(2);
    let mut r = ShardRings::new(
        release(&ring, &[1.0, 1.0], 0, 2),
        ring[0],
        CodecKind::Fp32,
        Values::Real(vec![0.5; 10]),
        None,
    )
    .unwrap();
    for shard in [2, 3, u16::MAX] {
        let f = collective(Body::empty(), EPOCH, OP, shard);
        assert_eq!(
            r.handle_frame(ring[1], &f),
            Err(FeedError::ShardOutOfRange { shard, shards: 2 })
        );
    }
    let f = Frame::control(crate::mesh::MeshMsg::HeartbeatAck);
    assert_eq!(r.handle_frame(ring[1], &f), Err(FeedError::NotCollective));
    let f = collective(Body::empty(), EPOCH, OP, 1);
    assert!(matches!(r.handle_frame(ring[1], &f), Err(FeedError::Ring { shard: 1, .. })));
    assert_eq!(r.stats().frames_received, 0);
}

#[test]
fn a_bad_ring_gives_the_values_back() {
    let ring = ids(3);
    let v = vec![1.0f32; 50];
    let p = v.as_ptr();
    let e = ShardRings::new(
        release(&ring, &[1.0; 3], 0, 3),
        NodeId(99),
        CodecKind::Fp32,
        Values::Real(v),
        None,
    )
    .err()
    .unwrap();
    assert_eq!(e.source, RingError::NotAMember { me: NodeId(99) });
    let Values::Real(v) = e.values else { panic!() };
    assert_eq!((v.as_ptr(), v.len()), (p, 50));
    let twice = vec![NodeId(1), NodeId(2), NodeId(1)];
    let mut s = release(&twice, &[1.0; 3], 0, 1);
    s.ring = twice;
    let e = ShardRings::new(s, NodeId(1), CodecKind::Fp32, Values::Virtual(5), None).err().unwrap();
    assert_eq!(e.source, RingError::DuplicateMember { node: NodeId(1) });
}

#[test]
fn the_values_come_back_in_their_own_buffer() {
    for g in [1u16, 3] {
        // World 1: the result is the input, and no copy is made.
        let v: Vec<f32> = (0..101).map(|i| i as f32).collect();
        let (p, want) = (v.as_ptr(), v.clone());
        let ring = ids(1);
        let r = ShardRings::new(
            release(&ring, &[1.0], 0, g),
            ring[0],
            CodecKind::Fp32,
            Values::Real(v),
            None,
        )
        .unwrap();
        assert!(r.is_done());
        assert_eq!(r.shards(), usize::from(g));
        let out = r.into_values().unwrap();
        assert_eq!(out, want);
        assert_eq!(out.as_ptr(), p, "G {g}: the caller's buffer");
    }
    // World 3, G 3: after the reduction the result is in the caller's buffer (shard 0 kept
    // it, with the capacity of the whole).
    let inputs: Vec<Vec<f32>> = (0..3).map(|r| gaussian(77, r)).collect();
    let want = weighted_average(&inputs, &[1.0; 3]);
    let ring = ids(3);
    let ptrs: Vec<*const f32> = inputs.iter().map(|x| x.as_ptr()).collect();
    let mut nodes: Vec<ShardRings> = inputs
        .into_iter()
        .enumerate()
        .map(|(i, x)| {
            let s = release(&ring, &[1.0; 3], i, 3);
            ShardRings::new(s, ring[i], CodecKind::Fp32, Values::Real(x), Some(4)).unwrap()
        })
        .collect();
    let mut moved = true;
    while moved {
        moved = false;
        for i in 0..3 {
            while let Some((to, f)) = nodes[i].poll_send() {
                let j = ring.iter().position(|&n| n == to).unwrap();
                nodes[j].handle_frame(ring[i], &f).unwrap();
                moved = true;
            }
        }
    }
    for (n, p) in nodes.into_iter().zip(ptrs) {
        assert!(n.is_done());
        let out = n.into_values().unwrap();
        assert_eq!(out.as_ptr(), p);
        for (g, w) in out.iter().zip(&want) {
            assert!((f64::from(*g) - w).abs() < 1e-5, "{g} vs {w}");
        }
    }
}

#[test]
fn early_frames_are_bounded_by_count_and_bytes() {
    let bytes = |n: usize| Body::Bytes(Bytes::from(vec![0u8; n]));
    let mut e = EarlyFrames::new(3, 100);
    for i in 0..3 {
        e.push(NodeId(i), collective(Body::Virtual(1 << 40), EPOCH, OP, 0)).unwrap();
    }
    assert_eq!(e.bytes(), 0, "a virtual body holds no memory");
    let r = e.push(NodeId(9), collective(Body::empty(), EPOCH, OP, 0));
    assert_eq!(r, Err(EarlyRefused::Full { frames: 3, bytes: 0 }));
    assert_eq!((e.len(), e.refused()), (3, 1));

    let mut e = EarlyFrames::new(10, 100);
    e.push(NodeId(1), collective(bytes(60), EPOCH, OP, 0)).unwrap();
    assert!(e.push(NodeId(1), collective(bytes(41), EPOCH, OP, 0)).is_err());
    e.push(NodeId(1), collective(bytes(40), EPOCH, OP, 0)).unwrap();
    assert_eq!(e.bytes(), 100);
    assert!(e.push(NodeId(1), collective(bytes(1), EPOCH, OP, 0)).is_err());
    let ctl = Frame::control(crate::mesh::MeshMsg::HeartbeatAck);
    assert_eq!(e.push(NodeId(1), ctl), Err(EarlyRefused::NotCollective));
    assert_eq!(e.refused(), 3);
    // Taking them frees the room.
    assert_eq!(e.take_for((EPOCH, OP)).len(), 2);
    assert_eq!((e.len(), e.bytes()), (0, 0));
    e.push(NodeId(1), collective(bytes(100), EPOCH, OP, 0)).unwrap();
    // The default bounds.
    let d = EarlyFrames::default();
    assert_eq!((d.held.max_items(), d.held.max_bytes()), (65_536, 1 << 30));
}

/// A peer that filled the area first with frames of its own cannot keep the ring neighbour's
/// frames out: the neighbour pushes the flood's newest frames out until the two hold as much,
/// and those frames are the ones the collective gets when it starts.
#[test]
fn a_flood_that_came_first_cannot_crowd_out_the_neighbour() {
    let bytes = |n: usize| Body::Bytes(Bytes::from(vec![0u8; n]));
    let (flood, neighbour) = (NodeId(7), NodeId(1));
    let mut inbox = Inbox::new(EarlyFrames::new(1000, 1000));
    for _ in 0..100 {
        let f = collective(bytes(10), EPOCH, OP, 0);
        assert_eq!(inbox.admit(Some(EPOCH), None, flood, f), Admission::Held);
    }
    let f = collective(bytes(10), EPOCH, OP, 0);
    assert_eq!(inbox.admit(Some(EPOCH), None, flood, f), Admission::Refused, "full");
    for _ in 0..50 {
        let f = collective(bytes(10), EPOCH, OP, 0);
        assert_eq!(inbox.admit(Some(EPOCH), None, neighbour, f), Admission::Held);
    }
    let f = collective(bytes(10), EPOCH, OP, 0);
    assert_eq!(inbox.admit(Some(EPOCH), None, neighbour, f), Admission::Refused, "even now");
    assert_eq!((inbox.early().bytes_of(neighbour), inbox.early().bytes_of(flood)), (500, 500));
    let got = inbox.take_for((EPOCH, OP));
    assert_eq!(got.iter().filter(|(from, _)| *from == neighbour).count(), 50);
    let c = inbox.counters();
    assert_eq!((c.early_held, c.early_dropped, c.refused), (150, 50, 2));
}

#[test]
fn early_frames_come_out_in_arrival_order_and_obsolete_ones_go() {
    let mut e = EarlyFrames::default();
    let keys = [(3, 9), (4, 0), (3, 9), (2, 5), (3, 8), (3, 9), (5, 1)];
    for (i, &(ep, op)) in keys.iter().enumerate() {
        e.push(NodeId(i as u32), collective(Body::Virtual(1), Epoch(ep), op, 0)).unwrap();
    }
    let got: Vec<u32> = e.take_for((Epoch(3), 9)).into_iter().map(|(n, _)| n.0).collect();
    assert_eq!(got, vec![0, 2, 5]);
    assert_eq!((e.len(), e.dropped()), (2, 2), "(2, 5) and (3, 8) can never start");
    e.retain_after(Epoch(4), 0);
    assert_eq!((e.len(), e.dropped()), (1, 3));
    e.retain_newer_than(Epoch(5));
    assert_eq!((e.len(), e.dropped()), (0, 4));
    // An abort through the inbox keeps a later op of the same epoch.
    let mut inbox = Inbox::default();
    for op in [7, 8] {
        let f = collective(Body::Virtual(1), EPOCH, op, 0);
        assert_eq!(inbox.admit(Some(EPOCH), None, NodeId(1), f), Admission::Held);
    }
    inbox.abort(EPOCH, 7);
    assert_eq!(inbox.take_for((EPOCH, 8)).len(), 1);
    let c = inbox.counters();
    assert_eq!((c.early_held, c.early_dropped), (2, 1));
}

#[test]
fn an_inbox_refuses_beyond_its_bounds_and_counts_drops() {
    let mut inbox = Inbox::new(EarlyFrames::new(1, 10));
    let f = |op| collective(Body::Virtual(1), EPOCH, op, 0);
    assert_eq!(inbox.admit(Some(EPOCH), None, NodeId(1), f(1)), Admission::Held);
    assert_eq!(inbox.admit(Some(EPOCH), None, NodeId(1), f(2)), Admission::Refused);
    let running = Some((EPOCH, 5));
    assert_eq!(inbox.admit(Some(EPOCH), running, NodeId(1), f(4)), Admission::Dropped);
    let ctl = Frame::control(crate::mesh::MeshMsg::HeartbeatAck);
    assert_eq!(inbox.admit(Some(EPOCH), running, NodeId(1), ctl), Admission::Dropped);
    let c = inbox.counters();
    assert_eq!((c.early_held, c.refused, c.dropped, c.stale), (1, 1, 2, 0));
}

/// Early frames far ahead of anything an honest neighbour can be at (an epoch up to `u64::MAX`,
/// an outer step far past the last collective) are dropped, not held for good; near ones are
/// held.
#[test]
fn early_frames_far_ahead_are_dropped_not_held() {
    use crate::mesh::op_id;
    let mut inbox = Inbox::default();
    let f = |e: u64, op: u64| collective(Body::Virtual(1), Epoch(e), op, 0);
    let started = (Epoch(5), op_id(3, 0));
    assert!(inbox.take_for(started).is_empty());
    let member = Some(Epoch(5));
    for (e, op) in [(6, op_id(0, 0)), (5 + EARLY_EPOCHS_AHEAD, 0), (5, op_id(4, 0))] {
        assert_eq!(inbox.admit(member, None, NodeId(1), f(e, op)), Admission::Held, "{e} {op}");
    }
    for (e, op) in [
        (u64::MAX, 0),
        (6 + EARLY_EPOCHS_AHEAD, 0),
        (5, op_id(4 + EARLY_STEPS_AHEAD, 0)),
        (5, u64::MAX),
    ] {
        assert_eq!(inbox.admit(member, None, NodeId(1), f(e, op)), Admission::Dropped, "{e} {op}");
    }
    let c = inbox.counters();
    assert_eq!((c.early_held, c.dropped), (3, 4));
}

fn header() -> impl Strategy<Value = CollectiveHeader> {
    (
        prop_oneof![Just(EPOCH.0), any::<u64>()],
        prop_oneof![Just(OP), any::<u64>()],
        prop_oneof![0u16..3, any::<u16>()],
        any::<bool>(),
        prop_oneof![0u16..3, any::<u16>()],
        prop_oneof![0u32..4, any::<u32>()],
        prop_oneof![0u32..4, any::<u32>()],
        prop_oneof![Just(1.0f64), Just(2.0), any::<f64>()],
    )
        .prop_map(|(e, op, shard, ag, step, chunk, segment, weight_sum)| CollectiveHeader {
            epoch: Epoch(e),
            op,
            shard,
            phase: if ag { Phase::AllGather } else { Phase::ReduceScatter },
            step,
            chunk,
            segment,
            weight_sum,
        })
}

fn body() -> impl Strategy<Value = Body> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..80).prop_map(|b| Body::Bytes(Bytes::from(b))),
        prop_oneof![0u64..80, any::<u64>()].prop_map(Body::Virtual),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn arbitrary_frames_never_panic(
        frames in proptest::collection::vec((0usize..4, header(), body()), 1..24),
        virt in any::<bool>(),
        codec in 0usize..CodecKind::ALL.len(),
    ) {
        let ring = ids(3);
        let codec = CodecKind::ALL[codec];
        let values = if virt { Values::Virtual(37) } else { Values::Real(vec![1.0; 37]) };
        let mut r = ShardRings::new(release(&ring, &[1.0; 3], 1, 2), ring[1], codec, values, Some(5))
            .unwrap();
        let mut inbox = Inbox::new(EarlyFrames::new(8, 256));
        while r.poll_send().is_some() {}
        for (from, h, body) in frames {
            let from = ring.get(from).copied().unwrap_or(NodeId(77));
            let f = Frame { header: Header::Collective(h), body };
            match inbox.admit(Some(EPOCH), Some(r.collective()), from, f.clone()) {
                Admission::Feed(f) => {
                    let _ = r.handle_frame(from, &f);
                }
                _ => prop_assert!(r.handle_frame(from, &f).is_err()),
            }
            while r.poll_send().is_some() {}
            let _ = inbox.take_for((EPOCH, OP));
        }
        let _ = r.is_done();
        let _ = r.into_values();
    }
}
