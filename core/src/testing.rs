//! An in-memory network of sans-IO mesh machines on a virtual clock, for tests (feature
//! `testing`): raft-rs's `Network` harness and quinn's `Pair` in one.
//!
//! A [`Network`] holds one [`Coordinator`] and any number of nodes, each a [`Member`] plus a
//! [`Driver`] (the node's "backend": it executes the member's actions, such as computing or
//! running the all-reduce, and reports back with [`Command`]s). Frames travel with a latency and
//! are serialised per directed link at a bandwidth (so the members' probes measure something),
//! in order per link. Time is virtual: each [`Network::step`] jumps to the earliest of the next
//! delivery and every machine's `poll_timeout`, and handles exactly that one event. Runs are
//! bounded ([`Livelock`]) and deterministic (ties broken by kind and id; the only randomness,
//! message loss, comes from a seeded ChaCha stream).
//!
//! Faults: [`crash`](Network::crash) (SIGKILL: the node vanishes, frames to it are lost),
//! [`leave`](Network::leave) (deathrattle), [`hang`](Network::hang) (the application stops but
//! the heartbeats go on), [`restart`](Network::restart) (a new incarnation) and
//! [`restart_same_incarnation`](Network::restart_same_incarnation), [`crash_coordinator`](Network::crash_coordinator),
//! [`cut`](Network::cut) / [`isolate`](Network::isolate) / [`recover`](Network::recover),
//! [`set_drop_rate`](Network::set_drop_rate), per-node clock offsets
//! ([`set_clock_offset`](Network::set_clock_offset)).

pub mod nodes;

use crate::ids::NodeId;
use crate::mesh::Member;
use crate::mesh::{
    Command, Coordinator, CoordinatorAction, LeaveReason, MemberAction, MeshConfig, MeshError,
    MeshEvent,
};
use crate::time::Time;
use crate::transport::{Frame, Header, padded_frame};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// What a [`Driver`] asks of its node.
#[derive(Clone, Debug, PartialEq)]
pub enum DriverOutput {
    /// A command for the node's member.
    Command(Command),
    /// A frame to send (a collective segment, or anything else the driver speaks).
    Send {
        /// Receiver.
        to: NodeId,
        /// The frame.
        frame: Frame,
    },
}

/// The backend of one node in the harness: executes its member's actions and reports back.
/// Times are the node's local clock.
pub trait Driver {
    /// The member emitted `action` (never a `Send`: the network carries those).
    fn on_action(
        &mut self,
        now: Time,
        me: NodeId,
        action: &MemberAction,
        out: &mut Vec<DriverOutput>,
    );

    /// A frame other than a mesh control frame arrived (for example a collective segment).
    fn on_frame(&mut self, _now: Time, _from: NodeId, _frame: Frame, _out: &mut Vec<DriverOutput>) {
    }

    /// The driver's next deadline.
    fn poll_timeout(&self) -> Option<Time> {
        None
    }

    /// The driver's deadline passed (early calls must be harmless).
    fn handle_timeout(&mut self, _now: Time, _out: &mut Vec<DriverOutput>) {}
}

/// A modelled workload: computing an outer step takes `compute`, an all-reduce `allreduce`,
/// receiving the state `sync`. No numerics.
#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    /// Time for the inner steps of one outer step.
    pub compute: Duration,
    /// Time for one all-reduce.
    pub allreduce: Duration,
    /// Time to receive the state as a joiner.
    pub sync: Duration,
    pending: Vec<(Time, Command)>,
}

impl Workload {
    /// A workload with these durations.
    pub fn new(compute: Duration, allreduce: Duration, sync: Duration) -> Self {
        Workload { compute, allreduce, sync, pending: Vec::new() }
    }

    /// Commands scheduled, with their due time.
    pub fn pending(&self) -> &[(Time, Command)] {
        &self.pending
    }
}

impl Driver for Workload {
    fn on_action(
        &mut self,
        now: Time,
        _me: NodeId,
        action: &MemberAction,
        _out: &mut Vec<DriverOutput>,
    ) {
        match action {
            MemberAction::Compute { outer_step, .. } => {
                let c = Command::BarrierArrive { outer_step: *outer_step };
                self.pending.push((now + self.compute, c));
            }
            MemberAction::StartAllReduce(s) => {
                self.pending.retain(|(_, c)| !matches!(c, Command::AllReduceDone { .. }));
                let c = Command::AllReduceDone { epoch: s.epoch, op: s.op };
                self.pending.push((now + self.allreduce, c));
            }
            MemberAction::AbortAllReduce { epoch, op } => {
                self.pending
                    .retain(|(_, c)| *c != Command::AllReduceDone { epoch: *epoch, op: *op });
            }
            MemberAction::FetchState { .. } => {
                self.pending.retain(|(_, c)| *c != Command::SyncDone);
                self.pending.push((now + self.sync, Command::SyncDone));
            }
            MemberAction::Stop(_) => self.pending.clear(),
            _ => {}
        }
    }

