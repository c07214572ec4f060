//! Live recovery of a [`Node`]: the sender's side (its share of the state cut into pieces,
//! digested ahead of any joiner, and the joiners' asks for pieces again) and the joiner's side
//! (the pieces assembled into a state, asked for again when they do not come, verified by the
//! executor, and installed with the steps committed meanwhile replayed onto it).

use super::effect::SnapshotKey;
use super::{Effect, Node, NodeEvent, StateJob, StatePieces, Violation};
use crate::diloco::OuterState;
use crate::ids::{Epoch, NodeId};
use crate::mesh::{Held, MemberPhase};
use crate::node::acct::Span;
use crate::node::state::{
    Expect, PIECE_MAX, PieceRule, Progress, Refused, ReplayLog, Share, SharedState, StateAssembly,
    Verified, share_of, virtual_part_lens,
};
use crate::time::Time;
use crate::transport::{Body, Frame, Header, StateAsk, StateHeader};
use bytes::Bytes;

/// A state transfer being received.
#[derive(Debug)]
pub(super) struct Fetch {
    pub(super) assembly: StateAssembly,
    /// Results committed here while the state is on the way (non-blocking), replayed onto it.
    pub(super) log: ReplayLog,
    /// A complete copy is with the executor for verification.
    pub(super) verifying: bool,
    /// When to ask the senders for the pieces still missing: set by each piece stored (no
    /// piece for `state_resend_after`), cleared while nothing is missing.
    pub(super) ask_at: Option<Time>,
    /// Asks sent so far (at most [`MAX_ASKS`]).
    asks: u32,
}

/// The most times a joiner asks its senders for missing pieces in one fetch, and a sender
/// answers one joiner's asks in one assignment; past it `sync_timeout` decides.
const MAX_ASKS: u32 = 8;

/// A transfer this node sends (its joiner may ask for pieces again).
pub(super) struct Serving {
    epoch: Epoch,
    senders: Vec<NodeId>,
    asks: u32,
}

impl Node {
    /// Which snapshot the outer state is (`None` while it is lent to a job).
    pub(super) fn snapshot_key(&self) -> Option<SnapshotKey> {
        let o = self.outer.as_ref()?;
        Some((o.steps(), o.outer().as_ptr() as usize, o.momentum().as_ptr() as usize))
    }

    /// Digests the replicated part's pieces ahead of any joiner (off the event loop, while the
    /// inner steps run), so that a sender's first piece leaves at once when one comes.
    pub(super) fn digest_ahead(&mut self) {
        if !self.synced {
            return;
        }
        let (Some(key), Some(outer)) = (self.snapshot_key(), &self.outer) else { return };
        if self.digest_cache.as_ref().is_some_and(|(k, _)| *k == key) {
            return;
        }
        let me = self.cfg.id;
        let job = StateJob {
            epoch: self.member.epoch().unwrap_or_default(),
            to: me,
            share: Share { index: 0, of: 1, sends_own: false },
            rule: self.state_rule(me),
            outer_step: outer.steps(),
            shared: self.real.then(|| SharedState::from_outer(outer)),
            virtual_lens: virtual_part_lens(self.params()),
            only: None,
            key: Some(key),
            known: None,
            ahead: true,
        };
        self.effects.push_back(Effect::PrepareState(job));
    }

    /// How this node cuts the state it sends `to` into pieces.
    fn state_rule(&self, to: NodeId) -> PieceRule {
        match &self.cfg.state_pieces {
            StatePieces::Clamped => PieceRule::Clamped,
            StatePieces::PerJoinerShard { shards } => {
                let g = u64::from(shards.get(&to).copied().unwrap_or(1).max(1));
                let count = g.saturating_mul(self.cfg.mesh.state_senders.max(1) as u64);
                // Real bytes are buffered a piece at a time: no piece above PIECE_MAX.
                if self.real {
                    PieceRule::CountAtMost { count, max_len: PIECE_MAX }
                } else {
                    PieceRule::Count(count)
                }
            }
        }
    }

    /// Sends this node's share of its state to a joiner (see [`share_of`]): in blocking mode the
    /// senders share out the replicated part's pieces; in non-blocking mode each sends a whole
    /// copy of its latest state. The first sender also sends the own part.
    pub(super) fn send_state(&mut self, epoch: Epoch, to: NodeId, senders: &[NodeId]) {
        self.serving.insert(to, Serving { epoch, senders: senders.to_vec(), asks: 0 });
        self.prepare_state(epoch, to, senders, None);
    }

