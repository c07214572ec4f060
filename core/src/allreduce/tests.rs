//! Ring all-reduce tests: reference.md test cases 3 (accuracy), 4 (bytes on the wire) and
//! 5 (replica agreement), weights, epochs, virtual mode, pipelining.

use super::schedule::bytes_sent_per_rank;
use super::*;
use crate::codec::CodecKind;
use crate::ids::{Epoch, NodeId, Weight};
use crate::transport::{Body, Frame, Header};
use proptest::prelude::*;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use std::collections::VecDeque;

fn ids(w: usize) -> Vec<NodeId> {
    // A ring order that is not the identity, to exercise rank lookup.
    (0..w).map(|i| NodeId(((w - i) % w) as u32 + 10)).collect()
}

fn gaussian(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let v: f64 = StandardNormal.sample(&mut rng);
            scale * v as f32
        })
        .collect::<Vec<f32>>()
}

/// Delivers frames one at a time in FIFO order until quiescence; returns per-rank stats.
/// Bounded: fails on more frames than the schedule can produce.
fn pump(machines: &mut [RingAllReduce<'_>]) -> Vec<RingStats> {
    let index = |id: NodeId, ms: &[RingAllReduce<'_>]| {
        ms.iter().position(|m| m.config().me == id).expect("known node")
    };
    let mut wire: VecDeque<(NodeId, NodeId, Frame)> = VecDeque::new();
    let mut budget = 10_000_000usize;
    loop {
        for m in machines.iter_mut() {
            while let Some((to, f)) = m.poll_send() {
                wire.push_back((m.config().me, to, f));
            }
        }
        let Some((from, to, f)) = wire.pop_front() else {
            break;
        };
        let i = index(to, machines);
        machines[i].handle_frame(from, &f).expect("frame accepted");
        budget -= 1;
        assert!(budget > 0, "livelock");
    }
    assert!(machines.iter().all(|m| m.is_done()), "all ranks finished");
    machines.iter().map(|m| m.stats()).collect()
}

fn cfg(ring: &[NodeId], me: NodeId, codec: CodecKind, seg: usize) -> RingConfig {
    let mut c = RingConfig::new(Epoch(3), 7, ring.to_vec(), me, codec);
    c.segment_elems = seg;
    c
}

/// Runs a real all-reduce; returns the per-rank results and stats.
fn reduce(
    inputs: &[Vec<f32>],
    weights: &[f32],
    codec: CodecKind,
    seg: usize,
) -> (Vec<Vec<f32>>, Vec<RingStats>) {
    let ring = ids(inputs.len());
    let mut data: Vec<Vec<f32>> = inputs.to_vec();
    let stats = {
        let mut ms: Vec<RingAllReduce<'_>> = data
            .iter_mut()
            .zip(&ring)
            .zip(weights)
            .map(|((d, &me), &w)| {
                RingAllReduce::new(
                    cfg(&ring, me, codec, seg),
                    Payload::Real(d),
                    Weight::new(w).unwrap(),
                )
                .unwrap()
            })
            .collect();
        pump(&mut ms)
    };
    (data, stats)
}

fn exact_average(inputs: &[Vec<f32>], weights: &[f32]) -> Vec<f64> {
    let n = inputs[0].len();
    let ws: f64 = weights.iter().map(|&w| f64::from(w)).sum();
    (0..n)
        .map(|i| {
            if ws == 0.0 {
                return 0.0;
            }
            inputs
                .iter()
                .zip(weights)
                .filter(|(_, w)| **w > 0.0)
                .map(|(x, &w)| f64::from(w) * f64::from(x[i]))
                .sum::<f64>()
                / ws
        })
        .collect()
}

fn rel_rms(got: &[f32], want: &[f64]) -> f64 {
    let num: f64 = got.iter().zip(want).map(|(g, w)| (f64::from(*g) - w).powi(2)).sum();
    let den: f64 = want.iter().map(|w| w * w).sum();
    if den == 0.0 { num.sqrt() } else { (num / den).sqrt() }
}

fn assert_identical(results: &[Vec<f32>]) {
    for r in &results[1..] {
        let same = r.iter().zip(&results[0]).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "replicas differ");
    }
}

