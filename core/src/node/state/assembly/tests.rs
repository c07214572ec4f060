use super::*;
use crate::digest::Blake3Digest;
use crate::node::state::{
    PartDigests, PartFault, PieceRule, Received, ReceivedPart, Rejected, Segments, Share,
    SharedState, StateError, Verified, piece_digest, pieces, share_of, state_digest,
};
use bytes::Bytes;
use proptest::prelude::*;

const N: usize = 100;
const RULE: PieceRule = PieceRule::Count(12);
const A: NodeId = NodeId(1);
const B: NodeId = NodeId(2);
const C: NodeId = NodeId(3);

/// A sender's state: both parts encoded and hashed.
struct Src {
    step: u64,
    shared: Bytes,
    own: Bytes,
}

fn src(step: u64, seed: u8) -> Src {
    let outer = (0..N).map(|i| i as f32 * 0.5 - 3.0).collect();
    let momentum = (0..N).map(|i| i as f32 * step as f32).collect();
    let shared = SharedState::new(step, outer, momentum).unwrap().encode();
    let own: Vec<u8> = (0..300u32).map(|i| (i as u8).wrapping_mul(seed)).collect();
    Src { step, shared: shared.into(), own: own.into() }
}

/// The header of `[offset, offset + len)` of a part of `s` cut by `rule`.
fn header_in(
    s: &Src,
    epoch: u64,
    part: u32,
    offset: u64,
    len: u64,
    rule: PieceRule,
) -> StateHeader {
    let b = if part == PART_SHARED { &s.shared } else { &s.own };
    let end = (offset + len).min(b.len() as u64);
    StateHeader {
        epoch: Epoch(epoch),
        outer_step: s.step,
        offset,
        total: b.len() as u64,
        digest: part_digests(b, rule).digest,
        piece: piece_digest(&b[offset.min(end) as usize..end as usize]),
        part,
    }
}

/// [`header_in`] on the tests' grid.
fn header(s: &Src, epoch: u64, part: u32, offset: u64, len: u64) -> StateHeader {
    header_in(s, epoch, part, offset, len, RULE)
}

fn part_digests(b: &Bytes, rule: PieceRule) -> PartDigests {
    PartDigests::of(&Segments::new([b.clone()]), rule)
}

/// The frames a sender with `share` sends of `s` (replicated part first, as real does).
fn frames(s: &Src, epoch: u64, share: Share) -> Vec<(StateHeader, Body)> {
    let mut out = Vec::new();
    for (part, bytes) in [(PART_SHARED, &s.shared), (PART_OWN, &s.own)] {
        for r in share.pieces(part, bytes.len() as u64, RULE) {
            let body = Body::Bytes(bytes.slice(r.start as usize..r.end as usize));
            out.push((header(s, epoch, part, r.start, r.end - r.start), body));
        }
    }
    out
}

fn put_all(
    a: &mut StateAssembly,
    from: NodeId,
    f: &[(StateHeader, Body)],
) -> Vec<Result<Progress, Refused>> {
    f.iter().map(|(h, b)| a.put(from, h, b)).collect()
}

fn all_ok(r: &[Result<Progress, Refused>]) -> bool {
    r.iter().all(|x| matches!(x, Ok(Progress::Stored { .. } | Progress::Duplicate)))
}

fn expect() -> Expect {
    Expect::real(N, 1000)
}

fn share(senders: &[NodeId], me: NodeId, blocking: bool) -> Share {
    share_of(senders, me, blocking).unwrap()
}

fn verified(a: &mut StateAssembly) -> Verified {
    a.take_complete().expect("complete").verify(N).expect("verifies")
}

#[test]
fn blocking_transfer_shared_by_three_keeps_pieces_when_a_sender_dies() {
    let s = src(7, 3);
    let abc = [A, B, C];
    let mut a = StateAssembly::new(Epoch(5), abc.to_vec(), true, expect());
    let fa = frames(&s, 5, share(&abc, A, true));
    let fb = frames(&s, 5, share(&abc, B, true));
    let fc = frames(&s, 5, share(&abc, C, true));
    assert!(all_ok(&put_all(&mut a, A, &fa)));
    assert!(all_ok(&put_all(&mut a, B, &fb)));
    // C sends one piece, then dies.
    assert!(all_ok(&put_all(&mut a, C, &fc[..1])));
    assert!(!a.is_complete());
    let held = a.held_bytes();
    assert_eq!(held, a.shared_held() + 300);
    assert!(a.shared_held() < s.shared.len() as u64);
    let r = a.reassign(Epoch(6), vec![A, B]);
    assert_eq!((r.kept_bytes, r.dropped_bytes), (held, 0));
    assert_eq!(a.held_bytes(), held);
    // A piece C sent before it died arrives late: a sender of an earlier assignment, the same
    // frozen state: taken.
    assert!(matches!(a.put(C, &fc[1].0, &fc[1].1), Ok(Progress::Stored { restarted: false, .. })));
    // The new split: pieces already held come as duplicates, the rest completes the state.
    let ab = [A, B];
    let ra = put_all(&mut a, A, &frames(&s, 6, share(&ab, A, true)));
    let rb = put_all(&mut a, B, &frames(&s, 6, share(&ab, B, true)));
    assert!(all_ok(&ra) && all_ok(&rb));
    assert!(ra.iter().chain(&rb).any(|r| r == &Ok(Progress::Duplicate)));
    assert!(a.is_complete());
    let v = verified(&mut a);
    assert_eq!(v.own_from, A);
    assert_eq!(v.outer_step, 7);
    assert_eq!(v.shared.unwrap().encode(), s.shared.to_vec());
    assert_eq!(v.own.unwrap(), s.own.to_vec());
    assert_eq!(v.bytes, s.shared.len() as u64 + 300);
}

