//! Unit tests of the metrics schema, its CSV format and the summary arithmetic.

use super::*;
use crate::digest::WeightsDigest;
use std::collections::BTreeMap;

fn row(step: u64, node: &str, id: u32) -> OuterStepRow {
    OuterStepRow {
        outer_step: step,
        node: node.to_owned(),
        node_id: id,
        epoch: 1,
        world: 2,
        start_s: 0.0,
        end_s: 0.0,
        compute_s: 0.0,
        allreduce_s: 0.0,
        barrier_s: 0.0,
        recovery_s: 0.0,
        checkpoint_s: 0.0,
        outer_s: 0.0,
        idle_s: 0.0,
        bytes_sent: 0,
        retries: 0,
        tokens: 0,
        loss: None,
        weights_hash: None,
        weight: 1.0,
        allreduce_wall_s: 0.0,
        eval_loss: None,
    }
}

/// A row whose wall time is `compute + allreduce + barrier + recovery + idle`, starting at `start`.
fn timed(step: u64, node: &str, id: u32, start: f64, parts: [f64; 5]) -> OuterStepRow {
    let [compute_s, allreduce_s, barrier_s, recovery_s, idle_s] = parts;
    OuterStepRow {
        start_s: start,
        end_s: start + parts.iter().sum::<f64>(),
        compute_s,
        allreduce_s,
        barrier_s,
        recovery_s,
        idle_s,
        ..row(step, node, id)
    }
}

fn awkward_rows() -> Vec<OuterStepRow> {
    vec![
        OuterStepRow {
            start_s: 12345.678901,
            end_s: 99999999.5,
            compute_s: 0.000001,
            allreduce_s: 103.25,
            bytes_sent: u64::MAX,
            retries: 3,
            tokens: 1_048_576,
            loss: Some(2.468135),
            weights_hash: Some("deadbeef00c0ffee".parse().unwrap()),
            weight: 0.0,
            ..row(7, "eu, \"west\" 1", 4)
        },
        OuterStepRow { loss: None, world: 14, ..row(0, " padded ", 1) },
        OuterStepRow { idle_s: -0.0, ..row(0, "a", 0) },
    ]
}

#[test]
fn outer_steps_round_trip() {
    let rows = awkward_rows();
    let text = outer_steps_csv(&rows);
    let parsed = parse_outer_steps_csv(&text).unwrap();
    let mut expected = rows.clone();
    sort_outer_steps(&mut expected);
    assert_eq!(parsed, expected);
    // Written again, the bytes are the same, whatever the order of the input.
    let mut reversed = rows;
    reversed.reverse();
    assert_eq!(outer_steps_csv(&parsed), text);
    assert_eq!(outer_steps_csv(&reversed), text);
}

#[test]
fn outer_steps_format_is_fixed() {
    let text = outer_steps_csv(&awkward_rows());
    let mut lines = text.lines();
    assert_eq!(lines.next().unwrap(), OUTER_STEPS_COLUMNS.join(","));
    // Sorted by (outer_step, node_id): node 0 first, with -0 written as 0.
    assert_eq!(
        lines.next().unwrap(),
        "0,a,0,1,2,0.000000,0.000000,0.000000,0.000000,0.000000,0.000000,0.000000,0.000000,\
         0.000000,0,0,0,,,1.000000,0.000000,"
    );
    assert!(lines.next().unwrap().starts_with("0,\" padded \",1,1,14,"));
    assert!(lines.next().unwrap().starts_with("7,\"eu, \"\"west\"\" 1\",4,"));
    assert!(text.ends_with('\n'));
}

#[test]
fn held_out_loss_round_trips_and_older_files_still_parse() {
    let rows = vec![OuterStepRow { eval_loss: Some(3.25), ..row(0, "a", 0) }, row(1, "a", 0)];
    let text = outer_steps_csv(&rows);
    assert!(text.lines().nth(1).unwrap().ends_with(",3.250000"), "{text}");
    assert_eq!(parse_outer_steps_csv(&text).unwrap(), rows);
    // A file written before the column: every row parses, without a held-out loss.
    let old: String = text.lines().map(|l| format!("{}\n", &l[..l.rfind(',').unwrap()])).collect();
    assert!(!old.contains("eval_loss"));
    let parsed = parse_outer_steps_csv(&old).unwrap();
    assert_eq!(parsed, vec![row(0, "a", 0), row(1, "a", 0)]);
    // A row of the new header with a field short is still an error.
    let short = format!("{}\n{}\n", text.lines().next().unwrap(), old.lines().nth(1).unwrap());
    assert!(matches!(
        parse_outer_steps_csv(&short).unwrap_err(),
        MetricsError::FieldCount { expected: 22, found: 21, .. }
    ));
}

