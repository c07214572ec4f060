//! Who is to blame for a failed all-reduce attempt, as the [decision](super::decide) reads it:
//! the one member that reported it failed, the member it named, and a ring that gives a named
//! member a successor that has not named it. Pure functions of the mesh's state.

use super::state::MeshState;
use crate::ids::NodeId;

/// Who is blamed for the current attempt when it is given up with nobody dead: the one member
/// that reported it failed (when exactly one did), and in a ring of two the member it named, if
/// any (in larger rings a named member is given another successor, and evicted only when a
/// second member names it). Id order.
pub(super) fn blamed_parties(s: &MeshState) -> Vec<NodeId> {
    let Some(id) = sole_reporter(s) else { return Vec::new() };
    let accused = s.members.get(&id).and_then(|m| m.accuses).filter(|_| s.members.len() < 3);
    let mut parties: Vec<NodeId> = [Some(id), accused].into_iter().flatten().collect();
    parties.sort_unstable();
    parties
}

/// The one member that reported the current attempt failed, when exactly one did.
pub(super) fn sole_reporter(s: &MeshState) -> Option<NodeId> {
    let mut reporters = s.members.iter().filter(|(_, m)| m.failed).map(|(&id, _)| id);
    let first = reporters.next()?;
    reporters.next().is_none().then_some(first)
}

/// Gives each member named in a failed attempt a successor that has not named it (it swaps
/// places with the one that did), so that a second name against it comes from another member
/// and one member's word can never gather two. Rings of two cannot be changed.
pub(super) fn separate(ring: &mut [NodeId], s: &MeshState) {
    let n = ring.len();
    if n < 3 {
        return;
    }
    for (id, by) in s.accusers_now() {
        let Some(i) = ring.iter().position(|x| *x == id) else { continue };
        let j = (i + 1) % n;
        if by.contains(&ring[j]) {
            ring.swap(i, j);
        }
    }
}