#[test]
fn the_own_part_comes_again_whole_from_the_new_first_sender() {
    let s = src(7, 3);
    let sb = src(7, 5); // B's own part differs; the replicated part is the same
    assert_eq!(s.shared, sb.shared);
    let abc = [A, B, C];
    let mut a = StateAssembly::new(Epoch(5), abc.to_vec(), true, expect());
    let fa = frames(&s, 5, share(&abc, A, true));
    let own_start = fa.iter().position(|(h, _)| h.part == PART_OWN).unwrap();
    // A dies half-way through its own part.
    assert!(all_ok(&put_all(&mut a, A, &fa[..own_start + 3])));
    assert!(all_ok(&put_all(&mut a, B, &frames(&sb, 5, share(&abc, B, true)))));
    // Only the first sender sends its own part.
    let whole = frames(&sb, 5, share(&[B], B, true));
    let (h, b) = whole.iter().find(|(h, _)| h.part == PART_OWN).unwrap();
    assert_eq!(a.put(B, h, b), Err(Refused::NotAssigned { from: B, part: PART_OWN }));
    let bc = [B, C];
    let r = a.reassign(Epoch(6), bc.to_vec());
    assert_eq!(r.dropped_bytes, 3 * 25);
    // A's last piece in flight: its own copy is gone and it is not the first sender.
    let (h, b) = &fa[own_start + 3];
    assert_eq!(a.put(A, h, b), Err(Refused::NotAssigned { from: A, part: PART_OWN }));
    assert!(all_ok(&put_all(&mut a, B, &frames(&sb, 6, share(&bc, B, true)))));
    assert!(all_ok(&put_all(&mut a, C, &frames(&s, 6, share(&bc, C, true)))));
    let v = verified(&mut a);
    assert_eq!(v.own_from, B);
    assert_eq!(v.own.unwrap(), sb.own.to_vec());
}

#[test]
fn non_blocking_copy_restarts_for_a_newer_outer_step() {
    let old = src(5, 3);
    let new = src(6, 3);
    let ab = [A, B];
    let mut a = StateAssembly::new(Epoch(2), ab.to_vec(), false, expect());
    let fa_old = frames(&old, 2, share(&ab, A, false));
    let fb_old = frames(&old, 2, share(&ab, B, false));
    assert!(fb_old.iter().all(|(h, _)| h.part == PART_SHARED));
    // Both send whole copies of the same state: the same grid, so duplicates.
    assert!(all_ok(&put_all(&mut a, A, &fa_old[..4])));
    assert_eq!(a.put(B, &fb_old[0].0, &fb_old[0].1), Ok(Progress::Duplicate));
    // A commits a step, and its next copy replaces what is held.
    let fa_new = frames(&new, 2, share(&ab, A, false));
    assert_eq!(
        a.put(A, &fa_new[0].0, &fa_new[0].1),
        Ok(Progress::Stored { restarted: true, complete: false })
    );
    assert_eq!(a.shared_held(), fa_new[0].1.len());
    assert_eq!(
        a.put(B, &fb_old[5].0, &fb_old[5].1),
        Err(Refused::StaleDigest { part: PART_SHARED, got: 5, held: 6 })
    );
    // Another digest at the same step: the replicas disagree, refused.
    let mut h = fb_old[5].0.clone();
    h.outer_step = 6;
    assert!(matches!(
        a.put(B, &h, &fb_old[5].1),
        Err(Refused::DigestConflict { outer_step: 6, .. })
    ));
    assert!(all_ok(&put_all(&mut a, A, &fa_new[1..])));
    let v = verified(&mut a);
    assert_eq!(v.outer_step, 6);
    assert_eq!(v.shared.unwrap().outer_steps(), 6);
    // Non-blocking: a sender no longer assigned is not taken.
    let mut a = StateAssembly::new(Epoch(2), ab.to_vec(), false, expect());
    assert!(all_ok(&put_all(&mut a, B, &fb_old[..3])));
    a.reassign(Epoch(3), vec![A]);
    assert_eq!(a.shared_held(), 3 * 69, "the pooled copy is kept");
    assert_eq!(
        a.put(B, &fb_old[3].0, &fb_old[3].1),
        Err(Refused::NotAssigned { from: B, part: PART_SHARED })
    );
}

