//! The event executor: the same hosts as under turmoil (core's node machine in
//! [`crate::node::Node`], the coordinator in [`crate::coord::CoordHost`]), the same fluid
//! bandwidth model and the same churn, driven from one event to the next instead of polled at
//! every tick. Its cost grows with the number of events, not with hosts x simulated time.
//!
//! The agenda holds, in time order (ties in the order they were scheduled):
//!
//! - a frame's arrival at its receiver, a latency after its body's flow ended in the bandwidth
//!   model (control messages skip the model, as under turmoil);
//! - the news that a peer cannot be reached, for a sender whose peer is down or cut off, or
//!   whose flow was cancelled by the peer's crash;
//! - each host's next deadline (its process's timers: the machine's, a new membership's start,
//!   the process's exit; the end of its work);
//! - the bandwidth model's next change (a flow's end, a hold's end).
//!
//! What it keeps of turmoil's network: a message's latency is drawn as turmoil draws it (the
//! link's minimum plus an exponential share of its range, rate 5, in whole milliseconds, capped
//! at the maximum), from the run's seed; the messages of one connection arrive in order; a
//! message in flight across a cut or to a host that died is lost. Hosts see the same inputs in
//! the same order as under turmoil, but at exact times rather than at tick boundaries.

use crate::SimError;
use crate::bandwidth::{FlowId, LaneKey, LaneTcp};
use crate::clock::EventTime;
use crate::coord::CoordHost;
use crate::ctx::RunCtx;
use crate::exec::Exec;
use crate::net::Lane;
use crate::node::{Event, Node, Port};
use crate::ring_model::{RingLinks, RingPlan, draw_latency, finish_times};
use loco_core::node::machine::ModelledAllReduce;
use loco_core::rng::{Purpose, mix64, stream};
use loco_core::transport::{Frame, TransportError};
use loco_core::{Epoch, NodeId, Time};
use rand_chacha::ChaCha8Rng;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

/// Events handled before the executor hands control back to the replay loop (for its progress
/// bar), whatever happens.
const EVENTS_PER_STEP: u64 = 4096;

/// Something that happens at a time.
enum Ev {
    /// A frame arrives at `to` (sent to its process of life `life`).
    Deliver { from: NodeId, to: NodeId, life: u64, frame: Frame },
    /// Sender `to` (of life `life`) learns that `peer` cannot be reached.
    Unreachable { to: NodeId, peer: NodeId, life: u64 },
    /// Host `host`'s deadline, armed as `version`.
    Wake { host: NodeId, version: u64 },
    /// The bandwidth model's next change, armed as `version`.
    Flows { version: u64 },
    /// Member `to` (of life `life`) is done with the modelled all-reduce `key`, as scheduled in
    /// its `version`.
    Modelled { to: NodeId, life: u64, key: (Epoch, u64), version: u64 },
}

/// A ring all-reduce the executor models whole (`[sim] collectives = "modelled"`, see
/// [`crate::ring_model`]): scheduled when its last member has started it.
struct Modelled {
    ring: Vec<NodeId>,
    shards: Vec<(usize, usize)>,
    /// When each member started it.
    starts: BTreeMap<NodeId, Time>,
    /// The links the schedule ran on, from the start and from each change since.
    links: Vec<RingLinks>,
    /// When each rank is done (empty until scheduled), and whether it has been told.
    finish: Vec<Time>,
    told: Vec<bool>,
    /// Ranks not told yet.
    untold: usize,
    /// Bumped at each schedule: the done events of an older one are dropped.
    version: u64,
    /// TCP's state on the ring's lanes when it was first scheduled (each schedule starts from
    /// it and leaves the connections as its frames would).
    tcp: Option<LaneTcp>,
    /// A member died or a ring edge was cut at this time: no rank is done after it (the frames
    /// stop there; the coordinator aborts the attempt).
    broken_at: Option<Time>,
}

/// The network and the agenda, shared by the executor and every endpoint.
/// A map keyed by node pairs that is only looked up, never iterated, so its order cannot reach
/// the output; hashed with fixed keys (the same on every run).
type PairMap<V> = std::collections::HashMap<
    (NodeId, NodeId),
    V,
    std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher>,
>;

