//! The worker's O(model) work, off its event loop.
//!
//! Applying the outer step, resetting the inner weights, the weights digest, the pseudo-gradient,
//! the copies of a checkpoint's snapshot or of a state for a joiner, installing a received state:
//! each reads or writes every parameter, which at 10B is seconds to tens of seconds, longer than a
//! heartbeat timeout. So each runs as one blocking job ([`spawn`]) that owns what it works on,
//! moved in ([`Held`]: the inner loop, the outer state, the checkpointer) and moved back with its
//! result ([`JobOut`]), without a copy. While a job runs the event loop keeps serving frames,
//! heartbeats, pings and the ring; the member's actions that need what the job holds wait, in
//! order, until it is back (see `Worker::drain` in the parent module).

use super::WorkerError;
use crate::checkpoint::{CheckpointError, Checkpointer, SaveTicket, Snapshot};
use crate::inner::{InnerError, InnerLoop};
use loco_core::diloco::{OuterConfig, OuterState, buckets_from_sizes};
use loco_core::ids::{Epoch, NodeId};
use loco_core::node::digest::weights_digest;
use loco_core::node::rings::{ShardRings, Values};
use loco_core::node::state::{ReplayLog, Share, SharedState};
use std::time::Duration;
use tokio::time::Instant;

/// What a job owns while it runs.
pub(super) struct Held<L> {
    /// The inner loop (absent while it computes: a commit of a non-blocking joiner).
    pub(super) inner: Option<L>,
    /// The outer state.
    pub(super) outer: OuterState,
    /// The checkpointer and its period, if any.
    pub(super) checkpointer: Option<(Checkpointer, u64)>,
}

/// A finished job: what it held, how long it took, what it did.
pub(super) struct JobOut<L> {
    pub(super) held: Held<L>,
    pub(super) took: Duration,
    pub(super) done: Result<Done, WorkerError>,
}

/// A checkpoint's snapshot, taken and handed to the writer.
pub(super) struct CheckpointTaken {
    /// The outer step it is of.
    pub(super) steps: u64,
    /// The time the snapshot's copy (and a wait for the previous save) took.
    pub(super) spent: Duration,
    /// The writer's ticket.
    pub(super) ticket: Result<SaveTicket, CheckpointError>,
}

/// What a job did; each carries what the event loop does next with it.
pub(super) enum Done {
    /// The pseudo-gradient is `outer - inner` of the inner steps just run: arrive at the barrier.
    Refreshed,
    /// The rings of an attempt, built from the pseudo-gradient (recomputed first when a previous
    /// attempt consumed it).
    RingReady {
        epoch: Epoch,
        op: u64,
        refreshed: bool,
        /// The rings, or why they could not start (the values are back in the outer state).
        rings: Result<ShardRings, String>,
    },
    /// An outer step ended: applied (`skipped: None`) or skipped after `attempts`.
    Committed {
        epoch: Epoch,
        outer_step: u64,
        skipped: Option<u32>,
        /// Digest of the outer weights (empty when not asked for).
        hash: String,
        /// The step's entry of a running fetch's replay log (`Some(None)`: a skip).
        log: Option<Option<Vec<f32>>>,
        checkpoint: Option<CheckpointTaken>,
    },
    /// The replicated state and the own part, copied for a joiner (serialised next, beside the
    /// loop).
    StateCopied {
        epoch: Epoch,
        to: NodeId,
        share: Share,
        shared: SharedState,
        own: Option<Vec<u8>>,
    },
    /// A received state became the outer state, the steps committed meanwhile replayed.
    Installed {
        as_of: u64,
        replayed: usize,
        hash: String,
        bytes: u64,
        shared_digest: String,
        own: Vec<u8>,
    },
    /// The inner loop holds the received state: its optimiser's, and the outer weights.
    Synced,
}

