//! The software of the coordinator's turmoil host: the mesh [`Coordinator`] over the simulator's
//! transport, its events turned into `events.csv` rows and into the recorder's progress.

use crate::clock;
use crate::ctx::RunCtx;
use crate::net::SimTransport;
use loco_core::mesh::{Coordinator, CoordinatorAction, EvictReason, MeshEvent};
use loco_core::metrics::EventKind;
use loco_core::transport::{Frame, Header};
use loco_core::{NodeId, Time};
use std::rc::Rc;

/// Runs the coordinator until its host is crashed or the run ends.
pub(crate) async fn run(run: Rc<RunCtx>) -> turmoil::Result {
    let mut net = SimTransport::bind(NodeId::COORDINATOR, run.net.clone()).await?;
    let mut c = Coordinator::new(run.mesh.clone());
    loop {
        while let Some(a) = c.poll_action() {
            match a {
                CoordinatorAction::Send { to, msg } => {
                    run.frames.set(run.frames.get() + 1);
                    net.enqueue(to, Frame::control(msg));
                }
                CoordinatorAction::Event(e) => on_event(&run, clock::now(), e),
            }
        }
        let wake = c.poll_timeout().unwrap_or(Time::MAX);
        tokio::select! {
            biased;
            r = net.next() => {
                if let Ok((from, f)) = r {
                    if let Header::Mesh(m) = f.header {
                        c.handle_message(clock::now(), from, m);
                    }
                }
            }
            () = clock::sleep_until(wake) => c.handle_timeout(clock::now()),
        }
    }
}

fn on_event(run: &RunCtx, now: Time, e: MeshEvent) {
    let mut rec = run.rec.borrow_mut();
    match e {
        MeshEvent::JoinQueued { node, position, .. } => {
            rec.event(
                now,
                EventKind::JoinRequest,
                Some(node),
                None,
                format!("queued at position {position}"),
            );
        }
        MeshEvent::EpochFormed { epoch, members, admitted, evicted } => {
            rec.epoch_formed(epoch, &members);
            rec.touch(now);
            let names: Vec<String> = members.iter().map(|m| rec.name(*m)).collect();
            rec.event(
                now,
                EventKind::Epoch,
                None,
                Some(epoch),
                format!("{} members: {}", members.len(), names.join(" ")),
            );
            for a in admitted {
                rec.event(now, EventKind::Admit, Some(a), Some(epoch), "");
            }
            for (n, why) in evicted {
                // A deathrattle is recorded as the `leave` it is, not as an eviction.
                if !matches!(why, EvictReason::Deathrattle(_)) {
                    rec.event(now, EventKind::Evict, Some(n), Some(epoch), why.to_string());
                }
            }
        }
        MeshEvent::Released { epoch, outer_step, attempt, .. } if attempt > 0 => {
            rec.event(
                now,
                EventKind::Retry,
                None,
                Some(epoch),
                format!("outer step {outer_step} attempt {attempt}"),
            );
        }
        MeshEvent::AllReduceFailed { node, epoch, attempt } => {
            rec.event(
                now,
                EventKind::AllreduceFailed,
                Some(node),
                Some(epoch),
                format!("attempt {attempt}"),
            );
        }
        MeshEvent::Committed { outer_step, .. } => rec.step_done(now, outer_step),
        MeshEvent::StepSkipped { epoch, outer_step, attempts } => {
            rec.event(
                now,
                EventKind::SkipStep,
                None,
                Some(epoch),
                format!("outer step {outer_step} after {attempts} attempts"),
            );
            rec.step_done(now, outer_step);
        }
        MeshEvent::DecisionLimit => {
            tracing::warn!(target: "loco_sim", "coordinator: decision limit reached");
        }
        MeshEvent::Released { .. }
        | MeshEvent::JoinerForgotten { .. }
        | MeshEvent::Stale { .. }
        | MeshEvent::BandwidthMeasured { .. }
        | MeshEvent::Waiting(_)
        | MeshEvent::Shutdown => {}
    }
}
