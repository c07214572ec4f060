//! The `loco` command-line tool.

/// mimalloc keeps freed pages for reuse: the all-reduce allocates a frame buffer per segment,
/// and the system allocator returned each to the kernel and faulted it back in.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod bench;
mod churn_cmd;
mod cli;
mod clock;
mod data_cmd;
mod export_cmd;
mod fidelity_cmd;
mod human;
mod identity_cmd;
mod live;
mod net_cmd;
mod plan;
mod real_cmd;
mod replay;

use anyhow::Result;
use clap::Parser;
use cli::{BenchCommand, Cli, Command};
use std::io::Write;
use std::process::ExitCode;

/// How a command ended, mapped to the exit code in one place.
enum Outcome {
    /// Everything held: exit 0.
    Success,
    /// The run finished but an invariant broke: exit 1.
    InvariantsBroken,
}

/// An error in the user's input (file, field, flag): exit 2.
#[derive(Debug)]
struct InputError(anyhow::Error);

impl std::fmt::Display for InputError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#}", self.0)
    }
}

impl std::error::Error for InputError {}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log.as_deref());
    match run(cli) {
        Ok(Outcome::Success) => ExitCode::SUCCESS,
        Ok(Outcome::InvariantsBroken) => ExitCode::from(1),
        Err(e) => {
            if is_broken_pipe(&e) {
                return ExitCode::SUCCESS;
            }
            eprintln!("loco: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

fn init_logging(filter: Option<&str>) {
    use tracing_subscriber::EnvFilter;
    let filter = filter
        .map(EnvFilter::new)
        .or_else(|| EnvFilter::try_from_env("LOCO_LOG").ok())
        .unwrap_or_else(|| EnvFilter::new("warn"));
    let _ =
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

fn run(cli: Cli) -> Result<Outcome> {
    match cli.command {
        Command::Churn(a) => churn_cmd::print(&a)?,
        Command::Data(cli::DataCommand::Prepare(a)) => data_cmd::prepare(&a)?,
        Command::Export(a) => export_cmd::export(&a)?,
        Command::Plan(a) => {
            let report = plan::command(&a)?;
            print_report(a.json, &report, |out| report.print_table(out))?;
        }
        Command::Replay(a) => {
            if !replay::replay(&a)? {
                return Ok(Outcome::InvariantsBroken);
            }
        }
        Command::Bench(b) => return bench_cmd(b),
        Command::Launch(a) => {
            if !real_cmd::launch(&a)? {
                return Ok(Outcome::InvariantsBroken);
            }
        }
        Command::Fidelity(a) => {
            if !fidelity_cmd::fidelity(&a)? {
                return Ok(Outcome::InvariantsBroken);
            }
        }
        Command::Net(cli::NetCommand::Check(a)) => {
            if !net_cmd::check(&a)? {
                return Ok(Outcome::InvariantsBroken);
            }
        }
        Command::Coordinator(a) => real_cmd::coordinator(&a)?,
        Command::Worker(a) => real_cmd::worker(&a)?,
        Command::Keygen(a) => identity_cmd::keygen(&a)?,
        Command::Report(a) => {
            let rendered = loco_reports::render(&a.dirs).map_err(|e| InputError(e.into()))?;
            for r in &rendered.reports {
                println!("report: {}", r.display());
            }
            if let Some(c) = &rendered.comparison {
                println!("comparison: {}", c.display());
            }
        }
    }
    Ok(Outcome::Success)
}

/// Runs a `loco bench` subcommand.
fn bench_cmd(command: BenchCommand) -> Result<Outcome> {
    match command {
        BenchCommand::Sim(a) => bench_sim(a)?,
        BenchCommand::Codec(a) => bench_codec(a)?,
        BenchCommand::Allreduce(a) => bench_allreduce(a)?,
        BenchCommand::Outer(a) => bench_outer(a)?,
        BenchCommand::Handshake(a) => bench::handshake::run(&a)?,
        BenchCommand::AllreduceRank(a) => {
            let r = bench::allreduce::run_rank(&a)?;
            println!("{}", serde_json::to_string(&r)?);
        }
        BenchCommand::Recovery(a) => bench_recovery(a)?,
        BenchCommand::RecoveryNode(a) => {
            let r = bench::recovery::run_node(&a)?;
            println!("{}", serde_json::to_string(&r)?);
        }
        BenchCommand::Data(a) => {
            let report = bench::data::run(&a)?;
            print_report(a.json, &report, |out| report.print_table(out))?;
        }
        BenchCommand::Train(a) if a.plan => {
            let report = bench::train::plan(&a)?;
            print_report(a.json, &report, |out| report.print_table(out))?;
        }
        BenchCommand::Train(a) => {
            let report = bench::train::run(&a)?;
            print_report(a.json, &report, |out| report.print_table(out))?;
        }
        BenchCommand::Quality(a) => {
            let report = bench::quality::run(&a)?;
            print_report(a.json, &report, |out| report.print_table(out))?;
            if !report.claims_hold() {
                return Ok(Outcome::InvariantsBroken);
            }
        }
    }
    Ok(Outcome::Success)
}

/// `loco bench sim`: the simulator's speed on a scenario.
fn bench_sim(a: cli::SimBench) -> Result<()> {
    let mut s = replay::scenario_or_default(a.scenario.as_deref())?;
    if let Some(e) = a.executor {
        s.set_executor(e);
    }
    if let Some(c) = a.collectives {
        s.set_collectives(c);
    }
    let f = loco_sim::bench(&s, a.hours).map_err(|e| anyhow::anyhow!(e))?;
    print_report(a.json, &f, |out| {
        writeln!(out, "simulator: {}", f.scenario)?;
        writeln!(
            out,
            "  simulated        {:.0} s ({:.1} h), {} outer steps",
            f.simulated_seconds,
            f.simulated_seconds / 3600.0,
            f.outer_steps
        )?;
        writeln!(out, "  wall             {:.2} s", f.wall_seconds)?;
        writeln!(
            out,
            "  speed            {:.0} simulated s per wall s",
            f.simulated_per_wall_second
        )?;
        writeln!(
            out,
            "  24 h would take  {:.1} s",
            86_400.0 / f.simulated_per_wall_second.max(1e-9)
        )?;
        writeln!(out, "  nodes            {}", f.nodes)?;
        if f.executor == loco_core::scenario::ExecutorKind::Events {
            writeln!(
                out,
                "  frames, events   {}, {} (event executor, {} all-reduces)",
                f.frames, f.events, f.collectives
            )?;
        } else {
            writeln!(
                out,
                "  frames, ticks    {}, {} (turmoil, tick {} s)",
                f.frames, f.ticks, f.tick_seconds
            )?;
        }
        match f.peak_rss_bytes {
            Some(b) => writeln!(out, "  peak memory      {:.1} MB resident", b as f64 / 1e6)?,
            None => writeln!(out, "  peak memory      unknown")?,
        }
        writeln!(out, "  invariants       {}", if f.invariants_ok { "ok" } else { "BROKEN" })
    })?;
    Ok(())
}

/// `loco bench codec`: each codec's speed.
fn bench_codec(a: cli::CodecBench) -> Result<()> {
    let threads = a
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
    let codecs =
        if a.codec.is_empty() { loco_core::codec::CodecKind::ALL.to_vec() } else { a.codec };
    let report = bench::codec::run(&bench::codec::CodecBenchArgs {
        elements: a.elements,
        codecs,
        threads,
        repeats: a.repeats.max(1),
        seed: a.seed,
    })?;
    print_report(a.json, &report, |out| report.print_table(out))?;
    Ok(())
}

/// `loco bench allreduce`: one all-reduce, in memory or over TCP.
fn bench_allreduce(a: cli::AllreduceBench) -> Result<()> {
    let args = bench::allreduce::AllreduceBenchArgs {
        world: a.world,
        elements: a.elements,
        codec: a.codec,
        segment: a.segment,
        seed: a.seed,
        repeat: a.repeat,
    };
    if a.world == 0 || a.segment == 0 || a.repeat == 0 {
        let flag = match (a.world, a.segment) {
            (0, _) => "--world",
            (_, 0) => "--segment",
            _ => "--repeat",
        };
        return Err(InputError(anyhow::anyhow!("{flag}: expected at least 1")).into());
    }
    let report = match a.backend {
        cli::BenchBackend::Memory => {
            if a.repeat > 1 {
                tracing::warn!("--repeat applies to --backend tcp; the memory backend runs once");
            }
            bench::allreduce::run(&args)?
        }
        cli::BenchBackend::Tcp => bench::allreduce::run_tcp(&args, a.streams, a.secure)?,
    };
    print_report(a.json, &report, |out| report.print_table(out))?;
    Ok(())
}

/// `loco bench outer`: the outer step's work, with a progress bar on a terminal.
fn bench_outer(a: cli::OuterBench) -> Result<()> {
    for (flag, v) in [("--params", a.params), ("--repeats", a.repeats)] {
        if v == 0 {
            return Err(InputError(anyhow::anyhow!("{flag}: expected at least 1")).into());
        }
    }
    let args = bench::outer::OuterBenchArgs {
        params: a.params,
        repeats: a.repeats,
        seed: a.seed,
        shards: a.shards,
    };
    let bar = std::io::IsTerminal::is_terminal(&std::io::stderr()).then(|| {
        let b = indicatif::ProgressBar::new(5);
        b.set_style(
            indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        b
    });
    let report = bench::outer::run(&args, |name| {
        if let Some(b) = &bar {
            if !b.message().is_empty() {
                b.inc(1);
            }
            b.set_message(format!("{name}, {} params", a.params));
        }
    })?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    print_report(a.json, &report, |out| report.print_table(out))?;
    Ok(())
}

/// `loco bench recovery`: a state transfer to a recovering node.
fn bench_recovery(a: cli::RecoveryBench) -> Result<()> {
    let args = bench::recovery::RecoveryBenchArgs {
        bytes: a.bytes,
        senders: a.senders,
        streams: a.streams,
        secure: a.secure,
        cold: a.cold,
        scenario: a.scenario.as_deref().map(real_cmd::load).transpose()?,
    };
    if a.senders == 0 || a.streams == 0 || a.bytes < 8 {
        let (flag, what) = match (a.senders, a.streams) {
            (0, _) => ("--senders", "at least 1"),
            (_, 0) => ("--streams", "at least 1"),
            _ => ("--bytes", "at least 8 bytes"),
        };
        return Err(InputError(anyhow::anyhow!("{flag}: expected {what}")).into());
    }
    if let Some(s) = &args.scenario {
        bench::recovery::check_emulated(s, a.senders).map_err(InputError)?;
    }
    let report = bench::recovery::run(&args)?;
    print_report(a.json, &report, |out| report.print_table(out))?;
    Ok(())
}

/// Prints the end-of-run table and where the files are.
pub(crate) fn print_summary(s: &loco_core::metrics::Summary, dir: &std::path::Path) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "scenario            {} ({} backend, seed {})",
        s.scenario, s.backend, s.seed
    );
    let d = &s.diloco;
    let fragments = u64::from(d.fragments.max(1));
    let rounds = d.rounds_per_step.max(fragments);
    let merged = if rounds > fragments {
        format!(", each average merged {} inner steps into the next round", d.sync_delay)
    } else {
        String::new()
    };
    use loco_core::diloco::Mode;
    match d.mode {
        Mode::Streaming => {
            let _ = writeln!(
                out,
                "outer steps         {} rounds of streaming DiLoCo ({fragments} fragments, {rounds} rounds per outer step{merged})",
                s.outer_steps
            );
        }
        Mode::Overlap if rounds > 1 => {
            let _ = writeln!(
                out,
                "outer steps         {} rounds of overlapped DiLoCo ({rounds} rounds per outer step{merged})",
                s.outer_steps
            );
        }
        Mode::Overlap => {
            let _ = writeln!(
                out,
                "outer steps         {} (overlap: each all-reduce beside the next step's compute)",
                s.outer_steps
            );
        }
        Mode::Sync => {
            let _ = writeln!(out, "outer steps         {}", s.outer_steps);
        }
    }
    if s.wall_seconds > 0.0 {
        let _ = writeln!(
            out,
            "run time            {:.1} s (wall {:.1} s)",
            s.simulated_seconds, s.wall_seconds
        );
    } else {
        let _ = writeln!(
            out,
            "simulated time      {:.1} s ({:.2} h)",
            s.simulated_seconds,
            s.simulated_seconds / 3600.0
        );
    }
    let u = &s.utilization;
    let _ = writeln!(
        out,
        "utilisation         {:.1}% (compute / wall; Table 2's inner / (inner + all-reduce): {:.1}%)",
        100.0 * u.mean,
        100.0 * u.table2
    );
    let a = &s.allreduce_seconds;
    let _ = writeln!(
        out,
        "all-reduce          median {}, p5 {}, p95 {} ({} all-reduces)",
        human::seconds(a.median),
        human::seconds(a.p5),
        human::seconds(a.p95),
        a.count
    );
    let _ = writeln!(
        out,
        "bytes sent          {} ({} bytes)",
        human::bytes(s.bytes_sent_total),
        s.bytes_sent_total
    );
    if let Some(t) = s.tokens_per_second {
        let step = s
            .inner_step_seconds
            .map(|st| format!(", inner step {}", human::seconds(st)))
            .unwrap_or_default();
        let _ = writeln!(out, "throughput          {} tokens/s{step}", human::rate(t));
    }
    if let Some(m) = s.mfu {
        let _ = writeln!(out, "MFU                 {:.1}%", 100.0 * m);
    }
    let m = &s.membership;
    let _ = writeln!(
        out,
        "membership          max {}, {}, {}, {}, {}",
        human::count(m.max_nodes.into(), "node"),
        human::count(m.joins, "join"),
        human::count(m.leaves, "leave"),
        human::count(m.evictions, "eviction"),
        human::count(m.epochs, "epoch")
    );
    if let Some(l) = s.final_loss {
        let _ = writeln!(out, "final loss          {l:.4}");
    }
    if let Some(l) = s.final_eval_loss {
        let _ = writeln!(out, "held-out loss       {l:.4} (perplexity {:.2})", l.exp());
    }
    if s.invariants.ok {
        let _ = writeln!(out, "invariants          ok");
    } else {
        let _ = writeln!(out, "invariants          BROKEN");
        for v in &s.invariants.violations {
            let _ = writeln!(out, "  - {v}");
        }
    }
    let _ = writeln!(out, "report              {}", dir.join("report.html").display());
}

fn print_report<T: serde::Serialize>(
    json: bool,
    report: &T,
    table: impl FnOnce(&mut std::io::StdoutLock<'_>) -> std::io::Result<()>,
) -> Result<()> {
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer_pretty(&mut out, report)?;
        writeln!(out)?;
    } else {
        table(&mut out)?;
    }
    out.flush()?;
    Ok(())
}
