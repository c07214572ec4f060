//! `loco plan SWEEP`: replays a scenario over a grid of settings and answers "which is the
//! cheapest setting that meets the target?".
//!
//! A sweep file names a scenario, fixed overrides (`[set]`), axes (`[[axis]]`: a scenario field
//! by its dotted path, e.g. `diloco.inner_steps`, `nodes.0.count`, `failures.0.mtbf`, and the
//! values it takes), a target (`[target] utilization = 0.9`) and what "cheap" means (`cost`:
//! the bytes each node sends per hour, or the simulated time per token). Every combination of
//! the axes' values is a setting: the scenario text with those values written in, validated as
//! any scenario file is, and replayed, the settings in parallel over the cores. The report:
//! a table of every setting (utilisation, time per token, bytes per node, all-reduce time), the
//! settings on the frontier (none other is both cheaper and busier), the cheapest that meets the
//! target, and a plot of utilisation against cost with the frontier and the target. With `cost =
//! "order"` the answer is the first setting in the grid that meets the target: the axes list
//! their values from the most wanted (a smaller H, a more precise codec), which the simulator
//! does not price.

use crate::InputError;
use anyhow::{Context, Result, anyhow};
use loco_core::scenario::{ExecutorKind, Scenario};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Settings a sweep may have: a bound on a typo's cost.
pub(crate) const MAX_SETTINGS: usize = 4096;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSweep {
    scenario: Option<String>,
    #[serde(default)]
    set: BTreeMap<String, toml::Value>,
    #[serde(default)]
    axis: Vec<RawAxis>,
    target: Option<RawTarget>,
    cost: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAxis {
    field: Option<String>,
    values: Option<Vec<toml::Value>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTarget {
    utilization: Option<f64>,
}

/// What "cheapest" minimises.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Cost {
    /// Bytes each node sends per simulated hour (the links a run needs).
    BytesPerNodeHour,
    /// Simulated seconds per token trained (the run's length).
    SecondsPerToken,
    /// The grid's order: the first setting that meets the target, the axes' values listed from
    /// the most wanted (a smaller H, a more precise codec: what the simulator does not price).
    Order,
}

impl Cost {
    const ALL: [(&'static str, Cost); 3] = [
        ("bytes_per_node_hour", Cost::BytesPerNodeHour),
        ("seconds_per_token", Cost::SecondsPerToken),
        ("order", Cost::Order),
    ];

    fn name(self) -> &'static str {
        Cost::ALL.iter().find(|(_, c)| *c == self).map_or("?", |(n, _)| n)
    }
}

/// A sweep, read and checked.
#[derive(Debug)]
pub(crate) struct Sweep {
    /// The sweep file.
    pub(crate) file: PathBuf,
    /// The scenario file (relative paths are the sweep file's).
    pub(crate) scenario: PathBuf,
    /// Every setting (`field = value` of each axis, in the grid's order: the first axis
    /// slowest) with its scenario, validated.
    pub(crate) settings: Vec<(Vec<(String, toml::Value)>, Scenario)>,
    /// The utilisation to meet (loco's definition).
    pub(crate) target: f64,
    /// What cheapest means.
    pub(crate) cost: Cost,
}

/// One setting's figures.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Point {
    /// `field = value` of each axis.
    pub(crate) setting: Vec<(String, String)>,
    /// Utilisation, loco's definition.
    pub(crate) utilization: f64,
    /// Utilisation, Table 2's definition.
    pub(crate) table2_utilization: f64,
    /// Simulated seconds per token trained (infinite without tokens).
    pub(crate) seconds_per_token: f64,
    /// Bytes each node sent per simulated hour, on average.
    pub(crate) bytes_per_node_hour: f64,
    /// Median all-reduce seconds.
    pub(crate) allreduce_median_s: f64,
    /// Outer steps done.
    pub(crate) outer_steps: u64,
    /// Simulated seconds.
    pub(crate) simulated_seconds: f64,
    /// Whether the run's invariants held.
    pub(crate) invariants_ok: bool,
    /// Whether no other setting is both cheaper and busier.
    pub(crate) frontier: bool,
    /// Its place in the grid's order.
    pub(crate) index: usize,
}

