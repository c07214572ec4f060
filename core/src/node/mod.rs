//! The node: what one member of the mesh does, decided once for every backend.
//!
//! The [`Member`](crate::mesh::Member) decides membership; this module holds the rest of a
//! node's protocol work that both backends need, as pure code with injected time:
//!
//! - [`digest`]: the one digest of outer weights written to `outer_steps.csv` (BLAKE3);
//! - [`state`]: live recovery's wire format (one encoding and one digest of the training state),
//!   the senders' piece plan, the joiner's bounded assembly, and the replay log a non-blocking
//!   joiner replays onto a late state;
//! - [`rings`]: the `G` per-shard ring all-reduces of one outer step under one epoch, with the
//!   stale-frame count and the frames that arrive before their collective starts;
//! - [`events`]: the coordinator's and the node's event rows, mapped once;
//! - [`fair`]: the holding areas' bound, shared fairly among senders;
//! - [`machine`]: the node machine that owns all of the above and the Member: one sans-IO
//!   state machine per node, which the executors drive;
//! - [`synthetic`]: the synthetic objective both backends train without a model (the
//!   simulator's real numerics, the real backend's `--synthetic-params`);
//! - [`process`]: the process around a node across its memberships (incarnations, the rejoin
//!   policy, restart and exit timing, the stop rows): what every executor drives;
//! - [`config`]: the one translation of a scenario into a node's settings;
//! - [`acct`]: step accounting: where a node's wall time went in one outer step, closed into one
//!   [`OuterStepRow`](crate::metrics::OuterStepRow).
//!
//! The simulator and the real backend execute these; neither re-implements them.

pub mod acct;
pub mod config;
pub mod digest;
pub mod events;
pub mod fair;
pub mod machine;
pub mod process;
pub mod rings;
pub mod state;
pub mod synthetic;
