use super::*;
use proptest::prelude::*;

/// Plain SGD with lr 1: an outer step subtracts the average, so sums are exact in binary.
fn sgd() -> OuterConfig {
    OuterConfig { lr: 1.0, momentum: 0.0, nesterov: false, feedback: None }
}

/// Rounds of overlapped or streaming DiLoCo on `n` nodes, each taking `progress[r][i]` as
/// its inner steps of round `r` (then rounds of none until every fragment is synchronised
/// and merged); the commit of round `r - 1` lands during round `r`, or is skipped where
/// `skip[r - 1]`. Returns each node's outer state and inner weights.
fn run(
    n: usize,
    p: u32,
    len: usize,
    progress: &[Vec<Vec<f32>>],
    skip: &[bool],
) -> Vec<(OuterState, Vec<f32>)> {
    let schedule = Schedule::new(Mode::Streaming, len, &[], p, 0.0);
    let g0: Vec<f32> = (0..len).map(|i| i as f32 * 0.5).collect();
    let mut nodes: Vec<(OuterState, Vec<f32>)> = (0..n)
        .map(|_| {
            let mut o = OuterState::new(sgd(), g0.clone(), vec![]).unwrap();
            o.anchor_here();
            (o, g0.clone())
        })
        .collect();
    let zero = vec![vec![0.0; len]; n];
    let rounds = progress.len() + p as usize + 1;
    let mut in_flight: Option<(Range<usize>, Vec<Vec<f32>>)> = None;
    for r in 0..rounds {
        let step = progress.get(r).unwrap_or(&zero);
        for ((_, x), d) in nodes.iter_mut().zip(step) {
            for (x, d) in x.iter_mut().zip(d) {
                *x -= d;
            }
        }
        // The all-reduce of the round before completes beside this round's inner steps.
        if let Some((f, sent)) = in_flight.take() {
            let mut avg = vec![0.0f32; f.len()];
            for s in &sent {
                for (a, v) in avg.iter_mut().zip(s) {
                    *a += v;
                }
            }
            avg.iter_mut().for_each(|a| *a /= n as f32);
            for (o, _) in &mut nodes {
                if skip.get(r - 1).copied().unwrap_or(false) {
                    o.skip_round(f.clone());
                } else {
                    o.apply_outer_step_to(f.clone(), &avg).unwrap();
                }
            }
        }
        let f = schedule.fragment(r as u64);
        let mut sent = Vec::new();
        for (o, x) in &mut nodes {
            let merge = schedule.merged(r as u64);
            assert_eq!(o.overlap_round(x, merge, f.clone(), 0.0, true), Ok(0));
            sent.push(o.pseudo_gradient()[f.clone()].to_vec());
        }
        in_flight = Some((f, sent));
    }
    nodes
}

proptest! {
    /// Every inner step's progress is averaged into the global weights exactly once, skips
    /// included: once every fragment has been synchronised and merged after the last
    /// progress, each node's inner weights are the global weights, which moved by the
    /// average of all the progress made.
    #[test]
    fn no_progress_is_lost_or_counted_twice(
        n in prop::sample::select(vec![1usize, 2, 4]),
        p in 1u32..5,
        len in 1usize..24,
        seed in prop::collection::vec(-8i32..8, 1..200),
        rounds in 1usize..7,
        skips in prop::collection::vec(any::<bool>(), 7),
    ) {
        let progress: Vec<Vec<Vec<f32>>> = (0..rounds)
            .map(|r| (0..n).map(|i| (0..len).map(|k| {
                seed[(r * 31 + i * 7 + k) % seed.len()] as f32 * 0.25
            }).collect()).collect())
            .collect();
        // Skips only among the rounds with progress: the rounds after them flush.
        let skip: Vec<bool> = skips.iter().take(rounds.saturating_sub(1)).copied().collect();
        let nodes = run(n, p, len, &progress, &skip);
        let mut want: Vec<f32> = (0..len).map(|i| i as f32 * 0.5).collect();
        for step in &progress {
            for k in 0..len {
                let sum: f32 = step.iter().map(|d| d[k]).sum();
                want[k] -= sum / n as f32;
            }
        }
        for (o, x) in &nodes {
            prop_assert_eq!(o.outer(), &want[..]);
            prop_assert_eq!(&x[..], &want[..]);
        }
    }
}

#[test]
fn fragments_follow_layers_and_tile_the_model() {
    assert_eq!(fragments(10, &[], 3), vec![0..3, 3..6, 6..10]);
    assert_eq!(fragments(10, &[4, 1, 1, 4], 2), vec![0..5, 5..10]);
    assert_eq!(fragments(10, &[2, 7, 1], 2), vec![0..2, 2..10]);
    assert_eq!(fragments(10, &[9, 1], 4), vec![0..2, 2..5, 5..7, 7..10], "too few layers");
    assert_eq!(fragments(10, &[3, 3], 2), vec![0..5, 5..10], "layers that do not tile");
    let s = Schedule::new(Mode::Streaming, 12, &[], 4, 0.0);
    assert_eq!((s.fragment(5), s.merged(5), s.merged(0)), (3..6, Some(0..3), None));
    assert_eq!(Schedule::new(Mode::Overlap, 12, &[], 4, 0.0).fragments, vec![0..12]);
}

#[test]
fn a_non_finite_round_drops_the_local_trajectory() {
    let mut o = OuterState::new(OuterConfig::default(), vec![1.0; 4], vec![]).unwrap();
    o.anchor_here();
    let mut x = vec![0.5, f32::NAN, 0.5, 0.5];
    assert_eq!(o.overlap_round(&mut x, None, 0..4, 0.0, true), Ok(1));
    assert_eq!(x, vec![1.0; 4]);
    assert!(o.pseudo_gradient().iter().all(|&g| g == 0.0));
    // Inner weights not valid for the round (a joiner's) start a trajectory too.
    let mut y = vec![3.0; 4];
    assert_eq!(o.overlap_round(&mut y, Some(0..4), 0..4, 0.0, false), Ok(0));
    assert_eq!(y, vec![1.0; 4]);
}
