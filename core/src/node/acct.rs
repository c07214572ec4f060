//! Step accounting: where one node's wall time went in one outer step, for its row of
//! `outer_steps.csv`. Both backends feed the same [`StepAcct`] with their own clock's [`Time`],
//! so a row means the same in both.
//!
//! At every moment a node is in at most one [`Span`] (or idle). The executor calls
//! [`StepAcct::enter`] when the node starts something (its inner steps, waiting at the barrier,
//! the all-reduce from the first release to the commit, receiving the state, the outer step's
//! own work, a checkpoint's blocking part) and [`StepAcct::leave`] when it stops without starting
//! anything else (a hang). Work done beside the current span, on the node's own loop, is moved
//! into its span with [`StepAcct::spend`]. [`StepAcct::close`] ends the row; what no span
//! covers is `idle_s`.

use crate::digest::WeightsDigest;
use crate::ids::Epoch;
use crate::metrics::OuterStepRow;
use crate::time::Time;
use std::time::Duration;

/// What a node spends time on in an outer step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Span {
    /// Its inner steps (`compute_s`).
    Compute,
    /// Waiting for the others before the all-reduce (`barrier_s`).
    Barrier,
    /// The all-reduce, from the first release to the commit, retries included (`allreduce_s`).
    AllReduce,
    /// Live recovery: receiving the state, or the sender's own share of sending it (`recovery_s`).
    Recovery,
    /// The outer step's own O(model) work: the pseudo-gradient, applying the update, resetting
    /// the inner weights (`outer_s`).
    Outer,
    /// The blocking part of a checkpoint (the snapshot copy; `checkpoint_s`).
    Checkpoint,
}

impl Span {
    const ALL: [Span; 6] = [
        Span::Compute,
        Span::Barrier,
        Span::AllReduce,
        Span::Recovery,
        Span::Outer,
        Span::Checkpoint,
    ];

    fn index(self) -> usize {
        match self {
            Span::Compute => 0,
            Span::Barrier => 1,
            Span::AllReduce => 2,
            Span::Recovery => 3,
            Span::Outer => 4,
            Span::Checkpoint => 5,
        }
    }
}

/// Who writes a row, and on which time base.
#[derive(Clone, Debug)]
pub struct RowIdentity {
    /// The node's name (as in the scenario).
    pub node: String,
    /// Its id on the transport.
    pub node_id: u32,
    /// Seconds added to every [`Time`] in the row: the offset of this process's clock from the
    /// run's time base (0 in the simulator).
    pub offset_s: f64,
}

/// The accounting of one outer step of one node. See the module documentation.
#[derive(Clone, Debug)]
pub struct StepAcct {
    step: u64,
    start: Time,
    bytes0: u64,
    spent: [Duration; 6],
    /// Time moved out of the current span into another by [`StepAcct::spend`].
    lent: Duration,
    /// This step's all-reduce from its first release to its commit.
    allreduce_wall: Duration,
    current: Option<(Span, Time)>,
    epoch: Epoch,
    world: u32,
    weight: f64,
    retries: u32,
    tokens: u64,
    loss: Option<f64>,
    eval_loss: Option<f64>,
}

impl StepAcct {
    /// Opens the row of `step` at `now`, in `epoch`; `bytes_sent` is the node's counter of bytes
    /// sent so far (the row gets the difference at its close).
    pub fn open(step: u64, now: Time, epoch: Epoch, bytes_sent: u64) -> StepAcct {
        StepAcct {
            step,
            start: now,
            bytes0: bytes_sent,
            spent: [Duration::ZERO; 6],
            lent: Duration::ZERO,
            allreduce_wall: Duration::ZERO,
            current: None,
            epoch,
            world: 0,
            weight: 0.0,
            retries: 0,
            tokens: 0,
            loss: None,
            eval_loss: None,
        }
    }

    /// The outer step of this row.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// The span the node is in, if any.
    pub fn current(&self) -> Option<Span> {
        self.current.map(|(s, _)| s)
    }

    /// The time spent in `span` so far (the current stint included, up to `now`).
    pub fn spent(&self, span: Span, now: Time) -> Duration {
        let mut d = self.spent[span.index()];
        if let Some((s, since)) = self.current
            && s == span
        {
            d += now.saturating_since(since).saturating_sub(self.lent);
        }
        d
    }

    /// The node starts `span` at `now` (ending the current one). Entering the span it is in
    /// already changes nothing, so a retry stays one all-reduce stint.
    pub fn enter(&mut self, span: Span, now: Time) {
        if self.current().is_some_and(|s| s == span) {
            return;
        }
        self.leave(now);
        self.current = Some((span, now));
    }

    /// The node stops its current span at `now` without starting another (idle until the next
    /// [`enter`](Self::enter)).
    pub fn leave(&mut self, now: Time) {
        if let Some((s, since)) = self.current.take() {
            let d = now.saturating_since(since).saturating_sub(self.lent);
            self.spent[s.index()] += d;
        }
        self.lent = Duration::ZERO;
    }

    /// `d` of the current span went to `span` instead (work on the node's loop beside it, like
    /// the sender's share of a state transfer while it waits at the barrier). Without a current
    /// span, `d` is taken from idle time.
    pub fn spend(&mut self, span: Span, d: Duration) {
        self.spent[span.index()] += d;
        if self.current.is_some_and(|(s, _)| s != span) {
            self.lent += d;
        }
    }

    /// This step's all-reduce took `d` from its first release to its commit
    /// (`allreduce_wall_s`, outside the spans that tile the row's wall time).
    pub fn set_allreduce_wall(&mut self, d: Duration) {
        self.allreduce_wall = d;
    }