#[test]
fn events_round_trip() {
    let events = vec![
        EventRow::new(5.5, EventKind::Crash).node("b").detail("SIGKILL"),
        EventRow::new(0.0, EventKind::Start),
        EventRow::new(5.5, EventKind::Epoch).epoch(3).detail("line one\nline \"two\", three"),
        EventRow::new(1.0, EventKind::JoinRequest).node("d"),
    ];
    let text = events_csv(&events);
    let parsed = parse_events_csv(&text).unwrap();
    // Sorted by time, stable for equal times (crash before epoch, as given).
    let kinds: Vec<EventKind> = parsed.iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        [EventKind::Start, EventKind::JoinRequest, EventKind::Crash, EventKind::Epoch]
    );
    assert_eq!(parsed[3], events[2]);
    assert_eq!(parsed[0].node, None);
    assert_eq!(parsed[0].epoch, None);
    assert_eq!(events_csv(&parsed), text);
}

#[test]
fn every_event_kind_round_trips_in_kebab_case() {
    for k in EventKind::ALL {
        assert_eq!(k.as_str().parse::<EventKind>(), Ok(k));
        let json = serde_json::to_string(&k).unwrap();
        assert_eq!(json, format!("\"{}\"", k.as_str()));
    }
    assert_eq!(EventKind::AllreduceFailed.as_str(), "allreduce-failed");
    assert!("Join".parse::<EventKind>().is_err());
}

#[test]
fn parse_errors_name_line_and_field() {
    let mut text = outer_steps_csv(&[row(0, "a", 0), row(1, "a", 0)]);
    text =
        text.replacen("1,a,0,1,2,0.000000,0.000000,0.000000", "1,a,0,1,2,0.000000,0.000000,x", 1);
    let err = parse_outer_steps_csv(&text).unwrap_err();
    assert_eq!(
        err,
        MetricsError::Field {
            line: 3,
            field: "compute_s",
            expected: "a number",
            found: "x".into()
        }
    );
    assert_eq!(err.to_string(), "line 3: field `compute_s`: expected a number, found `x`");

    // A weights digest is 16 hex digits or nothing.
    let d: WeightsDigest = "0123456789abcdef".parse().unwrap();
    let text = outer_steps_csv(&[OuterStepRow { weights_hash: Some(d), ..row(0, "a", 0) }]);
    assert!(text.contains(",0123456789abcdef,"), "{text}");
    let short = text.replace("0123456789abcdef", "0123");
    match parse_outer_steps_csv(&short).unwrap_err() {
        MetricsError::Field { line, field, found, .. } => {
            assert_eq!((line, field, found.as_str()), (2, "weights_hash", "0123"));
        }
        e => panic!("unexpected {e:?}"),
    }

    let bad_count = "time_s,kind,node,epoch,detail\n1.0,join,a,1\n";
    assert_eq!(
        parse_events_csv(bad_count).unwrap_err(),
        MetricsError::FieldCount { line: 2, expected: 5, found: 4 }
    );
    let bad_kind = "time_s,kind,node,epoch,detail\n\n1.0,explode,a,,\n";
    match parse_events_csv(bad_kind).unwrap_err() {
        MetricsError::Field { line, field, found, .. } => {
            assert_eq!((line, field, found.as_str()), (3, "kind", "explode"));
        }
        e => panic!("unexpected {e:?}"),
    }
    // Lines count blank lines and the line breaks inside quoted fields.
    let multi =
        "time_s,kind,node,epoch,detail\n\n1.0,leave,a,,\"two\nlines\"\r\n\n2.0,leave,b,x,\n";
    assert_eq!(parse_events_csv(multi).unwrap_err().line(), Some(6));
    let bad_epoch = "time_s,kind,node,epoch,detail\n1.0,epoch,,-1,\n";
    assert_eq!(parse_events_csv(bad_epoch).unwrap_err().line(), Some(2));
    assert!(matches!(
        parse_events_csv("time,kind\n").unwrap_err(),
        MetricsError::Header { line: 1, .. }
    ));
    assert!(matches!(parse_events_csv("").unwrap_err(), MetricsError::MissingHeader { .. }));
    let empty_node = outer_steps_csv(&[row(0, "x", 0)]).replace(",x,", ",,");
    assert!(matches!(
        parse_outer_steps_csv(&empty_node).unwrap_err(),
        MetricsError::Field { line: 2, field: "node", .. }
    ));
    // A header alone is an empty, valid file.
    assert_eq!(parse_events_csv(&events_csv(&[])).unwrap(), vec![]);
}

