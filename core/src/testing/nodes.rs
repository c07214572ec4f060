//! An in-memory network of whole node machines ([`Node`]) and a [`Coordinator`] on a virtual
//! clock: the executor of [`Node`] for tests, as [`Network`](super::Network) is of bare members.
//!
//! Each host runs its node's effects at once: inner steps take a fixed `compute` time and move
//! the weights halfway to a node-specific target (real numerics: every byte of the rings, the
//! outer step and the state transfer is real), jobs complete on the spot, and a stopped node
//! is restarted by its [`Process`] (a new incarnation after a heartbeat interval), as in every
//! executor. Collective and state frames are serialised per directed link at its bandwidth and
//! arrive after a latency, in order per link (membership frames take the latency only); the only randomness (loss) comes from a seeded stream. Each
//! [`NodeNet::step`] jumps to the earliest event (a delivery, a timer, a compute's end, a
//! restart) and handles that one; runs are bounded ([`Livelock`]).

use super::Livelock;
use crate::codec::CodecKind;
use crate::digest::WeightsDigest;
use crate::diloco::{Mode, OuterConfig, Schedule};
use crate::ids::NodeId;
use crate::mesh::{Coordinator, CoordinatorAction, LeaveReason, MeshConfig, MeshEvent};
use crate::metrics::OuterStepRow;
use crate::node::acct::RowIdentity;
use crate::node::machine::{Check, Effect, Node, NodeConfig, NodeEvent, Numerics, StatePieces};
use crate::node::process::{Output, Process};
use crate::time::Time;
use crate::transport::{Frame, Header};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// One thing that happened, for assertions and script output.
#[derive(Clone, Debug, PartialEq)]
pub enum Seen {
    /// A coordinator's event.
    Mesh(MeshEvent),
    /// A node's event.
    Node(NodeEvent),
    /// A node's member stopped (`rejoin`: its host restarts it).
    Stop {
        /// The reason, in words.
        reason: String,
        /// Whether it joins again.
        rejoin: bool,
    },
    /// An invariant check failed at a node.
    Violation(String),
    /// The harness injected a fault.
    Fault(String),
}

/// One entry of the record.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    /// Virtual time.
    pub at: Time,
    /// The node (the coordinator for its events).
    pub node: NodeId,
    /// What.
    pub what: Seen,
}

struct Host {
    process: Option<Process>,
    incarnation: u64,
    params: Vec<f32>,
    target: Vec<f32>,
    /// The inner steps under way: (end, step).
    computing: Option<(Time, u64)>,
    /// Compute time left when it hung.
    paused_left: Option<Duration>,
    hung: bool,
    /// An outer step whose inner weights come out NaN (a diverged inner loop).
    diverge_at: Option<u64>,
    /// Outer steps whose pseudo-gradient comes out multiplied by a factor.
    scale_at: BTreeMap<u64, f32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Due {
    Deliver,
    Coordinator,
    Node(NodeId),
    Compute(NodeId),
}

/// The in-memory network of node machines. See the module documentation.
pub struct NodeNet {
    now: Time,
    mesh: MeshConfig,
    params: usize,
    compute: Duration,
    coordinator: Option<Coordinator>,
    hosts: BTreeMap<NodeId, Host>,
    inflight: BTreeMap<(Time, u64), (NodeId, NodeId, Frame)>,
    seq: u64,
    latency: Duration,
    default_bandwidth: f64,
    bandwidth: BTreeMap<(NodeId, NodeId), f64>,
    busy: BTreeMap<(NodeId, NodeId), Time>,
    cut: BTreeSet<(NodeId, NodeId)>,
    drop_rate: f64,
    /// What befalls the next state pieces (real bytes) sent: lost, or one byte changed.
    piece_faults: std::collections::VecDeque<PieceFault>,
    rng: ChaCha8Rng,
    record: Vec<Record>,
    rows: Vec<OuterStepRow>,
    hashes: BTreeMap<u64, BTreeMap<NodeId, WeightsDigest>>,
    checkpoint_every: Option<u64>,
    /// The DiLoCo mode, fragments and mix of every node started from now on.
    mode: (Mode, u32, f32),
    snapshots: Vec<(NodeId, u64, Option<WeightsDigest>)>,
    max_steps: u64,
    /// The coordinator runs nothing before this time ([`NodeNet::pause_coordinator`]).
    coordinator_paused_until: Time,
    /// Frames to and from the coordinator are lost before this time
    /// ([`NodeNet::isolate_coordinator`]).
    coordinator_isolated_until: Time,
    /// Nodes whose collective frames are also delivered to every other node
    /// ([`NodeNet::spray_collectives`]).
    sprayers: BTreeSet<NodeId>,
    /// Nodes that report every all-reduce attempt failed ([`NodeNet::fail_every_attempt`]).
    liars: BTreeSet<NodeId>,
    /// Nodes whose ring frames carry a NaN ([`NodeNet::poison_values`]).
    poisoners: BTreeSet<NodeId>,
    /// Nodes whose ring frames are lost, and that report nothing
    /// ([`NodeNet::withhold_ring_frames`]).
    withholders: BTreeSet<NodeId>,
    /// Nodes that send joiners a forged state ([`NodeNet::forge_states`]).
    forgers: BTreeSet<NodeId>,
}

/// A fault of one state piece on its way ([`NodeNet::fault_next_piece`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PieceFault {
    /// Lost (as a frame that failed its checksum is dropped with its connection).
    Lost,
    /// One byte of the body changed, the header intact (damage no frame checksum saw).
    Damaged,
}

