//! The mesh driving the real ring all-reduce over the in-memory harness: a member dies in the
//! middle of the reduce-scatter, or of the all-gather; the survivors abort, retry on the new
//! epoch from their kept inputs, and end bit-identical, holding the average over the survivors
//! (reference.md test case 6, last part; PRIME defects 3, 4 and 5).

use loco_core::allreduce::{Payload, RingAllReduce, RingConfig, RingError};
use loco_core::codec::CodecKind;
use loco_core::mesh::{Command, JoinMode, MemberAction, MeshConfig, MeshEvent};
use loco_core::testing::{Driver, DriverOutput, Network};
use loco_core::transport::{Frame, Header, Phase};
use loco_core::{Epoch, NodeId, Time};
use std::slice::IterMut;
use std::time::Duration;

const LEN: usize = 1000;
const SEGMENT: usize = 50;

/// A node's backend: keeps its pseudo-gradient, runs one `RingAllReduce` per shard on a fresh
/// buffer for every attempt, buffers frames of epochs it has not started yet, and reports.
struct RingNode<'a> {
    kept: Vec<f32>,
    buffers: IterMut<'a, Vec<f32>>,
    next_buffer: usize,
    codec: CodecKind,
    compute: Duration,
    sync: Duration,
    pending: Vec<(Time, Command)>,
    rings: Vec<RingAllReduce<'a>>,
    running: Option<(Epoch, u64)>,
    reported: bool,
    attempt_buffers: Vec<usize>,
    committed: Vec<(u64, Vec<usize>)>,
    future: Vec<(NodeId, Frame)>,
    /// Phases of the collective frames this node sent, in order.
    sent: Vec<Phase>,
    stale_rejected: u64,
    errors: Vec<RingError>,
}

impl<'a> RingNode<'a> {
    fn new(kept: Vec<f32>, buffers: &'a mut [Vec<f32>], codec: CodecKind) -> Self {
        RingNode {
            kept,
            buffers: buffers.iter_mut(),
            next_buffer: 0,
            codec,
            compute: Duration::from_secs(10),
            sync: Duration::from_secs(1),
            pending: Vec::new(),
            rings: Vec::new(),
            running: None,
            reported: false,
            attempt_buffers: Vec::new(),
            committed: Vec::new(),
            future: Vec::new(),
            sent: Vec::new(),
            stale_rejected: 0,
            errors: Vec::new(),
        }
    }

    fn flush(&mut self, out: &mut Vec<DriverOutput>) {
        for r in &mut self.rings {
            while let Some((to, frame)) = r.poll_send() {
                if let Header::Collective(h) = &frame.header {
                    self.sent.push(h.phase);
                }
                out.push(DriverOutput::Send { to, frame });
            }
        }
        if let Some((epoch, op)) = self.running
            && !self.reported
            && !self.rings.is_empty()
            && self.rings.iter().all(|r| r.is_done())
        {
            self.reported = true;
            out.push(DriverOutput::Command(Command::AllReduceDone { epoch, op }));
        }
    }

    fn feed(&mut self, from: NodeId, frame: Frame) {
        let Header::Collective(h) = &frame.header else { return };
        match self.running {
            // The ring itself rejects frames of older epochs.
            Some((epoch, _)) if h.epoch <= epoch && !self.rings.is_empty() => {
                let Some(ring) = self.rings.get_mut(usize::from(h.shard)) else { return };
                match ring.handle_frame(from, &frame) {
                    Ok(()) => {}
                    Err(RingError::StaleEpoch { .. }) => self.stale_rejected += 1,
                    Err(e) => self.errors.push(e),
                }
            }
            // Aborted, not restarted yet: an old frame has nowhere to go.
            Some((epoch, _)) if h.epoch <= epoch => self.stale_rejected += 1,
            // A peer learned of a newer epoch first: keep its frames for when we start it.
            _ => self.future.push((from, frame)),
        }
    }
}

