//! What the node machine asks of its executor ([`Effect`]) and the O(model) jobs it hands out
//! ([`OuterJob`], [`StateJob`]); what it reports is in [`super::report`].

use super::report::{Check, NodeEvent};
use crate::digest::WeightsDigest;
use crate::diloco::OuterState;
use crate::ids::{Epoch, NodeId};
use crate::mesh::{AllReduceStart, StopReason};
use crate::metrics::OuterStepRow;
use crate::node::digest::{weights_digest, weights_digest_parallel};
use crate::node::state::{
    PART_OWN, PART_SHARED, PartDigests, PieceRule, Received, Segments, Share, SharedState,
    Verified, VerifyFailed,
};
use crate::transport::{Body, Frame, Header, StateHeader};
use bytes::Bytes;
use std::sync::Arc;

/// What the executor carries out for the machine. Drain with
/// [`Node::poll_effect`](super::Node::poll_effect) after every input, in order. Effects that
/// name an input to call back (`Compute`, `Outer`, `PrepareState`, `VerifyState`) leave the
/// machine waiting for it; the others are fire-and-forget.
#[derive(Debug)]
pub enum Effect {
    /// Run the `inner_steps` inner steps of `outer_step` from the current parameters (as last
    /// set by [`Effect::SetParams`]), then call [`Node::computed`](super::Node::computed).
    /// The time they take is the executor's: the machine only waits.
    Compute {
        /// The epoch the step is computed in.
        epoch: Epoch,
        /// The outer step.
        outer_step: u64,
        /// Inner steps to run (`H`).
        inner_steps: u64,
    },
    /// Set the inner model's parameters to these outer weights (real numerics only).
    SetParams(Vec<f32>),
    /// O(model) work on the outer state, which is lent out with the job: run
    /// [`OuterJob::run`] (off the event loop where that matters), charge its time if the
    /// executor models one, then give it back with [`Node::outer_done`](super::Node::outer_done).
    /// Until then the machine defers every membership action but its sends.
    Outer(Box<OuterJob>),
    /// Encode this node's share of its state for a joiner ([`StateJob::prepare`], O(model)),
    /// then hand it back with [`Node::state_prepared`](super::Node::state_prepared); the
    /// machine queues the pieces as transmits.
    PrepareState(StateJob),
    /// Check and decode a complete state ([`Received::verify`], O(state)), then hand the result
    /// to [`Node::state_verified`](super::Node::state_verified).
    VerifyState {
        /// The state as assembled (boxed: it is large beside the other effects).
        received: Box<Received>,
        /// The number of parameters of this node's model.
        params: usize,
    },
    /// A checkpoint of `outer_step` is due (every `checkpoint_every` steps): the executor
    /// writes it, or does nothing if it writes none.
    Checkpoint {
        /// The step just committed.
        outer_step: u64,
        /// The outer state after that commit, copied by its [`OuterJob`] (real numerics): the
        /// O(model) snapshot is made off the executor's event loop too.
        snapshot: Option<Snapshot>,
    },
    /// A finished row of `outer_steps.csv`.
    Row(OuterStepRow),
    /// A row of `events.csv` of this node.
    Event(NodeEvent),
    /// An observation for the invariant checks (the simulator checks them; real may log).
    Check(Check),
    /// Model this virtual all-reduce's time ([`NodeConfig::modelled_collectives`](super::NodeConfig::modelled_collectives)):
    /// its rings send no frame. When the modelled schedule has every frame of the attempt
    /// here, call [`Node::allreduce_modelled`](super::Node::allreduce_modelled); when this node
    /// would have found a ring neighbour unreachable, [`Node::peer_unreachable`](super::Node::peer_unreachable).
    ModelledAllReduce(ModelledAllReduce),
    /// The member stopped. `rejoin`: the node's supervisor restarts it with a new incarnation
    /// after a heartbeat interval ([`Node::restart`](super::Node::restart)); otherwise the
    /// process exits.
    Stop {
        /// Why.
        reason: StopReason,
        /// Whether to restart and join again (an eviction, or the coordinator went silent).
        rejoin: bool,
    },
}

/// A virtual all-reduce whose time the executor models (see [`Effect::ModelledAllReduce`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelledAllReduce {
    /// The release: epoch, op, ring order, shards.
    pub start: AllReduceStart,
    /// Per shard, its values and its pipelining unit in values.
    pub shards: Vec<(usize, usize)>,
}

