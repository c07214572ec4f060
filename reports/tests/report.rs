//! End-to-end tests of the reports crate: synthetic runs written with `write_run`, then the files
//! checked as a reader would (PNG decoded, SVG and HTML parsed as XML, numbers compared).

use loco_core::digest::WeightsDigest;
use loco_core::metrics::{
    EventKind, EventRow, MfuBasis, OuterStepRow, RunMeta, Summary, summarize,
};
use loco_reports::{
    ALLREDUCE_TIMES_CSV, COMPARISON_CSV, PLOT_NAMES, REPORT_HTML, ReportError,
    UTILIZATION_BY_NODE_CSV, escape_html, read_run, render, render_into, write_run,
};
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

const STEPS: u64 = 10;

/// 4 nodes for 10 outer steps of 100 s compute; n2 crashes during step 4 and is evicted at its
/// end; n4 asks to join during step 5, is admitted at step 6, recovers (weight 0) and contributes
/// from step 7. Losses fall; each node processes 1000 tokens per step it computes.
fn synthetic() -> (Vec<OuterStepRow>, Vec<EventRow>) {
    let mut rows = Vec::new();
    let mut events = vec![EventRow::new(0.0, EventKind::Start)];
    for n in 0..4 {
        events.push(EventRow::new(0.0, EventKind::Start).node(format!("n{n}")).epoch(1));
    }
    events.push(EventRow::new(0.0, EventKind::Epoch).epoch(1));
    let mut epoch = 1;
    let mut t = 0.0;
    for step in 0..STEPS {
        let members: Vec<u32> = match step {
            0..=4 => vec![0, 1, 2, 3],
            5 => vec![0, 1, 3],
            _ => vec![0, 1, 3, 4],
        };
        if step == 5 {
            epoch += 1;
            events.push(EventRow::new(t + 1.0, EventKind::Epoch).epoch(epoch));
            events.push(EventRow::new(t + 50.0, EventKind::JoinRequest).node("n4"));
        }
        if step == 6 {
            epoch += 1;
            events.push(EventRow::new(t, EventKind::Admit).node("n4").epoch(epoch));
            events.push(EventRow::new(t, EventKind::Epoch).epoch(epoch));
            events.push(EventRow::new(t, EventKind::RecoveryStart).node("n4"));
            events.push(EventRow::new(t + 100.0, EventKind::RecoveryDone).node("n4"));
            events.push(EventRow::new(t + 100.0, EventKind::Join).node("n4").epoch(epoch));
        }
        let world = members.len() as u32;
        let allreduce = 10.0 + step as f64 + if step == 4 { 20.0 } else { 0.0 };
        let mut end = t;
        for &n in &members {
            let recovering = step == 6 && n == 4;
            let compute = if recovering { 0.0 } else { 100.0 };
            let recovery = if recovering { 100.0 } else { 0.0 };
            let barrier = f64::from(n) * 0.5;
            let checkpoint = if step == 9 { 3.0 } else { 0.0 };
            let idle = 0.25;
            let wall = compute + recovery + barrier + allreduce + checkpoint + idle;
            end = f64::max(end, t + wall);
            rows.push(OuterStepRow {
                outer_step: step,
                node: format!("n{n}"),
                node_id: n,
                epoch,
                world,
                start_s: t,
                end_s: t + wall,
                compute_s: compute,
                allreduce_s: allreduce,
                barrier_s: barrier,
                recovery_s: recovery,
                checkpoint_s: checkpoint,
                outer_s: 0.0,
                idle_s: idle,
                bytes_sent: 1_000_000 * u64::from(world - 1)
                    + if recovering { 5_000_000 } else { 0 },
                retries: u32::from(step == 4),
                tokens: if recovering { 0 } else { 1000 },
                loss: (!recovering).then(|| 4.0 - 0.25 * step as f64 + 0.01 * f64::from(n)),
                weights_hash: Some(WeightsDigest::from_bytes((step * 7919).to_be_bytes())),
                weight: if recovering { 0.0 } else { 1.0 },
                allreduce_wall_s: 0.0,
                eval_loss: None,
            });
        }
        if step == 4 {
            events.push(EventRow::new(t + 60.0, EventKind::Crash).node("n2").detail("SIGKILL"));
            events.push(EventRow::new(t + 70.0, EventKind::AllreduceFailed).epoch(epoch));
            events.push(
                EventRow::new(t + 70.0, EventKind::Evict)
                    .node("n2")
                    .detail("heartbeat timeout, 6 s"),
            );
            events.push(EventRow::new(t + 71.0, EventKind::Retry).epoch(epoch + 1));
        }
        t = end;
    }
    events.push(EventRow::new(t, EventKind::Stop));
    (rows, events)
}

