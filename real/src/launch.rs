//! The process launcher behind `loco launch`: a coordinator and a worker per node on this
//! machine, the scenario's churn played with signals and new processes, the run's record merged
//! from the processes' metrics files.
//!
//! The launcher learns that a worker is up, how far the run is, and that a worker is gone from
//! the workers themselves, pushed over a status channel ([`status`]): each worker process it
//! starts says `ready` once its model is loaded, forwards its metrics lines, and says `stopped`;
//! its connection closes when it exits. The scenario's clock starts once every starting worker
//! is ready (at most [`READY_LIMIT`] after the launch), so that process start-up (loading
//! libtorch takes a second or more) is not part of the run; those workers wait at a [`gate`]
//! until then and ask to join together at its time 0. A joiner's process starts
//! [`JOIN_LEAD`] before its join and waits for the scenario's time to ask to join, so that
//! nodes the scenario starts together ask together.
//!
//! The launcher prints nothing: [`Launcher::on_notice`] receives what a user should see, the
//! returned [`LaunchOutcome`] holds the run's record, and details go to `tracing`.

mod error;
pub mod gate;
mod keys;
mod outcome;
mod prepare;
mod record;
mod run_loop;
pub mod status;

pub use error::LaunchError;
pub use outcome::{LaunchOutcome, Notice, ProcessRecord};
pub use prepare::{
    agreed_step, check_devices, check_memory, checkpoint_plan, checkpoint_root, resume_step,
    scenario_base,
};
pub use record::read_lines;
pub use status::{StatusEvent, StatusHub, StatusMsg, StatusSender};

use loco_core::ids::NodeId;
use loco_core::scenario::{ChurnAction, NetworkMode, NodeSpec, Scenario};
use nix::sys::signal::Signal;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How long before its join a joiner's process is started.
pub const JOIN_LEAD: Duration = Duration::from_secs(3);
/// The longest the scenario's clock waits for the starting workers to be ready.
pub const READY_LIMIT: Duration = Duration::from_secs(60);
/// The start [`gate`]'s file, in the run's `nodes/` folder.
const GATE_FILE: &str = "start";
/// The longest the launcher sleeps between two looks at its processes.
const TICK: Duration = Duration::from_millis(100);

/// Where a launch hands its metrics lines as they come ([`Launcher::on_metrics`]).
type OnMetrics<'a> = Box<dyn FnMut(&crate::node::MetricsLine) + 'a>;

/// The coordinator's metrics file, in the run's `nodes/` folder.
const COORDINATOR_METRICS: &str = "coordinator.jsonl";

/// How far a growing metrics file was read: its complete lines are taken once each.
#[derive(Debug, Default)]
struct Tail {
    offset: u64,
    partial: Vec<u8>,
}

impl Tail {
    /// The most bytes one read takes (the rest waits for the next).
    const MAX_READ: u64 = 1 << 20;

    /// Calls `f` with each metrics line completed in `path` since the last read; a line that is
    /// not one is skipped (the launch's record reports it).
    fn read(&mut self, path: &Path, f: &mut dyn FnMut(&crate::node::MetricsLine)) {
        use std::io::{Read, Seek};
        let Ok(mut file) = std::fs::File::open(path) else { return };
        if file.seek(std::io::SeekFrom::Start(self.offset)).is_err() {
            return;
        }
        let mut buf = Vec::new();
        let Ok(n) = file.take(Self::MAX_READ).read_to_end(&mut buf) else { return };
        self.offset += n as u64;
        self.partial.extend_from_slice(&buf);
        let Some(end) = self.partial.iter().rposition(|&b| b == b'\n') else {
            if self.partial.len() as u64 > Self::MAX_READ {
                self.partial.clear(); // no metrics line is that long
            }
            return;
        };
        let complete: Vec<u8> = self.partial.drain(..=end).collect();
        for line in complete.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            if let Ok(l) = serde_json::from_slice::<crate::node::MetricsLine>(line) {
                f(&l);
            }
        }
    }
}
/// The longest it waits for the coordinator's address.
const COORDINATOR_START: Duration = Duration::from_secs(30);

