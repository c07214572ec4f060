use super::*;
use crate::allreduce::{Payload, RingAllReduce, RingConfig};
use crate::codec::CodecKind;
use crate::ids::{Epoch, NodeId, Weight};

/// reference.md test case 12: outer weights r+1 and inner weights (r+1)/2 on rank r.
/// The pseudo-gradient of rank r is (r+1)/2; their average over W = 4 ranks is
/// (1+2+3+4)/8 = 1.25. One Nesterov step from outer weights w with zero momentum:
/// buf = g = 1.25, w' = w - 0.7 * (1.25 + 0.9 * 1.25) = w - 1.6625.
#[test]
fn diloco_arithmetic_checked_by_hand() {
    let world = 4;
    let n = 10;
    let ring: Vec<NodeId> = (0..world).map(NodeId).collect();
    let mut states: Vec<OuterState> = (0..world)
        .map(|r| OuterState::new(OuterConfig::default(), vec![r as f32 + 1.0; n], vec![]).unwrap())
        .collect();
    for (r, s) in states.iter_mut().enumerate() {
        s.compute_pseudo_gradient(&vec![(r as f32 + 1.0) / 2.0; n]).unwrap();
        assert!(s.pseudo_gradient().iter().all(|&g| g == (r as f32 + 1.0) / 2.0));
    }
    // Average the pseudo-gradients with the ring (fp32), as the backends do.
    {
        let mut ms: Vec<RingAllReduce<'_>> = states
            .iter_mut()
            .zip(&ring)
            .map(|(s, &me)| {
                let cfg = RingConfig::new(Epoch(1), 0, ring.clone(), me, CodecKind::Fp32);
                RingAllReduce::new(cfg, Payload::Real(s.pseudo_gradient_mut()), Weight::ONE)
                    .unwrap()
            })
            .collect();
        let mut wire = std::collections::VecDeque::new();
        for _ in 0..10_000 {
            for m in ms.iter_mut() {
                while let Some((to, f)) = m.poll_send() {
                    wire.push_back((m.config().me, to, f));
                }
            }
            let Some((from, to, f)) = wire.pop_front() else {
                break;
            };
            ms[to.0 as usize].handle_frame(from, &f).unwrap();
        }
        assert!(ms.iter().all(|m| m.is_done()));
    }
    for (r, s) in states.iter_mut().enumerate() {
        assert!(s.pseudo_gradient().iter().all(|&g| g == 1.25), "rank {r}");
        s.apply_outer_step();
        let want = (r as f32 + 1.0) - 0.7 * (1.25 + 0.9 * 1.25);
        assert!(s.outer().iter().all(|&w| (w - want).abs() < 1e-6), "rank {r}: {:?}", s.outer());
        assert!(s.momentum().iter().all(|&b| b == 1.25));
    }
}

#[test]
fn second_nesterov_step_uses_the_momentum() {
    let mut s = OuterState::new(
        OuterConfig { lr: 0.5, momentum: 0.9, nesterov: true, feedback: None },
        vec![0.0],
        vec![],
    )
    .unwrap();
    s.pseudo_gradient_mut()[0] = 1.0;
    s.apply_outer_step(); // buf = 1, w = -0.5*(1 + 0.9) = -0.95
    s.pseudo_gradient_mut()[0] = 2.0;
    s.apply_outer_step(); // buf = 0.9 + 2 = 2.9, w = -0.95 - 0.5*(2 + 0.9*2.9) = -3.255
    assert!((s.outer()[0] + 3.255).abs() < 1e-6, "{}", s.outer()[0]);
    assert!((s.momentum()[0] - 2.9).abs() < 1e-6);
    let mut plain = OuterState::new(
        OuterConfig { lr: 0.5, momentum: 0.9, nesterov: false, feedback: None },
        vec![0.0],
        vec![],
    )
    .unwrap();
    plain.pseudo_gradient_mut()[0] = 1.0;
    plain.apply_outer_step();
    assert_eq!(plain.outer()[0], -0.5);
}

#[test]
fn sharded_passes_give_the_same_bits_as_one_thread() {
    // Large enough for several shards (SHARD_MIN values each), odd so that shards differ.
    let n = 3 * SHARD_MIN + 7;
    let w: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1000) as f32 * 1e-3 - 0.5).collect();
    let inner: Vec<f32> = w.iter().enumerate().map(|(i, x)| x + (i % 13) as f32 * 1e-4).collect();
    let mut inner_bad = inner.clone();
    inner_bad[2 * SHARD_MIN + 1] = f32::NAN;
    let cfg = OuterConfig { lr: 0.7, momentum: 0.9, nesterov: true, feedback: None };
    let run = |shards: usize, inner: &[f32]| {
        let mut o = OuterState::new(cfg, w.clone(), Vec::new()).unwrap();
        let mut bad = 0;
        for _ in 0..2 {
            bad = o.compute_pseudo_gradient_sharded(inner, shards).unwrap();
            o.apply_outer_step_sharded(shards);
        }
        (o, bad)
    };
    let (one, bad) = run(1, &inner);
    assert_eq!(bad, 0);
    assert_eq!(shards_for(n, 8), 3, "no shard under SHARD_MIN values");
    assert_eq!(shards_for(10, 8), 1);
    for shards in [2, 3, 8] {
        let (o, bad) = run(shards, &inner);
        assert_eq!(bad, 0);
        assert_eq!(o, one, "{shards} shards");
        assert_eq!(run(shards, &inner_bad).1, 1, "a NaN in the third shard is counted");
    }
}