impl Point {
    fn cost(&self, c: Cost) -> f64 {
        match c {
            Cost::BytesPerNodeHour => self.bytes_per_node_hour,
            Cost::SecondsPerToken => self.seconds_per_token,
            Cost::Order => self.index as f64,
        }
    }

    fn label(&self) -> String {
        self.setting.iter().map(|(f, v)| format!("{f} = {v}")).collect::<Vec<_>>().join(", ")
    }
}

/// What `loco plan` found.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct PlanReport {
    /// The sweep file.
    pub(crate) sweep: String,
    /// The scenario.
    pub(crate) scenario: String,
    /// The target utilisation.
    pub(crate) target_utilization: f64,
    /// What cheapest means.
    pub(crate) cost: Cost,
    /// Every setting, in grid order.
    pub(crate) points: Vec<Point>,
    /// The index of the cheapest setting that meets the target, if any.
    pub(crate) cheapest: Option<usize>,
    /// Wall seconds the sweep took.
    pub(crate) wall_seconds: f64,
}

fn bad(file: &Path, field: &str, expected: impl std::fmt::Display) -> anyhow::Error {
    InputError(anyhow!("{}: {field}: expected {expected}", file.display())).into()
}

impl Sweep {
    /// Reads and checks a sweep file (and reads its scenario's text).
    pub(crate) fn load(file: &Path) -> Result<Sweep> {
        let src = std::fs::read_to_string(file)
            .map_err(|e| InputError(anyhow!("{}: cannot read the file: {e}", file.display())))?;
        let raw: RawSweep = toml::from_str(&src)
            .map_err(|e| InputError(anyhow!("{}: {}", file.display(), e.message())))?;
        let scenario =
            raw.scenario.ok_or_else(|| bad(file, "scenario", "the scenario file to sweep"))?;
        let scenario = file.parent().unwrap_or(Path::new(".")).join(scenario);
        let text = std::fs::read_to_string(&scenario).map_err(|e| {
            InputError(anyhow!(
                "{}: scenario: cannot read {}: {e}",
                file.display(),
                scenario.display()
            ))
        })?;
        let mut axes = Vec::new();
        let mut settings = 1usize;
        for (i, a) in raw.axis.into_iter().enumerate() {
            let field = a.field.ok_or_else(|| {
                bad(
                    file,
                    &format!("axis[{i}].field"),
                    "a scenario field, like \"diloco.inner_steps\"",
                )
            })?;
            let values = a.values.unwrap_or_default();
            if values.is_empty() {
                return Err(bad(file, &format!("axis[{i}].values"), "at least one value"));
            }
            settings = settings.saturating_mul(values.len());
            axes.push((field, values));
        }
        if axes.is_empty() {
            return Err(bad(file, "axis", "at least one [[axis]] (field and values)"));
        }
        if settings > MAX_SETTINGS {
            return Err(bad(
                file,
                "axis",
                format!("at most {MAX_SETTINGS} settings in all, not {settings}"),
            ));
        }
        let target = raw.target.and_then(|t| t.utilization).unwrap_or(0.9);
        if !(target.is_finite() && (0.0..=1.0).contains(&target)) {
            return Err(bad(
                file,
                "target.utilization",
                format!("a fraction in [0, 1], not {target}"),
            ));
        }
        let cost = match raw.cost.as_deref() {
            None => Cost::BytesPerNodeHour,
            Some(c) => {
                Cost::ALL.iter().find(|(n, _)| *n == c).map(|(_, c)| *c).ok_or_else(|| {
                    bad(
                        file,
                        "cost",
                        format!("one of {}, not {c:?}", Cost::ALL.map(|(n, _)| n).join(", ")),
                    )
                })?
            }
        };
        // Every setting must make a valid scenario: checked before anything runs.
        let set: Vec<(String, toml::Value)> = raw.set.into_iter().collect();
        let settings = grid(&axes)
            .into_iter()
            .map(|setting| {
                let s = scenario_of(file, &scenario, &text, &set, &setting)?;
                Ok((setting, s))
            })
            .collect::<Result<_>>()?;
        Ok(Sweep { file: file.to_path_buf(), scenario, settings, target, cost })
    }
}

