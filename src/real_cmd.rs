//! `loco coordinator`, `loco worker` and `loco launch`: the real backend from a scenario file.

use crate::InputError;
use anyhow::{Context, Result, anyhow, bail};
use loco_core::ids::NodeId;
use loco_core::metrics::{EventKind, EventRow, OuterStepRow, RunMeta, summarize};
use loco_core::scenario::{ChurnAction, Scenario};
use loco_real::coord::{CoordinatorOptions, bind, run_coordinator};
use loco_real::inner::{InnerError, InnerLoop, InnerStats, Quadratic};
use loco_real::node::{MetricsLine, WorkerOptions, run_worker};
use loco_real::tcp::TcpConfig;
use loco_real::train::TrainerState;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Seconds since the Unix epoch: the shared time base of a launch's processes (metrics only;
/// no decision reads it).
#[allow(clippy::disallowed_methods)] // the real backend's one wall clock, for metrics
pub(crate) fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

pub(crate) fn load(path: &Path) -> Result<Scenario> {
    Scenario::load(path).map_err(|e| InputError(anyhow!(e)).into())
}

/// The run's secret: the scenario's `secret_env` variable when it is set, else its `secret`.
fn secret(s: &Scenario) -> Option<Vec<u8>> {
    std::env::var(&s.real().secret_env)
        .ok()
        .filter(|v| !v.is_empty())
        .or_else(|| s.real().secret.clone())
        .map(String::into_bytes)
}

/// The runtime of a real worker or coordinator (the all-reduce benchmark's ranks use it too).
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?)
}

async fn terminate_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) =
        (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

/// `loco coordinator`.
pub(crate) fn coordinator(a: &crate::cli::CoordinatorArgs) -> Result<()> {
    let s = load(&a.scenario)?;
    let names: BTreeMap<NodeId, String> =
        s.nodes().iter().map(|n| (n.id, n.name.clone())).collect();
    let opts = CoordinatorOptions {
        listen: a.listen,
        mesh: s.mesh().clone(),
        tcp: TcpConfig { secret: secret(&s), ..TcpConfig::default() },
        stop_outer_steps: a.max_outer_steps.or(s.stop().outer_steps),
        stop_time: s.stop().time,
        names,
        metrics: a.metrics.clone(),
        time_offset_s: a.run_start.map_or(0.0, |t| unix_now() - t),
        start_outer_step: a.start_step,
    };
    runtime()?.block_on(async {
        let t = bind(&opts).await?;
        let addr = t.local_addr();
        eprintln!("loco: coordinator of `{}` listening on {addr}", s.name());
        if let Some(f) = &a.addr_file {
            write_atomic(f, addr.to_string().as_bytes())?;
        }
        let r = run_coordinator(opts, t, terminate_signal()).await?;
        eprintln!("loco: coordinator done: {} outer steps, {} epochs", r.outer_steps, r.epochs);
        anyhow::Ok(())
    })
}

/// Writes `bytes` to `path` through a temporary file and a rename.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(())
}

/// The inner loop a worker runs: the libtorch trainer, or the synthetic objective.
enum AnyInner {
    Synthetic(Box<Quadratic>),
    #[cfg(feature = "torch")]
    Torch(Box<loco_real::inner::TchInner>),
}

