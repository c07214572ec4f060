//! The links of a scenario over time: [`loco_core::scenario::links`], shared with the real
//! backend's emulated network so that both draw the same rates from the same seed.

pub use loco_core::scenario::links::*;
