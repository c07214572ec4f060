//! The thin async driver of a [`RingAllReduce`] over any [`Transport`].

use super::ring::{Payload, RingAllReduce, RingConfig, RingError, RingStats};
use crate::ids::Weight;
use crate::transport::{Header, Transport};

/// Runs one all-reduce to completion over `transport`: sends what the machine produces, feeds it
/// what arrives. With `data` the values are reduced in place (their weighted average on success);
/// without, a virtual all-reduce of `len` values runs the same schedule.
///
/// Stale collective frames (older epochs) are counted and dropped; non-collective frames are
/// dropped (a backend that multiplexes control traffic drives the machine itself). A send or
/// receive failure aborts with [`RingError::Transport`].
pub async fn run_ring<T: Transport>(
    transport: &mut T,
    cfg: RingConfig,
    data: Option<&mut [f32]>,
    len: usize,
    weight: Weight,
) -> Result<RingStats, RingError> {
    let payload = match data {
        Some(d) => Payload::Real(d),
        None => Payload::Virtual(len),
    };
    let mut ring = RingAllReduce::new(cfg, payload, weight)?;
    loop {
        while let Some((to, frame)) = ring.poll_send() {
            transport.send(to, frame).await?;
        }
        if ring.is_done() {
            return Ok(ring.stats());
        }
        let (from, frame) = transport.recv().await?;
        if !matches!(frame.header, Header::Collective(_)) {
            continue;
        }
        match ring.handle_frame(from, &frame) {
            Ok(()) | Err(RingError::StaleEpoch { .. }) => {}
            Err(e) => return Err(e),
        }
    }
}
