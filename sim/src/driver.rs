//! The replay loop: builds the turmoil simulation of a scenario, steps it tick by tick, plays the
//! churn between ticks, watches the stop conditions and the deadlock bound, and summarises.

use crate::ctx::RunCtx;
use crate::exec::Exec;
use crate::net::host_name;
use crate::record::Recorder;
use crate::{Progress, ReplayOptions, RunOutput, SimError};
use loco_core::metrics::{EventKind, RunMeta, sort_events, sort_outer_steps, summarize};
use loco_core::scenario::links::{LatencySetting, Links};
use loco_core::scenario::{ChurnAction, ChurnEvent, Cut, ExecutorKind, RegionId, Scenario};
use loco_core::{NodeId, Time};
use setup::{modelled_collectives, new_exec, node_ctls, real_setup, shared_net, start_detail};
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::time::Duration;
use tokio::sync::Notify;

mod setup;

/// Ticks a default tick aims at over a whole run (each tick polls every host).
const TICK_BUDGET: u64 = 400_000;

/// Settings derived from a scenario and the options.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    pub(crate) seed: u64,
    pub(crate) tick: Duration,
    pub(crate) stop_steps: Option<u64>,
    pub(crate) stop_time: Option<Duration>,
    pub(crate) duration_limit: Duration,
    pub(crate) stall_limit: Duration,
}

impl Plan {
    pub(crate) fn of(s: &Scenario, opts: &ReplayOptions) -> Result<Plan, SimError> {
        let seed = opts.seed.unwrap_or(s.seed());
        let stop = s.stop();
        let (stop_steps, stop_time) = match opts.run_for {
            Some(t) => (None, Some(t)),
            None => (
                match (stop.outer_steps, opts.max_outer_steps) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                }
                .map(|n| n.saturating_mul(s.diloco().rounds_per_step())),
                match (stop.time, opts.max_time) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                },
            ),
        };
        let d = s.diloco();
        let m = s.mesh();
        let slowest = s
            .nodes()
            .iter()
            .map(|n| n.step_time.mul_f64(1.0 + n.step_jitter))
            .max()
            .unwrap_or(Duration::ZERO);
        let compute = slowest.saturating_mul(u32::try_from(d.round_steps()).unwrap_or(u32::MAX));
        let retries = m.max_retries.saturating_add(1);
        // The longest an outer step can take while the mesh keeps its promises: compute, the
        // barrier deadline, a blocking state transfer, every attempt of the all-reduce with its
        // backoff, the heartbeat timeouts that trigger them, and the commit's outer work.
        let stall_limit = compute.saturating_mul(2)
            + s.sim().outer_time(s.model().param_count())
            + m.barrier_timeout
            + m.sync_timeout
            + (m.allreduce_timeout + m.retry_backoff + m.heartbeat_timeout.saturating_mul(2))
                .saturating_mul(retries)
            + m.join_window
            + m.compute_timeout
            + Duration::from_secs(60);
        let steps = stop_steps.unwrap_or(1);
        let estimate = match stop_time {
            Some(t) => t,
            None => (compute + Duration::from_secs(600))
                .saturating_mul(u32::try_from(steps).unwrap_or(u32::MAX)),
        };
        let duration_limit = match opts.run_for {
            Some(t) => t,
            None => s.sim().duration_limit.unwrap_or(match stop_time {
                Some(t) => t,
                None => (compute + stall_limit)
                    .saturating_mul(u32::try_from(steps + 1).unwrap_or(u32::MAX)),
            }),
        };
        let tick = s.sim().tick.unwrap_or_else(|| default_tick(estimate));
        if tick.is_zero() {
            return Err(SimError::Scenario("sim.tick must be greater than zero".into()));
        }
        Ok(Plan { seed, tick, stop_steps, stop_time, duration_limit, stall_limit })
    }
}