fn meta(scenario: &str) -> RunMeta {
    RunMeta {
        scenario: scenario.into(),
        seed: 42,
        backend: "sim".into(),
        wall_seconds: 0.0,
        published: Some("usa".into()),
        inner_steps_per_outer: Some(100),
        mfu_basis: Some(MfuBasis {
            flops_per_token: 6.0e10,
            peak_flops_per_gpu: 1.0e12,
            gpus_per_node: 8,
        }),
        violations: Vec::new(),
        diloco: Default::default(),
        extra: BTreeMap::from([("link_model".to_owned(), serde_json::json!("fair-share"))]),
    }
}

fn write_synthetic(dir: &Path, scenario: &str) -> Summary {
    let (rows, events) = synthetic();
    let summary = summarize(&meta(scenario), &rows, &events);
    write_run(dir, &summary, &rows, &events).unwrap();
    summary
}

/// Every file in `dir`, by name.
fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.file_name().to_string_lossy().into_owned(), fs::read(e.path()).unwrap())
        })
        .collect()
}

#[test]
fn writes_every_file_and_no_temporary_one() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    write_synthetic(&dir, "churn");
    let files = snapshot(&dir);
    let mut expected = vec![
        "summary.json".to_owned(),
        "outer_steps.csv".to_owned(),
        "events.csv".to_owned(),
        REPORT_HTML.to_owned(),
        UTILIZATION_BY_NODE_CSV.to_owned(),
        ALLREDUCE_TIMES_CSV.to_owned(),
        "outer_step_totals.csv".to_owned(),
    ];
    for p in PLOT_NAMES {
        expected.push(format!("{p}.svg"));
        expected.push(format!("{p}.png"));
    }
    expected.sort();
    assert_eq!(files.keys().cloned().collect::<Vec<_>>(), expected);
    assert!(files.keys().all(|k| !k.starts_with('.')));
    // The metrics files read back as written.
    let run = read_run(&dir).unwrap();
    let (rows, events) = synthetic();
    assert_eq!(run.rows.len(), rows.len());
    assert_eq!(run.events.len(), events.len());
    assert_eq!(run.summary, summarize(&meta("churn"), &rows, &events));
}

#[test]
fn pngs_decode_to_drawn_images() {
    let tmp = tempfile::tempdir().unwrap();
    write_synthetic(tmp.path(), "churn");
    for name in PLOT_NAMES {
        let bytes = fs::read(tmp.path().join(format!("{name}.png"))).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{name}");
        assert!(bytes.len() > 5_000, "{name}: only {} bytes", bytes.len());
        let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).unwrap();
        assert_eq!((info.width, info.height), (loco_reports::WIDTH, loco_reports::HEIGHT));
        let pixels = &buf[..info.buffer_size()];
        let white = pixels.chunks(3).filter(|p| p == &[255, 255, 255]).count();
        let total = pixels.len() / 3;
        // Mostly white background, but a few percent of the pixels drawn (axes, text, data).
        assert!(white < total * 98 / 100, "{name}: {white} of {total} pixels white");
        assert!(white > total / 4, "{name}: {white} of {total} pixels white");
        // Coloured data, not only black text and grey axes.
        assert!(pixels.chunks(3).any(|p| p[0].abs_diff(p[2]) > 60), "{name}: no colour");
    }
}

