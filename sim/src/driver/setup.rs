//! The replay's set-up: the shared network, the nodes' control blocks, the choice of
//! collectives and the executor, from the scenario.

use super::Plan;
use crate::SimError;
use crate::bandwidth::BandwidthModel;
use crate::ctx::{NodeCtl, RealSetup, RunCtx};
use crate::events::EventExec;
use crate::exec::{Exec, TurmoilExec};
use crate::net::NetShared;
use crate::numerics;
use loco_core::Time;
use loco_core::rng::{Purpose, derive};
use loco_core::scenario::{
    ChurnAction, CollectiveModel, ExecutorKind, FaultPhase, Numerics, Scenario, TcpKind,
};
use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;
use tokio::sync::Notify;

/// The real numerics' set-up (the initial weights), or `None` under virtual numerics.
pub(super) fn real_setup(s: &Scenario, seed: u64) -> Result<Option<RealSetup>, SimError> {
    Ok(match s.sim().numerics {
        Numerics::Virtual => None,
        Numerics::Real => {
            let n = usize::try_from(s.sim().elements)
                .map_err(|_| SimError::Scenario("sim.elements does not fit this machine".into()))?;
            Some(RealSetup { initial: numerics::initial_weights(seed, n) })
        }
    })
}

/// The shared network, its bandwidth model set to the scenario's TCP and NICs.
pub(super) fn shared_net(s: &Scenario) -> Rc<NetShared> {
    let net = NetShared::new();
    net.set_handshake(s.sim().tcp != TcpKind::None);
    {
        let mut bw: std::cell::RefMut<'_, BandwidthModel> = net.bandwidth.borrow_mut();
        let mss = f64::from(loco_core::scenario::links::EMULATED_MSS);
        bw.set_tcp(match s.sim().tcp {
            TcpKind::Cubic => Some(crate::bandwidth::TcpParams::linux(mss, true)),
            TcpKind::Bbr => Some(crate::bandwidth::TcpParams::linux(mss, false)),
            TcpKind::None => None,
        });
        for n in s.nodes() {
            bw.set_nic(Time::ZERO, n.id, n.nic.map(|r| r.bytes_per_sec()));
        }
    }
    net
}

/// One control block per node, every node as yet untouched by churn.
pub(super) fn node_ctls(s: &Scenario) -> Vec<NodeCtl> {
    s.nodes()
        .iter()
        .map(|n| NodeCtl {
            spec: n.clone(),
            incarnation: Cell::new(0),
            hung: Cell::new(false),
            leave: Cell::new(false),
            wake: Notify::new(),
            member: Cell::new(false),
            armed: Cell::new(None),
            struck: Cell::new(false),
        })
        .collect()
}

/// Whether the all-reduces are modelled whole rather than moved frame by frame, refusing the
/// scenarios a modelled all-reduce cannot run.
pub(super) fn modelled_collectives(s: &Scenario, executor: ExecutorKind) -> Result<bool, SimError> {
    // What a modelled all-reduce does not model, so that such a scenario moves frames: a crash
    // armed for a phase of the all-reduce strikes when the node sends that phase's frames
    // (modelled all-reduces send none), and a hung member holds the ring's frames until it
    // resumes (the model has no pause).
    let phase_faults = s.churn().iter().any(|e| {
        matches!(e.during, Some(FaultPhase::ReduceScatter | FaultPhase::AllGather))
            || matches!(e.action, ChurnAction::Hang(_))
    });
    let collectives = match s.sim().collectives {
        None if phase_faults => CollectiveModel::Frames,
        _ => s.sim().collectives_for(s.nodes().len(), executor),
    };
    if phase_faults && collectives == CollectiveModel::Modelled {
        return Err(SimError::Scenario(
            "sim.collectives: \"modelled\" models neither a crash `during` the reduce-scatter or all-gather (it sends no frame to strike at) nor a hung member holding the ring; set sim.collectives = \"frames\"".into(),
        ));
    }
    match (collectives, executor) {
        (CollectiveModel::Frames, _) => Ok(false),
        (CollectiveModel::Modelled, ExecutorKind::Events) => Ok(true),
        (CollectiveModel::Modelled, ExecutorKind::Turmoil) => Err(SimError::Scenario(
            "sim.collectives: \"modelled\" runs on the event executor only; set sim.executor = \"events\" or sim.collectives = \"frames\"".into(),
        )),
    }
}

/// The executor that runs the hosts of `run`.
pub(super) fn new_exec(
    executor: ExecutorKind,
    plan: &Plan,
    s: &Scenario,
    run: &Rc<RunCtx>,
) -> Box<dyn Exec> {
    // turmoil panics when more connections wait on a listener than its TCP capacity (64 by
    // default): every node dials the coordinator at the start. Room for all of them, twice
    // (the default below 32 nodes, so that smaller runs are as they were).
    let tcp_capacity = s.nodes().len().saturating_add(1).saturating_mul(2).max(64);
    match executor {
        ExecutorKind::Turmoil => Box::new(TurmoilExec {
            sim: turmoil::Builder::new()
                .tcp_capacity(tcp_capacity)
                .tick_duration(plan.tick)
                .simulation_duration(Duration::from_secs(u64::from(u32::MAX)))
                .min_message_latency(Duration::ZERO)
                .max_message_latency(Duration::ZERO)
                .rng_seed(derive(plan.seed, 0, Purpose::Turmoil))
                .build(),
            run: run.clone(),
            tick: plan.tick,
            ticks: 0,
        }),
        ExecutorKind::Events => Box::new(EventExec::new(run.clone())),
    }
}

/// The detail of the run's start event: the seed and how it is executed.
pub(super) fn start_detail(
    executor: ExecutorKind,
    modelled: bool,
    seed: u64,
    tick: Duration,
) -> String {
    match executor {
        ExecutorKind::Turmoil => format!("seed {seed}, tick {} ms", tick.as_millis()),
        ExecutorKind::Events if modelled => {
            format!("seed {seed}, event executor, modelled all-reduces")
        }
        ExecutorKind::Events => format!("seed {seed}, event executor"),
    }
}