struct Core {
    now: Time,
    agenda: BTreeMap<(Time, u64), Ev>,
    seq: u64,
    run: Rc<RunCtx>,
    /// One-way latency range per unordered pair (looked up, never iterated: a hash map, for a
    /// thousand nodes have half a million pairs).
    latency: PairMap<(Duration, Duration)>,
    rng: ChaCha8Rng,
    /// The last arrival scheduled on each directed connection: later messages arrive no sooner
    /// (looked up, never iterated).
    last_arrival: PairMap<Time>,
    /// Frames whose bodies are flowing in the bandwidth model: sender, receiver, frame.
    flows: BTreeMap<FlowId, (NodeId, NodeId, Frame)>,
    /// Each host's process count: frames and news for an earlier process are dropped.
    life: BTreeMap<NodeId, u64>,
    flows_version: u64,
    flows_armed: Option<Time>,
    /// The modelled all-reduces under way, by (epoch, op).
    collectives: BTreeMap<(Epoch, u64), Modelled>,
}

fn unordered(a: NodeId, b: NodeId) -> (NodeId, NodeId) {
    if a <= b { (a, b) } else { (b, a) }
}

impl Core {
    fn push(&mut self, at: Time, ev: Ev) {
        self.seq += 1;
        self.agenda.insert((at.max(self.now), self.seq), ev);
    }

    fn life(&self, id: NodeId) -> u64 {
        self.life.get(&id).copied().unwrap_or(0)
    }

    /// A message's one-way latency from `a` to `b`, drawn as turmoil draws it.
    fn latency(&mut self, a: NodeId, b: NodeId) -> Duration {
        let Some(&(min, max)) = self.latency.get(&unordered(a, b)) else {
            return Duration::ZERO;
        };
        draw_latency(&mut self.rng, min, max)
    }

    /// Member `me` started the modelled all-reduce `m`: the news that its successor cannot be
    /// reached comes at once (as at its first send, which breaks the ring); once every member
    /// has started it, the schedule says when each is done.
    fn model(&mut self, me: NodeId, m: ModelledAllReduce) {
        let now = self.now;
        let key = (m.start.epoch, m.start.op);
        // A member that starts a later attempt has left the earlier ones that never started.
        self.collectives.retain(|k, x| !(*k < key && x.finish.is_empty() && x.ring.contains(&me)));
        let ring = m.start.ring;
        let Some(rank) = ring.iter().position(|n| *n == me) else { return };
        let right = ring[(rank + 1) % ring.len()];
        let x = self.collectives.entry(key).or_insert_with(|| Modelled {
            ring: ring.clone(),
            shards: m.shards,
            starts: BTreeMap::new(),
            links: Vec::new(),
            finish: Vec::new(),
            told: Vec::new(),
            untold: 0,
            version: 0,
            tcp: None,
            broken_at: None,
        });
        x.starts.insert(me, now);
        let cut = self.run.net.unreachable(me, right);
        if cut {
            x.broken_at.get_or_insert(now);
        }
        let complete =
            x.starts.len() == x.ring.len() && x.broken_at.is_none() && x.finish.is_empty();
        if cut {
            let life = self.life(me);
            self.push(now, Ev::Unreachable { to: me, peer: right, life });
        }
        if complete {
            let links = self.ring_links(key, Time::ZERO);
            let tcp = self.run.net.bandwidth.borrow().lane_tcp(&self.ring_lanes(key));
            if let Some(x) = self.collectives.get_mut(&key) {
                x.links.push(links);
                x.tcp = tcp;
            }
            self.schedule(key);
        }
    }

    /// The network as the ring of `key` sees it now: the fair rates of its flows, the
    /// latencies of its edges.
    fn ring_links(&self, key: (Epoch, u64), from: Time) -> RingLinks {
        let Some(x) = self.collectives.get(&key) else {
            return RingLinks { from, rates: Vec::new(), latency: Vec::new() };
        };
        let lanes = self.ring_lanes(key);
        let flows: Vec<(NodeId, NodeId)> = lanes.iter().map(|&(a, b, _)| (a, b)).collect();
        let rates = self.run.net.bandwidth.borrow().fair_rates(&flows);
        // Each rank's edge: its first lane's pair (its shards share the pair).
        let g = x.shards.len().max(1);
        let latency = flows
            .iter()
            .step_by(g)
            .map(|&(a, b)| self.latency.get(&unordered(a, b)).copied().unwrap_or_default())
            .collect();
        RingLinks { from, rates, latency }
    }