    /// A joiner asks again for pieces of its state: queued until the outer state is here to
    /// snapshot, only from a joiner this node sends to and at most [`MAX_ASKS`] from each (so
    /// the queue stays bounded while the state is lent to the compute), then answered.
    pub(super) fn on_ask(&mut self, from: NodeId, ask: StateAsk) {
        let queued = self.asked.iter().filter(|(f, _)| *f == from).count();
        if !self.serving.contains_key(&from) || queued >= MAX_ASKS as usize {
            tracing::debug!(target: "loco_core", "{}: dropped an ask from {from} ({queued} queued)", self.cfg.id);
            return;
        }
        self.asked.push_back((from, ask));
        self.answer_asks();
    }

    /// Answers the joiners' asks for pieces (once the outer state is here to snapshot): a
    /// joiner this node sends to, under the assignment it sends under, within [`MAX_ASKS`]
    /// and [`StateAsk::MAX_RANGES`]; other asks are dropped.
    pub(super) fn answer_asks(&mut self) {
        while self.outer.is_some() {
            let Some((from, ask)) = self.asked.pop_front() else { return };
            let me = self.cfg.id;
            let Some(s) = self.serving.get_mut(&from) else {
                tracing::debug!(target: "loco_core", "{me}: dropped an ask from {from}, which it does not send to");
                continue;
            };
            let (n, bad) = (ask.ranges.len(), ask.epoch != s.epoch);
            if bad || n == 0 || n > StateAsk::MAX_RANGES || s.asks >= MAX_ASKS {
                tracing::debug!(target: "loco_core", "{me}: dropped an ask from {from} ({n} ranges, epoch {}, asks {})", ask.epoch, s.asks);
                continue;
            }
            s.asks += 1;
            let senders = s.senders.clone();
            tracing::info!(target: "loco_core", "{me}: {from} asks again for {n} range(s) of its state");
            self.prepare_state(ask.epoch, from, &senders, Some(ask.ranges));
        }
    }

    /// Prepares this node's share of its state for `to` (only the pieces overlapping `only`).
    fn prepare_state(
        &mut self,
        epoch: Epoch,
        to: NodeId,
        senders: &[NodeId],
        only: Option<Vec<(u32, u64, u64)>>,
    ) {
        let Some(share) = share_of(senders, self.cfg.id, self.blocking()) else {
            tracing::debug!(target: "loco_core", "{}: not among the senders to {to}", self.cfg.id);
            return;
        };
        let (Some(key), Some(outer)) = (self.snapshot_key(), &self.outer) else { return };
        let known = self.digest_cache.as_ref().filter(|(k, _)| *k == key).map(|(_, d)| d.clone());
        let job = StateJob {
            epoch,
            to,
            share,
            rule: self.state_rule(to),
            outer_step: outer.steps(),
            shared: self.real.then(|| SharedState::from_outer(outer)),
            virtual_lens: virtual_part_lens(self.params()),
            only,
            key: Some(key),
            known,
            ahead: false,
        };
        self.effects.push_back(Effect::PrepareState(job));
    }

