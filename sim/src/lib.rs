//! # loco-sim
//!
//! loco's deterministic simulator backend: the same core (mesh, ring all-reduce, DiLoCo) as the
//! real backend, on a simulated network of [turmoil] hosts, from the same scenario file.
//!
//! - **Hosts.** One host per node (the mesh member, compute, the shard rings, DiLoCo) and one for
//!   the mesh coordinator, driven by one of two executors (`exec.rs`): turmoil, which provides
//!   simulated time, latency, partitions, crashes and restarts and polls every host at every
//!   tick; or the event executor (`events.rs`), which jumps from one event to the next (the
//!   default above 32 nodes; `[sim] executor`). Both seed their randomness from the run's seed.
//!   Above 128 nodes the event executor models each ring all-reduce whole (`ring_model.rs`,
//!   `[sim] collectives`) instead of moving its 2(N-1) frames per node.
//! - **Bandwidth** ([`bandwidth`]), which turmoil lacks: a fluid model in which every frame body
//!   is a flow over the sender's egress NIC, the directed node pair (`streams` connections of
//!   `bandwidth`) and the receiver's ingress NIC, rates shared max-min fairly. The transport
//!   ([`net`]) charges each frame's length to it before the header goes through turmoil. Virtual
//!   bodies (sizes only) are charged by their length, so a 10B all-reduce costs no memory.
//! - **Links over time** ([`links`]): fixed, traced or uniformly drawn per node pair and outer
//!   step, degraded and restored by churn.
//! - **Compute** ([`numerics`]): inner steps take the node's step time with seeded jitter; with
//!   `numerics = "real"` small vectors follow a synthetic objective, so DiLoCo, the codecs,
//!   retries and live recovery are checked for bit-identical replicas.
//! - **Invariants** ([`record`]) checked as it runs: no deadlock, members agree on each epoch,
//!   identical outer weights after each step, no contribution lost or counted twice.
//!
//! Determinism: every random draw comes from a ChaCha stream of (seed, subject, purpose)
//! ([`rng`]); hosts, maps and outputs are ordered; the simulated path never reads a clock. The
//! same scenario and seed give byte-identical `summary.json`, `outer_steps.csv` and `events.csv`
//! (the summary's `wall_seconds` is left 0 for the caller to fill).
//!
//! ```no_run
//! use loco_core::scenario::Scenario;
//! let s = Scenario::load("scenarios/small.toml").unwrap();
//! let out = loco_sim::replay(&s, loco_sim::ReplayOptions::default()).unwrap();
//! assert!(out.summary.invariants.ok);
//! ```

#![warn(missing_docs)]

use loco_core::metrics::{EventRow, OuterStepRow, Summary};
use loco_core::scenario::Scenario;
use std::fmt;
use std::time::Duration;

pub mod bandwidth;
pub mod clock;
mod coord;
mod ctx;
mod driver;
mod events;
mod exec;
pub mod net;
mod node;
pub mod numerics;

pub use node::executor_side;
pub mod record;
mod ring_model;

/// Where a replay stands, for a progress bar.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Progress {
    /// Simulated seconds since the start of the run.
    pub simulated_seconds: f64,
    /// Outer steps committed (or skipped) so far.
    pub outer_steps: u64,
    /// Outer steps at which the run stops, if it stops on a count.
    pub target_outer_steps: Option<u64>,
    /// Simulated seconds at which the run stops, if it stops on a time.
    pub target_seconds: Option<f64>,
}

/// How to run a replay. `Default` runs the scenario as written.
#[derive(Default)]
pub struct ReplayOptions {
    /// Overrides the scenario's seed (`--seed`).
    pub seed: Option<u64>,
    /// Stops after at most this many outer steps (shortens long scenarios in tests).
    pub max_outer_steps: Option<u64>,
    /// Stops after at most this much simulated time (tests).
    pub max_time: Option<Duration>,
    /// Runs for exactly this much simulated time, ignoring the scenario's `[stop]` (benchmarks).
    pub run_for: Option<Duration>,
    /// Called as the run advances (every outer step and every 2000 ticks).
    pub progress: Option<Box<dyn FnMut(Progress)>>,
    /// The parameters a commit's O(model) work is charged for (`[sim] outer_cost` each), instead
    /// of the model's: `loco fidelity` sets `[sim] elements`, the size of the synthetic objective
    /// the real run trains.
    pub outer_params: Option<u64>,
    /// Runs on this executor instead of the scenario's (`loco replay --executor`).
    pub executor: Option<loco_core::scenario::ExecutorKind>,
}

