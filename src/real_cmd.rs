//! `loco coordinator`, `loco worker` and `loco launch`: the real backend from a scenario file.

use crate::InputError;
use anyhow::{Context, Result, anyhow};
use loco_core::digest::HexOrEmpty;
use loco_core::ids::NodeId;
use loco_core::scenario::Scenario;
use loco_real::coord::{CoordinatorOptions, bind, run_coordinator};
use loco_real::exporter::Exporter;
use loco_real::http::TOKEN_ENV;
use loco_real::inner::{InnerError, InnerLoop, InnerStats, Quadratic};
use loco_real::launch::{
    LaunchError, LaunchPlan, Launcher, Notice, READY_LIMIT, Resume, StatusSender, checkpoint_plan,
    unix_now,
};
use loco_real::node::{WorkerOptions, run_worker};
use loco_real::tcp::TcpConfig;
use loco_real::train::TrainerState;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

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

/// The least entropy a secret must carry beyond loopback: one captured handshake lets anyone
/// guess at it offline, as fast as they can compute.
const SECRET_BITS: f64 = 128.0;

/// The most entropy `secret` can carry, judged as a guesser would: its length times the bits of
/// the smallest usual alphabet its characters come from (hex digits 4, letters and digits 5.95,
/// base64's 6, printable ASCII 6.57, other bytes 8); a secret of fewer distinct characters than
/// half of what a random one of its length would show is judged by those alone (40 characters
/// of two kinds carry 40 bits).
fn secret_bits(secret: &[u8]) -> f64 {
    let all = |f: fn(&u8) -> bool| secret.iter().all(f);
    let alphabet: f64 = if all(u8::is_ascii_hexdigit) {
        16.0
    } else if all(u8::is_ascii_alphanumeric) {
        62.0
    } else if all(|b| b.is_ascii_alphanumeric() || b"+/=-_".contains(b)) {
        64.0
    } else if all(|b| b.is_ascii_graphic() || *b == b' ') {
        95.0
    } else {
        256.0
    };
    let distinct = secret.iter().collect::<std::collections::BTreeSet<_>>().len() as f64;
    let len = secret.len() as f64;
    let per_char = if distinct < alphabet.min(len) / 2.0 { distinct } else { alphabet };
    len * per_char.max(1.0).log2()
}