    /// The lanes of the ring of `key`, by rank and shard: its collective frames' connections.
    fn ring_lanes(&self, key: (Epoch, u64)) -> Vec<LaneKey> {
        let Some(x) = self.collectives.get(&key) else { return Vec::new() };
        let w = x.ring.len();
        let g = x.shards.len().max(1);
        (0..w * g)
            .map(|i| {
                let (r, s) = (i / g, i % g);
                let shard = u16::try_from(s).unwrap_or(u16::MAX);
                (x.ring[r], x.ring[(r + 1) % w], Lane::Bulk(shard).key())
            })
            .collect()
    }

    /// (Re)computes when each rank of `key` is done, and arms the news for those not told yet.
    fn schedule(&mut self, key: (Epoch, u64)) {
        let Some(x) = self.collectives.get(&key) else { return };
        let starts: Vec<Time> =
            x.ring.iter().map(|n| x.starts.get(n).copied().unwrap_or(self.now)).collect();
        let codec = self.run.scenario.diloco().codec;
        let sim = self.run.scenario.sim();
        let work = |phase, step, values| sim.frame_work(codec, phase, step, values);
        let plan = RingPlan { shards: &x.shards, codec, starts: &starts };
        let subject = mix64(key.0.0) ^ key.1.rotate_left(32);
        let mut rng = stream(self.run.seed, subject, Purpose::RingModel);
        let mut tcp = x.tcp.clone();
        let finish = finish_times(&plan, &x.links, &work, tcp.as_mut(), &mut rng);
        if let Some(t) = &tcp {
            let lanes = self.ring_lanes(key);
            self.run.net.bandwidth.borrow_mut().set_lane_conns(&lanes, &t.conns);
        }
        let Some(x) = self.collectives.get_mut(&key) else { return };
        x.version += 1;
        x.told.resize(finish.len(), false);
        x.untold = x.told.iter().filter(|t| !**t).count();
        x.finish = finish;
        let version = x.version;
        let due: Vec<(Time, NodeId)> =
            (0..x.ring.len()).filter(|&r| !x.told[r]).map(|r| (x.finish[r], x.ring[r])).collect();
        for (at, to) in due {
            let life = self.life(to);
            self.push(at, Ev::Modelled { to, life, key, version });
        }
    }

    /// The links changed: the modelled all-reduces under way go on at the new figures from now.
    fn relink(&mut self) {
        let keys: Vec<(Epoch, u64)> = self
            .collectives
            .iter()
            .filter(|(_, x)| !x.finish.is_empty() && x.broken_at.is_none())
            .map(|(k, _)| *k)
            .collect();
        for key in keys {
            let links = self.ring_links(key, self.now);
            let Some(x) = self.collectives.get_mut(&key) else { continue };
            if x.links.last().is_some_and(|l| l.rates == links.rates && l.latency == links.latency)
            {
                continue;
            }
            x.links.push(links);
            self.schedule(key);
        }
    }

    /// The frames from `a` to `b` stop now (`b` died, or a cut): a modelled all-reduce with that
    /// edge breaks, and `a` learns that `b` cannot be reached. With `b` only (`a` `None`): every
    /// edge into `b`.
    fn break_edge(&mut self, a: Option<NodeId>, b: NodeId) {
        let now = self.now;
        let mut news = Vec::new();
        for x in self.collectives.values_mut() {
            let w = x.ring.len();
            let Some(rb) = x.ring.iter().position(|n| *n == b) else { continue };
            let pred = x.ring[(rb + w - 1) % w];
            if a.is_some_and(|a| a != pred) || x.broken_at.is_some() {
                continue;
            }
            let rp = (rb + w - 1) % w;
            let done = x.finish.get(rp).is_some_and(|t| *t <= now);
            x.broken_at = Some(now);
            if x.starts.contains_key(&pred) && !done {
                news.push(pred);
            }
        }
        for p in news {
            let life = self.life(p);
            self.push(now, Ev::Unreachable { to: p, peer: b, life });
        }
    }

    /// Puts a frame on the wire from `from` to `to` at `at` (its body has been sent): it
    /// arrives a latency later, after the connection's earlier messages; a sender whose peer
    /// cannot be reached learns it at once instead.
    fn wire(&mut self, at: Time, from: NodeId, to: NodeId, frame: Frame) {
        if self.run.net.unreachable(from, to) {
            let life = self.life(from);
            self.push(at, Ev::Unreachable { to: from, peer: to, life });
            return;
        }
        let mut arrive = at + self.latency(from, to);
        if let Some(&last) = self.last_arrival.get(&(from, to)) {
            arrive = arrive.max(last);
        }
        self.last_arrival.insert((from, to), arrive);
        let life = self.life(to);
        self.push(arrive, Ev::Deliver { from, to, life, frame });
    }
}