fn target(id: NodeId, n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i as f32) * 0.01).sin() + id.0 as f32 * 0.25).collect()
}

impl NodeNet {
    /// A network with a coordinator and no nodes: models of `params` parameters whose inner
    /// steps take `compute`; 1 ms latency, 1 GB/s links, no loss; `seed` drives loss only.
    pub fn new(mesh: MeshConfig, params: usize, compute: Duration, seed: u64) -> NodeNet {
        NodeNet {
            now: Time::ZERO,
            coordinator: Some(Coordinator::new(mesh.clone())),
            mesh,
            params,
            compute,
            hosts: BTreeMap::new(),
            inflight: BTreeMap::new(),
            seq: 0,
            latency: Duration::from_millis(1),
            default_bandwidth: 1e9,
            bandwidth: BTreeMap::new(),
            busy: BTreeMap::new(),
            cut: BTreeSet::new(),
            drop_rate: 0.0,
            piece_faults: std::collections::VecDeque::new(),
            rng: ChaCha8Rng::seed_from_u64(seed),
            record: Vec::new(),
            rows: Vec::new(),
            hashes: BTreeMap::new(),
            checkpoint_every: None,
            mode: (Mode::Sync, 1, 0.0),
            snapshots: Vec::new(),
            max_steps: 2_000_000,
            coordinator_paused_until: Time::ZERO,
            coordinator_isolated_until: Time::ZERO,
            sprayers: BTreeSet::new(),
            liars: BTreeSet::new(),
            poisoners: BTreeSet::new(),
            withholders: BTreeSet::new(),
            forgers: BTreeSet::new(),
        }
    }

    /// The virtual time.
    pub fn now(&self) -> Time {
        self.now
    }

    /// The coordinator, unless crashed.
    pub fn coordinator(&self) -> Option<&Coordinator> {
        self.coordinator.as_ref()
    }

    /// A node's machine, unless crashed or unknown.
    pub fn node(&self, id: NodeId) -> Option<&Node> {
        self.hosts.get(&id).and_then(|h| h.process.as_ref().map(Process::node))
    }

    /// Everything recorded so far.
    pub fn record(&self) -> &[Record] {
        &self.record
    }

    /// The rows written so far.
    pub fn rows(&self) -> &[OuterStepRow] {
        &self.rows
    }

    /// The digests of the outer weights after each step, by node.
    pub fn hashes(&self) -> &BTreeMap<u64, BTreeMap<NodeId, WeightsDigest>> {
        &self.hashes
    }