/// A piece that claims a state beyond the mesh's step (one commit ahead of the joiner's view
/// at most) is refused before it can make the honest copy look stale, and the honest pieces
/// complete the state; without the ceiling the made-up step would have won.
#[test]
fn a_piece_of_a_made_up_later_step_is_refused_and_the_honest_copy_completes() {
    let honest = src(6, 3);
    let ab = [A, B];
    let fa = frames(&honest, 2, share(&ab, A, false));
    let mut forged = fa[0].clone();
    forged.0.outer_step = u64::MAX;
    for ceiling in [Some(6), None] {
        let mut a = StateAssembly::new(Epoch(2), ab.to_vec(), false, expect());
        if let Some(c) = ceiling {
            a.set_ceiling(c);
        }
        let first = a.put(B, &forged.0, &forged.1);
        let rest = put_all(&mut a, A, &fa);
        match ceiling {
            Some(c) => {
                let want = Refused::FutureStep { part: PART_SHARED, got: u64::MAX, ceiling: c };
                assert_eq!(first, Err(want));
                assert!(all_ok(&rest));
                assert_eq!(verified(&mut a).outer_step, 6);
            }
            None => {
                // Every honest piece of the replicated part looks stale: no state comes.
                assert!(first.is_ok());
                let stale = |r: &Result<Progress, Refused>| {
                    matches!(r, Err(Refused::StaleDigest { part: PART_SHARED, .. }))
                };
                let shared = fa.iter().filter(|(h, _)| h.part == PART_SHARED).count();
                assert_eq!(rest.iter().filter(|r| stale(r)).count(), shared);
                assert!(a.take_complete().is_none());
            }
        }
    }
}

#[test]
fn every_refusal_names_its_reason() {
    let s = src(7, 3);
    let mut a = StateAssembly::new(Epoch(5), vec![A, B], true, expect());
    let piece = |part: u32, offset: u64, len: usize| {
        let b = if part == PART_OWN { &s.own } else { &s.shared };
        let h = header(&s, 5, part, offset, len as u64);
        (h, Body::Bytes(b.slice(offset as usize..offset as usize + len)))
    };
    let (h, b) = piece(PART_SHARED, 0, 69);
    assert_eq!(a.put(C, &h, &b), Err(Refused::NotAssigned { from: C, part: 0 }));
    let mut bad = h.clone();
    bad.part = 2;
    assert_eq!(a.put(A, &bad, &b), Err(Refused::BadPart { part: 2 }));
    bad = h.clone();
    bad.total += 1;
    assert_eq!(a.put(A, &bad, &b), Err(Refused::SharedTotal { got: 825, expected: 824 }));
    let (oh, ob) = piece(PART_OWN, 0, 25);
    bad = oh.clone();
    bad.total = 1001;
    assert_eq!(a.put(A, &bad, &ob), Err(Refused::OwnTotal { got: 1001, max: 1000 }));
    bad = h.clone();
    bad.offset = 800;
    assert_eq!(
        a.put(A, &bad, &b),
        Err(Refused::OutOfRange { part: 0, offset: 800, len: 69, total: 824 })
    );
    bad.offset = u64::MAX - 3;
    assert!(matches!(a.put(A, &bad, &b), Err(Refused::OutOfRange { .. })));
    assert_eq!(a.put(A, &h, &Body::empty()), Err(Refused::EmptyPiece { part: 0, total: 824 }));
    assert_eq!(a.put(A, &h, &Body::Virtual(69)), Err(Refused::UnexpectedVirtual));
    bad = h.clone();
    bad.epoch = Epoch(4);
    assert_eq!(a.put(A, &bad, &b), Err(Refused::OldEpoch { got: Epoch(4), first: Epoch(5) }));
    // Stored, then a duplicate, then an overlap.
    assert_eq!(a.put(A, &h, &b), Ok(Progress::Stored { restarted: false, complete: false }));
    assert_eq!(a.put(B, &h, &b), Ok(Progress::Duplicate));
    let (h2, b2) = piece(PART_SHARED, 60, 20);
    assert_eq!(a.put(B, &h2, &b2), Err(Refused::Overlap { part: 0, offset: 60, len: 20 }));
    let (h3, b3) = piece(PART_SHARED, 0, 10);
    assert_eq!(a.put(B, &h3, &b3), Err(Refused::Overlap { part: 0, offset: 0, len: 10 }));
    let (h4, b4) = piece(PART_SHARED, 69, 69);
    assert!(a.put(B, &h4, &b4).is_ok());
    let (h5, b5) = piece(PART_SHARED, 100, 10);
    assert!(matches!(a.put(B, &h5, &b5), Err(Refused::Overlap { .. })));
    // Stale and conflicting copies.
    bad = piece(PART_SHARED, 200, 10).0;
    bad.outer_step = 6;
    let b6 = piece(PART_SHARED, 200, 10).1;
    assert_eq!(a.put(A, &bad, &b6), Err(Refused::StaleDigest { part: 0, got: 6, held: 7 }));
    bad.outer_step = 7;
    bad.digest = Some(Blake3Digest::default());
    assert!(matches!(a.put(A, &bad, &b6), Err(Refused::DigestConflict { .. })));
    // An own copy that changes its length.
    assert!(a.put(A, &oh, &ob).is_ok());
    let mut oh2 = piece(PART_OWN, 25, 25).0;
    oh2.total = 400;
    assert_eq!(
        a.put(A, &oh2, &piece(PART_OWN, 25, 25).1),
        Err(Refused::TotalChanged { part: 1, held: 300, got: 400 })
    );
    // Virtual numerics refuse bytes.
    let mut v = StateAssembly::new(Epoch(5), vec![A], true, Expect::virtual_params(N as u64));
    assert_eq!(v.put(A, &h, &b), Err(Refused::UnexpectedBytes));
    // A full holding area.
    let mut tiny = Expect::real(N, 1000);
    tiny.hold_bytes = 10;
    let mut t = StateAssembly::new(Epoch(5), vec![A], true, tiny);
    let mut future = h.clone();
    future.epoch = Epoch(6);
    assert_eq!(t.put(C, &future, &b), Err(Refused::HoldingFull { held: 0, max: 10 }));
    // Refusals stored nothing.
    assert_eq!(t.held_bytes(), 0);
}

