//! End-to-end tests of the `loco` binary: one test binary, one module per area.

mod bench;
mod churn;
mod common;
mod conformance;
mod data_prepare;
mod faults;
mod hf_export;
mod launch;
mod net;
mod observe;
mod plan;
mod replay;
mod structure;