    /// The violations recorded.
    pub fn violations(&self) -> Vec<String> {
        self.record
            .iter()
            .filter_map(|r| match &r.what {
                Seen::Violation(v) => Some(v.clone()),
                _ => None,
            })
            .collect()
    }

    /// Nodes added from now on ask for a checkpoint every `k` outer steps.
    pub fn set_checkpoint_every(&mut self, k: u64) {
        self.checkpoint_every = Some(k);
    }

    /// The checkpoints asked for: node, outer step, and the digest of the snapshot's outer
    /// weights (`None`: the machine sent no snapshot).
    pub fn snapshots(&self) -> &[(NodeId, u64, Option<WeightsDigest>)] {
        &self.snapshots
    }

    /// Bandwidth (bytes per second) of the directed link `from -> to`.
    pub fn set_bandwidth(&mut self, from: NodeId, to: NodeId, bytes_per_sec: f64) {
        self.bandwidth.insert((from, to), bytes_per_sec);
    }

    /// The next state piece with a body of real bytes, on any link, meets `fault` (faults
    /// given in turn strike the pieces that follow, one each).
    pub fn fault_next_piece(&mut self, fault: PieceFault) {
        self.piece_faults.push_back(fault);
        self.note(NodeId::COORDINATOR, Seen::Fault(format!("the next state piece: {fault:?}")));
    }

    /// Probability that a frame is lost.
    pub fn set_drop_rate(&mut self, p: f64) {
        self.drop_rate = p.clamp(0.0, 1.0);
    }

    fn note(&mut self, node: NodeId, what: Seen) {
        self.record.push(Record { at: self.now, node, what });
    }

    fn config(&self, id: NodeId) -> NodeConfig {
        NodeConfig {
            id,
            mesh: self.mesh.clone(),
            shards: 1,
            codec: CodecKind::Fp32,
            segment: None,
            outer: OuterConfig::default(),
            numerics: Numerics::Real { initial: vec![0.5; self.params] },
            inner_steps: 10,
            schedule: Schedule::new(self.mode.0, self.params, &[], self.mode.1, self.mode.2),
            batch_tokens: 100,
            checkpoint_every: self.checkpoint_every,
            // Joiners with 4 GPUs' worth of parallel pieces per sender.
            state_pieces: StatePieces::PerJoinerShard {
                shards: (0..64).map(|n| (NodeId(n), 4)).collect(),
            },
            own_max: 0,
            row: RowIdentity { node: format!("n{}", id.0), node_id: id.0, offset_s: 0.0 },
            virtual_padding: true,
            modelled_collectives: false,
        }
    }

    /// Nodes started from now on run DiLoCo in `mode` (`fragments` in streaming mode) with the
    /// merge's `mix`.
    pub fn set_mode(&mut self, mode: Mode, fragments: u32, mix: f32) {
        self.mode = (mode, fragments, mix);
    }

    /// Starts node `id` (a new incarnation if it ran before), which joins now.
    pub fn add(&mut self, id: NodeId) {
        let incarnation = self.hosts.get(&id).map_or(0, |h| h.incarnation + 1);
        let process = match Process::new(self.config(id), incarnation) {
            Ok(p) => p,
            Err(e) => {
                self.note(id, Seen::Violation(format!("cannot start: {e}")));
                return;
            }
        };
        let host = Host {
            process: Some(process),
            incarnation,
            params: vec![0.5; self.params],
            target: target(id, self.params),
            computing: None,
            paused_left: None,
            hung: false,
            diverge_at: None,
            scale_at: BTreeMap::new(),
        };
        self.hosts.insert(id, host);
        let now = self.now;
        if let Some(p) = self.process_mut(id) {
            let _ = p.start(now);
        }
        self.drain(id);
    }

    /// Node `id`'s pseudo-gradient of `outer_step` comes out `factor` times what its inner loop
    /// made (finite values, far off: a faulty device or a hostile member).
    pub fn scale_update(&mut self, id: NodeId, outer_step: u64, factor: f32) {
        if let Some(h) = self.hosts.get_mut(&id) {
            h.scale_at.insert(outer_step, factor);
        }
    }

