//! The scenario/config file both backends read, validated.
//!
//! One TOML file describes a run: the model, DiLoCo, the mesh, the regions and the links between
//! them, the nodes, the churn (faults and joins over time), when to stop, and backend-specific
//! sections. The simulator and the real backend read the same file; a field only one backend uses
//! is carried by the other, which logs that it ignores it.
//!
//! Loading has two layers, so that every error names its file and field: a serde layer that mirrors the file and rejects
//! unknown keys, then validation into a [`Scenario`] of typed values ([`Duration`]s, [`Rate`]s in
//! bits per second, [`CodecKind`], [`MeshConfig`], [`NodeId`]s, [`RegionId`]s). Parsing works on a
//! string ([`Scenario::from_toml_str`]); [`Scenario::load`] is the one function of loco-core that
//! reads a file. Every error names the file, the line and column, the field and what was expected:
//!
//! ```text
//! churn.toml:14:13: links[1].bandwidth: expected a rate like "500Mbit/s", got "fast"
//! ```
//!
//! Files stay valid as loco grows: new fields are added with defaults, so an old file keeps its
//! meaning; a misspelt key is an error, never silently ignored.
//!
//! # Units
//!
//! Durations are strings like `"250ms"`, `"22.8s"`, `"38min"`, `"1.5h"`, `"2d"`, `"1h30min"`, or a
//! plain number of seconds. Rates are strings like `"500Mbit/s"`, `"4Gbit/s"`, `"10Gbps"`,
//! `"1.5GB/s"`, `"100MB/s"` (lower-case `b` bits, upper-case `B` bytes; never a bare number).
//! Sizes are strings like `"4MiB"`, `"1GB"`, or a plain number of bytes. See [`units`] for every
//! unit.
//!
//! A *varying* value (link bandwidth and latency) is one value, or
//! `{ uniform = [low, high] }` (drawn uniformly, redrawn every `resample` duration; by default at
//! every outer step), or `{ trace = [["0s", v0], ["2h", v1], ...] }` (a step function of time;
//! the first entry at `"0s"`, times increasing).
//!
//! # Schema
//!
//! Every field, with its default; "required" fields have none.
//!
//! ```toml
//! name = "intellect1-global"   # required; letters, digits, '-', '_', '.'
//! description = "..."          # default none
//! seed = 42                    # default 0; `--seed` on the command line overrides it
//! published = "global"         # default none; the INTELLECT-1 Table-2 setting this reproduces:
//!                              # "no-communication" | "usa" | "usa-eu" ("usa-europe") | "global"
//!
//! [model]                      # required
//! preset = "10b"               # "tiny" | "150m" | "1b" | "10b" (see `Preset`); without a preset,
//!                              # layers, dim, heads, kv_heads, ffn, vocab and seq_len are required
//! layers = 42                  # each of these overrides the preset's value
//! dim = 4096                   # a multiple of heads
//! heads = 32                   # a multiple of kv_heads
//! kv_heads = 8
//! ffn = 14336
//! vocab = 128256
//! seq_len = 8192
//! rope_theta = 500000.0        # default 500000
//! norm_eps = 1e-5              # default 1e-5
//! tied_embeddings = false      # default false (or the preset's)
//!
//! [diloco]                     # optional; the defaults are INTELLECT-1's
//! inner_steps = 100            # H, default 100; >= 1
//! mode = "sync"                # default "sync"; "overlap": the all-reduce of step t runs
//!                              # during step t+1's inner steps and is merged at their end;
//!                              # "streaming": `fragments` fragments, one per round of
//!                              # inner_steps / fragments inner steps, each overlapped likewise
//! fragments = 4                # streaming only; default 4; a divisor of inner_steps
//! mix = 0.0                    # overlap and streaming; default 0; in [0, 1): the share of the
//!                              # local weights the merge keeps against the global update
//! sync_delay = 25              # overlap and streaming; default a round (inner_steps, or
//!                              # inner_steps / fragments): the inner steps after a sync at which
//!                              # its average is merged; a divisor of that round
//! codec = "uint8"              # default "uint8"; fp32 | fp16 | bf16 | uint8 | int8-block | int4-block
//!                              # | sparse (top-k per chunk, gathered whole: each member sums
//!                              # every contribution; a ring of W sends W - 1 of them)
//! sparse_density = 0.01        # sparse only; default 0.01; in (0, 1]: the share of each chunk kept
//! sparse_chunk = 4096          # sparse only; default 4096; 256..=65536 values per chunk
//! sparse_bits = 2              # sparse only; default 2; 2..=8 bits a kept value (sign + level)
//! error_feedback = 1.0         # sparse only; default 1.0 with it; in [0, 1], 0 = off: the decay of
//!                              # the residual a node keeps of what its codec did not send (added
//!                              # to its next pseudo-gradient; local, not in the replicated state:
//!                              # a joiner or a resumed node starts it at zero); sync mode only
//! outer_lr = 0.7               # default 0.7; > 0
//! outer_momentum = 0.9         # default 0.9; in [0, 1)
//! nesterov = true              # default true
//! inner_lr = 7.5e-5            # default 7.5e-5 (AdamW peak); > 0
//! betas = [0.9, 0.95]          # default [0.9, 0.95]; each in [0, 1)
//! warmup_steps = 1000          # default 1000 (linear warmup, in inner steps)
//! decay_start = 74700          # default none (no decay); with decay_steps, a WSD sqrt decay
//! decay_steps = 15700          # required with decay_start; >= 1
//! weight_decay = 0.1           # default 0.1; >= 0
//! grad_clip = 1.0              # default 1.0; 0 disables
//! z_loss = 2e-4                # default 2e-4 (max-z-loss weight); 0 disables
//! batch_tokens = 1048576       # default 1048576 (tokens per node per inner step); >= 1
//! segment = "4MiB"             # default none (the all-reduce picks); pipelining unit, > 0
//!
//! [mesh]                       # optional; defaults = MeshConfig::default() (INTELLECT-1 report)
//! heartbeat = "2s"             # default 2s; > 0
//! heartbeat_timeout = "6s"     # default 6s; > heartbeat
//! barrier_timeout = "600s"     # default 600s; > 0
//! max_retries = 3              # default 3; at most 1000
//! join_mode = "blocking"       # default "blocking"; or "non-blocking"
//! probe = "1s"                 # default 1s; > 0 (bandwidth probe per pair)
//! coordinator_timeout = "18s"  # default 3 x heartbeat_timeout; > heartbeat
//! rejoin_for = "36s"           # default 2 x coordinator_timeout; then a node stops rejoining
//! coordinator_region = "us"    # default the first region
//! min_members = 1              # default 1; the first epoch waits for this many joiners
//! join_window = "5s"           # default 5s; the first epoch forms this long after the first join
//! sync_timeout = "3600s"       # default 3600s; a blocking joiner not synced by then is evicted
//! state_resend_after = "60s"   # default 60s (> 0); a joiner that got pieces and then none for this
//!                              # long asks its senders for those it lacks (again after 2x, up to
//!                              # 8 times); a copy that fails verification is asked for at once
//! compute_timeout = "4h"       # default 4h or 3 x the slowest node's H inner steps, if longer;
//!                              # a barrier nobody reaches by then evicts every member
//! allreduce_timeout = "3600s"  # default 3600s; an all-reduce not done by then is retried
//! retry_backoff = "8s"         # default 8s; wait for an eviction before retrying
//! progress_timeout = "600s"    # default 600s; no ring frame from the neighbour that sends to a
//!                              # member for this long: it names that neighbour (named by two
//!                              # members, over retries with new neighbours, it is evicted)
//! state_senders = 1            # default 1; peers sending the state to one joiner
//! ring = "measured"            # default "measured" (by probed bandwidth); or "ids" (node-id
//!                              # order: links all alike, the same sums run to run)
//! max_queue = 16384            # default 16384; joiners waiting at most (a join beyond is told
//!                              # the queue is full and sent again with the joiner's heartbeats)
//! max_admissions = 1024        # default 1024; joiners admitted at one boundary at most, the
//!                              # longest queued first (the formation admits every founder)
//! max_update_ratio = 0         # default 0 (off); a step whose averaged update's norm is not
//!                              # finite or above this many times the median of the last 16
//!                              # committed is skipped by all (3 in a row stop the run); real
//!                              # values only, so a replay never refuses one
//!
//! [[regions]]                  # at least one
//! name = "us"                  # required, unique
//!
//! [[links]]                    # between two regions; within a region, from = to
//! from = "us"                  # required
//! to = "eu"                    # required
//! oneway = false               # default false (the link serves both directions)
//! bandwidth = "1Gbit/s"        # required, a varying rate: between two nodes, per stream
//! latency = "40ms"             # required, a varying duration: one-way
//! jitter = "5ms"               # default 0; latency varies by up to this much
//! streams = 8                  # default 1: how many concurrent connections between two nodes
//!                              # each get `bandwidth` (PRIME's 8 rings per node were up to 8x
//!                              # faster on some links); more connections share that total
//!
//! [[nodes]]                    # at least one
//! name = "us"                  # required; with count > 1 the nodes are us-0, us-1, ...
//! count = 4                    # default 1; at most 65536 nodes in all
//! region = "us"                # default the only region when there is one; else required
//! gpus = 8                     # default 1; local ranks = parallel rings per node
//! step_time = "22.8s"          # required; > 0; time of one inner step
//! step_jitter = 0.02           # default 0; relative, in [0, 1)
//! start = "2h"                 # default 0s; a later start joins the running mesh
//! nic = "10Gbit/s"             # default none (no cap); NIC cap per direction
//! peak_flops = 989e12          # default none; per GPU, for MFU (H100 SXM bf16 dense)
//!
//! [[churn]]                    # default none; events at a time
//! at = "3h"                    # required
//! kind = "crash"               # required; see below
//! node = "eu-1"                # or nodes = ["us-0", "eu-2"] for a simultaneous event
//! from = "us"                  # partition, heal, degrade, restore: two regions
//! to = "eu"
//! oneway = false               # default false; only from -> to
//! bandwidth = "100Mbit/s"      # degrade: the new varying bandwidth (default unchanged)
//! latency = "300ms"            # degrade: the new varying latency (default unchanged)
//! jitter = "50ms"              # degrade: the new jitter (default unchanged)
//! for = "10min"                # hang, partition, degrade: undo after this long
//!                              # (a resume, heal or restore event); default never
//! during = "reduce-scatter"    # crash: armed at `at`, fires when the node next enters this
//!                              # phase: compute, reduce-scatter, all-gather, state-send or
//!                              # checkpoint
//! step = 4                     # crash with `during`: and only in outer step 4 or later
//!                              # (default any): the same step in the simulator and on any
//!                              # machine, however loaded
//!
//! [[failures]]                 # default none; a failure and repair process per node,
//!                              # expanded into churn events (docs/scenario-format.md)
//! nodes = ["us-0", "us-1"]     # or region = "us"; default every node
//! kind = "crash"               # default crash; or leave (with notice), or hang
//! mtbf = "6h"                  # required; mean time between failures (from start or repair)
//! shape = 1.0                  # default 1 (exponential); Weibull shape in [0.1, 20]
//! repair = "20min"             # required; mean outage (exponential), then restart (resume)
//! from = "0s"                  # default 0s
//! until = "24h"                # default the [stop] time (then required without one)
//!
//! [[arrivals]]                 # default none; nodes that join one after another
//! nodes = ["v-0", "v-1"]       # or region = "eu"; default every node without a start
//! every = "30min"              # required; mean time between arrivals (exponential)
//! from = "0s"                  # default 0s; the first arrives `every` on average after it
//!
//! [[diurnal]]                  # default none; a daily offline window per node (leave, then
//!                              # restart), expanded into churn events
//! region = "eu"                # or nodes = [...]; default every node
//! offline_at = "22h"           # required; time of day (since the start, modulo 24 h)
//! offline_for = "8h"           # required; > 0 and < 24h
//! jitter = "30min"             # default 0s; each node and day starts up to this much later
//! from = "0s"                  # default 0s
//! until = "72h"                # default the [stop] time (then required without one)
//!
//! [stop]                       # required: outer_steps, time, or both (the first reached)
//! outer_steps = 30             # >= 1
//! time = "24h"                 # > 0
//!
//! [sim]                        # simulator only
//! tick = "1ms"                 # default none (the simulator picks); > 0
//! numerics = "virtual"         # default "virtual" (sizes only); or "real" (small vectors)
//! elements = 4096              # default 4096; vector length when numerics = "real"; >= 1
//! duration_limit = "30d"       # default none (the simulator picks); >= stop.time
//! outer_cost = 3.2e-9          # default 3.2e-9 (seconds per parameter; >= 0, 0 for none):
//!                              # each commit's O(model) work (pseudo-gradient, outer step, copy
//!                              # into the model, weights digest) takes params x this of the
//!                              # node's time, heartbeats going on meanwhile; `loco bench outer`
//!                              # measures it (the default: on a 2-core AMD EPYC VM)
//! state_prepare_cost = 1.1e-10 # default 1.1e-10 (seconds per byte; >= 0, 0 for none):
//!                              # digesting a snapshot's pieces takes the bytes x this: ahead,
//!                              # after each outer step (in the background), and before a
//!                              # sender's first piece for what was not digested ahead (its
//!                              # own part; all when the joiner came first)
//! state_receive_cost = 3.7e-10 # default 3.7e-10 (seconds per byte; >= 0, 0 for none): a
//!                              # joiner holds a verified state no sooner than its fetch's
//!                              # start + the state's bytes x this (pieces are taken in and
//!                              # hashed as they arrive: a slow link hides it). Both measured
//!                              # by `loco bench recovery` (the defaults: `--bytes 2GB`, and
//!                              # `--cold` for the first, on a 2-core AMD EPYC VM)
//! encode_cost = 5.9e-10        # default the codec's measured figure (seconds per value; >= 0,
//!                              # 0 for none): a ring node's CPU time per value it encodes, and
//! decode_cost = 2.7e-10        # per value it decodes; a collective frame leaves once the
//!                              # work that made it is done, one piece of work at a time per
//!                              # node (`loco bench codec` measures both; the defaults: on a
//!                              # 2-core AMD EPYC VM, uint8's shown)
//! tcp = "cubic"                # default "cubic" (Linux's), or "bbr", or "none": the nodes'
//!                              # TCP congestion control. New connections start from 10
//!                              # segments doubling each round trip; with cubic, so does one
//!                              # idle past its retransmission timeout; a BBR connection still
//!                              # in its start-up paces each burst at 2.885x its rate and loses
//!                              # the tail of one that would fill the bottleneck's queue (one
//!                              # round trip), repaired a round trip later. `loco launch` sets
//!                              # it in the emulated network; "none" models no start-up at all
//!
//! [real]                       # real backend only
//! device = "cpu"               # default "cpu"; or "cuda" / "cuda:N"
//! precision = "f32"            # default "f32" on the CPU, "bf16" on CUDA: what the model
//!                              # computes in (weights and optimiser state stay fp32)
//! data = "data/corpus.txt"     # default none (synthetic); relative to the scenario file
//! micro_batch = 4              # default 1; sequences per forward pass
//! seq_len = 128                # default none (the model's); override for CPU runs
//! checkpoint_dir = "ckpt"      # default none (no checkpoints); relative to the scenario file
//! checkpoint_remote = "bucket" # default none; a second copy of each checkpoint, written after
//!                              # the local one (a mounted remote file system); relative as above
//! checkpoint_every = 1         # default 1 (outer steps); >= 1
//! keep = 3                     # default 3; >= 1
//! secret_env = "LOCO_SECRET"   # default "LOCO_SECRET": env variable with the run's secret
//! secret = "..."               # default none; the secret itself, when that variable is unset
//! roster = "roster.toml"       # default none; node names to public keys (`loco keygen`):
//!                              # the coordinator's names every node, a worker's at least the
//!                              # coordinator and itself; relative to the scenario file; needed
//!                              # beyond loopback; read again when it changes
//! network = "auto"             # default "auto": the links emulated where the machine allows
//!                              # it (root), else relayed in userspace; "emulated", "relay" or
//!                              # "loopback" (unshaped)
//! ```
//!
//! # Nodes and churn
//!
//! Nodes get [`NodeId`]s `0..n` in file order, after `count` expansion. A node whose `start` is
//! later than 0 is not a member at the start; it joins then. Churn kinds:
//!
//! | kind | fields | effect |
//! |---|---|---|
//! | `join` | `node`/`nodes` | a declared node without `start` starts then (same as setting its `start`) |
//! | `leave` | `node`/`nodes` | graceful exit with a deathrattle |
//! | `crash` | `node`/`nodes`, `during` | SIGKILL (also of a hung node); with `during`, at the node's next entry into that phase after `at` (and, with `step`, in outer step `step` or later) |
//! | `hang` | `node`/`nodes`, `for` | stops working but keeps sending heartbeats |
//! | `resume` | `node`/`nodes` | a hung node works again |
//! | `restart` | `node`/`nodes` | a node that crashed or left comes back and rejoins |
//! | `partition` | `from` + `to` (regions) or `node`/`nodes`, `oneway`, `for` | traffic between the two regions, or between the nodes and everyone else, is dropped |
//! | `heal` | as `partition`, or nothing | ends that partition, or all of them |
//! | `degrade` | `from`, `to`, `oneway`, `bandwidth`, `latency`, `jitter`, `for` | the link changes |
//! | `restore` | `from`, `to`, `oneway` | the link is as declared again |
//! | `coordinator-crash` | | the coordinator dies |
//! | `coordinator-pause` | `for` (required) | the coordinator's process stops (SIGSTOP, a paused VM) for `for`, its connections open, then runs again: members notice its silence after `coordinator_timeout` and wait for it, still members, until `rejoin_for` |
//!
//! Validation plays the events in time order and rejects the impossible (a crash of a node that is
//! not running, a restart of a running one, a heal without a partition). Events at the same time
//! keep file order, after the joins of nodes with a `start`. [`Scenario::churn`] lists the
//! resolved events: one `Join` for each `[[nodes]]` entry with a later start, and the end of each
//! `for` as its own `Resume`, `Heal` or `Restore` event.
//!
//! # Links
//!
//! Every pair of regions that must talk needs a link in each direction: the regions of any two
//! nodes (a region with two or more nodes needs a link to itself), and the coordinator's region
//! with every node's region. Validation names the missing one.
//!
//! Size: 266 lines are the file format's reference above; the rest are the validated types it
//! describes, one per section, kept beside it so that a field and its documentation change together.