/// Runs `f` on a blocking thread with `held`; the result comes back with it.
pub(super) fn spawn<L: InnerLoop>(
    mut held: Held<L>,
    f: impl FnOnce(&mut Held<L>) -> Result<Done, WorkerError> + Send + 'static,
) -> tokio::task::JoinHandle<JobOut<L>> {
    tokio::task::spawn_blocking(move || {
        let t0 = Instant::now();
        let done = f(&mut held);
        JobOut { held, took: t0.elapsed(), done }
    })
}

fn inner_of<L>(h: &Held<L>) -> Result<&L, InnerError> {
    h.inner.as_ref().ok_or_else(|| InnerError::Backend("the inner loop is busy computing".into()))
}

/// `pseudo_gradient = outer - inner`, written in place (no copy of the weights).
pub(super) fn refresh<L: InnerLoop>(h: &mut Held<L>) -> Result<(), WorkerError> {
    let inner = h
        .inner
        .as_ref()
        .ok_or_else(|| InnerError::Backend("the inner loop is busy computing".into()))?;
    h.outer.compute_pseudo_gradient_with(|buf| inner.params_into(buf))?;
    Ok(())
}

/// The rings of `start` over the pseudo-gradient, recomputed first unless it is `fresh`.
pub(super) fn ring_ready<L: InnerLoop>(
    h: &mut Held<L>,
    start: loco_core::mesh::AllReduceStart,
    me: NodeId,
    codec: loco_core::codec::CodecKind,
    segment: Option<usize>,
    fresh: bool,
) -> Result<Done, WorkerError> {
    let (epoch, op) = (start.epoch, start.op);
    if !fresh {
        refresh(h)?;
    }
    let g = h.outer.take_pseudo_gradient();
    let rings = match ShardRings::new(start, me, codec, Values::Real(g), segment) {
        Ok(r) => Ok(r),
        Err(e) => {
            if let Values::Real(g) = e.values {
                h.outer.put_pseudo_gradient(g)?;
            }
            Err(e.source.to_string())
        }
    };
    Ok(Done::RingReady { epoch, op, refreshed: !fresh, rings })
}

/// What a commit job is told.
pub(super) struct CommitJob {
    pub(super) epoch: Epoch,
    pub(super) outer_step: u64,
    /// `None`: apply the all-reduce's result; `Some(attempts)`: skip the update.
    pub(super) skipped: Option<u32>,
    /// Keep the step for a running fetch's replay log.
    pub(super) log: bool,
    /// Compute the weights digest.
    pub(super) digest: bool,
    /// The outer step of the last checkpoint taken.
    pub(super) checkpointed: Option<u64>,
}

/// Ends an outer step as every member does: applies the all-reduce's result or skips the update,
/// resets the inner weights to the outer ones, digests them, and snapshots a checkpoint when one
/// is due.
pub(super) fn commit<L: InnerLoop>(h: &mut Held<L>, j: CommitJob) -> Result<Done, WorkerError> {
    let apply = j.skipped.is_none();
    let log = j.log.then(|| apply.then(|| h.outer.pseudo_gradient().to_vec()));
    // A state received meanwhile (non-blocking join) may already hold this step.
    if h.outer.steps() == j.outer_step {
        if apply {
            h.outer.apply_outer_step();
        } else {
            h.outer.skip_outer_step();
        }
    }
    if let Some(inner) = h.inner.as_mut() {
        inner.set_params(h.outer.outer())?;
    }
    let hash = if j.digest { weights_digest(h.outer.outer()) } else { String::new() };
    let checkpoint = checkpoint(
        h.inner.as_ref(),
        &h.outer,
        h.checkpointer.as_mut(),
        false,
        false,
        j.checkpointed,
    )?;
    Ok(Done::Committed {
        epoch: j.epoch,
        outer_step: j.outer_step,
        skipped: j.skipped,
        hash,
        log,
        checkpoint,
    })
}