/// A tick that keeps a run of `estimate` within [`TICK_BUDGET`] ticks: between 1 ms and 200 ms,
/// in whole milliseconds.
pub(crate) fn default_tick(estimate: Duration) -> Duration {
    let ms = (estimate.as_millis() / u128::from(TICK_BUDGET)).clamp(1, 200);
    Duration::from_millis(u64::try_from(ms).unwrap_or(200))
}

struct Driver<'a> {
    exec: Box<dyn Exec + 'a>,
    run: Rc<RunCtx>,
    links: Links,
    regions: BTreeMap<NodeId, RegionId>,
    /// Hosts registered with the executor, the coordinator included, in order.
    hosts: Vec<NodeId>,
    /// The same, to look up.
    known: BTreeSet<NodeId>,
    cuts: Vec<Cut>,
    coordinator_alive: bool,
}

impl<'a> Driver<'a> {
    /// A driver of `exec` with no host registered yet, every link as the scenario starts it.
    fn new(exec: Box<dyn Exec + 'a>, run: Rc<RunCtx>, s: &Scenario, seed: u64) -> Driver<'a> {
        let mut regions: BTreeMap<NodeId, RegionId> =
            s.nodes().iter().map(|n| (n.id, n.region)).collect();
        regions.insert(NodeId::COORDINATOR, s.coordinator_region());
        Driver {
            exec,
            run,
            links: Links::new(s, seed),
            regions,
            hosts: Vec::new(),
            known: BTreeSet::new(),
            cuts: Vec::new(),
            coordinator_alive: true,
        }
    }

    fn now(&self) -> Time {
        self.exec.now()
    }

    fn host_cmp(&mut self) -> Vec<NodeId> {
        self.hosts.clone()
    }

    fn set_latencies(&mut self, l: &[LatencySetting]) {
        let mut bw = self.run.net.bandwidth.borrow_mut();
        for s in l {
            self.exec.set_latency(s.a, s.b, s.min, s.max);
            // Both directions take the pair's latency, half-way between min and max on average;
            // the bottleneck's queue holds the round trip without jitter (the emulation's).
            bw.set_path(s.a, s.b, s.min + s.max, s.min * 2);
        }
    }

    fn register(&mut self, id: NodeId) {
        self.run.net.set_down(id, false);
        self.exec.start(id);
        let now = self.now();
        let hosts = self.host_cmp();
        let lat = self.links.host_latencies(id, &hosts, now);
        self.set_latencies(&lat);
        for cut in self.cuts.clone() {
            for &o in &hosts {
                if cut.covers(&self.regions, id, o) {
                    self.cut(id, o);
                }
                if cut.covers(&self.regions, o, id) {
                    self.cut(o, id);
                }
            }
        }
        self.hosts.push(id);
        self.known.insert(id);
    }

    fn cut(&mut self, a: NodeId, b: NodeId) {
        self.run.net.cut(a, b);
        self.exec.partition_oneway(a, b);
    }

    fn partition(&mut self, cut: &Cut) {
        let hosts = self.hosts.clone();
        for &a in &hosts {
            for &b in &hosts {
                if a != b && cut.covers(&self.regions, a, b) {
                    self.cut(a, b);
                }
            }
        }
        self.cuts.push(cut.clone());
    }

    fn heal(&mut self, cut: &Cut) {
        let Some(i) = self.cuts.iter().position(|c| c == cut) else { return };
        self.cuts.remove(i);
        let hosts = self.hosts.clone();
        for &a in &hosts {
            for &b in &hosts {
                if a != b && cut.covers(&self.regions, a, b) && self.run.net.uncut(a, b) {
                    self.exec.repair_oneway(a, b);
                }
            }
        }
    }

    fn reset_node_links(&mut self, id: NodeId) {
        for &h in &self.hosts {
            if h != id {
                self.run.net.reset_pair(id, h);
            }
        }
    }

    /// Writes a network event's rows (`ChurnAction::network_rows`).
    fn network_rows(&self, now: Time, action: &ChurnAction) {
        for (kind, detail) in action.network_rows(&self.run.scenario, &self.cuts) {
            self.run.event(now, kind, None, None, detail);
        }
    }

    fn apply(&mut self, action: &ChurnAction) {
        let now = self.now();
        let run = self.run.clone();
        match action {
            ChurnAction::Join(nodes) => {
                for &id in nodes {
                    if !self.known.contains(&id) {
                        self.register(id);
                    }
                }
            }
            ChurnAction::Leave(nodes) => {
                for &id in nodes {
                    let ctl = run.node(id);
                    ctl.leave.set(true);
                    // Its process writes the `leave` row when its member stops.
                    self.exec.notify(id);
                }
            }
            ChurnAction::Crash(nodes) => {
                for &id in nodes {
                    if !self.known.contains(&id) {
                        continue;
                    }
                    let ctl = run.node(id);
                    let detail = match ctl.armed.take() {
                        Some((phase, _)) => format!("SIGKILL during {phase} (fault injection)"),
                        None => "killed".to_string(),
                    };
                    run.event(now, EventKind::Crash, Some(id), None, detail);
                    ctl.member.set(false);
                    ctl.hung.set(false);
                    run.net.bandwidth.borrow_mut().cancel_node(now, id);
                    run.net.set_down(id, true);
                    self.reset_node_links(id);
                    self.exec.crash(id);
                }
            }
            ChurnAction::Hang(nodes) | ChurnAction::Resume(nodes) => {
                let hang = matches!(action, ChurnAction::Hang(_));
                for &id in nodes {
                    let ctl = run.node(id);
                    ctl.hung.set(hang);
                    self.exec.notify(id);
                    let detail = action.hang_detail().unwrap_or_default();
                    run.event(now, EventKind::Hang, Some(id), None, detail);
                }
            }
            ChurnAction::Restart(nodes) => {
                for &id in nodes {
                    let ctl = run.node(id);
                    ctl.incarnation.set(ctl.incarnation.get() + 1);
                    ctl.hung.set(false);
                    ctl.leave.set(false);
                    ctl.member.set(false);
                    run.event(
                        now,
                        EventKind::Restart,
                        Some(id),
                        None,
                        format!("incarnation {}", ctl.incarnation.get()),
                    );
                    if self.known.contains(&id) {
                        run.net.bandwidth.borrow_mut().cancel_node(now, id);
                        run.net.set_down(id, false);
                        self.reset_node_links(id);
                        self.exec.bounce(id);
                    } else {
                        self.register(id);
                    }
                }
            }
            ChurnAction::Partition(cut) => {
                self.network_rows(now, action);
                self.partition(cut);
            }
            ChurnAction::Heal(cut) => {
                self.network_rows(now, action);
                let cuts: Vec<Cut> = match cut {
                    Some(c) => vec![c.clone()],
                    None => self.cuts.clone(),
                };
                for c in cuts {
                    self.heal(&c);
                }
            }
            ChurnAction::Degrade { from, to, oneway, bandwidth, latency, jitter } => {
                self.links.degrade(
                    *from,
                    *to,
                    *oneway,
                    bandwidth.as_ref(),
                    latency.as_ref(),
                    *jitter,
                );
                self.network_rows(now, action);
            }
            ChurnAction::Restore { from, to, oneway } => {
                self.links.restore(*from, *to, *oneway);
                self.network_rows(now, action);
            }
            ChurnAction::CoordinatorPause | ChurnAction::CoordinatorResume => {
                let detail = action.coordinator_pause_detail().unwrap_or_default();
                run.event(now, EventKind::CoordinatorPause, None, None, detail);
                self.exec.pause_coordinator(matches!(action, ChurnAction::CoordinatorPause));
            }
            ChurnAction::CoordinatorCrash => {
                run.event(now, EventKind::CoordinatorCrash, None, None, "killed");
                self.coordinator_alive = false;
                run.net.set_down(NodeId::COORDINATOR, true);
                self.reset_node_links(NodeId::COORDINATOR);
                self.exec.crash(NodeId::COORDINATOR);
            }
        }
    }

    fn refresh_links(&mut self) {
        let now = self.now();
        let steps = self.run.rec.borrow().steps_done();
        if !self.links.due(now, steps) {
            return;
        }
        let nodes: Vec<NodeId> = self.run.scenario.nodes().iter().map(|n| n.id).collect();
        let hosts = self.hosts.clone();
        let (rates, lats) = self.links.refresh(now, steps, &nodes, &hosts);
        let changed = !rates.is_empty() || !lats.is_empty();
        if !rates.is_empty() {
            self.run.net.bandwidth.borrow_mut().set_pairs(now, rates);
        }
        self.set_latencies(&lats);
        if changed {
            self.exec.links_changed();
        }
    }

    fn node_running(&mut self, id: NodeId) -> bool {
        self.known.contains(&id) && self.exec.is_running(id)
    }
}

/// The most nodes turmoil takes: it polls every host at every tick, so its cost grows with the
/// hosts times the ticks (64 nodes: about 4 minutes a simulated hour; 256 would take hours).
pub(crate) const TURMOIL_MAX_NODES: usize = 256;
/// The most nodes the event executor takes with frame-by-frame all-reduces: a ring moves
/// 2(N-1) frames per node, O(N^2) events per all-reduce (512 nodes: a minute for three simulated
/// minutes).
pub(crate) const FRAMES_MAX_NODES: usize = 1024;
/// The most nodes the simulator takes: it keeps link state for every pair of nodes, about
/// [`BYTES_PER_PAIR`] each (1,000 nodes peak at 0.6-0.7 GB).
pub(crate) const MAX_NODES: usize = 2048;
/// Memory per pair of nodes, measured at 1,000 nodes.
pub(crate) const BYTES_PER_PAIR: u64 = 700;

/// Refuses, before anything runs, a size the chosen executor cannot run in reasonable time and
/// memory, saying why and what to change.
fn refuse_size(nodes: usize, executor: ExecutorKind, modelled: bool) -> Result<(), SimError> {
    let pairs = (nodes as u64).saturating_mul(nodes.saturating_sub(1) as u64);
    if nodes > MAX_NODES {
        let gb = pairs.saturating_mul(BYTES_PER_PAIR) as f64 / 1e9;
        return Err(SimError::Scenario(format!(
            "{nodes} nodes: the simulator keeps link state for every pair of nodes ({pairs} pairs, \
             about {gb:.0} GB); it takes at most {MAX_NODES} nodes"
        )));
    }
    match executor {
        ExecutorKind::Turmoil if nodes > TURMOIL_MAX_NODES => Err(SimError::Scenario(format!(
            "{nodes} nodes on turmoil, which polls every host at every tick (64 nodes take about \
             4 minutes a simulated hour, and the cost grows with the nodes squared); it takes at \
             most {TURMOIL_MAX_NODES}: set sim.executor = \"events\""
        ))),
        ExecutorKind::Events if !modelled && nodes > FRAMES_MAX_NODES => {
            Err(SimError::Scenario(format!(
                "{nodes} nodes with frame-by-frame all-reduces: a ring moves 2(N-1) frames per \
                 node, {} per all-reduce; the event executor moves frames for at most \
                 {FRAMES_MAX_NODES} nodes: set sim.collectives = \"modelled\" (with virtual \
                 numerics)",
                pairs.saturating_mul(2)
            )))
        }
        _ => Ok(()),
    }
}

/// Replays `scenario` (see [`crate::replay`]).
pub(crate) fn replay(scenario: &Scenario, mut opts: ReplayOptions) -> Result<RunOutput, SimError> {
    let plan = Plan::of(scenario, &opts)?;
    let seed = plan.seed;
    let mut s = scenario.clone();
    s.set_seed(seed);
    let rec = Rc::new(RefCell::new(Recorder::new(s.node_names())));
    let real = real_setup(&s, seed)?;
    let net = shared_net(&s);
    let nodes = node_ctls(&s);
    let executor = opts.executor.unwrap_or_else(|| s.sim().executor_for(s.nodes().len()));
    let modelled_collectives = modelled_collectives(&s, executor)?;
    refuse_size(s.nodes().len(), executor, modelled_collectives)?;
    let run = Rc::new(RunCtx {
        mesh: s.mesh().clone(),
        params: opts.outer_params.unwrap_or_else(|| s.model().param_count()),
        scenario: s.clone(),
        seed,
        net,
        rec,
        nodes,
        real,
        frames: Cell::new(0),
        modelled_collectives,
        mesh_stopped: RefCell::new(None),
        coordinator_paused: Cell::new(false),
        coordinator_wake: Notify::new(),
    });
    let exec = new_exec(executor, &plan, &s, &run);
    let mut d = Driver::new(exec, run.clone(), &s, seed);
    run.event(
        Time::ZERO,
        EventKind::Start,
        None,
        None,
        start_detail(executor, modelled_collectives, seed, plan.tick),
    );
    d.refresh_links();
    d.register(NodeId::COORDINATOR);
    for n in s.initial_nodes() {
        d.register(n.id);
    }
    let stop_reason = run_to_stop(&mut d, &s, &plan, &mut opts, executor)?;
    Ok(finish(&d, &s, seed, executor, stop_reason))
}

/// Where the replay loop stands at the top of a round, for its stop conditions and horizon.
struct Round<'r> {
    now: Time,
    /// Outer steps done.
    steps: u64,
    last_progress: Time,
    /// Rounds run so far.
    rounds: u64,
    /// The churn events not played yet.
    churn_left: &'r [ChurnEvent],
    /// Every node of the scenario.
    ids: &'r [NodeId],
    /// How long the loop waits, once the last outer step is done, for the members to close
    /// their last rows.
    stop_grace: Duration,
}