use crate::codec::CodecKind;
use crate::diloco::{Mode, Schedule};
use crate::ids::NodeId;
use crate::mesh::MeshConfig;
use crate::transport::Phase;
use serde::Serialize;
use std::fmt;
use std::path::Path;
use std::time::Duration;

mod churn;
mod error;
mod failures;
mod fields;
pub mod links;
mod model;
pub mod random;
mod raw;
pub mod units;
mod validate;

pub use error::{ErrorKind, FieldPath, Location, ScenarioError, Segment};
pub use model::{DEFAULT_NORM_EPS, DEFAULT_ROPE_THETA, ModelSpec, Preset};
pub use units::Rate;

/// A region (a data centre, a continent): a group of nodes whose links are described together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct RegionId(pub u32);

impl fmt::Display for RegionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "region{}", self.0)
    }
}

/// The Table-2 setting of the INTELLECT-1 report a scenario reproduces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Published {
    /// All nodes compute, none communicates (100% utilisation, 43.3% MFU).
    NoCommunication,
    /// Nodes in the USA only (median all-reduce 103 s).
    Usa,
    /// Nodes in the USA and Europe (median all-reduce 382 s).
    UsaEu,
    /// Nodes on three continents (median all-reduce 469 s).
    Global,
}

impl Published {
    /// Every setting, in the report's order.
    pub const ALL: [Published; 4] =
        [Published::NoCommunication, Published::Usa, Published::UsaEu, Published::Global];

