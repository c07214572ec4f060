//! Live recovery, decided once: the wire format of the training state a joiner receives, the
//! senders' piece plan, the joiner's bounded assembly and verification, and the replay log.
//!
//! # The protocol
//!
//! A joiner receives the state in two **parts**, each sent as [`StateHeader`] frames carrying
//! `[offset, offset + body.len())` of the part's bytes:
//!
//! - [`PART_SHARED`]: the replicated part, a [`SharedState`] (outer steps, outer weights, outer
//!   momentum) in one fixed little-endian layout ([`SharedState::encode`]). Every member holds the
//!   same bytes, so in blocking mode the senders share its pieces out (sender `i` of `k` sends
//!   pieces `i, i + k, ...`, see [`pieces`]); in non-blocking mode each sender sends a whole copy.
//! - [`PART_OWN`]: the sender's own part (its inner optimiser's state), opaque bytes, sent whole
//!   by the first sender of the assignment only.
//!
//! The fields of a [`StateHeader`], for both backends:
//!
//! - `epoch`: the epoch of the assignment (`FetchState`/`SendState`) the piece is sent under;
//! - `outer_step`: the number of outer steps applied to the state sent, i.e.
//!   [`SharedState::outer_steps`] (also on the own part's pieces). A larger value is a newer state;
//! - `offset`, `total`: the piece's place in its part and the part's length;
//! - `digest`: the part's [`part_digest`] (`None` for virtual numerics): BLAKE3 over
//!   the part's length and each grid piece's offset, length and digest. It names the copy: pieces
//!   of one digest are pooled, whoever sent them;
//! - `piece`: the [`piece_digest`] (BLAKE3) of this piece's body, as its sender computed it from
//!   the buffers it sends (zeros for virtual bodies). The joiner checks every body against it
//!   before it stores anything, and asks for a piece that fails again at once;
//! - `part`: [`PART_SHARED`] or [`PART_OWN`].
//!
//! So a sender hashes each byte once, piece by piece, and needs no pass over the whole part
//! before its first piece leaves when it digested the snapshot ahead ([`PartDigests`]: a node
//! does after each outer step, in the background); a joiner hashes each byte once, as it
//! arrives, and knows the part's digest from its pieces' when the last one is in.
//!
//! The piece grid of a part is a function of its length and a [`PieceRule`] only, never of the
//! number of senders, so that the pieces of a reassignment line up with those already held.
//!
//! # The joiner
//!
//! Pieces that arrive before the node knows it will fetch are kept, within a bound, in
//! [`EarlyPieces`]. A [`StateAssembly`] is made at the `FetchState`, told of reassignments, and
//! checks every piece before it stores anything ([`Refused`] says why one was not taken). When
//! both parts are complete, [`StateAssembly::take_complete`] gives a plain-data [`Received`] whose
//! [`verify`](Received::verify) (O(state): run it off the event loop) checks that the pieces'
//! digests make the part's and decodes; a failure goes back with [`StateAssembly::retry`], which keeps the part that was
//! right. A non-blocking joiner then replays the steps committed meanwhile ([`ReplayLog`]).

mod assembly;
mod format;
mod part;
mod plan;
mod replay;
mod verify;
mod wire;

pub use assembly::{
    DEFAULT_EARLY_BYTES, EarlyPieces, Expect, Fed, Progress, Reassigned, Refused, StateAssembly,
};
pub use format::{SHARED_HEADER_LEN, SHARED_MAGIC, encoded_len, segments_digest, state_digest};
pub use part::PartBytes;
pub use plan::{
    PIECE_MAX, PIECE_MIN, PieceRule, Pieces, Share, VIRTUAL_BYTES_PER_PARAM, pieces, share_of,
    virtual_part_lens,
};
pub use replay::{DEFAULT_REPLAY_STEPS, ReplayLog};
pub use verify::{PartFault, Received, ReceivedPart, Rejected, Verified, VerifyFailed};
pub use wire::{
    PartDigests, PieceDigest, Segments, SharedState, StateError, encode_outer_state, part_digest,
    piece_digest,
};

#[cfg(doc)]
use crate::transport::StateHeader;

/// The replicated part of a state: a [`SharedState`], the same bytes on every member.
pub const PART_SHARED: u32 = 0;
/// The sender's own part: its inner optimiser's state, opaque to core, from the first sender only.
pub const PART_OWN: u32 = 1;