    fn poll_timeout(&self) -> Option<Time> {
        self.pending.iter().map(|(t, _)| *t).min()
    }

    fn handle_timeout(&mut self, now: Time, out: &mut Vec<DriverOutput>) {
        let mut due: Vec<(Time, Command)> = Vec::new();
        self.pending.retain(|&(t, c)| {
            if t <= now {
                due.push((t, c));
                false
            } else {
                true
            }
        });
        due.sort_by_key(|(t, _)| *t);
        out.extend(due.into_iter().map(|(_, c)| DriverOutput::Command(c)));
    }
}

/// One thing that happened, for assertions.
#[derive(Clone, Debug, PartialEq)]
pub enum TraceKind {
    /// A member's action (sends only when [`Network::trace_sends`] is on).
    Member(MemberAction),
    /// A coordinator's event (or send, when tracing sends).
    Coordinator(CoordinatorAction),
    /// A driver's command and the member's answer.
    Command(Command, Result<(), MeshError>),
    /// The harness injected a fault.
    Fault(String),
}

/// One trace entry.
#[derive(Clone, Debug, PartialEq)]
pub struct Traced {
    /// Global virtual time.
    pub at: Time,
    /// The node (the coordinator for its events).
    pub node: NodeId,
    /// What.
    pub what: TraceKind,
}

/// A run did not settle within the step bound: probably a livelock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("no progress after {steps} steps at {at}: livelock?")]
pub struct Livelock {
    /// Steps taken.
    pub steps: u64,
    /// Virtual time reached.
    pub at: Time,
}

/// A seeded network on a virtual clock that handles one event at a time: what the run loops
/// below need of it.
trait Stepped {
    fn clock(&mut self) -> &mut Time;
    fn next_at(&self) -> Option<Time>;
    fn handle_next(&mut self);
    fn step_limit(&self) -> u64;
}

/// Runs every event of `net` up to and including `t`, then sets its clock to `t`.
fn run_until<N: Stepped>(net: &mut N, t: Time) -> Result<(), Livelock> {
    let mut steps = 0;
    while net.next_at().is_some_and(|n| n <= t) {
        net.handle_next();
        steps += 1;
        if steps > net.step_limit() {
            return Err(Livelock { steps, at: *net.clock() });
        }
    }
    let now = net.clock();
    *now = (*now).max(t);
    Ok(())
}

/// Runs `net` until `pred` holds (checked after every event) or `deadline`; whether it held.
fn run_until_cond<N: Stepped>(
    net: &mut N,
    deadline: Time,
    mut pred: impl FnMut(&N) -> bool,
) -> Result<bool, Livelock> {
    let mut steps = 0;
    loop {
        if pred(net) {
            return Ok(true);
        }
        match net.next_at() {
            Some(n) if n <= deadline => net.handle_next(),
            _ => {
                let now = net.clock();
                *now = (*now).max(deadline);
                return Ok(pred(net));
            }
        }
        steps += 1;
        if steps > net.step_limit() {
            return Err(Livelock { steps, at: *net.clock() });
        }
    }
}

struct Node<D> {
    member: Option<Member>,
    driver: D,
    offset_ns: i64,
    hung: bool,
    incarnation: u64,
    shards: u16,
}

#[derive(Clone, Debug)]
struct Envelope {
    from: NodeId,
    to: NodeId,
    frame: Frame,
}