    /// The name written in scenario files.
    pub fn name(self) -> &'static str {
        match self {
            Published::NoCommunication => "no-communication",
            Published::Usa => "usa",
            Published::UsaEu => "usa-eu",
            Published::Global => "global",
        }
    }

    /// The setting named `name`; `usa-europe` is accepted for `usa-eu`.
    pub fn from_name(name: &str) -> Option<Published> {
        if name == "usa-europe" {
            return Some(Published::UsaEu);
        }
        Published::ALL.into_iter().find(|p| p.name() == name)
    }
}

impl fmt::Display for Published {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The inner learning-rate schedule's decay phase (WSD with sqrt decay).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Decay {
    /// The inner step the decay starts at.
    pub start: u64,
    /// How many inner steps it lasts; the rate is 0 from `start + steps` on.
    pub steps: u64,
}

/// DiLoCo and the inner optimiser. Defaults are INTELLECT-1's.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DilocoSpec {
    /// H: inner steps per outer step (>= 1).
    pub inner_steps: u64,
    /// How the outer step meets the inner steps (`sync`, `overlap`, `streaming`).
    pub mode: Mode,
    /// Streaming DiLoCo's fragments `P` (1 in the other modes; a divisor of `inner_steps`).
    pub fragments: u32,
    /// The merge's mix of overlap and streaming modes, in [0, 1): the share of the local weights
    /// kept against the global update (0: all of the update).
    pub mix: f64,
    /// Overlap and streaming modes: the inner steps after a sync at which its average is merged
    /// (a divisor of [`sync_period`](Self::sync_period), which is the default: the merge at the
    /// end of the round the all-reduce ran beside). Shorter, the global weights lag less and the
    /// all-reduce has less compute to hide behind. [`sync_period`](Self::sync_period) in sync
    /// mode.
    pub sync_delay: u64,
    /// How pseudo-gradients travel in the all-reduce.
    pub codec: CodecKind,
    /// Outer SGD learning rate (> 0).
    pub outer_lr: f64,
    /// Outer momentum, in [0, 1).
    pub outer_momentum: f64,
    /// Nesterov momentum for the outer step.
    pub nesterov: bool,
    /// Peak inner AdamW learning rate (> 0).
    pub inner_lr: f64,
    /// AdamW betas, each in [0, 1).
    pub betas: (f64, f64),
    /// Linear warmup length, in inner steps.
    pub warmup_steps: u64,
    /// The decay phase, if any (after `warmup_steps`).
    pub decay: Option<Decay>,
    /// AdamW weight decay (>= 0).
    pub weight_decay: f64,
    /// Gradient-norm clip; 0 disables.
    pub grad_clip: f64,
    /// Max-z-loss weight; 0 disables.
    pub z_loss: f64,
    /// Tokens per node per inner step.
    pub batch_tokens: u64,
    /// Pipelining unit of the ring all-reduce in bytes, if set.
    pub segment: Option<u64>,
    /// Error feedback's decay `beta` (`error_feedback`, in (0, 1]), or `None` for none: on by
    /// default with the `sparse` codec ([`DEFAULT_ERROR_FEEDBACK`]), which alone drops enough of
    /// a contribution to need it, and only in sync mode.
    pub error_feedback: Option<f64>,
}

/// The default decay of error feedback's residual with the `sparse` codec.
pub const DEFAULT_ERROR_FEEDBACK: f64 = 1.0;

/// Streaming DiLoCo's default number of fragments.
pub const STREAMING_FRAGMENTS: u32 = 4;

impl DilocoSpec {
    /// Inner steps from one fragment's sync to the next one's: `inner_steps / fragments` in
    /// streaming mode, `inner_steps` otherwise.
    pub fn sync_period(&self) -> u64 {
        match self.mode {
            Mode::Streaming => (self.inner_steps / u64::from(self.fragments.max(1))).max(1),
            Mode::Sync | Mode::Overlap => self.inner_steps,
        }
    }

    /// Inner steps per round of the mesh (one all-reduce): [`sync_delay`](Self::sync_delay) in
    /// overlap and streaming modes (a sync's average is merged at the end of the round after
    /// it; rounds between two syncs all-reduce nothing), `inner_steps` in sync mode.
    pub fn round_steps(&self) -> u64 {
        match self.mode {
            Mode::Sync => self.inner_steps,
            Mode::Overlap | Mode::Streaming => self.sync_delay.clamp(1, self.sync_period()),
        }
    }

    /// Rounds of the mesh (all-reduces) per outer step of `inner_steps` inner steps: `P` in
    /// streaming mode, 1 otherwise, times [`sync_every`](Self::sync_every). `[stop]
    /// outer_steps` counts outer steps; the mesh, its rows and its step numbers count rounds.
    pub fn rounds_per_step(&self) -> u64 {
        (self.inner_steps / self.round_steps()).max(1)
    }

    /// Rounds from one sync to the next: `sync_period / sync_delay` (1 unless `sync_delay` is
    /// shorter than the period).
    pub fn sync_every(&self) -> u64 {
        (self.sync_period() / self.round_steps()).max(1)
    }

    /// The schedule as a run's summary reports it.
    pub fn facts(&self) -> crate::metrics::DilocoFacts {
        crate::metrics::DilocoFacts {
            mode: self.mode,
            fragments: self.fragments,
            sync_delay: self.round_steps(),
            rounds_per_step: self.rounds_per_step(),
        }
    }

    /// The all-reduce [`Schedule`] over a model of `params` values whose layers have the
    /// lengths `layers` (empty: cut anywhere).
    pub fn schedule(&self, params: usize, layers: &[usize]) -> Schedule {
        Schedule::new(self.mode, params, layers, self.fragments, self.mix as f32)
            .with_sync_every(self.sync_every())
    }

