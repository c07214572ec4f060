//! Seeded random streams, one per (seed, subject, purpose): [`loco_core::rng`], shared with the
//! real backend's emulated network.

pub use loco_core::rng::*;