/// Seconds since the Unix epoch: the shared time base of a launch's processes (metrics, and the
/// launcher's timers).
#[allow(clippy::disallowed_methods)] // the launcher's one wall clock
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Which checkpoints a launch resumes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resume {
    /// The newest outer step that every starting node has a complete checkpoint of.
    Newest,
    /// This outer step.
    Step(u64),
}

/// What to launch.
#[derive(Clone, Debug)]
pub struct LaunchPlan {
    /// The scenario.
    pub scenario: Scenario,
    /// Its file, passed to every process (its paths are relative to it).
    pub scenario_path: PathBuf,
    /// The `loco` executable: run as `PROGRAM coordinator SCENARIO ...` and
    /// `PROGRAM worker SCENARIO ...`.
    pub program: PathBuf,
    /// The run directory; the processes' metrics go to its `nodes/`.
    pub out: PathBuf,
    /// Stop after this many outer steps (overrides the scenario's stop).
    pub max_outer_steps: Option<u64>,
    /// Workers train a synthetic objective of this many parameters instead of the model (and
    /// the memory check is skipped).
    pub synthetic_params: Option<usize>,
    /// Give up after this long (default: the scenario's stop time plus a minute).
    pub timeout: Option<Duration>,
    /// Continue from checkpoints.
    pub resume: Option<Resume>,
    /// Checkpoints go here instead of the scenario's `[real] checkpoint_dir`.
    pub checkpoint_dir: Option<PathBuf>,
    /// The network to run in, instead of the scenario's `[real] network`.
    pub network: Option<NetworkMode>,
}

/// The network a launch ran in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NetworkUsed {
    /// The scenario's links, emulated (namespaces, TUN devices and the router).
    Emulated,
    /// The scenario's links, relayed in userspace ([`crate::wan::Relays`]), and why not
    /// emulated.
    Relayed {
        /// Why not emulated: the scenario asked for the relays, or what the machine lacks.
        why: String,
    },
    /// Bare loopback, and why.
    Loopback {
        /// Why not emulated: the scenario asked for loopback, or what the machine lacks.
        why: String,
    },
}

impl NetworkUsed {
    /// The short name written to summary.json (`extra.network`).
    pub fn name(&self) -> &'static str {
        match self {
            NetworkUsed::Emulated => "emulated",
            NetworkUsed::Relayed { .. } => "relay",
            NetworkUsed::Loopback { .. } => "loopback",
        }
    }
}

impl std::fmt::Display for NetworkUsed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NetworkUsed::Emulated => write!(
                f,
                "the scenario's links, emulated (a network namespace per process, packets shaped \
                 by the launcher's router; addresses in 198.18.0.0/15)"
            ),
            NetworkUsed::Relayed { why } => write!(
                f,
                "the scenario's links, relayed in userspace (processes on loopback, every \
                 connection between nodes through a shaping relay of the launcher's; no packet \
                 is lost, so TCP's own dynamics are not the links'; {why})"
            ),
            NetworkUsed::Loopback { why } => write!(f, "bare loopback, unshaped ({why})"),
        }
    }
}

/// The scenario's network of a launch.
enum Net {
    Emulated(crate::wan::Network),
    Relayed(crate::wan::Relays),
}

impl Net {
    fn apply(&self, action: &ChurnAction) {
        match self {
            Net::Emulated(n) => n.router().apply(action),
            Net::Relayed(r) => r.apply(action),
        }
    }

    fn set_outer_steps(&self, steps: u64) {
        match self {
            Net::Emulated(n) => n.router().set_outer_steps(steps),
            Net::Relayed(r) => r.set_outer_steps(steps),
        }
    }

    fn start_clock(&self) {
        match self {
            Net::Emulated(n) => n.router().start_clock(),
            Net::Relayed(r) => r.start_clock(),
        }
    }

    fn stats(&self) -> (loco_core::Time, crate::wan::Stats) {
        match self {
            Net::Emulated(n) => n.router().stats(),
            Net::Relayed(r) => r.stats(),
        }
    }
}

