//! # loco-reports
//!
//! A run's metrics files to its report. A run directory holds the three files both backends
//! write through [`write_run`] (schema in [`loco_core::metrics`]):
//!
//! - `summary.json` ([`loco_core::metrics::Summary`]),
//! - `outer_steps.csv` (one row per outer step and node),
//! - `events.csv` (membership and fault events),
//!
//! and [`render`] draws from them, into the same directory:
//!
//! - `report.html`: one self-contained page (inline CSS and SVG, no scripts, nothing fetched):
//!   scenario, backend, seed, invariants, the summary figures, a Table-2-style comparison with
//!   INTELLECT-1's published figures, per-node and per-event tables, and the plots;
//! - plots, each as `NAME.svg` and `NAME.png` ([`PLOT_NAMES`]): `active_nodes` (members over time,
//!   joins, leaves, crashes and evictions marked), `time_by_node` and `time_by_step` (where wall
//!   time went, stacked), `timeline` (compute and all-reduce side by side on a timeline per
//!   node: whether the all-reduces run beside the compute or stop it), `bandwidth` (each node's
//!   send rate over time, peak against mean), `allreduce_hist`
//!   (distribution of all-reduce times), `bytes_per_step`, and `loss` (over tokens, only when
//!   rows have a loss);
//! - CSV summaries: [`UTILIZATION_BY_NODE_CSV`], [`ALLREDUCE_TIMES_CSV`], [`OUTER_STEP_TOTALS_CSV`].
//!
//! Given several directories, [`render`] also writes `comparison.html` and `comparison.csv` (one
//! row per run, next to the published figures) into the first one; [`render_into`] writes them
//! where it is told.
//!
//! Every file is written atomically (a temporary file in the same directory, then a rename), and
//! the output is a function of the input files only: the same files give the same bytes (no
//! clock, no absolute path; a run is labelled by its directory's last component in comparisons).
//! Text is drawn with a bundled font (DejaVu Sans, `assets/`), never a system one.

#![warn(missing_docs, unreachable_pub)]

pub mod draw;
mod error;
pub mod fidelity;
mod files;
mod format;
mod html;
mod plots;
mod tables;

pub use error::ReportError;
pub use files::{EVENTS_CSV, OUTER_STEPS_CSV, Run, SUMMARY_JSON, read_run, summary_json};
pub use format::escape_html;
pub use plots::{HEIGHT, PLOT_NAMES, WIDTH};
pub use tables::{
    ALLREDUCE_TIMES_COLUMNS, ALLREDUCE_TIMES_CSV, COMPARISON_COLUMNS, COMPARISON_CSV,
    OUTER_STEP_TOTALS_COLUMNS, OUTER_STEP_TOTALS_CSV, UTILIZATION_BY_NODE_COLUMNS,
    UTILIZATION_BY_NODE_CSV, allreduce_times_csv, comparison_csv, outer_step_totals_csv,
    utilization_by_node_csv,
};

use loco_core::metrics::{EventRow, OuterStepRow, Summary};
use std::path::{Path, PathBuf};

/// `report.html`.
pub const REPORT_HTML: &str = "report.html";
/// `comparison.html`.
pub const COMPARISON_HTML: &str = "comparison.html";

/// What [`render`] wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rendered {
    /// Every file written, in order.
    pub files: Vec<PathBuf>,
    /// Each run's `report.html`, in the order of the directories.
    pub reports: Vec<PathBuf>,
    /// `comparison.html`, when one was written.
    pub comparison: Option<PathBuf>,
}

/// Writes a finished run into `dir` (created if missing): `outer_steps.csv`, `events.csv` and
/// `summary.json`, each atomically, then draws its report from those files as [`render`] does, so
/// that `loco report DIR` later gives the same bytes.
///
/// # Errors
/// [`ReportError`] naming the file that could not be written or drawn. The metrics files are
/// written first: a failure while drawing leaves them in place.
pub fn write_run(
    dir: &Path,
    summary: &Summary,
    rows: &[OuterStepRow],
    events: &[EventRow],
) -> Result<(), ReportError> {
    files::write_metrics(dir, summary, rows, events)?;
    render(&[dir.to_path_buf()]).map(|_| ())
}

/// Redraws the report of each run directory in `dirs` (see the crate docs). With more than one,
/// also writes `comparison.html` and `comparison.csv` into the first directory.
///
/// Every directory is read before anything is written, so a bad file anywhere writes nothing.
///
/// # Errors
/// [`ReportError::NoRuns`] for an empty list; otherwise a [`ReportError`] naming the file (and
/// for a bad CSV or JSON file, the line and the field).
pub fn render(dirs: &[PathBuf]) -> Result<Rendered, ReportError> {
    let first = dirs.first().ok_or(ReportError::NoRuns)?.clone();
    render_impl(dirs, (dirs.len() > 1).then_some(first.as_path()))
}

