//! `outer_steps.csv` and `events.csv`: writing to a `String` with a fixed format, and parsing back
//! with errors that name the line and the field.
//!
//! Format: a header line with the column names, then one record per row, `\n`-terminated, RFC 4180
//! quoting (a field holding a comma, a quote, a line break or surrounding spaces is quoted, quotes
//! doubled). Floats are written with six decimals (`{:.6}`: microseconds for times), `-0` as `0`,
//! and `NaN`/`inf` as Rust writes them. An absent value (`None`) is an empty field. Rows are sorted
//! before writing (see [`outer_steps_csv`], [`events_csv`]), so the same rows in any order give
//! the same bytes.

use super::MetricsError;
use super::schema::{EventKind, EventRow, OuterStepRow};
use std::fmt::Write as _;
use std::str::FromStr;

/// The columns of `outer_steps.csv`, in order (the fields of [`OuterStepRow`]).
pub const OUTER_STEPS_COLUMNS: [&str; 22] = [
    "outer_step",
    "node",
    "node_id",
    "epoch",
    "world",
    "start_s",
    "end_s",
    "compute_s",
    "allreduce_s",
    "barrier_s",
    "recovery_s",
    "checkpoint_s",
    "outer_s",
    "idle_s",
    "bytes_sent",
    "retries",
    "tokens",
    "loss",
    "weights_hash",
    "weight",
    "allreduce_wall_s",
    "eval_loss",
];

/// Columns of `outer_steps.csv` files written before `eval_loss`: they parse with `eval_loss`
/// absent.
const OUTER_STEPS_COLUMNS_V1: usize = 21;

/// The columns of `events.csv`, in order (the fields of [`EventRow`]).
pub const EVENTS_COLUMNS: [&str; 5] = ["time_s", "kind", "node", "epoch", "detail"];

/// A float in the files' fixed format: six decimals, `-0` written as `0`.
pub fn format_f64(x: f64) -> String {
    let s = format!("{x:.6}");
    if s == "-0.000000" { "0.000000".to_owned() } else { s }
}

fn push_field(out: &mut String, field: &str) {
    let needs_quotes = field.contains([',', '"', '\n', '\r'])
        || field.starts_with(char::is_whitespace)
        || field.ends_with(char::is_whitespace);
    if needs_quotes {
        out.push('"');
        out.push_str(&field.replace('"', "\"\""));
        out.push('"');
    } else {
        out.push_str(field);
    }
}

fn push_record<'a>(out: &mut String, fields: impl IntoIterator<Item = &'a str>) {
    for (i, f) in fields.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        push_field(out, f);
    }
    out.push('\n');
}

/// Rows in the order the files use: by outer step, then node id, then node name (stable for ties).
pub fn sort_outer_steps(rows: &mut [OuterStepRow]) {
    rows.sort_by(|a, b| {
        (a.outer_step, a.node_id, &a.node).cmp(&(b.outer_step, b.node_id, &b.node))
    });
}

/// Events in the order the files use: by time (stable: events at the same time keep their order).
pub fn sort_events(events: &mut [EventRow]) {
    events.sort_by(|a, b| a.time_s.total_cmp(&b.time_s));
}

/// `outer_steps.csv`: the header line, then the rows sorted by [`sort_outer_steps`].
pub fn outer_steps_csv(rows: &[OuterStepRow]) -> String {
    let mut sorted = rows.to_vec();
    sort_outer_steps(&mut sorted);
    let mut out = String::new();
    push_record(&mut out, OUTER_STEPS_COLUMNS);
    for r in &sorted {
        let fields = [
            r.outer_step.to_string(),
            r.node.clone(),
            r.node_id.to_string(),
            r.epoch.to_string(),
            r.world.to_string(),
            format_f64(r.start_s),
            format_f64(r.end_s),
            format_f64(r.compute_s),
            format_f64(r.allreduce_s),
            format_f64(r.barrier_s),
            format_f64(r.recovery_s),
            format_f64(r.checkpoint_s),
            format_f64(r.outer_s),
            format_f64(r.idle_s),
            r.bytes_sent.to_string(),
            r.retries.to_string(),
            r.tokens.to_string(),
            r.loss.map(format_f64).unwrap_or_default(),
            r.weights_hash.map(|d| d.to_string()).unwrap_or_default(),
            format_f64(r.weight),
            format_f64(r.allreduce_wall_s),
            r.eval_loss.map(format_f64).unwrap_or_default(),
        ];
        push_record(&mut out, fields.iter().map(String::as_str));
    }
    out
}