#[test]
fn percentile_edge_cases() {
    assert_eq!(percentile(&[], 50.0), None);
    for p in [0.0, 5.0, 50.0, 95.0, 100.0] {
        assert_eq!(percentile(&[7.0], p), Some(7.0));
    }
    let two = [10.0, 20.0];
    assert_eq!(percentile(&two, 0.0), Some(10.0));
    assert_eq!(percentile(&two, 50.0), Some(15.0));
    assert_eq!(percentile(&two, 5.0), Some(10.5));
    assert_eq!(percentile(&two, 95.0), Some(19.5));
    assert_eq!(percentile(&two, 100.0), Some(20.0));
    assert_eq!(percentile(&two, 150.0), Some(20.0));
    assert_eq!(percentile(&two, -1.0), Some(10.0));
    // h = 4 * 0.3 = 1.2 -> 2 + 0.2 * (3 - 2)
    let five = [1.0, 2.0, 3.0, 4.0, 100.0];
    assert!((percentile(&five, 30.0).unwrap() - 2.2).abs() < 1e-12);
    assert_eq!(percentile(&five, 50.0), Some(3.0));

    assert_eq!(allreduce_stats(&[]), AllreduceStats::default());
    let s = allreduce_stats(&two);
    assert_eq!((s.count, s.median, s.p5, s.p95, s.mean), (2, 15.0, 10.5, 19.5, 15.0));
}

#[test]
fn allreduce_samples_skip_rows_without_one() {
    let rows = vec![
        OuterStepRow { allreduce_s: 3.0, ..row(0, "a", 0) },
        OuterStepRow { allreduce_s: 0.0, ..row(0, "b", 1) },
        OuterStepRow { allreduce_s: 1.0, ..row(1, "a", 0) },
        OuterStepRow { allreduce_s: f64::NAN, ..row(1, "b", 1) },
    ];
    assert_eq!(allreduce_samples(&rows), vec![1.0, 3.0]);
    // Overlapped: a row's own all-reduce only, not its wait for the one before.
    let rows = vec![
        OuterStepRow { allreduce_s: 0.5, allreduce_wall_s: 4.0, ..row(0, "a", 0) },
        OuterStepRow { allreduce_s: 2.0, allreduce_wall_s: 0.0, ..row(0, "a", 1) },
        OuterStepRow { allreduce_s: 1.0, allreduce_wall_s: 3.0, ..row(0, "a", 2) },
    ];
    assert_eq!(allreduce_samples(&rows), vec![3.0, 4.0]);
}

/// Node a: 14 s compute of 20 s wall, 3 s all-reduce. Node b: 10 of 20, 5 s all-reduce.
fn two_nodes() -> Vec<OuterStepRow> {
    vec![
        timed(0, "a", 0, 0.0, [8.0, 1.0, 1.0, 0.0, 0.0]),
        timed(1, "a", 0, 10.0, [6.0, 2.0, 0.0, 0.0, 2.0]),
        timed(1, "b", 1, 0.0, [10.0, 5.0, 0.0, 5.0, 0.0]),
    ]
}

#[test]
fn utilization_by_hand() {
    let rows = two_nodes();
    let s = summarize(&RunMeta::default(), &rows, &[]);
    let u = &s.utilization;
    assert_eq!(u.per_node["a"], 14.0 / 20.0);
    assert_eq!(u.per_node["b"], 10.0 / 20.0);
    assert_eq!(u.mean, 24.0 / 40.0);
    assert_eq!(u.table2_per_node["a"], 14.0 / 17.0);
    assert_eq!(u.table2_per_node["b"], 10.0 / 15.0);
    assert_eq!(u.table2, 24.0 / 32.0);
    assert_eq!(s.outer_steps, 2);
    assert_eq!(s.simulated_seconds, 20.0);
    // Samples 1, 2, 5.
    assert_eq!(s.allreduce_seconds.count, 3);
    assert_eq!(s.allreduce_seconds.median, 2.0);
    assert_eq!(s.allreduce_seconds.mean, 8.0 / 3.0);
    assert!((s.allreduce_seconds.p95 - 4.7).abs() < 1e-12);

    let totals = node_totals(&rows);
    assert_eq!(totals["a"].rows, 2);
    assert_eq!(totals["a"].idle_s, 2.0);
    assert_eq!(totals["b"].recovery_s, 5.0);
    // No time at all: 0, not NaN.
    let empty = summarize(&RunMeta::default(), &[row(0, "z", 0)], &[]);
    assert_eq!(empty.utilization.mean, 0.0);
    assert_eq!(empty.utilization.table2, 0.0);
}