#[test]
fn fp32_ring_is_exact_up_to_summation_order() {
    for world in [1usize, 2, 4, 8] {
        let inputs: Vec<Vec<f32>> = (0..world).map(|r| gaussian(100_003, r as u64, 10.0)).collect();
        let weights = vec![1.0; world];
        let (out, _) = reduce(&inputs, &weights, CodecKind::Fp32, 4096);
        assert_identical(&out);
        let want = exact_average(&inputs, &weights);
        let err = rel_rms(&out[0], &want);
        assert!(err < 1e-6, "world {world}: fp32 error {err}");
    }
}

#[test]
fn uint8_ring_is_within_three_percent_and_replicas_agree() {
    // reference.md test case 3: N = 1e6, inputs N(0,1) x 10. W = 4 must be within 3%.
    let n = 1_000_000;
    for world in [1usize, 2, 4, 8] {
        let inputs: Vec<Vec<f32>> = (0..world).map(|r| gaussian(n, 100 + r as u64, 10.0)).collect();
        let weights = vec![1.0; world];
        let (out, _) = reduce(&inputs, &weights, CodecKind::Uint8, 1 << 18);
        assert_identical(&out);
        let err = rel_rms(&out[0], &exact_average(&inputs, &weights));
        assert!(err < 0.03, "world {world}: uint8 relative RMS error {err}");
        if world == 4 {
            // Re-quantising at each of 3 reduce-scatter hops plus the final encode: clearly
            // more than one quantisation (1.6%) but well under 3%.
            assert!(err > 0.016, "world 4 error {err} suspiciously small");
        }
    }
}

/// The largest relative RMS error of a ring all-reduce of Gaussian inputs with `codec`: every
/// reduce-scatter hop encodes a partial sum again, so a codec's own error (int4-block: 0.13)
/// grows with the ring.
pub(crate) fn ring_error_bound(codec: CodecKind) -> f64 {
    match codec {
        CodecKind::Int4Block => 0.35,
        // Measured against the average of what was sent ([`as_sent`]): f32 sums only.
        CodecKind::Sparse(_) => 1e-5,
        _ => 0.05,
    }
}

/// What a gathering ring sends of `x` (each contribution encoded whole, per segment of each
/// of `shards` shards), decoded: the values its average is exact for. A summing codec's input
/// as it is.
pub(crate) fn as_sent(codec: CodecKind, x: &[f32], shards: usize, seg: usize) -> Vec<f32> {
    if codec.sums_in_ring() {
        return x.to_vec();
    }
    let c = codec.codec();
    let mut out = vec![0.0; x.len()];
    for s in 0..shards.max(1) {
        let shard = crate::allreduce::schedule::chunk_range(x.len(), shards.max(1), s);
        for j in 0..crate::allreduce::schedule::segment_count(shard.len(), seg) {
            let r = crate::allreduce::schedule::segment_range(&shard, seg, j);
            let mut e = vec![0u8; c.encoded_len(r.len())];
            c.encode(&x[r.clone()], &mut e);
            c.decode(&e, &mut out[r]);
        }
    }
    out
}

#[test]
fn every_codec_gives_identical_replicas() {
    for codec in CodecKind::ALL {
        let inputs: Vec<Vec<f32>> = (0..5).map(|r| gaussian(10_007, r, 1.0)).collect();
        let weights = [1.0, 2.0, 0.5, 1.0, 0.0];
        let (out, _) = reduce(&inputs, &weights, codec, 999);
        assert_identical(&out);
        let sent: Vec<Vec<f32>> = inputs.iter().map(|x| as_sent(codec, x, 1, 999)).collect();
        let err = rel_rms(&out[2], &exact_average(&sent, &weights));
        assert!(err < ring_error_bound(codec), "{codec}: error {err}");
    }
}

#[test]
fn bytes_on_the_wire_are_two_w_minus_one_over_w_of_the_payload() {
    // reference.md test case 4.
    let n = 1 << 16;
    for world in [2usize, 4, 8] {
        for codec in [CodecKind::Fp32, CodecKind::Uint8] {
            let inputs: Vec<Vec<f32>> = (0..world).map(|r| gaussian(n, r as u64, 1.0)).collect();
            let seg = 1 << 12;
            let (_, stats) = reduce(&inputs, &vec![1.0; world], codec, seg);
            let per_value = if codec == CodecKind::Fp32 { 4 } else { 1 };
            let segments_sent = 2 * (world - 1) * (n / world).div_ceil(seg);
            let tables = if codec == CodecKind::Uint8 { 1024 * segments_sent } else { 0 };
            let want = (2 * (world - 1) * per_value * n / world + tables) as u64;
            for (r, s) in stats.iter().enumerate() {
                assert_eq!(s.body_bytes_sent, want, "world {world} rank {r} {codec}");
                let codec_impl = codec.codec();
                let planned = bytes_sent_per_rank(n, world, r, seg, |k| codec_impl.encoded_len(k));
                assert_eq!(s.body_bytes_sent, planned);
            }
        }
    }
}