/// Changes a byte of a piece's body; `consistent`: its piece digest too (a sender whose copy
/// differs), else only the body (damaged on its way).
fn damage(frame: &mut (StateHeader, Body), consistent: bool) {
    if let Body::Bytes(b) = &frame.1 {
        let mut v = b.to_vec();
        v[3] ^= 0x40;
        if consistent {
            frame.0.piece = piece_digest(&v);
        }
        frame.1 = Body::Bytes(v.into());
    }
}

/// A piece whose bytes do not match its digest is refused before anything is stored; the
/// same piece intact is taken afterwards.
#[test]
fn a_piece_damaged_on_its_way_is_refused_and_taken_when_it_comes_again() {
    let s = src(7, 3);
    let mut a = StateAssembly::new(Epoch(5), vec![A], true, expect());
    let f = frames(&s, 5, share(&[A], A, true));
    let mut bad = f[2].clone();
    damage(&mut bad, false);
    let (offset, len) = (bad.0.offset, bad.1.len());
    assert_eq!(
        a.put(A, &bad.0, &bad.1),
        Err(Refused::PieceDigest { part: PART_SHARED, offset, len })
    );
    assert_eq!(a.held_bytes(), 0);
    assert!(all_ok(&put_all(&mut a, A, &f)));
    assert_eq!(verified(&mut a).own.unwrap(), s.own.to_vec());
}

#[test]
fn a_corrupted_piece_fails_verify_and_the_retry_keeps_the_good_part() {
    let s = src(7, 3);
    let mut a = StateAssembly::new(Epoch(5), vec![A], true, expect());
    let f = frames(&s, 5, share(&[A], A, true));
    // A piece of another copy (its digest matches its bytes): only the part's digest tells.
    let mut corrupt = f.clone();
    damage(&mut corrupt[2], true);
    assert!(all_ok(&put_all(&mut a, A, &corrupt)));
    let rec = a.take_complete().unwrap();
    assert!(a.take_complete().is_none(), "one verification at a time");
    assert!(!a.is_complete());
    let failed = rec.verify(N).unwrap_err();
    assert!(matches!(&failed.shared, Err(r) if matches!(r.fault, PartFault::Digest { .. })));
    assert!(failed.own.is_ok());
    assert!(failed.to_string().contains("replicated part"), "{failed}");
    assert!(!a.retry(*failed));
    assert_eq!(a.held_bytes(), 300, "the own part is kept, the replicated one dropped");
    // The replicated part comes again; the own part is not needed again.
    let shared: Vec<_> = f.iter().filter(|(h, _)| h.part == PART_SHARED).cloned().collect();
    let r = put_all(&mut a, A, &shared);
    assert!(r.last().unwrap().as_ref().unwrap().is_complete());
    let v = verified(&mut a);
    assert_eq!(v.own.unwrap(), s.own.to_vec());

    // The own part corrupted: the replicated part is kept.
    let mut a = StateAssembly::new(Epoch(5), vec![A], true, expect());
    let mut corrupt = f.clone();
    let last = corrupt.len() - 1;
    corrupt[last].1 = Body::Bytes(vec![0u8; corrupt[last].1.len() as usize].into());
    corrupt[last].0.piece = piece_digest(&vec![0u8; corrupt[last].1.len() as usize]);
    put_all(&mut a, A, &corrupt);
    let failed = a.take_complete().unwrap().verify(N).unwrap_err();
    assert!(failed.shared.is_ok() && failed.own.is_err());
    assert!(!a.retry(*failed));
    assert_eq!(a.held_bytes(), s.shared.len() as u64);
    let own: Vec<_> = f.iter().filter(|(h, _)| h.part == PART_OWN).cloned().collect();
    put_all(&mut a, A, &own);
    assert!(verified(&mut a).shared.is_some());
}