/// The in-memory network. See the module documentation.
pub struct Network<D: Driver = Workload> {
    now: Time,
    cfg: MeshConfig,
    coordinator: Option<Coordinator>,
    nodes: BTreeMap<NodeId, Node<D>>,
    inflight: BTreeMap<(Time, u64), Envelope>,
    seq: u64,
    latency: Duration,
    default_bandwidth: f64,
    bandwidth: BTreeMap<(NodeId, NodeId), f64>,
    busy: BTreeMap<(NodeId, NodeId), Time>,
    cut: BTreeSet<(NodeId, NodeId)>,
    drop_rate: f64,
    rng: ChaCha8Rng,
    trace: Vec<Traced>,
    trace_sends: bool,
    max_steps: u64,
    delivered: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Due {
    Deliver(u64),
    Coordinator,
    Member(NodeId),
    Driver(NodeId),
}

impl<D: Driver> Network<D> {
    /// A network with a coordinator and no nodes at time 0: 1 ms latency, 1 GB/s links,
    /// no loss. `seed` drives message loss only.
    pub fn new(cfg: MeshConfig, seed: u64) -> Self {
        Network {
            now: Time::ZERO,
            coordinator: Some(Coordinator::new(cfg.clone())),
            cfg,
            nodes: BTreeMap::new(),
            inflight: BTreeMap::new(),
            seq: 0,
            latency: Duration::from_millis(1),
            default_bandwidth: 1e9,
            bandwidth: BTreeMap::new(),
            busy: BTreeMap::new(),
            cut: BTreeSet::new(),
            drop_rate: 0.0,
            rng: ChaCha8Rng::seed_from_u64(seed),
            trace: Vec::new(),
            trace_sends: false,
            max_steps: 5_000_000,
            delivered: 0,
        }
    }

    /// The virtual time (global clock).
    pub fn now(&self) -> Time {
        self.now
    }

    /// The mesh settings.
    pub fn config(&self) -> &MeshConfig {
        &self.cfg
    }

    /// The coordinator, unless crashed.
    pub fn coordinator(&self) -> Option<&Coordinator> {
        self.coordinator.as_ref()
    }

    /// A node's member, unless crashed or unknown.
    pub fn member(&self, id: NodeId) -> Option<&Member> {
        self.nodes.get(&id).and_then(|n| n.member.as_ref())
    }

    /// A node's driver.
    pub fn driver(&self, id: NodeId) -> Option<&D> {
        self.nodes.get(&id).map(|n| &n.driver)
    }

    /// A node's driver, mutably.
    pub fn driver_mut(&mut self, id: NodeId) -> Option<&mut D> {
        self.nodes.get_mut(&id).map(|n| &mut n.driver)
    }

    /// Ids of the nodes ever added, crashed or not.
    pub fn node_ids(&self) -> Vec<NodeId> {
        self.nodes.keys().copied().collect()
    }

    /// Everything traced so far.
    pub fn trace(&self) -> &[Traced] {
        &self.trace
    }

    /// Also trace every message sent (off by default: heartbeats are many).
    pub fn trace_sends(&mut self, on: bool) {
        self.trace_sends = on;
    }

    /// The actions of one node's member, with their global time.
    pub fn actions_of(&self, id: NodeId) -> Vec<(Time, &MemberAction)> {
        self.trace
            .iter()
            .filter(|t| t.node == id)
            .filter_map(|t| match &t.what {
                TraceKind::Member(a) => Some((t.at, a)),
                _ => None,
            })
            .collect()
    }

    /// The coordinator's events, with their time.
    pub fn events(&self) -> Vec<(Time, &MeshEvent)> {
        self.trace
            .iter()
            .filter_map(|t| match &t.what {
                TraceKind::Coordinator(CoordinatorAction::Event(e)) => Some((t.at, e)),
                _ => None,
            })
            .collect()
    }

    /// Frames delivered so far.
    pub fn delivered(&self) -> u64 {
        self.delivered
    }

    /// One-way latency of every link.
    pub fn set_latency(&mut self, d: Duration) {
        self.latency = d;
    }

    /// Bandwidth (bytes per second) of links without their own.
    pub fn set_default_bandwidth(&mut self, bytes_per_sec: f64) {
        self.default_bandwidth = bytes_per_sec;
    }

    /// Bandwidth of the directed link `from -> to`.
    pub fn set_bandwidth(&mut self, from: NodeId, to: NodeId, bytes_per_sec: f64) {
        self.bandwidth.insert((from, to), bytes_per_sec);
    }

    /// Probability that any frame is lost (drawn from the seeded stream).
    pub fn set_drop_rate(&mut self, p: f64) {
        self.drop_rate = p.clamp(0.0, 1.0);
    }

    /// The step bound of one `run_*` call.
    pub fn set_max_steps(&mut self, n: u64) {
        self.max_steps = n;
    }

    fn fault(&mut self, node: NodeId, what: String) {
        self.trace.push(Traced { at: self.now, node, what: TraceKind::Fault(what) });
    }

    /// Adds a node with one shard that joins now.
    pub fn add_node(&mut self, id: NodeId, driver: D) {
        self.add_node_with(id, driver, 1, 0.0);
    }