#[test]
fn svgs_are_well_formed_with_titles_and_data() {
    let tmp = tempfile::tempdir().unwrap();
    write_synthetic(tmp.path(), "churn");
    let titles = [
        ("active_nodes", "Active nodes"),
        ("time_by_node", "Where each node's time went"),
        ("time_by_step", "Time per outer step (mean over nodes)"),
        ("timeline", "Compute and all-reduce per node"),
        ("bandwidth", "Send rate per node: peak 4 Mbit/s, mean 206 kbit/s (19.4x)"),
        ("allreduce_hist", "All-reduce time distribution"),
        ("bytes_per_step", "Bytes sent per outer step (all nodes)"),
        ("loss", "Loss"),
    ];
    for (name, title) in titles {
        let text = fs::read_to_string(tmp.path().join(format!("{name}.svg"))).unwrap();
        let doc = roxmltree::Document::parse(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        let root = doc.root_element();
        assert_eq!(root.tag_name().name(), "svg");
        assert_eq!(root.attribute("width"), Some("960"));
        let texts: Vec<String> = doc
            .descendants()
            .filter(|n| n.has_tag_name("text"))
            .map(|n| n.text().unwrap_or("").trim().to_owned())
            .collect();
        assert!(texts.iter().any(|t| t == title), "{name}: no title in {texts:?}");
        let shapes = doc
            .descendants()
            .filter(|n| n.has_tag_name("rect") || n.has_tag_name("polyline"))
            .count();
        assert!(shapes > 5, "{name}: {shapes} shapes");
    }
    // The node names label the per-node breakdown, and the legend names every part.
    let by_node = fs::read_to_string(tmp.path().join("time_by_node.svg")).unwrap();
    for label in ["n0", "n4", "compute", "allreduce", "barrier", "recovery", "checkpoint", "idle"] {
        assert!(by_node.contains(&format!(">\n{label}\n<")), "no {label}");
    }
    let active = fs::read_to_string(tmp.path().join("active_nodes.svg")).unwrap();
    for label in ["join", "crash", "eviction"] {
        assert!(active.contains(&format!(">\n{label}\n<")), "no {label} in the legend");
    }
}

/// report.html parsed as XML (it starts with `<!DOCTYPE html>`).
fn parse_html(text: &str) -> roxmltree::Document<'_> {
    let opt = roxmltree::ParsingOptions { allow_dtd: true, ..roxmltree::ParsingOptions::default() };
    roxmltree::Document::parse_with_options(text, opt).unwrap()
}

/// The `data-value` numbers of the run row of the Table-2 table, by field.
fn table2_values(html: &str, class: &str) -> Vec<BTreeMap<String, Option<f64>>> {
    let doc = parse_html(html);
    let table = doc
        .descendants()
        .find(|n| n.has_tag_name("table") && n.attribute("id") == Some("table2"))
        .expect("a table2 table");
    table
        .descendants()
        .filter(|n| n.has_tag_name("tr") && n.attribute("class") == Some(class))
        .map(|tr| {
            tr.children()
                .filter_map(|td| {
                    let field = td.attribute("data-field")?;
                    Some((field.to_owned(), td.attribute("data-value").map(|v| v.parse().unwrap())))
                })
                .collect()
        })
        .collect()
}