#[test]
fn weights_divide_by_their_sum_and_weight_zero_is_ignored_even_if_nan() {
    // A joiner with weight 0 holds garbage: it must not leak into the average.
    let inputs = vec![vec![1.0f32; 9], vec![f32::NAN; 9], vec![4.0f32; 9]];
    let (out, _) = reduce(&inputs, &[1.0, 0.0, 2.0], CodecKind::Fp32, 2);
    assert_identical(&out);
    assert!(out[1].iter().all(|&v| v == 3.0), "(1*1 + 2*4) / 3 = 3, got {:?}", out[1]);
    // Every weight zero: a defined result of zeros, never a division by zero.
    let (out, _) = reduce(&inputs, &[0.0, 0.0, 0.0], CodecKind::Fp32, 4);
    assert!(out.iter().flatten().all(|&v| v == 0.0));
}

#[test]
fn world_of_one_and_tiny_buffers() {
    let (out, stats) = reduce(&[vec![1.5, -2.0]], &[1.0], CodecKind::Uint8, 8);
    assert_eq!(out[0], vec![1.5, -2.0]);
    assert_eq!(stats[0].frames_sent, 0);
    // Fewer values than ranks: some chunks are empty.
    let inputs: Vec<Vec<f32>> = (0..8).map(|r| vec![r as f32; 3]).collect();
    let (out, _) = reduce(&inputs, &[1.0; 8], CodecKind::Fp32, 1);
    assert_identical(&out);
    assert_eq!(out[0], vec![3.5; 3]);
    // Empty buffers.
    let (out, _) = reduce(&[vec![], vec![]], &[1.0, 1.0], CodecKind::Uint8, 1);
    assert!(out[0].is_empty());
}

#[test]
fn stale_and_misrouted_frames_are_rejected_without_effect() {
    let ring = ids(3);
    let mut a = vec![1.0f32; 6];
    let mut b = vec![2.0f32; 6];
    let mut ma = RingAllReduce::new(
        cfg(&ring, ring[0], CodecKind::Fp32, 2),
        Payload::Real(&mut a),
        Weight::ONE,
    )
    .unwrap();
    let mut mb = RingAllReduce::new(
        cfg(&ring, ring[1], CodecKind::Fp32, 2),
        Payload::Real(&mut b),
        Weight::ONE,
    )
    .unwrap();
    let (to, mut f) = ma.poll_send().unwrap();
    assert_eq!(to, ring[1]);
    let mut stale = f.clone();
    if let Header::Collective(h) = &mut stale.header {
        h.epoch = Epoch(2);
    }
    assert_eq!(
        mb.handle_frame(ring[0], &stale),
        Err(RingError::StaleEpoch { got: Epoch(2), current: Epoch(3) })
    );
    assert_eq!(mb.stats().stale_rejected, 1);
    assert!(matches!(mb.handle_frame(ring[2], &f), Err(RingError::Unexpected { .. })));
    assert!(mb.poll_send().is_some(), "b's own first segment");
    mb.handle_frame(ring[0], &f).unwrap();
    assert!(matches!(mb.handle_frame(ring[0], &f), Err(RingError::Unexpected { .. })));
    f.body = Body::Bytes(bytes::Bytes::from_static(&[0; 3]));
    assert!(mb.handle_frame(ring[0], &f).is_err());
}

