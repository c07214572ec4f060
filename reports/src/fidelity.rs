//! The simulator against the real backend on one scenario (`loco fidelity`): per outer step,
//! both backends' all-reduce time (median over the nodes), the step's wall time (mean over the
//! nodes), bytes and members; the errors of the simulator's predictions, with the real run as
//! the reference; and the differences of the membership story.
//!
//! Pure: two runs in, figures and file contents out (`fidelity.csv`, `fidelity.json`,
//! `fidelity.html`); [`write_fidelity`] writes them atomically.

use crate::ReportError;
use crate::files::{Run, write_atomic};
use loco_core::metrics::{EventKind, EventRow, OuterStepRow};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// `fidelity.csv`.
pub const FIDELITY_CSV: &str = "fidelity.csv";
/// `fidelity.json`.
pub const FIDELITY_JSON: &str = "fidelity.json";
/// `fidelity.html`.
pub const FIDELITY_HTML: &str = "fidelity.html";
/// The tolerance a report's fidelity section judges by (`loco fidelity`'s default).
pub const DEFAULT_TOLERANCE: f64 = 0.05;

/// One backend's figures of one outer step.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StepFigures {
    /// Median all-reduce wall time (`allreduce_wall_s`) over the nodes whose all-reduce ran (0
    /// when none did).
    pub allreduce_s: f64,
    /// Mean of `end_s - start_s` over the nodes.
    pub wall_s: f64,
    /// Sum of `bytes_sent`.
    pub bytes: u64,
    /// The nodes with a row, sorted.
    pub members: Vec<String>,
}

/// One outer step, both backends (`None` where a backend has no row of it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepPair {
    /// The outer step.
    pub outer_step: u64,
    /// The simulator's figures.
    pub sim: Option<StepFigures>,
    /// The real run's figures.
    pub real: Option<StepFigures>,
}

/// The simulator's error on one figure: `sim / real - 1`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Error {
    /// The simulator's value.
    pub sim: f64,
    /// The real run's value.
    pub real: f64,
    /// `sim / real - 1` (NaN when the real value is 0; `null` in JSON).
    #[serde(deserialize_with = "nan_or_number")]
    pub relative: f64,
}

impl Error {
    fn of(sim: f64, real: f64) -> Error {
        let relative = if real == 0.0 { f64::NAN } else { sim / real - 1.0 };
        Error { sim, real, relative }
    }

    /// Whether `|relative| <= tol`.
    pub fn within(&self, tol: f64) -> bool {
        self.relative.abs() <= tol
    }
}

/// The comparison of two runs of one scenario.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Fidelity {
    /// The scenario's name.
    pub scenario: String,
    /// The seed of the simulated run.
    pub seed: u64,
    /// The real run's network (`extra.network` of its summary), if it says.
    pub network: Option<String>,
    /// Median all-reduce time over every row of the steps both backends ran.
    pub allreduce_median: Error,
    /// Mean outer-step wall time over those rows.
    pub outer_step_mean: Error,
    /// Utilisation (compute / wall) over those rows.
    pub utilisation: Error,
    /// Bytes sent over those steps.
    pub bytes: Error,
    /// Steps both backends ran, compared.
    pub steps_compared: u64,
    /// The membership story's differences, one line each (empty: the same story).
    pub story_differences: Vec<String>,
    /// Per outer step.
    pub steps: Vec<StepPair>,
}

