//! The distribution of the simulator's error over a draw of random scenarios (`loco fidelity
//! --random`): per figure the median, 90th percentile and largest absolute error, the share of
//! identical membership stories, and the worst scenarios.

use crate::fidelity::Fidelity;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// One scenario of a draw: its comparison, or why there is none (a run that failed).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Outcome {
    /// Its index in the draw.
    pub index: u64,
    /// The scenario's name.
    pub name: String,
    /// The comparison, when both runs finished.
    pub fidelity: Option<Fidelity>,
    /// Why a run failed, or an invariant that broke.
    pub failure: Option<String>,
}

/// The distribution of one figure's absolute relative error, in percent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    /// The median.
    pub median: f64,
    /// The 90th percentile (nearest rank).
    pub p90: f64,
    /// The largest.
    pub max: f64,
}

impl Spread {
    /// Of these errors (percent); zeros when there are none. A NaN (no reference figure)
    /// counts as the largest.
    pub fn of(mut v: Vec<f64>) -> Spread {
        if v.is_empty() {
            return Spread::default();
        }
        for x in &mut v {
            if x.is_nan() {
                *x = f64::INFINITY;
            }
        }
        v.sort_by(f64::total_cmp);
        let rank = |q: f64| v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        let median = if v.len() % 2 == 1 {
            v[v.len() / 2]
        } else {
            0.5 * (v[v.len() / 2 - 1] + v[v.len() / 2])
        };
        Spread { median, p90: rank(0.9), max: v[v.len() - 1] }
    }
}

/// A draw's summary.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DrawSummary {
    /// The draw's seed.
    pub seed: u64,
    /// Scenarios drawn.
    pub scenarios: usize,
    /// Scenarios whose both runs finished.
    pub compared: usize,
    /// The median all-reduce's error.
    pub allreduce_median: Spread,
    /// The mean outer step's error.
    pub outer_step_mean: Spread,
    /// The utilisation's error.
    pub utilisation: Spread,
    /// The bytes' error.
    pub bytes: Spread,
    /// Compared scenarios whose membership stories are identical.
    pub same_story: usize,
    /// Every scenario.
    pub outcomes: Vec<Outcome>,
}

impl DrawSummary {
    /// The summary of `outcomes`, drawn with `seed`.
    pub fn new(seed: u64, outcomes: Vec<Outcome>) -> DrawSummary {
        let done: Vec<&Fidelity> = outcomes.iter().filter_map(|o| o.fidelity.as_ref()).collect();
        let spread = |f: fn(&Fidelity) -> f64| {
            Spread::of(done.iter().map(|x| (f(x) * 100.0).abs()).collect())
        };
        DrawSummary {
            seed,
            scenarios: outcomes.len(),
            compared: done.len(),
            allreduce_median: spread(|f| f.allreduce_median.relative),
            outer_step_mean: spread(|f| f.outer_step_mean.relative),
            utilisation: spread(|f| f.utilisation.relative),
            bytes: spread(|f| f.bytes.relative),
            same_story: done.iter().filter(|f| f.story_differences.is_empty()).count(),
            outcomes,
        }
    }

    /// Whether every scenario was compared, its runs kept their invariants, and its three
    /// timing figures are within `tol`.
    pub fn within(&self, tol: f64) -> bool {
        self.outcomes.iter().all(|o| {
            o.failure.is_none()
                && o.fidelity.as_ref().is_some_and(|f| {
                    f.allreduce_median.within(tol)
                        && f.outer_step_mean.within(tol)
                        && f.utilisation.within(tol)
                })
        })
    }

    /// The largest absolute timing error of a scenario (percent), for ranking.
    fn worst_of(o: &Outcome) -> f64 {
        match (&o.fidelity, &o.failure) {
            (Some(f), None) => [f.allreduce_median, f.outer_step_mean, f.utilisation]
                .iter()
                .map(|e| if e.relative.is_nan() { f64::INFINITY } else { e.relative.abs() * 100.0 })
                .fold(0.0, f64::max),
            _ => f64::INFINITY,
        }
    }

    /// What a terminal shows: the table of spreads, the stories, the `worst` worst scenarios.
    pub fn text(&self, worst: usize) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "draw {}: {} scenarios, {} compared (loco fidelity --random {} --seed {})",
            self.seed, self.scenarios, self.compared, self.scenarios, self.seed
        );
        let _ = writeln!(s, "{:<22} {:>8} {:>8} {:>8}", "error (absolute)", "median", "p90", "max");
        for (name, sp) in [
            ("median all-reduce", self.allreduce_median),
            ("mean outer step", self.outer_step_mean),
            ("utilisation", self.utilisation),
            ("bytes sent", self.bytes),
        ] {
            let _ = writeln!(s, "{name:<22} {:>7.2}% {:>7.2}% {:>7.2}%", sp.median, sp.p90, sp.max);
        }
        let share = if self.compared == 0 {
            0.0
        } else {
            100.0 * self.same_story as f64 / self.compared as f64
        };
        let _ = writeln!(
            s,
            "membership stories     {} of {} identical ({share:.0}%)",
            self.same_story, self.compared
        );
        let mut ranked: Vec<&Outcome> = self.outcomes.iter().collect();
        ranked.sort_by(|a, b| Self::worst_of(b).total_cmp(&Self::worst_of(a)));
        let _ = writeln!(s, "worst scenarios:");
        for o in ranked.into_iter().take(worst) {
            match (&o.fidelity, &o.failure) {
                (Some(f), None) => {
                    let _ = writeln!(
                        s,
                        "  {:>3} {:<24} all-reduce {:>+6.1}%  outer step {:>+6.1}%  utilisation {:>+6.1}%  story {}",
                        o.index,
                        o.name,
                        f.allreduce_median.relative * 100.0,
                        f.outer_step_mean.relative * 100.0,
                        f.utilisation.relative * 100.0,
                        if f.story_differences.is_empty() { "the same" } else { "differs" }
                    );
                }
                (_, failure) => {
                    let _ = writeln!(
                        s,
                        "  {:>3} {:<24} failed: {}",
                        o.index,
                        o.name,
                        failure.as_deref().unwrap_or("no comparison")
                    );
                }
            }
        }
        s
    }

    /// `draw.csv`: one row per scenario.
    pub fn csv(&self) -> String {
        let mut s = String::from(
            "index,name,allreduce_error,outer_step_error,utilisation_error,bytes_error,same_story,failure\n",
        );
        for o in &self.outcomes {
            let (a, b, c, d, story) = match &o.fidelity {
                Some(f) => (
                    format!("{:.6}", f.allreduce_median.relative),
                    format!("{:.6}", f.outer_step_mean.relative),
                    format!("{:.6}", f.utilisation.relative),
                    format!("{:.6}", f.bytes.relative),
                    f.story_differences.is_empty().to_string(),
                ),
                None => Default::default(),
            };
            let failure = o.failure.as_deref().unwrap_or("").replace([',', '\n'], ";");
            let _ = writeln!(s, "{},{},{a},{b},{c},{d},{story},{failure}", o.index, o.name);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spreads_take_the_median_the_nearest_rank_p90_and_the_max() {
        let sp = Spread::of((1..=10).map(f64::from).collect());
        assert_eq!(sp, Spread { median: 5.5, p90: 9.0, max: 10.0 });
        let sp = Spread::of(vec![3.0, 1.0, 2.0]);
        assert_eq!(sp, Spread { median: 2.0, p90: 3.0, max: 3.0 });
        assert_eq!(Spread::of(vec![1.0, f64::NAN]).max, f64::INFINITY);
        assert_eq!(Spread::of(Vec::new()), Spread::default());
    }
}