    /// Node `id`'s inner loop diverges in `outer_step`: the inner weights it hands over hold NaN
    /// and infinities.
    pub fn diverge(&mut self, id: NodeId, outer_step: u64) {
        if let Some(h) = self.hosts.get_mut(&id) {
            h.diverge_at = Some(outer_step);
        }
    }

    /// SIGKILL: the node vanishes; frames to it are lost.
    pub fn crash(&mut self, id: NodeId) {
        if let Some(h) = self.hosts.get_mut(&id) {
            h.process = None;
            h.computing = None;
        }
        self.note(id, Seen::Fault("crash".into()));
    }

    /// The coordinator's process stops for `d` (SIGSTOP, a paused VM): it handles nothing, and
    /// the frames sent to it wait until it runs again.
    pub fn pause_coordinator(&mut self, d: Duration) {
        self.coordinator_paused_until = self.now + d;
        self.note(NodeId::COORDINATOR, Seen::Fault(format!("paused for {d:?}")));
    }

    /// The coordinator's uplink goes down for `d`: it runs, but frames to and from it are lost.
    pub fn isolate_coordinator(&mut self, d: Duration) {
        self.coordinator_isolated_until = self.now + d;
        self.note(NodeId::COORDINATOR, Seen::Fault(format!("cut off for {d:?}")));
    }

    /// The coordinator vanishes.
    pub fn crash_coordinator(&mut self) {
        self.coordinator = None;
        self.note(NodeId::COORDINATOR, Seen::Fault("crash".into()));
    }

    /// The coordinator's process is replaced by a new one that knows nothing (an operator
    /// restarted it, or a standby took its address): the members find they are not members and
    /// join again, each telling which state it holds.
    pub fn restart_coordinator(&mut self) {
        self.coordinator = Some(Coordinator::new(self.mesh.clone()));
        self.note(NodeId::COORDINATOR, Seen::Fault("restart".into()));
    }

    /// The node leaves with its deathrattle.
    pub fn leave(&mut self, id: NodeId) {
        let now = self.now;
        if let Some(p) = self.process_mut(id) {
            p.leave(now, LeaveReason::Graceful);
        }
        self.note(id, Seen::Fault("leave".into()));
        self.drain(id);
    }

    /// The node's application hangs (its heartbeats go on) or goes on again.
    pub fn hang(&mut self, id: NodeId, hung: bool) {
        let now = self.now;
        if let Some(h) = self.hosts.get_mut(&id) {
            h.hung = hung;
            if let Some(p) = h.process.as_mut() {
                if hung { p.suspend(now) } else { p.resume(now) }
            }
            // A hang pauses the compute: it ends that much later.
            match (hung, h.computing, h.paused_left) {
                (true, Some((end, _)), None) => h.paused_left = Some(end.saturating_since(now)),
                (false, Some((_, step)), Some(left)) => {
                    h.computing = Some((now + left, step));
                    h.paused_left = None;
                }
                _ => {}
            }
        }
        self.note(id, Seen::Fault(if hung { "hang" } else { "resume" }.into()));
        self.drain(id);
    }

    /// Frames between `a` and `b` are lost, both ways.
    pub fn cut(&mut self, a: NodeId, b: NodeId) {
        self.cut.insert((a, b));
        self.cut.insert((b, a));
        self.note(a, Seen::Fault(format!("cut from {b}")));
    }

    /// Frames from `a` to `b` are lost; the other way still works.
    pub fn cut_oneway(&mut self, a: NodeId, b: NodeId) {
        self.cut.insert((a, b));
        self.note(a, Seen::Fault(format!("cut towards {b}")));
    }

    /// Heals every cut.
    pub fn recover(&mut self) {
        self.cut.clear();
    }

    /// A frame from `from` to `to`, sent now as if `from` had sent it (stray and stale frames).
    pub fn send_as(&mut self, from: NodeId, to: NodeId, frame: Frame) {
        self.enqueue(from, to, frame);
    }

    /// From now on every collective frame `id` sends also goes to every other node but its
    /// addressee: a member that sprays its ring frames at nodes that are not its neighbours.
    pub fn spray_collectives(&mut self, id: NodeId) {
        self.sprayers.insert(id);
    }