    /// Replaces the mode (the command line's `--mode`), with streaming's `fragments`
    /// (default: the scenario's, or [`STREAMING_FRAGMENTS`]) and the merge's `mix` (default: the
    /// scenario's) and `sync_delay` (default: the scenario's where it was shortened and still
    /// divides the new round, else the round). Errors as the scenario's own fields would:
    /// `fragments` must divide `inner_steps` (streaming) or be 1, `mix` lie in [0, 1) (not with
    /// sync), and `sync_delay` divide the round (not with sync).
    pub fn set_mode(
        &mut self,
        mode: Mode,
        fragments: Option<u32>,
        mix: Option<f64>,
        sync_delay: Option<u64>,
    ) -> Result<(), String> {
        let h = self.inner_steps;
        let fragments = match (mode, fragments) {
            (Mode::Streaming, Some(f)) => f,
            (Mode::Streaming, None) if self.fragments > 1 => self.fragments,
            (Mode::Streaming, None) => STREAMING_FRAGMENTS,
            (_, Some(f)) if f != 1 => {
                return Err(format!("fragments = {f}: fragments are streaming DiLoCo's"));
            }
            _ => 1,
        };
        if fragments == 0 || !h.is_multiple_of(u64::from(fragments)) {
            return Err(format!(
                "fragments = {fragments}: expected a divisor of inner_steps ({h}), at least 1"
            ));
        }
        let mix = mix.unwrap_or(if mode == Mode::Sync { 0.0 } else { self.mix });
        if !(0.0..1.0).contains(&mix) || (mode == Mode::Sync && mix != 0.0) {
            return Err(format!("mix = {mix}: expected a number in [0, 1), and none with sync"));
        }
        let period = if mode == Mode::Streaming { h / u64::from(fragments) } else { h };
        let old = &*self;
        let delay = match sync_delay {
            Some(d) if mode == Mode::Sync => {
                return Err(format!("sync_delay = {d}: sync mode has no delay to shorten"));
            }
            Some(d) => d,
            None if old.mode != Mode::Sync
                && old.sync_delay < old.sync_period()
                && old.sync_delay > 0
                && period.is_multiple_of(old.sync_delay) =>
            {
                old.sync_delay
            }
            None => period,
        };
        if delay == 0 || !period.is_multiple_of(delay) {
            return Err(format!(
                "sync_delay = {delay}: expected a divisor of a round ({period} inner steps), at \
                 least 1"
            ));
        }
        (self.mode, self.fragments, self.mix, self.sync_delay) = (mode, fragments, mix, delay);
        Ok(())
    }

    /// [`segment`](Self::segment) in values of the configured codec (at least 1), if set: what
    /// both backends give their rings.
    pub fn segment_elems(&self) -> Option<usize> {
        self.segment.map(|bytes| {
            let values = match self.codec {
                crate::codec::CodecKind::Fp32 => bytes / 4,
                crate::codec::CodecKind::Fp16 | crate::codec::CodecKind::Bf16 => bytes / 2,
                crate::codec::CodecKind::Uint8 | crate::codec::CodecKind::Int8Block => bytes,
                crate::codec::CodecKind::Int4Block => bytes.saturating_mul(2),
                c @ crate::codec::CodecKind::Sparse(_) => c.values_in(bytes),
            };
            usize::try_from(values.max(1)).unwrap_or(usize::MAX)
        })
    }

    /// The inner learning rate at inner step `step` (0-based): linear warmup `lr * step /
    /// warmup_steps`, then `lr`, then from `decay.start` `lr * (1 - sqrt((step - start) /
    /// steps))`, and 0 after the decay.
    pub fn inner_lr_at(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            return self.inner_lr * step as f64 / self.warmup_steps as f64;
        }
        match self.decay {
            Some(d) if step >= d.start => {
                let frac = ((step - d.start) as f64 / d.steps.max(1) as f64).min(1.0);
                self.inner_lr * (1.0 - frac.sqrt())
            }
            _ => self.inner_lr,
        }
    }
}

impl Default for DilocoSpec {
    /// INTELLECT-1: H = 100, uint8, outer SGD Nesterov lr 0.7 m 0.9, AdamW 7.5e-5 (0.9, 0.95),
    /// warmup 1000, weight decay 0.1, clip 1.0, z-loss 2e-4, 1,048,576 tokens per step.
    fn default() -> Self {
        DilocoSpec {
            inner_steps: 100,
            mode: Mode::Sync,
            fragments: 1,
            mix: 0.0,
            sync_delay: 100,
            codec: CodecKind::Uint8,
            outer_lr: 0.7,
            outer_momentum: 0.9,
            nesterov: true,
            inner_lr: 7.5e-5,
            betas: (0.9, 0.95),
            warmup_steps: 1000,
            decay: None,
            weight_decay: 0.1,
            grad_clip: 1.0,
            z_loss: 2e-4,
            batch_tokens: 1_048_576,
            segment: None,
            error_feedback: None,
        }
    }
}

/// A region as declared.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Region {
    /// Its index in `[[regions]]`.
    pub id: RegionId,
    /// Its name.
    pub name: String,
}

/// A value that may change over time.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Varying<T> {
    /// Always this value.
    Fixed(T),
    /// Drawn uniformly in `[low, high]` from the run's seeded stream, redrawn every `resample`
    /// (`None`: at every outer step).
    Uniform {
        /// The lower bound.
        low: T,
        /// The upper bound (>= `low`).
        high: T,
        /// How often to draw again; `None` for every outer step.
        resample: Option<Duration>,
    },
    /// A step function: `(time, value)` pairs, the first at time 0, times increasing.
    Trace(Vec<(Duration, T)>),
}

impl<T: Copy + PartialOrd> Varying<T> {
    /// The value at time `t` for a fixed value or a trace; `None` for a distribution (the backend
    /// draws it).
    pub fn at(&self, t: Duration) -> Option<T> {
        match self {
            Varying::Fixed(v) => Some(*v),
            Varying::Uniform { .. } => None,
            Varying::Trace(points) => {
                points.iter().take_while(|(at, _)| *at <= t).last().map(|(_, v)| *v)
            }
        }
    }

    /// The smallest and largest value it can take; `None` for an empty trace (which validation
    /// never produces).
    pub fn range(&self) -> Option<(T, T)> {
        match self {
            Varying::Fixed(v) => Some((*v, *v)),
            Varying::Uniform { low, high, .. } => Some((*low, *high)),
            Varying::Trace(points) => {
                let first = points.first()?.1;
                Some(points.iter().fold((first, first), |(lo, hi), (_, v)| {
                    (if *v < lo { *v } else { lo }, if *v > hi { *v } else { hi })
                }))
            }
        }
    }
}

/// A link between two regions (one direction, or both).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LinkSpec {
    /// The sending region.
    pub from: RegionId,
    /// The receiving region (equal to `from` within a region).
    pub to: RegionId,
    /// Whether the link serves only `from -> to`.
    pub oneway: bool,
    /// The rate between two nodes of one stream (see `streams`).
    pub bandwidth: Varying<Rate>,
    /// One-way latency.
    pub latency: Varying<Duration>,
    /// Latency jitter (0 for none).
    pub jitter: Duration,
    /// How many concurrent connections between two nodes each get `bandwidth` (>= 1); more
    /// connections share `streams x bandwidth`. With 1, `bandwidth` is the node pair's rate
    /// whatever the number of rings. NICs cap the sum in any case.
    pub streams: u32,
}

impl LinkSpec {
    /// Whether this link carries traffic from `from` to `to`.
    pub fn serves(&self, from: RegionId, to: RegionId) -> bool {
        (self.from == from && self.to == to) || (!self.oneway && self.from == to && self.to == from)
    }
}

/// One node (a machine), after `count` expansion.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NodeSpec {
    /// Its id: its position in [`Scenario::nodes`].
    pub id: NodeId,
    /// Its unique name (`us-0` for the first of a `[[nodes]]` entry named `us` with `count > 1`).
    pub name: String,
    /// Its region.
    pub region: RegionId,
    /// GPUs, i.e. local ranks and parallel rings (>= 1).
    pub gpus: u32,
    /// Duration of one inner step (> 0).
    pub step_time: Duration,
    /// Relative jitter of the step time, in [0, 1).
    pub step_jitter: f64,
    /// When it starts; a node starting after 0 joins the running mesh (see [`ChurnAction::Join`]).
    pub start: Duration,
    /// NIC cap per direction, if any.
    pub nic: Option<Rate>,
    /// Peak flops per GPU, for MFU, if given.
    pub peak_flops: Option<f64>,
    /// The index of its `[[nodes]]` entry.
    pub entry: usize,
}

/// The ways a partition can cut the network.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Cut {
    /// Between two regions (both ways unless `oneway`).
    Regions {
        /// One side.
        from: RegionId,
        /// The other side.
        to: RegionId,
        /// Only `from -> to` is cut.
        oneway: bool,
    },
    /// Between these nodes and everyone else (the coordinator included).
    Nodes(Vec<NodeId>),
}