/// Every combination of the axes' values, the first axis slowest.
fn grid(axes: &[(String, Vec<toml::Value>)]) -> Vec<Vec<(String, toml::Value)>> {
    let mut out: Vec<Vec<(String, toml::Value)>> = vec![Vec::new()];
    for (field, values) in axes {
        out = out
            .into_iter()
            .flat_map(|s| {
                values.iter().map(move |v| {
                    let mut s = s.clone();
                    s.push((field.clone(), v.clone()));
                    s
                })
            })
            .collect();
    }
    out
}

/// The scenario of one setting of sweep `file`: the fixed overrides `set`, then the setting's
/// values, written into the text of `scenario` and validated.
fn scenario_of(
    file: &Path,
    scenario: &Path,
    text: &str,
    set: &[(String, toml::Value)],
    setting: &[(String, toml::Value)],
) -> Result<Scenario> {
    let mut doc: toml_edit::DocumentMut =
        text.parse().map_err(|e| InputError(anyhow!("{}: {e}", scenario.display())))?;
    for (field, value) in set.iter().chain(setting) {
        set_path(&mut doc, field, value).map_err(|e| {
            InputError(anyhow!("{}: setting {field} = {value}: {e}", file.display()))
        })?;
    }
    let label: Vec<String> = setting.iter().map(|(f, v)| format!("{f} = {v}")).collect();
    let name = format!("{} with {}", scenario.display(), label.join(", "));
    Scenario::from_toml_str(&doc.to_string(), &name).map_err(|e| {
        InputError(anyhow!("{}: a setting gives no valid scenario: {e}", file.display())).into()
    })
}

/// Writes `value` at the dotted `path` of `doc`: table keys, and indices into arrays of tables
/// (`nodes.0.count`). A key that is absent is added (the scenario's own checks then say whether
/// it exists).
fn set_path(
    doc: &mut toml_edit::DocumentMut,
    path: &str,
    value: &toml::Value,
) -> Result<(), String> {
    let segs: Vec<&str> = path.split('.').collect();
    if segs.iter().any(|s| s.is_empty()) {
        return Err("expected a dotted path like diloco.inner_steps".into());
    }
    let v: toml_edit::Value = value.to_string().parse().map_err(|e| format!("{e}"))?;
    let mut table: &mut toml_edit::Table = doc.as_table_mut();
    let mut k = 0;
    while k + 1 < segs.len() {
        let seg = segs[k];
        match segs[k + 1].parse::<usize>() {
            Ok(i) => {
                let aot = table
                    .get_mut(seg)
                    .and_then(toml_edit::Item::as_array_of_tables_mut)
                    .ok_or_else(|| format!("{seg} is not a list of [[{seg}]] tables"))?;
                let len = aot.len();
                table = aot.get_mut(i).ok_or_else(|| format!("{seg} has {len} entries, no {i}"))?;
                k += 2;
            }
            Err(_) => {
                table = table
                    .entry(seg)
                    .or_insert_with(toml_edit::table)
                    .as_table_mut()
                    .ok_or_else(|| format!("{seg} is not a table"))?;
                k += 1;
            }
        }
    }
    match segs.get(k) {
        Some(last) if k + 1 == segs.len() => {
            table.insert(last, toml_edit::Item::Value(v));
            Ok(())
        }
        _ => Err("expected a field after the index".into()),
    }
}

