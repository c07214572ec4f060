//! The simulator's one clock adapter: turmoil's simulated time as a [`Time`].
//!
//! Every host of a turmoil simulation runs its own paused tokio runtime, whose `Instant`s are not
//! comparable between hosts; [`turmoil::sim_elapsed`] is the simulation's shared clock, exact
//! within a tick. Nothing in the simulator reads `std::time`.

use loco_core::Time;
use std::time::Duration;

/// Simulated time since the start of the run, from inside a host (zero outside a simulation).
pub fn now() -> Time {
    from_duration(turmoil::sim_elapsed().unwrap_or_default())
}

/// A duration since the start of the run as a [`Time`].
pub fn from_duration(d: Duration) -> Time {
    Time::from_nanos(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// Sleeps (in simulated time) until `t`; returns at once when `t` has passed. `Time::MAX`
/// never returns.
pub async fn sleep_until(t: Time) {
    if t == Time::MAX {
        std::future::pending::<()>().await;
    }
    let d = t.saturating_since(now());
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}