impl Driver for RingNode<'_> {
    fn on_action(&mut self, now: Time, me: NodeId, a: &MemberAction, out: &mut Vec<DriverOutput>) {
        match a {
            MemberAction::Compute { outer_step, .. } => {
                let c = Command::BarrierArrive { outer_step: *outer_step };
                self.pending.push((now + self.compute, c));
            }
            MemberAction::FetchState { .. } => {
                self.pending.push((now + self.sync, Command::SyncDone))
            }
            MemberAction::StartAllReduce(s) => {
                self.rings.clear();
                self.attempt_buffers.clear();
                self.reported = false;
                let shards = usize::from(s.shards);
                for shard in 0..shards {
                    let range = (LEN * shard / shards)..(LEN * (shard + 1) / shards);
                    let buf = self.buffers.next().expect("enough buffers for every attempt");
                    self.attempt_buffers.push(self.next_buffer);
                    self.next_buffer += 1;
                    buf.clear();
                    buf.extend_from_slice(&self.kept[range]);
                    let mut cfg = RingConfig::new(s.epoch, s.op, s.ring.clone(), me, self.codec);
                    cfg.shard = shard as u16;
                    cfg.segment_elems = SEGMENT;
                    let ring = RingAllReduce::new(cfg, Payload::Real(buf.as_mut_slice()), s.weight)
                        .expect("a valid ring");
                    self.rings.push(ring);
                }
                self.running = Some((s.epoch, s.op));
                let waiting = std::mem::take(&mut self.future);
                for (from, frame) in waiting {
                    self.feed(from, frame);
                }
                self.flush(out);
            }
            MemberAction::AbortAllReduce { .. } | MemberAction::Stop(_) => {
                self.rings.clear();
                self.running = None;
                self.pending.clear();
            }
            MemberAction::Commit { outer_step, .. } => {
                self.committed.push((*outer_step, self.attempt_buffers.clone()));
            }
            _ => {}
        }
    }

    fn on_frame(&mut self, _now: Time, from: NodeId, frame: Frame, out: &mut Vec<DriverOutput>) {
        self.feed(from, frame);
        self.flush(out);
    }

    fn poll_timeout(&self) -> Option<Time> {
        self.pending.iter().map(|(t, _)| *t).min()
    }

    fn handle_timeout(&mut self, now: Time, out: &mut Vec<DriverOutput>) {
        let (due, rest): (Vec<_>, Vec<_>) = self.pending.drain(..).partition(|(t, _)| *t <= now);
        self.pending = rest;
        out.extend(due.into_iter().map(|(_, c)| DriverOutput::Command(c)));
    }
}

/// Node i's pseudo-gradient: distinct, non-trivial values.
fn input(i: u32) -> Vec<f32> {
    (0..LEN).map(|k| ((k as f32 * 0.37 + i as f32 * 1.91).sin() * 10.0) + i as f32).collect()
}

fn mean(of: &[u32]) -> Vec<f64> {
    let ins: Vec<Vec<f32>> = of.iter().map(|&i| input(i)).collect();
    (0..LEN).map(|k| ins.iter().map(|v| f64::from(v[k])).sum::<f64>() / of.len() as f64).collect()
}

fn rel_rms(got: &[f32], want: &[f64]) -> f64 {
    let num: f64 = got.iter().zip(want).map(|(g, w)| (f64::from(*g) - w).powi(2)).sum();
    let den: f64 = want.iter().map(|w| w * w).sum();
    (num / den).sqrt()
}

/// What a node did, read off its driver before the network (which borrows the buffers) drops.
struct Outcome {
    committed: Vec<(u64, Vec<usize>)>,
    sent: Vec<Phase>,
    errors: Vec<RingError>,
}

enum Kill {
    /// After the victim has sent this many reduce-scatter frames.
    ReduceScatter(usize),
    /// After the victim has sent this many all-gather frames.
    AllGather(usize),
}

struct Run {
    outcomes: Vec<Outcome>,
    results: Vec<Vec<f32>>,
    events: Vec<MeshEvent>,
}

/// Four nodes with `shards` rings each; node 3 crashes as `kill` says during the first
/// all-reduce.
fn run(codec: CodecKind, shards: u16, kill: Kill) -> Run {
    let n = 4u32;
    let victim = NodeId(3);
    let mut store: Vec<Vec<Vec<f32>>> = (0..n).map(|_| vec![Vec::new(); 32]).collect();
    let mut outcomes = Vec::new();
    let events;
    {
        let cfg = MeshConfig {
            min_members: n as usize,
            join_window: Duration::ZERO,
            ..MeshConfig::default()
        };
        let mut net: Network<RingNode<'_>> = Network::new(cfg, 42);
        for (i, bufs) in (0..n).zip(store.iter_mut()) {
            net.add_node_with(NodeId(i), RingNode::new(input(i), bufs, codec), shards, 0.0);
        }
        let deadline = Time::ZERO + Duration::from_secs(60);
        let hit = net
            .run_until_cond(deadline, |net| {
                let sent = &net.driver(victim).unwrap().sent;
                let rs = sent.iter().filter(|p| **p == Phase::ReduceScatter).count();
                let ag = sent.iter().filter(|p| **p == Phase::AllGather).count();
                match kill {
                    Kill::ReduceScatter(k) => rs >= k,
                    Kill::AllGather(k) => ag >= k,
                }
            })
            .unwrap();
        assert!(hit, "the victim reached the kill point");
        // It is in the middle: the collective has not finished anywhere.
        for i in 0..n {
            assert!(net.driver(NodeId(i)).unwrap().committed.is_empty());
        }
        net.crash(victim);
        // Evicted within the heartbeat timeout; the retry and the next steps follow.
        net.run_for(Duration::from_secs(15)).unwrap();
        for i in 0..n {
            let d = net.driver(NodeId(i)).unwrap();
            outcomes.push(Outcome {
                committed: d.committed.clone(),
                sent: d.sent.clone(),
                errors: d.errors.clone(),
            });
        }
        events = net.events().into_iter().map(|(_, e)| e.clone()).collect();
    }
    // The network is gone: read the buffers of the committed attempts.
    let results = outcomes
        .iter()
        .zip(&store)
        .map(|(o, bufs)| match o.committed.first() {
            Some((_, idx)) => idx.iter().flat_map(|&b| bufs[b].iter().copied()).collect(),
            None => Vec::new(),
        })
        .collect();
    Run { outcomes, results, events }
}

