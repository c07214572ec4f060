//! The ring all-reduce: reduce-scatter with fp32 accumulation, then an all-gather that forwards
//! the owner's encoded bytes unchanged, so that every replica ends bit-identical.
//!
//! - [`schedule`] is the pure plan: chunk and segment bounds, which chunk moves at which step.
//! - [`RingAllReduce`] is a sans-IO state machine over that plan: it produces frames to send
//!   ([`RingAllReduce::poll_send`]) and consumes received ones ([`RingAllReduce::handle_frame`]).
//!   It owns no socket and no clock; the backends drive it.
//! - [`run_ring`] is the thin async driver over any [`Transport`](crate::transport::Transport).
//!
//! The result is the *weighted average*: every contribution carries a [`Weight`](crate::Weight)
//! (0 for a joiner without a pseudo-gradient), the weights travel with the partial sums, and the
//! owner of each chunk divides by their sum, never by a world size (PRIME's defect 3).
//!
//! Each chunk is split into segments of at most [`RingConfig::segment_elems`] values, the unit of
//! pipelining: a segment is encoded only when the driver asks for the next frame, so the transfer
//! of one segment overlaps the encoding of the next, and a received segment is reduced and
//! forwarded while later segments of the same step are still on the wire.

pub mod schedule;

mod driver;
mod ring;
mod scratch;

pub use driver::{run_ring, run_ring_stashed};
pub use ring::{DEFAULT_SEGMENT_ELEMS, Payload, RingAllReduce, RingConfig, RingError, RingStats};

#[cfg(test)]
pub(crate) mod tests;
