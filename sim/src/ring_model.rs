//! The schedule of a whole ring all-reduce, computed at once (`[sim] collectives = "modelled"`).
//!
//! Frame by frame, a ring all-reduce over `W` members moves `2(W-1)` steps of segments per
//! member: `O(W^2)` frames, each a flow in the bandwidth model and an arrival on the agenda. At
//! a thousand members that is millions of events per all-reduce. This module computes the same
//! schedule's times directly, frame by frame but without the agenda: each frame
//!
//! - is ready when its data is here (a member's own segments at its release; any other at the
//!   arrival of the segment it forwards, from its predecessor's previous step) and its
//!   sender's codec work on it is done (`[sim] encode_cost` and `decode_cost`, one frame's work
//!   at a time per member, as the frame-by-frame simulator charges it);
//! - starts its flow when it is ready and its lane (member, shard) has finished the previous
//!   frame, and sends its wire bytes at the rate its edge gets;
//! - arrives a latency later, drawn as the event executor draws it, and no sooner than the
//!   previous frame of the same connection.
//!
//! A member is done when its last frame has arrived. The rate of each edge and shard is the
//! max-min fair share that the ring's `W x G` flows get of the network's capacities
//! ([`BandwidthModel::fair_rates`](crate::bandwidth::BandwidthModel::fair_rates)), from the
//! links in force when the frame starts: every flow counts as busy, which is what a pipelined
//! ring's steady state is. What the frame-by-frame model has and this one does not: TCP's
//! slow start on a connection's first frames, other traffic sharing the links meanwhile (state
//! transfers, probes), and the rates an edge gains while its neighbours idle. `docs/simulator.md`
//! measures the difference.
//!
//! The cost is `O(2(W-1) x W x segments)` arithmetic, a few milliseconds at a thousand members.

use crate::bandwidth::LaneTcp;
use loco_core::Time;
use loco_core::allreduce::schedule::{
    ag_send_chunk, chunk_range, rs_send_chunk, segment_count, segment_range,
};
use loco_core::codec::CodecKind;
use loco_core::transport::{HEADER_WIRE_BYTES, Phase};
use rand::Rng;
use std::time::Duration;

/// The network as a modelled ring sees it from a time on.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RingLinks {
    /// From when these figures hold.
    pub from: Time,
    /// Bytes per second of each edge and shard, at `rank x shards + shard` (rank `r`'s edge
    /// goes to rank `r + 1`).
    pub rates: Vec<f64>,
    /// The one-way latency range of each rank's edge.
    pub latency: Vec<(Duration, Duration)>,
}

/// A message's one-way latency in `[min, max]`, drawn as turmoil draws it: the minimum plus an
/// exponential share (rate 5) of the range, in whole milliseconds, capped at the maximum.
pub(crate) fn draw_latency(rng: &mut impl Rng, min: Duration, max: Duration) -> Duration {
    if max <= min {
        return min;
    }
    let u: f64 = rng.random();
    let mult = -(1.0 - u).ln() / 5.0;
    let range_ms = (max - min).as_millis() as f64;
    (min + Duration::from_millis((range_ms * mult) as u64)).min(max)
}

/// One ring all-reduce to schedule.
pub(crate) struct RingPlan<'a> {
    /// Per shard, its values and its pipelining unit.
    pub shards: &'a [(usize, usize)],
    /// How values travel.
    pub codec: CodecKind,
    /// When each member started the attempt (its release), in ring order.
    pub starts: &'a [Time],
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The segments of a ring's chunks, and where their arrivals are kept.
struct Segments {
    /// The distinct lengths of the segments.
    sizes: Vec<u64>,
    /// Per shard and chunk, its segments, as indices into `sizes`.
    chunk_segs: Vec<Vec<Vec<usize>>>,
    /// Per shard, where its segments start among a rank's arrivals.
    offsets: Vec<usize>,
    /// Arrivals kept per rank: per (rank, shard, segment), the most segments of a chunk.
    per_rank: usize,
}

