//! A joiner's state assembly under a sequence of pieces from assigned senders, unassigned ones
//! and forgers (any header: part, offset, total, epoch, digest, piece digest (by default the
//! digest of the forger's own body); any body, bytes or virtual),
//! corrupted genuine pieces, reassignments, pieces held early, and buffers lent by the joiner
//! (holding other values) and taken back. Never a panic; what the assembly says it lacks lies
//! within the parts, in order; and a state that verifies is the genuine one whenever no forger
//! wrote a digest of its own (the fuzzer cannot make bytes match a digest it did not compute).
#![no_main]

use arbitrary::Arbitrary;
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use loco_core::digest::Blake3Digest;
use loco_core::node::state::{
    EarlyPieces, Expect, PART_OWN, PART_SHARED, PartDigests, PieceRule, Segments, SharedState,
    StateAssembly, encoded_len, piece_digest, pieces,
};
use loco_core::transport::{Body, StateAsk, StateHeader};
use loco_core::{Epoch, NodeId};

const N: usize = 40;
const OWN_MAX: u64 = 1024;
const STEP: u64 = 9;
const RULE: PieceRule = PieceRule::Count(6);

struct Genuine {
    shared: Bytes,
    own: Bytes,
}

fn genuine() -> &'static Genuine {
    static G: std::sync::OnceLock<Genuine> = std::sync::OnceLock::new();
    G.get_or_init(|| {
        let outer = (0..N).map(|i| i as f32 * 0.25 - 2.0).collect();
        let momentum = (0..N).map(|i| (i as f32).sin()).collect();
        let shared = SharedState::new(STEP, outer, momentum).expect("one length").encode();
        let own: Vec<u8> = (0..300u32).map(|i| (i * 7) as u8).collect();
        Genuine { shared: shared.into(), own: own.into() }
    })
}

#[derive(Arbitrary, Debug)]
enum Op {
    /// Piece `piece` of a part's grid, as an honest sender sends it, from sender `from`.
    Genuine { from: u8, own: bool, piece: u8, epoch: u8 },
    /// The same with one byte of the body changed (a piece damaged on the way).
    Corrupt { from: u8, own: bool, piece: u8, epoch: u8, at: u16, xor: u8 },
    /// Anything a hostile sender can put in a state frame.
    Forged {
        from: u8,
        epoch: u8,
        outer_step: u64,
        offset: u64,
        total: u64,
        /// The genuine part's digest, or one of the forger's own (or none).
        digest: Option<Option<[u8; 32]>>,
        /// The body's digest (as a forger computes it), or any other.
        piece: Option<[u8; 32]>,
        part: u32,
        body: Result<Vec<u8>, u64>,
    },
    /// The coordinator's next assignment.
    Reassign { epoch: u8, senders: Vec<u8> },
    /// The pieces held early, fed.
    Feed,
    /// The joiner lends buffers of its own outer state (of this model's size, or one more
    /// parameter), holding values the state does not have.
    Lend { right_size: bool },
    /// The joiner takes its buffers back (a fetch ending without the state).
    Reclaim,
}

#[derive(Arbitrary, Debug)]
struct Input {
    blocking: bool,
    senders: Vec<u8>,
    ops: Vec<Op>,
}

fn id(x: u8) -> NodeId {
    NodeId(u32::from(x % 6))
}

/// The genuine part's digest on the grid.
fn part_digest(bytes: &Bytes) -> Option<Blake3Digest> {
    PartDigests::of(&Segments::new([bytes.clone()]), RULE).digest
}

fn genuine_piece(own: bool, piece: u8, epoch: u8) -> (StateHeader, Bytes) {
    let g = genuine();
    let (part, bytes) = if own { (PART_OWN, &g.own) } else { (PART_SHARED, &g.shared) };
    let total = bytes.len() as u64;
    let count = RULE.piece_count(total);
    let r = pieces(total, count, u64::from(piece) % count, RULE).next().expect("a piece");
    let h = StateHeader {
        epoch: Epoch(u64::from(epoch % 4)),
        outer_step: STEP,
        offset: r.start,
        total,
        digest: part_digest(bytes),
        piece: piece_digest(&bytes[r.start as usize..r.end as usize]),
        part,
    };
    (h, bytes.slice(r.start as usize..r.end as usize))
}

