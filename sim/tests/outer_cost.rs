//! `[sim] outer_cost`: every commit takes params x outer_cost of the node's time, in the row's
//! `outer_s`; the member keeps beating meanwhile (a commit longer than the heartbeat timeout
//! evicts nobody), a hang pauses it, and the next compute starts after it.

use loco_core::metrics::{EventKind, OuterStepRow, outer_steps_csv};
use loco_core::scenario::{Preset, Scenario};
mod common;

use common::{run, three_tiny_nodes};
use loco_sim::RunOutput;

/// Three one-GPU nodes, the tiny model, 5 inner steps of 1 s, real numerics; each commit's outer
/// work takes `outer_s` seconds.
fn scenario(outer_s: f64, churn: &str) -> Scenario {
    let cost = outer_s / Preset::Tiny.spec().param_count() as f64;
    let rest = format!(
        "{churn}\n[stop]\nouter_steps = 3\n[sim]\nnumerics = \"real\"\nelements = 1024\n\
         outer_cost = {cost:e}\n"
    );
    three_tiny_nodes("outer-cost", 5, &rest)
}

fn rows_of<'a>(out: &'a RunOutput, node: &str) -> Vec<&'a OuterStepRow> {
    let mut rows: Vec<&OuterStepRow> = out.rows.iter().filter(|r| r.node == node).collect();
    rows.sort_by_key(|r| r.outer_step);
    rows
}

#[test]
fn a_commit_longer_than_the_heartbeat_timeout_is_charged_and_evicts_nobody() {
    // 10 s of outer work per commit, past the 6 s heartbeat timeout.
    let out = run(&scenario(10.0, ""));
    let free = run(&scenario(0.0, ""));
    assert_eq!((out.summary.outer_steps, free.summary.outer_steps), (3, 3));
    assert_eq!(out.rows.len(), 9);
    for r in &out.rows {
        assert!((r.outer_s - 10.0).abs() < 1e-6, "{r:?}");
        // The row ends when the work does: nothing else is in it after the all-reduce.
        assert!((r.end_s - r.start_s - r.wall_s()).abs() < 1e-9);
    }
    for r in &free.rows {
        assert_eq!(r.outer_s, 0.0, "{r:?}");
    }
    for kind in [EventKind::Evict, EventKind::CoordinatorLost] {
        assert_eq!(out.events.iter().filter(|e| e.kind == kind).count(), 0, "{kind:?}");
    }
    for node in ["n-0", "n-1", "n-2"] {
        let rows = rows_of(&out, node);
        // The next step's compute starts when the commit's work ends.
        for w in rows.windows(2) {
            assert!((w[1].start_s - w[0].end_s).abs() < 0.05, "{:?} then {:?}", w[0], w[1]);
        }
        let free_rows = rows_of(&free, node);
        for (r, f) in rows.iter().zip(&free_rows) {
            // Each step ends 10 s later per commit so far, the others unchanged (to the tick).
            let shift = 10.0 * (r.outer_step + 1) as f64;
            assert!((r.end_s - f.end_s - shift).abs() < 0.05, "{r:?} vs {f:?}");
            assert!((r.compute_s - f.compute_s).abs() < 1e-6);
        }
    }
    // The same numerics either way: the cost is time only.
    let hashes = |o: &RunOutput| o.rows.iter().map(|r| r.weights_hash).collect::<Vec<_>>();
    let (mut a, mut b) = (hashes(&out), hashes(&free));
    a.sort();
    b.sort();
    assert_eq!(a, b);
    assert!(a.iter().all(Option::is_some));
}

#[test]
fn a_hang_pauses_the_outer_work_and_the_replay_is_deterministic() {
    // The first commit is at about 5 s and its work runs to about 15 s; n-1 hangs from 8 s to
    // 12 s, so its work ends 4 s later but is still 10 s of outer_s.
    let churn = "[[churn]]\nat = \"8s\"\nkind = \"hang\"\nnode = \"n-1\"\nfor = \"4s\"\n";
    let s = scenario(10.0, churn);
    let out = run(&s);
    let hung = rows_of(&out, "n-1");
    let other = rows_of(&out, "n-0");
    assert!((hung[0].outer_s - 10.0).abs() < 1e-6, "{:?}", hung[0]);
    assert!((hung[0].idle_s - 4.0).abs() < 0.05, "{:?}", hung[0]);
    assert!((hung[0].end_s - other[0].end_s - 4.0).abs() < 0.05, "{:?} vs {:?}", hung[0], other[0]);
    assert_eq!(out.events.iter().filter(|e| e.kind == EventKind::Evict).count(), 0);
    let again = run(&s);
    assert_eq!(outer_steps_csv(&out.rows), outer_steps_csv(&again.rows));
}