    /// Adds a node with `shards` local rings and a clock `offset_secs` ahead of the global
    /// clock (negative: behind; local times clamp at 0), that joins now.
    pub fn add_node_with(&mut self, id: NodeId, driver: D, shards: u16, offset_secs: f64) {
        let incarnation = self.nodes.get(&id).map_or(0, |n| n.incarnation + 1);
        self.start_node(id, driver, shards, offset_secs, incarnation);
    }

    fn start_node(
        &mut self,
        id: NodeId,
        driver: D,
        shards: u16,
        offset_secs: f64,
        incarnation: u64,
    ) {
        let member = Member::new(id, incarnation, self.cfg.clone(), shards);
        let offset_ns = (offset_secs * 1e9) as i64;
        let node =
            Node { member: Some(member), driver, offset_ns, hung: false, incarnation, shards };
        self.nodes.insert(id, node);
        let now = self.local(id, self.now);
        if let Some(m) = self.nodes.get_mut(&id).and_then(|n| n.member.as_mut()) {
            // A fresh member is idle, so join cannot fail.
            let _ = m.join(now);
        }
        self.fault(id, format!("start (incarnation {incarnation})"));
        self.pump(id);
    }

    /// Restarts a node (after a crash or not) as a new incarnation with a new driver.
    pub fn restart(&mut self, id: NodeId, driver: D) {
        let (shards, offset) =
            self.nodes.get(&id).map_or((1, 0.0), |n| (n.shards, n.offset_ns as f64 * 1e-9));
        self.add_node_with(id, driver, shards, offset);
    }

    /// Restarts a node (after a crash or not) with the SAME incarnation as its last process: a
    /// misconfigured supervisor, or a process that does not persist its incarnation. The new
    /// process has none of the old one's state.
    pub fn restart_same_incarnation(&mut self, id: NodeId, driver: D) {
        let (shards, offset, incarnation) = self
            .nodes
            .get(&id)
            .map_or((1, 0.0, 0), |n| (n.shards, n.offset_ns as f64 * 1e-9, n.incarnation));
        self.fault(id, format!("restart reusing incarnation {incarnation}"));
        self.start_node(id, driver, shards, offset, incarnation);
    }

    /// SIGKILL: the node's member vanishes without a word; frames to it are lost.
    pub fn crash(&mut self, id: NodeId) {
        if let Some(n) = self.nodes.get_mut(&id) {
            n.member = None;
        }
        self.fault(id, "crash".into());
    }

    /// The coordinator vanishes.
    pub fn crash_coordinator(&mut self) {
        self.coordinator = None;
        self.fault(NodeId::COORDINATOR, "crash".into());
    }

    /// The node leaves with its deathrattle.
    pub fn leave(&mut self, id: NodeId, reason: LeaveReason) {
        let now = self.local(id, self.now);
        if let Some(m) = self.nodes.get_mut(&id).and_then(|n| n.member.as_mut()) {
            m.leave(now, reason);
        }
        self.fault(id, format!("leave ({reason})"));
        self.pump(id);
    }

    /// The node's application hangs: its driver no longer runs, its heartbeats go on.
    pub fn hang(&mut self, id: NodeId) {
        if let Some(n) = self.nodes.get_mut(&id) {
            n.hung = true;
        }
        self.fault(id, "hang".into());
    }

    /// Sets a node's clock offset in seconds (positive: ahead). For a skew between processes, give
    /// it at [`add_node_with`](Self::add_node_with); on a running node this is a jump of its clock,
    /// which a monotonic clock never does.
    pub fn set_clock_offset(&mut self, id: NodeId, offset_secs: f64) {
        if let Some(n) = self.nodes.get_mut(&id) {
            n.offset_ns = (offset_secs * 1e9) as i64;
        }
    }

    /// Frames between `a` and `b` are lost, both ways.
    pub fn cut(&mut self, a: NodeId, b: NodeId) {
        self.cut.insert((a, b));
        self.cut.insert((b, a));
        self.fault(a, format!("cut from {b}"));
    }

    /// Frames to and from `a` are lost.
    pub fn isolate(&mut self, a: NodeId) {
        let others: Vec<NodeId> =
            self.nodes.keys().copied().chain([NodeId::COORDINATOR]).filter(|&b| b != a).collect();
        for b in others {
            self.cut.insert((a, b));
            self.cut.insert((b, a));
        }
        self.fault(a, "isolate".into());
    }

