//! The thin async driver of a [`RingAllReduce`] over any [`Transport`].

use super::ring::{Payload, RingAllReduce, RingConfig, RingError, RingStats};
use crate::ids::{NodeId, Weight};
use crate::transport::{Frame, Header, Transport};

/// Runs one all-reduce to completion over `transport`: sends what the machine produces, feeds it
/// what arrives. With `data` the values are reduced in place (their weighted average on success);
/// without, a virtual all-reduce of `len` values runs the same schedule.
///
/// Stale collective frames (older epochs) are counted and dropped; frames of a later collective
/// (a fast neighbour already started the next one) are dropped too: use [`run_ring_stashed`] to
/// run several collectives back to back. Non-collective frames are dropped (a backend that
/// multiplexes control traffic drives the machine itself). A send or receive failure aborts with
/// [`RingError::Transport`].
pub async fn run_ring<T: Transport>(
    transport: &mut T,
    cfg: RingConfig,
    data: Option<&mut [f32]>,
    len: usize,
    weight: Weight,
) -> Result<RingStats, RingError> {
    run_ring_stashed(transport, cfg, data, len, weight, &mut Vec::new()).await
}

/// [`run_ring`] for collectives run back to back: frames of a later collective (same epoch and a
/// larger op, or a later epoch) that arrive early are kept in `stash`, and frames already in the
/// stash are fed to this collective first.
pub async fn run_ring_stashed<T: Transport>(
    transport: &mut T,
    cfg: RingConfig,
    data: Option<&mut [f32]>,
    len: usize,
    weight: Weight,
    stash: &mut Vec<(NodeId, Frame)>,
) -> Result<RingStats, RingError> {
    let payload = match data {
        Some(d) => Payload::Real(d),
        None => Payload::Virtual(len),
    };
    let (epoch, op) = (cfg.epoch, cfg.op);
    let mut ring = RingAllReduce::new(cfg, payload, weight)?;
    let mut early = std::mem::take(stash).into_iter();
    loop {
        while let Some((to, frame)) = ring.poll_send() {
            transport.send(to, frame).await?;
        }
        if ring.is_done() {
            stash.extend(early);
            return Ok(ring.stats());
        }
        let (from, frame) = match early.next() {
            Some(f) => f,
            None => transport.recv().await?,
        };
        let Header::Collective(h) = &frame.header else { continue };
        if h.epoch > epoch || (h.epoch == epoch && h.op > op) {
            stash.push((from, frame));
            continue;
        }
        match ring.handle_frame(from, &frame) {
            Ok(()) | Err(RingError::StaleEpoch { .. }) => {}
            Err(RingError::WrongOp { got, .. }) if got < op => {} // an older collective's straggler
            Err(e) => return Err(e),
        }
    }
}