/// Runs the replay round by round (a tick under turmoil, a run of events under the event
/// executor), playing the churn between rounds, until a stop condition holds: returns why.
fn run_to_stop(
    d: &mut Driver<'_>,
    s: &Scenario,
    plan: &Plan,
    opts: &mut ReplayOptions,
    executor: ExecutorKind,
) -> Result<String, SimError> {
    let rec = d.run.rec.clone();
    let churn = s.churn().to_vec();
    let mut next_churn = 0;
    let mut rounds: u64 = 0;
    let progress_every = match executor {
        ExecutorKind::Turmoil => 2000,
        ExecutorKind::Events => 1,
    };
    // How long the loop waits, once the last outer step is done, for the members to close
    // their last rows (after the commit's outer work).
    let stop_grace = d.run.mesh.heartbeat_timeout.saturating_mul(2)
        + Duration::from_secs(10)
        + s.sim().outer_time(d.run.params);
    let mut reported_steps = u64::MAX;
    let ids: Vec<NodeId> = s.nodes().iter().map(|n| n.id).collect();
    loop {
        let now = d.now();
        while next_churn < churn.len() && Time::ZERO + churn[next_churn].at <= now {
            d.play(&churn[next_churn]);
            next_churn += 1;
        }
        d.strike_armed(s.nodes().len());
        d.refresh_links();
        let (steps, last_progress) = {
            let r = rec.borrow();
            (r.steps_done(), r.last_progress())
        };
        if let Some(p) = opts.progress.as_mut()
            && (steps != reported_steps || rounds.is_multiple_of(progress_every))
        {
            reported_steps = steps;
            p(Progress {
                simulated_seconds: now.as_secs_f64(),
                outer_steps: steps,
                target_outer_steps: plan.stop_steps,
                target_seconds: plan.stop_time.map(|t| t.as_secs_f64()),
            });
        }
        let round = Round {
            now,
            steps,
            last_progress,
            rounds,
            churn_left: &churn[next_churn..],
            ids: &ids,
            stop_grace,
        };
        if let Some(why) = d.stop_reason(plan, &round) {
            return Ok(why);
        }
        let horizon = d.horizon(plan, &round);
        d.exec.step(horizon)?;
        rounds += 1;
    }
}

