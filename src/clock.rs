//! The CLI's one wall clock, for benchmarks and progress: never on the simulated path.

/// Now, on the process's monotonic clock.
#[allow(clippy::disallowed_methods)] // benchmarks and progress measure wall time
pub(crate) fn now() -> std::time::Instant {
    std::time::Instant::now()
}
