//! The published figures loco compares itself with: Table 2 of the INTELLECT-1 technical report
//! (arXiv 2412.01152), as quoted in `shared/reference.md`.

use serde::Serialize;

/// One setting of INTELLECT-1's Table 2.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct PublishedRow {
    /// The name a scenario and [`super::Summary::published`] use for it (kebab-case).
    pub key: &'static str,
    /// The setting as the report names it.
    pub setting: &'static str,
    /// Median all-reduce time in seconds; `None` for the setting without communication.
    pub median_allreduce_s: Option<f64>,
    /// Compute utilisation as a fraction, Table 2's definition: inner time / (inner time +
    /// all-reduce time).
    pub compute_utilization: f64,
    /// Model flops utilisation as a fraction.
    pub mfu: f64,
}

const TABLE2: [PublishedRow; 4] = [
    PublishedRow {
        key: "no-communication",
        setting: "no communication",
        median_allreduce_s: None,
        compute_utilization: 1.0,
        mfu: 0.433,
    },
    PublishedRow {
        key: "usa",
        setting: "USA only",
        median_allreduce_s: Some(103.0),
        compute_utilization: 0.957,
        mfu: 0.414,
    },
    PublishedRow {
        key: "usa-eu",
        setting: "USA + Europe",
        median_allreduce_s: Some(382.0),
        compute_utilization: 0.856,
        mfu: 0.371,
    },
    PublishedRow {
        key: "global",
        setting: "global",
        median_allreduce_s: Some(469.0),
        compute_utilization: 0.830,
        mfu: 0.360,
    },
];

/// INTELLECT-1's Table 2, in the report's order. One outer step held 2280 s of inner compute
/// (100 inner steps of 22.8 s), so utilisation = 2280 / (2280 + median all-reduce).
pub fn published_table2() -> &'static [PublishedRow] {
    &TABLE2
}

/// The Table-2 row named `name`: its key or its setting, compared case-insensitively.
pub fn published_row(name: &str) -> Option<&'static PublishedRow> {
    let name = name.trim();
    // The scenario schema also accepts `usa-europe` for `usa-eu`.
    let name = if name.eq_ignore_ascii_case("usa-europe") { "usa-eu" } else { name };
    TABLE2.iter().find(|r| r.key.eq_ignore_ascii_case(name) || r.setting.eq_ignore_ascii_case(name))
}
