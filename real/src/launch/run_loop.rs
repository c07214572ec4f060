//! The launcher's run loop: starts the processes, plays the scenario's churn on them with
//! signals and new processes as its clock comes, watches them until the run ends, and merges
//! the record.

use super::{
    Fleet, JOIN_LEAD, LaunchError, LaunchOutcome, Notice, ProcessRecord, READY_LIMIT, Run, TICK,
    gate, record, unix_now,
};
use loco_core::ids::NodeId;
use loco_core::metrics::{EventKind, EventRow};
use loco_core::scenario::{ChurnAction, Cut};
use nix::sys::signal::Signal;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// What the run loop keeps between its turns.
struct Loop {
    /// Each node's worker, as its index in the fleet.
    workers: BTreeMap<NodeId, usize>,
    /// The launcher's own rows of the run's events.
    launch_events: Vec<EventRow>,
    /// The scenario's churn (it already holds the starts of late nodes, as joins), sorted by
    /// time: (time, action, armed in the worker at its start).
    timeline: Vec<(Duration, ChurnAction, bool)>,
    /// The next event of `timeline` to play.
    next: usize,
    /// The workers started at the launch.
    starting: Vec<usize>,
    /// Join events whose processes were started ahead of time.
    prestarted: BTreeSet<usize>,
    /// When the scenario's clock started, since the launch.
    churn_t0: Option<Duration>,
    /// The nodes this launch stopped (hang).
    hung: BTreeSet<NodeId>,
    /// This launch stopped the coordinator (`coordinator-pause`).
    coordinator_paused: bool,
    /// The partitions in force (a `heal` without a cut heals them all).
    cuts: Vec<Cut>,
    /// The workers that failed on their own.
    failures: Vec<String>,
}

impl Run<'_, '_> {
    pub(super) fn run(&mut self) -> Result<LaunchOutcome, LaunchError> {
        let plan = self.plan;
        let s = &plan.scenario;
        self.addr = Some(self.start_coordinator()?);
        let mut st = Loop {
            workers: BTreeMap::new(),
            launch_events: Vec::new(),
            timeline: s
                .churn()
                .iter()
                .map(|c| (c.at, c.action.clone(), c.during.is_some()))
                .collect(),
            next: 0,
            starting: Vec::new(),
            prestarted: BTreeSet::new(),
            churn_t0: None,
            hung: BTreeSet::new(),
            coordinator_paused: false,
            cuts: Vec::new(),
            failures: Vec::new(),
        };
        for n in s.initial_nodes() {
            let i = self.spawn(n, Duration::ZERO, None)?;
            st.workers.insert(n.id, i);
            st.starting.push(i);
        }
        // The run's start, as the simulator writes it (the processes' own rows follow).
        st.launch_events.push(EventRow::new(0.0, EventKind::Start).detail(format!(
            "seed {}, {} processes",
            s.seed(),
            st.starting.len()
        )));
        let limit = plan.timeout.or(s.stop().time.map(|t| t + Duration::from_secs(60)));
        let mut shown: Option<Duration> = None;
        loop {
            let elapsed = self.elapsed();
            self.start_clock_when_ready(&mut st, elapsed)?;
            let churn_now = st.churn_t0.map(|t0| elapsed.saturating_sub(t0));
            if let (Some(now), Some(t0)) = (churn_now, st.churn_t0) {
                self.prestart_joiners(&mut st, now, t0)?;
            }
            if let Some(churn_now) = churn_now {
                self.play_due(&mut st, churn_now, elapsed)?;
            }
            self.poll_workers(&mut st)?;
            if self.ends(&mut st, elapsed, limit)? {
                break;
            }
            if shown.is_none_or(|t| elapsed >= t + TICK) {
                shown = Some(elapsed);
                let committed = self.committed;
                (self.on_notice)(Notice::Progress { elapsed_s: elapsed.as_secs_f64(), committed });
            }
            // Sleep until the next churn event is due, a worker says something, or a tick.
            let due = self.next_due(&st);
            self.listen(due.map_or(TICK, |d| d.min(TICK)));
        }
        self.outcome(st)
    }

