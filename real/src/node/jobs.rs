//! The worker's work on the inner loop, off its event loop.
//!
//! The inner steps, the inner optimiser's export for a joiner and a checkpoint's snapshot each
//! read or write every parameter, which at 10B is seconds to tens of seconds, longer than a
//! heartbeat timeout. So each runs on a blocking thread ([`spawn`]) that owns what it works on,
//! moved in ([`Held`]: the inner loop and the checkpointer) and moved back with its result,
//! without a copy. One runs at a time, in the order the machine asked for them; before each, the
//! inner loop takes what the machine gave it meanwhile (the parameters of the next step, a
//! received optimiser state). While one runs the event loop keeps serving frames, heartbeats,
//! pings and the ring.

use super::WorkerError;
use crate::checkpoint::{CheckpointError, Checkpointer, SaveTicket, Snapshot};
use crate::inner::{HangGate, InnerError, InnerLoop};
use loco_core::node::machine::StateJob;

/// What a job owns while it runs.
pub(super) struct Held<L> {
    /// The inner loop.
    pub(super) inner: L,
    /// The checkpointer and its period, if any.
    pub(super) checkpointer: Option<(Checkpointer, u64)>,
    /// Closed while the node hangs: the inner steps wait on it.
    pub(super) gate: HangGate,
}

/// A job for the inner loop.
pub(super) enum InnerWork {
    /// The inner steps of `outer_step` in the process's `draw` ([`InnerLoop::begin_round`]);
    /// `crash`: the fault drill kills the process in them. `eval`: the global weights to take
    /// the held-out loss of first ([`InnerLoop::eval_loss`]), when the run evaluates this step.
    Compute { outer_step: u64, draw: u64, steps: u64, crash: bool, eval: Option<Vec<f32>> },
    /// The inner optimiser's export for a joiner (a copy; the encoding runs elsewhere).
    Export(StateJob),
    /// A checkpoint of the committed outer state (`steps` outer steps). `dirty`: the inner loop
    /// has moved on since (a stop mid-step): the snapshot's parameters are the outer weights.
    Checkpoint { steps: u64, outer: Vec<f32>, momentum: Vec<f32>, residual: Vec<f32>, dirty: bool },
}

/// What one round of inner steps did.
pub(super) struct Round {
    /// The inner weights after the steps.
    pub(super) inner: Vec<f32>,
    /// The training loss at their end.
    pub(super) loss: Option<f64>,
    /// The held-out loss of the global weights, when asked for.
    pub(super) eval_loss: Option<f64>,
    /// Tokens processed.
    pub(super) tokens: u64,
}

/// What the inner loop takes before its next job.
#[derive(Default)]
pub(super) struct Pending {
    /// The parameters the machine set last.
    pub(super) params: Option<Vec<f32>>,
    /// A received inner optimiser state.
    pub(super) own: Option<Vec<u8>>,
}

/// What a job did.
pub(super) enum InnerOut {
    /// The inner steps.
    Computed { outer_step: u64, result: Result<Round, InnerError> },
    /// The inner optimiser's export for a joiner's state: the state is encoded and hashed
    /// after, off the inner loop (the next inner steps need not wait for it).
    Exported(StateJob, Result<Vec<u8>, InnerError>),
    /// A snapshot handed to the writer.
    Checkpointed { steps: u64, ticket: Result<SaveTicket, CheckpointError> },
    /// Nothing was done (no checkpointer).
    Nothing,
}

/// Runs `work` on a blocking thread with `held`, after giving the inner loop `pending`.
pub(super) fn spawn<L: InnerLoop>(
    mut held: Held<L>,
    pending: Pending,
    work: InnerWork,
) -> tokio::task::JoinHandle<(Held<L>, Result<InnerOut, WorkerError>)> {
    tokio::task::spawn_blocking(move || {
        let out = run(&mut held, pending, work);
        (held, out)
    })
}

fn run<L: InnerLoop>(
    h: &mut Held<L>,
    pending: Pending,
    work: InnerWork,
) -> Result<InnerOut, WorkerError> {
    if let Some(own) = pending.own {
        h.inner.import_optimizer(&own)?;
    }
    if let Some(p) = pending.params {
        h.inner.set_params(&p)?;
    }
    Ok(match work {
        InnerWork::Compute { outer_step, draw, steps, crash, eval } => {
            let eval_loss = match eval {
                Some(w) => h.inner.eval_loss(&w),
                None => Ok(None),
            };
            h.inner.begin_round(outer_step, draw);
            let result = eval_loss.and_then(|eval_loss| {
                let mut round = compute(&mut h.inner, &h.gate, steps, crash)?;
                round.eval_loss = eval_loss;
                Ok(round)
            });
            InnerOut::Computed { outer_step, result }
        }
        InnerWork::Export(job) => {
            let own = h.inner.export_optimizer();
            InnerOut::Exported(job, own)
        }
        InnerWork::Checkpoint { steps, outer, momentum, residual, dirty } => {
            let Some((ck, _)) = h.checkpointer.as_mut() else { return Ok(InnerOut::Nothing) };
            let (mut trainer, data_position) = h.inner.save_state()?;
            if dirty && trainer.params.len() == outer.len() {
                trainer.params.copy_from_slice(&outer);
            }
            let mut snap = Snapshot::from_trainer(steps, data_position, outer, momentum, trainer);
            snap.residual = residual;
            InnerOut::Checkpointed { steps, ticket: ck.save(snap) }
        }
    })
}

/// `steps` inner steps, none while the node hangs and no more once the worker aborts them (their
/// membership stopped), then the inner weights (copied here, off the loop).
fn compute<L: InnerLoop>(
    inner: &mut L,
    gate: &HangGate,
    steps: u64,
    crash: bool,
) -> Result<Round, InnerError> {
    let (mut loss, mut tokens) = (None, 0u64);
    for _ in 0..steps {
        gate.wait();
        if gate.is_aborted() {
            break;
        }
        let s = inner.step()?;
        loss = s.loss;
        tokens = tokens.saturating_add(s.tokens);
        if crash {
            super::record::kill_self();
        }
    }
    let mut p = vec![0.0f32; inner.num_params()];
    inner.params_into(&mut p)?;
    Ok(Round { inner: p, loss, eval_loss: None, tokens })
}
