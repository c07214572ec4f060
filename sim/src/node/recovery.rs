//! Live recovery on a simulated node, through `loco_core::node::state` (the one protocol both
//! backends speak): the sender's pieces, the joiner's assembly, verification and replay.
//!
//! **What is sent.** With real numerics the replicated part is the encoded [`SharedState`]
//! (`encode_outer_state`) and the own part is empty (the synthetic model has no inner optimiser
//! state): one `0..0` piece from the first sender. With virtual numerics both parts are
//! lengths only ([`virtual_part_lens`]: 16 bytes a parameter in all) and digests are empty;
//! copies are told apart by `outer_step`, the number of outer steps applied.
//!
//! **Pieces.** Both parts are cut by [`PieceRule::Count`] of `joiner GPUs x state_senders`
//! pieces: fixed for the whole fetch (a reassignment's grid lines up with the pieces held), and
//! as many parallel flows as the joiner has GPUs per sender at the first assignment.
//!
//! [`SharedState`]: loco_core::node::state::SharedState

use super::{Node, names};
use bytes::Bytes;
use loco_core::diloco::OuterState;
use loco_core::mesh::{JoinMode, MemberPhase};
use loco_core::metrics::EventKind;
use loco_core::node::acct::Span;
use loco_core::node::digest::weights_digest;
use loco_core::node::state::{
    Expect, PART_OWN, PART_SHARED, PieceRule, Refused, ReplayLog, StateAssembly, Verified,
    encode_outer_state, share_of, state_digest, virtual_part_lens,
};
use loco_core::transport::{Body, Frame, Header, StateHeader};
use loco_core::{Epoch, NodeId};

/// A state transfer being received.
pub(super) struct Fetch {
    /// The pieces of both parts, checked as they arrive.
    assembly: StateAssembly,
    /// The results committed here while the state is on the way (non-blocking mode), replayed
    /// onto it.
    log: ReplayLog,
}

impl Fetch {
    /// Records the result of `outer_step` (`None`: skipped) for the replay.
    pub(super) fn log(&mut self, outer_step: u64, average: Option<Vec<f32>>) {
        self.log.push(outer_step, average);
    }
}

/// One part as the sender sends it: its number, length, digest, and bytes (`None`: virtual).
struct OutPart {
    part: u32,
    total: u64,
    digest: String,
    bytes: Option<Bytes>,
}

/// Whether a refusal means that a sender (or the piece grid) is wrong, rather than a piece that
/// was merely overtaken: a late piece of a dropped sender, of an older copy or an older fetch.
fn is_fault(r: &Refused) -> bool {
    !matches!(
        r,
        Refused::NotAssigned { .. }
            | Refused::OldEpoch { .. }
            | Refused::StaleDigest { .. }
            | Refused::HoldingFull { .. }
    )
}

impl Node {
    fn blocking(&self) -> bool {
        self.run.mesh.join_mode == JoinMode::Blocking
    }

    /// Pieces per part of a state sent to `to`: one per GPU of the joiner for each of the
    /// senders an assignment names at most. It depends on the joiner only, so it is the same
    /// for every sender and every reassignment of one fetch.
    fn state_pieces(&self, to: NodeId) -> u64 {
        let gpus = u64::from(self.run.node(to).spec.gpus.max(1));
        gpus.saturating_mul(self.run.mesh.state_senders.max(1) as u64)
    }

