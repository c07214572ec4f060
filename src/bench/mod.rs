//! `loco bench ...`: reproducible performance figures.

pub(crate) mod allreduce;
pub mod codec;
pub(crate) mod outer;
pub(crate) mod quality;
pub(crate) mod recovery;
pub(crate) mod train;
