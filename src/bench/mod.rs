//! `loco bench ...`: reproducible performance figures.

pub(crate) mod allreduce;
pub mod codec;
pub(crate) mod quality;
pub(crate) mod train;
