//! What the replay loop ([`crate::driver`]) asks of an executor: hosts that start, crash and
//! restart, links that are cut and given latencies, and time that moves on. Two executors
//! provide it: turmoil ([`TurmoilExec`], a fixed tick) and the event executor
//! ([`crate::events::EventExec`], from one event to the next).

use crate::SimError;
use crate::clock;
use crate::coord;
use crate::ctx::RunCtx;
use crate::net::host_name;
use crate::node::Node;
use loco_core::{NodeId, Time};
use std::rc::Rc;
use std::time::Duration;

/// An executor of the simulated hosts. See the module documentation.
pub(crate) trait Exec {
    /// Simulated time since the start of the run.
    fn now(&self) -> Time;
    /// Starts host `id` (a node, or the coordinator for [`NodeId::COORDINATOR`]).
    fn start(&mut self, id: NodeId);
    /// Kills host `id` where it stands.
    fn crash(&mut self, id: NodeId);
    /// Kills host `id` and starts it again (a new process: the control block says which
    /// incarnation).
    fn bounce(&mut self, id: NodeId);
    /// Tells node `id` that its control block changed (hang, resume, leave).
    fn notify(&mut self, id: NodeId);
    /// Stops the coordinator's process where it stands, or lets it run again.
    fn pause_coordinator(&mut self, paused: bool);
    /// Cuts the traffic from `a` to `b` (the shared network already counts the cut).
    fn partition_oneway(&mut self, a: NodeId, b: NodeId);
    /// Opens the traffic from `a` to `b` again.
    fn repair_oneway(&mut self, a: NodeId, b: NodeId);
    /// The one-way latency between `a` and `b` (both directions): from `min` to `max`.
    fn set_latency(&mut self, a: NodeId, b: NodeId, min: Duration, max: Duration);
    /// The links' bandwidth or latency changed (the bandwidth model and the latencies are
    /// already set).
    fn links_changed(&mut self) {}
    /// Whether host `id`'s software is running.
    fn is_running(&mut self, id: NodeId) -> bool;
    /// Moves time on: at least to the next thing that happens, and no later than `horizon`
    /// (the replay loop's next deadline: a churn event, a stop, a check).
    fn step(&mut self, horizon: Time) -> Result<(), SimError>;
    /// What the summary says of the executor: its name and its count of steps.
    fn figures(&self) -> Vec<(&'static str, serde_json::Value)>;
}

/// turmoil: every host polled at every tick.
pub(crate) struct TurmoilExec<'a> {
    pub(crate) sim: turmoil::Sim<'a>,
    pub(crate) run: Rc<RunCtx>,
    pub(crate) tick: Duration,
    pub(crate) ticks: u64,
}

impl Exec for TurmoilExec<'_> {
    fn now(&self) -> Time {
        clock::from_duration(self.sim.elapsed())
    }

    fn start(&mut self, id: NodeId) {
        let run = self.run.clone();
        if id == NodeId::COORDINATOR {
            self.sim.host(host_name(id), move || coord::run(run.clone()));
        } else {
            self.sim.host(host_name(id), move || {
                let run = run.clone();
                async move {
                    let node = Node::start(run, id).await?;
                    node.run().await
                }
            });
        }
    }

    fn crash(&mut self, id: NodeId) {
        self.sim.crash(host_name(id));
    }

    fn bounce(&mut self, id: NodeId) {
        self.sim.bounce(host_name(id));
    }

    fn notify(&mut self, id: NodeId) {
        self.run.node(id).wake.notify_one();
    }

    fn pause_coordinator(&mut self, paused: bool) {
        self.run.coordinator_paused.set(paused);
        self.run.coordinator_wake.notify_one();
    }

    fn partition_oneway(&mut self, a: NodeId, b: NodeId) {
        self.sim.partition_oneway(host_name(a), host_name(b));
    }

    fn repair_oneway(&mut self, a: NodeId, b: NodeId) {
        self.sim.repair_oneway(host_name(a), host_name(b));
    }

    fn set_latency(&mut self, a: NodeId, b: NodeId, min: Duration, max: Duration) {
        self.sim.set_link_latency(host_name(a), host_name(b), min);
        self.sim.set_link_max_message_latency(host_name(a), host_name(b), max);
    }

    fn is_running(&mut self, id: NodeId) -> bool {
        self.sim.is_host_running(host_name(id))
    }

    fn step(&mut self, _horizon: Time) -> Result<(), SimError> {
        self.sim.step().map_err(|e| SimError::Host(e.to_string()))?;
        self.ticks += 1;
        Ok(())
    }

    fn figures(&self) -> Vec<(&'static str, serde_json::Value)> {
        vec![
            ("executor", serde_json::json!(loco_core::scenario::ExecutorKind::Turmoil)),
            ("tick_seconds", serde_json::json!(self.tick.as_secs_f64())),
            ("ticks", serde_json::json!(self.ticks)),
        ]
    }
}