    /// Heals every cut.
    pub fn recover(&mut self) {
        self.cut.clear();
    }

    fn local(&self, id: NodeId, global: Time) -> Time {
        let off = self.nodes.get(&id).map_or(0, |n| n.offset_ns);
        let ns = i128::from(global.as_nanos()) + i128::from(off);
        Time::from_nanos(ns.clamp(0, i128::from(u64::MAX)) as u64)
    }

    fn global(&self, id: NodeId, local: Time) -> Time {
        let off = self.nodes.get(&id).map_or(0, |n| n.offset_ns);
        let ns = i128::from(local.as_nanos()) - i128::from(off);
        Time::from_nanos(ns.clamp(0, i128::from(u64::MAX)) as u64)
    }

    fn enqueue(&mut self, from: NodeId, to: NodeId, frame: Frame) {
        if self.cut.contains(&(from, to)) {
            return;
        }
        if self.drop_rate > 0.0 && self.rng.random::<f64>() < self.drop_rate {
            return;
        }
        let bw = self.bandwidth.get(&(from, to)).copied().unwrap_or(self.default_bandwidth);
        let tx = Duration::from_secs_f64(frame.wire_len() as f64 / bw.max(1.0));
        let start = self.busy.get(&(from, to)).copied().unwrap_or(Time::ZERO).max(self.now);
        let done = start + tx;
        self.busy.insert((from, to), done);
        self.seq += 1;
        self.inflight.insert((done + self.latency, self.seq), Envelope { from, to, frame });
    }

    fn next_due(&self) -> Option<(Time, Due)> {
        let mut best: Option<(Time, Due)> = None;
        let mut consider = |t: Time, d: Due| {
            if best.as_ref().is_none_or(|b| (t, d) < *b) {
                best = Some((t, d));
            }
        };
        if let Some((&(t, seq), _)) = self.inflight.first_key_value() {
            consider(t, Due::Deliver(seq));
        }
        if let Some(t) = self.coordinator.as_ref().and_then(Coordinator::poll_timeout) {
            consider(t, Due::Coordinator);
        }
        for (&id, n) in &self.nodes {
            if let Some(t) = n.member.as_ref().and_then(Member::poll_timeout) {
                consider(self.global(id, t), Due::Member(id));
            }
            if n.member.is_some()
                && !n.hung
                && let Some(t) = n.driver.poll_timeout()
            {
                consider(self.global(id, t), Due::Driver(id));
            }
        }
        best
    }

    /// The time of the next event, if any.
    pub fn next_event(&self) -> Option<Time> {
        self.next_due().map(|(t, _)| t)
    }

    /// Handles the next event (jumping the clock to it). False when nothing is left to do.
    pub fn step(&mut self) -> bool {
        let Some((t, due)) = self.next_due() else { return false };
        self.now = self.now.max(t);
        let now = self.now;
        match due {
            Due::Deliver(_) => {
                let Some((_, env)) = self.inflight.pop_first() else { return true };
                self.deliver(env);
            }
            Due::Coordinator => {
                if let Some(c) = self.coordinator.as_mut() {
                    c.handle_timeout(now);
                }
                self.pump_coordinator();
            }
            Due::Member(id) => {
                let local = self.local(id, now);
                if let Some(m) = self.nodes.get_mut(&id).and_then(|n| n.member.as_mut()) {
                    m.handle_timeout(local);
                }
                self.pump(id);
            }
            Due::Driver(id) => {
                let local = self.local(id, now);
                let mut out = Vec::new();
                if let Some(n) = self.nodes.get_mut(&id) {
                    n.driver.handle_timeout(local, &mut out);
                }
                self.driver_outputs(id, out);
                self.pump(id);
            }
        }
        true
    }

    fn deliver(&mut self, env: Envelope) {
        self.delivered += 1;
        let now = self.now;
        if env.to == NodeId::COORDINATOR {
            if let (Some(c), Header::Mesh(msg)) = (self.coordinator.as_mut(), env.frame.header) {
                c.handle_message(now, env.from, msg);
                self.pump_coordinator();
            }
            return;
        }
        let local = self.local(env.to, now);
        let Some(n) = self.nodes.get_mut(&env.to) else { return };
        let Some(member) = n.member.as_mut() else { return };
        match env.frame.header {
            Header::Mesh(msg) => member.handle_message(local, env.from, msg),
            Header::State(_) | Header::StateAsk(_) => {}
            Header::Collective(_) => {
                if n.hung {
                    return;
                }
                let mut out = Vec::new();
                n.driver.on_frame(local, env.from, env.frame, &mut out);
                self.driver_outputs(env.to, out);
            }
        }
        self.pump(env.to);
    }

