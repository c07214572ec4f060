//! Reading a run directory, and writing files atomically.

use crate::ReportError;
use loco_core::metrics::{
    EventRow, OuterStepRow, Summary, events_csv, outer_steps_csv, parse_events_csv,
    parse_outer_steps_csv,
};
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// `summary.json`.
pub const SUMMARY_JSON: &str = "summary.json";
/// `outer_steps.csv`.
pub const OUTER_STEPS_CSV: &str = "outer_steps.csv";
/// `events.csv`.
pub const EVENTS_CSV: &str = "events.csv";

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ReportError + '_ {
    move |source| ReportError::Io { path: path.to_path_buf(), source }
}

/// Writes `bytes` to `dir/name` atomically: into a temporary file in `dir`, flushed to disk,
/// then renamed over the target. A reader sees the old file or the new one, never a part.
pub(crate) fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<PathBuf, ReportError> {
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let result = (|| {
        let mut f = fs::File::create(&tmp).map_err(io_err(&tmp))?;
        f.write_all(bytes).map_err(io_err(&tmp))?;
        f.sync_all().map_err(io_err(&tmp))?;
        drop(f);
        fs::rename(&tmp, &path).map_err(io_err(&path))
    })();
    if result.is_err() {
        // Best effort: the error that matters is the one returned.
        let _ = fs::remove_file(&tmp);
    }
    result.map(|()| path)
}

/// Removes `dir/name` if it exists (a plot this run no longer has).
pub(crate) fn remove_stale(dir: &Path, name: &str) -> Result<(), ReportError> {
    let path = dir.join(name);
    match fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(ReportError::Io { path, source }),
    }
}

/// The contents of `summary.json` as written by [`crate::write_run`]: pretty, keys in struct
/// order, a final newline.
pub fn summary_json(summary: &Summary) -> String {
    // Serialising plain data with string keys cannot fail; fall back to an empty object anyway.
    let mut s = serde_json::to_string_pretty(summary).unwrap_or_else(|_| "{}".to_owned());
    s.push('\n');
    s
}

/// Writes the three metrics files of a run into `dir` (created if missing), each atomically.
pub(crate) fn write_metrics(
    dir: &Path,
    summary: &Summary,
    rows: &[OuterStepRow],
    events: &[EventRow],
) -> Result<(), ReportError> {
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    write_atomic(dir, OUTER_STEPS_CSV, outer_steps_csv(rows).as_bytes())?;
    write_atomic(dir, EVENTS_CSV, events_csv(events).as_bytes())?;
    // The summary last: its presence says the run's files are complete.
    write_atomic(dir, SUMMARY_JSON, summary_json(summary).as_bytes())?;
    Ok(())
}

/// One run, as read from its directory.
#[derive(Clone, Debug, PartialEq)]
pub struct Run {
    /// The directory it was read from.
    pub dir: PathBuf,
    /// `summary.json`.
    pub summary: Summary,
    /// `outer_steps.csv`, in file order.
    pub rows: Vec<OuterStepRow>,
    /// `events.csv`, in file order.
    pub events: Vec<EventRow>,
}

/// serde_json's message without its " at line L column C" suffix (the error carries those).
fn json_message(e: &serde_json::Error) -> String {
    let msg = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    msg.strip_suffix(&suffix).map_or_else(|| msg.clone(), str::to_owned)
}

fn read_text(path: &Path) -> Result<String, ReportError> {
    fs::read_to_string(path).map_err(io_err(path))
}

/// Reads `summary.json`, `outer_steps.csv` and `events.csv` from `dir`.
///
/// # Errors
/// [`ReportError::Io`] for a missing or unreadable file, [`ReportError::Json`] and
/// [`ReportError::Csv`] (file, line, field) for contents that do not parse.
pub fn read_run(dir: &Path) -> Result<Run, ReportError> {
    let summary_path = dir.join(SUMMARY_JSON);
    let summary: Summary =
        serde_json::from_str(&read_text(&summary_path)?).map_err(|e| ReportError::Json {
            file: summary_path.clone(),
            line: e.line(),
            column: e.column(),
            message: json_message(&e),
        })?;
    let rows_path = dir.join(OUTER_STEPS_CSV);
    let rows = parse_outer_steps_csv(&read_text(&rows_path)?)
        .map_err(|source| ReportError::Csv { file: rows_path.clone(), source })?;
    let events_path = dir.join(EVENTS_CSV);
    let events = parse_events_csv(&read_text(&events_path)?)
        .map_err(|source| ReportError::Csv { file: events_path.clone(), source })?;
    Ok(Run { dir: dir.to_path_buf(), summary, rows, events })
}