impl LaunchPlan {
    /// A plan with no overrides.
    pub fn new(scenario: Scenario, scenario_path: PathBuf, program: PathBuf, out: PathBuf) -> Self {
        LaunchPlan {
            scenario,
            scenario_path,
            program,
            out,
            max_outer_steps: None,
            synthetic_params: None,
            timeout: None,
            resume: None,
            checkpoint_dir: None,
            network: None,
        }
    }
}

/// Runs a launch to its end with no one watching its notices.
pub fn launch(plan: LaunchPlan) -> Result<LaunchOutcome, LaunchError> {
    Launcher::new(plan).run()
}

/// A launch to run, with whoever watches it.
pub struct Launcher<'a> {
    plan: LaunchPlan,
    on_notice: Box<dyn FnMut(Notice) + 'a>,
    on_metrics: Option<OnMetrics<'a>>,
}

impl std::fmt::Debug for Launcher<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Launcher").field("plan", &self.plan).finish_non_exhaustive()
    }
}

impl<'a> Launcher<'a> {
    /// A launch of `plan`.
    pub fn new(plan: LaunchPlan) -> Self {
        Launcher { plan, on_notice: Box::new(|_| {}), on_metrics: None }
    }

    /// Calls `f` with each metrics line of the run as it comes: the workers' (through their
    /// status channel) and the coordinator's (read from its file as it grows). For a live view;
    /// the files stay the run's record.
    pub fn on_metrics(mut self, f: impl FnMut(&crate::node::MetricsLine) + 'a) -> Self {
        self.on_metrics = Some(Box::new(f));
        self
    }

    /// Calls `f` with each [`Notice`] as the launch runs.
    pub fn on_notice(mut self, f: impl FnMut(Notice) + 'a) -> Self {
        self.on_notice = Box::new(f);
        self
    }

    /// Runs the launch to its end: every process it started has exited (or was killed) when
    /// this returns. `Err` only when the run could not start or be watched; a run that broke an
    /// invariant is an `Ok` whose [`LaunchOutcome::ok`] is false.
    pub fn run(self) -> Result<LaunchOutcome, LaunchError> {
        let Launcher { plan, on_notice, on_metrics } = self;
        if plan.synthetic_params.is_none() {
            check_memory(&plan.scenario)?;
        }
        let nodes_dir = plan.out.join("nodes");
        let io = |action, path: &Path| {
            let path = path.to_path_buf();
            move |source| LaunchError::Io { action, path, source }
        };
        std::fs::create_dir_all(&nodes_dir).map_err(io("creating", &nodes_dir))?;
        for e in std::fs::read_dir(&nodes_dir).map_err(io("listing", &nodes_dir))? {
            let p = e.map_err(io("listing", &nodes_dir))?.path();
            let stale = p.extension().is_some_and(|x| x == "jsonl" || x == "addr" || x == "sock");
            if stale || p.file_name().is_some_and(|n| n == GATE_FILE) {
                std::fs::remove_file(&p).map_err(io("removing", &p))?;
            }
        }
        let (s, path, given) =
            (&plan.scenario, &plan.scenario_path, plan.checkpoint_dir.as_deref());
        let resume = match plan.resume {
            None => None,
            Some(Resume::Newest) => Some(resume_step(s, path, given, None)?),
            Some(Resume::Step(k)) => Some(resume_step(s, path, given, Some(k))?),
        };
        let (net, used) = match plan.network.unwrap_or(s.real().network) {
            NetworkMode::Loopback => (
                None,
                NetworkUsed::Loopback {
                    why: "the scenario's `[real] network` is \"loopback\"".into(),
                },
            ),
            NetworkMode::Emulated => (
                Some(Net::Emulated(crate::wan::Network::start(s, s.seed())?)),
                NetworkUsed::Emulated,
            ),
            NetworkMode::Relay => (
                Some(Net::Relayed(crate::wan::Relays::start(s, s.seed())?)),
                NetworkUsed::Relayed { why: "the scenario's `[real] network` is \"relay\"".into() },
            ),
            NetworkMode::Auto => match crate::wan::netns::unavailable() {
                None => (
                    Some(Net::Emulated(crate::wan::Network::start(s, s.seed())?)),
                    NetworkUsed::Emulated,
                ),
                Some(why) => (
                    Some(Net::Relayed(crate::wan::Relays::start(s, s.seed())?)),
                    NetworkUsed::Relayed { why: format!("not emulated: {why}") },
                ),
            },
        };
        let mut on_notice = on_notice;
        on_notice(Notice::Network { description: used.to_string() });
        let sock = nodes_dir.join("status.sock");
        let hub = StatusHub::bind(&sock)
            .map_err(|source| LaunchError::Status { path: sock.clone(), source })?;
        // Emulated, the processes listen on addresses beyond loopback.
        let secret = if matches!(net, Some(Net::Emulated(_))) { keys::run_secret(s) } else { None };
        // A run with a secret binds its processes' ids to keys of their own.
        let keys = match secret.is_some() || keys::secret_given(s) {
            true => Some(keys::make(s, &nodes_dir.join("keys"))?),
            false => None,
        };
        let mut run = Run {
            ckpt_root: checkpoint_root(s, path, given),
            plan: &plan,
            gate: Some(nodes_dir.join(GATE_FILE)),
            nodes_dir,
            resume,
            run_start: unix_now(),
            hub,
            fleet: Fleet::default(),
            incarnation: BTreeMap::new(),
            coordinator: 0,
            addr: None,
            committed: 0,
            last_step: None,
            on_notice,
            on_metrics: on_metrics.map(|f| (f, Tail::default())),
            net,
            used,
            secret,
            keys,
        };
        run.run()
    }
}

