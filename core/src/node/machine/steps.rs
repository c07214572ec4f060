//! The DiLoCo step cycle of a [`Node`]: the inner steps (started by the member, or ahead of it
//! in overlap modes), the outer state lent to the pseudo-gradient's job, the arrival at the
//! barrier, and the commit or skip of the step with the jobs they lend the outer state to.

use super::effect::RoundJob;
use super::rows::Closing;
use super::{
    AfterOuter, Check, Effect, Node, NodeEvent, OuterJob, OuterKind, Snapshot, Violation, Work,
};
use crate::digest::WeightsDigest;
use crate::diloco::OuterState;
use crate::ids::Epoch;
use crate::node::acct::Span;
use crate::time::Time;

/// The inner steps of a round in overlap and streaming modes, started by the machine (as the
/// node arrives at the previous round's barrier, or when the member asks for a first round).
#[derive(Debug)]
pub(super) struct Ahead {
    pub(super) outer_step: u64,
    /// They started from weights of the mesh's state (a synced node).
    pub(super) valid: bool,
    /// Their result, when it came before the member asked for the step (the previous commit
    /// had not come yet).
    pub(super) result: Option<Computed>,
}

/// What inner steps returned.
#[derive(Debug)]
pub(super) struct Computed {
    pub(super) inner: Option<Vec<f32>>,
    pub(super) loss: Option<f64>,
    pub(super) eval_loss: Option<f64>,
    pub(super) tokens: u64,
}

/// What an [`OuterJob`] brings back besides the outer state.
#[derive(Debug)]
pub(super) struct Returned {
    /// Its values after the work: in overlap modes the merged weights a pseudo-gradient's job
    /// starts the next round from; the average a commit's job applied.
    pub(super) average: Option<Vec<f32>>,
    /// Pseudo-gradient: whether the inner steps started from valid weights.
    pub(super) valid: bool,
    /// Pseudo-gradient: how many of its values were not finite (withheld from the average).
    pub(super) nonfinite: usize,
    /// Values of the outer state.
    pub(super) of: usize,
    /// The digest of the outer weights after the work, when asked for.
    pub(super) digest: Option<WeightsDigest>,
    /// Pseudo-gradient: a copy of it (the all-reduce's input); commit and skip: a copy of the
    /// outer weights (the next [`Effect::SetParams`]).
    pub(super) copy: Option<Vec<f32>>,
    /// Commit: a snapshot for the checkpoint that is due.
    pub(super) snapshot: Option<Snapshot>,
}

impl Node {
    /// The member asks for the inner steps of `step`: they start (or, in overlap modes, are
    /// found under way or done since the barrier of the step before).
    pub(super) fn start_compute(&mut self, epoch: Epoch, step: u64, now: Time) {
        if self.just_admitted {
            // Admitted by the formation of a mesh: every founding member starts from the same
            // initial weights.
            self.just_admitted = false;
            self.synced = true;
            self.holds = true;
        }
        // A non-blocking joiner that holds the state says so at the start of the first round it
        // computes from it: the coordinator gives it weight 1 from that step on. In overlap
        // modes a round may have started before the state came (ahead, from the joiner's own
        // weights): that round's pseudo-gradient is not the mesh's, so the report waits a round.
        let from_state = match self.ahead.as_ref().filter(|a| a.outer_step == step) {
            Some(a) if self.overlaps() => a.valid,
            _ => self.synced,
        };
        if self.report_sync && from_state {
            self.report_sync = false;
            if let Err(e) = self.member.report_sync_done(now) {
                tracing::debug!(target: "loco_core", "{}: sync report refused: {e}", self.cfg.id);
            }
        }
        if self.overlaps() {
            if let Some(a) = self.ahead.as_mut().filter(|a| a.outer_step == step) {
                // Running since the barrier of the step before (or done already).
                let result = a.result.take();
                if let Some(acct) = &mut self.acct {
                    acct.set_epoch(epoch);
                }
                self.work = Work::Computing { outer_step: step };
                if let Some(done) = result {
                    self.round_done(now, step, done);
                }
                return;
            }
            // A fresh start (a founding member, a joiner, a node whose round was lost): the
            // local trajectory starts at the global weights.
            if let (true, Some(o)) = (self.real, self.outer.as_mut()) {
                o.anchor_here();
            }
            self.ahead = Some(Ahead { outer_step: step, valid: self.synced, result: None });
        }
        self.grad_step = self.synced.then_some(step);
        if !self.params_current {
            self.set_params();
        }
        self.open_row(step, now);
        if let Some(a) = &mut self.acct {
            a.set_epoch(epoch);
        }
        if !self.suspended {
            self.enter(Span::Compute, now);
        }
        self.work = Work::Computing { outer_step: step };
        let inner_steps = self.cfg.inner_steps;
        self.effects.push_back(Effect::Compute { epoch, outer_step: step, inner_steps });
    }