#[test]
fn report_html_holds_the_table_the_numbers_and_the_plots() {
    let tmp = tempfile::tempdir().unwrap();
    write_synthetic(tmp.path(), "churn <&> \"quoted\"");
    let html = fs::read_to_string(tmp.path().join(REPORT_HTML)).unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(tmp.path().join("summary.json")).unwrap())
            .unwrap();
    let get = |path: &str| path.split('.').fold(&json, |v, k| &v[k]).as_f64();

    let runs = table2_values(&html, "run");
    assert_eq!(runs.len(), 1);
    let row = &runs[0];
    for field in ["allreduce_seconds.median", "utilization.table2", "utilization.mean", "mfu"] {
        let v = row[field].unwrap_or_else(|| panic!("{field} has no value"));
        assert_eq!(Some(v), get(field), "{field}");
    }
    // Sanity of the numbers themselves: utilisation below 1, Table 2's above loco's.
    assert!(row["utilization.mean"].unwrap() < row["utilization.table2"].unwrap());
    assert!(row["utilization.table2"].unwrap() < 1.0);
    let published = table2_values(&html, "published");
    assert_eq!(published.len(), 1);
    assert_eq!(published[0]["allreduce_seconds.median"], Some(103.0));
    assert_eq!(published[0]["utilization.table2"], Some(0.957));
    assert_eq!(published[0]["mfu"], Some(0.414));

    let doc = parse_html(&html);
    // Every summary number the page shows equals summary.json's.
    let mut checked = 0;
    for tr in doc.descendants().filter(|n| n.has_tag_name("tr")) {
        let Some(key) = tr.attribute("data-key") else { continue };
        let Some(td) = tr.children().find(|c| c.attribute("data-value").is_some()) else {
            continue;
        };
        let shown: f64 = td.attribute("data-value").unwrap().parse().unwrap();
        assert_eq!(Some(shown), get(key), "{key}");
        checked += 1;
    }
    assert!(checked >= 20, "only {checked} numbers checked");
    // The scenario's name is escaped, in the title and the heading.
    let h1 = doc.descendants().find(|n| n.has_tag_name("h1")).unwrap();
    assert_eq!(h1.text(), Some("loco report: churn <&> \"quoted\""));
    assert!(!html.contains("<&>"));
    assert_eq!(
        doc.descendants().find(|n| n.attribute("id") == Some("backend")).unwrap().text(),
        Some("sim")
    );
    assert_eq!(
        doc.descendants().find(|n| n.attribute("id") == Some("seed")).unwrap().text(),
        Some("42")
    );
    assert!(html.contains("data-invariants=\"ok\""));
    // Every plot is inline, as SVG, and nothing is loaded from elsewhere.
    for name in PLOT_NAMES {
        let fig = doc
            .descendants()
            .find(|n| n.attribute("id") == Some(&format!("plot-{name}")))
            .unwrap_or_else(|| panic!("no figure for {name}"));
        assert!(fig.descendants().any(|n| n.has_tag_name("svg")), "{name}");
    }
    assert!(
        doc.descendants().all(|n| n.attribute("src").is_none() && n.attribute("href").is_none())
    );
    assert!(!html.contains("<script"));
    // The per-node table has one row per node.
    let nodes = doc.descendants().find(|n| n.attribute("id") == Some("nodes")).unwrap();
    assert_eq!(nodes.descendants().filter(|n| n.has_tag_name("tr")).count(), 1 + 5);
}

#[test]
fn violations_are_listed() {
    let tmp = tempfile::tempdir().unwrap();
    let (rows, events) = synthetic();
    let mut m = meta("bad");
    m.violations = vec!["step 3: n1 weights differ from n0".into(), "<b>epoch</b> mismatch".into()];
    let summary = summarize(&m, &rows, &events);
    write_run(tmp.path(), &summary, &rows, &events).unwrap();
    let html = fs::read_to_string(tmp.path().join(REPORT_HTML)).unwrap();
    let doc = parse_html(&html);
    let items: Vec<&str> = doc
        .descendants()
        .find(|n| n.attribute("id") == Some("violations"))
        .unwrap()
        .children()
        .filter(|n| n.has_tag_name("li"))
        .filter_map(|n| n.text())
        .collect();
    assert_eq!(items, ["step 3: n1 weights differ from n0", "<b>epoch</b> mismatch"]);
    assert!(html.contains("data-invariants=\"failed\""));
}

#[test]
fn rendering_twice_gives_the_same_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a");
    let b = tmp.path().join("b");
    write_synthetic(&a, "churn");
    let first = snapshot(&a);
    render(std::slice::from_ref(&a)).unwrap();
    assert_eq!(snapshot(&a), first);
    // Another directory, rows given in another order: the same bytes again.
    let (mut rows, mut events) = synthetic();
    rows.reverse();
    events.reverse();
    events.sort_by(|x, y| x.time_s.total_cmp(&y.time_s));
    let summary = summarize(&meta("churn"), &rows, &events);
    write_run(&b, &summary, &rows, &events).unwrap();
    let second = snapshot(&b);
    for (name, bytes) in &first {
        if name == "events.csv" {
            continue; // same-time events kept in their given (here different) order
        }
        assert!(second.get(name) == Some(bytes), "{name} differs");
    }
}