/// One child process of a launch.
struct Proc {
    name: String,
    /// `None` for the coordinator.
    node: Option<NodeId>,
    incarnation: u64,
    child: Child,
    exited: bool,
    started_s: f64,
    ready_s: Option<f64>,
    stopped: Option<String>,
    exit: Option<String>,
}

impl Proc {
    /// Signals it, unless it was reaped (its pid may be another process's by now).
    fn signal(&self, sig: Signal) {
        if self.exited {
            return;
        }
        let Ok(pid) = i32::try_from(self.child.id()) else { return };
        if let Err(e) = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig) {
            tracing::warn!(process = %self.name, "signal {sig}: {e}");
        }
    }

    /// Writes a fault command line to its standard input (`--control-stdin`).
    fn command(&mut self, line: &str) {
        use std::io::Write;
        if self.exited {
            return;
        }
        let Some(stdin) = self.child.stdin.as_mut() else { return };
        if let Err(e) = stdin.write_all(format!("{line}\n").as_bytes()).and_then(|()| stdin.flush())
        {
            tracing::warn!(process = %self.name, "fault command {line:?}: {e}");
        }
    }

    /// Whether it has exited (reaped now if so); `Some(status)` the first time.
    fn poll_exit(&mut self) -> Result<Option<std::process::ExitStatus>, LaunchError> {
        if self.exited {
            return Ok(None);
        }
        let st = self.child.try_wait().map_err(|source| LaunchError::Process {
            action: "watching",
            process: self.name.clone(),
            source,
        })?;
        if let Some(st) = st {
            self.exited = true;
            self.exit = Some(st.to_string());
        }
        Ok(st)
    }
}

/// Every process a launch started. Dropping it kills those still running, so that no process
/// outlives its launch, whatever way the launch ends.
#[derive(Default)]
struct Fleet(Vec<Proc>);

impl Drop for Fleet {
    fn drop(&mut self) {
        for p in &mut self.0 {
            if matches!(p.child.try_wait(), Ok(None)) {
                let _ = p.child.kill();
                let _ = p.child.wait();
            }
        }
    }
}

