//! The events a coordinator and a node write to `events.csv`, mapped once for both backends, so
//! that the two reports tell a membership story in the same words.
//!
//! The rules: the coordinator writes `join-request` when it queues a joiner, `epoch` for every
//! epoch it forms (`"N members: a b c"`), `admit` for each node it admits into it, `evict` for
//! each member it removes (a deathrattle is the `leave` the node records, not an eviction),
//! `retry` for a release with attempt > 0, `all-reduce-failed` for a reported failure,
//! and `skip-step` for a skipped step. A node writes `start` when it is
//! admitted into the mesh's first epoch (a founding member) and `join` when it is admitted later;
//! see [`admission_kind`].

use crate::ids::{Epoch, NodeId};
use crate::mesh::{EvictReason, MeshEvent, StopReason};
use crate::metrics::{EventKind, EventRow};

/// The epoch a coordinator forms first; a node admitted into it is a founding member.
pub const FIRST_EPOCH: Epoch = Epoch(1);

/// The rows a coordinator's [`MeshEvent`] becomes, at `at_s` seconds, with node ids written by
/// `name`. Events that are not part of the record (probes, stale messages, waits) give none.
pub fn coordinator_rows(
    at_s: f64,
    ev: &MeshEvent,
    name: &dyn Fn(NodeId) -> String,
) -> Vec<EventRow> {
    let row = |kind, epoch: Option<Epoch>, node: Option<NodeId>, detail: String| {
        let mut r = EventRow::new(at_s, kind).detail(detail);
        if let Some(e) = epoch {
            r = r.epoch(e.0);
        }
        if let Some(n) = node {
            r = r.node(name(n));
        }
        r
    };
    match ev {
        MeshEvent::JoinQueued { node, position, .. } => vec![row(
            EventKind::JoinRequest,
            None,
            Some(*node),
            format!("queued at position {position}"),
        )],
        MeshEvent::EpochFormed { epoch, members, admitted, evicted } => {
            let names: Vec<String> = members.iter().map(|m| name(*m)).collect();
            let mut rows = vec![row(
                EventKind::Epoch,
                Some(*epoch),
                None,
                format!("{} members: {}", members.len(), names.join(" ")),
            )];
            for a in admitted {
                rows.push(row(
                    EventKind::Admit,
                    Some(*epoch),
                    Some(*a),
                    format!("admitted into {epoch}"),
                ));
            }
            for (n, why) in evicted {
                if !matches!(why, EvictReason::Deathrattle(_)) {
                    rows.push(row(EventKind::Evict, Some(*epoch), Some(*n), why.to_string()));
                }
            }
            rows
        }
        MeshEvent::Released { epoch, outer_step, attempt, ring, .. } if *attempt > 0 => vec![row(
            EventKind::Retry,
            Some(*epoch),
            None,
            format!("outer step {outer_step} attempt {attempt} on {} nodes", ring.len()),
        )],
        MeshEvent::AllReduceFailed { node, epoch, attempt, accused } => vec![row(
            EventKind::AllreduceFailed,
            Some(*epoch),
            Some(*node),
            match accused {
                Some(a) => format!("attempt {attempt}: values from node {a} not finite"),
                None => format!("attempt {attempt}"),
            },
        )],
        MeshEvent::StepSkipped { epoch, outer_step, attempts } => vec![row(
            EventKind::SkipStep,
            Some(*epoch),
            None,
            format!("outer step {outer_step} after {attempts} attempts"),
        )],
        // The step skipped for its update (the step's one `skip_step` row), naming the member
        // whose own pseudo-gradient stands out. At the limit the run stops instead: its `stop`
        // row, written by whoever ends the run, says why.
        MeshEvent::UpdateRefused { epoch, outer_step, norm, median, outlier, stopping: false } => {
            vec![row(
                EventKind::SkipStep,
                Some(*epoch),
                *outlier,
                format!(
                    "outer step {outer_step}: update refused, norm {norm:.3e}{}{}",
                    median.map_or(String::new(), |m| format!(" against a median of {m:.3e}")),
                    outlier.map_or(String::new(), |o| format!(
                        "; node {o}'s own pseudo-gradient stands out"
                    )),
                ),
            )]
        }
        MeshEvent::NoSyncedMember { epoch, evicted, .. } => evicted
            .iter()
            .filter(|(_, why)| !matches!(why, EvictReason::Deathrattle(_)))
            .map(|(n, why)| row(EventKind::Evict, Some(*epoch), Some(*n), why.to_string()))
            .collect(),
        // The run's `stop` is written by whoever ends the run (the simulator's driver, the real
        // coordinator at its shutdown), with the reason it knows.
        _ => Vec::new(),
    }
}

/// What a node writes when it is admitted: `start` into the first epoch, `join` after.
pub fn admission_kind(epoch: Epoch) -> EventKind {
    if epoch == FIRST_EPOCH { EventKind::Start } else { EventKind::Join }
}

/// The event a node writes when its member stops.
pub fn stop_kind(reason: &StopReason) -> EventKind {
    match reason {
        StopReason::Left(_) => EventKind::Leave,
        StopReason::Evicted(_) => EventKind::Evict,
        StopReason::CoordinatorLost { .. } => EventKind::CoordinatorLost,
        StopReason::Shutdown
        | StopReason::UpdatesRefused { .. }
        | StopReason::NoSyncedMember { .. } => EventKind::Stop,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mesh::LeaveReason;

    fn name(n: NodeId) -> String {
        format!("n-{}", n.0)
    }

    #[test]
    fn an_epoch_gives_its_members_admissions_and_evictions_but_no_deathrattle() {
        let ev = MeshEvent::EpochFormed {
            epoch: Epoch(3),
            members: vec![NodeId(0), NodeId(2)],
            admitted: vec![NodeId(2)],
            evicted: vec![
                (NodeId(1), EvictReason::HeartbeatTimeout),
                (NodeId(3), EvictReason::Deathrattle(LeaveReason::Graceful)),
            ],
        };
        let rows = coordinator_rows(1.5, &ev, &name);
        let kinds: Vec<(EventKind, Option<&str>)> =
            rows.iter().map(|r| (r.kind, r.node.as_deref())).collect();
        assert_eq!(
            kinds,
            vec![
                (EventKind::Epoch, None),
                (EventKind::Admit, Some("n-2")),
                (EventKind::Evict, Some("n-1")),
            ]
        );
        assert_eq!(rows[0].detail, "2 members: n-0 n-2");
        assert!(rows.iter().all(|r| r.epoch == Some(3) && r.time_s == 1.5));
        assert_eq!(rows[2].detail, "heartbeat timeout");
    }

    #[test]
    fn only_retries_of_a_release_are_recorded() {
        let rel = |attempt| MeshEvent::Released {
            epoch: Epoch(2),
            outer_step: 4,
            attempt,
            ring: vec![NodeId(0), NodeId(1)],
            weights: vec![],
        };
        assert!(coordinator_rows(0.0, &rel(0), &name).is_empty());
        let r = coordinator_rows(0.0, &rel(1), &name);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].kind, EventKind::Retry);
        assert_eq!(r[0].detail, "outer step 4 attempt 1 on 2 nodes");
    }

    #[test]
    fn founding_members_start_and_later_ones_join() {
        assert_eq!(admission_kind(FIRST_EPOCH), EventKind::Start);
        assert_eq!(admission_kind(Epoch(2)), EventKind::Join);
        assert_eq!(stop_kind(&StopReason::Shutdown), EventKind::Stop);
        assert_eq!(stop_kind(&StopReason::Left(LeaveReason::Signal)), EventKind::Leave);
    }
}
