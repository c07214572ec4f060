//! A small fixed table of deadlines, indexed by a timer enum (quinn's `TimerTable`).

use crate::time::Time;

/// A timer kind: a small enum whose variants index a [`TimerTable`].
pub(crate) trait TimerKind: Copy + 'static {
    /// Number of variants.
    const COUNT: usize;
    /// Every variant, in index order.
    fn all() -> &'static [Self];
    /// Index of this variant, below `COUNT`.
    fn index(self) -> usize;
}

/// One optional deadline per timer kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TimerTable<T: TimerKind> {
    at: Vec<Option<Time>>,
    _kind: std::marker::PhantomData<T>,
}

impl<T: TimerKind> TimerTable<T> {
    pub(crate) fn new() -> Self {
        TimerTable { at: vec![None; T::COUNT], _kind: std::marker::PhantomData }
    }

    pub(crate) fn set(&mut self, t: T, at: Time) {
        self.at[t.index()] = Some(at);
    }

    pub(crate) fn set_opt(&mut self, t: T, at: Option<Time>) {
        self.at[t.index()] = at;
    }

    #[cfg(test)]
    pub(crate) fn stop(&mut self, t: T) {
        self.at[t.index()] = None;
    }

    pub(crate) fn get(&self, t: T) -> Option<Time> {
        self.at[t.index()]
    }

    /// The earliest deadline.
    pub(crate) fn next_timeout(&self) -> Option<Time> {
        self.at.iter().flatten().min().copied()
    }

    /// Stops every timer due at or before `now`.
    pub(crate) fn clear_expired(&mut self, now: Time) {
        for at in &mut self.at {
            if at.is_some_and(|t| t <= now) {
                *at = None;
            }
        }
    }

    /// The timers due at `now`, in index order.
    pub(crate) fn expired(&self, now: Time) -> Vec<T> {
        T::all().iter().copied().filter(|t| self.get(*t).is_some_and(|at| at <= now)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug, PartialEq)]
    enum K {
        A,
        B,
    }
    impl TimerKind for K {
        const COUNT: usize = 2;
        fn all() -> &'static [Self] {
            &[K::A, K::B]
        }
        fn index(self) -> usize {
            self as usize
        }
    }

    #[test]
    fn next_is_the_minimum_and_expired_is_in_order() {
        let mut t = TimerTable::<K>::new();
        assert_eq!(t.next_timeout(), None);
        t.set(K::B, Time::from_nanos(5));
        t.set(K::A, Time::from_nanos(9));
        assert_eq!(t.next_timeout(), Some(Time::from_nanos(5)));
        assert_eq!(t.expired(Time::from_nanos(4)), vec![]);
        assert_eq!(t.expired(Time::from_nanos(9)), vec![K::A, K::B]);
        t.stop(K::B);
        assert_eq!(t.next_timeout(), Some(Time::from_nanos(9)));
    }
}