/// One host's side of the event network (a [`Port`]).
pub(crate) struct Endpoint {
    me: NodeId,
    core: Rc<RefCell<Core>>,
}

impl crate::node::Wire for Endpoint {
    fn model(&mut self, m: ModelledAllReduce) {
        self.core.borrow_mut().model(self.me, m);
    }

    /// Its body flows in the bandwidth model (no bandwidth before `ready`), then it goes on the
    /// wire; a control message goes at once.
    fn enqueue_ready(&mut self, to: NodeId, frame: Frame, ready: Time) {
        let mut c = self.core.borrow_mut();
        let now = c.now;
        if to == self.me {
            let life = c.life(to);
            c.push(now, Ev::Deliver { from: to, to, life, frame });
            return;
        }
        let lane = Lane::of(&frame);
        if lane == Lane::Control {
            c.wire(now, self.me, to, frame);
            return;
        }
        let id = c.run.net.bandwidth.borrow_mut().start_in_lane_ready(
            now,
            (self.me, to, lane.key()),
            frame.wire_len(),
            ready,
        );
        c.flows.insert(id, (self.me, to, frame));
    }
}

/// Where a host stands.
enum State {
    /// A node's process: it takes inputs (between memberships its process holds them).
    Member(Box<Node>),
    /// The coordinator.
    Coord(Box<CoordHost>),
    /// Not running (exited or crashed).
    Down,
}

struct Slot {
    state: State,
    /// The deadline armed in the agenda, and its version.
    armed: Time,
    version: u64,
}

/// The event executor. See the module documentation.
pub(crate) struct EventExec {
    run: Rc<RunCtx>,
    core: Rc<RefCell<Core>>,
    hosts: BTreeMap<NodeId, Slot>,
    clock: EventTime,
    events: u64,
    /// A host that could not start (the replay fails with it).
    failed: Option<String>,
    /// A process exited while handling the last event.
    exited: bool,
    /// The coordinator's inputs while it is paused, in order (`None`: it runs).
    held: Option<Vec<Event>>,
}

impl EventExec {
    /// An executor with no host yet, at time zero.
    pub(crate) fn new(run: Rc<RunCtx>) -> EventExec {
        let rng = stream(run.seed, 0, Purpose::Turmoil);
        let core = Core {
            now: Time::ZERO,
            agenda: BTreeMap::new(),
            seq: 0,
            run: run.clone(),
            latency: PairMap::default(),
            rng,
            last_arrival: PairMap::default(),
            flows: BTreeMap::new(),
            life: BTreeMap::new(),
            flows_version: 0,
            flows_armed: None,
            collectives: BTreeMap::new(),
        };
        EventExec {
            run,
            core: Rc::new(RefCell::new(core)),
            hosts: BTreeMap::new(),
            clock: EventTime::start(),
            events: 0,
            failed: None,
            exited: false,
            held: None,
        }
    }

    fn port(&self, me: NodeId) -> Port {
        Port::Events(Box::new(Endpoint { me, core: self.core.clone() }))
    }

    /// Carries out what host `id` has to do after an input, and arms its next deadline.
    fn settle(&mut self, id: NodeId) {
        let Some(slot) = self.hosts.get_mut(&id) else { return };
        let mut wake = Time::MAX;
        let mut exited = false;
        match &mut slot.state {
            State::Member(node) => {
                exited = node.drain();
                if !exited {
                    wake = node.next_wake();
                }
            }
            State::Coord(c) => {
                c.drain();
                wake = c.next_wake();
            }
            State::Down => {}
        }
        if exited {
            // The process ended: it takes nothing more.
            slot.state = State::Down;
            self.core.borrow_mut().break_edge(None, id);
            self.run.net.set_down(id, true);
            self.exited = true;
        }
        if wake != slot.armed {
            slot.armed = wake;
            slot.version += 1;
            if wake != Time::MAX {
                let version = slot.version;
                self.core.borrow_mut().push(wake, Ev::Wake { host: id, version });
            }
        }
    }