impl Driver<'_> {
    /// Plays one churn event: a crash with `during` is armed, to strike when its node enters
    /// that phase; any other event is applied now.
    fn play(&mut self, e: &ChurnEvent) {
        let (a, during, from_step) = (e.action.clone(), e.during, e.from_step);
        match (&a, during) {
            (ChurnAction::Crash(ids), Some(phase)) => {
                for &id in ids {
                    self.run.node(id).armed.set(Some((phase, from_step.unwrap_or(0))));
                }
            }
            _ => self.apply(&a),
        }
    }

    /// Crashes the nodes whose armed crash struck since the last round: they froze where they
    /// were.
    fn strike_armed(&mut self, nodes: usize) {
        let struck: Vec<NodeId> = (0..nodes as u32)
            .map(NodeId)
            .filter(|&id| self.run.node(id).struck.replace(false))
            .collect();
        if !struck.is_empty() {
            self.apply(&ChurnAction::Crash(struck));
        }
    }

    /// Why the replay stops at this round, if it does (recording a violation where it stops for
    /// a stall or the duration limit).
    fn stop_reason(&mut self, plan: &Plan, r: &Round<'_>) -> Option<String> {
        let run = self.run.clone();
        let rec = &run.rec;
        let now = r.now;
        if let Some(t) = plan.stop_time
            && now >= Time::ZERO + t
        {
            return Some(format!("stop.time reached ({} s)", t.as_secs_f64()));
        }
        if let Some(n) = plan.stop_steps
            && r.steps >= n
        {
            let rb = rec.borrow();
            let last = rb.last_step().unwrap_or(0);
            let members: Vec<NodeId> =
                rb.latest_epoch().map(|(_, m)| m.to_vec()).unwrap_or_default();
            let have = rb.rows_of(last);
            let waiting = members.iter().any(|m| !have.contains(m) && run.node(*m).member.get());
            if !waiting || now - r.last_progress > r.stop_grace {
                return Some(format!("{n} outer steps done"));
            }
        }
        if let Some(why) = run.mesh_stopped.borrow().clone() {
            return Some(why);
        }
        // Rounds come at every row under the event executor: look at the nodes only as far as
        // the answer needs (a thousand lookups a row add up at a thousand nodes).
        if (r.rounds > 0 || !self.coordinator_alive)
            && !future_starts(r.churn_left)
            && !r.ids.iter().any(|&id| self.node_running(id))
        {
            if self.coordinator_alive {
                return Some("every node stopped".to_owned());
            }
            // No coordinator comes back (there is no standby): every node waited for it until
            // `rejoin_for`, then stopped its member cleanly and its process ended.
            let lost = rec.borrow().coordinator_lost_count();
            return Some(format!(
                "the coordinator died; {lost} members stopped cleanly (coordinator lost)"
            ));
        }
        let members = r.ids.iter().any(|&id| run.node(id).member.get());
        if self.coordinator_alive && members && now - r.last_progress > plan.stall_limit {
            let msg = format!(
                "no deadlock: no outer step finished in {:.0} s of simulated time (the mesh's deadlines \
                 bound it by {:.0} s); last progress at {:.0} s",
                (now - r.last_progress).as_secs_f64(),
                plan.stall_limit.as_secs_f64(),
                r.last_progress.as_secs_f64()
            );
            rec.borrow_mut().violation(msg);
            return Some("stalled (deadlock)".to_owned());
        }
        if now >= Time::ZERO + plan.duration_limit {
            let msg = format!(
                "no deadlock: ran for the duration limit of {:.0} s without finishing ({} outer steps done)",
                plan.duration_limit.as_secs_f64(),
                r.steps
            );
            rec.borrow_mut().violation(msg);
            return Some("duration limit reached".to_owned());
        }
        None
    }

    /// The loop's next deadline: the executor stops there (turmoil steps one tick anyway).
    fn horizon(&self, plan: &Plan, r: &Round<'_>) -> Time {
        let mut horizon = (Time::ZERO + plan.duration_limit)
            .min(self.links.next_change())
            .min(r.last_progress + plan.stall_limit + Duration::from_nanos(1));
        if let Some(e) = r.churn_left.first() {
            horizon = horizon.min(Time::ZERO + e.at);
        }
        if let Some(t) = plan.stop_time {
            horizon = horizon.min(Time::ZERO + t);
        }
        if plan.stop_steps.is_some_and(|n| r.steps >= n) {
            horizon = horizon.min(r.last_progress + r.stop_grace + Duration::from_nanos(1));
        }
        horizon
    }
}