#[test]
fn received_segments_are_forwarded_before_later_segments_arrive() {
    // Pipelining: after the first segment of step 0 arrives, its reduced partial sum is ready to
    // go on at once, while the rest of the chunk is still on the wire.
    let ring = ids(4);
    let mut xs: Vec<Vec<f32>> = (0..4).map(|_| vec![1.0; 4000]).collect();
    let mut ms: Vec<_> = xs
        .iter_mut()
        .zip(&ring)
        .map(|(d, &me)| {
            RingAllReduce::new(cfg(&ring, me, CodecKind::Fp32, 100), Payload::Real(d), Weight::ONE)
                .unwrap()
        })
        .collect();
    let (_, first) = ms[0].poll_send().unwrap();
    while ms[1].poll_send().is_some() {}
    ms[1].handle_frame(ring[0], &first).unwrap();
    let (to, next) = ms[1].poll_send().expect("forwarded at once");
    assert_eq!(to, ring[2]);
    let Header::Collective(h) = next.header else { panic!() };
    assert_eq!((h.step, h.segment), (1, 0));
}

#[test]
fn virtual_mode_runs_the_same_schedule_with_lengths_only() {
    let world = 4;
    let n = 1_000_000;
    let ring = ids(world);
    let mut ms: Vec<_> = ring
        .iter()
        .map(|&me| {
            RingAllReduce::new(
                cfg(&ring, me, CodecKind::Uint8, 1 << 16),
                Payload::Virtual(n),
                Weight::ONE,
            )
            .unwrap()
        })
        .collect();
    let stats = pump(&mut ms);
    let inputs: Vec<Vec<f32>> = (0..world).map(|r| gaussian(n, r as u64, 1.0)).collect();
    let (_, real) = reduce(&inputs, &[1.0; 4], CodecKind::Uint8, 1 << 16);
    assert_eq!(stats, real, "virtual and real move the same frames and bytes");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn any_length_world_and_weights(
        len in 0usize..2000,
        world in 1usize..9,
        seg in 1usize..300,
        seed in 0u64..1000,
        raw_weights in proptest::collection::vec(0u8..4, 8),
    ) {
        let inputs: Vec<Vec<f32>> = (0..world).map(|r| gaussian(len, seed * 31 + r as u64, 3.0)).collect();
        let weights: Vec<f32> = raw_weights[..world].iter().map(|&w| f32::from(w) * 0.5).collect();
        let (out, _) = reduce(&inputs, &weights, CodecKind::Fp32, seg);
        assert_identical(&out);
        let want = exact_average(&inputs, &weights);
        for (g, w) in out[0].iter().zip(&want) {
            prop_assert!((f64::from(*g) - w).abs() <= 1e-5 * (1.0 + w.abs()), "{} vs {}", g, w);
        }
    }
}

#[test]
fn owned_payload_gives_the_same_result_back() {
    let ring = ids(3);
    let inputs: Vec<Vec<f32>> = (0..3).map(|r| gaussian(1000, r, 1.0)).collect();
    let (want, _) = reduce(&inputs, &[1.0; 3], CodecKind::Uint8, 100);
    let mut ms: Vec<_> = inputs
        .iter()
        .zip(&ring)
        .map(|(x, &me)| {
            RingAllReduce::new(
                cfg(&ring, me, CodecKind::Uint8, 100),
                Payload::Owned(x.clone()),
                Weight::ONE,
            )
            .unwrap()
        })
        .collect();
    pump(&mut ms);
    let got: Vec<Vec<f32>> = ms.into_iter().map(|m| m.into_payload().unwrap()).collect();
    assert_eq!(got, want);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// A virtual all-reduce finished at once (the simulator's modelled collectives) counts the
    /// frames and bytes that moving its frames counts.
    #[test]
    fn completing_a_virtual_ring_counts_what_its_frames_would(
        len in 0usize..3000,
        world in 1usize..12,
        seg in 1usize..400,
        codec in proptest::sample::select(vec![CodecKind::Fp32, CodecKind::Uint8, CodecKind::Int4Block]),
    ) {
        let ring = ids(world);
        let new = |me| RingAllReduce::new(cfg(&ring, me, codec, seg), Payload::Virtual(len), Weight::ONE).unwrap();
        let mut moved: Vec<_> = ring.iter().map(|&me| new(me)).collect();
        let want = pump(&mut moved);
        for (r, &me) in ring.iter().enumerate() {
            let mut m = new(me);
            prop_assert!(m.complete_virtual());
            prop_assert!(m.is_done());
            prop_assert_eq!(m.stats(), want[r]);
            prop_assert!(m.poll_send().is_none());
        }
    }
}