impl InnerLoop for AnyInner {
    fn param_layout(&self) -> Vec<(String, usize)> {
        match self {
            AnyInner::Synthetic(q) => q.param_layout(),
            #[cfg(feature = "torch")]
            AnyInner::Torch(t) => t.param_layout(),
        }
    }
    fn params_into(&self, out: &mut [f32]) -> Result<(), InnerError> {
        match self {
            AnyInner::Synthetic(q) => q.params_into(out),
            #[cfg(feature = "torch")]
            AnyInner::Torch(t) => t.params_into(out),
        }
    }
    fn set_params(&mut self, p: &[f32]) -> Result<(), InnerError> {
        match self {
            AnyInner::Synthetic(q) => q.set_params(p),
            #[cfg(feature = "torch")]
            AnyInner::Torch(t) => t.set_params(p),
        }
    }
    fn step(&mut self) -> Result<InnerStats, InnerError> {
        match self {
            AnyInner::Synthetic(q) => q.step(),
            #[cfg(feature = "torch")]
            AnyInner::Torch(t) => t.step(),
        }
    }
    fn export_optimizer(&self) -> Result<Vec<u8>, InnerError> {
        match self {
            AnyInner::Synthetic(q) => q.export_optimizer(),
            #[cfg(feature = "torch")]
            AnyInner::Torch(t) => t.export_optimizer(),
        }
    }
    fn import_optimizer(&mut self, b: &[u8]) -> Result<(), InnerError> {
        match self {
            AnyInner::Synthetic(q) => q.import_optimizer(b),
            #[cfg(feature = "torch")]
            AnyInner::Torch(t) => t.import_optimizer(b),
        }
    }
    fn save_state(&self) -> Result<(TrainerState, serde_json::Value), InnerError> {
        match self {
            AnyInner::Synthetic(q) => q.save_state(),
            #[cfg(feature = "torch")]
            AnyInner::Torch(t) => t.save_state(),
        }
    }
    fn load_state(&mut self, st: &TrainerState, pos: &serde_json::Value) -> Result<(), InnerError> {
        match self {
            AnyInner::Synthetic(q) => q.load_state(st, pos),
            #[cfg(feature = "torch")]
            AnyInner::Torch(t) => t.load_state(st, pos),
        }
    }
}

fn make_inner(
    s: &Scenario,
    scenario_path: &Path,
    node: &loco_core::scenario::NodeSpec,
    synthetic: Option<usize>,
) -> Result<AnyInner> {
    if let Some(n) = synthetic {
        let q = Quadratic::new(n, s.seed(), node.id.0).paced(node.step_time);
        return Ok(AnyInner::Synthetic(Box::new(q)));
    }
    #[cfg(feature = "torch")]
    {
        use loco_real::data::{DataLoader, DataSource, Order, Shard, Synthetic};
        use loco_real::train::{TrainConfig, Trainer};
        let cfg = TrainConfig::from_scenario(s.model(), s.diloco(), s.real());
        let device = loco_real::model::tch_device(s.real().device)?;
        tch::manual_seed(s.seed() as i64);
        if matches!(s.real().device, loco_core::scenario::Device::Cpu) {
            // Several workers share this machine's cores: one intra-op thread each.
            tch::set_num_threads(1);
        }
        let trainer = Trainer::new(s.model(), cfg.clone(), device, s.seed())?;
        tracing::info!(
            params = trainer.num_params(),
            device = %s.real().device,
            precision = %cfg.precision,
            "model ready"
        );
        let source = match &s.real().data {
            Some(d) => DataSource::File(scenario_base(scenario_path).join(d)),
            None => DataSource::Synthetic(Synthetic { seed: s.seed(), sequences: 1 << 20 }),
        };
        let count = s.nodes().len() as u32;
        let shard = Shard::new(node.id.0 % count, count)?;
        let data =
            DataLoader::new(&source, cfg.seq_len, s.model().vocab, shard, Order::Sequential)?;
        Ok(AnyInner::Torch(Box::new(loco_real::inner::TchInner::new(trainer, data))))
    }
    #[cfg(not(feature = "torch"))]
    {
        let _ = scenario_path;
        Err(InputError(anyhow!(
            "this loco was built without libtorch: rebuild with `--features torch` \
             (see README), or pass --synthetic-params N to train a synthetic objective"
        ))
        .into())
    }
}

/// How long before its join a joiner's process is started by `loco launch`.
const JOIN_LEAD: Duration = Duration::from_secs(3);