#[test]
fn verify_refuses_a_state_that_does_not_decode_or_names_another_step() {
    let s = src(7, 3);
    let own = ReceivedPart {
        outer_step: 7,
        digest: Some(state_digest(&s.own)),
        total: 300,
        bytes: Some(s.own.to_vec().into()),
        hashed: Some(state_digest(&s.own)),
    };
    let part = |bytes: Vec<u8>, step| ReceivedPart {
        outer_step: step,
        digest: Some(state_digest(&bytes)),
        total: bytes.len() as u64,
        hashed: Some(state_digest(&bytes)),
        bytes: Some(bytes.into()),
    };
    let garbage = vec![7u8; s.shared.len()];
    let r = Received { shared: part(garbage, 7), own: own.clone(), own_from: A, vouched: None };
    let e = r.verify(N).unwrap_err();
    assert!(matches!(
        e.shared,
        Err(Rejected { fault: PartFault::Decode(StateError::BadMagic { .. }), .. })
    ));
    let r = Received {
        shared: part(s.shared.to_vec(), 8),
        own: own.clone(),
        own_from: A,
        vouched: None,
    };
    let e = r.verify(N).unwrap_err();
    assert!(matches!(
        e.shared,
        Err(Rejected { fault: PartFault::Step { header: 8, inside: 7 }, .. })
    ));
    // A state whose digests hold but whose momentum holds a NaN: no node committed it.
    let mut momentum: Vec<f32> = (0..N).map(|i| i as f32).collect();
    momentum[N / 2] = f32::NAN;
    let outer = (0..N).map(|i| i as f32 * 0.5).collect();
    let poisoned = SharedState::new(7, outer, momentum).unwrap().encode();
    let r = Received { shared: part(poisoned, 7), own, own_from: A, vouched: None };
    let e = r.verify(N).unwrap_err();
    assert_eq!(
        e.shared.map(|_| ()).map_err(|r| r.fault),
        Err(PartFault::NotFinite { what: "momentum", index: N / 2 })
    );
    assert!(e.own.is_ok(), "the own part, right, is kept");
}

#[test]
fn a_virtual_transfer_completes_with_lengths_only() {
    let params = 10_000_000_000u64;
    let exp = Expect::virtual_params(params);
    let ab = [A, B];
    let mut a = StateAssembly::new(Epoch(1), ab.to_vec(), true, exp);
    let rule = PieceRule::Count(8);
    for me in ab {
        let sh = share(&ab, me, true);
        for (part, total) in [(PART_SHARED, exp.shared_len), (PART_OWN, exp.own_max)] {
            for r in sh.pieces(part, total, rule) {
                let h = StateHeader {
                    epoch: Epoch(1),
                    outer_step: 3,
                    offset: r.start,
                    total,
                    digest: None,
                    piece: Blake3Digest::default(),
                    part,
                };
                assert!(a.put(me, &h, &Body::Virtual(r.end - r.start)).is_ok());
            }
        }
    }
    let v = verified(&mut a);
    assert_eq!(v.shared, None);
    assert_eq!(v.own, None);
    assert_eq!(v.bytes, 16 * params);
    assert_eq!(v.outer_step, 3);
}

#[test]
fn early_pieces_are_bounded_and_fed_when_the_fetch_starts() {
    let s = src(7, 3);
    let f = frames(&s, 5, share(&[A], A, true));
    let one = hold_cost(&f[0].1);
    let mut early = EarlyPieces::new(one * 3 + one / 2);
    for (h, b) in &f[..3] {
        early.hold(A, h.clone(), b.clone()).unwrap();
    }
    assert!(matches!(
        early.hold(A, f[3].0.clone(), f[3].1.clone()),
        Err(Refused::HoldingFull { .. })
    ));
    let mut odd = f[3].0.clone();
    odd.part = 9;
    assert_eq!(early.hold(A, odd, f[3].1.clone()), Err(Refused::BadPart { part: 9 }));
    assert_eq!(early.len(), 3);
    early.drop_before(Epoch(6));
    assert!(early.is_empty() && early.bytes() == 0);
    for (h, b) in &f[..3] {
        early.hold(A, h.clone(), b.clone()).unwrap();
    }
    let mut a = StateAssembly::new(Epoch(5), vec![A], true, expect());
    let fed = a.feed(&mut early);
    assert_eq!((fed.stored, fed.held, fed.refused.len(), fed.complete), (3, 0, 0, false));
    assert!(early.is_empty());
    assert!(all_ok(&put_all(&mut a, A, &f[3..])));
    assert!(a.is_complete());
}