#[test]
fn a_corrupted_csv_names_the_file_and_line() {
    let tmp = tempfile::tempdir().unwrap();
    write_synthetic(tmp.path(), "churn");
    let report_before = fs::read(tmp.path().join(REPORT_HTML)).unwrap();
    let path = tmp.path().join("outer_steps.csv");
    let text = fs::read_to_string(&path).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let mut fields: Vec<String> = lines[4].split(',').map(str::to_owned).collect();
    fields[8] = "fast".into(); // allreduce_s
    lines[4] = fields.join(",");
    fs::write(&path, lines.join("\n") + "\n").unwrap();

    let err = render(&[tmp.path().to_path_buf()]).unwrap_err();
    assert!(matches!(err, ReportError::Csv { .. }), "{err:?}");
    assert_eq!(err.line(), Some(5));
    assert!(err.file().unwrap().ends_with("outer_steps.csv"));
    let msg = err.to_string();
    assert!(
        msg.ends_with(
            "outer_steps.csv: line 5: field `allreduce_s`: expected a number, found `fast`"
        ),
        "{msg}"
    );
    // Nothing already written was lost.
    assert_eq!(fs::read(tmp.path().join(REPORT_HTML)).unwrap(), report_before);

    let events = tmp.path().join("events.csv");
    fs::write(&events, "time_s,kind,node,epoch,detail\n0.000000,start,,,\n1.0,teleport,n1,,\n")
        .unwrap();
    fs::write(&path, text).unwrap();
    let err = render(&[tmp.path().to_path_buf()]).unwrap_err();
    assert_eq!(err.line(), Some(3));
    assert!(err.to_string().contains("events.csv: line 3: field `kind`"), "{err}");
}

#[test]
fn a_broken_summary_names_the_file_line_and_field() {
    let tmp = tempfile::tempdir().unwrap();
    write_synthetic(tmp.path(), "churn");
    let path = tmp.path().join("summary.json");
    let text = fs::read_to_string(&path).unwrap().replace("\"seed\": 42", "\"seed\": \"x\"");
    fs::write(&path, text).unwrap();
    let err = render(&[tmp.path().to_path_buf()]).unwrap_err();
    let msg = err.to_string();
    assert_eq!(err.line(), Some(3), "{msg}");
    assert!(msg.contains("summary.json: line 3, column"), "{msg}");
    assert!(msg.ends_with("invalid type: string \"x\", expected u64"), "{msg}");
    fs::remove_file(&path).unwrap();
    let err = render(&[tmp.path().to_path_buf()]).unwrap_err();
    assert!(matches!(err, ReportError::Io { .. }), "{err:?}");
    assert!(err.to_string().contains("summary.json"));
    assert!(matches!(render(&[]), Err(ReportError::NoRuns)));
}

#[test]
fn comparison_of_two_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("usa");
    let b = tmp.path().join("global");
    let sa = write_synthetic(&a, "usa-only");
    let (rows, events) = synthetic();
    let mut m = meta("global");
    m.published = Some("global".into());
    m.backend = "real".into();
    let slow: Vec<OuterStepRow> = rows
        .iter()
        .map(|r| OuterStepRow {
            allreduce_s: r.allreduce_s * 4.0,
            end_s: r.end_s + 3.0 * r.allreduce_s,
            ..r.clone()
        })
        .collect();
    let sb = summarize(&m, &slow, &events);
    write_run(&b, &sb, &slow, &events).unwrap();

    let dirs: Vec<PathBuf> = vec![a.clone(), b.clone()];
    let out = render(&dirs).unwrap();
    assert_eq!(out.reports, vec![a.join(REPORT_HTML), b.join(REPORT_HTML)]);
    let comparison = out.comparison.unwrap();
    assert_eq!(comparison, a.join("comparison.html"));
    let html = fs::read_to_string(&comparison).unwrap();
    let rows2 = table2_values(&html, "run");
    assert_eq!(rows2.len(), 2);
    assert_eq!(rows2[0]["allreduce_seconds.median"], Some(sa.allreduce_seconds.median));
    assert_eq!(rows2[1]["allreduce_seconds.median"], Some(sb.allreduce_seconds.median));
    assert_eq!(rows2[1]["utilization.table2"], Some(sb.utilization.table2));
    assert_eq!(table2_values(&html, "published").len(), 2);
    assert!(!html.contains(tmp.path().to_str().unwrap()), "an absolute path leaked");
    let csv = fs::read_to_string(a.join(COMPARISON_CSV)).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 3);
    assert!(lines[1].starts_with("usa,usa-only,sim,42,usa,"), "{}", lines[1]);
    assert!(lines[2].starts_with("global,global,real,42,global,"), "{}", lines[2]);
    assert!(lines[2].ends_with(",true,global,469.000000,0.830000,0.360000"), "{}", lines[2]);

    // Into a given folder, even for one run.
    let elsewhere = tmp.path().join("cmp");
    let out = render_into(std::slice::from_ref(&b), &elsewhere).unwrap();
    assert_eq!(out.comparison, Some(elsewhere.join("comparison.html")));
    assert!(elsewhere.join(COMPARISON_CSV).exists());
}