/// `loco worker`.
pub(crate) fn worker(a: &crate::cli::WorkerArgs) -> Result<()> {
    let s = load(&a.scenario)?;
    let node = s
        .node_by_name(&a.id)
        .or_else(|| a.id.parse::<u32>().ok().and_then(|i| s.nodes().get(i as usize)))
        .ok_or_else(|| {
            InputError(anyhow!(
                "--id {}: no such node in {} (nodes: {})",
                a.id,
                a.scenario.display(),
                s.nodes().iter().map(|n| n.name.as_str()).collect::<Vec<_>>().join(", ")
            ))
        })?
        .clone();
    let inner = make_inner(&s, &a.scenario, &node, a.synthetic_params)?;
    if let Some(t) = a.join_at {
        // Started early (loading libtorch and building the model take a while, and not equally
        // long for every process): wait for the scenario's time to ask to join, at most 60 s.
        // Before the options: the metrics' time base and the faults' clock start after it.
        let wait = (t - unix_now()).clamp(0.0, 60.0);
        std::thread::sleep(Duration::from_secs_f64(wait));
    }
    let opts = WorkerOptions {
        id: node.id,
        name: node.name.clone(),
        incarnation: a.incarnation,
        coordinator: a.coordinator,
        listen: a.listen,
        mesh: s.mesh().clone(),
        inner_steps: u32::try_from(s.diloco().inner_steps).unwrap_or(u32::MAX),
        codec: s.diloco().codec,
        outer: loco_core::diloco::OuterConfig {
            lr: s.diloco().outer_lr as f32,
            momentum: s.diloco().outer_momentum as f32,
            nesterov: s.diloco().nesterov,
        },
        segment_elems: s.diloco().segment_elems(),
        shards: u16::try_from(node.gpus.max(1)).unwrap_or(u16::MAX),
        tcp: TcpConfig { secret: secret(&s), ..TcpConfig::default() },
        metrics: a.metrics.clone(),
        time_offset_s: a.run_start.map_or(0.0, |t| unix_now() - t),
        checkpoint: checkpoint_plan(&s, &a.scenario, a.checkpoint_dir.as_deref(), &node.name),
        resume: a.resume.clone(),
        faults: a.crash_during.clone(),
    };
    let report = runtime()?.block_on(run_worker(opts, inner, terminate_signal()))?;
    eprintln!(
        "loco: worker {} stopped: {} ({} outer steps, weights {})",
        node.name, report.stop, report.committed, report.weights_hash
    );
    Ok(())
}