    /// From now on node `id` reports every all-reduce attempt it is released into failed, at
    /// once, and sends no ring frame (a member that stalls every attempt, while it still beats).
    pub fn fail_every_attempt(&mut self, id: NodeId) {
        self.liars.insert(id);
    }

    /// From now on every ring frame with real bytes that node `id` sends has its first four
    /// bytes set to an f32 NaN (the first value, scale or table entry): a member that sends
    /// values that are not finite, as a diverged or hostile node would.
    pub fn poison_values(&mut self, id: NodeId) {
        self.poisoners.insert(id);
    }

    /// From now on the state node `id` sends joiners is forged: other weights, consistent in
    /// themselves (digests made from them), while its barrier arrivals report what it holds.
    pub fn forge_states(&mut self, id: NodeId) {
        self.forgers.insert(id);
    }

    /// From now on node `id` sends no ring frame and reports nothing of it: a member that beats,
    /// reaches every barrier and stalls every all-reduce it is in, silently.
    pub fn withhold_ring_frames(&mut self, id: NodeId) {
        self.withholders.insert(id);
    }

    fn enqueue(&mut self, from: NodeId, to: NodeId, mut frame: Frame) {
        if let (true, Header::Collective(_), crate::transport::Body::Bytes(b)) =
            (self.poisoners.contains(&from), &frame.header, &frame.body)
            && b.len() >= 4
        {
            let mut v = b.to_vec();
            v[..4].copy_from_slice(&f32::NAN.to_le_bytes());
            frame.body = crate::transport::Body::Bytes(v.into());
        }
        if (self.liars.contains(&from) || self.withholders.contains(&from))
            && matches!(frame.header, Header::Collective(_))
        {
            return;
        }
        if self.sprayers.contains(&from) && matches!(frame.header, Header::Collective(_)) {
            let others: Vec<NodeId> =
                self.hosts.keys().copied().filter(|&n| n != from && n != to).collect();
            for other in others {
                self.enqueue_one(from, other, frame.clone());
            }
        }
        self.enqueue_one(from, to, frame);
    }

    fn enqueue_one(&mut self, from: NodeId, to: NodeId, mut frame: Frame) {
        if self.cut.contains(&(from, to)) {
            return;
        }
        let coordinator = from == NodeId::COORDINATOR || to == NodeId::COORDINATOR;
        if coordinator && self.now < self.coordinator_isolated_until {
            return;
        }
        if let (Header::State(_), crate::transport::Body::Bytes(b)) = (&frame.header, &frame.body)
            && !b.is_empty()
        {
            match self.piece_faults.pop_front() {
                Some(PieceFault::Lost) => return,
                Some(PieceFault::Damaged) => {
                    let mut v = b.to_vec();
                    v[b.len() / 2] ^= 0x40;
                    frame.body = crate::transport::Body::Bytes(v.into());
                }
                None => {}
            }
        }
        if self.drop_rate > 0.0 && self.rng.random::<f64>() < self.drop_rate {
            return;
        }
        if matches!(frame.header, Header::Mesh(_)) {
            // Membership frames (probes included) take the latency only: the links' bandwidth
            // is for the rings and the state.
            self.seq += 1;
            self.inflight.insert((self.now + self.latency, self.seq), (from, to, frame));
            return;
        }
        let bw = self.bandwidth.get(&(from, to)).copied().unwrap_or(self.default_bandwidth);
        let tx = Duration::from_secs_f64(frame.wire_len() as f64 / bw.max(1.0));
        let start = self.busy.get(&(from, to)).copied().unwrap_or(Time::ZERO).max(self.now);
        let done = start + tx;
        self.busy.insert((from, to), done);
        self.seq += 1;
        self.inflight.insert((done + self.latency, self.seq), (from, to, frame));
    }

    fn process_mut(&mut self, id: NodeId) -> Option<&mut Process> {
        self.hosts.get_mut(&id).and_then(|h| h.process.as_mut())
    }