/// Like [`render`], but always writes `comparison.html` and `comparison.csv`, into `out`
/// (created if missing), even for one run.
///
/// # Errors
/// As [`render`].
pub fn render_into(dirs: &[PathBuf], out: &Path) -> Result<Rendered, ReportError> {
    render_impl(dirs, Some(out))
}

fn render_impl(dirs: &[PathBuf], comparison: Option<&Path>) -> Result<Rendered, ReportError> {
    if dirs.is_empty() {
        return Err(ReportError::NoRuns);
    }
    let runs = dirs.iter().map(|d| read_run(d)).collect::<Result<Vec<_>, _>>()?;
    let mut rendered = Rendered::default();
    for run in &runs {
        let written = render_run(run)?;
        rendered.reports.extend(written.iter().find(|p| p.ends_with(REPORT_HTML)).cloned());
        rendered.files.extend(written);
    }
    if let Some(out) = comparison {
        std::fs::create_dir_all(out)
            .map_err(|source| ReportError::Io { path: out.to_path_buf(), source })?;
        let labelled: Vec<(String, &Summary)> =
            runs.iter().enumerate().map(|(i, r)| (run_name(&r.dir, i), &r.summary)).collect();
        rendered.files.push(files::write_atomic(
            out,
            COMPARISON_CSV,
            comparison_csv(&labelled).as_bytes(),
        )?);
        let html = files::write_atomic(
            out,
            COMPARISON_HTML,
            html::comparison_report(&labelled).as_bytes(),
        )?;
        rendered.comparison = Some(html.clone());
        rendered.files.push(html);
    }
    Ok(rendered)
}

/// A run's name in a comparison: its directory's last component, or `run N` (1-based) when it
/// has none (`/`). Never an absolute path. A name already taken gets ` (N)` appended.
fn run_name(dir: &Path, i: usize) -> String {
    let name = dir.file_name().map(ToOwned::to_owned).or_else(|| {
        // `.` or `..`: the name of the directory it stands for.
        dir.canonicalize().ok().and_then(|p| p.file_name().map(ToOwned::to_owned))
    });
    name.map_or_else(|| format!("run {}", i + 1), |n| n.to_string_lossy().into_owned())
}

/// Events a live page lists, newest first, above the report's sections.
pub const LIVE_LATEST_EVENTS: usize = 20;

/// The live view of a run under way (its `dir` is not read): the latest events, then the
/// report's sections (summary, nodes, events, plots as inline SVG) drawn from the rows and events
/// so far, as an HTML fragment for [`live_page`]. The same drawing as [`render_run`]'s report,
/// without files or PNGs.
///
/// # Errors
/// [`ReportError`] naming the plot that failed.
pub fn live_fragment(run: &Run) -> Result<String, ReportError> {
    let plots = plots::draw_all(&run.rows, &run.events, run.summary.simulated_seconds, false)?;
    Ok(html::live_fragment(run, &plots, LIVE_LATEST_EVENTS))
}

/// The live page titled `title`: it shows each fragment the server-sent events at the path
/// `events` carry, as JSON `{"status": text, "html": fragment, "ended": bool}` (and stops
/// listening once `ended`).
pub fn live_page(title: &str, events: &str) -> String {
    html::live_page(title, events)
}

/// Draws one run's report, plots and CSV summaries into its directory; returns the files written.
///
/// # Errors
/// [`ReportError`] naming the plot or file that failed.
pub fn render_run(run: &Run) -> Result<Vec<PathBuf>, ReportError> {
    let dir = run.dir.as_path();
    let mut written = Vec::new();
    let plots = plots::draw_all(&run.rows, &run.events, run.summary.simulated_seconds, true)?;
    for p in &plots {
        written.push(files::write_atomic(dir, &format!("{}.svg", p.name), p.svg.as_bytes())?);
        written.push(files::write_atomic(dir, &format!("{}.png", p.name), &p.png)?);
    }
    for name in PLOT_NAMES.iter().filter(|n| !plots.iter().any(|p| p.name == **n)) {
        files::remove_stale(dir, &format!("{name}.svg"))?;
        files::remove_stale(dir, &format!("{name}.png"))?;
    }
    let tables = [
        (UTILIZATION_BY_NODE_CSV, utilization_by_node_csv(&run.rows)),
        (ALLREDUCE_TIMES_CSV, allreduce_times_csv(&run.rows)),
        (OUTER_STEP_TOTALS_CSV, outer_step_totals_csv(&run.rows)),
    ];
    for (name, text) in tables {
        written.push(files::write_atomic(dir, name, text.as_bytes())?);
    }
    // A run that `loco fidelity` compared has its fidelity.json beside it: its report says so.
    let fidelity = fidelity::read(dir)?;
    let html = html::run_report(run, &plots, fidelity.as_ref());
    written.push(files::write_atomic(dir, REPORT_HTML, html.as_bytes())?);
    Ok(written)
}
