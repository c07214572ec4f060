//! The `loco` command-line tool.

mod bench;
mod cli;
mod clock;

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
        c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

fn init_logging(filter: Option<&str>) {
    use tracing_subscriber::EnvFilter;
    let filter = filter
        .map(EnvFilter::new)
        .or_else(|| EnvFilter::try_from_env("LOCO_LOG").ok())
        .unwrap_or_else(|| EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

fn run(cli: Cli) -> Result<Outcome> {
    match cli.command {
        Command::Report(a) => {
            let rendered = loco_reports::render(&a.dirs).map_err(|e| InputError(e.into()))?;
            for r in &rendered.reports {
                println!("report: {}", r.display());
            }
            if let Some(c) = &rendered.comparison {
                println!("comparison: {}", c.display());
            }
        }
        Command::Bench(BenchCommand::Codec(a)) => {
            let threads = a.threads.unwrap_or_else(|| {
                std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
            });
            let codecs = if a.codec.is_empty() { loco_core::codec::CodecKind::ALL.to_vec() } else { a.codec };
            let report = bench::codec::run(&bench::codec::CodecBenchArgs {
                elements: a.elements,
                codecs,
                threads,
                repeats: a.repeats.max(1),
                seed: a.seed,
            })?;
            print_report(a.json, &report, |out| report.print_table(out))?;
        }
        Command::Bench(BenchCommand::Allreduce(a)) => {
            let args = bench::allreduce::AllreduceBenchArgs {
                world: a.world,
                elements: a.elements,
                codec: a.codec,
                segment: a.segment,
                seed: a.seed,
            };
            if a.world == 0 || a.segment == 0 {
                let flag = if a.world == 0 { "--world" } else { "--segment" };
                return Err(InputError(anyhow::anyhow!("{flag}: expected at least 1")).into());
            }
            let report = match a.backend {
                cli::BenchBackend::Memory => bench::allreduce::run(&args)?,
                cli::BenchBackend::Tcp => bench::allreduce::run_tcp(&args, a.streams)?,
            };
            print_report(a.json, &report, |out| report.print_table(out))?;
        }
        Command::Bench(BenchCommand::AllreduceRank(a)) => {
            let r = bench::allreduce::run_rank(&a)?;
            println!("{}", serde_json::to_string(&r)?);
        }
    }
    Ok(Outcome::Success)
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