/// Pieces nobody asked for, from a peer that came first, give way to an assigned sender's down
/// to an even share: the sender's pieces are held, the flood's newest are pushed out.
#[test]
fn early_pieces_from_a_flood_give_way_to_another_sender() {
    let s = src(7, 3);
    let f = frames(&s, 5, share(&[A], A, true));
    let one = hold_cost(&f[0].1);
    let mut early = EarlyPieces::new(one * 4);
    for _ in 0..4 {
        early.hold(B, f[0].0.clone(), f[0].1.clone()).unwrap();
    }
    assert!(early.hold(B, f[0].0.clone(), f[0].1.clone()).is_err());
    for (h, b) in &f[..2] {
        early.hold(A, h.clone(), b.clone()).unwrap();
    }
    assert!(early.hold(A, f[2].0.clone(), f[2].1.clone()).is_err(), "an even share reached");
    assert_eq!((early.len(), early.dropped()), (4, 2));
    let from_a = early.take().iter().filter(|(from, _, _)| *from == A).count();
    assert_eq!(from_a, 2);
}

#[test]
fn pieces_of_a_reassignment_not_known_yet_wait_for_it() {
    let s = src(7, 3);
    let mut a = StateAssembly::new(Epoch(5), vec![A], true, expect());
    // A dies; the coordinator tells B first, and B's pieces (epoch 6) arrive before the joiner's
    // new FetchState.
    let fb = frames(&s, 6, share(&[B], B, true));
    assert!(put_all(&mut a, B, &fb).iter().all(|r| r == &Ok(Progress::Held)));
    assert_eq!(a.pending(), fb.len());
    assert_eq!(a.held_bytes(), 0);
    let r = a.reassign(Epoch(6), vec![B]);
    assert_eq!((r.fed.stored, r.fed.held, r.fed.complete), (fb.len(), 0, true));
    assert_eq!(verified(&mut a).own_from, B);
    // An older reassignment is ignored.
    let mut a = StateAssembly::new(Epoch(5), vec![A], true, expect());
    a.reassign(Epoch(4), vec![B]);
    assert_eq!(a.senders(), &[A]);
}

