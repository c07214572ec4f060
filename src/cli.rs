//! Command-line types (clap derive). No logic here: `main.rs` dispatches.

use clap::{Args, Parser, Subcommand, ValueEnum};
use loco_core::codec::CodecKind;
use loco_core::scenario::{Device, Precision, Preset};
use std::path::PathBuf;

mod data;
mod quality;
pub(crate) use data::{DataBench, DataCommand, PrepareArgs};
pub(crate) use quality::QualityBench;

/// loco: elastic, decentralised DiLoCo training.
///
/// Replay a churning, intercontinental training run in a deterministic simulator, read its
/// utilisation report, and run real training from the same scenario file.
#[derive(Debug, Parser)]
#[command(name = "loco", version, about, long_about)]
pub(crate) struct Cli {
    /// Log filter (e.g. `info`, `loco_sim=debug`); the LOCO_LOG environment variable also works.
    #[arg(long, global = true, value_name = "FILTER")]
    pub(crate) log: Option<String>,

    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Replay a scenario in the deterministic simulator: membership, churn, bandwidth and
    /// compute of every node, fast and reproducibly. Writes summary.json, outer_steps.csv,
    /// events.csv, the plots and report.html into DIR. Exit 0 when every invariant held, 1 when
    /// one broke (summary.json says which), 2 on bad input.
    Replay(ReplayArgs),
    /// Run a scenario on real processes on this machine: a coordinator and the scenario's
    /// workers, training the scenario's model (libtorch), with its churn played by real signals
    /// (SIGKILL, SIGTERM; SIGSTOP for a coordinator pause), in-process commands (a hang) and
    /// new processes. The processes talk kernel TCP
    /// through the scenario's links, emulated (each in a network namespace of its own, its
    /// packets delayed and dropped as the links would, partitions and degrades included), where
    /// this machine allows it (root); else through userspace relays that shape each directed
    /// link, as the run says. Writes the same files as `replay` into DIR.
    Launch(LaunchArgs),
    /// Run the coordinator of a real run (workers connect to it).
    Coordinator(CoordinatorArgs),
    /// Run one worker of a real run.
    Worker(WorkerArgs),
    /// Make a node's key for a run across machines: writes the private key (mode 0600) and
    /// prints the node's line for the run's roster (`[real] roster`), which binds each node id
    /// to a key at every handshake. With --public, prints the line of an existing key.
    Keygen(crate::identity_cmd::KeygenArgs),
    /// Redraw the report (report.html, plots, CSV summaries) of finished runs from their
    /// metrics files. With several directories, also a side-by-side Table-2-style comparison
    /// (comparison.html, comparison.csv) in the first.
    Report(ReportArgs),
    /// Training data: `loco data prepare` tokenizes text into the shards that real training
    /// reads (`[real] data = "DIR"`); see docs/data.md.
    #[command(subcommand)]
    Data(DataCommand),
    /// Performance and quality figures: codecs, the ring all-reduce, the simulator, DiLoCo's
    /// quality, and training throughput.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// The emulated network of real runs.
    #[command(subcommand)]
    Net(NetCommand),
    /// How far the simulator's predictions are from a real run: replays the scenario, launches
    /// it on real processes in its emulated network (a synthetic objective of `[sim] elements`
    /// parameters, so both backends send the same bytes), and compares them per outer step:
    /// all-reduce time, the step's wall time, utilisation, bytes and the membership story.
    /// Writes DIR/sim, DIR/real and DIR/fidelity.{csv,json,html}. Exit 0 when every figure is
    /// within the tolerance and the stories agree, 1 when not, 2 on bad input.
    Fidelity(FidelityArgs),
    /// Print a scenario's churn as both backends play it: the file's `[[churn]]`, the joins of
    /// nodes with a `start`, and the events its `[[arrivals]]` and `[[failures]]` processes
    /// and `[[diurnal]]` windows generate (expanded from the scenario's seed). With --toml, the generated events as `[[churn]]` entries, to freeze
    /// them into a file.
    Churn(ChurnArgs),
    /// Answer "which setting meets the target most cheaply?": replays a scenario over a grid of
    /// settings (a sweep file: the scenario, fixed overrides, axes of scenario fields and their
    /// values, a target utilisation, and what cheap means), in parallel over the cores, and
    /// writes a table, the frontier (no other setting both cheaper and busier) and a plot into
    /// DIR (plan.csv, plan.json, plan.svg, plan.html). Example:
    /// scenarios/sweeps/plan-volunteers.toml; the sweep format: docs/plan.md.
    Plan(PlanArgs),
    /// Write a checkpoint's outer weights (the global model) as a Hugging Face
    /// `LlamaForCausalLM` directory: config.json, model.safetensors (fp32; sharded with
    /// model.safetensors.index.json above --shard-size) and the tokenizer, for
    /// `LlamaForCausalLM.from_pretrained(DIR)`. See docs/huggingface.md.
    Export(crate::export_cmd::ExportArgs),
}