    fn pump_coordinator(&mut self) {
        let mut out = Vec::new();
        if let Some(c) = self.coordinator.as_mut() {
            while let Some(a) = c.poll_action() {
                out.push(a);
            }
        }
        for a in out {
            if let CoordinatorAction::Send { to, msg } = &a {
                self.enqueue(NodeId::COORDINATOR, *to, padded_frame(msg.clone(), 0, true));
                if !self.trace_sends {
                    continue;
                }
            }
            let what = TraceKind::Coordinator(a);
            self.trace.push(Traced { at: self.now, node: NodeId::COORDINATOR, what });
        }
    }

    fn driver_outputs(&mut self, id: NodeId, out: Vec<DriverOutput>) {
        for o in out {
            match o {
                DriverOutput::Send { to, frame } => self.enqueue(id, to, frame),
                DriverOutput::Command(c) => {
                    let local = self.local(id, self.now);
                    let Some(m) = self.nodes.get_mut(&id).and_then(|n| n.member.as_mut()) else {
                        continue;
                    };
                    let r = m.handle_command(local, c);
                    let what = TraceKind::Command(c, r);
                    self.trace.push(Traced { at: self.now, node: id, what });
                }
            }
        }
    }

    /// Drains a node's member, feeding its actions to the network and its driver, until both
    /// are quiet.
    fn pump(&mut self, id: NodeId) {
        loop {
            let mut actions = Vec::new();
            if let Some(m) = self.nodes.get_mut(&id).and_then(|n| n.member.as_mut()) {
                while let Some(a) = m.poll_action() {
                    actions.push(a);
                }
            }
            if actions.is_empty() {
                return;
            }
            for a in actions {
                if let MemberAction::Send { to, msg, padding } = &a {
                    self.enqueue(id, *to, padded_frame(msg.clone(), *padding, true));
                    if !self.trace_sends {
                        continue;
                    }
                }
                self.trace.push(Traced {
                    at: self.now,
                    node: id,
                    what: TraceKind::Member(a.clone()),
                });
                if matches!(a, MemberAction::Send { .. }) {
                    continue;
                }
                let local = self.local(id, self.now);
                let mut out = Vec::new();
                if let Some(n) = self.nodes.get_mut(&id)
                    && !n.hung
                {
                    n.driver.on_action(local, id, &a, &mut out);
                }
                self.driver_outputs(id, out);
            }
        }
    }

    /// Puts `frame` on the wire from `from` to `to` now, as if `from` had sent it (to replay,
    /// duplicate or forge traffic).
    pub fn inject(&mut self, from: NodeId, to: NodeId, frame: Frame) {
        self.fault(from, format!("inject a frame to {to}"));
        self.enqueue(from, to, frame);
    }

    /// Runs every event up to and including `t`, then sets the clock to `t`.
    pub fn run_until(&mut self, t: Time) -> Result<(), Livelock> {
        run_until(self, t)
    }

    /// Runs for `d` of virtual time.
    pub fn run_for(&mut self, d: Duration) -> Result<(), Livelock> {
        self.run_until(self.now + d)
    }

    /// Runs until `pred` holds (checked after every event) or `deadline`; returns whether it held.
    pub fn run_until_cond(
        &mut self,
        deadline: Time,
        pred: impl FnMut(&Self) -> bool,
    ) -> Result<bool, Livelock> {
        run_until_cond(self, deadline, pred)
    }
}

impl Network<Workload> {
    /// A network of `n` nodes (ids 0..n) running `workload`, formed into the first epoch:
    /// `min_members` is set to `n` and the join window to 0.
    pub fn formed(mut cfg: MeshConfig, n: u32, workload: &Workload, seed: u64) -> Self {
        cfg.min_members = n as usize;
        cfg.join_window = Duration::ZERO;
        let mut net = Network::new(cfg, seed);
        for i in 0..n {
            net.add_node(NodeId(i), workload.clone());
        }
        net
    }
}

impl<D: Driver> Stepped for Network<D> {
    fn clock(&mut self) -> &mut Time {
        &mut self.now
    }
    fn next_at(&self) -> Option<Time> {
        self.next_event()
    }
    fn handle_next(&mut self) {
        self.step();
    }
    fn step_limit(&self) -> u64 {
        self.max_steps
    }
}

#[cfg(test)]
mod tests;