    /// The collective this row's all-reduce runs in: its epoch, world size, this node's weight
    /// and attempt (retries = attempts after the first).
    pub fn ring(&mut self, epoch: Epoch, world: u32, weight: f64, attempt: u32) {
        self.epoch = epoch;
        self.world = world;
        self.weight = weight;
        self.retries = attempt;
    }

    /// The epoch the step ended in (its commit or skip).
    pub fn set_epoch(&mut self, epoch: Epoch) {
        self.epoch = epoch;
    }

    /// Attempts after the first (a skip after `attempts` attempts).
    pub fn set_retries(&mut self, retries: u32) {
        self.retries = retries;
    }

    /// What the inner steps did: tokens processed, the loss at their end, and the held-out loss
    /// of the weights they started from when the executor evaluated them.
    pub fn trained(&mut self, tokens: u64, loss: Option<f64>, eval_loss: Option<f64>) {
        self.tokens = tokens;
        self.loss = loss;
        self.eval_loss = eval_loss;
    }

    /// Closes the row at `now`, with the node's counter of bytes sent and the digest of its outer
    /// weights (`None` while it does not hold the mesh's state).
    pub fn close(
        mut self,
        now: Time,
        bytes_sent: u64,
        who: &RowIdentity,
        weights_hash: Option<WeightsDigest>,
    ) -> OuterStepRow {
        self.leave(now);
        let secs = |s: Span| self.spent[s.index()].as_secs_f64();
        let wall = now.saturating_since(self.start).as_secs_f64();
        let covered: f64 = Span::ALL.iter().map(|s| secs(*s)).sum();
        OuterStepRow {
            outer_step: self.step,
            node: who.node.clone(),
            node_id: who.node_id,
            epoch: self.epoch.0,
            world: self.world,
            start_s: who.offset_s + self.start.as_secs_f64(),
            end_s: who.offset_s + now.as_secs_f64(),
            compute_s: secs(Span::Compute),
            allreduce_s: secs(Span::AllReduce),
            barrier_s: secs(Span::Barrier),
            recovery_s: secs(Span::Recovery),
            checkpoint_s: secs(Span::Checkpoint),
            outer_s: secs(Span::Outer),
            idle_s: (wall - covered).max(0.0),
            allreduce_wall_s: self.allreduce_wall.as_secs_f64(),
            bytes_sent: bytes_sent.saturating_sub(self.bytes0),
            retries: self.retries,
            tokens: self.tokens,
            loss: self.loss,
            eval_loss: self.eval_loss,
            weights_hash,
            weight: self.weight,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: f64) -> Time {
        Time::from_secs_f64(s)
    }

    fn who() -> RowIdentity {
        RowIdentity { node: "a".into(), node_id: 3, offset_s: 100.0 }
    }

    #[test]
    fn spans_split_the_wall_time_and_the_rest_is_idle() {
        let mut a = StepAcct::open(7, t(10.0), Epoch(2), 1000);
        a.enter(Span::Compute, t(10.0));
        a.enter(Span::Barrier, t(14.0));
        a.enter(Span::AllReduce, t(15.0));
        // A retry re-enters the all-reduce: one stint.
        a.enter(Span::AllReduce, t(16.0));
        a.ring(Epoch(3), 4, 1.0, 1);
        a.enter(Span::Outer, t(18.0));
        a.leave(t(18.5));
        let r = a.close(t(19.0), 1500, &who(), Some(WeightsDigest::default()));
        assert_eq!((r.outer_step, r.epoch, r.world, r.retries), (7, 3, 4, 1));
        assert!((r.compute_s - 4.0).abs() < 1e-9);
        assert!((r.barrier_s - 1.0).abs() < 1e-9);
        assert!((r.allreduce_s - 3.0).abs() < 1e-9);
        assert!((r.outer_s - 0.5).abs() < 1e-9);
        assert!((r.idle_s - 0.5).abs() < 1e-9);
        assert_eq!(r.bytes_sent, 500);
        assert!((r.start_s - 110.0).abs() < 1e-9 && (r.end_s - 119.0).abs() < 1e-9);
    }

    #[test]
    fn work_beside_a_span_moves_out_of_it_and_nothing_counts_twice() {
        let mut a = StepAcct::open(0, t(0.0), Epoch(1), 0);
        a.enter(Span::Barrier, t(0.0));
        a.spend(Span::Recovery, Duration::from_secs(2));
        a.enter(Span::AllReduce, t(5.0));
        a.spend(Span::Checkpoint, Duration::from_secs(1));
        let r = a.close(t(9.0), 0, &who(), None);
        assert!((r.barrier_s - 3.0).abs() < 1e-9, "{r:?}");
        assert!((r.recovery_s - 2.0).abs() < 1e-9);
        assert!((r.allreduce_s - 3.0).abs() < 1e-9);
        assert!((r.checkpoint_s - 1.0).abs() < 1e-9);
        let sum = r.compute_s
            + r.barrier_s
            + r.allreduce_s
            + r.recovery_s
            + r.checkpoint_s
            + r.outer_s
            + r.idle_s;
        assert!((sum - r.wall_s()).abs() < 1e-9);
    }

    #[test]
    fn a_hang_pauses_the_span_and_shows_as_idle() {
        let mut a = StepAcct::open(0, t(0.0), Epoch(1), 0);
        a.enter(Span::Compute, t(0.0));
        a.leave(t(2.0));
        assert_eq!(a.current(), None);
        a.enter(Span::Compute, t(5.0));
        assert_eq!(a.spent(Span::Compute, t(6.0)), Duration::from_secs(3));
        let r = a.close(t(6.0), 0, &who(), None);
        assert!((r.compute_s - 3.0).abs() < 1e-9);
        assert!((r.idle_s - 3.0).abs() < 1e-9);
    }
}
