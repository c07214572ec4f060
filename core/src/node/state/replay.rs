//! The replay log: the averaged pseudo-gradients a non-blocking joiner committed while its state
//! was on the way, replayed onto the (older) state it receives.

use super::wire::StateError;
use crate::diloco::OuterState;
use std::collections::VecDeque;

/// Outer steps a [`ReplayLog`] keeps by default.
pub const DEFAULT_REPLAY_STEPS: usize = 64;

/// Averaged pseudo-gradients committed since admission, `(outer_step, Some(average))`, or
/// `(outer_step, None)` for a skipped step; bounded, the oldest dropped first. Entry `k` is the
/// result of outer step `k`, applied to a state whose [`steps`](OuterState::steps) is `k`.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplayLog {
    cap: usize,
    entries: VecDeque<(u64, Option<Average>)>,
}

/// A step's average: `(None, average)` of every value, `(Some(at), average)` of a fragment
/// from `at` on.
type Average = (Option<usize>, Vec<f32>);

impl Default for ReplayLog {
    fn default() -> Self {
        ReplayLog::new(DEFAULT_REPLAY_STEPS)
    }
}

impl ReplayLog {
    /// A log that keeps the last `cap` steps (at least 1).
    pub fn new(cap: usize) -> ReplayLog {
        ReplayLog { cap: cap.max(1), entries: VecDeque::new() }
    }

    /// Records the result of `outer_step` (`None`: skipped). Steps are kept in increasing
    /// order: entries at or after `outer_step` (a step recorded again) are replaced.
    pub fn push(&mut self, outer_step: u64, average: Option<Vec<f32>>) {
        self.record(outer_step, average.map(|a| (None, a)));
    }

    /// [`push`](Self::push) for a step that averaged only the values from `offset` on (a
    /// fragment of streaming DiLoCo, as long as `average`).
    pub fn push_fragment(&mut self, outer_step: u64, offset: usize, average: Option<Vec<f32>>) {
        self.record(outer_step, average.map(|a| (Some(offset), a)));
    }

    fn record(&mut self, outer_step: u64, average: Option<Average>) {
        while self.entries.back().is_some_and(|(s, _)| *s >= outer_step) {
            self.entries.pop_back();
        }
        self.entries.push_back((outer_step, average));
        while self.entries.len() > self.cap {
            self.entries.pop_front();
        }
    }

    /// Forgets every entry.
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The oldest and newest steps held.
    pub fn span(&self) -> Option<(u64, u64)> {
        Some((self.entries.front()?.0, self.entries.back()?.0))
    }

    /// Applies, in order, every entry at or after `outer.steps()`: the average is copied into
    /// the pseudo-gradient buffer and applied ([`OuterState::apply_outer_step`]), or the step is
    /// skipped. Returns how many were applied. Checks everything first: on an error (the first
    /// step needed is missing, a gap further on, a length that is not the state's) `outer` is
    /// unchanged. Overwrites the pseudo-gradient buffer when it applies anything.
    pub fn replay_onto(&self, outer: &mut OuterState) -> Result<usize, StateError> {
        let start = outer.steps();
        let todo: Vec<&(u64, Option<Average>)> =
            self.entries.iter().filter(|(s, _)| *s >= start).collect();
        for (expect, (step, g)) in (start..).zip(&todo) {
            if *step != expect {
                return Err(StateError::Gap { need: expect, next: *step });
            }
            if let Some((at, g)) = g {
                let fits = match at {
                    None => g.len() == outer.len(),
                    Some(at) => at.checked_add(g.len()).is_some_and(|end| end <= outer.len()),
                };
                if !fits {
                    return Err(StateError::ReplayLength {
                        step: *step,
                        expected: outer.len(),
                        got: g.len(),
                    });
                }
            }
        }
        for (_, g) in &todo {
            match g {
                Some((None, g)) => {
                    outer.pseudo_gradient_mut().copy_from_slice(g);
                    outer.apply_outer_step();
                }
                Some((Some(at), g)) => {
                    let range = *at..*at + g.len();
                    outer.apply_outer_step_to(range, g).map_err(|_| StateError::ReplayLength {
                        step: outer.steps(),
                        expected: outer.len(),
                        got: at + g.len(),
                    })?;
                }
                None => outer.skip_outer_step(),
            }
        }
        Ok(todo.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diloco::OuterConfig;

    fn state(steps: u64) -> OuterState {
        OuterState::restore(OuterConfig::default(), vec![1.0, 2.0], vec![0.0; 2], vec![], steps)
            .unwrap()
    }

    #[test]
    fn replays_three_steps_with_a_skip_as_the_mesh_applied_them() {
        let mut log = ReplayLog::default();
        log.push(3, Some(vec![9.0, 9.0])); // before the state: not applied
        log.push(4, Some(vec![0.5, -0.5]));
        log.push(5, None);
        log.push(6, Some(vec![0.25, 0.0]));
        // The mesh's path: the same three steps applied live.
        let mut live = state(4);
        live.pseudo_gradient_mut().copy_from_slice(&[0.5, -0.5]);
        live.apply_outer_step();
        live.skip_outer_step();
        live.pseudo_gradient_mut().copy_from_slice(&[0.25, 0.0]);
        live.apply_outer_step();
        let mut late = state(4);
        assert_eq!(log.replay_onto(&mut late), Ok(3));
        assert_eq!(late.steps(), 7);
        assert_eq!(late.outer(), live.outer());
        assert_eq!(late.momentum(), live.momentum());
        // A state newer than the whole log: nothing to do.
        let mut new = state(9);
        assert_eq!(log.replay_onto(&mut new), Ok(0));
        assert_eq!(new, state(9));
    }

    #[test]
    fn a_gap_or_a_wrong_length_is_reported_and_changes_nothing() {
        let mut log = ReplayLog::new(2);
        log.push(4, Some(vec![0.5, -0.5]));
        log.push(5, None);
        log.push(6, None); // 4 is dropped: the log keeps two
        assert_eq!(log.span(), Some((5, 6)));
        let mut s = state(4);
        assert_eq!(log.replay_onto(&mut s), Err(StateError::Gap { need: 4, next: 5 }));
        assert_eq!(s, state(4));
        let mut log = ReplayLog::default();
        log.push(4, None);
        log.push(6, None);
        let mut s = state(4);
        assert_eq!(log.replay_onto(&mut s), Err(StateError::Gap { need: 5, next: 6 }));
        assert_eq!(s, state(4));
        log.clear();
        log.push(4, None);
        log.push(5, Some(vec![1.0]));
        assert_eq!(
            log.replay_onto(&mut s),
            Err(StateError::ReplayLength { step: 5, expected: 2, got: 1 })
        );
        assert_eq!(s, state(4));
        // A step recorded again replaces it and what followed.
        log.push(5, Some(vec![1.0, 1.0]));
        log.push(5, None);
        assert_eq!(log.len(), 2);
        assert_eq!(log.replay_onto(&mut s), Ok(2));
    }
}
