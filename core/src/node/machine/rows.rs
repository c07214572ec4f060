//! The row accounting of a [`Node`]: which span of its row (compute, outer, barrier,
//! all-reduce, recovery) the node's time goes to, and when rows open and are written. In overlap
//! modes the row of a round whose time ended waits for its all-reduce's commit as a [`Closing`].

use super::{Effect, Node, Work};
use crate::digest::WeightsDigest;
use crate::node::acct::{Span, StepAcct};
use crate::time::Time;

/// Overlap modes: the row of a round whose time ended (the next round computes) and whose
/// all-reduce has not committed yet: written at its commit, with the weights after it.
#[derive(Debug)]
pub(super) struct Closing {
    pub(super) acct: StepAcct,
    pub(super) end: Time,
    pub(super) bytes: u64,
}

impl Node {
    /// Whether the inner steps of a round are running (overlap modes): the row stays in its
    /// compute span whatever the mesh does meanwhile.
    pub(super) fn computing_ahead(&self) -> bool {
        self.ahead.as_ref().is_some_and(|a| a.result.is_none())
    }

    /// The node starts `span` in its row, unless its inner steps run beside it.
    pub(super) fn enter(&mut self, span: Span, now: Time) {
        if span != Span::Compute && self.computing_ahead() {
            return;
        }
        if let Some(a) = &mut self.acct {
            a.enter(span, now);
        }
    }

    /// Overlap modes: the inner steps are done and the node waits; its row enters the span of
    /// what it waits for.
    pub(super) fn wait_span(&mut self, now: Time) {
        let span = match self.work {
            Work::Barrier => Some(Span::Barrier),
            Work::Reducing(_) | Work::Reduced { .. } => Some(Span::AllReduce),
            Work::Outer { .. } => Some(Span::Outer),
            Work::Idle | Work::Computing { .. } | Work::Stopped => None,
        };
        if let Some(a) = &mut self.acct {
            match span {
                Some(s) if !self.suspended => a.enter(s, now),
                _ => a.leave(now),
            }
        }
    }

    /// The row that accounts `step`'s all-reduce: the open one, or in overlap modes the row
    /// of a round waiting for its commit.
    pub(super) fn step_row(&mut self, step: u64) -> Option<&mut StepAcct> {
        if self.closing.as_ref().is_some_and(|c| c.acct.step() == step) {
            return self.closing.as_mut().map(|c| &mut c.acct);
        }
        self.acct.as_mut().filter(|a| a.step() == step)
    }

    /// Writes the row of `step` parked by [`start_ahead`](Self::start_ahead), with `hash`.
    pub(super) fn emit_closing(&mut self, step: u64, hash: Option<WeightsDigest>) {
        if self.closing.as_ref().is_none_or(|c| c.acct.step() != step) {
            return;
        }
        if let Some(c) = self.closing.take() {
            let row = c.acct.close(c.end, c.bytes, &self.cfg.row, hash);
            self.effects.push_back(Effect::Row(row));
        }
    }

    /// Opens the row of `step` (unless open already); in overlap modes a row left open by a
    /// round whose commit never came is written first.
    pub(super) fn open_row(&mut self, step: u64, now: Time) {
        if self.acct.as_ref().is_some_and(|a| a.step() == step) {
            return;
        }
        if self.overlaps() {
            // A row left open by a round whose commit never came here (a fresh start).
            if let Some(prev) = self.outer_step() {
                self.close_row(prev, now, self.last_digest);
            }
        }
        let epoch = self.member.epoch().unwrap_or_default();
        self.acct = Some(StepAcct::open(step, now, epoch, self.bytes_queued()));
    }

    /// Bytes sent so far, counting the frames queued (they go out at this instant).
    pub(super) fn bytes_queued(&self) -> u64 {
        self.bytes_sent
    }

    /// Writes the open row if it is `step`'s, with `hash` (the weights after the step).
    pub(super) fn close_row(&mut self, step: u64, now: Time, hash: Option<WeightsDigest>) {
        let Some(a) = self.acct.take() else { return };
        if a.step() != step {
            return;
        }
        let row = a.close(now, self.bytes_queued(), &self.cfg.row, hash);
        self.effects.push_back(Effect::Row(row));
    }
}