#[test]
fn summary_is_independent_of_row_order() {
    let mut rows = two_nodes();
    let a = summarize(&RunMeta::default(), &rows, &[]);
    rows.reverse();
    assert_eq!(summarize(&RunMeta::default(), &rows, &[]), a);
}

#[test]
fn step_totals_by_hand() {
    let mut rows = two_nodes();
    rows[0].loss = Some(3.0);
    rows[1].loss = Some(2.0);
    rows[2].loss = Some(1.0);
    rows[1].bytes_sent = 10;
    rows[2].bytes_sent = 32;
    let steps = step_totals(&rows);
    assert_eq!(steps.len(), 2);
    assert_eq!(steps[1].outer_step, 1);
    assert_eq!(steps[1].nodes, 2);
    assert_eq!(steps[1].bytes_sent, 42);
    assert_eq!(steps[1].mean_loss, Some(1.5));
    assert_eq!(steps[1].breakdown_s, [16.0, 7.0, 0.0, 5.0, 0.0, 0.0, 2.0]);
    assert_eq!(steps[1].allreduce_max_s, 5.0);
    assert_eq!((steps[1].start_s, steps[1].end_s), (0.0, 20.0));
    assert_eq!(summarize(&RunMeta::default(), &rows, &[]).final_loss, Some(1.5));
    assert_eq!(summarize(&RunMeta::default(), &rows, &[]).final_eval_loss, None);
    // The held-out loss of the last step evaluated, averaged over the nodes that did.
    let mut evaluated = rows.clone();
    for (i, r) in evaluated.iter_mut().enumerate() {
        r.eval_loss = Some(2.0 + i as f64);
    }
    let last = evaluated.iter().map(|r| r.outer_step).max().unwrap();
    let at_last: Vec<f64> =
        evaluated.iter().filter(|r| r.outer_step == last).filter_map(|r| r.eval_loss).collect();
    let want = at_last.iter().sum::<f64>() / at_last.len() as f64;
    assert_eq!(summarize(&RunMeta::default(), &evaluated, &[]).final_eval_loss, Some(want));
}

#[test]
fn membership_from_events() {
    let events = vec![
        EventRow::new(0.0, EventKind::Start),
        EventRow::new(0.0, EventKind::Start).node("a"),
        EventRow::new(0.0, EventKind::Start).node("b"),
        EventRow::new(0.0, EventKind::Start).node("c"),
        EventRow::new(0.0, EventKind::Epoch).epoch(1),
        EventRow::new(5.0, EventKind::JoinRequest).node("d"),
        EventRow::new(10.0, EventKind::Admit).node("d").epoch(2),
        EventRow::new(10.0, EventKind::Epoch).epoch(2),
        EventRow::new(12.0, EventKind::Join).node("d").epoch(2),
        EventRow::new(20.0, EventKind::Crash).node("b"),
        EventRow::new(26.0, EventKind::Evict).node("b"),
        EventRow::new(26.0, EventKind::Epoch).epoch(3),
        EventRow::new(30.0, EventKind::Leave).node("c"),
        EventRow::new(30.0, EventKind::Epoch).epoch(4),
        EventRow::new(40.0, EventKind::Stop),
    ];
    let m = membership(&[], &events);
    assert_eq!(
        m,
        Membership { max_nodes: 4, joins: 1, leaves: 1, evictions: 1, crashes: 1, epochs: 4 }
    );
    let timeline: Vec<(f64, u32)> =
        active_nodes(&events).iter().map(|p| (p.time_s, p.active)).collect();
    // Starts merge into one point at 0; admit counts d, the join does not count it twice; the
    // crash removes b, the eviction does not remove it twice.
    assert_eq!(timeline, vec![(0.0, 3), (10.0, 4), (20.0, 3), (30.0, 2)]);
    // World sizes in the rows also bound max_nodes.
    let wide = OuterStepRow { world: 9, epoch: 7, ..row(0, "a", 0) };
    let m = membership(&[wide], &events);
    assert_eq!((m.max_nodes, m.epochs), (9, 5));
}