/// Replays every setting, `jobs` at a time, calling `progress(done, total)` as they finish.
pub(crate) fn run(
    sweep: &Sweep,
    jobs: usize,
    mut progress: impl FnMut(usize, usize),
) -> Result<PlanReport> {
    let settings = &sweep.settings;
    let total = settings.len();
    #[allow(clippy::disallowed_methods)] // the sweep's wall time, reported, never simulated
    let t0 = std::time::Instant::now();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: std::sync::Mutex<Vec<Option<Result<Point, String>>>> =
        std::sync::Mutex::new(vec![None; total]);
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|scope| {
        for _ in 0..jobs.clamp(1, total.max(1)) {
            let tx = tx.clone();
            let (next, results) = (&next, &results);
            scope.spawn(move || {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some((setting, s)) = settings.get(i) else { break };
                    // A sweep replays many settings: on the event executor, unless the
                    // scenario or the sweep names one (the answers agree; it is tens of times
                    // faster).
                    let executor = s.sim().executor.unwrap_or(ExecutorKind::Events);
                    let opts = loco_sim::ReplayOptions {
                        executor: Some(executor),
                        ..loco_sim::ReplayOptions::default()
                    };
                    let r = loco_sim::replay(s, opts)
                        .map(|out| point(i, setting, &out.summary))
                        .map_err(|e| e.to_string());
                    if let Ok(mut v) = results.lock() {
                        v[i] = Some(r);
                    }
                    let _ = tx.send(());
                }
            });
        }
        drop(tx);
        let mut done = 0;
        while rx.recv().is_ok() {
            done += 1;
            progress(done, total);
        }
    });
    let results = results.into_inner().map_err(|_| anyhow!("a replay thread panicked"))?;
    let mut points = Vec::with_capacity(total);
    for (i, r) in results.into_iter().enumerate() {
        let r = r.ok_or_else(|| anyhow!("setting {i} did not run"))?;
        points.push(r.map_err(|e| anyhow!(e)).with_context(|| format!("setting {i}"))?);
    }
    mark_frontier(&mut points, sweep.cost);
    let cheapest = cheapest(&points, sweep.cost, sweep.target);
    Ok(PlanReport {
        sweep: sweep.file.display().to_string(),
        scenario: sweep.scenario.display().to_string(),
        target_utilization: sweep.target,
        cost: sweep.cost,
        points,
        cheapest,
        wall_seconds: t0.elapsed().as_secs_f64(),
    })
}

fn point(
    index: usize,
    setting: &[(String, toml::Value)],
    s: &loco_core::metrics::Summary,
) -> Point {
    let hours = s.simulated_seconds / 3600.0;
    let nodes = s.utilization.per_node.len().max(1) as f64;
    let tokens = s.tokens_per_second.unwrap_or(0.0) * s.simulated_seconds;
    Point {
        setting: setting.iter().map(|(f, v)| (f.clone(), v.to_string())).collect(),
        utilization: s.utilization.mean,
        table2_utilization: s.utilization.table2,
        seconds_per_token: if tokens > 0.0 { s.simulated_seconds / tokens } else { f64::INFINITY },
        bytes_per_node_hour: if hours > 0.0 {
            s.bytes_sent_total as f64 / nodes / hours
        } else {
            0.0
        },
        allreduce_median_s: s.allreduce_seconds.median,
        outer_steps: s.outer_steps,
        simulated_seconds: s.simulated_seconds,
        invariants_ok: s.invariants.ok,
        frontier: false,
        index,
    }
}

/// Marks the settings no other beats on both cost (lower) and utilisation (higher).
pub(crate) fn mark_frontier(points: &mut [Point], cost: Cost) {
    let n = points.len();
    for i in 0..n {
        let (ci, ui) = (points[i].cost(cost), points[i].utilization);
        let beaten = (0..n).any(|j| {
            let (cj, uj) = (points[j].cost(cost), points[j].utilization);
            j != i && cj <= ci && uj >= ui && (cj < ci || uj > ui)
        });
        points[i].frontier = !beaten;
    }
}

/// The cheapest setting whose utilisation meets `target` (its invariants held); among equal
/// costs, the busier; then the first in grid order.
pub(crate) fn cheapest(points: &[Point], cost: Cost, target: f64) -> Option<usize> {
    points
        .iter()
        .enumerate()
        .filter(|(_, p)| p.invariants_ok && p.utilization >= target)
        .min_by(|(i, a), (j, b)| {
            a.cost(cost)
                .total_cmp(&b.cost(cost))
                .then(b.utilization.total_cmp(&a.utilization))
                .then(i.cmp(j))
        })
        .map(|(i, _)| i)
}

