//! The software of the coordinator's turmoil host: the mesh [`Coordinator`] over the simulator's
//! transport, its events turned into `events.csv` rows and into the recorder's progress.

use crate::clock;
use crate::ctx::RunCtx;
use crate::net::SimTransport;
use crate::node::Port;
use loco_core::mesh::{Coordinator, CoordinatorAction, MeshEvent};
use loco_core::transport::{Frame, Header};
use loco_core::{NodeId, Time};
use std::rc::Rc;

/// Runs the coordinator until its host is crashed or the run ends.
pub(crate) async fn run(run: Rc<RunCtx>) -> turmoil::Result {
    let net = SimTransport::bind(NodeId::COORDINATOR, run.net.clone()).await?;
    let mut host = CoordHost::new(run.clone(), Port::Turmoil(net));
    loop {
        // Stopped (`coordinator-pause`): what arrives waits in the network, as in a socket's
        // buffers, and its deadlines pass unheeded until it runs again.
        while run.coordinator_paused.get() {
            run.coordinator_wake.notified().await;
        }
        host.drain();
        let wake = host.next_wake();
        tokio::select! {
            biased;
            () = run.coordinator_wake.notified() => {}
            r = host.net.next() => {
                if let Ok((from, f)) = r {
                    host.frame(from, f);
                }
            }
            () = clock::sleep_until(wake) => host.timeout(),
        }
    }
}

/// The coordinator's host software: the mesh [`Coordinator`] and where its messages go.
pub(crate) struct CoordHost {
    run: Rc<RunCtx>,
    net: Port,
    c: Coordinator,
}

impl CoordHost {
    /// A coordinator that sends through `net`.
    pub(crate) fn new(run: Rc<RunCtx>, net: Port) -> CoordHost {
        let c = Coordinator::new(run.mesh.clone());
        CoordHost { run, net, c }
    }

    /// Sends the coordinator's messages and records its events until it has none.
    pub(crate) fn drain(&mut self) {
        while let Some(a) = self.c.poll_action() {
            match a {
                CoordinatorAction::Send { to, msg } => {
                    self.run.frames.set(self.run.frames.get() + 1);
                    self.net.enqueue(to, Frame::control(msg));
                }
                CoordinatorAction::Event(e) => on_event(&self.run, clock::now(), e),
            }
        }
    }

    /// A frame from `from` (only mesh messages concern the coordinator).
    pub(crate) fn frame(&mut self, from: NodeId, f: Frame) {
        if let Header::Mesh(m) = f.header {
            self.c.handle_message(clock::now(), from, m);
        }
    }

    /// Its deadline came.
    pub(crate) fn timeout(&mut self) {
        self.c.handle_timeout(clock::now());
    }

    /// Its next deadline (`Time::MAX` for none).
    pub(crate) fn next_wake(&self) -> Time {
        self.c.poll_timeout().unwrap_or(Time::MAX)
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
        MeshEvent::Committed { outer_step, .. }
        | MeshEvent::StepSkipped { outer_step, .. }
        | MeshEvent::UpdateRefused { outer_step, stopping: false, .. } => {
            rec.step_done(now, outer_step)
        }
        MeshEvent::UpdateRefused { stopping: true, .. } => {
            let why = e.to_string();
            drop(rec);
            *run.mesh_stopped.borrow_mut() = Some(why);
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