impl Segments {
    /// The segments of `plan` over `w` ranks.
    fn of(plan: &RingPlan<'_>, w: usize) -> Segments {
        // Per shard and chunk, its segments (as indices into `sizes`, their distinct lengths).
        let mut sizes: Vec<u64> = Vec::new();
        let chunk_segs: Vec<Vec<Vec<usize>>> = plan
            .shards
            .iter()
            .map(|&(len, seg)| {
                (0..w)
                    .map(|c| {
                        // A gathered codec sends every contribution whole.
                        let chunk =
                            if plan.codec.sums_in_ring() { chunk_range(len, w, c) } else { 0..len };
                        (0..segment_count(chunk.len(), seg))
                            .map(|j| {
                                let v = segment_range(&chunk, seg, j).len() as u64;
                                sizes.iter().position(|&x| x == v).unwrap_or_else(|| {
                                    sizes.push(v);
                                    sizes.len() - 1
                                })
                            })
                            .collect()
                    })
                    .collect()
            })
            .collect();
        // Per shard, the most segments of a chunk: arrivals are kept per (rank, shard, segment).
        let max_segs: Vec<usize> = chunk_segs
            .iter()
            .map(|chunks| chunks.iter().map(Vec::len).max().unwrap_or(0))
            .collect();
        let offsets: Vec<usize> = max_segs
            .iter()
            .scan(0, |acc, &m| {
                let o = *acc;
                *acc += m;
                Some(o)
            })
            .collect();
        let per_rank: usize = max_segs.iter().sum();
        Segments { sizes, chunk_segs, offsets, per_rank }
    }
}

/// What sending a segment costs, per length of segment.
struct Costs {
    /// Per length, the codec's work for each kind of step (it differs at the first step of each
    /// phase): reduce-scatter first and later, all-gather first and later, gather first and
    /// later.
    kinds: Vec<[u64; 6]>,
    /// Per length, the wire bytes.
    wire: Vec<f64>,
    /// Per links in force, each lane's send time of each length, at `lane x lengths + length`.
    sends: Vec<Vec<u64>>,
    /// Per links in force, each edge's latency when it is fixed.
    fixed: Vec<Vec<Option<u64>>>,
}

impl Costs {
    /// The costs of segments of `sizes` over `lanes` lanes (ranks x shards).
    fn of(
        plan: &RingPlan<'_>,
        links: &[RingLinks],
        work: &dyn Fn(Phase, u16, u64) -> Duration,
        sizes: &[u64],
        lanes: usize,
    ) -> Costs {
        let kinds: Vec<[u64; 6]> = sizes
            .iter()
            .map(|&v| {
                [
                    nanos(work(Phase::ReduceScatter, 0, v)),
                    nanos(work(Phase::ReduceScatter, 1, v)),
                    nanos(work(Phase::AllGather, 0, v)),
                    nanos(work(Phase::AllGather, 1, v)),
                    nanos(work(Phase::Gather, 0, v)),
                    nanos(work(Phase::Gather, 1, v)),
                ]
            })
            .collect();
        let wire: Vec<f64> = sizes
            .iter()
            .map(|&v| {
                (HEADER_WIRE_BYTES + plan.codec.codec().encoded_len(v as usize) as u64) as f64
            })
            .collect();
        let n = sizes.len();
        let sends: Vec<Vec<u64>> = links
            .iter()
            .map(|l| {
                (0..lanes * n)
                    .map(|i| {
                        let rate = l.rates[i / n];
                        let secs =
                            if rate.is_finite() && rate > 0.0 { wire[i % n] / rate } else { 0.0 };
                        (secs * 1e9).ceil() as u64
                    })
                    .collect()
            })
            .collect();
        let fixed: Vec<Vec<Option<u64>>> = links
            .iter()
            .map(|l| l.latency.iter().map(|&(lo, hi)| (hi <= lo).then(|| nanos(lo))).collect())
            .collect();
        Costs { kinds, wire, sends, fixed }
    }
}