fn gb(bytes: f64) -> String {
    format!("{:.2} GB", bytes / 1e9)
}

impl PlanReport {
    /// The answer, in a sentence.
    pub(crate) fn answer(&self) -> String {
        let t = self.target_utilization * 100.0;
        match self.cheapest {
            Some(i) => {
                let p = &self.points[i];
                format!(
                    "the cheapest setting ({}) with utilisation >= {t:.0}%: {} ({:.1}%, {} per node per hour, {:.3e} s per token)",
                    self.cost.name(),
                    p.label(),
                    p.utilization * 100.0,
                    gb(p.bytes_per_node_hour),
                    p.seconds_per_token
                )
            }
            None => {
                let best =
                    self.points.iter().max_by(|a, b| a.utilization.total_cmp(&b.utilization));
                match best {
                    Some(p) => format!(
                        "no setting reaches utilisation {t:.0}%; the busiest: {} ({:.1}%)",
                        p.label(),
                        p.utilization * 100.0
                    ),
                    None => "no setting ran".to_owned(),
                }
            }
        }
    }

    /// The table printed on the terminal.
    pub(crate) fn print_table(&self, out: &mut impl std::io::Write) -> std::io::Result<()> {
        writeln!(
            out,
            "{} settings of {} in {:.1} s",
            self.points.len(),
            self.scenario,
            self.wall_seconds
        )?;
        writeln!(
            out,
            "{:>6} {:>7} {:>16} {:>13} {:>11}  setting",
            "util", "table2", "GB/node/hour", "s/token", "all-reduce"
        )?;
        for (i, p) in self.points.iter().enumerate() {
            let mark = match (Some(i) == self.cheapest, p.frontier) {
                (true, _) => " <- cheapest meeting the target",
                (false, true) => " (frontier)",
                _ => "",
            };
            writeln!(
                out,
                "{:>5.1}% {:>6.1}% {:>16.3} {:>13.3e} {:>10.2}s  {}{}{mark}",
                p.utilization * 100.0,
                p.table2_utilization * 100.0,
                p.bytes_per_node_hour / 1e9,
                p.seconds_per_token,
                p.allreduce_median_s,
                p.label(),
                if p.invariants_ok { "" } else { " [invariants broken]" }
            )?;
        }
        writeln!(out, "{}", self.answer())
    }

    /// `plan.csv`: one row per setting.
    pub(crate) fn csv(&self) -> String {
        let mut out = String::new();
        let fields: Vec<&str> = self
            .points
            .first()
            .map_or(Vec::new(), |p| p.setting.iter().map(|(f, _)| f.as_str()).collect());
        let _ = writeln!(
            out,
            "{},utilization,table2_utilization,seconds_per_token,bytes_per_node_hour,allreduce_median_s,outer_steps,simulated_seconds,invariants_ok,frontier,cheapest",
            fields.join(",")
        );
        for (i, p) in self.points.iter().enumerate() {
            let values: Vec<String> = p.setting.iter().map(|(_, v)| v.replace(',', ";")).collect();
            let _ = writeln!(
                out,
                "{},{},{},{},{},{},{},{},{},{},{}",
                values.join(","),
                p.utilization,
                p.table2_utilization,
                p.seconds_per_token,
                p.bytes_per_node_hour,
                p.allreduce_median_s,
                p.outer_steps,
                p.simulated_seconds,
                p.invariants_ok,
                p.frontier,
                Some(i) == self.cheapest
            );
        }
        out
    }