    /// Carries out a process's outputs until it has none.
    fn drain(&mut self, id: NodeId) {
        let now = self.now;
        while let Some(out) = self.process_mut(id).and_then(|p| p.poll(now)) {
            match out {
                Output::Effect(e) => self.effect(id, e),
                Output::Transmit(to, f) => self.enqueue(id, to, f),
                Output::Stopped(s) => {
                    if let Some(h) = self.hosts.get_mut(&id) {
                        h.computing = None;
                    }
                    self.note(id, Seen::Stop { reason: s.reason.to_string(), rejoin: s.rejoin });
                }
                Output::Restarted { .. } => self.note(id, Seen::Fault("restart".into())),
                Output::Exit => {
                    if let Some(h) = self.hosts.get_mut(&id) {
                        h.process = None;
                    }
                }
            }
        }
    }

    fn effect(&mut self, id: NodeId, e: Effect) {
        let now = self.now;
        let compute = self.compute;
        let Some(h) = self.hosts.get_mut(&id) else { return };
        let Some(node) = h.process.as_mut().map(Process::node_mut) else { return };
        match e {
            Effect::Compute { outer_step, .. } => {
                h.computing = Some((now + compute, outer_step));
                h.paused_left = None;
            }
            Effect::SetParams(w) => h.params = w,
            Effect::Outer(job) => {
                let mut job = *job;
                job.run();
                node.outer_done(now, job);
            }
            Effect::PrepareState(mut job) => {
                if self.forgers.contains(&id) {
                    job.forge();
                }
                node.state_prepared(now, job.prepare(None))
            }
            Effect::VerifyState { received, params } => {
                node.state_verified(now, received.verify(params))
            }
            Effect::Checkpoint { outer_step, snapshot } => {
                let digest = snapshot.map(|s| crate::node::digest::weights_digest(&s.outer));
                self.snapshots.push((id, outer_step, digest));
            }
            Effect::Row(r) => self.rows.push(r),
            Effect::Event(ev) => self.note(id, Seen::Node(ev)),
            Effect::Check(Check::WeightsAfter { outer_step, hash }) => {
                self.hashes.entry(outer_step).or_default().insert(id, hash);
            }
            Effect::Check(Check::Violation(v)) => {
                let msg = v.describe(id, &|n| format!("n{}", n.0));
                self.note(id, Seen::Violation(msg));
            }
            // The harness moves every frame (`modelled_collectives` is off).
            Effect::Check(_) | Effect::ModelledAllReduce(_) => {}
            // The process carries out the stop ([`Output::Stopped`]).
            Effect::Stop { .. } => {}
        }
    }

    fn pump_coordinator(&mut self) {
        let mut out = Vec::new();
        if let Some(c) = self.coordinator.as_mut() {
            while let Some(a) = c.poll_action() {
                out.push(a);
            }
        }
        for a in out {
            match a {
                CoordinatorAction::Send { to, msg } => self.enqueue(
                    NodeId::COORDINATOR,
                    to,
                    crate::transport::padded_frame(msg, 0, true),
                ),
                CoordinatorAction::Event(e) => self.note(NodeId::COORDINATOR, Seen::Mesh(e)),
            }
        }
    }

    fn next_due(&self) -> Option<(Time, Due)> {
        let mut best: Option<(Time, Due)> = None;
        let mut consider = |t: Time, d: Due| {
            if best.as_ref().is_none_or(|b| (t, d) < *b) {
                best = Some((t, d));
            }
        };
        if let Some((&(t, _), _)) = self.inflight.first_key_value() {
            consider(t, Due::Deliver);
        }
        if let Some(t) = self.coordinator.as_ref().and_then(Coordinator::poll_timeout) {
            consider(t.max(self.coordinator_paused_until), Due::Coordinator);
        }
        for (&id, h) in &self.hosts {
            if let Some(t) = h.process.as_ref().and_then(Process::poll_timeout) {
                consider(t, Due::Node(id));
            }
            if let (Some((t, _)), false) = (h.computing, h.hung) {
                consider(t, Due::Compute(id));
            }
        }
        best
    }