impl ChurnAction {
    /// Updates the partitions in force: a partition adds its cut, a heal removes its cut (the
    /// first equal one) or, without a cut, all of them. Other events change nothing.
    pub fn update_cuts(&self, in_force: &mut Vec<Cut>) {
        match self {
            ChurnAction::Partition(cut) => in_force.push(cut.clone()),
            ChurnAction::Heal(Some(cut)) => {
                if let Some(i) = in_force.iter().position(|c| c == cut) {
                    in_force.remove(i);
                }
            }
            ChurnAction::Heal(None) => in_force.clear(),
            _ => {}
        }
    }

    /// The detail of the `coordinator-pause` row that a pause or its end writes, the same in
    /// both backends; `None` for other events.
    pub fn coordinator_pause_detail(&self) -> Option<&'static str> {
        match self {
            ChurnAction::CoordinatorPause => Some("paused"),
            ChurnAction::CoordinatorResume => Some("runs again"),
            _ => None,
        }
    }

    /// The detail of the `hang` row that a hang or its end writes, the same in both backends;
    /// `None` for other events.
    pub fn hang_detail(&self) -> Option<&'static str> {
        match self {
            ChurnAction::Hang(_) => Some("hangs (keeps beating)"),
            ChurnAction::Resume(_) => Some("resumes"),
            _ => None,
        }
    }

    /// The events.csv rows (kind, detail) that a network event writes, the same in both
    /// backends: a partition and each cut a heal ends (`in_force`: the partitions in force
    /// before it, which a `heal` without a cut ends), a degrade and a restore. Other events
    /// write none here.
    pub fn network_rows(
        &self,
        scenario: &Scenario,
        in_force: &[Cut],
    ) -> Vec<(crate::metrics::EventKind, String)> {
        use crate::metrics::EventKind;
        let link = |from: &RegionId, to: &RegionId, oneway: &bool| {
            Cut::Regions { from: *from, to: *to, oneway: *oneway }.describe(scenario)
        };
        match self {
            ChurnAction::Partition(cut) => vec![(EventKind::Partition, cut.describe(scenario))],
            ChurnAction::Heal(Some(cut)) => vec![(EventKind::Heal, cut.describe(scenario))],
            ChurnAction::Heal(None) => {
                in_force.iter().map(|c| (EventKind::Heal, c.describe(scenario))).collect()
            }
            ChurnAction::Degrade { from, to, oneway, .. } => {
                vec![(EventKind::Degrade, format!("link {} degraded", link(from, to, oneway)))]
            }
            ChurnAction::Restore { from, to, oneway } => {
                vec![(EventKind::Degrade, format!("link {} restored", link(from, to, oneway)))]
            }
            _ => Vec::new(),
        }
    }
}

impl Cut {
    /// The cut as events.csv writes it: `us <-> eu`, `us -> eu`, or `n-1 n-2 | everyone else`.
    pub fn describe(&self, scenario: &Scenario) -> String {
        let region =
            |r: &RegionId| scenario.region(*r).map_or_else(|| r.to_string(), |x| x.name.clone());
        match self {
            Cut::Regions { from, to, oneway } => {
                format!("{} {} {}", region(from), if *oneway { "->" } else { "<->" }, region(to))
            }
            Cut::Nodes(n) => {
                let names: Vec<String> = n
                    .iter()
                    .map(|i| scenario.node(*i).map_or_else(|| i.to_string(), |x| x.name.clone()))
                    .collect();
                format!("{} | everyone else", names.join(" "))
            }
        }
    }

    /// Whether the cut drops traffic from host `a` to host `b`, given every host's region.
    pub fn covers(
        &self,
        regions: &std::collections::BTreeMap<NodeId, RegionId>,
        a: NodeId,
        b: NodeId,
    ) -> bool {
        match self {
            Cut::Regions { from, to, oneway } => {
                let (ra, rb) = (regions.get(&a), regions.get(&b));
                (ra == Some(from) && rb == Some(to))
                    || (!oneway && ra == Some(to) && rb == Some(from))
            }
            Cut::Nodes(nodes) => nodes.contains(&a) != nodes.contains(&b),
        }
    }
}

/// What a churn event does.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ChurnAction {
    /// The nodes start and join the running mesh.
    Join(Vec<NodeId>),
    /// The nodes exit gracefully (deathrattle).
    Leave(Vec<NodeId>),
    /// The nodes die at once (SIGKILL).
    Crash(Vec<NodeId>),
    /// The nodes stop working but keep sending heartbeats.
    Hang(Vec<NodeId>),
    /// Hung nodes work again.
    Resume(Vec<NodeId>),
    /// Nodes that crashed or left start again and rejoin.
    Restart(Vec<NodeId>),
    /// The network is cut.
    Partition(Cut),
    /// A cut ends; `None` ends every cut.
    Heal(Option<Cut>),
    /// A link changes; `None` fields stay as they are.
    Degrade {
        /// The sending region.
        from: RegionId,
        /// The receiving region.
        to: RegionId,
        /// Only `from -> to` changes.
        oneway: bool,
        /// The new bandwidth.
        bandwidth: Option<Varying<Rate>>,
        /// The new latency.
        latency: Option<Varying<Duration>>,
        /// The new jitter.
        jitter: Option<Duration>,
    },
    /// A link is as declared again.
    Restore {
        /// The sending region.
        from: RegionId,
        /// The receiving region.
        to: RegionId,
        /// Only `from -> to` is restored.
        oneway: bool,
    },
    /// The coordinator dies.
    CoordinatorCrash,
    /// The coordinator's process stops (SIGSTOP, a paused VM, a swap storm): it neither reads
    /// nor sends, its connections stay open, and its clock goes on.
    CoordinatorPause,
    /// A paused coordinator runs again (the end of a `coordinator-pause`'s `for`).
    CoordinatorResume,
}

/// Where an event comes from in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EventSource {
    /// The `start` of `[[nodes]]` entry `i`.
    NodeStart(usize),
    /// `[[churn]]` entry `i`.
    Churn(usize),
    /// The end of the `for` of `[[churn]]` entry `i`.
    ChurnEnd(usize),
    /// Generated by `[[failures]]` entry `i`.
    Failures(usize),
    /// Generated by `[[diurnal]]` entry `i`.
    Diurnal(usize),
    /// Generated by `[[arrivals]]` entry `i`.
    Arrivals(usize),
}

/// A resolved churn event.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ChurnEvent {
    /// When, since the start of the run.
    pub at: Duration,
    /// What happens.
    pub action: ChurnAction,
    /// Where it was written.
    pub source: EventSource,
    /// A crash armed at `at` that fires when the node next enters this phase (`None`: at `at`).
    pub during: Option<FaultPhase>,
    /// A crash with `during` strikes only in this outer step or a later one (`None`: any):
    /// where the crash lands then depends on the protocol, not on the pace of the machine.
    pub from_step: Option<u64>,
}

/// A phase of a node's outer step, where a `crash` with `during` strikes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultPhase {
    /// The inner steps (after the first inner step of an outer step).
    Compute,
    /// The reduce-scatter of the all-reduce (after sending its first segment).
    ReduceScatter,
    /// The all-gather of the all-reduce (after sending its first segment).
    AllGather,
    /// Sending the training state to a joiner (after its first piece).
    StateSend,
    /// Writing a checkpoint (right after the snapshot went to the background writer; the
    /// simulator, which writes none, strikes at the same point of the outer step).
    Checkpoint,
}

impl FaultPhase {
    /// Every phase with its name in scenario files.
    pub const ALL: [(&'static str, FaultPhase); 5] = [
        ("compute", FaultPhase::Compute),
        ("reduce-scatter", FaultPhase::ReduceScatter),
        ("all-gather", FaultPhase::AllGather),
        ("state-send", FaultPhase::StateSend),
        ("checkpoint", FaultPhase::Checkpoint),
    ];

    /// Its name in scenario files.
    pub fn as_str(self) -> &'static str {
        FaultPhase::ALL.iter().find(|(_, p)| *p == self).map_or("?", |(n, _)| n)
    }

    /// The phase of a name, as written in scenario files.
    pub fn parse(name: &str) -> Option<FaultPhase> {
        FaultPhase::ALL.iter().find(|(n, _)| *n == name).map(|(_, p)| *p)
    }
}

impl std::fmt::Display for FaultPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// When the run ends: at whichever comes first (at least one is set).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Stop {
    /// After this many outer steps.
    pub outer_steps: Option<u64>,
    /// At this time since the start.
    pub time: Option<Duration>,
}

/// How the simulator computes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Numerics {
    /// Sizes only: tensors are lengths (any model size).
    #[default]
    Virtual,
    /// Small real vectors with a synthetic objective.
    Real,
}