    /// Starts the scenario's clock once every starting worker is ready (a worker that exited
    /// before it was will never be), or at [`READY_LIMIT`]: process start-up is not part of the
    /// run.
    fn start_clock_when_ready(
        &mut self,
        st: &mut Loop,
        elapsed: Duration,
    ) -> Result<(), LaunchError> {
        if st.churn_t0.is_some() {
            return Ok(());
        }
        let waiting = st
            .starting
            .iter()
            .filter_map(|&i| self.fleet.0.get(i))
            .filter(|p| p.ready_s.is_none() && !p.exited)
            .count();
        if waiting == 0 || elapsed > READY_LIMIT {
            st.churn_t0 = Some(elapsed);
            if let Some(net) = &self.net {
                net.start_clock();
            }
            if let Some(gate) = self.gate.take() {
                gate::open(&gate, self.run_start + elapsed.as_secs_f64())?;
            }
            let after_s = elapsed.as_secs_f64();
            if waiting > 0 {
                tracing::warn!(waiting, "starting workers not ready; the clock starts");
            }
            (self.on_notice)(Notice::ClockStarted { after_s, all_ready: waiting == 0 });
        }
        Ok(())
    }

    /// Starts the joiners due within [`JOIN_LEAD`] of the scenario's time `now`: they wait for
    /// their time to ask to join (start-up takes a while, and not equally long for every
    /// process: nodes the scenario starts together would ask some hundred milliseconds apart,
    /// and could be admitted at different outer steps). `t0` is when the clock started.
    fn prestart_joiners(
        &mut self,
        st: &mut Loop,
        now: Duration,
        t0: Duration,
    ) -> Result<(), LaunchError> {
        let plan = self.plan;
        let s = &plan.scenario;
        for (j, (t, action, _)) in st.timeline.iter().enumerate().skip(st.next) {
            if *t > now + JOIN_LEAD {
                break;
            }
            let ChurnAction::Join(ids) = action else { continue };
            if !st.prestarted.insert(j) {
                continue;
            }
            let join_at = self.run_start + (t0 + *t).as_secs_f64();
            for id in ids {
                if let Some(n) = s.node(*id) {
                    // Faults count from the join, where the worker's clock starts.
                    st.workers.insert(*id, self.spawn(n, *t, Some(join_at))?);
                }
            }
        }
        Ok(())
    }

    /// Plays the churn events due by the scenario's time `churn_now` (`elapsed` since the
    /// launch).
    fn play_due(
        &mut self,
        st: &mut Loop,
        churn_now: Duration,
        elapsed: Duration,
    ) -> Result<(), LaunchError> {
        while st.timeline.get(st.next).is_some_and(|e| e.0 <= churn_now) {
            let Some((_, action, in_process)) = st.timeline.get(st.next).cloned() else { break };
            let started_early = st.prestarted.contains(&st.next);
            st.next += 1;
            if in_process {
                continue; // armed in the worker at its start
            }
            self.play(st, &action, started_early, churn_now, elapsed.as_secs_f64())?;
        }
        Ok(())
    }