fn check_survivors(r: &Run, codec: CodecKind, tolerance: f64) {
    let survivors = [0u32, 1, 2];
    let want = mean(&survivors);
    for &i in &survivors {
        let o = &r.outcomes[i as usize];
        assert!(o.errors.is_empty(), "n{i}: {:?}", o.errors);
        assert_eq!(o.committed[0].0, 0, "n{i} committed step 0 first");
        assert_eq!(o.committed.iter().filter(|(s, _)| *s == 0).count(), 1, "n{i}: once");
        assert_eq!(r.results[i as usize].len(), LEN);
        // Bit-identical to n0.
        let a: Vec<u32> = r.results[i as usize].iter().map(|x| x.to_bits()).collect();
        let b: Vec<u32> = r.results[0].iter().map(|x| x.to_bits()).collect();
        assert!(a == b, "n{i} differs from n0");
        let e = rel_rms(&r.results[i as usize], &want);
        assert!(
            e < tolerance,
            "{codec:?}: n{i} relative RMS error {e} against the survivors' mean"
        );
    }
    // And far from the mean over all four (the dead node's contribution is not in it).
    assert!(rel_rms(&r.results[0], &mean(&[0, 1, 2, 3])) > 10.0 * tolerance);
    assert!(r.outcomes[3].committed.is_empty());
    // Released twice: epoch 1 with 4, epoch 2 with the 3 survivors, then committed in epoch 2.
    let released: Vec<(Epoch, u32, usize, f32)> = r
        .events
        .iter()
        .filter_map(|e| match e {
            MeshEvent::Released { epoch, attempt, ring, weights, .. } => {
                Some((*epoch, *attempt, ring.len(), weights.iter().map(|w| w.get()).sum()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(released, vec![(Epoch(1), 0, 4, 4.0), (Epoch(2), 1, 3, 3.0)]);
    assert!(r.events.contains(&MeshEvent::Committed { epoch: Epoch(2), outer_step: 0 }));
}

#[test]
fn a_member_dies_in_the_middle_of_the_reduce_scatter_fp32() {
    // 4 nodes, 250 values per chunk, 5 segments: 15 reduce-scatter frames per node.
    let r = run(CodecKind::Fp32, 1, Kill::ReduceScatter(7));
    assert!(!r.outcomes[3].sent.contains(&Phase::AllGather), "died before its all-gather");
    check_survivors(&r, CodecKind::Fp32, 1e-6);
}

#[test]
fn a_member_dies_in_the_middle_of_the_all_gather_fp32() {
    let r = run(CodecKind::Fp32, 1, Kill::AllGather(4));
    let ag = r.outcomes[3].sent.iter().filter(|p| **p == Phase::AllGather).count();
    assert!((4..15).contains(&ag), "died in the all-gather after {ag} frames");
    check_survivors(&r, CodecKind::Fp32, 1e-6);
}

#[test]
fn a_member_dies_in_the_middle_of_the_reduce_scatter_uint8() {
    let r = run(CodecKind::Uint8, 1, Kill::ReduceScatter(7));
    check_survivors(&r, CodecKind::Uint8, 0.05);
}

#[test]
fn a_member_dies_in_the_middle_of_the_all_gather_uint8() {
    let r = run(CodecKind::Uint8, 1, Kill::AllGather(4));
    check_survivors(&r, CodecKind::Uint8, 0.05);
}

/// A node with G local ranks runs G rings, one per shard, all under one epoch; a death in the
/// middle retries all of them on the new epoch.
#[test]
fn g_rings_per_node_share_one_epoch_and_retry_together() {
    let r = run(CodecKind::Fp32, 2, Kill::ReduceScatter(5));
    check_survivors(&r, CodecKind::Fp32, 1e-6);
    // Each committed attempt used two buffers (two shards).
    for i in 0..3 {
        assert_eq!(r.outcomes[i].committed[0].1.len(), 2);
    }
}

/// The epoch rule: a frame of an older epoch that reaches a running all-reduce is rejected by
/// it, never mixed in (the forged frame would add NaNs with a huge weight); the result is
/// unchanged.
#[test]
fn a_stale_frame_is_rejected_never_mixed_in() {
    let n = 3u32;
    let mut store: Vec<Vec<Vec<f32>>> = (0..n).map(|_| vec![Vec::new(); 8]).collect();
    let (stale, committed) = {
        let cfg = MeshConfig {
            min_members: n as usize,
            join_window: Duration::ZERO,
            ..MeshConfig::default()
        };
        let mut net: Network<RingNode<'_>> = Network::new(cfg, 7);
        net.set_latency(Duration::from_millis(20));
        net.set_default_bandwidth(1e6);
        for (i, bufs) in (0..n).zip(store.iter_mut()) {
            net.add_node(NodeId(i), RingNode::new(input(i), bufs, CodecKind::Fp32));
        }
        let deadline = Time::ZERO + Duration::from_secs(30);
        let running = net
            .run_until_cond(deadline, |net| !net.driver(NodeId(0)).unwrap().rings.is_empty())
            .unwrap();
        assert!(running);
        let forged = Frame {
            header: Header::Collective(loco_core::transport::CollectiveHeader {
                epoch: Epoch(0),
                op: loco_core::mesh::op_id(0, 0),
                shard: 0,
                phase: Phase::ReduceScatter,
                step: 0,
                chunk: 2,
                segment: 0,
                weight_sum: 1000.0,
            }),
            body: loco_core::transport::Body::Bytes(bytes::Bytes::from(vec![0xffu8; 4 * SEGMENT])),
        };
        // From each node's left neighbour in the ring [n0, n1, n2].
        net.inject(NodeId(2), NodeId(0), forged.clone());
        net.inject(NodeId(0), NodeId(1), forged);
        net.run_for(Duration::from_secs(5)).unwrap();
        let stale: u64 = (0..n).map(|i| net.driver(NodeId(i)).unwrap().stale_rejected).sum();
        let committed: Vec<_> =
            (0..n).map(|i| net.driver(NodeId(i)).unwrap().committed.clone()).collect();
        (stale, committed)
    };
    assert_eq!(stale, 2);
    let results: Vec<Vec<f32>> = committed
        .iter()
        .zip(&store)
        .map(|(c, bufs)| c[0].1.iter().flat_map(|&b| bufs[b].iter().copied()).collect())
        .collect();
    assert!(results[0] == results[1] && results[1] == results[2]);
    assert!(rel_rms(&results[0], &mean(&[0, 1, 2])) < 1e-6);
}

/// A joiner in non-blocking mode takes part in the all-reduce of its boundary with weight 0: the
/// result is the old members' average, and the joiner holds it bit for bit.
#[test]
fn a_non_blocking_joiner_contributes_weight_zero() {
    let n = 3u32;
    let mut store: Vec<Vec<Vec<f32>>> = (0..=n).map(|_| vec![Vec::new(); 8]).collect();
    let mut iter = store.iter_mut();
    let committed: Vec<Vec<(u64, Vec<usize>)>> = {
        let cfg = MeshConfig {
            min_members: n as usize,
            join_window: Duration::ZERO,
            join_mode: JoinMode::NonBlocking,
            ..MeshConfig::default()
        };
        let mut net: Network<RingNode<'_>> = Network::new(cfg, 3);
        for i in 0..n {
            let bufs = iter.next().unwrap();
            net.add_node(NodeId(i), RingNode::new(input(i), bufs, CodecKind::Fp32));
        }
        net.run_for(Duration::from_secs(5)).unwrap();
        // The joiner's "pseudo-gradient" is garbage: with weight 0 it must not count.
        let bufs = iter.next().unwrap();
        net.add_node(NodeId(9), RingNode::new(vec![1e6; LEN], bufs, CodecKind::Fp32));
        net.run_for(Duration::from_secs(10)).unwrap();
        (0..n).chain([9]).map(|i| net.driver(NodeId(i)).unwrap().committed.clone()).collect()
    };
    let results: Vec<Vec<f32>> = committed
        .iter()
        .zip(&store)
        .map(|(c, bufs)| c[0].1.iter().flat_map(|&b| bufs[b].iter().copied()).collect())
        .collect();
    for r in &results {
        assert!(*r == results[0]);
    }
    assert!(rel_rms(&results[3], &mean(&[0, 1, 2])) < 1e-6);
}
