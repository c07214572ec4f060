use super::*;
/// A row of `node` for `step`: 100 s compute from `start`, then 2 s barrier, then
/// `allreduce_s` waited and `wall_s` of all-reduce wall time.
fn row(node: u32, step: u64, start: f64, allreduce_s: f64, wall_s: f64) -> OuterStepRow {
    let end = start + 100.0 + 2.0 + allreduce_s;
    OuterStepRow {
        outer_step: step,
        node: format!("n{node}"),
        node_id: node,
        epoch: 1,
        world: 2,
        start_s: start,
        end_s: end,
        compute_s: 100.0,
        allreduce_s,
        barrier_s: 2.0,
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
        allreduce_wall_s: wall_s,
        eval_loss: None,
    }
}

#[test]
fn timeline_places_sync_all_reduces_inside_the_row_and_overlapped_ones_after_it() {
    // Sync: the all-reduce after the compute and the barrier; also from files without
    // `allreduce_wall_s` (0).
    let t = Timeline::new(&[row(0, 0, 0.0, 10.0, 10.0), row(0, 1, 112.0, 10.0, 0.0)]);
    assert_eq!(t.lanes.len(), 1);
    assert_eq!(t.lanes[0].compute, [(0.0, 100.0), (112.0, 212.0)]);
    assert_eq!(t.lanes[0].allreduce, [(102.0, 112.0), (214.0, 224.0)]);
    assert!(!t.overlapped);
    assert_eq!(t.span, (0.0, 224.0));
    // A joiner's row: recovery, barrier, all-reduce, outer step.
    let joiner = OuterStepRow {
        compute_s: 0.0,
        recovery_s: 50.0,
        outer_s: 3.0,
        end_s: 65.0,
        ..row(1, 0, 0.0, 10.0, 10.0)
    };
    let t = Timeline::new(&[joiner]);
    assert!(t.lanes[0].compute.is_empty());
    assert_eq!(t.lanes[0].allreduce, [(52.0, 62.0)]);
    assert_eq!(t.title(), "Compute and all-reduce per node");
    // Overlapped: from the row's end, for its wall time, beside the next row's compute.
    let t = Timeline::new(&[row(3, 0, 0.0, 0.0, 30.0), row(3, 1, 102.0, 0.0, 30.0)]);
    assert_eq!(t.lanes[0].compute, [(0.0, 100.0), (102.0, 202.0)]);
    assert_eq!(t.lanes[0].allreduce, [(102.0, 132.0), (204.0, 234.0)]);
    assert!(t.overlapped);
    assert_eq!(t.span, (0.0, 234.0));
}

#[test]
fn timeline_keeps_40_lanes_and_30_steps_and_says_so() {
    let mut rows = Vec::new();
    for node in (0..45).rev() {
        for step in 0..35 {
            rows.push(row(node, step, 102.0 * step as f64, 0.0, 0.0));
        }
    }
    let t = Timeline::new(&rows);
    assert_eq!(t.lanes.len(), 40);
    assert_eq!(t.lanes[0].name, "n0");
    assert_eq!(t.lanes[39].name, "n39");
    assert!(t.lanes.iter().all(|l| l.compute.len() == 30));
    assert_eq!(
        t.title(),
        "Compute and all-reduce per node (first 30 outer steps, first 40 of 45 nodes)"
    );
    assert!(render(&t, "", true).is_ok());
    // No rows: no lanes, and the plot says so.
    let t = Timeline::new(&[]);
    assert!(t.lanes.is_empty());
    assert!(render(&t, "", true).unwrap().svg.contains("no outer steps recorded"));
}

#[test]
fn bandwidth_spreads_bytes_over_the_all_reduce_and_compares_peak_with_mean() {
    // Two nodes, five rows each of `every` s, 1 Gbit sent in each.
    let run = |every: f64, allreduce_s: f64, wall_s: f64| -> Vec<OuterStepRow> {
        let sent = |n, s| OuterStepRow {
            bytes_sent: 125_000_000,
            ..row(n, s, every * s as f64, allreduce_s, wall_s)
        };
        (0..2).flat_map(|n| (0..5).map(move |s| sent(n, s))).collect()
    };
    // Sync: a 10 s all-reduce in each row of 112 s.
    let b = Bandwidth::new(&run(112.0, 10.0, 10.0));
    assert!((b.peak - 1e8).abs() < 1.0, "peak {}", b.peak);
    // 10 Gbit over two nodes' 560 s.
    assert!((b.mean - 1e10 / 1120.0).abs() < 1.0, "mean {}", b.mean);
    assert_eq!(b.span, (0.0, 560.0));
    // No bits are lost to the binning: the mean curve integrates to the bits per node.
    let width = 560.0 / BANDWIDTH_BINS as f64;
    let sent: f64 = b.bins.iter().map(|x| x.1 * width).sum();
    assert!((sent - 5e9).abs() < 1e3, "sent {sent}");
    // The compute stretches send nothing; the all-reduces send at the peak.
    let at = |t: f64| b.bins.iter().find(|x| (x.0 - t).abs() <= width / 2.0).unwrap();
    assert_eq!(at(50.0).1, 0.0);
    assert!((at(107.0).1 - 1e8).abs() < 1.0 && (at(107.0).2 - 1e8).abs() < 1.0);
    assert_eq!(b.title(), "Send rate per node: peak 100 Mbit/s, mean 8.93 Mbit/s (11.2x)");
    // The same bytes over all-reduces that run beside the next compute, 100 s each: the peak
    // falls tenfold, and the last all-reduce stretches the span.
    let o = Bandwidth::new(&run(102.0, 0.0, 100.0));
    assert!((o.peak - 1e7).abs() < 1.0, "peak {}", o.peak);
    assert_eq!(o.span, (0.0, 610.0));
    assert!(o.peak / o.mean < 1.3, "{}", o.title());
    assert!(render(&o, "", true).unwrap().svg.contains("Send rate per node: peak 10 Mbit/s"));
    // An overlapped row holds the bytes of the all-reduce before it, which ran beside its
    // compute: row 2's land in row 1's all-reduce (204-304 s), none in row 2's own.
    let mut rows = run(102.0, 0.0, 100.0);
    rows.iter_mut().for_each(|r| r.bytes_sent = if r.outer_step == 2 { 125_000_000 } else { 0 });
    let o = Bandwidth::new(&rows);
    let width = (o.span.1 - o.span.0) / BANDWIDTH_BINS as f64;
    let at = |t: f64| o.bins.iter().find(|x| (x.0 - t).abs() <= width / 2.0).unwrap().1;
    assert!((at(250.0) - 1e7).abs() < 1.0 && at(350.0) == 0.0, "{} {}", at(250.0), at(350.0));
    // Nothing sent: the plot says so.
    assert!(
        render(&Bandwidth::new(&[row(0, 0, 0.0, 1.0, 1.0)]), "", true)
            .unwrap()
            .svg
            .contains("no bytes sent")
    );
    assert!(Bandwidth::new(&[]).bins.is_empty());
}