    /// `plan.svg`: utilisation against cost, the frontier joined, the target as a line, the
    /// answer ringed.
    pub(crate) fn svg(&self) -> String {
        let (w, h, pad) = (760.0, 420.0, 56.0);
        let costs: Vec<f64> =
            self.points.iter().map(|p| p.cost(self.cost)).filter(|c| c.is_finite()).collect();
        let xmax = costs.iter().copied().fold(f64::MIN_POSITIVE, f64::max) * 1.05;
        let x = |c: f64| pad + (c / xmax).clamp(0.0, 1.0) * (w - 2.0 * pad);
        let y = |u: f64| h - pad - u.clamp(0.0, 1.0) * (h - 2.0 * pad);
        let mut body = String::new();
        let mut frontier: Vec<&Point> =
            self.points.iter().filter(|p| p.frontier && p.cost(self.cost).is_finite()).collect();
        frontier.sort_by(|a, b| a.cost(self.cost).total_cmp(&b.cost(self.cost)));
        let line: Vec<String> = frontier
            .iter()
            .map(|p| format!("{:.1},{:.1}", x(p.cost(self.cost)), y(p.utilization)))
            .collect();
        let _ = write!(
            body,
            "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\" points=\"{}\"/>",
            line.join(" ")
        );
        for (i, p) in self.points.iter().enumerate() {
            let c = p.cost(self.cost);
            if !c.is_finite() {
                continue;
            }
            let fill = if p.frontier { "#1f77b4" } else { "#999999" };
            let _ = write!(
                body,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"4\" fill=\"{fill}\"><title>{}</title></circle>",
                x(c),
                y(p.utilization),
                loco_reports::escape_html(&p.label())
            );
            if Some(i) == self.cheapest {
                let _ = write!(
                    body,
                    "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"9\" fill=\"none\" stroke=\"#d62728\" stroke-width=\"2\"/>",
                    x(c),
                    y(p.utilization)
                );
            }
        }
        let ty = y(self.target_utilization);
        let unit = match self.cost {
            Cost::BytesPerNodeHour => format!("{} per node per hour", gb(xmax)),
            Cost::SecondsPerToken => format!("{xmax:.3e} s per token"),
            Cost::Order => format!("place in the grid, {xmax:.0}"),
        };
        format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\">\
             <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\
             <line x1=\"{pad}\" y1=\"{y0}\" x2=\"{x1}\" y2=\"{y0}\" stroke=\"black\"/>\
             <line x1=\"{pad}\" y1=\"{pad}\" x2=\"{pad}\" y2=\"{y0}\" stroke=\"black\"/>\
             <line x1=\"{pad}\" y1=\"{ty:.1}\" x2=\"{x1}\" y2=\"{ty:.1}\" stroke=\"#d62728\" stroke-dasharray=\"6 4\"/>\
             <text x=\"{x1}\" y=\"{tl:.1}\" font-size=\"12\" text-anchor=\"end\" fill=\"#d62728\">target {tp:.0}%</text>\
             <text x=\"{pad}\" y=\"{yt}\" font-size=\"12\">utilisation 100%</text>\
             <text x=\"{x1}\" y=\"{yl}\" font-size=\"12\" text-anchor=\"end\">{cost}: {unit}</text>\
             <text x=\"{pad}\" y=\"{yl}\" font-size=\"12\">0</text>{body}</svg>",
            y0 = h - pad,
            x1 = w - pad,
            yt = pad - 8.0,
            yl = h - pad + 20.0,
            tl = ty - 6.0,
            tp = self.target_utilization * 100.0,
            cost = self.cost.name(),
        )
    }

    /// `plan.html`: the answer, the plot and the table.
    pub(crate) fn html(&self) -> String {
        let mut table = Vec::new();
        let _ = self.print_table(&mut table);
        format!(
            "<!doctype html><html><head><meta charset=\"utf-8\"><title>loco plan: {sc}</title></head>\
             <body><h1>loco plan: {sc}</h1><p>{ans}</p><h2>Utilisation against {cost} (blue: the frontier; ringed: the answer)</h2>{svg}<h2>Every setting</h2><pre>{tab}</pre></body></html>\n",
            sc = loco_reports::escape_html(&self.scenario),
            ans = loco_reports::escape_html(&self.answer()),
            cost = self.cost.name(),
            svg = self.svg(),
            tab = loco_reports::escape_html(&String::from_utf8_lossy(&table)),
        )
    }
}