#[derive(Debug, Args)]
pub(crate) struct PlanArgs {
    /// The sweep file.
    pub(crate) sweep: PathBuf,
    /// Where to write the report (default: out/plan-<sweep file name>).
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
    /// Replays at once (default: the cores).
    #[arg(long)]
    pub(crate) jobs: Option<usize>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct ChurnArgs {
    /// The scenario file.
    pub(crate) scenario: PathBuf,
    /// Print the generated events as `[[churn]]` entries instead of a table.
    #[arg(long)]
    pub(crate) toml: bool,
}

#[derive(Debug, Args)]
pub(crate) struct FidelityArgs {
    /// The scenario file (`[sim] numerics = "real"`); none with `--random`.
    #[arg(required_unless_present = "random", conflicts_with = "random")]
    pub(crate) scenario: Option<PathBuf>,
    /// Draw N scenarios at random instead (the space: docs/fidelity.md), write each beside its
    /// results (DIR/N/scenario.toml), run both backends on each and print the distribution of
    /// the errors (median, p90, max), the share of identical membership stories and the worst
    /// scenarios. `--seed` names the draw; without it one is drawn and printed. Exit 0 when
    /// every scenario's three timing figures are within the tolerance and its runs kept their
    /// invariants.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub(crate) random: Option<u64>,
    /// Output directory (default out/<scenario name>-fidelity; with `--random`,
    /// out/fidelity-random-<seed>).
    #[arg(long, value_name = "DIR")]
    pub(crate) out: Option<PathBuf>,
    /// Stop both runs after this many outer steps.
    #[arg(long)]
    pub(crate) max_outer_steps: Option<u64>,
    /// The largest relative error that passes.
    #[arg(long, default_value_t = 0.05)]
    pub(crate) tolerance: f64,
    /// Give the real run up after this many seconds.
    #[arg(long, value_name = "SECS")]
    pub(crate) timeout: Option<u64>,
    /// The real run's network (default: emulated; the run refuses to start where it cannot
    /// be). With `relay` the simulator runs its fluid model alone (`[sim] tcp = "none"`): the
    /// relays lose no packet, so the real connections have none of the TCP dynamics the model's
    /// TCP term describes.
    #[arg(long, value_name = "MODE")]
    pub(crate) network: Option<NetworkArg>,
    /// Seed of both runs (overrides the scenario's: the links' draws, the jitter, the synthetic
    /// objective); the real run reads a copy of the scenario with it, written to DIR. With
    /// `--random`: the draw's seed.
    #[arg(long)]
    pub(crate) seed: Option<u64>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum NetCommand {
    /// Self-test of the emulated network: builds the scenario's network as `loco launch` does
    /// (needs root), then for each pair of regions times one TCP connection between two of its
    /// nodes: the rate it reaches (on the wire, over the second half of the transfer) and the
    /// median round trip of one-byte exchanges, against the figures the scenario gives. Exit 0
    /// when every link is within the tolerance, 1 when one is not, 2 on bad input or when the
    /// network cannot be built.
    Check(NetCheckArgs),
}

#[derive(Debug, Args)]
pub(crate) struct NetCheckArgs {
    /// The scenario file.
    pub(crate) scenario: PathBuf,
    /// Seed of the links' draws (overrides the scenario's).
    #[arg(long)]
    pub(crate) seed: Option<u64>,
    /// Seconds of transfer per link (the rate is measured over the second half: long round
    /// trips need several seconds for TCP to find the link's rate).
    #[arg(long, default_value_t = 10.0)]
    pub(crate) seconds: f64,
    /// The largest relative error of rate and round trip that passes.
    #[arg(long, default_value_t = 0.05)]
    pub(crate) tolerance: f64,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct ReplayArgs {
    /// The scenario file (default: scenarios/intellect1-global.toml, INTELLECT-1's global run).
    pub(crate) scenario: Option<PathBuf>,
    /// Seed of the run (overrides the scenario's).
    #[arg(long)]
    pub(crate) seed: Option<u64>,
    /// Output directory (default out/<scenario name>).
    #[arg(long, value_name = "DIR")]
    pub(crate) out: Option<PathBuf>,
    /// Stop after at most this many outer steps (shortens long scenarios).
    #[arg(long)]
    pub(crate) max_outer_steps: Option<u64>,
    /// Run DiLoCo in this mode instead of the scenario's (`[diloco] mode`), on the same links:
    /// sync (INTELLECT-1's), overlap (each all-reduce runs during the next outer step's inner
    /// steps), streaming (fragments synchronised at staggered times, each overlapped).
    #[arg(long, value_name = "MODE")]
    pub(crate) mode: Option<loco_core::diloco::Mode>,
    /// Streaming DiLoCo's fragments (with --mode streaming; a divisor of inner_steps; default
    /// the scenario's, else 4).
    #[arg(long, value_name = "P")]
    pub(crate) fragments: Option<u32>,
    /// Overlap and streaming: merge each all-reduce's average this many inner steps into the
    /// round it runs beside, instead of at its end (`[diloco] sync_delay`; a divisor of a
    /// round: inner_steps, or inner_steps / fragments). Shorter: the global weights lag less,
    /// and the all-reduce has less compute to hide behind.
    #[arg(long, value_name = "STEPS")]
    pub(crate) sync_delay: Option<u64>,
    /// The simulator's executor instead of the scenario's (`[sim] executor`): `turmoil` polls
    /// every host at every tick; `events` jumps from one event to the next, for large
    /// scenarios (the default above 32 nodes).
    #[arg(long, value_name = "EXECUTOR", value_parser = parse_executor)]
    pub(crate) executor: Option<loco_core::scenario::ExecutorKind>,
    /// How the event executor runs all-reduces instead of the scenario's (`[sim]
    /// collectives`): `frames` moves every frame of the ring; `modelled` computes each
    /// all-reduce's schedule whole, for thousands of nodes (the default above 128 nodes).
    #[arg(long, value_name = "HOW", value_parser = parse_collectives)]
    pub(crate) collectives: Option<loco_core::scenario::CollectiveModel>,
}

/// `--collectives`'s value.
fn parse_collectives(s: &str) -> Result<loco_core::scenario::CollectiveModel, String> {
    use loco_core::scenario::CollectiveModel;
    CollectiveModel::from_name(s)
        .ok_or_else(|| format!("expected one of {}, got {s:?}", CollectiveModel::NAMES.join(", ")))
}

/// `--executor`'s value.
fn parse_executor(s: &str) -> Result<loco_core::scenario::ExecutorKind, String> {
    use loco_core::scenario::ExecutorKind;
    ExecutorKind::from_name(s)
        .ok_or_else(|| format!("expected one of {}, got {s:?}", ExecutorKind::NAMES.join(", ")))
}

#[derive(Debug, Args)]
pub(crate) struct LaunchArgs {
    /// The scenario file.
    pub(crate) scenario: PathBuf,
    /// Output directory (default out/<scenario name>).
    #[arg(long, value_name = "DIR")]
    pub(crate) out: Option<PathBuf>,
    /// Stop after this many outer steps (overrides the scenario's stop).
    #[arg(long)]
    pub(crate) max_outer_steps: Option<u64>,
    /// Replace the model by a synthetic objective with this many parameters (tests the
    /// protocol without libtorch); each inner step takes the node's `step_time`.
    #[arg(long, value_name = "N")]
    pub(crate) synthetic_params: Option<usize>,
    /// Serve a live page of the run at http://ADDR/ while it goes (PORT alone: 127.0.0.1:PORT;
    /// port 0 picks one): the report's views, redrawn as rows and events come, and the report
    /// once the run ends. Beyond loopback the page asks for a token made for the run, shown in
    /// the address printed at start.
    #[arg(long, value_name = "ADDR", value_parser = parse_metrics_addr)]
    pub(crate) http: Option<std::net::SocketAddr>,
    /// Give up after this many seconds (default: the scenario's stop time plus a minute).
    #[arg(long, value_name = "SECS")]
    pub(crate) timeout: Option<u64>,
    /// Continue from checkpoints (`[real] checkpoint_dir`): the newest outer step that every
    /// starting node has a complete checkpoint of, holding the same outer weights and momentum
    /// on every node (a step where they differ is skipped, with a warning). The run's step count and stop go on from
    /// there; churn times count from this launch's start (as always, from the moment every
    /// starting worker is up).
    #[arg(long)]
    pub(crate) resume: bool,
    /// Continue from the checkpoints of this outer step (implies --resume).
    #[arg(long, value_name = "STEP")]
    pub(crate) resume_step: Option<u64>,
    /// Write (and resume from) checkpoints here instead of the scenario's
    /// `[real] checkpoint_dir`.
    #[arg(long, value_name = "DIR")]
    pub(crate) checkpoint_dir: Option<PathBuf>,
    /// The network to run in, instead of the scenario's `[real] network`: `emulated` (the
    /// scenario's links in network namespaces; refuse to start where they cannot be), `relay`
    /// (the links shaped by userspace relays, no privileges needed), `loopback` (bare), or
    /// `auto` (emulated where this machine allows it, else relayed).
    #[arg(long, value_name = "MODE")]
    pub(crate) network: Option<NetworkArg>,
}

/// `--network`.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub(crate) enum NetworkArg {
    /// Emulated where this machine allows it, else relayed.
    Auto,
    /// The scenario's links, emulated (root).
    Emulated,
    /// The scenario's links, relayed in userspace (no privileges needed).
    Relay,
    /// Bare loopback.
    Loopback,
}

#[derive(Debug, Args)]
pub(crate) struct CoordinatorArgs {
    /// The scenario file.
    pub(crate) scenario: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0:7700")]
    pub(crate) listen: std::net::SocketAddr,
    /// Write the bound address to this file (useful with port 0).
    #[arg(long, value_name = "FILE")]
    pub(crate) addr_file: Option<PathBuf>,
    /// Append events as JSON lines to this file.
    #[arg(long, value_name = "FILE")]
    pub(crate) metrics: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics (PORT alone: 127.0.0.1:PORT; port 0
    /// picks one, printed at start). Off by default.
    #[arg(long, value_name = "ADDR", value_parser = parse_metrics_addr)]
    pub(crate) metrics_addr: Option<std::net::SocketAddr>,
    /// Serve a live page of the mesh at http://ADDR/ (PORT alone: 127.0.0.1:PORT): its members
    /// over time and its events, redrawn as they come (the workers' rows are the launch's; see
    /// `loco launch --http`). Beyond loopback it asks for a token, printed at start.
    #[arg(long, value_name = "ADDR", value_parser = parse_metrics_addr)]
    pub(crate) http: Option<std::net::SocketAddr>,
    /// Unix time (seconds) the run started, the time base of the metrics.
    #[arg(long, hide = true)]
    pub(crate) run_start: Option<f64>,
    /// Stop after this many outer steps (overrides the scenario's stop).
    #[arg(long)]
    pub(crate) max_outer_steps: Option<u64>,
    /// The outer step the run starts at (a run resumed from checkpoints of that step).
    #[arg(long, default_value_t = 0)]
    pub(crate) start_step: u64,
    /// Reach node ID through ADDR instead of the address it listens on (the launcher passes
    /// its relays' addresses when it relays the scenario's links in userspace).
    #[arg(long, value_name = "ID=ADDR,...", value_delimiter = ',', value_parser = parse_dial_via)]
    pub(crate) dial_via: Vec<(u32, std::net::SocketAddr)>,
    #[command(flatten)]
    pub(crate) identity: crate::identity_cmd::IdentityArgs,
}

#[derive(Debug, Args)]
pub(crate) struct WorkerArgs {
    #[command(flatten)]
    pub(crate) identity: crate::identity_cmd::IdentityArgs,
    /// The scenario file.
    pub(crate) scenario: PathBuf,
    /// The coordinator's address.
    #[arg(long)]
    pub(crate) coordinator: std::net::SocketAddr,
    /// This worker's node: its name in the scenario (e.g. `us-3`) or its index.
    #[arg(long)]
    pub(crate) id: String,
    /// Address to listen on for peers (its port is announced through the coordinator).
    #[arg(long, default_value = "0.0.0.0:0")]
    pub(crate) listen: std::net::SocketAddr,
    /// Restart counter of this node (a restarted node must use a larger one).
    #[arg(long, default_value_t = 1)]
    pub(crate) incarnation: u64,
    /// Append outer-step rows and events as JSON lines to this file.
    #[arg(long, value_name = "FILE")]
    pub(crate) metrics: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics (PORT alone: 127.0.0.1:PORT; port 0
    /// picks one, printed at start). Off by default.
    #[arg(long, value_name = "ADDR", value_parser = parse_metrics_addr)]
    pub(crate) metrics_addr: Option<std::net::SocketAddr>,
    /// Unix time (seconds) the run started, the time base of the metrics.
    #[arg(long, hide = true)]
    pub(crate) run_start: Option<f64>,
    /// Unix time (seconds) to ask to join at, once started up (`loco launch` starts joiners
    /// early, so that nodes the scenario starts together ask together).
    #[arg(long, hide = true)]
    pub(crate) join_at: Option<f64>,
    /// A file in which `loco launch` writes the Unix time to ask to join at, once every worker
    /// it started together is ready: the scenario's time 0 for all of them.
    #[arg(long, hide = true, value_name = "FILE", conflicts_with = "join_at")]
    pub(crate) start_gate: Option<PathBuf>,
    /// Replace the model by a synthetic objective with this many parameters.
    #[arg(long, value_name = "N")]
    pub(crate) synthetic_params: Option<usize>,
    /// Start from this checkpoint directory (`<checkpoint_dir>/<node>/step-<N>`) instead of the
    /// initial model.
    #[arg(long, value_name = "DIR")]
    pub(crate) resume: Option<PathBuf>,
    /// Fault injection: SIGKILL this process when it next enters PHASE (compute,
    /// reduce-scatter, all-gather, state-send or checkpoint) at or after SECS seconds after it
    /// started, and (with `,step=N`) in outer step N or later.
    /// Repeatable. `loco launch` passes the scenario's `crash` events that have a `during`.
    #[arg(long, value_name = "PHASE@SECS[,step=N]")]
    pub(crate) crash_during: Vec<loco_real::node::Fault>,
    /// The TCP congestion control of this worker's connections (the launcher passes the
    /// scenario's `[sim] tcp` in its emulated network); default: the host's.
    #[arg(long, value_name = "NAME")]
    pub(crate) congestion: Option<String>,
    /// Reach node ID through ADDR instead of the address it listens on (the launcher passes
    /// its relays' addresses when it relays the scenario's links in userspace).
    #[arg(long, value_name = "ID=ADDR,...", value_delimiter = ',', value_parser = parse_dial_via)]
    pub(crate) dial_via: Vec<(u32, std::net::SocketAddr)>,
    /// Write checkpoints here instead of the scenario's `[real] checkpoint_dir`.
    #[arg(long, value_name = "DIR")]
    pub(crate) checkpoint_dir: Option<PathBuf>,
    /// Read fault commands from standard input, one a line: `hang` stops this node's work
    /// (inner steps, collective frames, state sending) while its heartbeats go on, `resume`
    /// lets it go on. `loco launch` plays the scenario's `hang` events so.
    #[arg(long)]
    pub(crate) control_stdin: bool,
}

#[derive(Debug, Args)]
pub(crate) struct ReportArgs {
    /// Run directories holding summary.json, outer_steps.csv and events.csv.
    #[arg(required = true, value_name = "DIR")]
    pub(crate) dirs: Vec<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum BenchCommand {
    /// Encode and decode-accumulate throughput of every codec, next to a single-core memcpy of
    /// the same buffer measured in the same run.
    Codec(CodecBench),
    /// One ring all-reduce of W ranks: time, bytes on the wire per rank, error against the exact
    /// average (computed in f64), and whether all replicas ended bit-identical.
    Allreduce(AllreduceBench),
    /// Simulated seconds per wall second and peak memory of a replay (default: 24 simulated
    /// hours of the INTELLECT-1 global scenario).
    Sim(SimBench),
    /// The per-parameter cost of a commit's O(model) work as a real worker does it (the
    /// pseudo-gradient, the outer Nesterov step, the copy into the model, the weights digest),
    /// next to a memcpy of the same bytes measured in the same run, and what it comes to per
    /// outer step for the 150m, 1b and 10b presets. The total is the figure for a scenario's
    /// `[sim] outer_cost`.
    Outer(OuterBench),
    /// What a connection's handshake costs: plaintext, with the run secret (Noise NNpsk0), and
    /// with the secret and node keys (Noise IKpsk1, a roster), both ends on one thread over an
    /// in-memory pipe, best of interleaved measurements.
    Handshake(HandshakeBench),
    /// One rank of the TCP all-reduce benchmark.
    #[command(hide = true)]
    AllreduceRank(AllreduceRank),
    /// Live recovery on the real transport: K sender processes and a joiner on loopback (or in
    /// a scenario's emulated network, `--scenario`); the senders snapshot, prepare and send
    /// their shares of a state as a worker does, the joiner assembles and verifies it. Prints
    /// the time from the joiner's signal to its verified state, the throughput against this
    /// machine's memcpy and first-touch rates (or against the links' rate), each process's CPU
    /// time and peak memory against the state's size, and on loopback the per-byte terms for
    /// `[sim] state_prepare_cost` and `state_receive_cost`.
    Recovery(RecoveryBench),
    /// One process of the recovery benchmark.
    #[command(hide = true)]
    RecoveryNode(RecoveryNode),
    /// DiLoCo's quality on the tiny model, in one process (needs `--features torch`): 1 worker,
    /// DiLoCo with W workers and the fp32 and uint8 codecs, and data-parallel training with the
    /// same compute, all with H x outer-steps inner steps per worker from one pretrained start;
    /// the eval loss on the held-out last 5% of the text. Exits 1 when DiLoCo does not beat
    /// 1 worker or uint8 ends more than 1% from fp32.
    Quality(QualityBench),
    /// Inner-step throughput of a model preset on one device (needs `--features torch`):
    /// tokens/s, achieved flops by PRIME's formula, MFU against `--peak-flops`, the step time a
    /// scenario's `[[nodes]] step_time` would take for that batch, and peak memory. Synthetic
    /// tokens; the full inner step (forward, backward, clipping, AdamW) as a worker runs it.
    Train(TrainBench),
    /// Throughput of `loco data prepare` (MB/s of text, per thread, at 1 and --threads threads)
    /// on generated pseudo-English JSONL with a BPE it trains; see docs/data.md.
    Data(DataBench),
}

#[derive(Debug, Args)]
pub(crate) struct TrainBench {
    /// Model preset: tiny, 150m, 1b or 10b.
    #[arg(long, default_value = "tiny", value_parser = parse_preset)]
    pub(crate) preset: Preset,
    /// Where to train: cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu", value_parser = parse_device)]
    pub(crate) device: Device,
    /// Blocks of the model (default: the preset's): the preset's layers at full width, fewer
    /// of them (the GPU check trains as many of the 10B preset's as fit).
    #[arg(long)]
    pub(crate) layers: Option<u32>,
    /// Devices of the node: G > 1 trains one model sharded over them, as a worker of a node
    /// with `gpus = G` does (cuda:N to cuda:N+G-1; on the CPU, G threads over shards). The
    /// batch's rows are split over the devices.
    #[arg(long, default_value_t = 1)]
    pub(crate) gpus: u32,
    /// Print the memory plan of the node (per device and host) and exit, allocating nothing;
    /// needs no libtorch.
    #[arg(long)]
    pub(crate) plan: bool,
    /// What the model computes in: f32 or bf16 (default: f32 on the CPU, bf16 on CUDA).
    #[arg(long, value_parser = parse_precision)]
    pub(crate) precision: Option<Precision>,
    /// Sequences per forward pass (per device).
    #[arg(long, default_value_t = 1)]
    pub(crate) micro_batch: usize,
    /// Sequences per inner step, accumulated over micro-batches (default: one micro-batch per
    /// device).
    #[arg(long)]
    pub(crate) batch_rows: Option<usize>,
    /// Tokens per sequence (default: the preset's seq_len).
    #[arg(long)]
    pub(crate) seq_len: Option<usize>,
    /// Timed inner steps.
    #[arg(long, default_value_t = 10)]
    pub(crate) steps: usize,
    /// Untimed inner steps before them (allocator warm-up, kernel selection, lazy set-up).
    #[arg(long, default_value_t = 2)]
    pub(crate) warmup: usize,
    /// libtorch intra-op threads (default: libtorch's choice, all cores).
    #[arg(long)]
    pub(crate) threads: Option<usize>,
    /// One device's peak flops per second in the compute precision, for MFU (H100 or H200 SXM
    /// bf16 dense: 989e12; A100: 312e12); with `--gpus G`, MFU is against G times it. Without
    /// it MFU is not computed.
    #[arg(long, value_name = "FLOPS")]
    pub(crate) peak_flops: Option<f64>,
    /// Seed of the initial weights and of the synthetic tokens.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct SimBench {
    /// The scenario file (default: scenarios/intellect1-global.toml).
    pub(crate) scenario: Option<PathBuf>,
    /// Simulated hours to run.
    #[arg(long, default_value_t = 24.0)]
    pub(crate) hours: f64,
    /// The simulator's executor instead of the scenario's (`turmoil` or `events`).
    #[arg(long, value_name = "EXECUTOR", value_parser = parse_executor)]
    pub(crate) executor: Option<loco_core::scenario::ExecutorKind>,
    /// How the event executor runs all-reduces (`frames` or `modelled`).
    #[arg(long, value_name = "HOW", value_parser = parse_collectives)]
    pub(crate) collectives: Option<loco_core::scenario::CollectiveModel>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `loco bench handshake`.
#[derive(Debug, Args)]
pub(crate) struct HandshakeBench {
    /// Handshakes per measurement.
    #[arg(long, default_value_t = 2000)]
    pub(crate) count: usize,
    /// Measurements per mode, interleaved; the best is reported.
    #[arg(long, default_value_t = 5)]
    pub(crate) repeats: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct OuterBench {
    /// Parameters (fp32) of the vector; each copy takes 4 bytes per parameter, and the run
    /// holds five (outer weights, momentum, pseudo-gradient, inner weights, model).
    #[arg(long, default_value_t = 50_000_000)]
    pub(crate) params: usize,
    /// Repetitions; the best is reported.
    #[arg(long, default_value_t = 5)]
    pub(crate) repeats: usize,
    /// Seed of the N(0,1) weights.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// Threads of the pseudo-gradient and the outer step, one per shard: what a worker of a
    /// node with `gpus = G` runs them on.
    #[arg(long, default_value_t = 1)]
    pub(crate) shards: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct CodecBench {
    /// Values (f32) per buffer.
    #[arg(long, default_value_t = 1 << 24)]
    pub(crate) elements: usize,
    /// Codecs to measure (default: all).
    #[arg(long, value_delimiter = ',', value_parser = parse_codec)]
    pub(crate) codec: Vec<CodecKind>,
    /// Threads for the multithreaded figures (default: all cores; 1 disables them).
    #[arg(long)]
    pub(crate) threads: Option<usize>,
    /// Repetitions; the best is reported.
    #[arg(long, default_value_t = 5)]
    pub(crate) repeats: usize,
    /// Seed of the N(0,1) test data.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}

/// Where the all-reduce benchmark runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum BenchBackend {
    /// In-memory channels between tasks of this process (measures the compute side).
    Memory,
    /// One process per rank, TCP over loopback (127.0.0.1).
    Tcp,
}

#[derive(Debug, Args)]
pub(crate) struct AllreduceBench {
    /// Ranks in the ring.
    #[arg(long, default_value_t = 4)]
    pub(crate) world: usize,
    /// Values (f32) per rank.
    #[arg(long, default_value_t = 1_000_000)]
    pub(crate) elements: usize,
    /// Codec of the all-reduce.
    #[arg(long, default_value = "uint8", value_parser = parse_codec)]
    pub(crate) codec: CodecKind,
    /// Pipelining unit, in values.
    #[arg(long, default_value_t = loco_core::allreduce::DEFAULT_SEGMENT_ELEMS)]
    pub(crate) segment: usize,
    /// Transport.
    #[arg(long, value_enum, default_value_t = BenchBackend::Memory)]
    pub(crate) backend: BenchBackend,
    /// TCP connections per peer (tcp backend).
    #[arg(long, default_value_t = 1)]
    pub(crate) streams: usize,
    /// Encrypt and authenticate every connection, as a run with a secret does (tcp backend):
    /// measures what the security costs the ring.
    #[arg(long)]
    pub(crate) secure: bool,
    /// Timed all-reduces in one run (tcp backend), each of the same inputs after a barrier; the
    /// time reported is the best repetition's slowest rank, and the median is printed too.
    #[arg(long, default_value_t = 1)]
    pub(crate) repeat: usize,
    /// Seed of the N(0,1) x 10 inputs.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct RecoveryBench {
    /// Bytes of state to move: the replicated part (outer weights and momentum, 8 bytes per
    /// parameter), e.g. 200MB, 2GB (decimal) or 1GiB.
    #[arg(long, default_value = "200MB", value_parser = parse_bytes)]
    pub(crate) bytes: u64,
    /// Sender processes sharing the transfer out (blocking mode: each sends its share of the
    /// pieces).
    #[arg(long, default_value_t = 1)]
    pub(crate) senders: usize,
    /// Connections each sender opens to the joiner for the state (the pieces go round them).
    #[arg(long, default_value_t = 1)]
    pub(crate) streams: usize,
    /// Encrypt and authenticate the connections, as a run with a secret does.
    #[arg(long)]
    pub(crate) secure: bool,
    /// Senders that have not digested their snapshot ahead: each hashes the whole replicated
    /// part before its first piece leaves (a worker digests it after each outer step, in the
    /// background, so a joiner usually finds it done).
    #[arg(long)]
    pub(crate) cold: bool,
    /// Run the processes in this scenario's emulated network instead of on loopback (root; as
    /// `loco launch` does): the scenario's first K nodes send, the next one joins, and the
    /// throughput is compared with the rate the links give one connection from each sender.
    #[arg(long, value_name = "FILE")]
    pub(crate) scenario: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}

/// One process of `bench recovery` (started by it): index 0 is the joiner, 1..=K the senders.
#[derive(Debug, Args)]
pub(crate) struct RecoveryNode {
    #[arg(long)]
    pub(crate) index: usize,
    #[arg(long)]
    pub(crate) senders: usize,
    /// The joiner's listen address, then each sender's.
    #[arg(long, value_delimiter = ',', value_name = "ADDR,ADDR,...")]
    pub(crate) addrs: Vec<std::net::SocketAddr>,
    /// The connections' TCP congestion control (default: the host's).
    #[arg(long)]
    pub(crate) congestion: Option<String>,
    /// Connections per sender for the state.
    #[arg(long, default_value_t = 1)]
    pub(crate) streams: usize,
    #[arg(long)]
    pub(crate) params: usize,
    /// The processes' shared secret: connections are encrypted and authenticated with it.
    #[arg(long)]
    pub(crate) secret: Option<String>,
    /// A sender digests its snapshot after the signal, not ahead of it.
    #[arg(long)]
    pub(crate) cold: bool,
}

fn parse_bytes(s: &str) -> Result<u64, String> {
    loco_core::scenario::units::parse_size(s)
        .map_err(|e| format!("expected a size such as 200MB, 2GB or 1GiB ({e})"))
}

/// One rank of `bench allreduce --backend tcp` (started by it), or of a multi-host run such as
/// `scripts/bench-allreduce-wan.sh` (one rank per network namespace, with `--addrs`).
#[derive(Debug, Args)]
pub(crate) struct AllreduceRank {
    #[arg(long)]
    pub(crate) rank: usize,
    /// Every rank's listen port on 127.0.0.1, in rank order (or give --addrs).
    #[arg(long, value_delimiter = ',', value_name = "PORT,PORT,...")]
    pub(crate) ports: Vec<u16>,
    /// Every rank's listen address, in rank order; this rank binds to its own entry (or give
    /// --ports).
    #[arg(long, value_delimiter = ',', value_name = "IP:PORT,IP:PORT,...")]
    pub(crate) addrs: Vec<std::net::SocketAddr>,
    #[arg(long)]
    pub(crate) elements: usize,
    #[arg(long, value_parser = parse_codec)]
    pub(crate) codec: CodecKind,
    #[arg(long)]
    pub(crate) segment: usize,
    #[arg(long)]
    pub(crate) streams: usize,
    /// The ranks' shared secret: connections are encrypted and authenticated with it.
    #[arg(long)]
    pub(crate) secret: Option<String>,
    #[arg(long, default_value_t = 1)]
    pub(crate) repeat: usize,
    #[arg(long)]
    pub(crate) seed: u64,
}

fn parse_dial_via(s: &str) -> Result<(u32, std::net::SocketAddr), String> {
    let (id, addr) = s.split_once('=').ok_or("expected ID=HOST:PORT")?;
    let id = id.parse().map_err(|_| format!("{id:?}: expected a node id (a number)"))?;
    let addr = addr.parse().map_err(|_| format!("{addr:?}: expected HOST:PORT"))?;
    Ok((id, addr))
}

/// `PORT` (on loopback) or `HOST:PORT`.
fn parse_metrics_addr(s: &str) -> Result<std::net::SocketAddr, String> {
    if let Ok(port) = s.parse::<u16>() {
        return Ok(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    }
    s.parse().map_err(|_| format!("{s:?}: expected PORT or HOST:PORT"))
}

fn parse_codec(s: &str) -> Result<CodecKind, String> {
    s.parse()
}

fn parse_preset(s: &str) -> Result<Preset, String> {
    Preset::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = Preset::ALL.iter().map(|p| p.name()).collect();
        format!("expected one of {}", names.join(", "))
    })
}

fn parse_device(s: &str) -> Result<Device, String> {
    Device::from_name(s).ok_or_else(|| "expected cpu, cuda or cuda:N".to_owned())
}

fn parse_precision(s: &str) -> Result<Precision, String> {
    Precision::from_name(s).ok_or_else(|| "expected f32 or bf16".to_owned())
}