/// Whether a node joins or restarts in `churn`.
fn future_starts(churn: &[ChurnEvent]) -> bool {
    churn.iter().any(|e| matches!(e.action, ChurnAction::Join(_) | ChurnAction::Restart(_)))
}

/// Closes the run's events with `stop_reason` and summarises its rows and events.
fn finish(
    d: &Driver<'_>,
    s: &Scenario,
    seed: u64,
    executor: ExecutorKind,
    stop_reason: String,
) -> RunOutput {
    let run = &d.run;
    let end = d.now();
    {
        let mut r = run.rec.borrow_mut();
        for n in s.nodes() {
            if run.node(n.id).member.get() {
                r.event(end, EventKind::Stop, Some(n.id), None, "end of run");
            }
        }
        r.event(end, EventKind::Stop, None, None, stop_reason.clone());
    }
    let (mut rows, mut events, violations, stale, checked) = {
        let r = run.rec.borrow();
        (r.rows.clone(), r.events.clone(), r.violations(), r.stale_frames(), r.allreduces_checked())
    };
    sort_outer_steps(&mut rows);
    sort_events(&mut events);
    let gpus = s.nodes().first().map_or(1, |n| n.gpus);
    let mfu_basis = s.mfu_basis(gpus);
    let bw = run.net.bandwidth.borrow();
    let mut extra = BTreeMap::new();
    extra.insert("stop_reason".to_owned(), serde_json::json!(stop_reason));
    extra.insert(
        "numerics".to_owned(),
        serde_json::json!(if run.real.is_some() { "real" } else { "virtual" }),
    );
    for (k, v) in d.exec.figures() {
        extra.insert(k.to_owned(), v);
    }
    extra.insert("frames_sent".to_owned(), serde_json::json!(run.frames.get()));
    extra.insert("bandwidth_recomputes".to_owned(), serde_json::json!(bw.recomputes()));
    extra.insert("stale_frames_rejected".to_owned(), serde_json::json!(stale));
    extra.insert("allreduces_checked".to_owned(), serde_json::json!(checked));
    let hosts: BTreeSet<String> = d.hosts.iter().map(|h| host_name(*h)).collect();
    extra.insert("hosts".to_owned(), serde_json::json!(hosts.len()));
    drop(bw);
    let meta = RunMeta {
        scenario: s.name().to_owned(),
        seed,
        backend: "sim".to_owned(),
        wall_seconds: 0.0,
        published: s.published().map(|p| p.name().to_owned()),
        inner_steps_per_outer: Some(s.diloco().round_steps()),
        mfu_basis,
        violations,
        diloco: s.diloco().facts(),
        extra,
    };
    let summary = summarize(&meta, &rows, &events);
    RunOutput { summary, rows, events, executor }
}
