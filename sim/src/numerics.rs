//! Simulated compute: how long a node's inner steps take, and, with real numerics, what they do.
//!
//! **Time.** One inner step of node `n` takes `step_time x (1 + step_jitter x u)`, `u` uniform in
//! `[-1, 1]`, drawn from the stream of (seed, node, [`Purpose::StepTime`]) keyed further by the
//! incarnation and the outer step, so a node's draws depend on nothing but its own history.
//!
//! **Real numerics.** Small vectors (`[sim] elements`) with the synthetic objective of
//! `loco_core::node::synthetic`, the one the real backend's `--synthetic-params` trains: node `n`
//! minimises `0.5 |w - t_n|^2` towards its own seeded target by `H` steps of noisy gradient
//! descent, the noise drawn from the stream of (seed, node, the step's start weights). The
//! pseudo-gradient is `outer - inner`, averaged by the ring all-reduce, and the outer Nesterov
//! step of `OuterState` moves the shared weights towards the mean target. That is enough to check
//! that DiLoCo, the codecs, retries and live recovery keep every replica bit-identical under
//! churn, and, on the same membership story, that both backends compute the same weights.
//!
//! **State.** What a joiner receives is `loco_core::node::state`'s, as with the real backend
//! (see the node's recovery module).

use loco_core::diloco::OuterConfig;
use loco_core::node::synthetic::Objective;
use loco_core::scenario::Scenario;

pub use loco_core::node::synthetic::{
    INNER_NOISE, INNER_RATE, StepDraw, TARGET_SPREAD, initial_weights, target,
};

/// A node's synthetic model: its objective (`loco_core::node::synthetic`, the one the real
/// backend's `--synthetic-params` trains) and its inner weights.
#[derive(Clone, Debug)]
pub struct Synthetic {
    objective: Objective,
    /// The inner weights.
    pub inner: Vec<f32>,
}

impl Synthetic {
    /// The model of `node`, with inner weights `start`.
    pub fn new(seed: u64, node: u32, start: Vec<f32>) -> Self {
        Synthetic { objective: Objective::new(seed, node, start.len()), inner: start }
    }

    /// Runs the `inner_steps` of an outer step from the current inner weights; returns the loss
    /// `0.5 mean (w - t)^2` after them. The noise is the objective's for these start weights (as
    /// in the real backend): the incarnation and the outer step do not enter it, and are taken
    /// only for the caller's convenience.
    pub fn inner_steps(&mut self, _incarnation: u64, _outer_step: u64, inner_steps: u64) -> f64 {
        self.objective.inner_steps(&mut self.inner, inner_steps)
    }

    /// `0.5 mean (w - t)^2` at the inner weights.
    pub fn loss(&self) -> f64 {
        self.objective.loss(&self.inner)
    }
}

/// The outer optimiser settings of a scenario.
pub fn outer_config(s: &Scenario) -> OuterConfig {
    loco_core::node::config::outer_config(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn outer_step_compute(
        seed: u64,
        node: u32,
        incarnation: u64,
        outer_step: u64,
        inner_steps: u64,
        step_time: Duration,
        jitter: f64,
    ) -> Duration {
        StepDraw { seed, node, incarnation, outer_step, inner_steps, step_time, jitter }.total()
    }

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
