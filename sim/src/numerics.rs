//! Simulated compute: how long a node's inner steps take, and, with real numerics, what they do.
//!
//! **Time.** One inner step of node `n` takes `step_time x (1 + step_jitter x u)`, `u` uniform in
//! `[-1, 1]`, drawn from the stream of (seed, node, [`Purpose::StepTime`]) keyed further by the
//! incarnation and the outer step, so a node's draws depend on nothing but its own history.
//!
//! **Real numerics.** Small vectors (`[sim] elements`) with a synthetic objective: node `n`
//! minimises `0.5 |w - t_n|^2` towards its own target `t_n = c + s z_n` (a shared centre plus a
//! node-specific offset, both from seeded streams). Its `H` inner steps are gradient descent with
//! rate [`INNER_RATE`] plus a little seeded noise per step, so after them `w = t_n + (1 -
//! rate)^H (w_0 - t_n) + noise`. The pseudo-gradient is `outer - inner`, averaged by the ring
//! all-reduce, and the outer Nesterov step of `OuterState` moves the shared weights towards the
//! mean target. That is enough to check that DiLoCo, the codecs, retries and live recovery keep
//! every replica bit-identical under churn.
//!
//! **State.** What a joiner receives is `loco_core::node::state`'s, as with the real backend
//! (see the node's recovery module).

use crate::rng::{Purpose, mix64, stream};
use loco_core::diloco::OuterConfig;
use loco_core::scenario::Scenario;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::time::Duration;

/// Gradient-descent rate of one synthetic inner step.
pub const INNER_RATE: f32 = 0.05;
/// Standard deviation of the per-step noise of a synthetic inner step.
pub const INNER_NOISE: f32 = 1e-3;
/// Spread of the node targets around their centre.
pub const TARGET_SPREAD: f32 = 0.5;

/// The compute time of one outer step (`inner_steps` inner steps) of a node.
pub fn outer_step_compute(
    seed: u64,
    node: u32,
    incarnation: u64,
    outer_step: u64,
    inner_steps: u64,
    step_time: Duration,
    jitter: f64,
) -> Duration {
    let subject = mix64(u64::from(node)) ^ mix64(incarnation.wrapping_add(1) << 20) ^ outer_step;
    let mut rng = stream(seed, subject, Purpose::StepTime);
    let base = step_time.as_secs_f64();
    let mut total = 0.0;
    for _ in 0..inner_steps {
        let u: f64 = if jitter > 0.0 { rng.random_range(-1.0..=1.0) } else { 0.0 };
        total += base * (1.0 + jitter * u);
    }
    Duration::from_secs_f64(total.max(0.0))
}

fn normal(rng: &mut ChaCha8Rng) -> f32 {
    // Box-Muller, from two uniforms in (0, 1].
    let u1: f64 = 1.0 - rng.random::<f64>();
    let u2: f64 = rng.random::<f64>();
    ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
}

/// The initial outer weights every founding member starts from.
pub fn initial_weights(seed: u64, n: usize) -> Vec<f32> {
    let mut rng = stream(seed, 0, Purpose::InitialWeights);
    (0..n).map(|_| normal(&mut rng)).collect()
}

/// The target of node `node` (the minimum of its synthetic objective).
pub fn target(seed: u64, node: u32, n: usize) -> Vec<f32> {
    let mut centre = stream(seed, 1, Purpose::InitialWeights);
    let mut own = stream(seed, u64::from(node), Purpose::Objective);
    (0..n).map(|_| 2.0 * normal(&mut centre) + TARGET_SPREAD * normal(&mut own)).collect()
}

/// A node's synthetic model: its target and its inner weights.
#[derive(Clone, Debug)]
pub struct Synthetic {
    seed: u64,
    node: u32,
    target: Vec<f32>,
    /// The inner weights.
    pub inner: Vec<f32>,
}

impl Synthetic {
    /// The model of `node`, with inner weights `start`.
    pub fn new(seed: u64, node: u32, start: Vec<f32>) -> Self {
        let target = target(seed, node, start.len());
        Synthetic { seed, node, target, inner: start }
    }

    /// Runs the `inner_steps` of `outer_step` from the current inner weights; returns the loss
    /// `0.5 mean (w - t)^2` after them.
    pub fn inner_steps(&mut self, incarnation: u64, outer_step: u64, inner_steps: u64) -> f64 {
        let subject =
            mix64(u64::from(self.node)) ^ mix64(incarnation.wrapping_add(7) << 24) ^ outer_step;
        let mut rng = stream(self.seed, subject, Purpose::Objective);
        for _ in 0..inner_steps {
            for (w, t) in self.inner.iter_mut().zip(&self.target) {
                *w -= INNER_RATE * (*w - *t) + INNER_NOISE * normal(&mut rng);
            }
        }
        self.loss()
    }

    /// `0.5 mean (w - t)^2` at the inner weights.
    pub fn loss(&self) -> f64 {
        if self.inner.is_empty() {
            return 0.0;
        }
        let s: f64 =
            self.inner.iter().zip(&self.target).map(|(w, t)| f64::from(w - t).powi(2)).sum();
        0.5 * s / self.inner.len() as f64
    }
}

/// The outer optimiser settings of a scenario.
pub fn outer_config(s: &Scenario) -> OuterConfig {
    let d = s.diloco();
    OuterConfig { lr: d.outer_lr as f32, momentum: d.outer_momentum as f32, nesterov: d.nesterov }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compute_time_has_the_mean_and_the_spread_of_the_scenario() {
        let st = Duration::from_secs_f64(22.8);
        let t = outer_step_compute(42, 3, 0, 5, 100, st, 0.01).as_secs_f64();
        assert!((t - 2280.0).abs() < 2280.0 * 0.01, "{t}");
        assert_ne!(t, 2280.0);
        assert_eq!(outer_step_compute(42, 3, 0, 5, 100, st, 0.0).as_secs_f64(), 2280.0);
        // Reproducible, and different for another node or step.
        assert_eq!(t, outer_step_compute(42, 3, 0, 5, 100, st, 0.01).as_secs_f64());
        assert_ne!(t, outer_step_compute(42, 4, 0, 5, 100, st, 0.01).as_secs_f64());
        assert_ne!(t, outer_step_compute(42, 3, 0, 6, 100, st, 0.01).as_secs_f64());
    }

    #[test]
    fn inner_steps_descend_towards_the_target() {
        let w0 = initial_weights(1, 256);
        let mut m = Synthetic::new(1, 0, w0);
        let before = m.loss();
        let after = m.inner_steps(0, 0, 10);
        assert!(after < 0.7 * before, "{before} -> {after}");
    }
}
