//! The DiLoCo outer state in flat fp32 buffers.
//!
//! Every node keeps the last global weights (`outer`), the pseudo-gradient of the current round
//! and the outer optimiser's Nesterov momentum, each one flat `Vec<f32>` of the model's parameter
//! count, bucketed by layer so the all-reduce can send layer by layer. The inner optimiser is the
//! backend's business.
//!
//! One outer step, for every node:
//! 1. `pseudo_gradient = outer - inner` ([`OuterState::compute_pseudo_gradient`]);
//! 2. the pseudo-gradients are averaged by the ring all-reduce (weighted);
//! 3. the outer SGD step with Nesterov momentum, with torch's semantics
//!    (`buf = m*buf + g; outer -= lr*(g + m*buf)`; [`OuterState::apply_outer_step`]);
//! 4. the inner weights are set to the new outer weights (the backend copies `outer` back).

use serde::{Deserialize, Serialize};
use std::ops::Range;
use std::sync::Arc;

/// Settings of the outer optimiser. `Default` gives DiLoCo's: lr 0.7, momentum 0.9, Nesterov.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct OuterConfig {
    /// Outer learning rate.
    pub lr: f32,
    /// Momentum coefficient.
    pub momentum: f32,
    /// Nesterov momentum (torch `SGD(nesterov=True)`); plain momentum when false.
    pub nesterov: bool,
}

impl Default for OuterConfig {
    fn default() -> Self {
        OuterConfig { lr: 0.7, momentum: 0.9, nesterov: true }
    }
}

/// A named contiguous range of the flat buffers (one layer or parameter tensor).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bucket {
    /// Name of the tensor or layer.
    pub name: String,
    /// Its values in the flat buffers.
    pub range: Range<usize>,
}

/// Builds contiguous buckets from `(name, len)` pairs, in order.
pub fn buckets_from_sizes<S: Into<String>>(
    sizes: impl IntoIterator<Item = (S, usize)>,
) -> Vec<Bucket> {
    let mut at = 0;
    sizes
        .into_iter()
        .map(|(name, len)| {
            let b = Bucket { name: name.into(), range: at..at + len };
            at += len;
            b
        })
        .collect()
}

/// Errors of the outer state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DilocoError {
    /// A buffer of the wrong length was given.
    #[error("{what}: expected {expected} values, got {got}")]
    Length {
        /// Which buffer.
        what: &'static str,
        /// The parameter count.
        expected: usize,
        /// What was given.
        got: usize,
    },
    /// Buckets do not tile the buffers.
    #[error("buckets must tile 0..{len} contiguously; bucket `{name}` starts at {start}")]
    Buckets {
        /// The parameter count.
        len: usize,
        /// The offending bucket.
        name: String,
        /// Where it starts.
        start: usize,
    },
}

/// `n` zeros whose pages are resident: written once now, so that the first writes into them
/// later (a joiner's momentum, received by live recovery while the mesh waits) do not stop for
/// the kernel to hand out and clear fresh pages.
fn resident_zeros(n: usize) -> Vec<f32> {
    let mut v = vec![0.0f32; n];
    // One write per 4 KiB page (freshly allocated zeros are only mapped, not yet backed).
    for i in (0..n).step_by(1024) {
        v[i] = std::hint::black_box(0.0);
    }
    v
}

/// The outer state of one node.
///
/// The outer weights and momentum are shared buffers, copied on write: a snapshot
/// ([`shared_buffers`](Self::shared_buffers), what a live-recovery sender sends from) costs no
/// copy, and the outer step that follows copies a buffer only while a snapshot still holds it.
#[derive(Clone, Debug, PartialEq)]
pub struct OuterState {
    cfg: OuterConfig,
    outer: Arc<Vec<f32>>,
    pseudo_gradient: Vec<f32>,
    momentum: Arc<Vec<f32>>,
    buckets: Vec<Bucket>,
    steps: u64,
}

impl OuterState {
    /// Starts from the initial global weights, with zero momentum and one bucket per entry of
    /// `buckets` (which must tile the weights; empty means one bucket for everything).
    pub fn new(
        cfg: OuterConfig,
        weights: impl Into<Arc<Vec<f32>>>,
        buckets: Vec<Bucket>,
    ) -> Result<OuterState, DilocoError> {
        OuterState::build(cfg, weights.into(), None, buckets)
    }

