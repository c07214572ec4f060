//! A complete state, its verification (O(state): executors run it off their event loop), and
//! what a failure keeps.

use super::part::PartBytes;
use super::wire::{SharedState, StateError};
use crate::digest::{Blake3Digest, HexOrEmpty, WeightsDigest};
use crate::ids::NodeId;
use crate::mesh::Held;
use std::fmt;

/// One complete part as assembled: plain data, moved out of the assembly.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReceivedPart {
    /// The `outer_step` of its pieces.
    pub outer_step: u64,
    /// The digest its pieces claimed.
    pub digest: Option<Blake3Digest>,
    /// Its length (real or virtual).
    pub total: u64,
    /// Its bytes; `None` for virtual numerics.
    pub bytes: Option<PartBytes>,
    /// The part's digest ([`part_digest`](super::part_digest)) from the digests its pieces'
    /// bytes were checked against as they arrived; `None`: not checked (refused with bytes).
    pub hashed: Option<Blake3Digest>,
}

impl ReceivedPart {
    fn check(&self) -> Result<(), PartFault> {
        if self.bytes.is_none() {
            return Ok(());
        }
        match self.hashed {
            Some(d) if Some(d) == self.digest => Ok(()),
            actual => Err(PartFault::Digest { claimed: self.digest, actual }),
        }
    }

    fn reject(self, fault: PartFault) -> Rejected {
        Rejected { outer_step: self.outer_step, digest: self.digest, fault }
    }
}

/// Both parts of a state, complete, not yet verified ([`StateAssembly::take_complete`]).
///
/// [`StateAssembly::take_complete`]: super::StateAssembly::take_complete
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Received {
    /// The replicated part (an encoded [`SharedState`]).
    pub shared: ReceivedPart,
    /// The own part (the inner optimiser's state, opaque).
    pub own: ReceivedPart,
    /// Who sent the own part.
    pub own_from: NodeId,
    /// The state the members vouch for: the replicated part must be of its outer step and,
    /// where it names one, hold weights of its digest. `None`: any.
    pub vouched: Option<Held>,
}

/// Why one part failed verification.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PartFault {
    /// The pieces' checked digests do not make the part's digest they claimed (pieces of
    /// copies that differ, or a part whose pieces were not checked).
    #[error(
        "digest {} is not the {} claimed",
        actual.map_or_else(|| "of unchecked pieces".to_owned(), |d| d.to_string()),
        HexOrEmpty(claimed)
    )]
    Digest {
        /// Claimed by the pieces (`None`: no digest, as for virtual numerics).
        claimed: Option<Blake3Digest>,
        /// Of the bytes received; `None`: of pieces not checked.
        actual: Option<Blake3Digest>,
    },
    /// The digest matched, but the replicated part does not decode.
    #[error("does not decode: {0}")]
    Decode(StateError),
    /// The replicated part decodes to values that are not finite: no node could have committed
    /// them (a diverged or hostile sender), so the state is not installed.
    #[error("holds a value that is not finite: {what} {index}")]
    NotFinite {
        /// Which vector: the outer weights or the momentum.
        what: &'static str,
        /// The index of the first such value.
        index: usize,
    },
    /// The replicated part is not the state the members vouch for: another outer step, or
    /// other weights (a sender that forged a whole state, its digests consistent).
    #[error(
        "is not the state the members hold: outer step {outer_step}, weights {}; they vouch for \
         outer step {}, weights {}",
        HexOrEmpty(weights),
        vouched.outer_step,
        HexOrEmpty(&vouched.digest)
    )]
    NotVouched {
        /// Outer steps of the state received.
        outer_step: u64,
        /// Its weights' digest (`None`: not computed, the step differing).
        weights: Option<WeightsDigest>,
        /// What the members vouch for.
        vouched: Held,
    },
    /// The replicated part decodes to another outer step than its pieces said.
    #[error("holds outer step {inside}, its pieces said {header}")]
    Step {
        /// `outer_step` of the pieces.
        header: u64,
        /// `outer_steps` of the decoded state.
        inside: u64,
    },
}

/// A part that failed verification: which copy it was, and why. Its bytes are dropped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejected {
    /// The `outer_step` of its pieces.
    pub outer_step: u64,
    /// The digest its pieces claimed.
    pub digest: Option<Blake3Digest>,
    /// What was wrong.
    pub fault: PartFault,
}

/// A state that failed verification. The part that was right is kept, to be given back with
/// [`StateAssembly::retry`](super::StateAssembly::retry), which then waits only for the rest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifyFailed {
    /// The replicated part: kept when right.
    pub shared: Result<ReceivedPart, Rejected>,
    /// The own part: kept when right.
    pub own: Result<ReceivedPart, Rejected>,
    /// Who sent the own part.
    pub own_from: NodeId,
}