#[test]
fn pseudo_gradient_in_place_equals_the_copying_form() {
    let mut a = OuterState::new(OuterConfig::default(), vec![1.0, 2.0, 3.0], vec![]).unwrap();
    let mut b = a.clone();
    a.compute_pseudo_gradient(&[0.5, 2.5, 3.0]).unwrap();
    b.compute_pseudo_gradient_with(|buf: &mut [f32]| {
        buf.copy_from_slice(&[0.5, 2.5, 3.0]);
        Ok::<(), ()>(())
    })
    .unwrap();
    assert_eq!(a.pseudo_gradient(), b.pseudo_gradient());
    assert_eq!(a.pseudo_gradient(), &[0.5, -0.5, 0.0]);
}

/// reference.md test case 13: after every outer step the inner weights equal the outer
/// weights on every node (the backend copies them back; here: the copy is exact and a
/// fresh pseudo-gradient is zero).
#[test]
fn inner_equals_outer_after_the_step() {
    let mut s = OuterState::new(OuterConfig::default(), vec![1.0, 2.0, 3.0], vec![]).unwrap();
    s.compute_pseudo_gradient(&[0.5, 1.5, 2.0]).unwrap();
    s.apply_outer_step();
    let inner = s.outer().to_vec();
    s.compute_pseudo_gradient(&inner).unwrap();
    assert!(s.pseudo_gradient().iter().all(|&g| g == 0.0));
    let skipped = s.outer().to_vec();
    s.skip_outer_step();
    assert_eq!(s.outer(), &skipped[..]);
    assert_eq!(s.steps(), 2);
}

#[test]
fn buckets_must_tile_and_lengths_are_checked() {
    let b = buckets_from_sizes([("embed", 4), ("layer0", 3)]);
    assert_eq!(b[1].range, 4..7);
    assert!(OuterState::new(OuterConfig::default(), vec![0.0; 7], b.clone()).is_ok());
    assert!(matches!(
        OuterState::new(OuterConfig::default(), vec![0.0; 8], b),
        Err(DilocoError::Buckets { .. })
    ));
    let mut s = OuterState::new(OuterConfig::default(), vec![0.0; 2], vec![]).unwrap();
    assert_eq!(
        s.compute_pseudo_gradient(&[1.0]),
        Err(DilocoError::Length { what: "inner weights", expected: 2, got: 1 })
    );
}

/// Error feedback loses nothing: with decay 1, what the codec sent over the steps plus the
/// residual left equals the sum of the pseudo-gradients; without it the residual stays empty.
#[test]
fn error_feedback_keeps_what_the_codec_did_not_send() {
    use crate::codec::{CodecKind, SparseSpec};
    let codec = CodecKind::Sparse(SparseSpec { chunk: 256, keep: 8, bits: 2 });
    let n = 1000;
    let cfg = OuterConfig { lr: 1.0, momentum: 0.0, nesterov: false, feedback: Some(1.0) };
    let mut s = OuterState::new(cfg, vec![0.0f32; n], vec![]).unwrap();
    let mut pseudo = vec![0.0f64; n];
    let mut sent_total = vec![0.0f64; n];
    for step in 0..20u64 {
        let inner: Vec<f32> = (0..n)
            .map(|i| ((i as u64 * 7919 + step * 104_729) % 1000) as f32 / 1e4 - 0.05)
            .collect();
        let outer_now = s.outer().to_vec();
        s.compute_pseudo_gradient(&inner).unwrap();
        for (p, (o, i)) in pseudo.iter_mut().zip(outer_now.iter().zip(&inner)) {
            *p += f64::from(o - i);
        }
        s.add_residual();
        let sent = SentContribution::encode(codec, s.pseudo_gradient(), 300);
        s.keep_residual(&sent);
        let mut decoded = vec![0.0f32; n];
        for (r, b) in &sent.parts {
            codec.codec().decode(b, &mut decoded[r.clone()]);
        }
        for (t, d) in sent_total.iter_mut().zip(&decoded) {
            *t += f64::from(*d);
        }
        // The average of one node is what it sent: the outer step moves by it.
        s.put_pseudo_gradient(decoded).unwrap();
        s.apply_outer_step();
    }
    for i in 0..n {
        let kept = sent_total[i] + f64::from(s.residual()[i]);
        assert!((kept - pseudo[i]).abs() < 1e-4, "{i}: {kept} vs {}", pseudo[i]);
    }
    assert!(s.residual().iter().any(|e| *e != 0.0));
    // Without error feedback: no residual, and the contribution is the pseudo-gradient.
    let plain = OuterState::new(OuterConfig::default(), vec![0.0f32; 4], vec![]).unwrap();
    assert!(plain.residual().is_empty());
    let mut plain = plain;
    assert!(plain.set_residual(vec![0.0; 4]).is_err());
}