    /// [`new`](Self::new), with `momentum` (of the weights' length) or zeros.
    fn build(
        cfg: OuterConfig,
        weights: Arc<Vec<f32>>,
        momentum: Option<Arc<Vec<f32>>>,
        buckets: Vec<Bucket>,
    ) -> Result<OuterState, DilocoError> {
        let n = weights.len();
        let buckets = if buckets.is_empty() {
            vec![Bucket { name: "all".into(), range: 0..n }]
        } else {
            buckets
        };
        let mut at = 0;
        for b in &buckets {
            if b.range.start != at || b.range.end < b.range.start {
                return Err(DilocoError::Buckets {
                    len: n,
                    name: b.name.clone(),
                    start: b.range.start,
                });
            }
            at = b.range.end;
        }
        if at != n {
            let last = buckets.last().map(|b| b.name.clone()).unwrap_or_default();
            return Err(DilocoError::Buckets { len: n, name: last, start: at });
        }
        Ok(OuterState {
            cfg,
            pseudo_gradient: vec![0.0; n],
            momentum: momentum.unwrap_or_else(|| Arc::new(resident_zeros(n))),
            outer: weights,
            buckets,
            steps: 0,
        })
    }

    /// Restores a state (live recovery, checkpoints): weights and momentum as they were.
    pub fn restore(
        cfg: OuterConfig,
        weights: impl Into<Arc<Vec<f32>>>,
        momentum: impl Into<Arc<Vec<f32>>>,
        buckets: Vec<Bucket>,
        steps: u64,
    ) -> Result<OuterState, DilocoError> {
        let (weights, momentum) = (weights.into(), momentum.into());
        if momentum.len() != weights.len() {
            return Err(DilocoError::Length {
                what: "momentum",
                expected: weights.len(),
                got: momentum.len(),
            });
        }
        let mut s = OuterState::build(cfg, weights, Some(momentum), buckets)?;
        s.steps = steps;
        Ok(s)
    }

    /// Number of parameters.
    pub fn len(&self) -> usize {
        self.outer.len()
    }

    /// True for a model with no parameters.
    pub fn is_empty(&self) -> bool {
        self.outer.is_empty()
    }

    /// The outer optimiser's settings.
    pub fn config(&self) -> OuterConfig {
        self.cfg
    }

    /// The last global weights.
    pub fn outer(&self) -> &[f32] {
        &self.outer
    }

    /// The Nesterov momentum buffer.
    pub fn momentum(&self) -> &[f32] {
        &self.momentum
    }

    /// Hands out the outer weights' and momentum's buffers when nothing else shares them,
    /// leaving this state without parameters until [`put_buffers`](Self::put_buffers): a
    /// joiner writes the state it receives into the buffers it holds anyway.
    pub fn take_buffers(&mut self) -> Option<[Vec<f32>; 2]> {
        let (Some(outer), Some(momentum)) =
            (Arc::get_mut(&mut self.outer), Arc::get_mut(&mut self.momentum))
        else {
            return None;
        };
        Some([std::mem::take(outer), std::mem::take(momentum)])
    }

    /// Gives back buffers handed out by [`take_buffers`](Self::take_buffers) (their values are
    /// whatever was written meanwhile); ignored unless both have the pseudo-gradient's length.
    pub fn put_buffers(&mut self, [outer, momentum]: [Vec<f32>; 2]) {
        let n = self.pseudo_gradient.len();
        if outer.len() == n && momentum.len() == n {
            (self.outer, self.momentum) = (Arc::new(outer), Arc::new(momentum));
        }
    }

    /// The outer weights' and momentum's buffers, shared (no copy): a snapshot that stays as it
    /// is, since the next outer step copies a buffer still shared before it writes.
    pub fn shared_buffers(&self) -> [Arc<Vec<f32>>; 2] {
        [Arc::clone(&self.outer), Arc::clone(&self.momentum)]
    }

    /// The pseudo-gradient buffer (before the all-reduce: this node's; after: the average).
    pub fn pseudo_gradient(&self) -> &[f32] {
        &self.pseudo_gradient
    }

    /// Mutable pseudo-gradient, for the all-reduce to average in place.
    pub fn pseudo_gradient_mut(&mut self) -> &mut [f32] {
        &mut self.pseudo_gradient
    }

    /// Moves the pseudo-gradient buffer out (for an all-reduce that owns its payload); put it
    /// back with [`put_pseudo_gradient`](Self::put_pseudo_gradient).
    pub fn take_pseudo_gradient(&mut self) -> Vec<f32> {
        std::mem::take(&mut self.pseudo_gradient)
    }