/// The `[sim]` section.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SimSpec {
    /// turmoil's tick; `None` lets the simulator choose.
    pub tick: Option<Duration>,
    /// Virtual or real numerics.
    pub numerics: Numerics,
    /// Vector length for real numerics.
    pub elements: u64,
    /// Simulated-time safety limit; `None` lets the simulator choose.
    pub duration_limit: Option<Duration>,
    /// Seconds per parameter of a commit's O(model) work (the pseudo-gradient, the outer step,
    /// the copy into the model, the weights digest): every commit takes the model's parameter
    /// count times this of the node's time, spent in its row's `outer_s`. 0 charges nothing.
    pub outer_cost: f64,
    /// Seconds per byte a node takes to digest a snapshot's pieces (the replicated part, and
    /// the own part if it sends it): ahead of any joiner after each outer step, in the
    /// background, and before a sender's first piece leaves for what was not digested ahead
    /// (the own part; the replicated part too when the joiner came first). 0 charges nothing.
    pub state_prepare_cost: f64,
    /// Seconds per byte of a joiner's taking in and verifying a state (its pieces are written
    /// and hashed as they arrive): it holds a verified state no sooner than its fetch's start
    /// plus the state's total length (both parts) times this, so a slow link hides the cost and
    /// a fast one is bounded by it. 0 charges nothing.
    pub state_receive_cost: f64,
    /// Seconds per value of the codec's `encode` on a node's CPU (`None`: the codec's measured
    /// figure, [`CodecKind::measured_cost`]): a collective frame leaves no sooner than the
    /// work that made it is done, its node doing one such piece of work at a time. See
    /// [`SimSpec::frame_work`].
    pub encode_cost: Option<f64>,
    /// Seconds per value of the codec's `decode_accumulate` (as `encode_cost`).
    pub decode_cost: Option<f64>,
    /// The TCP congestion control the nodes run: the simulator charges its start-up, and
    /// `loco launch`'s emulated network sets it in every namespace.
    pub tcp: TcpKind,
    /// The simulator's executor; `None` chooses by the scenario's size
    /// ([`SimSpec::executor_for`]).
    pub executor: Option<ExecutorKind>,
    /// How the event executor runs an all-reduce: frame by frame, or modelled whole; `None`
    /// chooses by the scenario's size ([`SimSpec::collectives_for`]).
    pub collectives: Option<CollectiveModel>,
}

/// How the event executor runs a ring all-reduce (`[sim] collectives`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CollectiveModel {
    /// Every frame of the ring is a flow in the bandwidth model and an arrival on the agenda:
    /// 2(N-1) frames per node, O(N^2) events per all-reduce.
    Frames,
    /// The ring's schedule is computed whole when its last member starts it (each frame's
    /// start, end and arrival from its lane, its sender's codec work and its predecessor's
    /// frame, at the ring's max-min fair rates and drawn latencies), and each member is told
    /// when it is done: O(N) events. Virtual numerics and the event executor only.
    Modelled,
}

impl CollectiveModel {
    /// The names the scenario format takes.
    pub const NAMES: [&'static str; 2] = ["frames", "modelled"];

    /// Nodes above which [`SimSpec::collectives_for`] chooses [`CollectiveModel::Modelled`]
    /// on the event executor.
    pub const FRAMES_MAX_DEFAULT_NODES: usize = 128;

    /// The name.
    pub fn as_str(self) -> &'static str {
        match self {
            CollectiveModel::Frames => "frames",
            CollectiveModel::Modelled => "modelled",
        }
    }

    /// The kind of a name of [`Self::NAMES`].
    pub fn from_name(name: &str) -> Option<CollectiveModel> {
        match name {
            "frames" => Some(CollectiveModel::Frames),
            "modelled" => Some(CollectiveModel::Modelled),
            _ => None,
        }
    }
}

/// How the simulator advances time (`[sim] executor`). Both drive the same node machine, the
/// same fluid bandwidth model and the same churn; they differ in how they wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ExecutorKind {
    /// turmoil: every host is polled at every tick of a fixed length, and messages travel
    /// through turmoil's simulated TCP. Its cost grows with hosts x simulated time.
    Turmoil,
    /// Jumps from one event (a frame's arrival, a flow's end, a timer, a churn event) to the
    /// next: its cost grows with the number of events, not with simulated time.
    Events,
}

impl ExecutorKind {
    /// The names the scenario format takes.
    pub const NAMES: [&'static str; 2] = ["turmoil", "events"];

    /// Nodes above which [`SimSpec::executor_for`] chooses [`ExecutorKind::Events`]: turmoil
    /// polls every host at every tick, which 64 nodes already make slow.
    pub const TURMOIL_MAX_DEFAULT_NODES: usize = 32;

    /// The name of the executor.
    pub fn as_str(self) -> &'static str {
        match self {
            ExecutorKind::Turmoil => "turmoil",
            ExecutorKind::Events => "events",
        }
    }

    /// The kind of a name of [`Self::NAMES`].
    pub fn from_name(name: &str) -> Option<ExecutorKind> {
        match name {
            "turmoil" => Some(ExecutorKind::Turmoil),
            "events" => Some(ExecutorKind::Events),
            _ => None,
        }
    }
}

/// TCP congestion control (`[sim] tcp`). Either way a new connection starts from a window of 10
/// segments of the emulated network's MSS ([`links::EMULATED_MSS`]) and doubles it each round
/// trip until it covers the link's bandwidth-delay product.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TcpKind {
    /// Linux's default: a connection idle longer than its retransmission timeout starts over
    /// from the initial window (`tcp_slow_start_after_idle`).
    #[default]
    Cubic,
    /// BBR: after an idle time a connection resumes at the rate it had measured; until it
    /// leaves its start-up it paces each burst at 2.885 times that rate, and a burst that
    /// would fill the bottleneck's queue loses its tail (docs/fidelity.md).
    Bbr,
    /// No start-up at all: flows run at their share from their first byte (the fluid model
    /// alone); the emulated network keeps the host's congestion control.
    None,
}

impl TcpKind {
    /// The names the scenario format takes.
    pub const NAMES: [&'static str; 3] = ["cubic", "bbr", "none"];

    /// Linux's name of the congestion control (`TCP_CONGESTION`); `None` for
    /// [`TcpKind::None`], which keeps the host's.
    pub fn linux_name(self) -> Option<&'static str> {
        match self {
            TcpKind::Cubic => Some("cubic"),
            TcpKind::Bbr => Some("bbr"),
            TcpKind::None => None,
        }
    }

    /// The kind of a name of [`Self::NAMES`].
    pub fn from_name(name: &str) -> Option<TcpKind> {
        match name {
            "cubic" => Some(TcpKind::Cubic),
            "bbr" => Some(TcpKind::Bbr),
            "none" => Some(TcpKind::None),
            _ => None,
        }
    }
}

impl SimSpec {
    /// The default [`outer_cost`](SimSpec::outer_cost): what `loco bench outer` measured on a
    /// 2-core AMD EPYC VM (3.1-3.5 ns per parameter over seven runs: 0.48 s per commit at 150M
    /// parameters, 4.0 s at 1B, 33 s at 10B).
    pub const DEFAULT_OUTER_COST: f64 = 3.2e-9;

    /// The default [`state_prepare_cost`](SimSpec::state_prepare_cost): what
    /// `loco bench recovery --bytes 2GB --cold` measured on a 2-core AMD EPYC VM, where a
    /// sender's digest of a 2 GB snapshot's pieces (on both cores) took 0.22-0.24 s.
    pub const DEFAULT_STATE_PREPARE_COST: f64 = 1.1e-10;

    /// The executor a scenario of `nodes` nodes runs on: the one the file names, else turmoil
    /// up to [`ExecutorKind::TURMOIL_MAX_DEFAULT_NODES`] nodes and events above.
    pub fn executor_for(&self, nodes: usize) -> ExecutorKind {
        self.executor.unwrap_or(if nodes > ExecutorKind::TURMOIL_MAX_DEFAULT_NODES {
            ExecutorKind::Events
        } else {
            ExecutorKind::Turmoil
        })
    }

    /// How all-reduces run for a scenario of `nodes` nodes on `executor`: the file's choice,
    /// else modelled on the event executor above
    /// [`CollectiveModel::FRAMES_MAX_DEFAULT_NODES`] nodes with virtual numerics, else frames.
    /// turmoil always moves frames (a run that names `modelled` there is refused before it
    /// starts).
    pub fn collectives_for(&self, nodes: usize, executor: ExecutorKind) -> CollectiveModel {
        let default = if executor == ExecutorKind::Events
            && self.numerics == Numerics::Virtual
            && nodes > CollectiveModel::FRAMES_MAX_DEFAULT_NODES
        {
            CollectiveModel::Modelled
        } else {
            CollectiveModel::Frames
        };
        self.collectives.unwrap_or(default)
    }