#[test]
fn real_values_and_rings_under_way_are_not_completed_virtually() {
    let ring = ids(3);
    let mut v = vec![1.0f32; 300];
    let mut real = RingAllReduce::new(
        cfg(&ring, ring[0], CodecKind::Fp32, 50),
        Payload::Real(&mut v),
        Weight::ONE,
    )
    .unwrap();
    assert!(!real.complete_virtual());
    assert!(!real.is_done());
    let mut started = RingAllReduce::new(
        cfg(&ring, ring[0], CodecKind::Fp32, 50),
        Payload::Virtual(300),
        Weight::ONE,
    )
    .unwrap();
    assert!(started.poll_send().is_some());
    assert!(!started.complete_virtual());
    assert!(!started.is_done());
}

/// Bytes that would decode to a value that is not finite are refused before they are used, with
/// the sender named, and nothing is sent on for them; so is a sum that overflows.
#[test]
fn values_that_are_not_finite_are_refused_and_the_sender_named() {
    let ring = ids(3);
    fn start<'a>(
        ring: &[NodeId],
        codec: CodecKind,
        me: usize,
        x: &'a mut [f32],
    ) -> RingAllReduce<'a> {
        RingAllReduce::new(cfg(ring, ring[me], codec, 256), Payload::Real(x), Weight::ONE).unwrap()
    }
    // A NaN scale in int8-block bytes from the left neighbour.
    let (mut a, mut b) = (gaussian(1536, 1, 1.0), gaussian(1536, 2, 1.0));
    let mut ma = start(&ring, CodecKind::Int8Block, 0, &mut a);
    let mut mb = start(&ring, CodecKind::Int8Block, 1, &mut b);
    let (to, mut f) = ma.poll_send().unwrap();
    assert_eq!(to, ring[1]);
    let own = std::iter::from_fn(|| mb.poll_send()).count();
    let Body::Bytes(good) = &f.body else { panic!("real bytes") };
    let mut bad = good.to_vec();
    bad[..4].copy_from_slice(&f32::NAN.to_le_bytes());
    f.body = Body::Bytes(bad.into());
    match mb.handle_frame(ring[0], &f) {
        Err(RingError::BadValues { from, what: "values received", source }) => {
            assert_eq!((from, source.what, source.index), (ring[0], "block scale", 0));
        }
        other => panic!("{other:?}"),
    }
    assert!(mb.poll_send().is_none(), "nothing sent on for the refused frame ({own} own)");
    // fp32 values that are finite alone but overflow in the sum.
    let (mut a, mut b) = (vec![3e38f32; 1536], vec![3e38f32; 1536]);
    let mut ma = start(&ring, CodecKind::Fp32, 0, &mut a);
    let mut mb = start(&ring, CodecKind::Fp32, 1, &mut b);
    let (_, f) = ma.poll_send().unwrap();
    while mb.poll_send().is_some() {}
    match mb.handle_frame(ring[0], &f) {
        Err(RingError::BadValues { from, what, source }) => {
            assert_eq!((from, what), (ring[0], "the sum with the values received"));
            assert_eq!(source.value, f32::INFINITY);
        }
        other => panic!("{other:?}"),
    }
    assert!(mb.poll_send().is_none(), "the overflowed sum is not sent on");
}

/// A weight sum is checked as the f32 the average divides by: one that is positive but zero or
/// subnormal as an f32, or beyond its range, is refused like a negative one.
#[test]
fn weight_sums_that_would_divide_into_infinities_are_refused() {
    let ring = ids(3);
    for bad in [1e-50, 1e-40, 1e39, -1.0, f64::NAN] {
        let (mut a, mut b) = (vec![1.0f32; 6], vec![2.0f32; 6]);
        let cfg_a = cfg(&ring, ring[0], CodecKind::Fp32, 2);
        let mut ma = RingAllReduce::new(cfg_a, Payload::Real(&mut a), Weight::ONE).unwrap();
        let cfg_b = cfg(&ring, ring[1], CodecKind::Fp32, 2);
        let mut mb = RingAllReduce::new(cfg_b, Payload::Real(&mut b), Weight::ONE).unwrap();
        let (_, mut f) = ma.poll_send().unwrap();
        if let Header::Collective(h) = &mut f.header {
            h.weight_sum = bad;
        }
        match mb.handle_frame(ring[0], &f) {
            Err(RingError::Unexpected { reason, .. }) => assert!(reason.contains("weight sum")),
            other => panic!("{bad}: {other:?}"),
        }
    }
}