/// `events.csv`: the header line, then the events sorted by [`sort_events`].
pub fn events_csv(events: &[EventRow]) -> String {
    let mut sorted = events.to_vec();
    sort_events(&mut sorted);
    let mut out = String::new();
    push_record(&mut out, EVENTS_COLUMNS);
    for e in &sorted {
        let mut epoch = String::new();
        if let Some(ep) = e.epoch {
            let _ = write!(epoch, "{ep}");
        }
        let fields = [
            format_f64(e.time_s),
            e.kind.as_str().to_owned(),
            e.node.clone().unwrap_or_default(),
            epoch,
            e.detail.clone(),
        ];
        push_record(&mut out, fields.iter().map(String::as_str));
    }
    out
}

/// One data record being parsed: its line, and typed access to its fields by column.
struct Record<'r> {
    line: u64,
    fields: &'r csv::StringRecord,
}

impl Record<'_> {
    fn raw(&self, col: usize) -> &str {
        self.fields.get(col).unwrap_or("")
    }

    fn parse<T: FromStr>(
        &self,
        col: usize,
        field: &'static str,
        expected: &'static str,
    ) -> Result<T, MetricsError> {
        let s = self.raw(col);
        s.trim().parse().map_err(|_| MetricsError::Field {
            line: self.line,
            field,
            expected,
            found: s.to_owned(),
        })
    }

    fn f64(&self, col: usize, field: &'static str) -> Result<f64, MetricsError> {
        self.parse(col, field, "a number")
    }

    fn opt<T: FromStr>(
        &self,
        col: usize,
        field: &'static str,
        expected: &'static str,
    ) -> Result<Option<T>, MetricsError> {
        if self.raw(col).trim().is_empty() {
            Ok(None)
        } else {
            self.parse(col, field, expected).map(Some)
        }
    }
}

/// Turns the csv crate's byte positions into 1-based line numbers. The csv crate's own line count
/// skips blank lines and places a record that follows blank lines at the first of them, so lines
/// are counted from the bytes, incrementally (positions only grow).
struct Lines<'t> {
    bytes: &'t [u8],
    /// Bytes before `at` have been counted.
    at: usize,
    /// Line breaks before `at`.
    breaks: u64,
}