    /// Overlap modes: the inner steps of `step` start now, from `params` (the merged weights of
    /// the round that ended; `None`: as set), before the member asks for them. The row of the
    /// round that ended closes here and `step`'s opens: rows tile the node's time.
    fn start_ahead(&mut self, now: Time, step: u64, params: Option<Vec<f32>>) {
        let len = self.outer.as_ref().map(OuterState::len);
        match params {
            Some(p) if self.real && Some(p.len()) == len => {
                self.effects.push_back(Effect::SetParams(p));
            }
            _ => self.set_params(),
        }
        // The inner weights are a local trajectory, not the global weights.
        self.params_current = false;
        if let Some(mut a) = self.acct.take() {
            // The round's time ends here; its row waits for its all-reduce's commit.
            if let Some(c) = self.closing.take() {
                let row = c.acct.close(c.end, c.bytes, &self.cfg.row, self.last_digest);
                self.effects.push_back(Effect::Row(row));
            }
            a.leave(now);
            self.closing = Some(Closing { acct: a, end: now, bytes: self.bytes_queued() });
        }
        self.open_row(step, now);
        self.ahead = Some(Ahead { outer_step: step, valid: self.synced, result: None });
        if !self.suspended {
            self.enter(Span::Compute, now);
        }
        let epoch = self.member.epoch().unwrap_or_default();
        let inner_steps = self.cfg.inner_steps;
        self.effects.push_back(Effect::Compute { epoch, outer_step: step, inner_steps });
    }

    /// The inner steps of `outer_step`, the step the node computes, are done: the
    /// pseudo-gradient's job (with the merge of the previous fragment in overlap modes).
    pub(super) fn round_done(&mut self, now: Time, outer_step: u64, done: Computed) {
        // The inner loop moved: the next compute starts from parameters set again.
        self.params_current = false;
        if let Some(a) = &mut self.acct {
            a.trained(done.tokens, done.loss, done.eval_loss);
        }
        let valid = match self.ahead.take() {
            Some(a) if a.outer_step == outer_step => a.valid,
            _ => self.grad_step == Some(outer_step),
        };
        let round = self.round_job(outer_step, true);
        match self.lend(OuterKind::PseudoGradient, outer_step, now) {
            Some(mut job) => {
                job.values = done.inner;
                job.valid = valid;
                job.round = round;
                self.work = Work::Outer { then: AfterOuter::Barrier { outer_step } };
                self.effects.push_back(Effect::Outer(Box::new(job)));
            }
            None => self.work = Work::Idle,
        }
    }

    /// Keeps the digest of the outer weights just returned (`None` keeps the last one), with
    /// the steps they hold, for the state this node says it holds.
    fn note_held_digest(&mut self, digest: Option<crate::digest::WeightsDigest>) {
        if let (Some(d), Some(o)) = (digest, &self.outer) {
            self.held_digest = Some((o.steps(), d));
        }
    }