/// A copy of the outer state for a checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// The outer weights.
    pub outer: Vec<f32>,
    /// The outer optimiser's momentum.
    pub momentum: Vec<f32>,
    /// Error feedback's residual (empty without it).
    pub residual: Vec<f32>,
}

/// What an [`OuterJob`] does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OuterKind {
    /// Compute the pseudo-gradient `outer - inner` after the inner steps (or zero it when this
    /// node holds no valid weights for the step).
    PseudoGradient,
    /// Apply the outer step with the all-reduce's average.
    Commit,
    /// Skip the step: the outer weights stay.
    Skip,
}

/// O(model) work on the outer state, with the state lent to it. See [`Effect::Outer`].
#[derive(Debug)]
pub struct OuterJob {
    pub(super) outer: OuterState,
    pub(super) kind: OuterKind,
    pub(super) outer_step: u64,
    /// The inner weights (pseudo-gradient) or the average (commit).
    pub(super) values: Option<Vec<f32>>,
    /// Pseudo-gradient: whether the inner steps started from valid weights.
    pub(super) valid: bool,
    /// Pseudo-gradient: how many of its values were not finite (it was zeroed, and is withheld
    /// from the average).
    pub(super) nonfinite: usize,
    /// Compute the digest of the outer weights after the work.
    pub(super) want_digest: bool,
    pub(super) digest: Option<WeightsDigest>,
    /// Make [`copy`](Self::copy) after the work (real numerics): so that the O(model) copy the
    /// machine hands on is made off the executor's event loop too.
    pub(super) want_copy: bool,
    /// Pseudo-gradient: a copy of it (the all-reduce's input, in the inner weights' buffer);
    /// commit and skip: a copy of the outer weights (the next [`Effect::SetParams`]).
    pub(super) copy: Option<Vec<f32>>,
    /// Commit: make [`snapshot`](Self::snapshot) after it (a checkpoint is due).
    pub(super) want_snapshot: bool,
    pub(super) snapshot: Option<Snapshot>,
    pub(super) params: u64,
    /// Overlap and streaming modes: the pseudo-gradient is the end of a round
    /// ([`OuterState::overlap_round`]); a commit averages only this fragment.
    pub(super) round: Option<RoundJob>,
    /// Commit: what this node's codec sent of its contribution (error feedback's residual).
    pub(super) sent: Option<Box<crate::diloco::SentContribution>>,
    /// Threads of the element-wise passes ([`run_sharded`](Self::run_sharded)).
    shards: usize,
    done: bool,
}

/// What one round of overlapped or streaming DiLoCo merges and synchronises.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct RoundJob {
    /// The fragment synchronised a round ago, merged now (pseudo-gradient jobs).
    pub(super) merge: Option<std::ops::Range<usize>>,
    /// The fragment of this round: synchronised (pseudo-gradient) or averaged (commit).
    pub(super) fragment: std::ops::Range<usize>,
    /// The merge's mix.
    pub(super) mix: f32,
}

impl OuterJob {
    pub(super) fn new(outer: OuterState, kind: OuterKind, outer_step: u64, params: u64) -> Self {
        OuterJob {
            outer,
            kind,
            outer_step,
            values: None,
            valid: false,
            nonfinite: 0,
            want_digest: false,
            digest: None,
            want_copy: false,
            copy: None,
            want_snapshot: false,
            snapshot: None,
            params,
            round: None,
            sent: None,
            shards: 1,
            done: false,
        }
    }

    /// What the job does.
    pub fn kind(&self) -> OuterKind {
        self.kind
    }

    /// The outer step it belongs to.
    pub fn outer_step(&self) -> u64 {
        self.outer_step
    }

    /// Parameters of the model it works on (the virtual count with virtual numerics): what a
    /// modelled per-parameter cost is charged for.
    pub fn params(&self) -> u64 {
        self.params
    }

    /// The share of the model whose per-parameter cost the job is charged (a modelled cost):
    /// all of it, or in overlap modes one fragment's share (a round merges one fragment and
    /// synchronises one, a commit updates one).
    pub fn cost_share(&self) -> f64 {
        match &self.round {
            Some(r) if self.params > 0 => r.fragment.len() as f64 / self.params as f64,
            _ => 1.0,
        }
    }

    /// [`run`](Self::run) with the element-wise passes (the pseudo-gradient, the outer step)
    /// on `shards` threads, one per shard of the node's rings, and the weights digest on the
    /// thread pool: the same values, for an executor with the cores (a real node of G GPUs).
    /// The simulator calls [`run`](Self::run): no OS threads on the simulated path.
    pub fn run_sharded(&mut self, shards: usize) {
        self.shards = shards.max(1);
        self.run();
    }