    /// Puts the pseudo-gradient buffer back.
    pub fn put_pseudo_gradient(&mut self, g: Vec<f32>) -> Result<(), DilocoError> {
        self.check("pseudo-gradient", g.len())?;
        self.pseudo_gradient = g;
        Ok(())
    }

    /// The layer buckets.
    pub fn buckets(&self) -> &[Bucket] {
        &self.buckets
    }

    /// Outer steps applied so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// `pseudo_gradient = outer - inner`. Call again to restore the kept pseudo-gradient before
    /// retrying a failed all-reduce (the inner weights have not changed). Returns how many of
    /// its values are not finite (NaN or infinite: a diverged inner loop), counted in the same
    /// pass; such a pseudo-gradient must not be averaged.
    pub fn compute_pseudo_gradient(&mut self, inner: &[f32]) -> Result<usize, DilocoError> {
        self.check("inner weights", inner.len())?;
        let mut bad = 0usize;
        for ((g, o), i) in self.pseudo_gradient.iter_mut().zip(self.outer.iter()).zip(inner) {
            *g = o - i;
            bad += usize::from(!g.is_finite());
        }
        Ok(bad)
    }

    /// Like [`compute_pseudo_gradient`](Self::compute_pseudo_gradient), without a copy of the
    /// inner weights: `fill` writes them into the pseudo-gradient buffer, which is then turned
    /// into `outer - inner` in place. Keeps the outer state at three fp32 copies of the model.
    pub fn compute_pseudo_gradient_with<E>(
        &mut self,
        fill: impl FnOnce(&mut [f32]) -> Result<(), E>,
    ) -> Result<(), E> {
        fill(&mut self.pseudo_gradient)?;
        for (g, o) in self.pseudo_gradient.iter_mut().zip(self.outer.iter()) {
            *g = o - *g;
        }
        Ok(())
    }

    /// Applies the averaged pseudo-gradient held in the buffer: one outer SGD step with torch's
    /// semantics (`buf = m*buf + g`; Nesterov: `outer -= lr*(g + m*buf)`; else `outer -= lr*buf`).
    /// Afterwards the backend copies [`outer`](Self::outer) into the inner model.
    pub fn apply_outer_step(&mut self) {
        let OuterConfig { lr, momentum: m, nesterov } = self.cfg;
        // Copies a buffer only while a snapshot still holds it.
        let (outer, momentum) = (Arc::make_mut(&mut self.outer), Arc::make_mut(&mut self.momentum));
        for ((w, buf), &g) in outer.iter_mut().zip(momentum).zip(&self.pseudo_gradient) {
            *buf = m * *buf + g;
            let d = if nesterov { g + m * *buf } else { *buf };
            *w -= lr * d;
        }
        self.steps += 1;
    }

    /// Skips the outer update of this round (every member does the same when the all-reduce
    /// could not complete within its retries): weights and momentum are unchanged, the step is
    /// counted, and the backend resets the inner weights to [`outer`](Self::outer).
    pub fn skip_outer_step(&mut self) {
        self.pseudo_gradient.fill(0.0);
        self.steps += 1;
    }

    fn check(&self, what: &'static str, got: usize) -> Result<(), DilocoError> {
        if got == self.outer.len() {
            Ok(())
        } else {
            Err(DilocoError::Length { what, expected: self.outer.len(), got })
        }
    }
}

#[cfg(test)]
mod tests {
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
            .map(|r| {
                OuterState::new(OuterConfig::default(), vec![r as f32 + 1.0; n], vec![]).unwrap()
            })
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
            assert!(
                s.outer().iter().all(|&w| (w - want).abs() < 1e-6),
                "rank {r}: {:?}",
                s.outer()
            );
            assert!(s.momentum().iter().all(|&b| b == 1.25));
        }
    }

    #[test]
    fn second_nesterov_step_uses_the_momentum() {
        let mut s = OuterState::new(
            OuterConfig { lr: 0.5, momentum: 0.9, nesterov: true },
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
            OuterConfig { lr: 0.5, momentum: 0.9, nesterov: false },
            vec![0.0],
            vec![],
        )
        .unwrap();
        plain.pseudo_gradient_mut()[0] = 1.0;
        plain.apply_outer_step();
        assert_eq!(plain.outer()[0], -0.5);
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
}
