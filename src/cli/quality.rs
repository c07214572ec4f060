//! `loco bench quality`'s arguments.

use super::parse_codec;
use clap::Args;
use loco_core::codec::CodecKind;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub(crate) struct QualityBench {
    /// DiLoCo workers (W), each on its own shard; also the data-parallel run's.
    #[arg(long, default_value_t = 4)]
    pub(crate) workers: usize,
    /// Inner steps per outer step (H).
    #[arg(long, default_value_t = 50)]
    pub(crate) inner_steps: u64,
    /// Outer steps; every run takes inner-steps x outer-steps inner steps per worker.
    #[arg(long, default_value_t = 10)]
    pub(crate) outer_steps: u64,
    /// Sequences (of 64 bytes) per inner step per worker.
    #[arg(long, default_value_t = 4)]
    pub(crate) batch_rows: usize,
    /// Peak inner AdamW learning rate (after a 10-step warmup), as scenarios/tiny-real.toml.
    #[arg(long, default_value_t = 1e-3)]
    pub(crate) inner_lr: f64,
    /// Steps of one worker on the whole training set before the four runs, which all start from
    /// its weights and AdamW state (DiLoCo started from a pretrained model); 0: from scratch.
    #[arg(long, default_value_t = 200)]
    pub(crate) pretrain_steps: u64,
    /// Outer learning rate of the DiLoCo runs (DiLoCo's 0.7).
    #[arg(long, default_value_t = 0.7)]
    pub(crate) outer_lr: f32,
    /// Outer Nesterov momentum of the DiLoCo runs (DiLoCo's 0.9; 0 with --outer-lr 1 is plain
    /// averaging of the workers' weights).
    #[arg(long, default_value_t = 0.9)]
    pub(crate) outer_momentum: f32,
    /// The text, read byte by byte; its last 5% is held out for evaluation.
    #[arg(long, value_name = "FILE", default_value = "data/genesis-kjv.txt")]
    pub(crate) data: PathBuf,
    /// Seed of the initial weights and of the data order.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// One more DiLoCo run with this codec (fp16, bf16, int8-block, int4-block, sparse or
    /// sparse:BITS:KEEP:CHUNK; repeatable), shown beside fp32 and uint8 with its loss relative to
    /// fp32's; no claim is checked for it. A sparse codec runs twice: with error feedback
    /// (--error-feedback) and without.
    #[arg(long = "also-codec", value_name = "CODEC", value_parser = parse_codec)]
    pub(crate) also_codec: Vec<CodecKind>,
    /// Error feedback's decay for an --also-codec run of a gathering codec (`sparse`, which
    /// also runs without error feedback, to show what it buys).
    #[arg(long, default_value_t = loco_core::scenario::DEFAULT_ERROR_FEEDBACK as f32)]
    pub(crate) error_feedback: f32,
    /// Outer learning rate of the runs with error feedback (default: --outer-lr).
    #[arg(long)]
    pub(crate) ef_outer_lr: Option<f32>,
    /// Outer Nesterov momentum of the runs with error feedback (default: --outer-momentum).
    #[arg(long)]
    pub(crate) ef_outer_momentum: Option<f32>,
    /// One more DiLoCo run in this mode (overlap, streaming; repeatable): each all-reduce lands
    /// one round late, beside the next round's inner steps, with --mode-codec; its final eval
    /// loss must end within 1% of sync DiLoCo fp32's at equal tokens (a claim checked).
    #[arg(long = "mode", value_name = "MODE")]
    pub(crate) modes: Vec<loco_core::diloco::Mode>,
    /// The codec of the --mode runs.
    #[arg(long, value_name = "CODEC", value_parser = parse_codec, default_value = "int4-block")]
    pub(crate) mode_codec: CodecKind,
    /// Streaming DiLoCo's fragments (a divisor of --inner-steps).
    #[arg(long, value_name = "P", default_value_t = 5)]
    pub(crate) fragments: u32,
    /// The --mode runs merge each average this many inner steps into the round after its
    /// sync, not at its end (`[diloco] sync_delay`; a divisor of a round: --inner-steps, or
    /// --inner-steps / --fragments in streaming mode).
    #[arg(long, value_name = "STEPS")]
    pub(crate) sync_delay: Option<u64>,
    /// The --mode runs' mix (`[diloco] mix`): the share of the local weights kept against the
    /// eager outer step at each sync, in [0, 1).
    #[arg(long, default_value_t = 0.0)]
    pub(crate) mix: f32,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}