    /// `FetchState`: a new fetch (the pieces that came before it are fed), or new senders for
    /// the one under way (one died: every piece already held is kept).
    pub(super) fn fetch_state(
        &mut self,
        epoch: Epoch,
        senders: Vec<NodeId>,
        vouched: Option<Held>,
        now: Time,
    ) {
        // The outer state's buffers go to the assembly: it holds no whole state until it ends.
        self.holds = false;
        let ceiling = step_ceiling(self.member.phase());
        // A blocking joiner in sync mode receives exactly the state the members held at the
        // barrier; in the overlap modes a sender may apply a commit between its arrival and
        // its sending, and a non-blocking joiner replays later commits, so neither is vouched.
        let vouched = vouched.filter(|_| self.real && self.blocking() && !self.overlaps());
        let (kept, refused) = match &mut self.fetch {
            Some(f) => {
                f.assembly.set_ceiling(ceiling);
                f.assembly.set_vouched(vouched);
                let r = f.assembly.reassign(epoch, senders.clone());
                (Some(r.kept_bytes), r.fed.refused)
            }
            None => {
                let expect = match self.real {
                    true => Expect::real(self.params_len(), self.cfg.own_max),
                    false => Expect::virtual_params(self.params()),
                };
                let mut assembly =
                    StateAssembly::new(epoch, senders.clone(), self.blocking(), expect);
                assembly.set_ceiling(ceiling);
                assembly.set_vouched(vouched);
                // A blocking joiner computes nothing until the state is here, which replaces
                // its outer state: the state is written into that state's buffers, not into
                // memory allocated for it (given back should the fetch end without it).
                if self.real
                    && self.blocking()
                    && !self.synced
                    && let Some([o, m]) = self.outer.as_mut().and_then(OuterState::take_buffers)
                {
                    assembly.lend(o, m);
                }
                let fed = assembly.feed(&mut self.early);
                self.fetch = Some(Fetch {
                    assembly,
                    log: ReplayLog::default(),
                    verifying: false,
                    ask_at: None,
                    asks: 0,
                });
                (None, fed.refused)
            }
        };
        let ev = NodeEvent::RecoveryStart { epoch, senders, kept_bytes: kept };
        self.effects.push_back(Effect::Event(ev));
        for r in refused {
            self.refused(None, r);
        }
        if matches!(self.member.phase(), MemberPhase::Syncing { .. })
            && let Some(a) = &mut self.acct
        {
            a.enter(Span::Recovery, now);
        }
        self.take_state(now);
    }

    /// A state piece: into the fetch's assembly, or held until the `FetchState` (the
    /// coordinator tells the senders and this node separately).
    pub(super) fn on_state_part(&mut self, now: Time, from: NodeId, h: StateHeader, body: Body) {
        let Some(f) = &mut self.fetch else {
            if !self.synced
                && let Err(r) = self.early.hold(from, h, body)
            {
                tracing::debug!(target: "loco_core", "{}: early state piece dropped: {r}", self.cfg.id);
            }
            return;
        };
        f.assembly.set_ceiling(step_ceiling(self.member.phase()));
        match f.assembly.put(from, &h, &body) {
            Ok(p) => {
                if matches!(p, Progress::Stored { .. }) {
                    f.ask_at = Some(now + self.cfg.mesh.state_resend_after);
                }
                if p.is_complete() {
                    f.ask_at = None;
                    self.take_state(now);
                }
            }
            Err(r) => {
                // A piece damaged on its way is asked for again at once, from its senders.
                if let Refused::PieceDigest { part, offset, len } = r {
                    self.ask(now, vec![(part, offset, offset.saturating_add(len))]);
                }
                self.refused(Some(from), r);
            }
        }
    }

    /// Asks the current senders for the pieces the fetch lacks (each sends those of its
    /// share), and again after twice the wait, up to [`MAX_ASKS`] times.
    pub(super) fn ask_missing(&mut self, now: Time) {
        let Some(f) = &mut self.fetch else { return };
        f.ask_at = None;
        let ranges = f.assembly.missing();
        self.ask(now, ranges);
    }

    /// Asks the current senders for `ranges` (each sends the pieces of its share that overlap
    /// them), and for what is missing again after twice the wait, up to [`MAX_ASKS`] times.
    fn ask(&mut self, now: Time, ranges: Vec<(u32, u64, u64)>) {
        let Some(f) = &mut self.fetch else { return };
        if ranges.is_empty() || f.verifying || f.asks >= MAX_ASKS {
            return;
        }
        f.asks += 1;
        let wait = self.cfg.mesh.state_resend_after.saturating_mul(1 << f.asks.min(16));
        f.ask_at = Some(now + wait);
        let (epoch, senders) = (f.assembly.epoch(), f.assembly.senders().to_vec());
        tracing::info!(target: "loco_core", "{}: asks {senders:?} again for {} range(s) of its state", self.cfg.id, ranges.len());
        for s in senders {
            let ask = StateAsk { epoch, ranges: ranges.clone() };
            let frame = Frame { header: Header::StateAsk(ask), body: Body::Bytes(Bytes::new()) };
            self.transmits.push_back((s, frame));
        }
    }