#[test]
fn a_run_without_loss_or_allreduce_still_renders() {
    let tmp = tempfile::tempdir().unwrap();
    // First a run with a loss, then the same directory rewritten without: the stale plot goes.
    write_synthetic(tmp.path(), "churn");
    assert!(tmp.path().join("loss.png").exists());
    let rows: Vec<OuterStepRow> = synthetic()
        .0
        .into_iter()
        .filter(|r| r.node == "n0")
        .map(|r| OuterStepRow { loss: None, allreduce_s: 0.0, world: 1, tokens: 0, ..r })
        .collect();
    let summary = summarize(&RunMeta { scenario: "solo".into(), ..RunMeta::default() }, &rows, &[]);
    write_run(tmp.path(), &summary, &rows, &[]).unwrap();
    assert!(!tmp.path().join("loss.png").exists());
    assert!(!tmp.path().join("loss.svg").exists());
    let html = fs::read_to_string(tmp.path().join(REPORT_HTML)).unwrap();
    parse_html(&html);
    assert!(html.contains("no all-reduce in this run"));
    assert!(html.contains("No loss recorded"));
    let row = &table2_values(&html, "run")[0];
    assert_eq!(row["allreduce_seconds.median"], None);
    assert_eq!(row["utilization.table2"], Some(1.0));
    // An empty run (no rows, no events) renders too.
    let empty = tmp.path().join("empty");
    let summary = summarize(&RunMeta::default(), &[], &[]);
    write_run(&empty, &summary, &[], &[]).unwrap();
    assert!(empty.join("active_nodes.png").exists());
}

/// The `<rect>`s of `svg` filled with `fill` (`#RRGGBB`) left of the legend column, as
/// (x, y, width).
fn rects(svg: &str, fill: &str) -> Vec<(f64, f64, f64)> {
    let doc = roxmltree::Document::parse(svg).unwrap();
    let num = |n: &roxmltree::Node, a: &str| n.attribute(a).unwrap().parse::<f64>().unwrap();
    doc.descendants()
        .filter(|n| n.has_tag_name("rect") && n.attribute("fill") == Some(fill))
        .map(|n| (num(&n, "x"), num(&n, "y"), num(&n, "width")))
        .filter(|r| r.0 < f64::from(loco_reports::WIDTH) - 150.0)
        .collect()
}

/// The texts of `svg`, trimmed.
fn svg_texts(svg: &str) -> Vec<String> {
    let doc = roxmltree::Document::parse(svg).unwrap();
    doc.descendants()
        .filter(|n| n.has_tag_name("text"))
        .map(|n| n.text().unwrap_or("").trim().to_owned())
        .collect()
}

const COMPUTE_FILL: &str = "#2CA02C";
const ALLREDUCE_FILL: &str = "#1F77B4";