/// A launch in progress.
struct Run<'p, 'a> {
    plan: &'p LaunchPlan,
    nodes_dir: PathBuf,
    /// The start gate, until it opens (the scenario's clock starts).
    gate: Option<PathBuf>,
    resume: Option<u64>,
    ckpt_root: Option<PathBuf>,
    run_start: f64,
    hub: StatusHub,
    fleet: Fleet,
    incarnation: BTreeMap<NodeId, u64>,
    /// The coordinator's index in the fleet.
    coordinator: usize,
    addr: Option<SocketAddr>,
    /// Outer steps reported committed, and the last one.
    committed: u64,
    last_step: Option<u64>,
    on_notice: Box<dyn FnMut(Notice) + 'a>,
    /// Where the run's metrics lines go as they come, and how far the coordinator's file was
    /// read.
    on_metrics: Option<(OnMetrics<'a>, Tail)>,
    /// The scenario's network, when the run has one.
    net: Option<Net>,
    used: NetworkUsed,
    /// A secret made for this run, handed to its processes, when the user gave none.
    secret: Option<String>,
    /// The directory of the processes' keys and roster, when the run has a secret.
    keys: Option<PathBuf>,
}

impl Run<'_, '_> {
    fn elapsed(&self) -> Duration {
        Duration::from_secs_f64((unix_now() - self.run_start).max(0.0))
    }

    fn proc(&mut self, i: usize) -> Option<&mut Proc> {
        self.fleet.0.get_mut(i)
    }

    fn signal(&self, i: usize, sig: Signal) {
        if let Some(p) = self.fleet.0.get(i) {
            p.signal(sig);
        }
    }

    /// Writes a fault command to process `i` ([`Proc::command`]).
    fn send_command(&mut self, i: usize, line: &str) {
        if let Some(p) = self.fleet.0.get_mut(i) {
            p.command(line);
        }
    }

    /// A command that runs the `loco` program as `host` (in its namespace, when the run has an
    /// emulated network), and the address it is to listen on.
    fn command(&self, host: NodeId) -> (Command, String) {
        let (mut cmd, listen) = self.bare_command(host);
        if let Some(k) = &self.secret {
            cmd.env(&self.plan.scenario.real().secret_env, k);
        }
        (cmd, listen)
    }

    fn bare_command(&self, host: NodeId) -> (Command, String) {
        let program = &self.plan.program;
        match &self.net {
            Some(Net::Emulated(net)) => {
                let addr = net.hosts().host(host).map(|h| h.addr);
                if let (Some(cmd), Some(addr)) = (net.hosts().command(host, program), addr) {
                    return (cmd, format!("{addr}:0"));
                }
            }
            Some(Net::Relayed(r)) => {
                if let Some(addr) = r.listen_addr(host) {
                    return (Command::new(program), addr.to_string());
                }
            }
            None => {}
        }
        (Command::new(program), "127.0.0.1:0".into())
    }

    /// With keys: process `name`'s key and roster (the coordinator's names every node, a
    /// worker's the coordinator and itself).
    fn identity_args(&self, name: &str, cmd: &mut Command) {
        if let Some(dir) = &self.keys {
            cmd.arg("--key").arg(dir.join(format!("{name}.key")));
            let roster = match name {
                crate::identity::COORDINATOR_NAME => keys::ROSTER.to_string(),
                name => keys::worker_roster(name),
            };
            cmd.arg("--roster").arg(dir.join(roster));
        }
    }

    /// Relayed: `host` reaches every other host through that pair's relay.
    fn relayed_via(&self, host: NodeId, cmd: &mut Command) {
        if let Some(Net::Relayed(r)) = &self.net {
            let via: Vec<String> =
                r.dial_via(host).iter().map(|(n, a)| format!("{}={a}", n.0)).collect();
            if !via.is_empty() {
                cmd.args(["--dial-via", &via.join(",")]);
            }
        }
    }

