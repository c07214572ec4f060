//! Driving the per-shard rings of one all-reduce attempt of a [`Node`]: starting them at the
//! release, feeding them the collective frames through the inbox, draining their sends, and
//! reporting the attempt done (or failed) to the member.

use super::{Check, Effect, ModelledAllReduce, Node, Reducing, Violation, Work};
use crate::ids::{Epoch, NodeId};
use crate::mesh::{AllReduceStart, UpdateNorms};
use crate::node::acct::Span;
use crate::node::rings::{Admission, FeedError, ShardRings, Values};
use crate::time::Time;
use crate::transport::{Frame, HEADER_WIRE_BYTES};

impl Node {
    /// The member releases an attempt of the all-reduce: the rings of its shards start on the
    /// pseudo-gradient (or its fragment), or the executor models them.
    pub(super) fn start_allreduce(&mut self, start: AllReduceStart, now: Time) {
        self.work = Work::Idle;
        self.check_release(&start);
        self.enter(Span::AllReduce, now);
        if let Some(a) = self.step_row(start.outer_step) {
            let world = u32::try_from(start.ring.len()).unwrap_or(u32::MAX);
            a.ring(start.epoch, world, f64::from(start.weight.get()), start.attempt);
        }
        self.released_at.get_or_insert(now);
        let input = self.ring_input.take();
        // The values this round reduces: every value (one fragment), or its fragment.
        let fragment = self.cfg.schedule.fragment(start.outer_step);
        let values = match (&self.outer, self.real) {
            // The copy the pseudo-gradient's job made (a retry copies again).
            (Some(o), true) => match input {
                Some(g) if g.len() == fragment.len() => Values::Real(g),
                _ => Values::Real(
                    o.pseudo_gradient()
                        .get(fragment.clone())
                        .map(<[f32]>::to_vec)
                        .unwrap_or_default(),
                ),
            },
            _ => Values::Virtual(fragment.len()),
        };
        let (epoch, op) = (start.epoch, start.op);
        let own_norm = match &values {
            Values::Real(v) if self.guarded() && start.weight.get() > 0.0 => Some(l2_norm(v)),
            _ => None,
        };
        let rings = match ShardRings::new(
            start,
            self.cfg.id,
            self.cfg.codec,
            values,
            self.cfg.segment,
        ) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(target: "loco_core", "{}: cannot start the all-reduce: {}", self.cfg.id, e.source);
                let _ = self.member.report_allreduce_failed(now, epoch, op, None, 0);
                return;
            }
        };
        let modelled =
            self.cfg.modelled_collectives && !rings.is_real() && rings.start().ring.len() > 1;
        if modelled {
            let m = ModelledAllReduce { start: rings.start().clone(), shards: rings.plan() };
            self.effects.push_back(Effect::ModelledAllReduce(m));
        }
        let r =
            Reducing { rings, failed: false, modelled, modelled_done: false, own_norm, heard: now };
        self.work = Work::Reducing(Box::new(r));
        // Frames that arrived before this node's release (a neighbour started first).
        let early = self.inbox.take_for((epoch, op));
        self.held.extend(early);
        self.drive_rings(now);
    }

    /// Feeds the held frames, drains the rings' sends and finishes the attempt when it is done.
    pub(super) fn drive_rings(&mut self, now: Time) {
        if self.suspended || !matches!(self.work, Work::Reducing(_)) {
            return;
        }
        while let Some((from, f)) = self.held.pop_front() {
            self.feed(now, from, f);
            if !matches!(self.work, Work::Reducing(_)) {
                return;
            }
        }
        let Work::Reducing(r) = &mut self.work else { return };
        if r.modelled {
            if r.modelled_done && !r.failed && r.rings.complete_virtual() {
                let s = r.rings.stats();
                self.bytes_sent += s.body_bytes_sent + s.frames_sent * HEADER_WIRE_BYTES;
            }
        } else {
            while let Some(t) = r.rings.poll_send() {
                self.transmits.push_back(t);
            }
        }
        if r.failed || !r.rings.is_done() {
            return;
        }
        let Work::Reducing(r) = std::mem::replace(&mut self.work, Work::Idle) else { return };
        let s = r.rings.start().clone();
        if s.ring.len() > 1 {
            let what = format!("outer step {} attempt {} ({})", s.outer_step, s.attempt, s.epoch);
            let c = Check::AllReduceWeights {
                what,
                sums: r.rings.weight_sums(),
                total: f64::from(s.total_weight),
            };
            self.effects.push_back(Effect::Check(c));
        }
        let own = r.own_norm;
        let sent = r.rings.own_sent();
        // Virtual values reduce to an empty average (the step is counted all the same).
        let values = r.rings.into_values();
        let norms = match &values {
            Some(v) if self.guarded() => Some(UpdateNorms { own, average: l2_norm(v) }),
            _ => None,
        };
        if let Err(e) = self.member.report_allreduce_done(now, s.epoch, s.op, norms) {
            tracing::debug!(target: "loco_core", "{}: done refused: {e}", self.cfg.id);
        }
        let average = Some(values.unwrap_or_default());
        self.work = Work::Reduced { epoch: s.epoch, op: s.op, average, sent };
    }

    /// One collective frame through the inbox into the running rings.
    pub(super) fn feed(&mut self, now: Time, from: NodeId, f: Frame) {
        let running = match &self.work {
            Work::Reducing(r) => Some(r.rings.collective()),
            _ => None,
        };
        let f = match self.inbox.admit(self.member.epoch(), running, from, f) {
            Admission::Feed(f) => f,
            Admission::Stale => {
                self.effects.push_back(Effect::Check(Check::StaleFrame));
                return;
            }
            Admission::Held | Admission::Refused | Admission::Dropped => return,
        };
        let Work::Reducing(r) = &mut self.work else { return };
        if from != r.rings.neighbours().0 {
            // Only the ring neighbour on the left sends to this node. A frame from anyone else
            // (stray, or a member that is not in this place of the ring) is dropped and counted:
            // the attempt is not failed for it, so no member can stall a step by sending one.
            self.inbox.count_foreign();
            return;
        }
        r.heard = now;
        if let Err(e) = r.rings.handle_frame(from, &f) {
            let (epoch, op) = r.rings.collective();
            let received = r.rings.stats().frames_received;
            let first = !r.failed;
            r.failed = true;
            // Values that are not finite name their sender; a frame off the schedule does not
            // (it is refused, and the attempt fails as a link would).
            let accused = matches!(
                e,
                FeedError::Ring { source: crate::allreduce::RingError::BadValues { .. }, .. }
            )
            .then_some(from);
            self.violation(Violation::RingRefused { epoch, op, from, error: e.to_string() });
            if first {
                let _ = self.member.report_allreduce_failed(now, epoch, op, accused, received);
            }
        }
    }

    /// When the running attempt fails here for want of frames from the neighbour that sends to
    /// this node ([`MeshConfig::progress_timeout`](crate::mesh::MeshConfig::progress_timeout)
    /// after it was last heard): only while this node waits on it (its rings are not done, it
    /// has not reported a failure, it is not hung, frames move).
    pub(super) fn progress_deadline(&self) -> Option<Time> {
        let Work::Reducing(r) = &self.work else { return None };
        let waiting = !r.failed && !r.modelled && !self.suspended && !r.rings.is_done();
        (waiting && r.rings.start().ring.len() > 1)
            .then(|| r.heard + self.member.config().progress_timeout)
    }

    /// Nothing came from the ring neighbour that sends to this node for the progress timeout:
    /// the attempt failed here, and the report names that neighbour (the coordinator retries
    /// with a ring that gives it another successor, and evicts a member named by two).
    pub(super) fn stalled(&mut self, now: Time) {
        let Work::Reducing(r) = &mut self.work else { return };
        r.failed = true;
        let (epoch, op) = r.rings.collective();
        let left = r.rings.neighbours().0;
        tracing::warn!(
            target: "loco_core",
            "{}: nothing from {left} for {:?} in the all-reduce of {epoch}: attempt failed, naming it",
            self.cfg.id,
            self.member.config().progress_timeout
        );
        let received = r.rings.stats().frames_received;
        let _ = self.member.report_allreduce_failed(now, epoch, op, Some(left), received);
    }

    /// Whether the coordinator guards the averaged update ([`crate::mesh::MeshConfig`]'s
    /// `max_update_ratio`): only then are the norms taken (two passes over the values).
    fn guarded(&self) -> bool {
        self.member.config().max_update_ratio > 0.0
    }

    /// Checks the release against what this node knows: the ring is the epoch's membership (for
    /// the executor's check), and its weight is 1 exactly when it holds a pseudo-gradient.
    fn check_release(&mut self, s: &AllReduceStart) {
        let c = Check::View { epoch: s.epoch, members: s.ring.clone(), what: "release" };
        self.effects.push_back(Effect::Check(c));
        let holds =
            self.grad_step == Some(s.outer_step) && self.member.withheld() != Some(s.outer_step);
        let w = s.weight.get();
        if (w == 1.0) != holds || (w != 0.0 && w != 1.0) {
            let v = Violation::WrongWeight {
                weight: w,
                outer_step: s.outer_step,
                attempt: s.attempt,
                holds,
            };
            self.violation(v);
        }
    }

    /// The member aborts the attempt `(epoch, op)`: the node no longer runs or holds it, and its
    /// frames are dropped.
    pub(super) fn abort_allreduce(&mut self, epoch: Epoch, op: u64) {
        let running = match &self.work {
            Work::Reducing(r) => Some(r.rings.collective()),
            Work::Reduced { epoch, op, .. } => Some((*epoch, *op)),
            _ => None,
        };
        if running == Some((epoch, op)) {
            self.work = Work::Idle;
        }
        self.inbox.abort(epoch, op);
    }
}

/// The L2 norm of `values`, summed in f64 in index order (the same bits on every replica that
/// holds the same values); NaN when any value is NaN, infinite when any is infinite.
fn l2_norm(values: &[f32]) -> f64 {
    // Four sums side by side, so that the loop is not one long chain of dependent adds.
    let mut acc = [0.0f64; 4];
    let mut chunks = values.chunks_exact(4);
    for c in &mut chunks {
        for i in 0..4 {
            acc[i] += f64::from(c[i]) * f64::from(c[i]);
        }
    }
    let tail: f64 = chunks.remainder().iter().map(|&x| f64::from(x) * f64::from(x)).sum();
    ((acc[0] + acc[1]) + (acc[2] + acc[3]) + tail).sqrt()
}