    /// Handles the next event (jumping the clock to it). False when nothing is left to do.
    pub fn step(&mut self) -> bool {
        let Some((t, due)) = self.next_due() else { return false };
        self.now = self.now.max(t);
        let now = self.now;
        match due {
            Due::Deliver => {
                let Some((_, (from, to, frame))) = self.inflight.pop_first() else { return true };
                if to == NodeId::COORDINATOR && now < self.coordinator_paused_until {
                    // Paused: the frame waits in its socket until the coordinator runs again.
                    self.seq += 1;
                    self.inflight
                        .insert((self.coordinator_paused_until, self.seq), (from, to, frame));
                    return true;
                }
                if to == NodeId::COORDINATOR {
                    if let (Some(c), Header::Mesh(msg)) = (self.coordinator.as_mut(), frame.header)
                    {
                        c.handle_message(now, from, msg);
                        self.pump_coordinator();
                    }
                    return true;
                }
                if let Header::Mesh(crate::mesh::MeshMsg::Release {
                    epoch,
                    outer_step,
                    attempt,
                    ..
                }) = &frame.header
                    && self.liars.contains(&to)
                    && from == NodeId::COORDINATOR
                {
                    let msg = crate::mesh::MeshMsg::Failed {
                        epoch: *epoch,
                        outer_step: *outer_step,
                        attempt: *attempt,
                        accused: None,
                        received: 0,
                    };
                    self.enqueue(to, NodeId::COORDINATOR, Frame::control(msg));
                }
                if let Some(p) = self.process_mut(to) {
                    p.handle_frame(now, from, frame);
                }
                self.drain(to);
            }
            Due::Coordinator => {
                if let Some(c) = self.coordinator.as_mut() {
                    c.handle_timeout(now);
                }
                self.pump_coordinator();
            }
            Due::Node(id) => {
                if let Some(p) = self.process_mut(id) {
                    p.handle_timeout(now);
                }
                self.drain(id);
            }
            Due::Compute(id) => {
                if let Some(h) = self.hosts.get_mut(&id) {
                    let n = h.process.as_mut().map(Process::node_mut);
                    if let (Some((_, step)), Some(n)) = (h.computing.take(), n) {
                        // Halfway to this node's target: a pseudo-gradient that differs per node.
                        let before = h.params.clone();
                        for (w, t) in h.params.iter_mut().zip(&h.target) {
                            *w += 0.5 * (*t - *w);
                        }
                        let loss = h
                            .params
                            .iter()
                            .zip(&h.target)
                            .map(|(w, t)| f64::from((w - t).powi(2)))
                            .sum();
                        let mut inner = h.params.clone();
                        if let Some(&factor) = h.scale_at.get(&step) {
                            for (w, b) in inner.iter_mut().zip(&before) {
                                *w = b + factor * (*w - b);
                            }
                        }
                        if h.diverge_at == Some(step) {
                            for (i, w) in inner.iter_mut().enumerate().step_by(7) {
                                *w = if i % 2 == 0 { f32::NAN } else { f32::INFINITY };
                            }
                        }
                        n.computed(now, step, Some(inner), Some(loss));
                    }
                }
                self.drain(id);
            }
        }
        true
    }

    /// Runs every event up to and including `t`, then sets the clock to `t`.
    pub fn run_until(&mut self, t: Time) -> Result<(), Livelock> {
        super::run_until(self, t)
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
        super::run_until_cond(self, deadline, pred)
    }

    /// Every step's digests, checked: the nodes that report a step agree on its weights.
    /// Returns the steps whose nodes disagree.
    pub fn disagreements(&self) -> Vec<u64> {
        self.hashes
            .iter()
            .filter(|(_, by)| by.values().collect::<BTreeSet<_>>().len() > 1)
            .map(|(s, _)| *s)
            .collect()
    }
}

impl super::Stepped for NodeNet {
    fn clock(&mut self) -> &mut Time {
        &mut self.now
    }
    fn next_at(&self) -> Option<Time> {
        self.next_due().map(|(t, _)| t)
    }
    fn handle_next(&mut self) {
        self.step();
    }
    fn step_limit(&self) -> u64 {
        self.max_steps
    }
}
