//! The reports crate's one error type.

use loco_core::metrics::MetricsError;
use std::path::PathBuf;

/// A report that could not be read or written. Every variant names the file concerned.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// No run directory was given.
    #[error("no run directory given")]
    NoRuns,
    /// A file or directory could not be read, written or renamed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// `outer_steps.csv` or `events.csv` does not hold what it should; the message names the line
    /// and the field.
    #[error("{}: {source}", file.display())]
    Csv {
        /// The file.
        file: PathBuf,
        /// The problem, with its line and field.
        #[source]
        source: MetricsError,
    },
    /// `summary.json` is not a summary.
    #[error("{}: line {line}, column {column}: {message}", file.display())]
    Json {
        /// The file.
        file: PathBuf,
        /// 1-based line of the problem (0 when unknown).
        line: usize,
        /// 1-based column of the problem (0 when unknown).
        column: usize,
        /// serde_json's message, which names the field when one is missing or mistyped.
        message: String,
    },
    /// A plot could not be drawn.
    #[error("plot {plot}: {message}")]
    Plot {
        /// The plot's file stem.
        plot: &'static str,
        /// What plotters said.
        message: String,
    },
    /// A plot's PNG could not be encoded.
    #[error("plot {plot}: png encoding: {message}")]
    Png {
        /// The plot's file stem.
        plot: &'static str,
        /// What the encoder said.
        message: String,
    },
    /// The bundled font could not be loaded (a broken build).
    #[error("the bundled font (reports/assets/DejaVuSans.ttf) could not be loaded")]
    Font,
}

impl ReportError {
    /// The line of the input file at fault, for CSV and JSON errors that know it.
    pub fn line(&self) -> Option<u64> {
        match self {
            ReportError::Csv { source, .. } => source.line(),
            ReportError::Json { line, .. } if *line > 0 => Some(*line as u64),
            _ => None,
        }
    }

    /// The file concerned, when there is one.
    pub fn file(&self) -> Option<&std::path::Path> {
        match self {
            ReportError::Io { path, .. } => Some(path),
            ReportError::Csv { file, .. } | ReportError::Json { file, .. } => Some(file),
            _ => None,
        }
    }
}