    /// Hands an input to host `id`, or queues it while the node is between memberships.
    fn input(&mut self, id: NodeId, ev: Event) {
        if id == NodeId::COORDINATOR
            && let Some(held) = &mut self.held
        {
            held.push(ev);
            return;
        }
        let Some(slot) = self.hosts.get_mut(&id) else { return };
        match &mut slot.state {
            State::Member(node) => node.input(ev),
            State::Coord(c) => match ev {
                Event::Net(Ok((from, frame))) => c.frame(from, frame),
                Event::Timer => c.timeout(),
                Event::Net(Err(_)) | Event::Control | Event::Modelled { .. } => {}
            },
            State::Down => return,
        }
        self.settle(id);
    }

    /// Sends the frames whose flows ended, and arms the bandwidth model's next change.
    fn pump(&mut self) {
        let mut c = self.core.borrow_mut();
        let now = c.now;
        let finished = {
            let mut bw = c.run.net.bandwidth.borrow_mut();
            bw.advance(now);
            bw.take_finished()
        };
        for (id, at) in finished {
            if let Some((from, to, frame)) = c.flows.remove(&id) {
                c.wire(at, from, to, frame);
            }
        }
        let next = c.run.net.bandwidth.borrow_mut().next_change();
        if next != c.flows_armed {
            c.flows_armed = next;
            c.flows_version += 1;
            if let Some(t) = next {
                let version = c.flows_version;
                c.push(t, Ev::Flows { version });
            }
        }
    }

    fn handle(&mut self, ev: Ev) {
        let life = |s: &Self, id: NodeId| s.core.borrow().life(id);
        match ev {
            Ev::Deliver { from, to, life: l, frame } => {
                if l == life(self, to) && !self.run.net.is_cut(from, to) {
                    self.input(to, Event::Net(Ok((from, frame))));
                }
            }
            Ev::Unreachable { to, peer, life: l } => {
                if l == life(self, to) {
                    self.input(to, Event::Net(Err(TransportError::Unreachable(peer))));
                }
            }
            Ev::Wake { host, version } => {
                if self.hosts.get(&host).is_some_and(|s| s.version == version) {
                    if let Some(s) = self.hosts.get_mut(&host) {
                        s.armed = Time::MAX;
                    }
                    self.input(host, Event::Timer);
                }
            }
            Ev::Flows { version } => {
                if self.core.borrow().flows_version == version {
                    self.core.borrow_mut().flows_armed = None;
                }
            }
            Ev::Modelled { to, life: l, key, version } => {
                let now = self.now();
                let due = {
                    let mut c = self.core.borrow_mut();
                    // The news of this schedule's version is this rank's last word, given or
                    // not (a break before it drops it): the attempt is forgotten once every
                    // rank has had it.
                    let current = c.collectives.get_mut(&key).and_then(|x| {
                        let r = x.ring.iter().position(|n| *n == to)?;
                        if x.version != version {
                            return Some((false, false));
                        }
                        if !x.told[r] {
                            x.told[r] = true;
                            x.untold = x.untold.saturating_sub(1);
                        }
                        Some((x.broken_at.is_none_or(|t| now <= t), x.untold == 0))
                    });
                    if let Some((_, true)) = current {
                        c.collectives.remove(&key);
                    }
                    current.is_some_and(|(ok, _)| ok)
                };
                if due && l == life(self, to) {
                    self.input(to, Event::Modelled { epoch: key.0, op: key.1 });
                }
            }
        }
    }

    /// Forgets host `id`'s process: its deadlines, its frames in flight, the flows to it (whose
    /// senders learn that it cannot be reached).
    fn kill(&mut self, id: NodeId) {
        let mut c = self.core.borrow_mut();
        *c.life.entry(id).or_insert(0) += 1;
        c.break_edge(None, id);
        let gone: Vec<FlowId> =
            c.flows.iter().filter(|(_, f)| f.0 == id || f.1 == id).map(|(k, _)| *k).collect();
        let now = c.now;
        for k in gone {
            if let Some((from, to, _)) = c.flows.remove(&k)
                && to == id
                && from != id
            {
                let life = c.life(from);
                c.push(now, Ev::Unreachable { to: from, peer: id, life });
            }
        }
        drop(c);
        if let Some(s) = self.hosts.get_mut(&id) {
            s.state = State::Down;
            s.version += 1;
            s.armed = Time::MAX;
        }
    }
}

impl Exec for EventExec {
    fn now(&self) -> Time {
        self.core.borrow().now
    }

