//! The metrics schema both backends write, and the pure functions that summarise it.
//!
//! A run directory holds three files written from these types (the reports crate writes them
//! atomically and draws the report from them):
//!
//! - `outer_steps.csv`: one [`OuterStepRow`] per (outer step, node), columns
//!   [`OUTER_STEPS_COLUMNS`]; see [`outer_steps_csv`] and [`parse_outer_steps_csv`].
//! - `events.csv`: one [`EventRow`] per membership or fault event, columns [`EVENTS_COLUMNS`];
//!   see [`events_csv`] and [`parse_events_csv`].
//! - `summary.json`: the [`Summary`] from [`summarize`], written with `serde_json` (pretty; keys
//!   in struct order, maps sorted).
//!
//! The run's invariants are checked by one [`InvariantChecker`], fed by either backend.
//!
//! Utilisation has two definitions, both in [`Utilization`]: loco's (compute / wall time) and
//! INTELLECT-1 Table 2's (compute / (compute + all-reduce)). [`published_table2`] holds the
//! published figures to compare with.
//!
//! ```
//! use loco_core::metrics::*;
//!
//! let row = OuterStepRow {
//!     outer_step: 0, node: "a".into(), node_id: 0, epoch: 1, world: 1,
//!     start_s: 0.0, end_s: 10.0, compute_s: 8.0, allreduce_s: 2.0, barrier_s: 0.0,
//!     recovery_s: 0.0, checkpoint_s: 0.0, outer_s: 0.0, idle_s: 0.0, bytes_sent: 100, retries: 0,
//!     tokens: 0, loss: Some(2.5), weights_hash: None, weight: 1.0, allreduce_wall_s: 0.0,
//!     eval_loss: Some(2.7),
//! };
//! let csv = outer_steps_csv(std::slice::from_ref(&row));
//! assert_eq!(parse_outer_steps_csv(&csv).unwrap(), vec![row.clone()]);
//! let s = summarize(&RunMeta::default(), &[row], &[]);
//! assert_eq!(s.utilization.mean, 0.8);
//! ```

mod csv_format;
mod invariants;
mod published;
mod schema;
mod summary;

pub use csv_format::{
    EVENTS_COLUMNS, OUTER_STEPS_COLUMNS, events_csv, format_f64, outer_steps_csv, parse_events_csv,
    parse_outer_steps_csv, sort_events, sort_outer_steps,
};
pub use invariants::{InvariantChecker, MAX_VIOLATIONS};
pub use published::{PublishedRow, published_row, published_table2};
pub use schema::{EventKind, EventRow, OuterStepRow, UnknownEventKind};
pub use summary::{
    ActivePoint, AllreduceStats, BREAKDOWN_NAMES, DilocoFacts, Invariants, Membership, MfuBasis,
    NodeTotals, RunMeta, StepTotals, Summary, Utilization, active_nodes, allreduce_samples,
    allreduce_stats, breakdown, flops_per_token, membership, node_totals, percentile, step_totals,
    summarize,
};

/// A metrics file that cannot be read. Lines are 1-based; the caller adds the file's name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MetricsError {
    /// The text is empty: not even a header line.
    #[error("missing header line (expected `{expected}`)")]
    MissingHeader {
        /// The header expected.
        expected: String,
    },
    /// The header line is not the expected one.
    #[error("line {line}: expected header `{expected}`, found `{found}`")]
    Header {
        /// Line of the header.
        line: u64,
        /// The header expected.
        expected: String,
        /// The header found.
        found: String,
    },
    /// A record has too many or too few fields.
    #[error("line {line}: expected {expected} fields, found {found}")]
    FieldCount {
        /// Line where the record starts.
        line: u64,
        /// Fields expected.
        expected: usize,
        /// Fields found.
        found: usize,
    },
    /// A field does not hold what its column needs.
    #[error("line {line}: field `{field}`: expected {expected}, found `{found}`")]
    Field {
        /// Line where the record starts.
        line: u64,
        /// The column's name.
        field: &'static str,
        /// What the column needs.
        expected: &'static str,
        /// The text found.
        found: String,
    },
    /// The text is not CSV (an unterminated quote, invalid UTF-8).
    #[error("line {line}: {message}")]
    Syntax {
        /// Line where the problem was found (0 when unknown).
        line: u64,
        /// The CSV reader's message.
        message: String,
    },
}

impl MetricsError {
    /// The line the error is on, when it has one.
    pub fn line(&self) -> Option<u64> {
        match self {
            MetricsError::MissingHeader { .. } => None,
            MetricsError::Header { line, .. }
            | MetricsError::FieldCount { line, .. }
            | MetricsError::Field { line, .. }
            | MetricsError::Syntax { line, .. } => Some(*line),
        }
    }
}

#[cfg(test)]
mod tests;