    /// Does the work (once; a second call is a no-op). O(model): run it where the executor's
    /// event loop does not wait for it.
    pub fn run(&mut self) {
        if self.done {
            return;
        }
        self.done = true;
        match self.kind {
            OuterKind::PseudoGradient if self.round.is_some() => {
                self.run_round();
                return;
            }
            OuterKind::Commit if self.round.is_some() => {
                let fragment = self.round.as_ref().map(|r| r.fragment.clone()).unwrap_or(0..0);
                let applied = match self.values.as_deref() {
                    Some(avg) => self.outer.apply_outer_step_to(fragment, avg).is_ok(),
                    None => false,
                };
                if !applied {
                    // No result (a violation the machine reported): the count of steps stays.
                    self.outer.skip_outer_step();
                }
            }
            OuterKind::PseudoGradient => {
                if self.outer.is_empty() {
                    return;
                }
                let computed = match self.values.as_deref() {
                    Some(inner) if self.valid => {
                        self.outer.compute_pseudo_gradient_sharded(inner, self.shards).ok()
                    }
                    _ => None,
                };
                self.nonfinite = computed.unwrap_or(0);
                // A NaN times weight 0 is still NaN: a withheld pseudo-gradient goes in as zeros.
                if computed != Some(0) {
                    self.outer.pseudo_gradient_mut().fill(0.0);
                } else {
                    // Error feedback: the contribution carries what was not sent before.
                    self.outer.add_residual();
                }
                if self.want_copy {
                    // The inner weights' buffer becomes the copy: no allocation.
                    let mut buf = self.values.take().unwrap_or_default();
                    buf.clear();
                    buf.extend_from_slice(self.outer.pseudo_gradient());
                    self.copy = Some(buf);
                }
                return;
            }
            OuterKind::Commit => match self.values.as_deref() {
                Some(avg) if avg.len() == self.outer.len() => {
                    if let Some(sent) = &self.sent {
                        self.outer.keep_residual(sent);
                    }
                    self.outer.pseudo_gradient_mut().copy_from_slice(avg);
                    self.outer.apply_outer_step_sharded(self.shards);
                }
                // No result (a violation the machine reported): the count of steps stays right.
                _ => self.outer.skip_outer_step(),
            },
            OuterKind::Skip => match &self.round {
                Some(r) => self.outer.skip_round(r.fragment.clone()),
                None => self.outer.skip_outer_step(),
            },
        }
        if self.want_digest {
            self.digest = Some(if self.shards > 1 {
                weights_digest_parallel(self.outer.outer())
            } else {
                weights_digest(self.outer.outer())
            });
        }
        if self.want_copy {
            self.copy = Some(self.outer.outer().to_vec());
        }
        if self.want_snapshot {
            let (outer, momentum) = (self.outer.outer().to_vec(), self.outer.momentum().to_vec());
            let residual = self.outer.residual().to_vec();
            self.snapshot = Some(Snapshot { outer, momentum, residual });
        }
    }
}

impl OuterJob {
    /// The end of a round of overlapped or streaming DiLoCo: merge, then sync
    /// ([`OuterState::overlap_round`]) on the inner weights in place, which become the next
    /// round's parameters; the copy is this round's fragment of the pseudo-gradient.
    fn run_round(&mut self) {
        let Some(r) = self.round.clone() else { return };
        if self.outer.is_empty() {
            return; // lengths only
        }
        let Some(mut inner) = self.values.take() else { return };
        match self.outer.overlap_round(&mut inner, r.merge, r.fragment.clone(), r.mix, self.valid) {
            Ok(bad) => self.nonfinite = bad,
            Err(e) => {
                tracing::warn!(target: "loco_core", "round of step {}: {e}", self.outer_step);
                return;
            }
        }
        if self.want_copy {
            self.copy = self.outer.pseudo_gradient().get(r.fragment).map(<[f32]>::to_vec);
        }
        self.values = Some(inner);
    }
}

