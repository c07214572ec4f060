//! The synthetic objective, once for both backends: the simulator's real numerics
//! (`[sim] numerics = "real"`) and the real backend's `--synthetic-params` train exactly this, so
//! that on the same membership story their outer weights, and so their `weights_hash` rows, are
//! bit-identical after every outer step (tests/it/conformance.rs compares them).
//!
//! Node `n` minimises `0.5 |w - t_n|^2` towards its own target `t_n = c + s z_n` (a shared centre
//! plus a node-specific offset, both from seeded streams). One inner step is gradient descent with
//! rate [`INNER_RATE`] plus a little seeded noise: `w -= rate (w - t) + noise z`, element by
//! element in order, `z` standard normal.
//!
//! **The noise of an outer step** comes from the stream of (seed, node, digest of the weights the
//! step's inner loop starts from). Both executors start each outer step's inner loop from the
//! outer weights, which the protocol makes identical on every member, and neither needs to tell
//! the objective which outer step it is in (a joiner, a resumed process and a retried step all
//! draw the same noise as the others would from the same weights).
//!
//! Pure and deterministic: the same seed gives the same bits on every run.

use super::digest::weights_digest;
use crate::rng::{Purpose, mix64, stream};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;
use std::time::Duration;

/// Gradient-descent rate of one inner step.
pub const INNER_RATE: f32 = 0.05;
/// Standard deviation of the per-step noise of an inner step.
pub const INNER_NOISE: f32 = 1e-3;
/// Spread of the node targets around their centre.
pub const TARGET_SPREAD: f32 = 0.5;

fn normal(rng: &mut ChaCha8Rng) -> f32 {
    let z: f64 = rng.sample(StandardNormal);
    z as f32
}

/// The initial outer weights every founding member starts from (`n` of them).
pub fn initial_weights(seed: u64, n: usize) -> Vec<f32> {
    let mut rng = stream(seed, 0, Purpose::InitialWeights);
    (0..n).map(|_| normal(&mut rng)).collect()
}

/// The target of node `node` (the minimum of its objective).
pub fn target(seed: u64, node: u32, n: usize) -> Vec<f32> {
    let mut centre = stream(seed, 1, Purpose::InitialWeights);
    let mut own = stream(seed, u64::from(node), Purpose::Objective);
    (0..n).map(|_| 2.0 * normal(&mut centre) + TARGET_SPREAD * normal(&mut own)).collect()
}

/// The inner steps of one outer step of a node, whose times are drawn: each takes
/// `step_time x (1 + jitter x u)`, `u` uniform in `[-1, 1]`, from the stream of (seed, node,
/// [`Purpose::StepTime`]) keyed further by the incarnation and the outer step, so a node's draws
/// depend on nothing but its own history. The simulator sums them ([`total`](Self::total)); the
/// real backend's paced synthetic steps last them one by one ([`times`](Self::times)).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepDraw {
    /// The run's seed.
    pub seed: u64,
    /// The node's id.
    pub node: u32,
    /// Its process's incarnation (the simulator's count, from 0).
    pub incarnation: u64,
    /// The outer step.
    pub outer_step: u64,
    /// Inner steps in the outer step.
    pub inner_steps: u64,
    /// The mean step time.
    pub step_time: Duration,
    /// The relative jitter, in `[0, 1)`.
    pub jitter: f64,
}

impl StepDraw {
    /// Each inner step's time, in seconds.
    pub fn times(&self) -> impl Iterator<Item = f64> {
        let subject = mix64(u64::from(self.node))
            ^ mix64(self.incarnation.wrapping_add(1) << 20)
            ^ self.outer_step;
        let mut rng = stream(self.seed, subject, Purpose::StepTime);
        let (base, jitter) = (self.step_time.as_secs_f64(), self.jitter);
        (0..self.inner_steps).map(move |_| {
            let u: f64 = if jitter > 0.0 { rng.random_range(-1.0..=1.0) } else { 0.0 };
            base * (1.0 + jitter * u)
        })
    }

    /// The outer step's compute time: the sum of its [`times`](Self::times).
    pub fn total(&self) -> Duration {
        let total: f64 = self.times().sum();
        Duration::from_secs_f64(total.max(0.0))
    }
}