    fn start(&mut self, id: NodeId) {
        self.kill(id);
        let state = if id == NodeId::COORDINATOR {
            State::Coord(Box::new(CoordHost::new(self.run.clone(), self.port(id))))
        } else {
            match Node::with_port(self.run.clone(), id, self.port(id)) {
                Ok(mut node) => {
                    node.begin();
                    State::Member(Box::new(node))
                }
                Err(e) => {
                    self.failed = Some(format!("{id}: {e}"));
                    State::Down
                }
            }
        };
        let slot = self.hosts.entry(id).or_insert(Slot {
            state: State::Down,
            armed: Time::MAX,
            version: 0,
        });
        slot.state = state;
        self.settle(id);
    }

    fn crash(&mut self, id: NodeId) {
        self.kill(id);
    }

    fn bounce(&mut self, id: NodeId) {
        self.start(id);
    }

    fn notify(&mut self, id: NodeId) {
        if self.hosts.get(&id).is_some_and(|s| matches!(s.state, State::Member(_))) {
            self.input(id, Event::Control);
        }
    }

    fn pause_coordinator(&mut self, paused: bool) {
        if paused {
            self.held.get_or_insert_with(Vec::new);
            return;
        }
        // It runs again: what arrived meanwhile is read in order, then its deadlines, all late.
        for ev in self.held.take().unwrap_or_default() {
            if !matches!(ev, Event::Timer) {
                self.input(NodeId::COORDINATOR, ev);
            }
        }
        self.input(NodeId::COORDINATOR, Event::Timer);
    }

    fn partition_oneway(&mut self, a: NodeId, b: NodeId) {
        // The shared network's cut is what the wire checks; a modelled ring over it breaks.
        self.core.borrow_mut().break_edge(Some(a), b);
    }

    fn links_changed(&mut self) {
        self.core.borrow_mut().relink();
    }

    fn repair_oneway(&mut self, _a: NodeId, _b: NodeId) {}

    fn set_latency(&mut self, a: NodeId, b: NodeId, min: Duration, max: Duration) {
        self.core.borrow_mut().latency.insert(unordered(a, b), (min, max));
    }

    fn is_running(&mut self, id: NodeId) -> bool {
        self.hosts.get(&id).is_some_and(|s| !matches!(s.state, State::Down))
    }

    fn step(&mut self, horizon: Time) -> Result<(), SimError> {
        let progress = |run: &RunCtx| {
            let r = run.rec.borrow();
            (r.steps_done(), r.rows.len())
        };
        let before = progress(&self.run);
        let mut handled = 0u64;
        loop {
            if let Some(e) = self.failed.take() {
                return Err(SimError::Host(e));
            }
            self.pump();
            let next = self.core.borrow().agenda.first_key_value().map(|(k, _)| k.0);
            let now = self.now();
            match next {
                Some(t) if t <= horizon.max(now) => {
                    let Some(((t, _), ev)) = self.core.borrow_mut().agenda.pop_first() else {
                        return Ok(());
                    };
                    self.core.borrow_mut().now = t;
                    self.clock.set(t);
                    let host = match &ev {
                        Ev::Deliver { to, .. } | Ev::Unreachable { to, .. } => Some(*to),
                        Ev::Wake { host, .. } => Some(*host),
                        Ev::Modelled { to, .. } => Some(*to),
                        Ev::Flows { .. } => None,
                    };
                    self.exited = false;
                    self.handle(ev);
                    let down = self.exited;
                    self.events += 1;
                    handled += 1;
                    // Back to the replay loop when it has something to look at: an outer step
                    // done or a row written, an armed crash that struck, a process that exited.
                    let struck = host.is_some_and(|h| {
                        h != NodeId::COORDINATOR
                            && (h.0 as usize) < self.run.nodes.len()
                            && self.run.node(h).struck.get()
                    });
                    if struck
                        || down
                        || handled >= EVENTS_PER_STEP
                        || self.run.mesh_stopped.borrow().is_some()
                        || progress(&self.run) != before
                    {
                        self.pump();
                        return Ok(());
                    }
                }
                _ => {
                    let t = horizon.max(now);
                    if t != Time::MAX {
                        self.core.borrow_mut().now = t;
                        self.clock.set(t);
                    }
                    return Ok(());
                }
            }
        }
    }

    fn figures(&self) -> Vec<(&'static str, serde_json::Value)> {
        let collectives = if self.run.modelled_collectives { "modelled" } else { "frames" };
        vec![
            ("executor", serde_json::json!(loco_core::scenario::ExecutorKind::Events)),
            ("events", serde_json::json!(self.events)),
            ("collectives", serde_json::json!(collectives)),
        ]
    }
}
