//! Injected time. The core never reads a clock: every time-dependent call takes a [`Time`], which
//! each backend derives from its own clock (turmoil's simulated time, or tokio's monotonic clock).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::ops::{Add, AddAssign, Sub};
use std::time::Duration;

/// A point in time: nanoseconds since the start of the run, on the local monotonic clock of the
/// process that holds it. Never sent to another process (no remote clocks are compared).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Time(u64);

impl Time {
    /// The start of the run.
    pub const ZERO: Time = Time(0);
    /// A time later than every other; for "no deadline".
    pub const MAX: Time = Time(u64::MAX);

    /// From nanoseconds since the start of the run.
    pub const fn from_nanos(ns: u64) -> Time {
        Time(ns)
    }

    /// From (possibly fractional) seconds since the start of the run; negative values clamp to 0.
    pub fn from_secs_f64(s: f64) -> Time {
        Time((s.max(0.0) * 1e9).round() as u64)
    }

    /// Nanoseconds since the start of the run.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Seconds since the start of the run.
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 * 1e-9
    }

    /// The time elapsed since `earlier`, or zero when `earlier` is later.
    pub fn saturating_since(self, earlier: Time) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Time {
    type Output = Time;
    fn add(self, d: Duration) -> Time {
        Time(self.0.saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)))
    }
}

impl AddAssign<Duration> for Time {
    fn add_assign(&mut self, d: Duration) {
        *self = *self + d;
    }
}

impl Sub<Time> for Time {
    type Output = Duration;
    /// Saturating: a later `rhs` gives zero.
    fn sub(self, rhs: Time) -> Duration {
        self.saturating_since(rhs)
    }
}

impl fmt::Display for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.3}s", self.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates() {
        let t = Time::from_secs_f64(1.5);
        assert_eq!(t.as_nanos(), 1_500_000_000);
        assert_eq!(t + Duration::from_millis(500), Time::from_nanos(2_000_000_000));
        assert_eq!(Time::ZERO - t, Duration::ZERO);
        assert_eq!(Time::MAX + Duration::from_secs(1), Time::MAX);
        assert_eq!(Time::from_secs_f64(-3.0), Time::ZERO);
    }
}