    fn start_coordinator(&mut self) -> Result<SocketAddr, LaunchError> {
        let plan = self.plan;
        let addr_file = self.nodes_dir.join("coordinator.addr");
        let (mut cmd, listen) = self.command(NodeId::COORDINATOR);
        cmd.arg("coordinator")
            .arg(&plan.scenario_path)
            .args(["--listen", &listen])
            .arg("--addr-file")
            .arg(&addr_file)
            .arg("--metrics")
            .arg(self.nodes_dir.join(COORDINATOR_METRICS))
            .args(["--run-start", &self.run_start.to_string()])
            .args(["--start-step", &self.resume.unwrap_or(0).to_string()])
            .env_remove(status::SOCKET_ENV)
            .env_remove(status::TOKEN_ENV)
            .stdin(Stdio::null());
        if let Some(n) = plan.max_outer_steps {
            cmd.args(["--max-outer-steps", &n.to_string()]);
        }
        self.relayed_via(NodeId::COORDINATOR, &mut cmd);
        self.identity_args(crate::identity::COORDINATOR_NAME, &mut cmd);
        let child = cmd.spawn().map_err(|source| LaunchError::Process {
            action: "starting",
            process: "the coordinator".into(),
            source,
        })?;
        self.coordinator = self.fleet.0.len();
        self.fleet.0.push(Proc {
            name: "coordinator".into(),
            node: None,
            incarnation: 1,
            child,
            exited: false,
            started_s: 0.0,
            ready_s: None,
            stopped: None,
            exit: None,
        });
        // The coordinator has no status channel: it says its address in a file.
        let polls = COORDINATOR_START.as_millis() / 50;
        for _ in 0..polls {
            if let Ok(t) = std::fs::read_to_string(&addr_file) {
                return t.trim().parse().map_err(|_| LaunchError::CoordinatorAddr { text: t });
            }
            let i = self.coordinator;
            if let Some(st) = self.proc(i).map(Proc::poll_exit).transpose()?.flatten() {
                return Err(LaunchError::CoordinatorExited { status: st.to_string() });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(LaunchError::CoordinatorSilent { waited: COORDINATOR_START })
    }

    /// Starts `node`'s worker, `at` on the scenario's clock; a joiner started ahead waits for the
    /// Unix time `join_at` to ask to join. Returns its index in the fleet.
    fn spawn(
        &mut self,
        node: &NodeSpec,
        at: Duration,
        join_at: Option<f64>,
    ) -> Result<usize, LaunchError> {
        let plan = self.plan;
        let s = &plan.scenario;
        let inc = *self.incarnation.entry(node.id).and_modify(|i| *i += 1).or_insert(1);
        // Crashes with a `during` are armed inside the process, which kills itself there.
        let faults: Vec<String> = s
            .churn()
            .iter()
            .filter(|c| {
                c.at >= at && matches!(&c.action, ChurnAction::Crash(ids) if ids.contains(&node.id))
            })
            // Armed relative to the process's own start.
            .filter_map(|c| {
                let after_s = (c.at - at).as_secs_f64();
                let from_step = c.from_step.unwrap_or(0);
                c.during.map(|phase| crate::node::Fault { phase, after_s, from_step }.to_string())
            })
            .collect();
        let index = self.fleet.0.len();
        let token = self.hub.register(index).map_err(|source| LaunchError::Status {
            path: self.hub.path().to_path_buf(),
            source,
        })?;
        let addr = self.addr.map(|a| a.to_string()).unwrap_or_default();
        let (mut cmd, listen) = self.command(node.id);
        cmd.arg("worker")
            .arg(&plan.scenario_path)
            .args(["--coordinator", &addr, "--id", &node.name])
            .args(["--listen", &listen, "--incarnation", &inc.to_string()])
            .arg("--metrics")
            .arg(self.nodes_dir.join(format!("{}.jsonl", node.name)))
            .args(["--run-start", &self.run_start.to_string()])
            .env(status::SOCKET_ENV, self.hub.path())
            .env(status::TOKEN_ENV, &token)
            .arg("--control-stdin")
            .stdin(Stdio::piped());
        if let Some(n) = plan.synthetic_params {
            cmd.args(["--synthetic-params", &n.to_string()]);
        }
        match (join_at, &self.gate) {
            (Some(t), _) => {
                cmd.args(["--join-at", &t.to_string()]);
            }
            // Started before the scenario's clock: waits for its time 0 at the gate.
            (None, Some(gate)) => {
                cmd.arg("--start-gate").arg(gate);
            }
            (None, None) => {}
        }
        for f in &faults {
            cmd.args(["--crash-during", f]);
        }
        // In the emulated network the workers run the TCP the simulator models.
        if let (Some(Net::Emulated(_)), Some(cc)) = (&self.net, s.sim().tcp.linux_name()) {
            cmd.args(["--congestion", cc]);
        }
        self.relayed_via(node.id, &mut cmd);
        self.identity_args(&node.name, &mut cmd);
        if let Some(d) = &plan.checkpoint_dir {
            cmd.arg("--checkpoint-dir").arg(d);
        }
        if let (Some(step), Some(root), true) =
            (self.resume, &self.ckpt_root, at.is_zero() && inc == 1)
        {
            let dir = root.join(&node.name).join(crate::checkpoint::step_dir_name(step));
            cmd.arg("--resume").arg(dir);
        }
        let child = cmd.spawn().map_err(|source| LaunchError::Process {
            action: "starting worker",
            process: node.name.clone(),
            source,
        })?;
        self.fleet.0.push(Proc {
            name: node.name.clone(),
            node: Some(node.id),
            incarnation: inc,
            child,
            exited: false,
            started_s: unix_now() - self.run_start,
            ready_s: None,
            stopped: None,
            exit: None,
        });
        Ok(index)
    }

    /// Waits at most `timeout` for the workers' status, and takes what came.
    fn listen(&mut self, timeout: Duration) {
        for ev in self.hub.wait(unix_now(), timeout) {
            let now_s = unix_now() - self.run_start;
            match ev {
                StatusEvent::Message { key, msg } => {
                    if let (StatusMsg::Metrics { line }, Some((f, _))) =
                        (&msg, &mut self.on_metrics)
                    {
                        f(line);
                    }
                    let Some(p) = self.fleet.0.get_mut(key) else { continue };
                    match msg {
                        StatusMsg::Ready => {
                            tracing::info!(worker = %p.name, at_s = now_s, "ready");
                            p.ready_s.get_or_insert(now_s);
                        }
                        StatusMsg::Metrics { line: crate::node::MetricsLine::Row(r) } => {
                            if self.last_step.is_none_or(|l| r.outer_step > l) {
                                self.last_step = Some(r.outer_step);
                                self.committed += 1;
                                if let Some(net) = &self.net {
                                    net.set_outer_steps(self.committed);
                                }
                            }
                        }
                        StatusMsg::Metrics { .. } | StatusMsg::Hello { .. } => {}
                        StatusMsg::Stopped { reason, committed, .. } => {
                            tracing::info!(worker = %p.name, committed, "stopped: {reason}");
                            p.stopped = Some(reason);
                        }
                    }
                }
                StatusEvent::Closed { key } => {
                    if let Some(p) = self.fleet.0.get(key) {
                        tracing::debug!(worker = %p.name, "status channel closed");
                    }
                }
            }
        }
        if let Some((f, tail)) = &mut self.on_metrics {
            tail.read(&self.nodes_dir.join(COORDINATOR_METRICS), f);
        }
    }
}

#[cfg(test)]
mod tail_tests {
    use super::*;
    use loco_core::metrics::{EventKind, EventRow};

    /// Complete lines are taken once each, a line written in two parts once it is whole, and a
    /// line that is not a metrics line is skipped.
    #[test]
    fn a_growing_file_gives_each_complete_line_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.jsonl");
        let line = |t| {
            let l = crate::node::MetricsLine::Event(EventRow::new(t, EventKind::Evict));
            serde_json::to_string(&l).unwrap()
        };
        let mut tail = Tail::default();
        let mut seen = Vec::new();
        let mut take = |tail: &mut Tail| {
            tail.read(&path, &mut |l| {
                if let crate::node::MetricsLine::Event(e) = l {
                    seen.push(e.time_s);
                }
            });
        };
        take(&mut tail); // no file yet
        let (a, b) = (line(1.0), line(2.0));
        let (b1, b2) = b.split_at(10);
        std::fs::write(&path, format!("{a}\nnot json\n{b1}")).unwrap();
        take(&mut tail);
        let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        std::io::Write::write_all(&mut f, format!("{b2}\n").as_bytes()).unwrap();
        take(&mut tail);
        take(&mut tail);
        assert_eq!(seen, vec![1.0, 2.0]);
    }
}
