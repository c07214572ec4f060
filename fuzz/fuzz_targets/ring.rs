//! The ring all-reduce under hostile frames: three ranks reduce finite values with a codec,
//! while frames with any header (epoch, op, step, chunk, segment, weight sum) and any body are
//! fed to them as from any node, beside the genuine frames (delivered, dropped, or corrupted in
//! one byte). Never a panic; a rank that finishes holds only finite values (bytes that would
//! decode to NaN or an infinity are refused before use).
#![no_main]

use arbitrary::Arbitrary;
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use loco_core::allreduce::{Payload, RingAllReduce, RingConfig};
use loco_core::codec::CodecKind;
use loco_core::transport::{Body, Frame, Header};
use loco_core::{Epoch, NodeId, Weight};

#[derive(Arbitrary, Debug)]
enum Op {
    /// Deliver the next genuine frame of the queue.
    Deliver,
    /// Drop it.
    Drop,
    /// Deliver it with one body byte changed.
    Corrupt { at: u16, xor: u8 },
    /// A frame whose header comes from these bytes (as the transport decodes them), with this
    /// body, to rank `to` as from node `from`.
    Forged { to: u8, from: u8, header: Vec<u8>, body: Vec<u8> },
}

#[derive(Arbitrary, Debug)]
struct Input {
    codec: u8,
    len: u8,
    segment: u8,
    ops: Vec<Op>,
}

fuzz_target!(|input: Input| {
    let ring = [NodeId(0), NodeId(1), NodeId(2)];
    let codec = CodecKind::ALL[usize::from(input.codec) % CodecKind::ALL.len()];
    let n = usize::from(input.len) + 1;
    let mut values: Vec<Vec<f32>> =
        (0..3).map(|r| (0..n).map(|i| (i as f32 * 0.37 + r as f32).sin()).collect()).collect();
    let mut ranks: Vec<RingAllReduce<'_>> = values
        .iter_mut()
        .zip(ring)
        .map(|(v, me)| {
            let mut cfg = RingConfig::new(Epoch(2), 5, ring.to_vec(), me, codec);
            cfg.segment_elems = usize::from(input.segment) + 1;
            RingAllReduce::new(cfg, Payload::Real(v), Weight::ONE).expect("a ring")
        })
        .collect();
    let mut queue: std::collections::VecDeque<(NodeId, NodeId, Frame)> = Default::default();
    for op in input.ops.into_iter().take(512) {
        for r in ranks.iter_mut() {
            let me = r.config().me;
            while let Some((to, f)) = r.poll_send() {
                queue.push_back((me, to, f));
            }
        }
        let (from, to, frame) = match op {
            Op::Deliver => match queue.pop_front() {
                Some(x) => x,
                None => continue,
            },
            Op::Drop => {
                queue.pop_front();
                continue;
            }
            Op::Corrupt { at, xor } => match queue.pop_front() {
                Some((from, to, mut f)) => {
                    if let Body::Bytes(b) = &f.body {
                        let mut v = b.to_vec();
                        if !v.is_empty() {
                            let i = usize::from(at) % v.len();
                            v[i] ^= xor;
                        }
                        f.body = Body::Bytes(Bytes::from(v));
                    }
                    (from, to, f)
                }
                None => continue,
            },
            Op::Forged { to, from, header, body } => {
                let Ok(header @ Header::Collective(_)) = postcard::from_bytes::<Header>(&header)
                else {
                    continue;
                };
                let f = Frame { header, body: Body::Bytes(Bytes::from(body)) };
                (NodeId(u32::from(from % 4)), ring[usize::from(to % 3)], f)
            }
        };
        let Some(r) = ranks.iter_mut().find(|r| r.config().me == to) else { continue };
        let _ = r.handle_frame(from, &frame);
    }
    let done: Vec<bool> = ranks.iter().map(RingAllReduce::is_done).collect();
    drop(ranks);
    for (v, done) in values.iter().zip(done) {
        if done {
            assert!(v.iter().all(|x| x.is_finite()), "{codec}: a finished rank holds {v:?}");
        }
    }
});