/// Snapshots the state for a checkpoint when one is due (every `every` outer steps, or `force`d
/// at a stop) and hands it to the writer; `None` when none is due or possible.
///
/// A checkpoint at a commit is exact: resuming from it continues the run bit for bit. One forced
/// at a stop after the inner loop moved on (`dirty`) holds the committed outer state and the
/// committed weights as parameters; the inner optimiser's moments, schedule and data position are
/// as of the stop (the interrupted step's inner work is the only thing not kept).
pub(super) fn checkpoint<L: InnerLoop>(
    inner: Option<&L>,
    outer: &OuterState,
    ck: Option<&mut (Checkpointer, u64)>,
    force: bool,
    dirty: bool,
    checkpointed: Option<u64>,
) -> Result<Option<CheckpointTaken>, WorkerError> {
    let Some((ck, every)) = ck else { return Ok(None) };
    let steps = outer.steps();
    let due = force || steps.is_multiple_of(*every);
    if steps == 0 || !due || checkpointed == Some(steps) {
        return Ok(None);
    }
    let Some(inner) = inner else { return Ok(None) };
    let t0 = Instant::now();
    let (mut trainer, data_position) = inner.save_state()?;
    if dirty && trainer.params.len() == outer.len() {
        trainer.params.copy_from_slice(outer.outer());
    }
    let snap = Snapshot::from_trainer(
        steps,
        data_position,
        outer.outer().to_vec(),
        outer.momentum().to_vec(),
        trainer,
    );
    let ticket = ck.save(snap);
    Ok(Some(CheckpointTaken { steps, spent: t0.elapsed(), ticket }))
}

/// Copies what a joiner is sent: the replicated part, and the inner optimiser's state when this
/// node sends it.
pub(super) fn copy_state<L: InnerLoop>(
    h: &mut Held<L>,
    epoch: Epoch,
    to: NodeId,
    share: Share,
) -> Result<Done, WorkerError> {
    let own = if share.sends_own { Some(inner_of(h)?.export_optimizer()?) } else { None };
    let shared = SharedState::from_outer(&h.outer);
    Ok(Done::StateCopied { epoch, to, share, shared, own })
}

/// What an install job is given: the verified state and the fetch's replay log.
pub(super) struct InstallJob {
    pub(super) shared: SharedState,
    pub(super) log: ReplayLog,
    pub(super) cfg: OuterConfig,
    pub(super) layout: Vec<(String, usize)>,
    pub(super) bytes: u64,
    pub(super) shared_digest: String,
    pub(super) own: Vec<u8>,
}

/// Makes a received state the outer state: the steps committed here since it was taken replayed
/// onto it (non-blocking mode), the pseudo-gradient buffer carried over (it holds this step's
/// all-reduce result when that has finished: the commit applies it next).
pub(super) fn install<L: InnerLoop>(h: &mut Held<L>, j: InstallJob) -> Result<Done, WorkerError> {
    let as_of = j.shared.outer_steps();
    let mut outer = j.shared.into_outer(j.cfg, buckets_from_sizes(j.layout))?;
    let replayed = j.log.replay_onto(&mut outer).map_err(|e| {
        InnerError::Backend(format!("the state received is as of outer step {as_of}: {e}"))
    })?;
    let hash = weights_digest(outer.outer());
    let g = h.outer.take_pseudo_gradient();
    if g.len() == outer.len() {
        outer.put_pseudo_gradient(g)?;
    }
    // The old state is freed here, on this thread.
    h.outer = outer;
    Ok(Done::Installed {
        as_of,
        replayed,
        hash,
        bytes: j.bytes,
        shared_digest: j.shared_digest,
        own: j.own,
    })
}

/// Gives the inner loop the received optimiser state and the outer weights.
pub(super) fn sync<L: InnerLoop>(h: &mut Held<L>, own: Vec<u8>) -> Result<Done, WorkerError> {
    if let Some(inner) = h.inner.as_mut() {
        inner.import_optimizer(&own)?;
        inner.set_params(h.outer.outer())?;
    }
    Ok(Done::Synced)
}