/// One node's objective: its target, and the noise streams of its outer steps.
#[derive(Clone, Debug)]
pub struct Objective {
    seed: u64,
    node: u32,
    target: Vec<f32>,
}

impl Objective {
    /// The objective of `node` over `n` weights.
    pub fn new(seed: u64, node: u32, n: usize) -> Objective {
        Objective { seed, node, target: target(seed, node, n) }
    }

    /// How many weights it is over.
    pub fn len(&self) -> usize {
        self.target.len()
    }

    /// Whether it is over no weights.
    pub fn is_empty(&self) -> bool {
        self.target.is_empty()
    }

    /// The noise stream of an outer step whose inner loop starts from `start`.
    pub fn noise(&self, start: &[f32]) -> ChaCha8Rng {
        // The digest's bytes as the number its hex text reads as.
        let key = u64::from_be_bytes(*weights_digest(start).as_bytes());
        stream(self.seed, mix64(u64::from(self.node)) ^ key, Purpose::Objective)
    }

    /// One inner step on `w` (as long as the target) with the outer step's `noise`; returns the
    /// loss `0.5 mean (w - t)^2` after it (0 over no weights).
    pub fn step(&self, w: &mut [f32], noise: &mut ChaCha8Rng) -> f64 {
        let mut s = 0.0f64;
        for (w, t) in w.iter_mut().zip(&self.target) {
            *w -= INNER_RATE * (*w - *t) + INNER_NOISE * normal(noise);
            s += f64::from(*w - *t).powi(2);
        }
        if self.target.is_empty() { 0.0 } else { 0.5 * s / self.target.len() as f64 }
    }

    /// The `inner_steps` steps of one outer step from `w`; returns the loss after them.
    pub fn inner_steps(&self, w: &mut [f32], inner_steps: u64) -> f64 {
        let mut noise = self.noise(w);
        let mut loss = self.loss(w);
        for _ in 0..inner_steps {
            loss = self.step(w, &mut noise);
        }
        loss
    }

    /// `0.5 mean (w - t)^2` (0 over no weights).
    pub fn loss(&self, w: &[f32]) -> f64 {
        if self.target.is_empty() {
            return 0.0;
        }
        let s: f64 = w.iter().zip(&self.target).map(|(w, t)| f64::from(w - t).powi(2)).sum();
        0.5 * s / self.target.len() as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inner_steps_descend_towards_the_target() {
        let o = Objective::new(1, 0, 256);
        let mut w = initial_weights(1, 256);
        let before = o.loss(&w);
        let after = o.inner_steps(&mut w, 10);
        assert!(after < 0.7 * before, "{before} -> {after}");
        assert_eq!(after, o.loss(&w), "the loss returned is the loss after the steps");
    }

    #[test]
    fn steps_one_at_a_time_equal_an_outer_steps_worth() {
        let o = Objective::new(7, 3, 100);
        let start = initial_weights(7, 100);
        let mut a = start.clone();
        let la = o.inner_steps(&mut a, 5);
        let mut b = start.clone();
        let mut noise = o.noise(&b);
        let mut lb = 0.0;
        for _ in 0..5 {
            lb = o.step(&mut b, &mut noise);
        }
        assert_eq!(weights_digest(&a), weights_digest(&b));
        assert_eq!(la.to_bits(), lb.to_bits());
    }

    #[test]
    fn the_noise_depends_on_the_seed_the_node_and_the_start() {
        let w = initial_weights(7, 64);
        let draw = |o: &Objective, w: &[f32]| -> u64 { o.noise(w).random() };
        let o = Objective::new(7, 3, 64);
        assert_eq!(draw(&o, &w), draw(&Objective::new(7, 3, 64), &w));
        assert_ne!(draw(&o, &w), draw(&Objective::new(7, 4, 64), &w));
        assert_ne!(draw(&o, &w), draw(&Objective::new(8, 3, 64), &w));
        let mut moved = w.clone();
        moved[63] = f32::from_bits(moved[63].to_bits() ^ 1);
        assert_ne!(draw(&o, &w), draw(&o, &moved));
        // Targets: a shared centre plus a node's own offset.
        assert_ne!(target(7, 3, 8), target(7, 4, 8));
        assert_eq!(initial_weights(7, 8), initial_weights(7, 8));
    }
}