impl<'t> Lines<'t> {
    fn new(text: &'t str) -> Lines<'t> {
        Lines { bytes: text.as_bytes(), at: 0, breaks: 0 }
    }

    /// The line on which the record at `pos` starts (after any blank lines at `pos`).
    fn line_of(&mut self, pos: &csv::Position) -> u64 {
        let b = self.bytes;
        let mut start = usize::try_from(pos.byte()).unwrap_or(usize::MAX).min(b.len());
        while start < b.len() && matches!(b[start], b'\n' | b'\r') {
            start += 1;
        }
        if start < self.at {
            // Never happens with the csv crate; count from the beginning rather than guess.
            self.at = 0;
            self.breaks = 0;
        }
        self.breaks += b[self.at..start].iter().filter(|c| **c == b'\n').count() as u64;
        self.at = start;
        1 + self.breaks
    }
}

/// Reads records after checking the header; calls `row` on each one.
fn parse_records<T>(
    text: &str,
    columns: &[&str],
    mut row: impl FnMut(&Record<'_>) -> Result<T, MetricsError>,
) -> Result<Vec<T>, MetricsError> {
    let mut reader =
        csv::ReaderBuilder::new().has_headers(false).flexible(true).from_reader(text.as_bytes());
    let mut record = csv::StringRecord::new();
    let mut out = Vec::new();
    let mut header_seen = false;
    let mut lines = Lines::new(text);
    loop {
        let more = reader.read_record(&mut record).map_err(|e| MetricsError::Syntax {
            line: e.position().map_or(0, |p| lines.line_of(p)),
            message: e.to_string(),
        })?;
        if !more {
            break;
        }
        let line = record.position().map_or(0, |p| lines.line_of(p));
        if !header_seen {
            header_seen = true;
            let found: Vec<&str> = record.iter().map(str::trim).collect();
            if found != columns {
                return Err(MetricsError::Header {
                    line,
                    expected: columns.join(","),
                    found: record.iter().collect::<Vec<_>>().join(","),
                });
            }
            continue;
        }
        // The csv crate skips empty lines; a record with a single empty field is blank too.
        if record.len() == 1 && record.get(0).is_some_and(|f| f.trim().is_empty()) {
            continue;
        }
        if record.len() != columns.len() {
            return Err(MetricsError::FieldCount {
                line,
                expected: columns.len(),
                found: record.len(),
            });
        }
        out.push(row(&Record { line, fields: &record })?);
    }
    if !header_seen {
        return Err(MetricsError::MissingHeader { expected: columns.join(",") });
    }
    Ok(out)
}

/// Parses `outer_steps.csv` as written by [`outer_steps_csv`]. Rows keep the file's order.
///
/// # Errors
/// [`MetricsError`] naming the line (1-based) and the field of the first problem found.
pub fn parse_outer_steps_csv(text: &str) -> Result<Vec<OuterStepRow>, MetricsError> {
    const INT: &str = "a non-negative integer";
    // A file written before `eval_loss` has the columns before it.
    let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    let old = OUTER_STEPS_COLUMNS[..OUTER_STEPS_COLUMNS_V1].join(",");
    let columns = if first.split(',').map(str::trim).collect::<Vec<_>>().join(",") == old {
        &OUTER_STEPS_COLUMNS[..OUTER_STEPS_COLUMNS_V1]
    } else {
        &OUTER_STEPS_COLUMNS[..]
    };
    parse_records(text, columns, |r| {
        let node = r.raw(1).to_owned();
        if node.is_empty() {
            return Err(MetricsError::Field {
                line: r.line,
                field: "node",
                expected: "a node name",
                found: node,
            });
        }
        Ok(OuterStepRow {
            outer_step: r.parse(0, "outer_step", INT)?,
            node,
            node_id: r.parse(2, "node_id", INT)?,
            epoch: r.parse(3, "epoch", INT)?,
            world: r.parse(4, "world", INT)?,
            start_s: r.f64(5, "start_s")?,
            end_s: r.f64(6, "end_s")?,
            compute_s: r.f64(7, "compute_s")?,
            allreduce_s: r.f64(8, "allreduce_s")?,
            barrier_s: r.f64(9, "barrier_s")?,
            recovery_s: r.f64(10, "recovery_s")?,
            checkpoint_s: r.f64(11, "checkpoint_s")?,
            outer_s: r.f64(12, "outer_s")?,
            idle_s: r.f64(13, "idle_s")?,
            bytes_sent: r.parse(14, "bytes_sent", INT)?,
            retries: r.parse(15, "retries", INT)?,
            tokens: r.parse(16, "tokens", INT)?,
            loss: r.opt(17, "loss", "a number or nothing")?,
            weights_hash: r.opt(18, "weights_hash", "16 hex digits or nothing")?,
            weight: r.f64(19, "weight")?,
            allreduce_wall_s: r.f64(20, "allreduce_wall_s")?,
            eval_loss: if r.fields.len() > OUTER_STEPS_COLUMNS_V1 {
                r.opt(21, "eval_loss", "a number or nothing")?
            } else {
                None
            },
        })
    })
}

/// Parses `events.csv` as written by [`events_csv`]. Events keep the file's order.
///
/// # Errors
/// [`MetricsError`] naming the line (1-based) and the field of the first problem found.
pub fn parse_events_csv(text: &str) -> Result<Vec<EventRow>, MetricsError> {
    parse_records(text, &EVENTS_COLUMNS, |r| {
        let kind_raw = r.raw(1).trim();
        let kind = EventKind::from_str(kind_raw).map_err(|_| MetricsError::Field {
            line: r.line,
            field: "kind",
            expected: "an event kind (start, join-request, admit, join, leave, crash, evict, \
                       hang, restart, partition, heal, degrade, epoch, allreduce-failed, retry, \
                       skip-step, coordinator-crash, coordinator-pause, coordinator-lost, \
                       checkpoint, recovery-start, recovery-done, withheld, stop)",
            found: kind_raw.to_owned(),
        })?;
        let node = r.raw(2);
        Ok(EventRow {
            time_s: r.f64(0, "time_s")?,
            kind,
            node: (!node.is_empty()).then(|| node.to_owned()),
            epoch: r.opt(3, "epoch", "a non-negative integer or nothing")?,
            detail: r.raw(4).to_owned(),
        })
    })
}
