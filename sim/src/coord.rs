//! The software of the coordinator's turmoil host: the mesh [`Coordinator`] over the simulator's
//! transport, its events turned into `events.csv` rows and into the recorder's progress.

use crate::clock;
use crate::ctx::RunCtx;
use crate::net::SimTransport;
use loco_core::mesh::{Coordinator, CoordinatorAction, MeshEvent};
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
    let rows = {
        let name = |n: NodeId| rec.name(n);
        loco_core::node::events::coordinator_rows(now.as_secs_f64(), &e, &name)
    };
    for r in rows {
        rec.push_event(r);
    }
    match e {
        MeshEvent::EpochFormed { epoch, members, .. } => {
            rec.epoch_formed(epoch, &members);
            rec.touch(now);
        }
        MeshEvent::Committed { outer_step, .. } | MeshEvent::StepSkipped { outer_step, .. } => {
            rec.step_done(now, outer_step)
        }
        MeshEvent::NoSyncedMember { outer_step, .. } => {
            drop(rec);
            *run.mesh_stopped.borrow_mut() = Some(format!(
                "no member holds the training state any more: the coordinator stopped the run at \
                 outer step {outer_step} (resume from checkpoints)"
            ));
        }
        MeshEvent::JoinRefused { node, incarnation, reason } => {
            let name = rec.name(node);
            tracing::warn!(target: "loco_sim", "coordinator: join of {name} (incarnation {incarnation}) refused: {reason}");
        }
        MeshEvent::DecisionLimit => {
            tracing::warn!(target: "loco_sim", "coordinator: decision limit reached");
        }
        _ => {}
    }
}