    /// Sends this node's share of its state to a joiner (see [`share_of`]): in blocking mode
    /// the state is frozen and the senders share out the replicated part's pieces; in
    /// non-blocking mode each sends a whole copy of its latest state. The first sender also
    /// sends the own part.
    pub(super) fn send_state(&mut self, epoch: Epoch, to: NodeId, senders: &[NodeId]) {
        let Some(share) = share_of(senders, self.id, self.blocking()) else {
            tracing::debug!(target: "loco_sim", "{}: not among the senders to {to}", self.id);
            return;
        };
        let rule = PieceRule::Count(self.state_pieces(to));
        let outer_step = self.outer.steps();
        let parts = if self.model.is_some() {
            [(PART_SHARED, Bytes::from(encode_outer_state(&self.outer))), (PART_OWN, Bytes::new())]
                .map(|(part, b)| OutPart {
                    part,
                    total: b.len() as u64,
                    digest: state_digest(&b),
                    bytes: Some(b),
                })
        } else {
            let (shared, own) = virtual_part_lens(self.run.params);
            [(PART_SHARED, shared), (PART_OWN, own)].map(|(part, total)| OutPart {
                part,
                total,
                digest: String::new(),
                bytes: None,
            })
        };
        'parts: for p in parts {
            for r in share.pieces(p.part, p.total, rule) {
                let body = match &p.bytes {
                    // The ranges lie within the part, whose length fits memory.
                    Some(b) => Body::Bytes(b.slice(r.start as usize..r.end as usize)),
                    None => Body::Virtual(r.end - r.start),
                };
                let header = Header::State(StateHeader {
                    epoch,
                    outer_step,
                    offset: r.start,
                    total: p.total,
                    digest: p.digest.clone(),
                    part: p.part,
                });
                self.run.frames.set(self.run.frames.get() + 1);
                self.net.enqueue(to, Frame { header, body });
                if self.strike(loco_core::scenario::FaultPhase::StateSend) {
                    break 'parts;
                }
            }
        }
    }

    /// `FetchState`: a new fetch (the pieces that came before it are fed), or new senders for
    /// the one under way (one died: every piece already held is kept).
    pub(super) fn fetch_state(&mut self, epoch: Epoch, senders: Vec<NodeId>) {
        let now = Self::now();
        let who = names(&self.run, &senders);
        let (detail, refused) = match &mut self.fetch {
            Some(f) => {
                let r = f.assembly.reassign(epoch, senders);
                let detail =
                    format!("senders now {who}; {} bytes already held are kept", r.kept_bytes);
                (detail, r.fed.refused)
            }
            None => {
                let expect = match &self.model {
                    Some(_) => Expect::real(self.outer.len(), 0),
                    None => Expect::virtual_params(self.run.params),
                };
                let mut assembly = StateAssembly::new(epoch, senders, self.blocking(), expect);
                let fed = assembly.feed(&mut self.early);
                self.fetch = Some(Fetch { assembly, log: ReplayLog::default() });
                (format!("from {who}"), fed.refused)
            }
        };
        self.run.event(now, EventKind::RecoveryStart, Some(self.id), Some(epoch), detail);
        for r in &refused {
            self.refused(None, r);
        }
        if matches!(self.member.phase(), MemberPhase::Syncing { .. }) {
            if let Some(a) = &mut self.acct {
                a.enter(Span::Recovery, now);
            }
        }
        self.take_state();
    }

    /// A state piece: into the fetch's assembly, or held until the `FetchState` (the
    /// coordinator tells the senders and this node separately).
    pub(super) fn on_state_part(&mut self, from: NodeId, h: StateHeader, body: Body) {
        let Some(f) = &mut self.fetch else {
            if !self.synced {
                if let Err(r) = self.early.hold(from, h, body) {
                    tracing::debug!(target: "loco_sim", "{}: early state piece dropped: {r}", self.id);
                }
            }
            return;
        };
        match f.assembly.put(from, &h, &body) {
            Ok(p) if p.is_complete() => self.take_state(),
            Ok(_) => {}
            Err(r) => self.refused(Some(from), &r),
        }
    }

    /// A piece refused: a violation when a sender or the grid is at fault, else a late piece.
    fn refused(&mut self, from: Option<NodeId>, r: &Refused) {
        if !is_fault(r) {
            tracing::debug!(target: "loco_sim", "{}: state piece refused: {r}", self.id);
            return;
        }
        let mut rec = self.run.rec.borrow_mut();
        let from = from.map_or_else(|| "a sender".to_owned(), |f| rec.name(f));
        let msg = format!("{} refused a state piece from {from}: {r}", rec.name(self.id));
        rec.violation(msg);
    }

    /// Verifies a complete state and takes it; a failure is a violation, and goes back to the
    /// assembly, which waits for another copy of the part that was wrong.
    fn take_state(&mut self) {
        let n = self.outer.len();
        loop {
            let Some(f) = &mut self.fetch else { return };
            let Some(received) = f.assembly.take_complete() else { return };
            match received.verify(n) {
                Ok(v) => return self.install(v),
                Err(failed) => {
                    let msg = format!(
                        "the state {} received from {}: {failed}",
                        self.run.rec.borrow().name(self.id),
                        self.run.rec.borrow().name(failed.own_from)
                    );
                    self.run.rec.borrow_mut().violation(msg);
                    if !f.assembly.retry(*failed) {
                        return;
                    }
                }
            }
        }
    }

    /// Takes a verified state: the outer state from it, the steps committed here meanwhile
    /// replayed onto it (non-blocking mode), this step's pseudo-gradient carried over.
    fn install(&mut self, v: Verified) {
        let Some(f) = self.fetch.take() else { return };
        self.early.clear();
        let now = Self::now();
        let cfg = self.outer.config();
        let restored = match (v.shared, &self.model) {
            (Some(s), Some(_)) => s.into_outer(cfg, Vec::new()).map_err(|e| e.to_string()),
            (None, None) => {
                OuterState::restore(cfg, Vec::new(), Vec::new(), Vec::new(), v.outer_step)
                    .map_err(|e| e.to_string())
            }
            (Some(_), None) => Err("bytes where virtual numerics expect none".to_owned()),
            (None, Some(_)) => Err("no bytes where real numerics expect them".to_owned()),
        };
        let replayed = restored.and_then(|mut outer| {
            let n = f.log.replay_onto(&mut outer).map_err(|e| e.to_string())?;
            Ok((outer, n))
        });
        let (mut outer, replayed) = match replayed {
            Ok(x) => x,
            Err(e) => {
                let msg = format!(
                    "{} received a state as of outer step {} but cannot take it: {e}",
                    self.run.rec.borrow().name(self.id),
                    v.outer_step
                );
                self.run.rec.borrow_mut().violation(msg);
                return;
            }
        };
        // The pseudo-gradient of the step under way carries over to the received state.
        let g = self.outer.take_pseudo_gradient();
        if g.len() == outer.len() {
            let _ = outer.put_pseudo_gradient(g);
        }
        self.outer = outer;
        let mut weights = String::new();
        if let Some(m) = &mut self.model {
            m.inner = self.outer.outer().to_vec();
            weights = format!(", weights {}", weights_digest(self.outer.outer()));
        }
        self.synced = true;
        let epoch = f.assembly.epoch();
        let detail = format!(
            "received {} bytes of state from {} as of outer step {}{weights}{}",
            v.bytes,
            self.run.rec.borrow().name(v.own_from),
            v.outer_step,
            if replayed > 0 { format!(", {replayed} step(s) replayed") } else { String::new() }
        );
        self.run.event(now, EventKind::RecoveryDone, Some(self.id), Some(epoch), detail);
        if matches!(self.member.phase(), MemberPhase::Syncing { .. }) {
            if let Some(a) = &mut self.acct {
                a.enter(Span::Barrier, now);
            }
            if let Err(e) = self.member.report_sync_done(now) {
                tracing::debug!(target: "loco_sim", "{}: sync report refused: {e}", self.id);
            }
        } else {
            self.report_sync = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_faults_of_a_sender_or_the_grid_are_violations() {
        assert!(!is_fault(&Refused::NotAssigned { from: NodeId(1), part: 0 }));
        assert!(!is_fault(&Refused::StaleDigest { part: 0, got: 1, held: 2 }));
        assert!(!is_fault(&Refused::OldEpoch { got: Epoch(1), first: Epoch(2) }));
        assert!(is_fault(&Refused::Overlap { part: 0, offset: 0, len: 1 }));
        assert!(is_fault(&Refused::DigestConflict {
            outer_step: 3,
            got: "a".into(),
            held: "b".into()
        }));
        assert!(is_fault(&Refused::UnexpectedBytes));
    }
}