    /// The pseudo-gradient's job of `outer_step` came back: the node arrives at the barrier
    /// (in overlap modes the next round's inner steps start now, beside the all-reduce).
    pub(super) fn arrive(&mut self, now: Time, outer_step: u64, back: Returned) {
        self.ring_input = back.copy;
        self.work = Work::Barrier;
        if self.overlaps() {
            // The next round computes while this one's all-reduce runs.
            self.grad_step = (back.valid && self.synced).then_some(outer_step);
            self.start_ahead(now, outer_step + 1, back.average);
        } else {
            self.enter(Span::Barrier, now);
        }
        if back.nonfinite > 0 {
            // A diverged inner loop: averaging it would spread NaN (fp32, fp16) or hide
            // it (uint8, int8-block). The node asks for weight 0 and takes the average.
            self.member.withhold(outer_step);
            let epoch = self.member.epoch();
            let ev = NodeEvent::Withheld { epoch, outer_step, values: back.nonfinite, of: back.of };
            self.effects.push_back(Effect::Event(ev));
        }
        // The arrival says which state this node holds (its outer state is back from the job).
        self.tell_held();
        if let Err(e) = self.member.barrier_arrive(now, outer_step) {
            tracing::debug!(target: "loco_core", "{}: barrier refused: {e}", self.cfg.id);
        }
    }

    /// The member commits `step`: the attempt's average goes to the commit's job.
    pub(super) fn commit(&mut self, epoch: Epoch, step: u64, now: Time) {
        let (result, sent) = match std::mem::replace(&mut self.work, Work::Idle) {
            Work::Reduced { epoch: e, average, sent, .. } if e == epoch => (Some(average), sent),
            _ => (None, None),
        };
        if result.is_none() {
            self.violation(Violation::CommitWithoutResult { outer_step: step, epoch });
        }
        // The all-reduce from its first release to this commit, whether the node waited for
        // it or (overlap modes) computed beside it; not for the empty all-reduce of a round
        // between two syncs (`sync_delay` shorter than a round), which carries no values.
        let empty = self.cfg.schedule.fragment(step).is_empty();
        if let Some(t0) = self.released_at.take().filter(|_| !empty)
            && let Some(a) = self.step_row(step)
        {
            a.set_allreduce_wall(now.saturating_since(t0));
        }
        let Some(mut job) = self.lend(OuterKind::Commit, step, now) else { return };
        job.values = result.flatten();
        job.sent = sent.map(Box::new);
        job.round = self.round_job(step, false);
        self.work = Work::Outer { then: AfterOuter::Commit { epoch, outer_step: step } };
        self.effects.push_back(Effect::Outer(Box::new(job)));
    }

    /// The commit's job of `outer_step` came back: the row of the step is written (at once, or
    /// in overlap modes the parked one), the result logged for a fetch under way, and a due
    /// checkpoint asked for.
    pub(super) fn committed(&mut self, now: Time, epoch: Epoch, outer_step: u64, back: Returned) {
        self.work = Work::Idle;
        let fragment = self.cfg.schedule.fragment(outer_step);
        if let Some(hash) = back.digest {
            let c = Check::WeightsAfter { outer_step, hash };
            self.effects.push_back(Effect::Check(c));
        }
        self.last_digest = back.digest;
        self.note_held_digest(back.digest);
        if let Some(a) = self.step_row(outer_step) {
            a.set_epoch(epoch);
        }
        let average = back.average;
        if self.overlaps() {
            // The inner weights are this node's trajectory: the merge at the end of the
            // round under way takes the update. The round's row, whose time ended at its
            // barrier, is written now with the weights after its step.
            let avg = average.filter(|a| a.len() == fragment.len());
            self.log_fragment(outer_step, fragment.start, avg);
            self.emit_closing(outer_step, back.digest);
        } else {
            self.set_params_from(back.copy);
            let len = self.outer.as_ref().map(|o| o.len());
            self.log_result(outer_step, average.filter(|a| Some(a.len()) == len));
            self.close_row(outer_step, now, back.digest);
        }
        if self.checkpoint_due(outer_step) {
            let snapshot = back.snapshot;
            self.effects.push_back(Effect::Checkpoint { outer_step, snapshot });
        }
        self.digest_ahead();
    }

    /// The member skips `outer_step` after `attempts` failed attempts: the outer state is lent
    /// to the skip's job (in overlap modes it merges nothing).
    pub(super) fn skip(&mut self, epoch: Epoch, outer_step: u64, attempts: u32, now: Time) {
        if let Some(mut job) = self.lend(OuterKind::Skip, outer_step, now) {
            job.round = self.round_job(outer_step, false);
            self.work = Work::Outer { then: AfterOuter::Skip { epoch, outer_step, attempts } };
            self.effects.push_back(Effect::Outer(Box::new(job)));
        }
    }

