//! The simulator's one clock adapter: turmoil's simulated time as a [`Time`].
//!
//! Every host of a turmoil simulation runs its own paused tokio runtime, whose `Instant`s are not
//! comparable between hosts; [`turmoil::sim_elapsed`] is the simulation's shared clock, exact
//! within a tick. The event executor sets the time of the event it is handling instead
//! ([`EventTime`]). Nothing in the simulator reads `std::time`.

use loco_core::Time;
use std::cell::Cell;
use std::time::Duration;

thread_local! {
    /// The time of the event the event executor is handling (`None` under turmoil).
    static EVENT_NOW: Cell<Option<Time>> = const { Cell::new(None) };
}

/// Simulated time since the start of the run, from inside a host (zero outside a simulation).
pub fn now() -> Time {
    EVENT_NOW
        .with(Cell::get)
        .unwrap_or_else(|| from_duration(turmoil::sim_elapsed().unwrap_or_default()))
}

/// The event executor's clock on this thread while it lives: [`now`] reads what it was last
/// [`set`](EventTime::set) to.
pub(crate) struct EventTime(());

impl EventTime {
    /// Starts the event clock at zero.
    pub(crate) fn start() -> EventTime {
        EVENT_NOW.with(|c| c.set(Some(Time::ZERO)));
        EventTime(())
    }

    /// Moves the clock to `t`.
    pub(crate) fn set(&self, t: Time) {
        EVENT_NOW.with(|c| c.set(Some(t)));
    }
}

impl Drop for EventTime {
    fn drop(&mut self) {
        EVENT_NOW.with(|c| c.set(None));
    }
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