/// A state to encode for a joiner. See [`Effect::PrepareState`].
#[derive(Debug)]
pub struct StateJob {
    pub(super) epoch: Epoch,
    pub(super) to: NodeId,
    pub(super) share: Share,
    pub(super) rule: PieceRule,
    pub(super) outer_step: u64,
    /// A snapshot of the replicated part (real numerics); `None`: virtual lengths.
    pub(super) shared: Option<SharedState>,
    pub(super) virtual_lens: (u64, u64),
    /// Only the pieces overlapping these `(part, start, end)` ranges (a joiner's
    /// [`StateAsk`](crate::transport::StateAsk)); `None`: the whole share.
    pub(super) only: Option<Vec<(u32, u64, u64)>>,
    /// Which snapshot the replicated part is, and its pieces' digests when an earlier job of
    /// the same snapshot computed them (ahead, after the outer step; a resend; a second
    /// joiner): not computed again.
    pub(super) key: Option<SnapshotKey>,
    pub(super) known: Option<Arc<PartDigests>>,
    /// A job that only computes the replicated part's digests, ahead of any joiner, so that a
    /// later job's first piece leaves at once (nothing is sent).
    pub(super) ahead: bool,
}

/// A snapshot of the replicated part: its outer step and its two buffers' addresses (a buffer
/// changes in place only in an outer step, which counts a step).
pub(super) type SnapshotKey = (u64, usize, usize);

impl StateJob {
    /// Replaces the snapshot's outer weights by others (each plus one), its digests made afresh
    /// from them: a sender that forges a whole state, consistent in itself (the tests of
    /// vouched states).
    #[cfg(any(test, feature = "testing"))]
    pub fn forge(&mut self) {
        let Some(s) = self.shared.take() else { return };
        let (steps, mut outer, momentum) = s.into_parts();
        outer.iter_mut().for_each(|x| *x += 1.0);
        self.shared = SharedState::new(steps, outer, momentum).ok();
        (self.key, self.known) = (None, None);
    }

    /// A sender's job of real bytes outside a node machine (benchmarks: `loco bench recovery`):
    /// `share` of `shared` (and of an own part, if the share says so) for joiner `to` under the
    /// assignment of `epoch`, cut by `rule`.
    pub fn real(
        epoch: Epoch,
        to: NodeId,
        share: Share,
        rule: PieceRule,
        shared: SharedState,
    ) -> StateJob {
        let outer_step = shared.outer_steps();
        StateJob {
            epoch,
            to,
            share,
            rule,
            outer_step,
            shared: Some(shared),
            virtual_lens: (0, 0),
            only: None,
            key: None,
            known: None,
            ahead: false,
        }
    }

    /// The digests of the replicated part's pieces, computed already (as a worker computes
    /// them after its outer step): [`prepare`](Self::prepare) does not hash that part again.
    pub fn with_known(mut self, known: Arc<PartDigests>) -> StateJob {
        self.known = Some(known);
        self
    }

    /// The replicated part's digests for this job's snapshot and grid (O(state), on the thread
    /// pool): what [`with_known`](Self::with_known) takes. `None` for virtual numerics.
    pub fn shared_digests(&self) -> Option<Arc<PartDigests>> {
        let s = self.shared.clone()?.into_segments();
        Some(Arc::new(PartDigests::of(&s, self.rule)))
    }

    /// The joiner.
    pub fn to(&self) -> NodeId {
        self.to
    }

    /// Whether this sender sends its own part (the inner optimiser's state): the executor
    /// exports it for [`prepare`](Self::prepare).
    pub fn sends_own(&self) -> bool {
        self.share.sends_own
    }

    /// Takes the snapshot's parts and digests their pieces (O(state) on the thread pool,
    /// unless the replicated part's digests are known). `own`: the inner optimiser's state, or
    /// `None` for an empty own part (a model without one). The bytes are not copied: the pieces
    /// are slices of the snapshot's buffers.
    pub fn prepare(mut self, own: Option<Vec<u8>>) -> PreparedState {
        let rule = self.rule;
        let known = self.known.take();
        let sends_own = self.share.sends_own && !self.ahead;
        let parts = match self.shared.take() {
            Some(s) => {
                let shared = s.into_segments();
                let own = Segments::new([Bytes::from(own.unwrap_or_default())]);
                let shared_digests = known
                    .filter(|k| k.fits(shared.len(), rule))
                    .map(|k| (k, false))
                    .unwrap_or_else(|| (Arc::new(PartDigests::of(&shared, rule)), true));
                // Only the sender of the own part hashes it.
                let own_digests = sends_own.then(|| (Arc::new(PartDigests::of(&own, rule)), true));
                vec![(PART_SHARED, shared, Some(shared_digests)), (PART_OWN, own, own_digests)]
                    .into_iter()
                    .map(|(part, b, d)| PreparedPart {
                        part,
                        total: b.len(),
                        hashed: d.as_ref().is_some_and(|(_, fresh)| *fresh),
                        digests: d.map(|(d, _)| d),
                        bytes: Some(b),
                    })
                    .collect()
            }
            None => {
                // Virtual numerics: lengths only. The replicated part counts as hashed unless
                // a job of this snapshot hashed it already, as with real bytes.
                let (shared, own) = self.virtual_lens;
                let known = known.is_some_and(|k| k.fits(shared, rule));
                vec![
                    PreparedPart {
                        part: PART_SHARED,
                        total: shared,
                        hashed: !known,
                        digests: Some(Arc::new(PartDigests::virtual_len(shared, rule))),
                        bytes: None,
                    },
                    PreparedPart {
                        part: PART_OWN,
                        total: own,
                        hashed: sends_own,
                        digests: None,
                        bytes: None,
                    },
                ]
            }
        };
        PreparedState { job: self, parts }
    }
}