    /// The skip's job of `outer_step` came back: the step's row is written without a result.
    pub(super) fn skipped(
        &mut self,
        now: Time,
        epoch: Epoch,
        outer_step: u64,
        attempts: u32,
        back: Returned,
    ) {
        self.work = Work::Idle;
        self.released_at = None;
        self.log_result(outer_step, None);
        self.note_held_digest(back.digest);
        if let Some(a) = self.step_row(outer_step) {
            a.set_epoch(epoch);
            a.set_retries(attempts.saturating_sub(1));
        }
        if self.overlaps() {
            self.emit_closing(outer_step, self.last_digest);
        } else {
            self.set_params_from(back.copy);
            self.close_row(outer_step, now, back.digest);
        }
    }

    /// Lends the outer state to a job of `kind` for `outer_step`, asking for what its return
    /// needs (`None` while it is lent already).
    fn lend(&mut self, kind: OuterKind, outer_step: u64, now: Time) -> Option<OuterJob> {
        let outer = self.outer.take()?;
        self.enter(Span::Outer, now);
        let mut job = OuterJob::new(outer, kind, outer_step, self.params());
        job.want_digest = self.real && self.synced && kind != OuterKind::PseudoGradient;
        // Overlap modes set no parameters after a commit or a skip: no copy of the weights.
        job.want_copy = self.real && (kind == OuterKind::PseudoGradient || !self.overlaps());
        job.want_snapshot =
            self.real && kind == OuterKind::Commit && self.checkpoint_due(outer_step);
        Some(job)
    }

    /// Whether the commit of `outer_step` is followed by a checkpoint.
    fn checkpoint_due(&self, outer_step: u64) -> bool {
        self.cfg.checkpoint_every.is_some_and(|k| (outer_step + 1).is_multiple_of(k.max(1)))
    }

    /// Asks the executor to set its inner parameters to the outer weights.
    pub(super) fn set_params(&mut self) {
        if let (true, Some(o)) = (self.real, &self.outer) {
            self.effects.push_back(Effect::SetParams(o.outer().to_vec()));
        }
        self.params_current = true;
    }

    /// [`set_params`](Self::set_params) with the copy of the outer weights a job made.
    fn set_params_from(&mut self, copy: Option<Vec<f32>>) {
        let len = self.outer.as_ref().map(OuterState::len);
        match copy {
            Some(w) if self.real && Some(w.len()) == len => {
                self.effects.push_back(Effect::SetParams(w));
                self.params_current = true;
            }
            _ => self.set_params(),
        }
    }

    /// Logs the result of `outer_step` for the replay onto a state being fetched (nothing is
    /// fetched: the pieces held early are of no more use).
    fn log_result(&mut self, outer_step: u64, avg: Option<Vec<f32>>) {
        match &mut self.fetch {
            Some(f) => f.log.push(outer_step, avg),
            None => self.early.clear(),
        }
    }

    /// [`log_result`](Self::log_result) of a fragment's average from `offset` on.
    fn log_fragment(&mut self, outer_step: u64, offset: usize, avg: Option<Vec<f32>>) {
        match &mut self.fetch {
            Some(f) => f.log.push_fragment(outer_step, offset, avg),
            None => self.early.clear(),
        }
    }

    /// Overlap modes: the round job of `step` (with the merge of the fragment before it for a
    /// round's end); `None` in sync mode.
    fn round_job(&self, step: u64, merge: bool) -> Option<RoundJob> {
        let s = &self.cfg.schedule;
        self.overlaps().then(|| RoundJob {
            merge: if merge { s.merged(step) } else { None },
            fragment: s.fragment(step),
            mix: s.mix,
        })
    }

    /// Whether the inner steps go on while the all-reduce runs (overlap, streaming).
    pub(super) fn overlaps(&self) -> bool {
        self.cfg.schedule.mode.overlaps()
    }
}