impl fmt::Display for VerifyFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "state failed verification:")?;
        if let Err(r) = &self.shared {
            write!(f, " the replicated part (outer step {}) {}", r.outer_step, r.fault)?;
        }
        if let Err(r) = &self.own {
            let sep = if self.shared.is_err() { ";" } else { "" };
            write!(
                f,
                "{sep} the own part from {} (outer step {}) {}",
                self.own_from, r.outer_step, r.fault
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for VerifyFailed {}

/// A verified state, ready to take.
#[derive(Clone, Debug, PartialEq)]
pub struct Verified {
    /// The outer step count of the replicated part.
    pub outer_step: u64,
    /// The replicated state; `None` for virtual numerics.
    pub shared: Option<SharedState>,
    /// The own part's bytes (for the inner loop to import); `None` for virtual numerics.
    pub own: Option<Vec<u8>>,
    /// Who sent the own part.
    pub own_from: NodeId,
    /// Digest of the replicated part (`None` for virtual numerics).
    pub shared_digest: Option<Blake3Digest>,
    /// Digest of the own part (`None` for virtual numerics).
    pub own_digest: Option<Blake3Digest>,
    /// Bytes received in all (both parts, real or virtual).
    pub bytes: u64,
}

impl Received {
    /// The state's total length: both parts' (virtual lengths for virtual numerics).
    pub fn bytes(&self) -> u64 {
        self.shared.total.saturating_add(self.own.total)
    }

    /// Checks both digests and decodes the replicated part for a model of `expect_n`
    /// parameters. Virtual parts (no bytes) pass without checks. On failure the part that was
    /// right is kept in the [`VerifyFailed`] (boxed: it is large).
    pub fn verify(self, expect_n: usize) -> Result<Verified, Box<VerifyFailed>> {
        let Received { mut shared, own, own_from, vouched } = self;
        // Everything is checked before the replicated part's bytes are moved into the state.
        let checked = shared.check().and_then(|()| match &shared.bytes {
            None => Ok(()),
            Some(b) => {
                let inside = SharedState::check_part(b, expect_n).map_err(PartFault::Decode)?;
                if inside == shared.outer_step {
                    Ok(())
                } else {
                    Err(PartFault::Step { header: shared.outer_step, inside })
                }
            }
        });
        let own_ok = own.check();
        // Decoded once both parts are right, and checked finite before anything installs it.
        let decoded = match (&checked, &own_ok) {
            (Ok(()), Ok(())) => {
                shared.bytes.take().and_then(|b| SharedState::from_part(b, expect_n))
            }
            _ => None,
        };
        let checked = match (checked, &decoded) {
            (Ok(()), Some(s)) => {
                not_finite(s).or_else(|| not_vouched(s, vouched)).map_or(Ok(()), Err)
            }
            (c, _) => c,
        };
        match (checked, own_ok) {
            (Ok(()), Ok(())) => Ok(Verified {
                outer_step: shared.outer_step,
                shared: decoded,
                bytes: shared.total.saturating_add(own.total),
                own: own.bytes.map(PartBytes::into_vec),
                own_from,
                shared_digest: shared.digest,
                own_digest: own.digest,
            }),
            (d, o) => Err(Box::new(VerifyFailed {
                shared: match d {
                    Ok(_) => Ok(shared),
                    Err(f) => Err(shared.reject(f)),
                },
                own: match o {
                    Ok(()) => Ok(own),
                    Err(f) => Err(own.reject(f)),
                },
                own_from,
            })),
        }
    }
}

/// The fault of a decoded state that is not the one the members vouch for, if it is not.
fn not_vouched(s: &SharedState, vouched: Option<Held>) -> Option<PartFault> {
    let vouched = vouched?;
    let outer_step = s.outer_steps();
    if outer_step != vouched.outer_step {
        return Some(PartFault::NotVouched { outer_step, weights: None, vouched });
    }
    let want = vouched.digest?;
    let weights = crate::node::digest::weights_digest_parallel(s.outer());
    (weights != want).then_some(PartFault::NotVouched {
        outer_step,
        weights: Some(weights),
        vouched,
    })
}

/// The first value of a decoded state that is not finite, as a fault.
fn not_finite(s: &SharedState) -> Option<PartFault> {
    [("outer weight", s.outer()), ("momentum", s.momentum())].into_iter().find_map(|(what, v)| {
        // A branch-free pass first (it vectorises); the index is looked for only on a hit.
        let bad = v.iter().fold(false, |b, x| b | !x.is_finite());
        bad.then(|| v.iter().position(|x| !x.is_finite()))
            .flatten()
            .map(|index| PartFault::NotFinite { what, index })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_received_states_bytes_are_both_parts() {
        let part =
            |total| ReceivedPart { outer_step: 2, digest: None, total, bytes: None, hashed: None };
        let r = Received { shared: part(824), own: part(1600), own_from: NodeId(1), vouched: None };
        assert_eq!(r.bytes(), 2424);
        let v = r.verify(100).expect("virtual parts pass");
        assert_eq!(v.bytes, 2424);
        let r =
            Received { shared: part(u64::MAX), own: part(1), own_from: NodeId(1), vouched: None };
        assert_eq!(r.bytes(), u64::MAX);
    }
}