    /// Plays one churn event at the scenario's time `churn_now` (`at` seconds since the launch);
    /// `started_early`: a join whose processes were started ahead of time.
    fn play(
        &mut self,
        st: &mut Loop,
        action: &ChurnAction,
        started_early: bool,
        churn_now: Duration,
        at: f64,
    ) -> Result<(), LaunchError> {
        let plan = self.plan;
        let s = &plan.scenario;
        let name = |id: &NodeId| s.node(*id).map(|n| n.name.clone()).unwrap_or_default();
        match action {
            ChurnAction::Join(ids) | ChurnAction::Restart(ids) => {
                let restart = matches!(action, ChurnAction::Restart(_));
                for id in ids {
                    if let Some(n) = s.node(*id) {
                        if !started_early {
                            st.workers.insert(*id, self.spawn(n, churn_now, None)?);
                        }
                        // A join is the node's to write (its admission), as in the simulator; a
                        // restart is the launcher's.
                        if restart {
                            st.launch_events.push(
                                EventRow::new(at, EventKind::Restart)
                                    .node(n.name.clone())
                                    .detail("process restarted"),
                            );
                        }
                    }
                }
            }
            ChurnAction::Crash(ids) => {
                for id in ids {
                    if let Some(&i) = st.workers.get(id) {
                        self.signal(i, Signal::SIGKILL);
                        st.launch_events.push(
                            EventRow::new(at, EventKind::Crash).node(name(id)).detail("SIGKILL"),
                        );
                    }
                }
            }
            ChurnAction::Leave(ids) => {
                for id in ids {
                    if let Some(&i) = st.workers.get(id) {
                        self.signal(i, Signal::SIGTERM);
                    }
                }
            }
            // In-process: the node's work stops, its machine and heartbeats go on.
            ChurnAction::Hang(ids) | ChurnAction::Resume(ids) => {
                let hang = matches!(action, ChurnAction::Hang(_));
                let detail = action.hang_detail().unwrap_or_default();
                for id in ids {
                    if let Some(&i) = st.workers.get(id) {
                        if hang {
                            st.hung.insert(*id);
                        } else {
                            st.hung.remove(id);
                        }
                        self.send_command(i, if hang { "hang" } else { "resume" });
                        st.launch_events
                            .push(EventRow::new(at, EventKind::Hang).node(name(id)).detail(detail));
                    }
                }
            }
            ChurnAction::CoordinatorPause | ChurnAction::CoordinatorResume => {
                let paused = matches!(action, ChurnAction::CoordinatorPause);
                let signal = if paused { Signal::SIGSTOP } else { Signal::SIGCONT };
                let detail = action.coordinator_pause_detail().unwrap_or_default();
                st.coordinator_paused = paused;
                self.signal(self.coordinator, signal);
                st.launch_events
                    .push(EventRow::new(at, EventKind::CoordinatorPause).detail(detail));
            }
            ChurnAction::CoordinatorCrash => {
                self.signal(self.coordinator, Signal::SIGKILL);
                st.launch_events
                    .push(EventRow::new(at, EventKind::CoordinatorCrash).detail("SIGKILL"));
            }
            ChurnAction::Partition(_)
            | ChurnAction::Heal(_)
            | ChurnAction::Degrade { .. }
            | ChurnAction::Restore { .. } => {
                for (kind, detail) in action.network_rows(s, &st.cuts) {
                    st.launch_events.push(EventRow::new(at, kind).detail(detail));
                }
                action.update_cuts(&mut st.cuts);
                match &self.net {
                    Some(net) => net.apply(action),
                    None => tracing::warn!("{action:?} is not played: the run is on bare loopback"),
                }
            }
        }
        Ok(())
    }

    /// Notes the processes that exited: a worker that failed on its own (not a signal of the
    /// churn) is an error.
    fn poll_workers(&mut self, st: &mut Loop) -> Result<(), LaunchError> {
        let coord = self.coordinator;
        for i in 0..self.fleet.0.len() {
            if i == coord {
                continue;
            }
            let Some(p) = self.proc(i) else { continue };
            if let Some(status) = p.poll_exit()?
                && status.code().is_some_and(|c| c != 0)
            {
                let name = p.name.clone();
                st.failures.push(name.clone());
                (self.on_notice)(Notice::WorkerFailed { name, status: status.to_string() });
            }
        }
        if let Some(p) = self.proc(coord) {
            p.poll_exit()?;
        }
        Ok(())
    }

    /// Whether the run is over, `elapsed` since the launch with the time `limit`: ending it
    /// where it must (the coordinator told to stop, the hung let run again).
    fn ends(
        &mut self,
        st: &mut Loop,
        elapsed: Duration,
        limit: Option<Duration>,
    ) -> Result<bool, LaunchError> {
        let coord = self.coordinator;
        let exited = |fleet: &Fleet, i: usize| fleet.0.get(i).is_none_or(|p| p.exited);
        let coord_stopped = exited(&self.fleet, coord);
        let all_workers_done = st.workers.values().all(|&i| exited(&self.fleet, i));
        if coord_stopped && all_workers_done {
            return Ok(true);
        }
        let joins_ahead = st
            .timeline
            .get(st.next..)
            .unwrap_or_default()
            .iter()
            .any(|(_, a, _)| matches!(a, ChurnAction::Join(_) | ChurnAction::Restart(_)));
        if all_workers_done && !coord_stopped && !joins_ahead {
            (self.on_notice)(Notice::EveryWorkerStopped);
            self.terminate_coordinator(st);
            std::thread::sleep(Duration::from_secs(1));
            return Ok(true);
        }
        if coord_stopped && !all_workers_done {
            self.wait_for_members(st)?;
            return Ok(true);
        }
        if limit.is_some_and(|l| elapsed > l) {
            (self.on_notice)(Notice::TimeLimit);
            self.terminate_coordinator(st);
            std::thread::sleep(Duration::from_secs(3));
            return Ok(true);
        }
        Ok(false)
    }