    /// A piece refused: a violation when a sender or the grid is at fault, else a late piece.
    fn refused(&mut self, from: Option<NodeId>, r: Refused) {
        if !is_fault(&r) {
            tracing::debug!(target: "loco_core", "{}: state piece refused: {r}", self.cfg.id);
            return;
        }
        self.violation(Violation::PieceRefused { from, refused: r });
    }

    /// Hands a complete state to the executor for verification (one at a time).
    pub(super) fn take_state(&mut self, _now: Time) {
        if self.outer.is_none() {
            return; // taken when the outer state is back
        }
        // The model's count: the outer state's buffers may be lent to the fetch.
        let params = self.params_len();
        let Some(f) = &mut self.fetch else { return };
        if f.verifying {
            return;
        }
        let Some(received) = f.assembly.take_complete() else { return };
        f.verifying = true;
        self.effects.push_back(Effect::VerifyState { received: Box::new(received), params });
    }

    /// Takes a verified state: the outer state from it, the steps committed here meanwhile
    /// replayed onto it (non-blocking mode), this step's pseudo-gradient carried over.
    pub(super) fn install(&mut self, now: Time, v: Verified) {
        let Some(f) = self.fetch.take() else { return };
        let Some(current) = self.outer.as_mut() else {
            self.fetch = Some(f);
            self.verified = Some(v);
            return;
        };
        self.early.clear();
        self.digest_cache = None;
        let cfg = current.config();
        let restored = match (v.shared, self.real) {
            (Some(s), true) => s.into_outer(cfg, Vec::new()).map_err(|e| e.to_string()),
            (None, false) => {
                OuterState::restore(cfg, Vec::new(), Vec::new(), Vec::new(), v.outer_step)
                    .map_err(|e| e.to_string())
            }
            (Some(_), false) => Err("bytes where virtual numerics expect none".to_owned()),
            (None, true) => Err("no bytes where real numerics expect them".to_owned()),
        };
        let replayed = restored.and_then(|mut outer| {
            let n = f.log.replay_onto(&mut outer).map_err(|e| e.to_string())?;
            Ok((outer, n))
        });
        let (mut outer, replayed) = match replayed {
            Ok(x) => x,
            Err(error) => {
                self.violation(Violation::StateUnusable { outer_step: v.outer_step, error });
                return;
            }
        };
        // The pseudo-gradient of the step under way carries over to the received state.
        let g = current.take_pseudo_gradient();
        if g.len() == outer.len() {
            let _ = outer.put_pseudo_gradient(g);
        }
        let weights = self.real.then(|| crate::node::digest::weights_digest(outer.outer()));
        let steps = outer.steps();
        *current = outer;
        self.set_params();
        self.synced = true;
        self.holds = true;
        self.held_digest = weights.map(|d| (steps, d));
        self.digest_ahead();
        let ev = NodeEvent::RecoveryDone {
            epoch: f.assembly.epoch(),
            bytes: v.bytes,
            from: v.own_from,
            outer_step: v.outer_step,
            weights,
            replayed,
        };
        self.effects.push_back(Effect::Event(ev));
        if matches!(self.member.phase(), MemberPhase::Syncing { .. }) {
            if let Some(a) = &mut self.acct {
                a.enter(Span::Barrier, now);
            }
            if let Err(e) = self.member.report_sync_done(now) {
                tracing::debug!(target: "loco_core", "{}: sync report refused: {e}", self.cfg.id);
            }
        } else {
            self.report_sync = true;
        }
    }
}

/// The latest outer step a state piece can be of, as a member in `phase` knows the mesh: a
/// sender can be one commit ahead of what this node has heard (no bound before it knows a step).
fn step_ceiling(phase: crate::mesh::MemberPhase) -> u64 {
    use crate::mesh::MemberPhase as P;
    match phase {
        P::Computing { outer_step }
        | P::AtBarrier { outer_step }
        | P::Syncing { outer_step }
        | P::Reducing { outer_step, .. } => outer_step.saturating_add(1),
        _ => u64::MAX,
    }
}

/// Whether a refusal means that a sender (or the piece grid) is wrong, rather than a piece that
/// was merely overtaken: a late piece of a dropped sender, of an older copy or an older fetch.
pub fn is_fault(r: &Refused) -> bool {
    !matches!(
        r,
        Refused::NotAssigned { .. }
            | Refused::OldEpoch { .. }
            | Refused::StaleDigest { .. }
            | Refused::HoldingFull { .. }
    )
}