/// `loco plan`: loads the sweep, runs it with a progress bar, writes plan.{csv,json,svg,html}
/// into `out`, and returns the report.
pub(crate) fn command(a: &crate::cli::PlanArgs) -> Result<PlanReport> {
    let sweep = Sweep::load(&a.sweep)?;
    let stem = a.sweep.file_stem().and_then(|s| s.to_str()).unwrap_or("plan").to_owned();
    let out = a.out.clone().unwrap_or_else(|| PathBuf::from("out").join(format!("plan-{stem}")));
    let jobs =
        a.jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let total = sweep.settings.len();
    let bar = indicatif::ProgressBar::new(total as u64).with_style(
        indicatif::ProgressStyle::with_template(
            "plan [{bar:30}] {pos}/{len} settings, {elapsed}, about {eta} left",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    let report = run(&sweep, jobs, |done, _| bar.set_position(done as u64))?;
    bar.finish_and_clear();
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let json = serde_json::to_string_pretty(&report)? + "\n";
    for (name, bytes) in [
        ("plan.csv", report.csv().into_bytes()),
        ("plan.json", json.into_bytes()),
        ("plan.svg", report.svg().into_bytes()),
        ("plan.html", report.html().into_bytes()),
    ] {
        crate::real_cmd::write_atomic(&out.join(name), &bytes)?;
    }
    eprintln!("report: {}", out.join("plan.html").display());
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(u: f64, bytes: f64) -> Point {
        Point {
            setting: vec![("x".into(), format!("{u}"))],
            utilization: u,
            table2_utilization: u,
            seconds_per_token: 1.0,
            bytes_per_node_hour: bytes,
            allreduce_median_s: 1.0,
            outer_steps: 1,
            simulated_seconds: 1.0,
            invariants_ok: true,
            frontier: false,
            index: 0,
        }
    }

    #[test]
    fn frontier_and_cheapest_by_hand() {
        let mut pts =
            vec![p(0.95, 30.0), p(0.91, 10.0), p(0.80, 5.0), p(0.85, 20.0), p(0.91, 12.0)];
        mark_frontier(&mut pts, Cost::BytesPerNodeHour);
        let f: Vec<bool> = pts.iter().map(|p| p.frontier).collect();
        // (0.85, 20) is beaten by (0.91, 10); (0.91, 12) by (0.91, 10).
        assert_eq!(f, vec![true, true, true, false, false]);
        assert_eq!(cheapest(&pts, Cost::BytesPerNodeHour, 0.9), Some(1));
        assert_eq!(cheapest(&pts, Cost::BytesPerNodeHour, 0.96), None);
        pts[1].invariants_ok = false;
        assert_eq!(cheapest(&pts, Cost::BytesPerNodeHour, 0.9), Some(4));
    }

    #[test]
    fn paths_set_tables_and_arrays_of_tables() {
        let mut doc: toml_edit::DocumentMut =
            "a = 1\n[diloco]\ninner_steps = 5\n[[nodes]]\nname = \"x\"\n[[nodes]]\nname = \"y\"\n"
                .parse()
                .unwrap();
        set_path(&mut doc, "diloco.inner_steps", &toml::Value::Integer(50)).unwrap();
        set_path(&mut doc, "nodes.1.count", &toml::Value::Integer(3)).unwrap();
        set_path(&mut doc, "stop.time", &toml::Value::String("2h".into())).unwrap();
        let text = doc.to_string();
        assert!(text.contains("inner_steps = 50"), "{text}");
        assert!(text.contains("name = \"y\"\ncount = 3"), "{text}");
        assert!(text.contains("[stop]\ntime = \"2h\""), "{text}");
        assert!(
            set_path(&mut doc, "nodes.2.count", &toml::Value::Integer(1))
                .unwrap_err()
                .contains("2 entries")
        );
        assert!(
            set_path(&mut doc, "a.b", &toml::Value::Integer(1))
                .unwrap_err()
                .contains("not a table")
        );
        assert!(set_path(&mut doc, "diloco..x", &toml::Value::Integer(1)).is_err());
        assert!(set_path(&mut doc, "nodes.0", &toml::Value::Integer(1)).is_err());
    }
}