/// When each rank of `plan` is done: its last frame has arrived. `links` are sorted by their
/// `from` (the first one holds from the start); `work` is a sender's codec time on a frame of
/// (phase, step, values); `rng` draws the latencies, in a fixed order (the same stream gives the
/// same times).
pub(crate) fn finish_times(
    plan: &RingPlan<'_>,
    links: &[RingLinks],
    work: &dyn Fn(Phase, u16, u64) -> Duration,
    mut tcp: Option<&mut LaneTcp>,
    rng: &mut impl Rng,
) -> Vec<Time> {
    let w = plan.starts.len();
    let g = plan.shards.len().max(1);
    let start: Vec<u64> = plan.starts.iter().map(|t| t.as_nanos()).collect();
    let mut finish = start.clone();
    if w < 2 || links.is_empty() {
        return finish.into_iter().map(Time::from_nanos).collect();
    }
    let mut lane_free = vec![0u64; w * g];
    let mut lane_floor = vec![0u64; w * g];
    let mut cpu_free = vec![0u64; w];
    let mut last_arrival = vec![0u64; w];
    let link_at =
        |t: u64| -> usize { links.partition_point(|l| l.from.as_nanos() <= t).saturating_sub(1) };
    let Segments { sizes, chunk_segs, offsets, per_rank } = Segments::of(plan, w);
    let mut prev = vec![0u64; w * per_rank];
    let mut next = vec![0u64; w * per_rank];
    let Costs { kinds, wire, sends, fixed } = Costs::of(plan, links, work, &sizes, w * g);
    let n = sizes.len();
    // A gathering ring (the sparse codec) has only W - 1 steps, each forwarding a whole
    // contribution: rank r sends contribution r - k at step k.
    let gather = !plan.codec.sums_in_ring();
    let steps = if gather { w - 1 } else { 2 * (w - 1) };
    for k in 0..steps {
        let (phase, step) = if gather {
            (Phase::Gather, k)
        } else if k < w - 1 {
            (Phase::ReduceScatter, k)
        } else {
            (Phase::AllGather, k - (w - 1))
        };
        let kind = match (phase, step) {
            (Phase::ReduceScatter, 0) => 0,
            (Phase::ReduceScatter, _) => 1,
            (Phase::AllGather, 0) => 2,
            (Phase::AllGather, _) => 3,
            (Phase::Gather, 0) => 4,
            (Phase::Gather, _) => 5,
        };
        for r in 0..w {
            let c = match phase {
                Phase::ReduceScatter | Phase::Gather => rs_send_chunk(w, r, step),
                Phase::AllGather => ag_send_chunk(w, r, step),
            };
            let to = (r + 1) % w;
            for (s, segs) in chunk_segs.iter().enumerate() {
                for (j, &size) in segs[c].iter().enumerate() {
                    let avail = if k == 0 { start[r] } else { prev[r * per_rank + offsets[s] + j] };
                    let cost = kinds[size][kind];
                    let ready = if cost == 0 {
                        avail
                    } else {
                        cpu_free[r] = cpu_free[r].max(avail).saturating_add(cost);
                        cpu_free[r]
                    };
                    let lane = r * g + s;
                    // Its bytes are written at `ready`: a burst in TCP's start-up.
                    if let Some(t) = tcp.as_deref_mut()
                        && let Some(path) = t.paths[lane]
                    {
                        let at = Time::from_nanos(ready);
                        if let Some(f) = t.conns[lane].write(&t.tcp, at, path, wire[size]) {
                            lane_floor[lane] = lane_floor[lane].max(f.as_nanos());
                        }
                    }
                    let mut begin = ready.max(lane_free[lane]);
                    // TCP's start-up, evaluated when the flow takes its turn in its lane (at
                    // its making, or at the end of the lane's previous flow).
                    if let Some(t) = tcp.as_deref_mut()
                        && let Some(p) = t.paths[lane]
                    {
                        let turn = Time::from_nanos(avail.max(lane_free[lane]));
                        let extra =
                            t.conns[lane].extra(&t.tcp, turn, p.rtt, p.per_stream, wire[size]);
                        if extra > 0.0 {
                            begin = begin.saturating_add((extra * 1e9).ceil() as u64);
                        }
                    }
                    let e = if links.len() == 1 { 0 } else { link_at(begin) };
                    let end = begin.saturating_add(sends[e][lane * n + size]);
                    lane_free[lane] = end;
                    if let Some(t) = tcp.as_deref_mut() {
                        t.conns[lane].idle_from(Time::from_nanos(end));
                    }
                    // TCP delivers in order: no sooner than a repair its burst, or an earlier
                    // one, waits for.
                    let end = end.max(lane_floor[lane]);
                    let lat = match fixed[e][r] {
                        Some(ns) => ns,
                        None => {
                            let (lo, hi) = links[e].latency[r];
                            nanos(draw_latency(rng, lo, hi))
                        }
                    };
                    let arrive = end.saturating_add(lat).max(last_arrival[r]);
                    last_arrival[r] = arrive;
                    next[to * per_rank + offsets[s] + j] = arrive;
                    finish[to] = finish[to].max(arrive);
                }
            }
        }
        std::mem::swap(&mut prev, &mut next);
    }
    finish.into_iter().map(Time::from_nanos).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn links(w: usize, g: usize, rate: f64, lat_ms: u64) -> Vec<RingLinks> {
        let l = Duration::from_millis(lat_ms);
        vec![RingLinks { from: Time::ZERO, rates: vec![rate; w * g], latency: vec![(l, l); w] }]
    }

    fn no_work(_: Phase, _: u16, _: u64) -> Duration {
        Duration::ZERO
    }

    #[test]
    fn one_segment_per_chunk_takes_two_w_minus_one_hops() {
        // 4 ranks, 4000 fp32 values: chunks of 1000 values (4000 + 64 bytes) at 1 MB/s and
        // 10 ms: every hop takes 4.064 ms + 10 ms, and each of the 6 steps waits for the last.
        let starts = vec![Time::ZERO; 4];
        let shards = [(4000, 1 << 20)];
        let plan = RingPlan { shards: &shards, codec: CodecKind::Fp32, starts: &starts };
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let f = finish_times(&plan, &links(4, 1, 1e6, 10), &no_work, None, &mut rng);
        let hop = 4_064_000 + 10_000_000;
        for t in f {
            assert_eq!(t.as_nanos(), 6 * hop);
        }
    }

    #[test]
    fn segments_pipeline_and_a_late_rank_delays_the_others() {
        let shards = [(4000, 250)];
        let starts = vec![Time::ZERO; 4];
        let plan = RingPlan { shards: &shards, codec: CodecKind::Fp32, starts: &starts };
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let piped = finish_times(&plan, &links(4, 1, 1e6, 10), &no_work, None, &mut rng);
        // Four segments of a chunk pipeline: faster than whole chunks hop by hop.
        assert!(piped.iter().all(|t| t.as_nanos() < 6 * (4_064_000 + 10_000_000)), "{piped:?}");
        let late = vec![Time::ZERO, Time::ZERO, Time::from_nanos(50_000_000), Time::ZERO];
        let plan = RingPlan { starts: &late, ..plan };
        let delayed = finish_times(&plan, &links(4, 1, 1e6, 10), &no_work, None, &mut rng);
        for (a, b) in piped.iter().zip(&delayed) {
            assert!(b > a, "{piped:?} {delayed:?}");
        }
    }

    #[test]
    fn a_slower_link_from_a_time_on_slows_what_starts_after_it() {
        let shards = [(4000, 1 << 20)];
        let starts = vec![Time::ZERO; 4];
        let plan = RingPlan { shards: &shards, codec: CodecKind::Fp32, starts: &starts };
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let fast = finish_times(&plan, &links(4, 1, 1e6, 10), &no_work, None, &mut rng);
        let mut two = links(4, 1, 1e6, 10);
        let mut slow = two[0].clone();
        slow.from = Time::from_nanos(30_000_000);
        slow.rates = vec![0.5e6; 4];
        two.push(slow);
        let slower = finish_times(&plan, &two, &no_work, None, &mut rng);
        // Hops start at 0, 14.064, 28.128 ms, ...: the first three keep their pace; the three
        // that start after 30 ms take 8.128 ms instead of 4.064 ms to send.
        for (a, b) in fast.iter().zip(&slower) {
            assert_eq!(b.as_nanos() - a.as_nanos(), 3 * 4_064_000);
        }
    }

    #[test]
    fn codec_work_is_charged_one_frame_at_a_time() {
        let shards = [(4000, 1 << 20)];
        let starts = vec![Time::ZERO; 4];
        let plan = RingPlan { shards: &shards, codec: CodecKind::Fp32, starts: &starts };
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let work = |_: Phase, _: u16, _: u64| Duration::from_millis(1);
        let f = finish_times(&plan, &links(4, 1, 1e6, 10), &work, None, &mut rng);
        for t in f {
            assert_eq!(t.as_nanos(), 6 * (4_064_000 + 10_000_000 + 1_000_000));
        }
    }
}