/// A process that listens where other machines may reach it needs the run's secret: without one
/// anyone who reaches the address could join the run, or read and alter its traffic; with a
/// weak one a captured handshake gives it away. Refuses to start, saying how to give one.
fn require_secret(s: &Scenario, path: &Path, listen: std::net::SocketAddr) -> Result<()> {
    let var = &s.real().secret_env;
    let strong = format!("`export {var}=$(head -c 32 /dev/urandom | base64)`");
    if listen.ip().is_loopback() {
        return Ok(());
    }
    if let Some(k) = secret(s) {
        let bits = secret_bits(&k);
        if bits >= SECRET_BITS {
            return Ok(());
        }
        return Err(InputError(anyhow!(
            "{}: refusing to listen on {listen} with a weak run secret: it carries at most \
             {bits:.0} bits ({} characters), and one captured handshake lets anyone guess it \
             offline; at least {SECRET_BITS:.0} bits are needed beyond loopback (32 random hex \
             digits, 22 of base64). Give every process the same strong secret in {var} (for \
             example {strong}) or in `[real] secret`",
            path.display(),
            k.len()
        ))
        .into());
    }
    Err(InputError(anyhow!(
        "{}: refusing to listen on {listen} without a run secret: anyone who reaches that \
         address could join the run, or read and alter its traffic. Give every process of the \
         run the same secret in the environment variable {var} (for example {strong} here, and \
         the same value on the other machines), or set `[real] secret` in the scenario \
         (`loco launch` makes one for its own processes)",
        path.display()
    ))
    .into())
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

/// The transport of a run's processes: the run's secret, the congestion control the launcher
/// asks for, and connections given up after the mesh's heartbeat timeout without progress
/// (the coordinator evicts a node silent that long anyway), so that a partition's heal is
/// followed by a new connection at once rather than by TCP's backed-off retransmissions.
fn tcp_config(s: &Scenario, congestion: Option<String>) -> TcpConfig {
    TcpConfig {
        secret: secret(s),
        congestion,
        user_timeout: Some(s.mesh().heartbeat_timeout),
        ..TcpConfig::default()
    }
}

/// `loco coordinator`.
pub(crate) fn coordinator(a: &crate::cli::CoordinatorArgs) -> Result<()> {
    let s = load(&a.scenario)?;
    require_secret(&s, &a.scenario, a.listen)?;
    let root = loco_real::launch::checkpoint_root(&s, &a.scenario, None);
    let me = (NodeId::COORDINATOR, loco_real::identity::COORDINATOR_NAME);
    let keyed = crate::identity_cmd::identity(&s, &a.scenario, &a.identity, root, me, a.listen)?;
    let identity = keyed.as_ref().map(|(i, _)| i.clone());
    let names: BTreeMap<NodeId, String> =
        s.nodes().iter().map(|n| (n.id, n.name.clone())).collect();
    let opts = CoordinatorOptions {
        listen: a.listen,
        mesh: s.mesh().clone(),
        tcp: TcpConfig {
            dial_via: a.dial_via.iter().map(|&(n, addr)| (NodeId(n), addr)).collect(),
            identity,
            ..tcp_config(&s, None)
        },
        stop_outer_steps: a
            .max_outer_steps
            .or(s.stop().outer_steps)
            .map(|n| n.saturating_mul(s.diloco().rounds_per_step())),
        stop_time: s.stop().time,
        names,
        metrics: a.metrics.clone(),
        time_offset_s: a.run_start.map_or(0.0, |t| unix_now() - t),
        start_outer_step: a.start_step,
        exporter: None,
        lines: None,
    };
    let live = match a.http {
        Some(addr) => {
            let l = crate::live::LivePage::start(addr, &s)?;
            eprintln!("loco: live page on {}", l.url);
            Some(l)
        }
        None => None,
    };
    let lines = live.as_ref().and_then(crate::live::LivePage::sender);
    let ran = runtime()?.block_on(async {
        if let Some((i, roster)) = keyed {
            crate::identity_cmd::watch_roster(i, roster, std::sync::Arc::new(s.clone()));
        }
        let mut opts = opts;
        opts.exporter = serve_metrics(a.metrics_addr, Exporter::coordinator).await?;
        opts.lines = lines;
        let t = bind(&opts).await?;
        let addr = t.local_addr();
        eprintln!("loco: coordinator of `{}` listening on {addr}", s.name());
        if let Some(f) = &a.addr_file {
            write_atomic(f, addr.to_string().as_bytes())?;
        }
        let r = run_coordinator(opts, t, terminate_signal()).await?;
        eprintln!("loco: coordinator done: {} outer steps, {} epochs", r.outer_steps, r.epochs);
        anyhow::Ok(r)
    });
    if let Some(l) = live {
        let status = match &ran {
            Ok(r) => format!("ended: {} outer steps, {} epochs", r.outer_steps, r.epochs),
            Err(e) => format!("ended: the coordinator failed: {e}"),
        };
        l.finish(&status, None);
    }
    ran.map(|_| ())
}

/// With an address: binds it, serves `make()`'s metrics there in the background (on the
/// runtime this is called in) and says where; the exporter to feed.
async fn serve_metrics(
    addr: Option<std::net::SocketAddr>,
    make: impl FnOnce() -> Exporter,
) -> Result<Option<Exporter>> {
    let Some(addr) = addr else { return Ok(None) };
    let (listener, at) = loco_real::http::bind(addr)
        .await
        .with_context(|| format!("--metrics-addr {addr}: cannot listen there"))?;
    let token = loco_real::http::token_for(at);
    match &token {
        None => eprintln!("loco: metrics on http://{at}/metrics"),
        Some(t) => eprintln!(
            "loco: metrics on http://{at}/metrics (ask with `Authorization: Bearer {t}` or \
             ?token={t}; {TOKEN_ENV} sets it)"
        ),
    }
    let e = make();
    let site = loco_real::http::Site { exporter: Some(e.clone()), live: None, token };
    tokio::spawn(loco_real::http::serve(listener, site));
    Ok(Some(e))
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
    fn eval_loss(&mut self, weights: &[f32]) -> Result<Option<f64>, InnerError> {
        match self {
            AnyInner::Synthetic(q) => q.eval_loss(weights),
            #[cfg(feature = "torch")]
            AnyInner::Torch(t) => t.eval_loss(weights),
        }
    }
    fn begin_round(&mut self, outer_step: u64, draw: u64) {
        match self {
            AnyInner::Synthetic(q) => q.begin_round(outer_step, draw),
            #[cfg(feature = "torch")]
            AnyInner::Torch(t) => t.begin_round(outer_step, draw),
        }
    }
    fn set_gate(&mut self, gate: loco_real::inner::HangGate) {
        match self {
            AnyInner::Synthetic(q) => q.set_gate(gate),
            #[cfg(feature = "torch")]
            AnyInner::Torch(t) => t.set_gate(gate),
        }
    }
    fn export_optimizer(&self) -> Result<Vec<u8>, InnerError> {
        match self {
            AnyInner::Synthetic(q) => q.export_optimizer(),
            #[cfg(feature = "torch")]
            AnyInner::Torch(t) => t.export_optimizer(),
        }
    }
    fn max_optimizer_bytes(&self) -> u64 {
        match self {
            AnyInner::Synthetic(q) => q.max_optimizer_bytes(),
            #[cfg(feature = "torch")]
            AnyInner::Torch(t) => t.max_optimizer_bytes(),
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
        let pace = loco_core::node::synthetic::StepDraw {
            seed: s.seed(),
            node: node.id.0,
            incarnation: 0,
            outer_step: 0,
            inner_steps: s.diloco().round_steps(),
            step_time: node.step_time,
            jitter: node.step_jitter,
        };
        let q = Quadratic::new(n, s.seed(), node.id.0).paced(pace);
        return Ok(AnyInner::Synthetic(Box::new(q)));
    }
    #[cfg(feature = "torch")]
    {
        use loco_real::data::{DataLoader, DataSource, Order, Shard};
        use loco_real::inner::NodeTrainer;
        use loco_real::sharded::ShardedTrainer;
        use loco_real::train::{TrainConfig, Trainer};
        let cfg = TrainConfig::from_scenario(s.model(), s.diloco(), s.real());
        let device = loco_real::model::tch_device(s.real().device)?;
        tch::manual_seed(s.seed() as i64);
        if matches!(s.real().device, loco_core::scenario::Device::Cpu) {
            // Several workers share this machine's cores: one intra-op thread each.
            tch::set_num_threads(1);
        }
        let mut trainer = if node.gpus > 1 {
            let devices = loco_real::sharded::node_devices(s.real().device, node.gpus)?;
            NodeTrainer::Sharded(ShardedTrainer::new(s.model(), cfg.clone(), &devices, s.seed())?)
        } else {
            NodeTrainer::One(Trainer::new(s.model(), cfg.clone(), device, s.seed())?)
        };
        // `[real] init`: every node starts from the same Hugging Face weights (the worker takes
        // its initial outer weights from the trainer, so the outer state starts from them too).
        if let Some(flat) = crate::export_cmd::init_weights(s, scenario_path)? {
            trainer.set_flat_params(&flat)?;
        }
        tracing::info!(
            params = trainer.num_params(),
            device = %s.real().device,
            devices = node.gpus.max(1),
            precision = %cfg.precision,
            "model ready"
        );
        let source = DataSource::from_scenario(
            s.real().data.as_deref(),
            loco_real::launch::scenario_base(scenario_path),
            s.seed(),
        );
        let count = s.nodes().len() as u32;
        let shard = Shard::new(node.id.0 % count, count)?;
        let data =
            DataLoader::new(&source, cfg.seq_len, s.model().vocab, shard, Order::Sequential)?;
        let mut inner = loco_real::inner::TchInner::new(trainer, data);
        if s.real().eval_every > 0 {
            let rows =
                held_out_rows(&source, cfg.seq_len, s.model().vocab, s.real().eval_sequences)
                    .map_err(|e| {
                        InputError(anyhow!("{}: [real] eval_every: {e}", scenario_path.display()))
                    })?;
            inner = inner.with_held_out(rows);
        }
        Ok(AnyInner::Torch(Box::new(inner)))
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

/// The held-out rows a run evaluates on: the first `n` sequences of a prepared dataset's
/// held-out split, or, for synthetic data, `n` walks of the same chain past those it trains on.
#[cfg(feature = "torch")]
fn held_out_rows(
    source: &loco_real::data::DataSource,
    seq_len: usize,
    vocab: u32,
    n: u32,
) -> Result<Vec<i64>> {
    use loco_real::data::{DataLoader, DataPosition, DataSource, Order, Shard, Split, Synthetic};
    let whole = Shard::new(0, 1)?;
    let (mut loader, skip) = match source {
        DataSource::Synthetic(s) => {
            let past = s.sequences;
            let all = Synthetic { seed: s.seed, sequences: past + u64::from(n) };
            let all = DataSource::Synthetic(all);
            (DataLoader::new(&all, seq_len, vocab, whole, Order::Sequential)?, past)
        }
        DataSource::Prepared { dir, .. } => (
            DataLoader::prepared(dir, Split::HeldOut, seq_len, vocab, whole, Order::Sequential)?,
            0,
        ),
        DataSource::File(path) => {
            return Err(anyhow!(
                "the token file {} has no held-out split: prepare the data with `loco data \
                 prepare` and point [real] data at its directory",
                path.display()
            ));
        }
    };
    loader.seek(DataPosition { epoch: 0, offset: skip })?;
    let rows = u64::from(n).min(loader.per_epoch() - skip) as usize;
    Ok(loader.next_batch(rows)?)
}

/// `loco worker`.
/// How much longer than the launcher's [`READY_LIMIT`] a worker waits at the start gate.
const GATE_SLACK: Duration = Duration::from_secs(30);

pub(crate) fn worker(a: &crate::cli::WorkerArgs) -> Result<()> {
    let s = load(&a.scenario)?;
    require_secret(&s, &a.scenario, a.listen)?;
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
    let root = loco_real::launch::checkpoint_root(&s, &a.scenario, a.checkpoint_dir.as_deref());
    let me = (node.id, node.name.as_str());
    let keyed = crate::identity_cmd::identity(&s, &a.scenario, &a.identity, root, me, a.listen)?;
    let identity = keyed.as_ref().map(|(i, _)| i.clone());
    // A node whose devices cannot hold its plan stops here, with the plan (where nvidia-smi
    // tells the devices' memory).
    if a.synthetic_params.is_none() {
        loco_real::launch::check_devices(&s, &node).map_err(|e| InputError(e.into()))?;
    }
    // A launcher's status channel, when a launcher started this process (none by hand).
    let status = StatusSender::from_env();
    let inner = match make_inner(&s, &a.scenario, &node, a.synthetic_params) {
        Ok(i) => i,
        Err(e) => {
            if let Some(st) = &status {
                st.stopped(&format!("failed: {e:#}"), 0, None);
            }
            return Err(e);
        }
    };
    if let Some(st) = &status {
        st.ready();
    }
    let join_at = match &a.start_gate {
        // The launcher opens it at most READY_LIMIT after the launch.
        Some(gate) => match loco_real::launch::gate::wait(gate, READY_LIMIT + GATE_SLACK) {
            Ok(t) => Some(t),
            Err(e) => {
                if let Some(st) = &status {
                    st.stopped(&format!("failed: {e}"), 0, None);
                }
                return Err(e.into());
            }
        },
        None => a.join_at,
    };
    if let Some(t) = join_at {
        // Started early (loading libtorch and building the model take a while, and not equally
        // long for every process): wait for the scenario's time to ask to join, at most 60 s.
        // Before the options: the metrics' time base and the faults' clock start after it.
        let wait = (t - unix_now()).clamp(0.0, 60.0);
        std::thread::sleep(Duration::from_secs_f64(wait));
    }
    let opts = WorkerOptions {
        scenario: std::sync::Arc::new(s.clone()),
        id: node.id,
        incarnation: a.incarnation,
        coordinator: a.coordinator,
        listen: a.listen,
        tcp: TcpConfig {
            dial_via: a.dial_via.iter().map(|&(n, addr)| (NodeId(n), addr)).collect(),
            identity,
            ..tcp_config(&s, a.congestion.clone())
        },
        metrics: a.metrics.clone(),
        time_offset_s: a.run_start.map_or(0.0, |t| unix_now() - t),
        checkpoint: checkpoint_plan(&s, &a.scenario, a.checkpoint_dir.as_deref(), &node.name),
        resume: a.resume.clone(),
        faults: a.crash_during.clone(),
        status: status.clone(),
        exporter: None,
        hang: a
            .control_stdin
            .then(|| loco_real::node::hang_commands(std::io::BufReader::new(std::io::stdin()))),
    };
    let round_steps = s.diloco().round_steps();
    let report = runtime()?.block_on(async {
        if let Some((i, roster)) = keyed {
            crate::identity_cmd::watch_roster(i, roster, std::sync::Arc::new(s.clone()));
        }
        let mut opts = opts;
        opts.exporter =
            serve_metrics(a.metrics_addr, || Exporter::worker(&node.name, round_steps)).await?;
        anyhow::Ok(run_worker(opts, inner, terminate_signal()).await)
    })?;
    if let Some(st) = &status {
        match &report {
            Ok(r) => st.stopped(&r.stop.to_string(), r.committed, r.weights_hash),
            Err(e) => st.stopped(&format!("failed: {e}"), 0, None),
        }
    }
    let report = report?;
    eprintln!(
        "loco: worker {} stopped: {} ({} outer steps, weights {})",
        node.name,
        report.stop,
        report.committed,
        HexOrEmpty(&report.weights_hash)
    );
    Ok(())
}

/// The scenario format's network mode of `--network`.
pub(crate) fn network_mode(n: crate::cli::NetworkArg) -> loco_core::scenario::NetworkMode {
    use loco_core::scenario::NetworkMode;
    match n {
        crate::cli::NetworkArg::Auto => NetworkMode::Auto,
        crate::cli::NetworkArg::Emulated => NetworkMode::Emulated,
        crate::cli::NetworkArg::Relay => NetworkMode::Relay,
        crate::cli::NetworkArg::Loopback => NetworkMode::Loopback,
    }
}

/// `loco launch`: the library's launcher, its notices on stderr, its record written to the run
/// directory and summarised on stdout.
pub(crate) fn launch(a: &crate::cli::LaunchArgs) -> Result<bool> {
    let s = load(&a.scenario)?;
    let out = a.out.clone().unwrap_or_else(|| PathBuf::from("out").join(s.name()));
    if a.synthetic_params.is_none() {
        // A `[real] init` that does not fit the model stops here, once, not in every worker.
        crate::export_cmd::check_init(&s, &a.scenario)?;
    }
    let plan = LaunchPlan {
        max_outer_steps: a.max_outer_steps,
        synthetic_params: a.synthetic_params,
        timeout: a.timeout.map(Duration::from_secs),
        resume: match (a.resume, a.resume_step) {
            (_, Some(k)) => Some(Resume::Step(k)),
            (true, None) => Some(Resume::Newest),
            (false, None) => None,
        },
        checkpoint_dir: a.checkpoint_dir.clone(),
        network: a.network.map(network_mode),
        ..LaunchPlan::new(s, a.scenario.clone(), std::env::current_exe()?, out.clone())
    };
    let live = match a.http {
        Some(addr) => {
            let l = crate::live::LivePage::start(addr, &plan.scenario)?;
            eprintln!("loco: live page on {}", l.url);
            Some(l)
        }
        None => None,
    };
    let progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let mut shown = false;
    let mut launcher = Launcher::new(plan);
    if let Some(l) = &live {
        launcher = launcher.on_metrics(|line| l.line(line));
    }
    let outcome = launcher
        .on_notice(|n| match n {
            Notice::Progress { .. } => {
                if progress {
                    shown = true;
                    eprint!("\rloco: {n}   ");
                }
            }
            Notice::ClockStarted { .. } => tracing::info!("{n}"),
            n => eprintln!("loco: {n}"),
        })
        .run();
    if shown {
        eprintln!();
    }
    if let Some(l) = live {
        let record = outcome.as_ref().ok().map(|o| loco_reports::Run {
            dir: out.clone(),
            summary: o.summary.clone(),
            rows: o.rows.clone(),
            events: o.events.clone(),
        });
        let status = format!("ended: the report is {}", out.join("report.html").display());
        l.finish(&status, record);
    }
    let outcome = outcome.map_err(|e| match e {
        LaunchError::DoesNotFit { .. }
        | LaunchError::Network(loco_real::wan::WanError::Unavailable { .. })
        | LaunchError::NoCheckpointDir { .. }
        | LaunchError::NoCommonCheckpoint { .. } => InputError(anyhow!(e)).into(),
        e => anyhow!(e),
    })?;
    loco_reports::write_run(&out, &outcome.summary, &outcome.rows, &outcome.events)
        .map_err(|e| anyhow!(e))?;
    crate::print_summary(&outcome.summary, &out);
    for (node, b) in &outcome.peak_rss_bytes {
        println!("peak memory         {node}: {:.0} MB resident", *b as f64 / 1e6);
    }
    Ok(outcome.ok())
}

#[cfg(test)]
mod tests {
    use super::{SECRET_BITS, secret_bits};

    /// What a guesser would try first carries few bits; random bytes written out carry many.
    #[test]
    fn a_secret_is_judged_by_its_alphabet_length_and_variety() {
        let weak: [&[u8]; 6] = [
            b"a run secret",
            b"fault-suite secret",
            b"password1234567890",
            b"0123456789abcdef0123456789abcde",
            b"abababababababababababababababababababab",
            b"",
        ];
        for k in weak {
            assert!(
                secret_bits(k) < SECRET_BITS,
                "{:?}: {}",
                String::from_utf8_lossy(k),
                secret_bits(k)
            );
        }
        let strong: [&[u8]; 3] = [
            b"3f9a0c7e51b2d4861a0f3e9c7b5d2a41",
            b"q8Zr2LmX0vYp4TnW7sKd1A",
            b"correct horse battery staple, with more words to it",
        ];
        for k in strong {
            assert!(
                secret_bits(k) >= SECRET_BITS,
                "{:?}: {}",
                String::from_utf8_lossy(k),
                secret_bits(k)
            );
        }
    }
}