#[test]
fn the_timeline_has_a_lane_per_node_in_sync_and_overlapped_runs() {
    let tmp = tempfile::tempdir().unwrap();
    // Sync: every all-reduce inside its row (allreduce_wall_s 0 here, as in older files).
    let sync = tmp.path().join("sync");
    write_synthetic(&sync, "churn");
    assert!(sync.join("timeline.png").is_file());
    let svg = fs::read_to_string(sync.join("timeline.svg")).unwrap();
    let nodes = ["n0", "n1", "n2", "n3", "n4"];
    for n in nodes {
        assert!(svg.contains(&format!(">\n{n}\n<")), "no lane label {n}");
    }
    // At least one compute bar in each lane: as many distinct rows of bars as nodes.
    let compute = rects(&svg, COMPUTE_FILL);
    let mut lanes: Vec<i64> = compute.iter().map(|r| r.1.round() as i64).collect();
    lanes.sort_unstable();
    lanes.dedup();
    assert_eq!(lanes.len(), nodes.len(), "{lanes:?}");
    let allreduce = rects(&svg, ALLREDUCE_FILL);
    assert_eq!(allreduce.len(), synthetic().0.len(), "one all-reduce bar per row");
    // Every all-reduce bar sits below a compute bar, in the same lane.
    assert!(allreduce.iter().all(|a| lanes.iter().any(|&y| a.1 > y as f64)));
    assert!(svg_texts(&svg).contains(&"time (min)".to_owned()), "{:?}", svg_texts(&svg));

    // Overlapped: the all-reduce ran beside the next step's compute; the node waited for none.
    let (rows, events) = synthetic();
    let overlapped: Vec<OuterStepRow> = rows
        .iter()
        .map(|r| OuterStepRow {
            allreduce_wall_s: r.allreduce_s,
            allreduce_s: 0.0,
            idle_s: r.idle_s + r.allreduce_s,
            ..r.clone()
        })
        .collect();
    let dir = tmp.path().join("overlap");
    let summary = summarize(&meta("overlap"), &overlapped, &events);
    write_run(&dir, &summary, &overlapped, &events).unwrap();
    let svg = fs::read_to_string(dir.join("timeline.svg")).unwrap();
    let x_desc = "time (min); all-reduce drawn from the row's end (overlapped)";
    assert!(svg_texts(&svg).contains(&x_desc.to_owned()), "{:?}", svg_texts(&svg));
    let mut lanes: Vec<i64> =
        rects(&svg, COMPUTE_FILL).iter().map(|r| r.1.round() as i64).collect();
    lanes.sort_unstable();
    lanes.dedup();
    assert_eq!(lanes.len(), nodes.len());
    assert_eq!(rects(&svg, ALLREDUCE_FILL).len(), overlapped.len());
    let html = fs::read_to_string(dir.join(REPORT_HTML)).unwrap();
    assert!(html.contains("id=\"plot-timeline\""));
    let caption = escape_html("all-reduce from the row's end in overlapped runs");
    assert!(html.contains(&caption));

    // No rows: the plot says so.
    let empty = tmp.path().join("empty");
    write_run(&empty, &summarize(&RunMeta::default(), &[], &[]), &[], &[]).unwrap();
    assert!(empty.join("timeline.png").is_file());
    let svg = fs::read_to_string(empty.join("timeline.svg")).unwrap();
    let texts = svg_texts(&svg);
    assert!(texts.contains(&"Compute and all-reduce per node".to_owned()), "{texts:?}");
    assert!(texts.contains(&"no outer steps recorded".to_owned()), "{texts:?}");
}

/// The live fragment is well-formed, lists the newest events first (escaped), says the
/// invariants wait for the end, and draws the report's plots as inline SVG; the live page holds
/// the script that fills it from the event stream.
#[test]
fn the_live_fragment_holds_the_latest_events_and_the_plots() {
    let (rows, mut events) = synthetic();
    events.push(EventRow::new(999.0, EventKind::Evict).node("n2").detail("<timeout> & \"more\""));
    let summary = summarize(&meta("live"), &rows, &events);
    let run = loco_reports::Run { dir: PathBuf::new(), summary, rows, events };
    let html = loco_reports::live_fragment(&run).unwrap();
    let wrapped = format!("<div>{html}</div>");
    let doc = parse_html(&wrapped);
    let latest = doc
        .descendants()
        .find(|n| n.attribute("id") == Some("latest-events"))
        .expect("a latest-events table");
    let first =
        latest.descendants().find(|n| n.has_tag_name("tr") && n.attribute("data-kind").is_some());
    let first = first.expect("an event row");
    assert_eq!(first.attribute("data-kind"), Some("evict"));
    let text: String = first.descendants().filter_map(|n| n.text()).collect();
    assert!(text.contains("<timeout> & \"more\""), "{text}");
    let rows = latest.descendants().filter(|n| n.attribute("data-kind").is_some()).count();
    assert_eq!(rows, loco_reports::LIVE_LATEST_EVENTS.min(run.events.len()));
    assert!(doc.descendants().any(|n| n.attribute("id") == Some("invariants")));
    let svgs = doc
        .descendants()
        .filter(|n| n.has_tag_name(("http://www.w3.org/2000/svg", "svg")) || n.has_tag_name("svg"))
        .count();
    assert!(svgs >= PLOT_NAMES.len() - 1, "{svgs} plots");
    let page = loco_reports::live_page("loco live: <x>", "/events");
    assert!(page.contains("new EventSource(\"/events\""), "{page}");
    assert!(page.contains("loco live: &lt;x&gt;"), "{page}");
}