/// One part of a prepared state.
#[derive(Debug)]
pub(super) struct PreparedPart {
    pub(super) part: u32,
    pub(super) total: u64,
    /// Its pieces' digests (`None`: a part this sender does not send).
    pub(super) digests: Option<Arc<PartDigests>>,
    /// Whether this job hashed it (what a simulator charges for).
    pub(super) hashed: bool,
    pub(super) bytes: Option<Segments>,
}

/// A state encoded for a joiner: give it to [`Node::state_prepared`](super::Node::state_prepared).
#[derive(Debug)]
pub struct PreparedState {
    pub(super) job: StateJob,
    pub(super) parts: Vec<PreparedPart>,
}

impl PreparedState {
    /// The joiner.
    pub fn to(&self) -> NodeId {
        self.job.to
    }

    /// The replicated part's snapshot and its pieces' digests, for the next job of the same
    /// snapshot.
    pub(super) fn shared_digests(&self) -> Option<(SnapshotKey, Arc<PartDigests>)> {
        let p = self.parts.iter().find(|p| p.part == PART_SHARED)?;
        Some((self.job.key?, p.digests.clone()?))
    }

    /// Whether this was a job ahead of any joiner ([`StateJob::ahead`]): nothing to send.
    pub fn is_ahead(&self) -> bool {
        self.job.ahead
    }

    /// The bytes this sender hashed before its first piece (what a simulator charges its
    /// preparation for): the whole replicated part's length unless its digests were known
    /// (every piece is hashed, whichever of them this sender sends: the part's digest names
    /// them all), plus the own part's if this sender sends it. Virtual numerics count their
    /// virtual lengths ([`virtual_part_lens`](crate::node::state::virtual_part_lens)).
    pub fn bytes(&self) -> u64 {
        self.parts.iter().filter(|p| p.hashed).fold(0u64, |n, p| n.saturating_add(p.total))
    }

    /// The state frames of this sender's share (of the pieces asked for, for a resend), in
    /// sending order (each part's pieces in turn; bodies are slices of the encoded parts, not
    /// copies). None for a job ahead of any joiner.
    pub fn frames(&self) -> impl Iterator<Item = Frame> + '_ {
        let job = &self.job;
        let parts = if job.ahead { &[][..] } else { &self.parts[..] };
        parts.iter().flat_map(move |part| {
            let asked = move |r: &std::ops::Range<u64>| {
                job.only.as_ref().is_none_or(|only| {
                    only.iter().any(|&(p, lo, hi)| {
                        p == part.part
                            && ((r.start < hi && lo < r.end)
                                || (r.is_empty() && lo <= r.start && r.start <= hi))
                    })
                })
            };
            job.share.pieces(part.part, part.total, job.rule).filter(asked).map(move |r| {
                let body = match &part.bytes {
                    Some(b) => Body::Bytes(b.slice(r.clone())),
                    None => Body::Virtual(r.end - r.start),
                };
                let d = part.digests.as_deref();
                let header = Header::State(StateHeader {
                    epoch: job.epoch,
                    outer_step: job.outer_step,
                    offset: r.start,
                    total: part.total,
                    digest: d.and_then(|d| d.digest),
                    piece: d.and_then(|d| d.piece_at(r.start)).unwrap_or_default(),
                    part: part.part,
                });
                Frame { header, body }
            })
        })
    }
}

/// What [`Node::state_verified`](super::Node::state_verified) takes.
pub type VerifyResult = Result<Verified, Box<VerifyFailed>>;

#[cfg(test)]
mod tests;