/// Where a scenario's paths (data, checkpoints) are relative to.
fn scenario_base(path: &Path) -> &Path {
    path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// The checkpoint root: the override, or the scenario's, when there is one.
fn checkpoint_root(s: &Scenario, scenario_path: &Path, given: Option<&Path>) -> Option<PathBuf> {
    given
        .map(Path::to_path_buf)
        .or_else(|| s.real().checkpoint_dir.as_ref().map(|d| scenario_base(scenario_path).join(d)))
}

fn checkpoint_plan(
    s: &Scenario,
    scenario_path: &Path,
    given: Option<&Path>,
    node: &str,
) -> Option<loco_real::node::CheckpointPlan> {
    let dir = checkpoint_root(s, scenario_path, given)?;
    let remote = s.real().checkpoint_remote.as_ref().map(|d| scenario_base(scenario_path).join(d));
    Some(loco_real::node::CheckpointPlan {
        config: loco_real::checkpoint::CheckpointConfig {
            dir,
            scenario: s.name().to_string(),
            node: node.to_string(),
            keep: s.real().keep as usize,
            remote,
        },
        every: s.real().checkpoint_every,
    })
}

/// The outer step a launch resumes from: `wanted`, or the newest step every starting node has a
/// complete checkpoint of. Names what is missing otherwise.
fn resume_step(
    s: &Scenario,
    scenario_path: &Path,
    given: Option<&Path>,
    wanted: Option<u64>,
) -> Result<u64> {
    let Some(root) = checkpoint_root(s, scenario_path, given) else {
        return Err(InputError(anyhow!(
            "{}: [real] checkpoint_dir: needed to resume, and the scenario has none \
             (or pass --checkpoint-dir)",
            scenario_path.display()
        ))
        .into());
    };
    let mut common: Option<std::collections::BTreeSet<u64>> = None;
    let mut have = Vec::new();
    for n in s.initial_nodes() {
        let steps: std::collections::BTreeSet<u64> =
            loco_real::checkpoint::list(&root, &n.name)?.into_iter().map(|(k, _)| k).collect();
        have.push(format!("{}: {:?}", n.name, steps));
        common = Some(match common {
            None => steps,
            Some(c) => c.intersection(&steps).copied().collect(),
        });
    }
    let common = common.unwrap_or_default();
    let pick = match wanted {
        Some(k) => common.contains(&k).then_some(k),
        None => common.last().copied(),
    };
    pick.ok_or_else(|| {
        InputError(anyhow!(
            "{}: no complete checkpoint {}common to every starting node ({})",
            root.display(),
            wanted.map(|k| format!("of outer step {k} ")).unwrap_or_default(),
            have.join("; ")
        ))
        .into()
    })
}

/// One child process of a launch.
struct Proc {
    name: String,
    child: Child,
    stopped: bool,
}

fn signal(p: &mut Proc, sig: nix::sys::signal::Signal) {
    let pid = nix::unistd::Pid::from_raw(p.child.id() as i32);
    if let Err(e) = nix::sys::signal::kill(pid, sig) {
        tracing::warn!(process = %p.name, "signal {sig}: {e}");
    }
}

/// `loco launch`.
pub(crate) fn launch(a: &crate::cli::LaunchArgs) -> Result<bool> {
    let s = load(&a.scenario)?;
    if a.synthetic_params.is_none() {
        check_memory(&s)?;
    }
    let out = a.out.clone().unwrap_or_else(|| PathBuf::from("out").join(s.name()));
    let nodes_dir = out.join("nodes");
    std::fs::create_dir_all(&nodes_dir)
        .with_context(|| format!("creating {}", nodes_dir.display()))?;
    for e in std::fs::read_dir(&nodes_dir)? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "jsonl" || x == "addr") {
            std::fs::remove_file(&p)?;
        }
    }
    let resume = if a.resume || a.resume_step.is_some() {
        Some(resume_step(&s, &a.scenario, a.checkpoint_dir.as_deref(), a.resume_step)?)
    } else {
        None
    };
    let exe = std::env::current_exe()?;
    let run_start = unix_now();
    let addr_file = nodes_dir.join("coordinator.addr");
    let mut coord = Proc {
        name: "coordinator".into(),
        child: Command::new(&exe)
            .arg("coordinator")
            .arg(&a.scenario)
            .args(["--listen", "127.0.0.1:0"])
            .arg("--addr-file")
            .arg(&addr_file)
            .arg("--metrics")
            .arg(nodes_dir.join("coordinator.jsonl"))
            .args(["--run-start", &run_start.to_string()])
            .args(["--start-step", &resume.unwrap_or(0).to_string()])
            .args(
                a.max_outer_steps
                    .map(|n| vec!["--max-outer-steps".to_string(), n.to_string()])
                    .unwrap_or_default(),
            )
            .stdin(Stdio::null())
            .spawn()
            .context("starting the coordinator")?,
        stopped: false,
    };
    let addr: SocketAddr = {
        let mut waited = 0;
        loop {
            if let Ok(t) = std::fs::read_to_string(&addr_file) {
                break t.trim().parse().context("the coordinator's address")?;
            }
            if let Some(st) = coord.child.try_wait()? {
                bail!("the coordinator exited at start ({st})");
            }
            waited += 1;
            if waited > 600 {
                bail!("the coordinator did not start within 30 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let mut incarnation: BTreeMap<NodeId, u64> = BTreeMap::new();
    let ckpt_root = checkpoint_root(&s, &a.scenario, a.checkpoint_dir.as_deref());
    let mut spawn = |node: &loco_core::scenario::NodeSpec,
                     at: Duration,
                     join_at: Option<f64>|
     -> Result<Proc> {
        let inc = incarnation.entry(node.id).and_modify(|i| *i += 1).or_insert(1);
        // Crashes with a `during` are armed inside the process, which kills itself there.
        let faults: Vec<String> = s
            .churn()
            .iter()
            .filter(|c| {
                c.at >= at && matches!(&c.action, ChurnAction::Crash(ids) if ids.contains(&node.id))
            })
            // Armed relative to the process's own start.
            .filter_map(|c| c.during.map(|p| format!("{p}@{}", (c.at - at).as_secs_f64())))
            .collect();
        let mut cmd = Command::new(&exe);
        cmd.arg("worker")
            .arg(&a.scenario)
            .args(["--coordinator", &addr.to_string(), "--id", &node.name])
            .args(["--listen", "127.0.0.1:0", "--incarnation", &inc.to_string()])
            .arg("--metrics")
            .arg(nodes_dir.join(format!("{}.jsonl", node.name)))
            .args(["--run-start", &run_start.to_string()])
            .stdin(Stdio::null());
        if let Some(n) = a.synthetic_params {
            cmd.args(["--synthetic-params", &n.to_string()]);
        }
        if let Some(t) = join_at {
            cmd.args(["--join-at", &t.to_string()]);
        }
        for f in &faults {
            cmd.args(["--crash-during", f]);
        }
        if let Some(d) = &a.checkpoint_dir {
            cmd.arg("--checkpoint-dir").arg(d);
        }
        if let (Some(step), Some(root), true) = (resume, &ckpt_root, at.is_zero() && *inc == 1) {
            let dir = root.join(&node.name).join(loco_real::checkpoint::step_dir_name(step));
            cmd.arg("--resume").arg(dir);
        }
        let child = cmd.spawn().with_context(|| format!("starting worker {}", node.name))?;
        Ok(Proc { name: node.name.clone(), child, stopped: false })
    };
    let mut workers: BTreeMap<NodeId, Proc> = BTreeMap::new();
    let mut launch_events = Vec::new();
    // The scenario's churn already holds the starts of late nodes (as joins), sorted by time.
    let timeline: Vec<(Duration, ChurnAction, bool)> =
        s.churn().iter().map(|c| (c.at, c.action.clone(), c.during.is_some())).collect();
    for n in s.initial_nodes() {
        workers.insert(n.id, spawn(n, Duration::ZERO, None)?);
        launch_events.push(
            EventRow::new(0.0, EventKind::Start).node(n.name.clone()).detail("process started"),
        );
    }
    let limit =
        a.timeout.map(Duration::from_secs).or(s.stop().time.map(|t| t + Duration::from_secs(60)));
    let mut next = 0;
    // Join events whose processes were started ahead of time.
    let mut prestarted: std::collections::BTreeSet<usize> = std::collections::BTreeSet::new();
    let mut churn_t0: Option<Duration> = None;
    let mut hung: std::collections::BTreeSet<NodeId> = std::collections::BTreeSet::new();
    let mut failures: Vec<String> = Vec::new();
    let progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
    loop {
        let elapsed = Duration::from_secs_f64((unix_now() - run_start).max(0.0));
        // The scenario's clock starts once every starting worker is up: process start-up
        // (loading libtorch takes a second or more on a busy machine) is not part of the run.
        if churn_t0.is_none() {
            let up = s.initial_nodes().all(|n| worker_started(&nodes_dir, &n.name));
            if up || elapsed > Duration::from_secs(60) {
                churn_t0 = Some(elapsed);
            }
        }
        let churn_now = churn_t0.map(|t0| elapsed.saturating_sub(t0));
        // Joiners start early and wait for their time to ask to join (start-up takes a while,
        // and not equally long for every process: nodes the scenario starts together would ask
        // some hundred milliseconds apart, and could be admitted at different outer steps).
        if let (Some(now), Some(t0)) = (churn_now, churn_t0) {
            for (j, (t, action, _)) in timeline.iter().enumerate().skip(next) {
                if *t > now + JOIN_LEAD {
                    break;
                }
                let ChurnAction::Join(ids) = action else { continue };
                if !prestarted.insert(j) {
                    continue;
                }
                let join_at = run_start + (t0 + *t).as_secs_f64();
                for id in ids {
                    if let Some(n) = s.node(*id) {
                        // Faults count from the join, where the worker's clock starts.
                        workers.insert(*id, spawn(n, *t, Some(join_at))?);
                    }
                }
            }
        }
        while let Some(churn_now) =
            churn_now.filter(|&c| next < timeline.len() && timeline[next].0 <= c)
        {
            let (_, action, in_process) = timeline[next].clone();
            let started_early = prestarted.contains(&next);
            next += 1;
            if in_process {
                continue; // armed in the worker at its start
            }
            let at = elapsed.as_secs_f64();
            let name = |id: &NodeId| s.node(*id).map(|n| n.name.clone()).unwrap_or_default();
            use nix::sys::signal::Signal;
            match &action {
                ChurnAction::Join(ids) | ChurnAction::Restart(ids) => {
                    for id in ids {
                        if let Some(n) = s.node(*id) {
                            if !started_early {
                                workers.insert(*id, spawn(n, churn_now, None)?);
                            }
                            let detail = if started_early {
                                "process started ahead; asks to join now"
                            } else {
                                "process started"
                            };
                            launch_events.push(
                                EventRow::new(at, EventKind::Restart)
                                    .node(n.name.clone())
                                    .detail(detail),
                            );
                        }
                    }
                }
                ChurnAction::Crash(ids) => {
                    for id in ids {
                        if let Some(p) = workers.get_mut(id) {
                            signal(p, Signal::SIGKILL);
                            launch_events.push(
                                EventRow::new(at, EventKind::Crash)
                                    .node(name(id))
                                    .detail("SIGKILL"),
                            );
                        }
                    }
                }
                ChurnAction::Leave(ids) => {
                    for id in ids {
                        if let Some(p) = workers.get_mut(id) {
                            signal(p, Signal::SIGTERM);
                        }
                    }
                }
                ChurnAction::Hang(ids) => {
                    for id in ids {
                        if let Some(p) = workers.get_mut(id) {
                            hung.insert(*id);
                            signal(p, Signal::SIGSTOP);
                            launch_events.push(
                                EventRow::new(at, EventKind::Hang).node(name(id)).detail("SIGSTOP"),
                            );
                        }
                    }
                }
                ChurnAction::Resume(ids) => {
                    for id in ids {
                        if let Some(p) = workers.get_mut(id) {
                            hung.remove(id);
                            signal(p, Signal::SIGCONT);
                        }
                    }
                }
                ChurnAction::CoordinatorCrash => {
                    signal(&mut coord, Signal::SIGKILL);
                    launch_events
                        .push(EventRow::new(at, EventKind::CoordinatorCrash).detail("SIGKILL"));
                }
                other => {
                    tracing::info!(
                        "the real backend on one machine ignores {other:?} (network faults are the simulator's)"
                    );
                }
            }
        }
        for p in workers.values_mut() {
            if p.stopped {
                continue;
            }
            if let Some(status) = p.child.try_wait()? {
                p.stopped = true;
                // A worker that failed on its own (not a signal of the churn) is an error.
                if status.code().is_some_and(|c| c != 0) {
                    eprintln!("loco: worker {} failed ({status}); see its log above", p.name);
                    failures.push(p.name.clone());
                }
            }
        }
        if coord.child.try_wait()?.is_some() {
            coord.stopped = true;
        }
        let all_workers_done = workers.values().all(|p| p.stopped);
        if coord.stopped && all_workers_done {
            break;
        }
        let joins_ahead = timeline[next..]
            .iter()
            .any(|(_, a, _)| matches!(a, ChurnAction::Join(_) | ChurnAction::Restart(_)));
        if all_workers_done && !coord.stopped && !joins_ahead {
            eprintln!("loco: every worker has stopped and none is due to start; ending the run");
            signal(&mut coord, nix::sys::signal::Signal::SIGTERM);
            std::thread::sleep(Duration::from_secs(1));
            break;
        }
        if coord.stopped && !all_workers_done {
            // A process this launch stopped (hang) cannot stop on its own: let it run again.
            for id in std::mem::take(&mut hung) {
                if let Some(p) = workers.get_mut(&id) {
                    signal(p, nix::sys::signal::Signal::SIGCONT);
                }
            }
            // The coordinator is gone: members stop on their own within the coordinator timeout.
            let grace = s.mesh().coordinator_timeout + Duration::from_secs(10);
            let deadline = unix_now() + grace.as_secs_f64();
            while unix_now() < deadline
                && workers.values_mut().any(|p| matches!(p.child.try_wait(), Ok(None)))
            {
                std::thread::sleep(Duration::from_millis(100));
            }
            break;
        }
        if limit.is_some_and(|l| elapsed > l) {
            eprintln!("loco: the run exceeded its time limit; stopping it");
            signal(&mut coord, nix::sys::signal::Signal::SIGTERM);
            std::thread::sleep(Duration::from_secs(3));
            break;
        }
        if progress {
            let steps = count_commits(&nodes_dir.join("coordinator.jsonl"));
            eprint!("\rloco: {:>6.1}s, {steps} outer steps committed   ", elapsed.as_secs_f64());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if progress {
        eprintln!();
    }
    for p in workers.values_mut().chain(std::iter::once(&mut coord)) {
        if matches!(p.child.try_wait(), Ok(None)) {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }
    let wall = unix_now() - run_start;
    finish(&s, &out, &nodes_dir, launch_events, wall, &failures)
}

/// Whether a worker has written its start event (it is up and about to join).
fn worker_started(nodes_dir: &Path, name: &str) -> bool {
    read_lines(&nodes_dir.join(format!("{name}.jsonl"))).is_ok_and(|l| {
        l.iter().any(|x| matches!(x, MetricsLine::Event(e) if e.kind == EventKind::Start))
    })
}

fn count_commits(path: &Path) -> usize {
    std::fs::read_to_string(path).map(|t| t.matches("committed").count()).unwrap_or(0)
}

fn check_memory(s: &Scenario) -> Result<()> {
    use loco_real::memory::{MemoryPlan, Place, host_available_bytes};
    let seq = s.real().seq_len.unwrap_or(s.model().seq_len);
    let plan =
        MemoryPlan::new(s.model(), s.real().device, s.real().micro_batch, seq, s.real().precision);
    let nodes = s.initial_nodes().count().max(1) as u64;
    if let Some(avail) = host_available_bytes() {
        let need = plan.total(Place::Host).saturating_mul(nodes);
        if need > avail {
            let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
            return Err(InputError(anyhow!(
                "{}: {} processes of this model need {:.1} GiB, and this machine has {:.1} GiB \
                 available; nothing was started. Each process: {}",
                s.name(),
                nodes,
                gib(need),
                gib(avail),
                plan.describe(Place::Host),
            ))
            .into());
        }
    }
    Ok(())
}

fn read_lines(path: &Path) -> Result<Vec<MetricsLine>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    // A process killed mid-write may leave a torn last line: skip lines that do not parse.
    Ok(text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect())
}

/// Merges the processes' metrics, checks the invariants, writes the run directory.
fn finish(
    s: &Scenario,
    out: &Path,
    nodes_dir: &Path,
    mut events: Vec<EventRow>,
    wall: f64,
    failures: &[String],
) -> Result<bool> {
    let mut rows: Vec<OuterStepRow> = Vec::new();
    let mut peaks: BTreeMap<String, u64> = BTreeMap::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(nodes_dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    files.sort();
    for f in &files {
        for line in read_lines(f)? {
            match line {
                MetricsLine::Row(r) => rows.push(r),
                MetricsLine::Event(e) => events.push(e),
                MetricsLine::Resources { node, peak_rss_bytes } => {
                    if let Some(b) = peak_rss_bytes {
                        let p = peaks.entry(node).or_default();
                        *p = (*p).max(b);
                    }
                }
            }
        }
    }
    events.sort_by(|a, b| a.time_s.total_cmp(&b.time_s));
    // Invariant: after each outer step, every node holds the same outer weights.
    let mut by_step: BTreeMap<u64, BTreeMap<String, String>> = BTreeMap::new();
    // (An empty digest is a non-blocking joiner's step before it holds the state.)
    for r in rows.iter().filter(|r| !r.weights_hash.is_empty()) {
        by_step.entry(r.outer_step).or_default().insert(r.node.clone(), r.weights_hash.clone());
    }
    let mut violations = Vec::new();
    for (step, hashes) in &by_step {
        let distinct: std::collections::BTreeSet<&String> = hashes.values().collect();
        if distinct.len() > 1 {
            violations.push(format!("outer step {step}: replicas differ: {hashes:?}"));
        }
    }
    for name in failures {
        violations.push(format!("worker {name} failed (exit status not 0); see the log"));
    }
    if rows.is_empty() {
        violations.push("no outer step was committed".to_string());
    }
    let meta = RunMeta {
        scenario: s.name().to_string(),
        seed: s.seed(),
        backend: "real".into(),
        wall_seconds: wall,
        published: None,
        inner_steps_per_outer: Some(s.diloco().inner_steps),
        // One device per worker (the real backend does not shard a node over G devices yet).
        mfu_basis: loco_core::metrics::MfuBasis::of_run(s, 1),
        violations,
        extra: BTreeMap::from([("peak_rss_bytes".to_string(), serde_json::json!(peaks))]),
    };
    let summary = summarize(&meta, &rows, &events);
    loco_reports::write_run(out, &summary, &rows, &events).map_err(|e| anyhow!(e))?;
    crate::print_summary(&summary, out);
    for (node, b) in &peaks {
        println!("peak memory         {node}: {:.0} MB resident", *b as f64 / 1e6);
    }
    Ok(summary.invariants.ok)
}
