//! The CSV summaries written next to the report. Same format rules as the metrics files: a header
//! line, `\n` line ends, RFC 4180 quoting, floats with six decimals, rows sorted.

use loco_core::metrics::{
    OuterStepRow, Summary, format_f64, node_totals, published_row, step_totals,
};

/// `utilization_by_node.csv`: one row per node, by name.
pub const UTILIZATION_BY_NODE_CSV: &str = "utilization_by_node.csv";
/// `allreduce_times.csv`: one row per (outer step, node) that had an all-reduce.
pub const ALLREDUCE_TIMES_CSV: &str = "allreduce_times.csv";
/// `outer_step_totals.csv`: one row per outer step, summed over its nodes.
pub const OUTER_STEP_TOTALS_CSV: &str = "outer_step_totals.csv";
/// `comparison.csv`: one row per run of a comparison.
pub const COMPARISON_CSV: &str = "comparison.csv";

fn field(out: &mut String, f: &str) {
    if f.contains([',', '"', '\n', '\r']) || f.starts_with(' ') || f.ends_with(' ') {
        out.push('"');
        out.push_str(&f.replace('"', "\"\""));
        out.push('"');
    } else {
        out.push_str(f);
    }
}

fn record(out: &mut String, fields: &[String]) {
    for (i, f) in fields.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        field(out, f);
    }
    out.push('\n');
}

fn header(cols: &[&str]) -> String {
    let mut s = cols.join(",");
    s.push('\n');
    s
}

fn opt(x: Option<f64>) -> String {
    x.map(format_f64).unwrap_or_default()
}

/// Columns of [`UTILIZATION_BY_NODE_CSV`].
pub const UTILIZATION_BY_NODE_COLUMNS: [&str; 15] = [
    "node",
    "node_id",
    "outer_steps",
    "wall_s",
    "compute_s",
    "allreduce_s",
    "barrier_s",
    "recovery_s",
    "checkpoint_s",
    "outer_s",
    "idle_s",
    "utilization",
    "utilization_table2",
    "bytes_sent",
    "tokens",
];

/// `utilization_by_node.csv`: `utilization` is loco's (compute / wall), `utilization_table2`
/// Table 2's (compute / (compute + all-reduce)).
pub fn utilization_by_node_csv(rows: &[OuterStepRow]) -> String {
    let mut out = header(&UTILIZATION_BY_NODE_COLUMNS);
    for (node, t) in node_totals(rows) {
        record(
            &mut out,
            &[
                node,
                t.node_id.to_string(),
                t.rows.to_string(),
                format_f64(t.wall_s),
                format_f64(t.compute_s),
                format_f64(t.allreduce_s),
                format_f64(t.barrier_s),
                format_f64(t.recovery_s),
                format_f64(t.checkpoint_s),
                format_f64(t.outer_s),
                format_f64(t.idle_s),
                format_f64(t.utilization()),
                format_f64(t.utilization_table2()),
                t.bytes_sent.to_string(),
                t.tokens.to_string(),
            ],
        );
    }
    out
}

/// Columns of [`ALLREDUCE_TIMES_CSV`].
pub const ALLREDUCE_TIMES_COLUMNS: [&str; 8] =
    ["outer_step", "node", "node_id", "epoch", "world", "allreduce_s", "retries", "bytes_sent"];

/// `allreduce_times.csv`: the samples of the all-reduce statistics, by outer step and node id.
pub fn allreduce_times_csv(rows: &[OuterStepRow]) -> String {
    let mut sorted: Vec<&OuterStepRow> =
        rows.iter().filter(|r| r.allreduce_s.is_finite() && r.allreduce_s > 0.0).collect();
    sorted.sort_by(|a, b| {
        (a.outer_step, a.node_id, &a.node).cmp(&(b.outer_step, b.node_id, &b.node))
    });
    let mut out = header(&ALLREDUCE_TIMES_COLUMNS);
    for r in sorted {
        record(
            &mut out,
            &[
                r.outer_step.to_string(),
                r.node.clone(),
                r.node_id.to_string(),
                r.epoch.to_string(),
                r.world.to_string(),
                format_f64(r.allreduce_s),
                r.retries.to_string(),
                r.bytes_sent.to_string(),
            ],
        );
    }
    out
}

/// Columns of [`OUTER_STEP_TOTALS_CSV`].
pub const OUTER_STEP_TOTALS_COLUMNS: [&str; 17] = [
    "outer_step",
    "nodes",
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
    "allreduce_max_s",
    "bytes_sent",
    "tokens",
    "retries",
    "mean_loss",
];

/// `outer_step_totals.csv`: per outer step, sums over its nodes (times in node-seconds), the
/// longest all-reduce, and the mean loss (empty when none).
pub fn outer_step_totals_csv(rows: &[OuterStepRow]) -> String {
    let mut out = header(&OUTER_STEP_TOTALS_COLUMNS);
    for s in step_totals(rows) {
        let mut f = vec![
            s.outer_step.to_string(),
            s.nodes.to_string(),
            s.world.to_string(),
            format_f64(s.start_s),
            format_f64(s.end_s),
        ];
        f.extend(s.breakdown_s.iter().map(|x| format_f64(*x)));
        f.extend([
            format_f64(s.allreduce_max_s),
            s.bytes_sent.to_string(),
            s.tokens.to_string(),
            s.retries.to_string(),
            opt(s.mean_loss),
        ]);
        record(&mut out, &f);
    }
    out
}

/// Columns of [`COMPARISON_CSV`].
pub const COMPARISON_COLUMNS: [&str; 14] = [
    "run",
    "scenario",
    "backend",
    "seed",
    "published",
    "median_allreduce_s",
    "utilization_table2",
    "utilization",
    "mfu",
    "invariants_ok",
    "published_setting",
    "published_median_allreduce_s",
    "published_utilization",
    "published_mfu",
];

/// `comparison.csv`: one row per run, in the order given, with the published Table-2 figures of
/// the setting it names (empty when none). `median_allreduce_s` is empty for a run without
/// all-reduce samples.
pub fn comparison_csv(runs: &[(String, &Summary)]) -> String {
    let mut out = header(&COMPARISON_COLUMNS);
    for (label, s) in runs {
        let p = s.published.as_deref().and_then(published_row);
        let median = (s.allreduce_seconds.count > 0).then_some(s.allreduce_seconds.median);
        record(
            &mut out,
            &[
                label.clone(),
                s.scenario.clone(),
                s.backend.clone(),
                s.seed.to_string(),
                s.published.clone().unwrap_or_default(),
                opt(median),
                format_f64(s.utilization.table2),
                format_f64(s.utilization.mean),
                opt(s.mfu),
                s.invariants.ok.to_string(),
                p.map(|p| p.setting.to_owned()).unwrap_or_default(),
                opt(p.and_then(|p| p.median_allreduce_s)),
                opt(p.map(|p| p.compute_utilization)),
                opt(p.map(|p| p.mfu)),
            ],
        );
    }
    out
}