    /// The default [`state_receive_cost`](SimSpec::state_receive_cost): what
    /// `loco bench recovery --bytes 2GB` measured on a 2-core AMD EPYC VM, where a 2 GB state
    /// took 0.64-1.12 s (median 0.75 s of seven runs) on loopback from the joiner's signal to
    /// its verified state, the sender having digested its snapshot ahead (loopback was no
    /// limit there): 0.37 ns per byte.
    pub const DEFAULT_STATE_RECEIVE_COST: f64 = 3.7e-10;

    /// The time a commit's O(model) work takes for `params` parameters (saturating at
    /// [`Duration::MAX`]).
    pub fn outer_time(&self, params: u64) -> Duration {
        per_unit(params, self.outer_cost)
    }

    /// The time a sender takes to prepare `bytes` of a joiner's state
    /// ([`state_prepare_cost`](SimSpec::state_prepare_cost); saturating at [`Duration::MAX`]).
    pub fn state_prepare_time(&self, bytes: u64) -> Duration {
        per_unit(bytes, self.state_prepare_cost)
    }

    /// The seconds per value of `codec`'s encode and decode on a node's CPU:
    /// [`encode_cost`](SimSpec::encode_cost) and [`decode_cost`](SimSpec::decode_cost), or the
    /// codec's measured figures where they are not set.
    pub fn codec_costs(&self, codec: CodecKind) -> (f64, f64) {
        let (e, d) = codec.measured_cost();
        (self.encode_cost.unwrap_or(e), self.decode_cost.unwrap_or(d))
    }

    /// The CPU time a ring all-reduce's node spends before it sends one collective frame of
    /// `values` values, at `phase` and `step`, as the ring ([`crate::allreduce`]) does the work:
    /// the first reduce-scatter step encodes its own values; a middle one decodes what came,
    /// adds, and encodes; the owner's first all-gather frame decodes, averages, encodes and
    /// decodes its own copy; a forwarded all-gather frame is decoded first. A gathering ring
    /// (`sparse`) encodes its own contribution and decodes it at the end (step 0), and decodes
    /// each contribution it forwards.
    pub fn frame_work(&self, codec: CodecKind, phase: Phase, step: u16, values: u64) -> Duration {
        let (e, d) = self.codec_costs(codec);
        let per_value = match (phase, step) {
            (Phase::ReduceScatter, 0) => e,
            (Phase::ReduceScatter, _) => d + e,
            (Phase::AllGather, 0) => 2.0 * d + e,
            (Phase::Gather, 0) => e + d,
            (Phase::AllGather, _) | (Phase::Gather, _) => d,
        };
        per_unit(values, per_value)
    }

    /// The least time from a fetch's start to a verified state of `bytes` in all
    /// ([`state_receive_cost`](SimSpec::state_receive_cost); saturating at [`Duration::MAX`]).
    pub fn state_receive_time(&self, bytes: u64) -> Duration {
        per_unit(bytes, self.state_receive_cost)
    }
}

/// `n` units at `cost` seconds each, saturating at [`Duration::MAX`].
fn per_unit(n: u64, cost: f64) -> Duration {
    Duration::try_from_secs_f64(n as f64 * cost).unwrap_or(Duration::MAX)
}

impl Default for SimSpec {
    fn default() -> Self {
        SimSpec {
            tick: None,
            numerics: Numerics::Virtual,
            elements: 4096,
            duration_limit: None,
            outer_cost: SimSpec::DEFAULT_OUTER_COST,
            state_prepare_cost: SimSpec::DEFAULT_STATE_PREPARE_COST,
            state_receive_cost: SimSpec::DEFAULT_STATE_RECEIVE_COST,
            encode_cost: None,
            decode_cost: None,
            tcp: TcpKind::Cubic,
            executor: None,
            collectives: None,
        }
    }
}

/// Where the real backend computes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Device {
    /// The CPU.
    #[default]
    Cpu,
    /// A CUDA device by index.
    Cuda(u32),
}

impl Device {
    /// The device written as `name`: "cpu", "cuda" (device 0) or "cuda:N".
    pub fn from_name(name: &str) -> Option<Device> {
        match name {
            "cpu" => Some(Device::Cpu),
            "cuda" => Some(Device::Cuda(0)),
            _ => name.strip_prefix("cuda:").and_then(|n| n.parse().ok()).map(Device::Cuda),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

/// The element type the real backend's model computes in. Master weights, gradients and the
/// optimiser state are fp32 in both.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// Everything in fp32 (the CPU default; deterministic on the CPU).
    #[default]
    F32,
    /// Matmuls, attention and the residual stream in bf16, from fp32 weights cast in the forward
    /// pass; RMSNorm, RoPE and the loss in fp32 (mixed precision without autocast). The CUDA
    /// default: GPUs' peak flops (and so MFU) are quoted for bf16.
    Bf16,
}

impl Precision {
    /// Bytes per activation value.
    pub fn bytes(self) -> u64 {
        match self {
            Precision::F32 => 4,
            Precision::Bf16 => 2,
        }
    }

    /// The precision written as `name`: "f32" or "bf16".
    pub fn from_name(name: &str) -> Option<Precision> {
        match name {
            "f32" => Some(Precision::F32),
            "bf16" => Some(Precision::Bf16),
            _ => None,
        }
    }

    /// The default on `device`: fp32 on the CPU, bf16 on CUDA.
    pub fn default_for(device: Device) -> Precision {
        match device {
            Device::Cpu => Precision::F32,
            Device::Cuda(_) => Precision::Bf16,
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
        })
    }
}

/// The `[real]` section.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RealSpec {
    /// Where to compute.
    pub device: Device,
    /// What the model computes in (default: [`Precision::default_for`] the device).
    pub precision: Precision,
    /// Training data file as written (relative to the scenario file); `None` for synthetic data.
    pub data: Option<String>,
    /// A Hugging Face Llama directory (`config.json`, `model.safetensors`) the run starts from,
    /// as written (relative to the scenario file); `None` for the seeded initialisation.
    pub init: Option<String>,
    /// Held-out loss of the global weights every this many outer steps (0: never).
    pub eval_every: u64,
    /// Held-out sequences each evaluation reads (the first of the held-out split).
    pub eval_sequences: u32,
    /// Sequences per forward pass.
    pub micro_batch: u32,
    /// Sequence length override.
    pub seq_len: Option<u32>,
    /// Checkpoint directory as written (relative to the scenario file); `None` for no
    /// checkpoints.
    pub checkpoint_dir: Option<String>,
    /// A second checkpoint directory (the "remote") that each complete checkpoint is copied to
    /// in the background, as written (relative to the scenario file).
    pub checkpoint_remote: Option<String>,
    /// Checkpoint every this many outer steps.
    pub checkpoint_every: u64,
    /// Checkpoints kept.
    pub keep: u32,
    /// The environment variable holding the shared secret.
    pub secret_env: String,
    /// The run's shared secret written in the file, used when the environment variable is not
    /// set (a file is easier to leak than the environment: prefer `secret_env`).
    pub secret: Option<String>,
    /// The run's roster as written (relative to the scenario file): node names to public keys,
    /// so that a node id is bound to a key at every handshake (`loco keygen`); the
    /// coordinator's names every node it may admit, a worker's at least the coordinator and
    /// itself (it learns the others' keys from the coordinator). Required of a process that
    /// listens beyond loopback; `loco launch` makes keys and rosters of its own.
    pub roster: Option<String>,
    /// The network `loco launch` runs the processes in.
    pub network: NetworkMode,
}

/// The network of a real run on one machine (`[real] network`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NetworkMode {
    /// The scenario's links, emulated (each process in a network namespace of its own, packets
    /// delayed and dropped as the links would), where this machine allows it (root, TUN
    /// devices); relayed otherwise, said at the start of the run.
    #[default]
    Auto,
    /// The scenario's links, emulated; the run refuses to start where they cannot be.
    Emulated,
    /// The scenario's links in userspace, for machines without the privileges to emulate them:
    /// the processes on loopback, every connection between two nodes through a relay of the
    /// launcher's that holds each byte as the link would (rate, `streams`, NIC caps, latency,
    /// jitter, partitions, degrades). No packet is lost, so TCP's own dynamics (slow start,
    /// losses, timeouts) are not those of the link: the simulator's TCP term does not apply.
    Relay,
    /// Bare loopback: the links stand for this machine's own (the scenario's links are the
    /// simulator's alone).
    Loopback,
}