#[cfg(test)]
mod tests {
    use super::super::{NodeConfig, Numerics};
    use super::*;
    use crate::codec::CodecKind;
    use crate::diloco::{OuterConfig, Schedule};
    use crate::mesh::MeshConfig;
    use crate::node::acct::RowIdentity;
    use crate::node::state::{PART_SHARED, encoded_len};

    #[test]
    fn only_faults_of_a_sender_or_the_grid_are_violations() {
        assert!(!is_fault(&Refused::NotAssigned { from: NodeId(1), part: 0 }));
        assert!(!is_fault(&Refused::StaleDigest { part: 0, got: 1, held: 2 }));
        assert!(!is_fault(&Refused::OldEpoch { got: Epoch(1), first: Epoch(2) }));
        assert!(is_fault(&Refused::Overlap { part: 0, offset: 0, len: 1 }));
        assert!(is_fault(&Refused::UnexpectedBytes));
    }

    fn node(id: u32) -> Node {
        let cfg = NodeConfig {
            id: NodeId(id),
            mesh: MeshConfig::default(),
            shards: 1,
            codec: CodecKind::Fp32,
            segment: None,
            outer: OuterConfig::default(),
            numerics: Numerics::Real { initial: vec![0.5; 1000] },
            inner_steps: 10,
            schedule: Schedule::sync(1000),
            batch_tokens: 100,
            checkpoint_every: None,
            state_pieces: StatePieces::Clamped,
            own_max: 0,
            row: RowIdentity { node: format!("n{id}"), node_id: id, offset_s: 0.0 },
            virtual_padding: false,
            modelled_collectives: false,
        };
        Node::new(cfg, 1).unwrap()
    }

    fn ask(n: &mut Node, from: u32, epoch: u64, ranges: Vec<(u32, u64, u64)>) -> Vec<StateJob> {
        let header = Header::StateAsk(StateAsk { epoch: Epoch(epoch), ranges });
        n.handle_frame(Time::ZERO, NodeId(from), Frame { header, body: Body::Bytes(Bytes::new()) });
        std::iter::from_fn(|| n.poll_effect())
            .filter_map(|e| match e {
                Effect::PrepareState(job) => Some(job),
                _ => None,
            })
            .collect()
    }

    /// A joiner's ask is answered only by a node that sends to it, under that assignment,
    /// within the bounds on ranges and asks, and only with the pieces asked for.
    #[test]
    fn asks_are_answered_only_for_a_joiner_served_and_within_bounds() {
        let mut n = node(1);
        let whole = vec![(PART_SHARED, 0, u64::MAX)];
        assert!(ask(&mut n, 7, 3, whole.clone()).is_empty(), "it sends to nobody");
        n.send_state(Epoch(3), NodeId(7), &[NodeId(1), NodeId(2)]);
        assert!(matches!(n.poll_effect(), Some(Effect::PrepareState(j)) if j.only.is_none()));
        assert!(ask(&mut n, 8, 3, whole.clone()).is_empty(), "another joiner");
        assert!(ask(&mut n, 7, 4, whole.clone()).is_empty(), "another assignment");
        assert!(ask(&mut n, 7, 3, Vec::new()).is_empty(), "no range");
        let many = vec![(PART_SHARED, 0, 1); StateAsk::MAX_RANGES + 1];
        assert!(ask(&mut n, 7, 3, many).is_empty(), "too many ranges");
        let some = vec![(PART_SHARED, 100, 200)];
        for _ in 0..MAX_ASKS {
            let jobs = ask(&mut n, 7, 3, some.clone());
            assert_eq!(jobs.len(), 1);
            assert_eq!(jobs[0].only.as_deref(), Some(some.as_slice()));
            assert_eq!((jobs[0].to(), jobs[0].epoch), (NodeId(7), Epoch(3)));
        }
        assert!(ask(&mut n, 7, 3, some).is_empty(), "beyond the asks an assignment allows");
    }