/// JSON writes NaN as `null`: read it back as NaN.
fn nan_or_number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// The `fidelity.json` of `dir`, if it has one (a run that `loco fidelity` compared).
///
/// # Errors
/// [`ReportError::Io`] when it cannot be read, [`ReportError::Json`] when it does not parse.
pub fn read(dir: &Path) -> Result<Option<Fidelity>, ReportError> {
    let path = dir.join(FIDELITY_JSON);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(ReportError::Io { path, source }),
    };
    serde_json::from_str(&text).map(Some).map_err(|e| ReportError::Json {
        file: path.clone(),
        line: e.line(),
        column: e.column(),
        message: e.to_string(),
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

fn by_step(rows: &[OuterStepRow]) -> BTreeMap<u64, Vec<&OuterStepRow>> {
    let mut m: BTreeMap<u64, Vec<&OuterStepRow>> = BTreeMap::new();
    for r in rows {
        m.entry(r.outer_step).or_default().push(r);
    }
    m
}

/// A row's all-reduce: its own wall time (`allreduce_wall_s`, from release to commit), which in
/// overlap and streaming modes runs beside the next inner steps; `allreduce_s` (the part the node
/// waited for) in files written before that column.
fn allreduce_of(r: &OuterStepRow) -> f64 {
    if r.allreduce_wall_s > 0.0 { r.allreduce_wall_s } else { r.allreduce_s }
}

fn figures(rows: &[&OuterStepRow]) -> StepFigures {
    let ar: Vec<f64> = rows.iter().map(|r| allreduce_of(r)).filter(|a| *a > 0.0).collect();
    let mut members: Vec<String> = rows.iter().map(|r| r.node.clone()).collect();
    members.sort();
    members.dedup();
    StepFigures {
        allreduce_s: median(ar),
        wall_s: rows.iter().map(|r| r.wall_s()).sum::<f64>() / rows.len().max(1) as f64,
        bytes: rows.iter().map(|r| r.bytes_sent).sum(),
        members,
    }
}

/// Each subject's (a node, or the run) story: its story events' kinds in time order.
fn story(events: &[EventRow]) -> BTreeMap<String, Vec<String>> {
    let mut m: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for e in events.iter().filter(|e| EventKind::STORY.contains(&e.kind)) {
        let who = e.node.clone().unwrap_or_else(|| "(run)".into());
        m.entry(who).or_default().push(e.kind.to_string());
    }
    m
}

/// Compares the simulated run `sim` with the real run `real` of the same scenario.
pub fn compare(sim: &Run, real: &Run) -> Fidelity {
    let (a, b) = (by_step(&sim.rows), by_step(&real.rows));
    let all: BTreeSet<u64> = a.keys().chain(b.keys()).copied().collect();
    let mut steps = Vec::new();
    let mut story_differences = Vec::new();
    let (mut ar_s, mut ar_r, mut wall_s, mut wall_r) = (vec![], vec![], vec![], vec![]);
    let (mut comp_s, mut comp_r, mut bytes_s, mut bytes_r) = (0.0, 0.0, 0u64, 0u64);
    let mut compared = 0;
    for k in all {
        let (x, y) = (a.get(&k), b.get(&k));
        let (fx, fy) = (x.map(|r| figures(r)), y.map(|r| figures(r)));
        if let (Some(x), Some(y)) = (x, y) {
            compared += 1;
            for (rows, ar, wall, comp, bytes) in [
                (x, &mut ar_s, &mut wall_s, &mut comp_s, &mut bytes_s),
                (y, &mut ar_r, &mut wall_r, &mut comp_r, &mut bytes_r),
            ] {
                ar.extend(rows.iter().map(|r| allreduce_of(r)).filter(|v| *v > 0.0));
                wall.extend(rows.iter().map(|r| r.wall_s()));
                *comp += rows.iter().map(|r| r.compute_s).sum::<f64>();
                *bytes += rows.iter().map(|r| r.bytes_sent).sum::<u64>();
            }
        }
        match (&fx, &fy) {
            (Some(p), Some(q)) if p.members != q.members => story_differences.push(format!(
                "outer step {k}: members {} (sim) against {} (real)",
                p.members.join(" "),
                q.members.join(" ")
            )),
            (Some(_), None) => story_differences.push(format!("outer step {k}: only simulated")),
            (None, Some(_)) => story_differences.push(format!("outer step {k}: only real")),
            _ => {}
        }
        steps.push(StepPair { outer_step: k, sim: fx, real: fy });
    }
    let (ss, rs) = (story(&sim.events), story(&real.events));
    let who: BTreeSet<&String> = ss.keys().chain(rs.keys()).collect();
    let none = Vec::new();
    for w in who {
        let (p, q) = (ss.get(w).unwrap_or(&none), rs.get(w).unwrap_or(&none));
        if p != q {
            story_differences.push(format!(
                "{w}: {} (sim) against {} (real)",
                if p.is_empty() { "nothing".into() } else { p.join(" ") },
                if q.is_empty() { "nothing".into() } else { q.join(" ") }
            ));
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let util = |c: f64, w: &[f64]| {
        let t: f64 = w.iter().sum();
        if t > 0.0 { c / t } else { 0.0 }
    };
    Fidelity {
        scenario: real.summary.scenario.clone(),
        seed: sim.summary.seed,
        network: real.summary.extra.get("network").and_then(|v| v.as_str()).map(str::to_owned),
        allreduce_median: Error::of(median(ar_s), median(ar_r)),
        outer_step_mean: Error::of(mean(&wall_s), mean(&wall_r)),
        utilisation: Error::of(util(comp_s, &wall_s), util(comp_r, &wall_r)),
        bytes: Error::of(bytes_s as f64, bytes_r as f64),
        steps_compared: compared,
        story_differences,
        steps,
    }
}

impl Fidelity {
    /// Whether the three timing figures are within `tol` and the stories agree.
    pub fn within(&self, tol: f64) -> bool {
        self.allreduce_median.within(tol)
            && self.outer_step_mean.within(tol)
            && self.utilisation.within(tol)
            && self.story_differences.is_empty()
    }

    /// `fidelity.csv`: one row per outer step.
    pub fn csv(&self) -> String {
        let mut s = String::from(
            "outer_step,sim_allreduce_s,real_allreduce_s,sim_wall_s,real_wall_s,sim_bytes,real_bytes,sim_members,real_members\n",
        );
        let f = |x: &Option<StepFigures>| -> (String, String, String, String) {
            match x {
                Some(v) => (
                    format!("{:.6}", v.allreduce_s),
                    format!("{:.6}", v.wall_s),
                    v.bytes.to_string(),
                    v.members.len().to_string(),
                ),
                None => Default::default(),
            }
        };
        for p in &self.steps {
            let (a, b) = (f(&p.sim), f(&p.real));
            let _ = writeln!(
                s,
                "{},{},{},{},{},{},{},{},{}",
                p.outer_step, a.0, b.0, a.1, b.1, a.2, b.2, a.3, b.3
            );
        }
        s
    }

    /// The summary lines a terminal shows.
    pub fn text(&self, tol: f64) -> String {
        let line = |name: &str, e: &Error, unit: &str, scale: f64| {
            format!(
                "{name:<22} sim {:>10.3}{unit}  real {:>10.3}{unit}  error {:>+7.2}%{}\n",
                e.sim * scale,
                e.real * scale,
                e.relative * 100.0,
                if e.within(tol) { "" } else { "  (outside the tolerance)" }
            )
        };
        let mut s = String::new();
        s += &line("median all-reduce", &self.allreduce_median, " s", 1.0);
        s += &line("mean outer step", &self.outer_step_mean, " s", 1.0);
        s += &line("utilisation", &self.utilisation, " %", 100.0);
        s += &line("bytes sent", &self.bytes, " MB", 1e-6);
        let _ = writeln!(s, "outer steps compared   {}", self.steps_compared);
        if self.story_differences.is_empty() {
            s += "membership story       the same\n";
        } else {
            s += "membership story       differs:\n";
            for d in &self.story_differences {
                let _ = writeln!(s, "  {d}");
            }
        }
        s
    }

    /// `fidelity.html`: the summary, a plot of both backends' all-reduce time per outer step,
    /// and the per-step table. Self-contained.
    pub fn html(&self, tol: f64) -> String {
        let esc = crate::escape_html;
        let mut h = String::new();
        let _ = write!(
            h,
            "<!doctype html><html><head><meta charset=\"utf-8\"><title>fidelity: {}</title>\
             <style>body{{font-family:sans-serif;margin:2em}}td,th{{padding:2px 8px;text-align:right}}\
             pre{{background:#f4f4f4;padding:1em}}</style></head><body><h1>The simulator against the \
             real run: {}</h1><p>seed {}, real network: {}</p><pre>{}</pre>",
            esc(&self.scenario),
            esc(&self.scenario),
            self.seed,
            esc(self.network.as_deref().unwrap_or("unknown")),
            esc(&self.text(tol))
        );
        h += &self.svg();
        h += "<table><tr><th>outer step</th><th>all-reduce sim (s)</th><th>real (s)</th>\
              <th>wall sim (s)</th><th>real (s)</th><th>members sim</th><th>real</th></tr>";
        for p in &self.steps {
            let g = |x: &Option<StepFigures>, f: fn(&StepFigures) -> String| {
                x.as_ref().map_or_else(String::new, f)
            };
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                p.outer_step,
                g(&p.sim, |v| format!("{:.3}", v.allreduce_s)),
                g(&p.real, |v| format!("{:.3}", v.allreduce_s)),
                g(&p.sim, |v| format!("{:.3}", v.wall_s)),
                g(&p.real, |v| format!("{:.3}", v.wall_s)),
                g(&p.sim, |v| v.members.len().to_string()),
                g(&p.real, |v| v.members.len().to_string()),
            );
        }
        h += "</table></body></html>\n";
        h
    }

    /// The section of a run's report.html: the summary and the plot.
    pub fn section(&self, tol: f64) -> String {
        format!(
            "<h2 id=\"fidelity\">The simulator against this run</h2>\n<p>From <code>loco fidelity</code>: the \
             simulator's errors against the real run (sim / real - 1), tolerance {:.0}%.</p>\n<pre>{}</pre>\n{}\n",
            tol * 100.0,
            crate::escape_html(&self.text(tol)),
            self.svg()
        )
    }

    /// Both backends' all-reduce time per outer step, as an inline SVG line plot.
    fn svg(&self) -> String {
        let (w, hgt, pad) = (720.0, 280.0, 40.0);
        let pts = |f: fn(&StepPair) -> Option<f64>| -> Vec<(f64, f64)> {
            self.steps.iter().filter_map(|p| f(p).map(|v| (p.outer_step as f64, v))).collect()
        };
        let sim = pts(|p| p.sim.as_ref().map(|v| v.allreduce_s));
        let real = pts(|p| p.real.as_ref().map(|v| v.allreduce_s));
        let xmax = sim.iter().chain(&real).map(|p| p.0).fold(1.0, f64::max);
        let ymax = sim.iter().chain(&real).map(|p| p.1).fold(1e-9, f64::max) * 1.1;
        let line = |v: &[(f64, f64)], color: &str| {
            let p: Vec<String> = v
                .iter()
                .map(|(x, y)| {
                    format!(
                        "{:.1},{:.1}",
                        pad + x / xmax * (w - 2.0 * pad),
                        hgt - pad - y / ymax * (hgt - 2.0 * pad)
                    )
                })
                .collect();
            format!(
                "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>",
                p.join(" ")
            )
        };
        format!(
            "<h2>All-reduce time per outer step</h2><svg xmlns=\"http://www.w3.org/2000/svg\" \
             width=\"{w}\" height=\"{hgt}\"><rect width=\"100%\" height=\"100%\" fill=\"white\"/>\
             <line x1=\"{pad}\" y1=\"{y0}\" x2=\"{x1}\" y2=\"{y0}\" stroke=\"black\"/>\
             <line x1=\"{pad}\" y1=\"{pad}\" x2=\"{pad}\" y2=\"{y0}\" stroke=\"black\"/>\
             <text x=\"{pad}\" y=\"20\" font-size=\"12\">{ymax:.3} s</text>\
             <text x=\"{x1}\" y=\"{yl}\" font-size=\"12\" text-anchor=\"end\">outer step {xmax:.0}</text>\
             {}{}<text x=\"{x1}\" y=\"20\" font-size=\"12\" text-anchor=\"end\" fill=\"#1f77b4\">sim</text>\
             <text x=\"{x1}\" y=\"36\" font-size=\"12\" text-anchor=\"end\" fill=\"#d62728\">real</text></svg>",
            line(&sim, "#1f77b4"),
            line(&real, "#d62728"),
            y0 = hgt - pad,
            x1 = w - pad,
            yl = hgt - 10.0,
        )
    }
}

/// Writes `fidelity.csv`, `fidelity.json` and `fidelity.html` into `dir`, each atomically.
pub fn write_fidelity(dir: &Path, f: &Fidelity, tol: f64) -> Result<Vec<PathBuf>, ReportError> {
    std::fs::create_dir_all(dir)
        .map_err(|source| ReportError::Io { path: dir.to_path_buf(), source })?;
    let json = serde_json::to_string_pretty(f).unwrap_or_default() + "\n";
    Ok(vec![
        write_atomic(dir, FIDELITY_CSV, f.csv().as_bytes())?,
        write_atomic(dir, FIDELITY_JSON, json.as_bytes())?,
        write_atomic(dir, FIDELITY_HTML, f.html(tol).as_bytes())?,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use loco_core::metrics::Summary;

    fn row(step: u64, node: &str, allreduce: f64, wall: f64) -> OuterStepRow {
        OuterStepRow {
            outer_step: step,
            node: node.into(),
            node_id: 0,
            epoch: 1,
            world: 2,
            start_s: 10.0 * step as f64,
            end_s: 10.0 * step as f64 + wall,
            compute_s: wall - allreduce,
            allreduce_s: allreduce,
            barrier_s: 0.0,
            recovery_s: 0.0,
            checkpoint_s: 0.0,
            outer_s: 0.0,
            idle_s: 0.0,
            bytes_sent: 100,
            retries: 0,
            tokens: 0,
            loss: None,
            weights_hash: None,
            weight: 1.0,
            allreduce_wall_s: 0.0,
            eval_loss: None,
        }
    }

    fn run(rows: Vec<OuterStepRow>, events: Vec<EventRow>) -> Run {
        let meta = loco_core::metrics::RunMeta {
            scenario: "t".into(),
            seed: 1,
            backend: "sim".into(),
            wall_seconds: 0.0,
            published: None,
            inner_steps_per_outer: None,
            mfu_basis: None,
            violations: vec![],
            diloco: Default::default(),
            extra: Default::default(),
        };
        let summary: Summary = loco_core::metrics::summarize(&meta, &rows, &events);
        Run { dir: PathBuf::from("x"), summary, rows, events }
    }

    #[test]
    fn errors_are_the_simulators_against_the_real_run() {
        let sim =
            run(vec![row(0, "a", 1.0, 4.0), row(0, "b", 1.2, 4.0), row(1, "a", 1.1, 4.0)], vec![]);
        let real = run(
            vec![
                row(0, "a", 1.0, 5.0),
                row(0, "b", 1.4, 5.0),
                row(1, "a", 1.2, 5.0),
                row(2, "a", 1.0, 5.0),
            ],
            vec![],
        );
        let f = compare(&sim, &real);
        assert_eq!(f.steps_compared, 2);
        // Medians over the compared steps' rows: sim 1.1, real 1.2.
        assert!((f.allreduce_median.relative - (1.1 / 1.2 - 1.0)).abs() < 1e-12);
        assert!((f.outer_step_mean.relative - (4.0 / 5.0 - 1.0)).abs() < 1e-12);
        // The same members in steps 0 and 1; step 2 only in the real run.
        assert_eq!(f.story_differences, vec!["outer step 2: only real".to_string()]);
        assert!(!f.within(0.5), "a step only one backend ran is a different story");
        assert!(f.csv().lines().count() == 4 && f.csv().starts_with("outer_step,"));
        assert!(f.html(0.05).contains("<svg"));
    }

    #[test]
    fn fidelity_json_reads_back_nan_included_and_a_run_without_one_has_none() {
        let sim = run(vec![row(0, "a", 1.0, 4.0)], vec![]);
        let real = run(vec![row(0, "a", 1.2, 5.0)], vec![]);
        let mut f = compare(&sim, &real);
        f.bytes.relative = f64::NAN;
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()).unwrap(), None);
        write_fidelity(dir.path(), &f, 0.05).unwrap();
        let back = read(dir.path()).unwrap().expect("written");
        assert!(back.bytes.relative.is_nan());
        assert_eq!(back.allreduce_median, f.allreduce_median);
        assert_eq!(back.steps, f.steps);
        std::fs::write(dir.path().join(FIDELITY_JSON), "{").unwrap();
        let e = read(dir.path()).unwrap_err().to_string();
        assert!(e.contains(FIDELITY_JSON), "{e}");
    }

    #[test]
    fn the_story_compares_each_nodes_events_in_order() {
        let ev = |kind, node: &str| EventRow::new(1.0, kind).node(node.to_string());
        let rows = vec![row(0, "a", 1.0, 2.0)];
        let sim = run(rows.clone(), vec![ev(EventKind::Crash, "a"), ev(EventKind::Evict, "a")]);
        let same = run(
            rows.clone(),
            vec![ev(EventKind::Crash, "a"), ev(EventKind::Evict, "a"), ev(EventKind::Epoch, "a")],
        );
        assert!(compare(&sim, &same).story_differences.is_empty(), "epochs are not the story");
        let other = run(rows, vec![ev(EventKind::Crash, "a")]);
        let d = compare(&sim, &other).story_differences;
        assert_eq!(d, vec!["a: crash evict (sim) against crash (real)".to_string()]);
    }
}