impl NetworkMode {
    /// The names the scenario format takes.
    pub const NAMES: [&'static str; 4] = ["auto", "emulated", "relay", "loopback"];

    /// The mode of a name of [`Self::NAMES`].
    pub fn from_name(name: &str) -> Option<NetworkMode> {
        match name {
            "auto" => Some(NetworkMode::Auto),
            "emulated" => Some(NetworkMode::Emulated),
            "relay" => Some(NetworkMode::Relay),
            "loopback" => Some(NetworkMode::Loopback),
            _ => None,
        }
    }
}

impl Default for RealSpec {
    fn default() -> Self {
        RealSpec {
            device: Device::Cpu,
            precision: Precision::F32,
            data: None,
            init: None,
            eval_every: 0,
            eval_sequences: 64,
            micro_batch: 1,
            seq_len: None,
            checkpoint_dir: None,
            checkpoint_remote: None,
            checkpoint_every: 1,
            keep: 3,
            secret_env: "LOCO_SECRET".to_owned(),
            secret: None,
            roster: None,
            network: NetworkMode::Auto,
        }
    }
}

/// A validated scenario. Built only by [`Scenario::from_toml_str`] or [`Scenario::load`], so its
/// cross-references (node ids, region ids, links) always hold.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Scenario {
    name: String,
    description: Option<String>,
    seed: u64,
    published: Option<Published>,
    model: ModelSpec,
    diloco: DilocoSpec,
    mesh: MeshConfig,
    coordinator_region: RegionId,
    regions: Vec<Region>,
    links: Vec<LinkSpec>,
    nodes: Vec<NodeSpec>,
    churn: Vec<ChurnEvent>,
    stop: Stop,
    sim: SimSpec,
    real: RealSpec,
}

impl Scenario {
    /// Parses and validates the TOML text `src`; `file` names it in errors.
    pub fn from_toml_str(src: &str, file: &str) -> Result<Scenario, ScenarioError> {
        let raw: raw::RawScenario =
            toml::from_str(src).map_err(|e| error::from_toml(&e, src, file))?;
        validate::validate(raw).map_err(|e| e.locate(src, file))
    }

    /// Reads the file at `path` and validates it. The one function of loco-core that does I/O;
    /// errors name the file as `path` is written.
    pub fn load(path: impl AsRef<Path>) -> Result<Scenario, ScenarioError> {
        let path = path.as_ref();
        let file = path.display().to_string();
        let src = std::fs::read_to_string(path).map_err(|e| ScenarioError {
            file: file.clone(),
            location: None,
            path: FieldPath::root(),
            kind: Box::new(ErrorKind::Io { message: e.to_string() }),
        })?;
        Scenario::from_toml_str(&src, &file)
    }

    /// The scenario's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its description, if any.
    pub fn description(&self) -> Option<&str> {
        self.description.as_deref()
    }

    /// The seed of every random choice of the run.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Replaces the seed (the command line's `--seed`).
    pub fn set_seed(&mut self, seed: u64) {
        self.seed = seed;
    }

    /// Replaces the DiLoCo mode (the command line's `--mode`): [`DilocoSpec::set_mode`].
    pub fn set_mode(
        &mut self,
        mode: Mode,
        fragments: Option<u32>,
        mix: Option<f64>,
        sync_delay: Option<u64>,
    ) -> Result<(), String> {
        self.diloco.set_mode(mode, fragments, mix, sync_delay)
    }

    /// The Table-2 setting it reproduces, if any.
    pub fn published(&self) -> Option<Published> {
        self.published
    }

    /// The model.
    pub fn model(&self) -> &ModelSpec {
        &self.model
    }

    /// DiLoCo and the inner optimiser.
    pub fn diloco(&self) -> &DilocoSpec {
        &self.diloco
    }

    /// The mesh settings.
    pub fn mesh(&self) -> &MeshConfig {
        &self.mesh
    }

    /// The region the coordinator runs in.
    pub fn coordinator_region(&self) -> RegionId {
        self.coordinator_region
    }

    /// The regions, in file order (`regions()[i].id == RegionId(i)`).
    pub fn regions(&self) -> &[Region] {
        &self.regions
    }

    /// The region `id`.
    pub fn region(&self, id: RegionId) -> Option<&Region> {
        self.regions.get(usize::try_from(id.0).ok()?)
    }

    /// The region named `name`.
    pub fn region_by_name(&self, name: &str) -> Option<&Region> {
        self.regions.iter().find(|r| r.name == name)
    }

    /// The links, in file order.
    pub fn links(&self) -> &[LinkSpec] {
        &self.links
    }

    /// The link that carries traffic from region `from` to region `to`, if declared. Validation
    /// guarantees one for every pair of regions that nodes (or a node and the coordinator) use.
    pub fn link(&self, from: RegionId, to: RegionId) -> Option<&LinkSpec> {
        self.links.iter().find(|l| l.serves(from, to))
    }

    /// The link from node `a` to node `b` (by their regions).
    pub fn node_link(&self, a: NodeId, b: NodeId) -> Option<&LinkSpec> {
        self.link(self.node(a)?.region, self.node(b)?.region)
    }

    /// The nodes, in id order (`nodes()[i].id == NodeId(i)`).
    pub fn nodes(&self) -> &[NodeSpec] {
        &self.nodes
    }

    /// The node `id`.
    pub fn node(&self, id: NodeId) -> Option<&NodeSpec> {
        self.nodes.get(usize::try_from(id.0).ok()?)
    }

    /// The node named `name`.
    pub fn node_by_name(&self, name: &str) -> Option<&NodeSpec> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// The nodes that are members from the start (start = 0), in id order; every other node
    /// has a [`ChurnAction::Join`] event in [`Scenario::churn`].
    pub fn initial_nodes(&self) -> impl Iterator<Item = &NodeSpec> {
        self.nodes.iter().filter(|n| n.start.is_zero())
    }

    /// The churn events, sorted by time (file order among equal times).
    pub fn churn(&self) -> &[ChurnEvent] {
        &self.churn
    }

    /// When to stop.
    pub fn stop(&self) -> Stop {
        self.stop
    }

    /// The simulator's section.
    pub fn sim(&self) -> &SimSpec {
        &self.sim
    }

    /// Replaces the simulator's TCP model (`loco fidelity` against a relayed real run, whose
    /// connections never meet the links' losses, compares with the fluid model alone).
    pub fn set_tcp(&mut self, tcp: TcpKind) {
        self.sim.tcp = tcp;
    }

    /// Every node's name by id, and the coordinator's (`coordinator`): how rows, events and
    /// messages name them.
    pub fn node_names(&self) -> std::collections::BTreeMap<NodeId, String> {
        self.nodes
            .iter()
            .map(|n| (n.id, n.name.clone()))
            .chain(std::iter::once((NodeId::COORDINATOR, "coordinator".to_owned())))
            .collect()
    }

    /// Replaces the mesh settings (a harness's own timings), checked as the scenario's
    /// `[mesh]` table would be.
    pub fn set_mesh(&mut self, mesh: MeshConfig) -> Result<(), crate::mesh::MeshConfigError> {
        mesh.validate()?;
        self.mesh = mesh;
        Ok(())
    }

    /// Replaces the simulator's executor (`loco replay --executor`).
    pub fn set_executor(&mut self, executor: ExecutorKind) {
        self.sim.executor = Some(executor);
    }

    /// Replaces how the event executor runs all-reduces (`loco replay --collectives`).
    pub fn set_collectives(&mut self, collectives: CollectiveModel) {
        self.sim.collectives = Some(collectives);
    }

    /// The real backend's section.
    pub fn real(&self) -> &RealSpec {
        &self.real
    }

    /// The total number of GPUs over all nodes.
    pub fn total_gpus(&self) -> u64 {
        self.nodes.iter().map(|n| u64::from(n.gpus)).sum()
    }

    /// The one MFU basis of a run of this scenario, for both backends: PRIME's flops per token of
    /// the model at the sequence length the run trains with (`[real] seq_len` when set, else the
    /// model's), the first node's `peak_flops`, and `gpus_per_node` accelerators per node (what
    /// the backend runs each node on). `None` unless every node has `peak_flops`.
    pub fn mfu_basis(&self, gpus_per_node: u32) -> Option<crate::metrics::MfuBasis> {
        let nodes = self.nodes();
        if nodes.is_empty() || !nodes.iter().all(|n| n.peak_flops.is_some()) {
            return None;
        }
        let mut model = self.model().clone();
        if let Some(len) = self.real().seq_len {
            model.seq_len = len;
        }
        Some(crate::metrics::MfuBasis {
            flops_per_token: model.flops_per_token() as f64,
            peak_flops_per_gpu: nodes[0].peak_flops.unwrap_or(0.0),
            gpus_per_node: gpus_per_node.max(1),
        })
    }
}

#[cfg(test)]
mod tests;