#[test]
fn throughput_mfu_and_inner_step_by_hand() {
    let mut rows = two_nodes();
    rows[0].tokens = 1000;
    rows[1].tokens = 1000;
    rows[2].tokens = 2000;
    let meta = RunMeta {
        scenario: "s".into(),
        seed: 7,
        backend: "sim".into(),
        inner_steps_per_outer: Some(4),
        mfu_basis: Some(MfuBasis {
            flops_per_token: 100.0,
            peak_flops_per_gpu: 10000.0,
            gpus_per_node: 2,
        }),
        violations: vec!["replicas differ at step 3".into()],
        published: Some("usa".into()),
        ..RunMeta::default()
    };
    let s = summarize(&meta, &rows, &[]);
    // 4000 tokens over 20 s.
    assert_eq!(s.tokens_per_second, Some(200.0));
    // 100 * 4000 / (10000 * 2 * 40 node-seconds).
    assert_eq!(s.mfu, Some(0.5));
    // Mean compute of (8, 6, 10) = 8 s over H = 4.
    assert_eq!(s.inner_step_seconds, Some(2.0));
    assert!(!s.invariants.ok);
    assert_eq!(s.invariants.violations, vec!["replicas differ at step 3".to_owned()]);
    assert_eq!(s.published.as_deref(), Some("usa"));
    let no_basis = summarize(&RunMeta::default(), &rows, &[]);
    assert_eq!((no_basis.mfu, no_basis.inner_step_seconds), (None, None));
    assert!(no_basis.invariants.ok);
    // PRIME's formula, one term at a time.
    assert_eq!(flops_per_token(10.0, 1, 2, 3, 4), 60.0 + 12.0 * 24.0);
}

#[test]
fn summary_json_round_trips_in_struct_order() {
    let mut extra = BTreeMap::new();
    extra.insert("zeta".to_owned(), serde_json::json!(1));
    extra.insert("alpha".to_owned(), serde_json::json!("x"));
    let meta = RunMeta { scenario: "churn".into(), seed: 3, extra, ..RunMeta::default() };
    let s = summarize(&meta, &two_nodes(), &[]);
    let text = serde_json::to_string_pretty(&s).unwrap();
    assert!(text.starts_with("{\n  \"scenario\": \"churn\",\n  \"seed\": 3,"));
    assert!(text.find("\"alpha\"").unwrap() < text.find("\"zeta\"").unwrap());
    let back: Summary = serde_json::from_str(&text).unwrap();
    assert_eq!(back, s);
}

#[test]
fn published_table2_matches_its_arithmetic() {
    let t = published_table2();
    assert_eq!(t.len(), 4);
    for r in t {
        if let Some(m) = r.median_allreduce_s {
            let u = 2280.0 / (2280.0 + m);
            assert!((u - r.compute_utilization).abs() < 0.001, "{}: {u}", r.key);
        } else {
            assert_eq!(r.compute_utilization, 1.0);
        }
        assert_eq!(published_row(r.key), Some(r));
        assert_eq!(published_row(&r.setting.to_uppercase()), Some(r));
    }
    assert_eq!(published_row("usa-eu").and_then(|r| r.median_allreduce_s), Some(382.0));
    assert_eq!(published_row("mars"), None);
}

/// In JSON (the real backend's metrics lines) the digest is its hex text and no digest the empty
/// string, as the rows always had; both read back.
#[test]
fn a_rows_digest_in_json_is_its_hex_or_the_empty_string() {
    let none = row(0, "a", 0);
    let text = serde_json::to_string(&none).unwrap();
    assert!(text.contains(r#""weights_hash":"""#), "{text}");
    assert_eq!(serde_json::from_str::<OuterStepRow>(&text).unwrap(), none);
    let d: WeightsDigest = "00ff00ff00ff00ff".parse().unwrap();
    let some = OuterStepRow { weights_hash: Some(d), ..none };
    let text = serde_json::to_string(&some).unwrap();
    assert!(text.contains(r#""weights_hash":"00ff00ff00ff00ff""#), "{text}");
    assert_eq!(serde_json::from_str::<OuterStepRow>(&text).unwrap(), some);
    let bad = text.replace("00ff00ff00ff00ff", "zz");
    assert!(serde_json::from_str::<OuterStepRow>(&bad).is_err());
}