impl fmt::Debug for ReplayOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplayOptions")
            .field("seed", &self.seed)
            .field("max_outer_steps", &self.max_outer_steps)
            .field("max_time", &self.max_time)
            .field("run_for", &self.run_for)
            .field("progress", &self.progress.is_some())
            .field("outer_params", &self.outer_params)
            .field("executor", &self.executor)
            .finish()
    }
}

/// What a replay produced: the summary and the rows and events behind it, sorted as the files
/// are written.
#[derive(Clone, Debug, PartialEq)]
pub struct RunOutput {
    /// `summary.json` (with `wall_seconds` 0: the caller fills it from its own clock).
    pub summary: Summary,
    /// `outer_steps.csv`, one row per (outer step, node).
    pub rows: Vec<OuterStepRow>,
    /// `events.csv`.
    pub events: Vec<EventRow>,
    /// The executor that ran it.
    pub executor: loco_core::scenario::ExecutorKind,
}

/// Why a replay could not run. Broken invariants are not errors: they are reported in
/// [`Summary::invariants`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    /// The scenario cannot be simulated as given.
    #[error("scenario: {0}")]
    Scenario(String),
    /// A simulated host's software failed (a bug in the simulator or the core).
    #[error("simulated host failed: {0}")]
    Host(String),
}

/// Replays `scenario` in the simulator. See the crate documentation.
pub fn replay(scenario: &Scenario, opts: ReplayOptions) -> Result<RunOutput, SimError> {
    driver::replay(scenario, opts)
}

/// The figures of `loco bench sim`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct BenchFigures {
    /// The scenario's name.
    pub scenario: String,
    /// Simulated seconds replayed.
    pub simulated_seconds: f64,
    /// Host wall-clock seconds it took.
    pub wall_seconds: f64,
    /// Simulated seconds per wall second.
    pub simulated_per_wall_second: f64,
    /// Outer steps completed.
    pub outer_steps: u64,
    /// Nodes the scenario declares.
    pub nodes: usize,
    /// The executor that ran it.
    pub executor: loco_core::scenario::ExecutorKind,
    /// Events the event executor handled (0 under turmoil).
    pub events: u64,
    /// How the all-reduces ran: `frames`, or `modelled` whole (the event executor only).
    pub collectives: String,
    /// Frames the hosts handed to the network.
    pub frames: u64,
    /// turmoil ticks stepped.
    pub ticks: u64,
    /// The tick, seconds.
    pub tick_seconds: f64,
    /// Peak resident memory of this process (`VmHWM`), bytes, where the OS tells it.
    pub peak_rss_bytes: Option<u64>,
    /// Whether the run's invariants held.
    pub invariants_ok: bool,
}

/// Replays `scenario` for `simulated_hours` (ignoring its `[stop]`; earlier only if every node
/// stops) and measures how fast: simulated seconds per wall second and the peak resident memory.
pub fn bench(scenario: &Scenario, simulated_hours: f64) -> Result<BenchFigures, SimError> {
    let opts = ReplayOptions {
        run_for: Some(Duration::from_secs_f64(simulated_hours.max(0.0) * 3600.0)),
        ..ReplayOptions::default()
    };
    // The benchmark's one clock read: wall time is what it measures, and it never reaches the
    // simulation.
    #[allow(clippy::disallowed_methods)]
    let t0 = std::time::Instant::now();
    let out = replay(scenario, opts)?;
    let wall = t0.elapsed().as_secs_f64();
    let sim = out.summary.simulated_seconds;
    let extra_u64 =
        |k: &str| out.summary.extra.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
    Ok(BenchFigures {
        scenario: out.summary.scenario.clone(),
        simulated_seconds: sim,
        wall_seconds: wall,
        simulated_per_wall_second: if wall > 0.0 { sim / wall } else { 0.0 },
        outer_steps: out.summary.outer_steps,
        nodes: scenario.nodes().len(),
        executor: out.executor,
        events: extra_u64("events"),
        collectives: out
            .summary
            .extra
            .get("collectives")
            .and_then(serde_json::Value::as_str)
            .unwrap_or("frames")
            .to_owned(),
        frames: extra_u64("frames_sent"),
        ticks: extra_u64("ticks"),
        tick_seconds: out
            .summary
            .extra
            .get("tick_seconds")
            .and_then(serde_json::Value::as_f64)
            .unwrap_or(0.0),
        peak_rss_bytes: peak_rss_bytes(),
        invariants_ok: out.summary.invariants.ok,
    })
}

/// This process's peak resident memory (`VmHWM` of `/proc/self/status`), in bytes; `None` where
/// the OS does not tell it.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
