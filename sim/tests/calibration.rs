//! The three geographic scenarios reproduce Table 2 of the INTELLECT-1 report (reference.md):
//! median all-reduce within 20% and compute utilisation within 2 points, over their first 10
//! outer steps (the full 30 steps, over several seeds, land within 5% and 1 point; see the
//! `calibrate` example).

use loco_core::metrics::published_row;
use loco_core::scenario::Scenario;
use loco_sim::{ReplayOptions, replay};
use std::path::PathBuf;

#[test]
fn geographic_scenarios_match_table_2() {
    for name in ["intellect1-usa", "intellect1-usa-eu", "intellect1-global"] {
        let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../scenarios/{name}.toml"));
        let s = Scenario::load(&p).expect("scenario");
        let out =
            replay(&s, ReplayOptions { max_outer_steps: Some(10), ..ReplayOptions::default() })
                .expect("replay");
        let m = &out.summary;
        assert!(m.invariants.ok, "{name}: {:?}", m.invariants.violations);
        let paper = published_row(m.published.as_deref().expect("published")).expect("Table 2 row");
        let median = m.allreduce_seconds.median;
        let want = paper.median_allreduce_s.expect("a median");
        assert!(
            (median - want).abs() / want < 0.20,
            "{name}: median all-reduce {median:.0} s, paper {want} s"
        );
        let util = m.utilization.table2;
        assert!(
            (util - paper.compute_utilization).abs() < 0.02,
            "{name}: utilisation {util:.3}, paper {}",
            paper.compute_utilization
        );
        let mfu = m.mfu.expect("mfu");
        assert!((mfu - paper.mfu).abs() < 0.02, "{name}: MFU {mfu:.3}, paper {}", paper.mfu);
        eprintln!(
            "{name}: median {median:.0} s (paper {want}), utilisation {util:.3}, MFU {mfu:.3}"
        );
    }
}