fuzz_target!(|input: Input| {
    let senders = input.senders.iter().copied().map(id).collect();
    let mut a = StateAssembly::new(Epoch(1), senders, input.blocking, Expect::real(N, OWN_MAX));
    let mut early = EarlyPieces::new(64 << 10);
    let mut forged_digest = false;
    for op in input.ops.into_iter().take(256) {
        let (from, h, body) = match op {
            Op::Genuine { from, own, piece, epoch } => {
                let (h, b) = genuine_piece(own, piece, epoch);
                (id(from), h, Body::Bytes(b))
            }
            Op::Corrupt { from, own, piece, epoch, at, xor } => {
                let (h, b) = genuine_piece(own, piece, epoch);
                let mut b = b.to_vec();
                if !b.is_empty() {
                    let i = usize::from(at) % b.len();
                    b[i] ^= xor;
                }
                (id(from), h, Body::Bytes(b.into()))
            }
            Op::Forged { from, epoch, outer_step, offset, total, digest, piece, part, body } => {
                forged_digest |= digest.is_some();
                let g = genuine();
                let digest = match digest {
                    Some(forged) => forged.map(Blake3Digest::from_bytes),
                    None => part_digest(if part == PART_OWN { &g.own } else { &g.shared }),
                };
                let body = match body {
                    Ok(b) => Body::Bytes(b.into()),
                    Err(len) => Body::Virtual(len),
                };
                let piece = piece.map(Blake3Digest::from_bytes).unwrap_or_else(|| match &body {
                    Body::Bytes(b) => piece_digest(b),
                    Body::Virtual(_) => Blake3Digest::default(),
                });
                let h = StateHeader {
                    epoch: Epoch(u64::from(epoch % 4)),
                    outer_step,
                    offset,
                    total,
                    digest,
                    piece,
                    part,
                };
                (id(from), h, body)
            }
            Op::Reassign { epoch, senders } => {
                let senders = senders.iter().copied().map(id).collect();
                let _ = a.reassign(Epoch(u64::from(epoch % 4)), senders);
                check(&mut a, forged_digest);
                continue;
            }
            Op::Feed => {
                let _ = a.feed(&mut early);
                check(&mut a, forged_digest);
                continue;
            }
            Op::Lend { right_size } => {
                let n = if right_size { N } else { N + 1 };
                a.lend(vec![7.5; n], vec![-7.5; n]);
                continue;
            }
            Op::Reclaim => {
                if let Some([o, m]) = a.reclaim() {
                    assert!(o.len() == N && m.len() == N, "buffers of another size were taken");
                }
                continue;
            }
        };
        match a.put(from, &h, &body) {
            Ok(p) if p.is_complete() => check(&mut a, forged_digest),
            Ok(_) => {}
            Err(_) => {
                let _ = early.hold(from, h, body);
            }
        }
        assert!(early.bytes() <= 64 << 10, "early pieces beyond their bound");
        check_missing(&a);
    }
});

/// What the assembly says it lacks (what a joiner asks for again): at most the bound, each
/// range within its part, in order and disjoint within a part.
fn check_missing(a: &StateAssembly) {
    let m = a.missing();
    assert!(m.len() <= StateAsk::MAX_RANGES, "{} ranges", m.len());
    let mut last: Option<(u32, u64)> = None;
    for &(part, lo, hi) in &m {
        assert!(part == PART_SHARED || part == PART_OWN, "part {part}");
        assert!(lo <= hi, "{lo}..{hi}");
        if part == PART_SHARED {
            assert!(hi <= encoded_len(N as u64), "beyond the replicated part: {hi}");
        }
        if let Some((p, end)) = last {
            assert!(p != part || lo >= end, "out of order: {m:?}");
        }
        last = Some((part, hi));
    }
}

/// Verifies a complete state: what verifies is genuine unless a forger chose a digest.
fn check(a: &mut StateAssembly, forged_digest: bool) {
    while let Some(received) = a.take_complete() {
        match received.verify(N) {
            Ok(v) => {
                // A forger that chose its digest may have sent bytes that match it (libFuzzer
                // learns compared strings): a self-consistent state from an assigned sender,
                // which verification cannot tell from the real one.
                if !forged_digest {
                    let g = genuine();
                    let shared = v.shared.expect("real bytes").encode();
                    assert_eq!(shared, g.shared.as_ref(), "a forged replicated part verified");
                    assert_eq!(
                        v.own.as_deref(),
                        Some(g.own.as_ref()),
                        "a forged own part verified"
                    );
                }
                return;
            }
            Err(failed) => {
                if !a.retry(*failed) {
                    return;
                }
            }
        }
    }
}