    /// Tells the coordinator to stop (SIGTERM), letting it run first if this launch paused it:
    /// a stopped process does not act on SIGTERM.
    fn terminate_coordinator(&mut self, st: &mut Loop) {
        if std::mem::take(&mut st.coordinator_paused) {
            self.signal(self.coordinator, Signal::SIGCONT);
        }
        self.signal(self.coordinator, Signal::SIGTERM);
    }

    /// The coordinator is gone: lets the hung run again and waits, at most `rejoin_for` and
    /// some, for the members to stop on their own.
    fn wait_for_members(&mut self, st: &mut Loop) -> Result<(), LaunchError> {
        // A hung process does not start another membership: let it go on.
        for id in std::mem::take(&mut st.hung) {
            if let Some(&i) = st.workers.get(&id) {
                self.send_command(i, "resume");
            }
        }
        // The coordinator is gone: members wait for it until `rejoin_for`, then checkpoint and
        // stop on their own.
        let plan = self.plan;
        let grace = plan.scenario.mesh().rejoin_for + Duration::from_secs(10);
        let deadline = unix_now() + grace.as_secs_f64();
        while unix_now() < deadline {
            let mut running = false;
            for &i in st.workers.values() {
                if let Some(p) = self.proc(i) {
                    p.poll_exit()?;
                    running |= !p.exited;
                }
            }
            if !running {
                break;
            }
            self.listen(TICK);
        }
        Ok(())
    }

    /// How long until the next churn event is due (a joiner's start, [`JOIN_LEAD`] ahead of its
    /// join, included), once the scenario's clock runs.
    fn next_due(&self, st: &Loop) -> Option<Duration> {
        st.churn_t0.and_then(|t0| {
            let t = st.timeline.get(st.next)?.0;
            let lead = st
                .timeline
                .iter()
                .enumerate()
                .skip(st.next)
                .find(|(j, (_, a, _))| {
                    matches!(a, ChurnAction::Join(_)) && !st.prestarted.contains(j)
                })
                .map(|(_, (t, _, _))| t.saturating_sub(JOIN_LEAD));
            Some((t0 + lead.map_or(t, |l| l.min(t))).saturating_sub(self.elapsed()))
        })
    }

    /// Kills what still runs and merges the run's record.
    fn outcome(&mut self, st: Loop) -> Result<LaunchOutcome, LaunchError> {
        let plan = self.plan;
        let s = &plan.scenario;
        // Everything still running is killed (a stopped process included).
        for p in &mut self.fleet.0 {
            if matches!(p.child.try_wait(), Ok(None)) {
                let _ = p.child.kill();
                let _ = p.child.wait();
            }
        }
        let wall = unix_now() - self.run_start;
        let mut r = record::collect(s, &self.nodes_dir, st.launch_events, wall, &st.failures)?;
        r.summary.extra.insert("network".into(), self.used.name().into());
        if let Some(net) = &self.net {
            let (_, stats) = net.stats();
            let dropped: u64 = stats.values().map(|p| p.dropped_full + p.dropped_cut).sum();
            let carried: u64 = stats.values().map(|p| p.bytes).sum();
            r.summary.extra.insert("network_bytes_carried".into(), carried.into());
            r.summary.extra.insert("network_packets_dropped".into(), dropped.into());
        }
        let processes = self
            .fleet
            .0
            .iter()
            .filter_map(|p| {
                Some(ProcessRecord {
                    node: p.node?,
                    name: p.name.clone(),
                    incarnation: p.incarnation,
                    started_s: p.started_s,
                    ready_s: p.ready_s,
                    stopped: p.stopped.clone(),
                    exit: p.exit.clone(),
                })
            })
            .collect();
        Ok(LaunchOutcome {
            summary: r.summary,
            rows: r.rows,
            events: r.events,
            peak_rss_bytes: r.peaks,
            clock_start_s: st.churn_t0.map(|t| t.as_secs_f64()),
            processes,
        })
    }
}