#[derive(Clone, Debug)]
enum Op {
    Put {
        from: u32,
        part: u32,
        step: u64,
        digest: u8,
        offset: u64,
        len: u64,
        total: u8,
        epoch: u64,
    },
    Reassign {
        epoch: u64,
        senders: Vec<u32>,
    },
    Take {
        corrupt: bool,
    },
    /// A true piece of a sender's state (so that copies complete).
    Good {
        from: u32,
        step: u64,
        part: u32,
        index: u64,
        epoch: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let offset = prop_oneof![0u64..900, Just(u64::MAX), any::<u64>()];
    let len = prop_oneof![0u64..120, Just(u64::MAX)];
    prop_oneof![
        6 => (0u32..4, 0u32..3, 0u64..3, 0u8..3, offset, len, 0u8..4, 3u64..8).prop_map(
            |(from, part, step, digest, offset, len, total, epoch)| Op::Put {
                from, part, step, digest, offset, len, total, epoch
            }
        ),
        1 => (3u64..8, proptest::collection::vec(0u32..4, 0..4))
            .prop_map(|(epoch, senders)| Op::Reassign { epoch, senders }),
        1 => any::<bool>().prop_map(|corrupt| Op::Take { corrupt }),
        8 => (
            prop_oneof![4 => Just(1u32), 2 => Just(2), 1 => 0u32..4],
            prop_oneof![9 => Just(7u64), 1 => Just(6)],
            0u32..2,
            0u64..3,
            prop_oneof![9 => Just(5u64), 1 => 4u64..8],
        ).prop_map(
            |(from, step, part, index, epoch)| Op::Good { from, step, part, index, epoch }
        ),
    ]
}

proptest! {
    /// Arbitrary headers and bodies never panic the assembly, and it never holds more than its
    /// parts' bounds allow.
    #[test]
    fn arbitrary_pieces_never_panic_put(
        ops in proptest::collection::vec(op(), 0..80),
        virtual_bodies in any::<bool>(),
        blocking in any::<bool>(),
    ) {
        let exp = if virtual_bodies { Expect::virtual_params(N as u64) } else { expect() };
        let mut a = StateAssembly::new(Epoch(5), vec![A, B], blocking, exp);
        let mut verifying: Vec<Received> = Vec::new();
        for op in ops {
            match op {
                Op::Put { from, part, step, digest, offset, len, total, epoch } => {
                    let total = match total {
                        0 => exp.shared_len,
                        1 => exp.own_max,
                        2 => 0,
                        _ => u64::MAX,
                    };
                    let body = if virtual_bodies == (digest != 2) {
                        Body::Virtual(len)
                    } else {
                        Body::Bytes(vec![digest; len.min(1000) as usize].into())
                    };
                    let h = StateHeader {
                        epoch: Epoch(epoch),
                        outer_step: step,
                        offset: if offset < 900 { offset / 69 * 69 } else { offset },
                        total,
                        digest: Some(Blake3Digest::from_bytes([digest; 32])),
                        piece: match &body {
                            Body::Bytes(b) => piece_digest(b),
                            Body::Virtual(_) => Blake3Digest::default(),
                        },
                        part,
                    };
                    if let Ok(Progress::Stored { complete, .. }) = a.put(NodeId(from), &h, &body) {
                        prop_assert_eq!(complete, a.is_complete());
                    }
                }
                Op::Good { from, step, part, index, epoch } => {
                    let s = src(step, from as u8 + 1);
                    let bytes = if part == PART_SHARED { &s.shared } else { &s.own };
                    let total = match (virtual_bodies, part) {
                        (false, _) => bytes.len() as u64,
                        (true, PART_SHARED) => exp.shared_len,
                        (true, _) => exp.own_max,
                    };
                    if let Some(r) = pieces(total, 3, index, PieceRule::Count(3)).next() {
                        let rule = PieceRule::Count(3);
                        let mut h = header_in(&s, epoch, part, r.start, r.end - r.start, rule);
                        h.total = total;
                        let body = if virtual_bodies {
                            Body::Virtual(r.end - r.start)
                        } else {
                            Body::Bytes(bytes.slice(r.start as usize..r.end as usize))
                        };
                        if let Ok(Progress::Stored { complete, .. }) = a.put(NodeId(from), &h, &body) {
                            prop_assert_eq!(complete, a.is_complete());
                        }
                    }
                }
                Op::Reassign { epoch, senders } => {
                    a.reassign(Epoch(epoch), senders.into_iter().map(NodeId).collect());
                }
                Op::Take { corrupt } => {
                    if let Some(mut r) = a.take_complete() {
                        if corrupt
                            && let Some(b) = r.shared.bytes.as_mut().filter(|b| !b.is_empty()) {
                                let mut first = 0u8;
                                b.for_each(0..1, |s| first = s[0]);
                                b.write(0, &[first ^ 1]);
                                // Changed after its pieces were checked: it counts as
                                // unchecked, and does not verify.
                                r.shared.hashed = None;
                            }
                        verifying.push(r);
                    } else if let Some(r) = verifying.pop() {
                        match r.verify(N) {
                            Ok(v) => {
                                if let Some(st) = v.shared {
                                    prop_assert_eq!(st.encode(), src(v.outer_step, 1).shared.to_vec());
                                }
                            }
                            Err(f) => { a.retry(*f); }
                        }
                    }
                }
            }
            let own_copies = a.own.len() as u64;
            prop_assert!(a.shared_held() <= exp.shared_len);
            prop_assert!(a.held_bytes() <= exp.shared_len + own_copies * exp.own_max);
            prop_assert!(a.pending.bytes() <= exp.hold_bytes);
        }
    }
}

proptest! {
    /// Whatever order the pieces come in, the part's digest from its checked pieces' digests
    /// is the one its sender computed: verification need not read the bytes again.
    #[test]
    fn the_digest_of_the_checked_pieces_is_the_senders(order in Just(()).prop_perturb(|_, mut rng| {
        let s = src(3, 5);
        let mut f = frames(&s, 1, share(&[A], A, true));
        for i in (1..f.len()).rev() {
            f.swap(i, rng.random_range(0..=i));
        }
        f.into_iter().map(|(h, _)| (h.part, h.offset)).collect::<Vec<_>>()
    })) {
        let s = src(3, 5);
        let f = frames(&s, 1, share(&[A], A, true));
        let mut a = StateAssembly::new(Epoch(1), vec![A], true, expect());
        for (part, offset) in &order {
            let (h, b) = f.iter().find(|(h, _)| h.part == *part && h.offset == *offset).unwrap();
            prop_assert!(a.put(A, h, b).is_ok());
        }
        let r = a.take_complete().expect("complete");
        prop_assert_eq!(r.shared.hashed, part_digests(&s.shared, RULE).digest);
        prop_assert_eq!(r.own.hashed, part_digests(&s.own, RULE).digest);
        prop_assert!(r.verify(N).is_ok());
    }
}

/// What the assembly lacks is what a joiner asks for again: all of both parts before any
/// piece, the gaps between the pieces held, and nothing once the state is complete; the
/// pieces a sender sends for those ranges complete it.
#[test]
fn missing_names_the_gaps_and_the_pieces_sent_for_them_complete_the_state() {
    let s = src(7, 3);
    let mut a = StateAssembly::new(Epoch(5), vec![A], true, expect());
    let total = s.shared.len() as u64;
    assert_eq!(a.missing(), vec![(PART_SHARED, 0, total), (PART_OWN, 0, u64::MAX)]);
    let f = frames(&s, 5, share(&[A], A, true));
    // Every piece but the second and the last of the replicated part, and the own part.
    let shared: Vec<_> = f.iter().filter(|(h, _)| h.part == PART_SHARED).cloned().collect();
    let n = shared.len();
    let lost = [1, n - 1];
    for (i, (h, b)) in f.iter().enumerate() {
        if !(h.part == PART_SHARED && lost.contains(&i)) {
            assert!(a.put(A, h, b).is_ok());
        }
    }
    let gap = |i: usize| {
        let (h, b) = &shared[i];
        (PART_SHARED, h.offset, h.offset + b.len())
    };
    assert_eq!(a.missing(), vec![gap(1), gap(n - 1)]);
    // The sender's pieces overlapping those ranges are exactly the two lost.
    let again: Vec<_> = shared
        .iter()
        .filter(|(h, b)| {
            a.missing()
                .iter()
                .any(|&(p, lo, hi)| p == h.part && h.offset < hi && lo < h.offset + b.len())
        })
        .cloned()
        .collect();
    assert_eq!(again.len(), 2);
    assert!(all_ok(&put_all(&mut a, A, &again)));
    assert!(a.missing().is_empty());
    assert!(a.is_complete());
    assert_eq!(verified(&mut a).shared.unwrap().encode(), s.shared.to_vec());
}

/// Buffers lent by the joiner receive the replicated part: the verified state is made of them
/// (no memory allocated for it); buffers of another size are not taken, and a fetch that ends
/// without its state gives them back.
#[test]
fn lent_buffers_receive_the_replicated_part() {
    let s = src(7, 3);
    let mut a = StateAssembly::new(Epoch(5), vec![A], true, expect());
    let (outer, momentum) = (vec![9.0f32; N], vec![8.0f32; N]);
    let (po, pm) = (outer.as_ptr(), momentum.as_ptr());
    a.lend(outer, momentum);
    assert!(all_ok(&put_all(&mut a, A, &frames(&s, 5, share(&[A], A, true)))));
    let v = verified(&mut a).shared.unwrap();
    assert_eq!(v.encode(), s.shared.to_vec());
    assert_eq!((v.outer().as_ptr(), v.momentum().as_ptr()), (po, pm));

    let mut b = StateAssembly::new(Epoch(5), vec![A], true, expect());
    b.lend(vec![0.0; N + 1], vec![0.0; N + 1]);
    assert!(b.reclaim().is_none(), "buffers of another model are not taken");
    let (outer, momentum) = (vec![9.0f32; N], vec![8.0f32; N]);
    let po = outer.as_ptr();
    b.lend(outer, momentum);
    let f = frames(&s, 5, share(&[A], A, true));
    assert!(b.put(A, &f[0].0, &f[0].1).is_ok());
    let [back, _] = b.reclaim().expect("the buffers, holding the copy begun");
    assert_eq!((back.as_ptr(), back.len()), (po, N));
}

/// A complete state, consistent in itself, that is not the one the members vouch for (another
/// outer step, other weights) fails verification naming what it is and what is vouched for;
/// the one vouched for verifies, as does any state when nothing is vouched for.
#[test]
fn a_state_not_vouched_for_fails_verification() {
    let s = src(7, 3);
    let outer: Vec<f32> = (0..N).map(|i| i as f32 * 0.5 - 3.0).collect();
    let right = crate::node::digest::weights_digest(&outer);
    let wrong = crate::node::digest::weights_digest(&outer[1..]);
    let assembled = |vouched: Option<Held>| {
        let mut a = StateAssembly::new(Epoch(5), vec![A], true, expect());
        a.set_vouched(vouched);
        assert!(all_ok(&put_all(&mut a, A, &frames(&s, 5, share(&[A], A, true)))));
        a.take_complete().expect("complete").verify(N)
    };
    assert!(assembled(None).is_ok());
    assert!(assembled(Some(Held { outer_step: 7, digest: Some(right) })).is_ok());
    assert!(assembled(Some(Held { outer_step: 7, digest: None })).is_ok(), "the step alone");
    for (vouched, weights) in [
        (Held { outer_step: 7, digest: Some(wrong) }, Some(right)),
        (Held { outer_step: 6, digest: Some(right) }, None),
    ] {
        let failed = assembled(Some(vouched)).expect_err("not vouched for");
        let r = failed.shared.expect_err("the replicated part");
        assert_eq!(r.fault, PartFault::NotVouched { outer_step: 7, weights, vouched });
        assert!(r.fault.to_string().contains("not the state the members hold"));
        assert!(failed.own.is_ok(), "the own part is kept");
    }
}