    /// While the outer state is lent to the compute, asks wait in a queue: only a served
    /// joiner's, at most `MAX_ASKS` of them; a flood from anyone else queues nothing.
    #[test]
    fn asks_queued_while_the_state_is_lent_are_bounded() {
        let mut n = node(1);
        n.send_state(Epoch(3), NodeId(7), &[NodeId(1)]);
        while n.poll_effect().is_some() {}
        let lent = n.outer.take();
        let some = vec![(PART_SHARED, 100, 200)];
        for _ in 0..1000 {
            assert!(ask(&mut n, 8, 3, some.clone()).is_empty());
            assert!(ask(&mut n, 7, 3, some.clone()).is_empty());
        }
        assert_eq!(n.asked.len(), MAX_ASKS as usize, "the served joiner's, bounded");
        n.outer = lent;
        n.answer_asks();
        let jobs = std::iter::from_fn(|| n.poll_effect())
            .filter(|e| matches!(e, Effect::PrepareState(_)))
            .count();
        assert_eq!(jobs, MAX_ASKS as usize);
    }

    /// A synced node digests its snapshot ahead of any joiner (nothing is sent); a joiner's
    /// job of that snapshot then hashes nothing of the replicated part, and its pieces carry
    /// the digests computed ahead. Once is enough per snapshot; an outer step makes another.
    #[test]
    fn the_snapshot_is_digested_ahead_and_a_joiners_job_hashes_nothing_again() {
        let mut n = node(1);
        n.digest_ahead();
        assert!(n.poll_effect().is_none(), "not synced: nothing to send anyone");
        n.synced = true;
        n.digest_ahead();
        let Some(Effect::PrepareState(job)) = n.poll_effect() else { panic!("a job ahead") };
        assert!(job.ahead);
        let p = job.prepare(None);
        assert_eq!(p.bytes(), encoded_len(1000), "the replicated part, hashed");
        assert_eq!(p.frames().count(), 0);
        let ahead = p.shared_digests().expect("real bytes").1;
        n.state_prepared(Time::ZERO, p);
        assert!(n.transmits.is_empty());
        n.digest_ahead();
        assert!(n.poll_effect().is_none(), "digested already");
        n.send_state(Epoch(3), NodeId(7), &[NodeId(1)]);
        let Some(Effect::PrepareState(j)) = n.poll_effect() else { panic!("a job") };
        let p = j.prepare(None);
        assert_eq!(p.bytes(), 0, "nothing hashed before the first piece (an empty own part)");
        let frames: Vec<_> = p.frames().collect();
        for f in &frames {
            let (Header::State(h), Body::Bytes(b)) = (&f.header, &f.body) else { panic!() };
            if h.part == PART_SHARED {
                assert_eq!(h.digest, ahead.digest);
                assert_eq!(h.piece, crate::node::state::piece_digest(b));
            }
        }
        assert!(frames.len() > 1);
        if let Some(o) = n.outer.as_mut() {
            o.apply_outer_step();
        }
        n.digest_ahead();
        assert!(matches!(n.poll_effect(), Some(Effect::PrepareState(j)) if j.ahead));
    }

    /// A resend of the same snapshot reuses the digest the first preparation computed (the
    /// whole part is not hashed again for a few pieces); an outer step makes a new snapshot.
    #[test]
    fn a_resend_of_the_same_snapshot_reuses_its_digest() {
        let mut n = node(1);
        n.send_state(Epoch(3), NodeId(7), &[NodeId(1)]);
        let Some(Effect::PrepareState(first)) = n.poll_effect() else { panic!("a job") };
        assert!(first.known.is_none());
        let p = first.prepare(None);
        let digests = p.shared_digests().expect("real bytes").1;
        let digest = digests.digest;
        n.state_prepared(Time::ZERO, p);
        let again = ask(&mut n, 7, 3, vec![(PART_SHARED, 0, 10)]);
        assert_eq!(again[0].known.as_ref(), Some(&digests));
        let frames: Vec<_> = again.into_iter().next().unwrap().prepare(None).frames().collect();
        assert!(!frames.is_empty());
        for f in &frames {
            let Header::State(h) = &f.header else { panic!("a state frame") };
            assert!(h.part != PART_SHARED || h.digest == digest);
        }
        // After an outer step the snapshot is another: its digest is computed afresh.
        if let Some(o) = n.outer.as_mut() {
            o.apply_outer_step();
        }
        let fresh = ask(&mut n, 7, 3, vec![(PART_SHARED, 0, 10)]);
        assert!(fresh[0].known.is_none());
    }
}
