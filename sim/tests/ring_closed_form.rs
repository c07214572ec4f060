//! A churn-free ring all-reduce over the simulator's transport takes the closed-form time of a
//! ring: `2(W-1)/W x payload / bottleneck bandwidth + 2(W-1) x latency`.

use loco_core::allreduce::{RingConfig, run_ring};
use loco_core::codec::CodecKind;
use loco_core::transport::HEADER_WIRE_BYTES;
use loco_core::{Epoch, NodeId, Time, Weight};
use loco_sim::bandwidth::PairCaps;
use loco_sim::clock;
use loco_sim::net::{NetShared, SimTransport, host_name};
use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

struct Case {
    world: u32,
    elems: usize,
    segment_elems: usize,
    codec: CodecKind,
    /// Bytes per second of one connection, per directed pair (sender, receiver).
    rate: fn(u32, u32) -> f64,
    latency: Duration,
    tick: Duration,
    /// G parallel rings per node (one per shard), each over 1/G of the payload.
    shards: u16,
    streams: Option<u32>,
    nic: Option<f64>,
}

impl Case {
    /// The textbook ring of these tests: W = 4, 100 MB of fp32 over 1 Gbit/s connections with
    /// 50 ms one-way latency, one ring per node, 1 ms ticks, no NIC limit. Tests override fields.
    fn base() -> Case {
        Case {
            world: 4,
            elems: 25_000_000,
            segment_elems: 6_250_000,
            codec: CodecKind::Fp32,
            rate: |_, _| 125e6,
            latency: Duration::from_millis(50),
            tick: Duration::from_millis(1),
            shards: 1,
            streams: None,
            nic: None,
        }
    }
}

/// Runs the all-reduce and returns, per node, the simulated seconds it took.
fn simulate(c: &Case) -> Vec<f64> {
    let shared = NetShared::new();
    let ring: Vec<NodeId> = (0..c.world).map(NodeId).collect();
    {
        let mut bw = shared.bandwidth.borrow_mut();
        for &a in &ring {
            bw.set_nic(Time::ZERO, a, c.nic);
            for &b in &ring {
                if a != b {
                    let caps = PairCaps { per_stream: (c.rate)(a.0, b.0), streams: c.streams };
                    bw.set_pair(Time::ZERO, a, b, caps);
                }
            }
        }
    }
    let mut sim = turmoil::Builder::new()
        .tick_duration(c.tick)
        .simulation_duration(Duration::from_secs(3600))
        .min_message_latency(Duration::ZERO)
        .max_message_latency(Duration::ZERO)
        .rng_seed(1)
        .build();
    let done: Rc<RefCell<Vec<Option<f64>>>> = Rc::new(RefCell::new(vec![None; ring.len()]));
    let start = Duration::from_millis(50);
    for &me in &ring {
        let (shared, ring, done) = (shared.clone(), ring.clone(), done.clone());
        let (elems, seg, codec, shards) = (c.elems, c.segment_elems, c.codec, c.shards);
        sim.host(host_name(me), move || {
            let (shared, ring, done) = (shared.clone(), ring.clone(), done.clone());
            async move {
                let mut t = SimTransport::bind(me, shared).await?;
                clock::sleep_until(clock::from_duration(start)).await;
                let t0 = clock::now();
                // G rings at once, each over its shard, multiplexed on one transport.
                let per = elems / usize::from(shards);
                let mut machines = Vec::new();
                for s in 0..shards {
                    let mut cfg = RingConfig::new(Epoch(1), 7, ring.clone(), me, codec);
                    cfg.shard = s;
                    cfg.segment_elems = seg;
                    machines.push(loco_core::allreduce::RingAllReduce::new(
                        cfg,
                        loco_core::allreduce::Payload::Virtual(per),
                        Weight::ONE,
                    )?);
                }
                if shards == 1 {
                    // The generic driver over the Transport trait.
                    let mut cfg = RingConfig::new(Epoch(1), 7, ring.clone(), me, codec);
                    cfg.segment_elems = seg;
                    machines.clear();
                    run_ring(&mut t, cfg, None, elems, Weight::ONE).await?;
                } else {
                    loop {
                        for m in &mut machines {
                            while let Some((to, f)) = m.poll_send() {
                                t.enqueue(to, f);
                            }
                        }
                        if machines.iter().all(|m| m.is_done()) {
                            break;
                        }
                        let (from, f) = t.next().await?;
                        let loco_core::transport::Header::Collective(h) = &f.header else {
                            continue;
                        };
                        machines[usize::from(h.shard)].handle_frame(from, &f)?;
                    }
                }
                let took = clock::now().saturating_since(t0).as_secs_f64();
                done.borrow_mut()[me.0 as usize] = Some(took);
                // Keep the host (and its writer tasks) alive for the others.
                std::future::pending::<()>().await;
                Ok(())
            }
        });
    }
    for &a in &ring {
        for &b in &ring {
            if a < b {
                sim.set_link_latency(host_name(a), host_name(b), c.latency);
            }
        }
    }
    while done.borrow().iter().any(Option::is_none) {
        sim.step().expect("simulation step");
        assert!(sim.elapsed() < Duration::from_secs(3000), "all-reduce did not finish");
    }
    done.borrow().iter().map(|d| d.unwrap_or(f64::NAN)).collect()
}

/// The closed form of a pipelined ring. Each of the `2(W-1)` steps moves one chunk of
/// `payload / W` bytes in `k` segments over the bottleneck `rate`; a step can start on a link
/// once the link is free and the first segment of the previous step has arrived, so the period
/// of a step is `P = max(k t_seg, t_seg + L)`, and the last segment arrives `L` after it is
/// sent: `T = (2(W-1) - 1) P + k t_seg + L`. With one segment per chunk this is the textbook
/// `2(W-1) (payload / W / rate + L)`; with many it tends to `2(W-1)/W x payload / rate + L`.
fn closed_form(c: &Case, rate: f64) -> f64 {
    let w = c.world as usize;
    let per_ring = c.elems / usize::from(c.shards);
    let chunk = per_ring / w;
    let k = chunk.div_ceil(c.segment_elems);
    let seg_bytes = c.codec.codec().encoded_len(chunk / k) as u64 + HEADER_WIRE_BYTES;
    let t_seg = seg_bytes as f64 / rate;
    let l = c.latency.as_secs_f64();
    let p = (k as f64 * t_seg).max(t_seg + l);
    let steps = 2.0 * (w as f64 - 1.0);
    (steps - 1.0) * p + k as f64 * t_seg + l
}

/// `rate` is the bottleneck rate of one ring (per shard). The collective's time is the time of
/// its slowest node: with a heterogeneous ring, nodes upstream of the slow link finish earlier.
fn check(c: &Case, rate: f64) {
    let expected = closed_form(c, rate);
    let got = simulate(c);
    let slowest = got.iter().copied().fold(0.0, f64::max);
    // The issue asks for 5%; the model is within 0.5% (a tick per hop), so 2% catches drift.
    let err = (slowest - expected).abs() / expected;
    assert!(
        err < 0.02,
        "simulated {slowest:.4} s, closed form {expected:.4} s ({:.1}% off); per node {got:?}",
        err * 100.0
    );
    for g in &got {
        assert!(*g <= slowest && *g > 0.5 * expected, "{got:?}");
    }
    eprintln!("W={} closed form {expected:.4} s, simulated {got:?}", c.world);
}

#[test]
fn store_and_forward_ring_matches_the_textbook_closed_form() {
    // W = 4, 100 MB of fp32 at 1 Gbit/s per connection, 50 ms one-way latency, one segment per
    // chunk: 2(W-1) (25 MB / 125 MB/s + 50 ms) = 1.5 s.
    let c = Case::base();
    let t = closed_form(&c, 125e6);
    assert!((t - 1.5).abs() < 1e-3, "{t}");
    check(&c, 125e6);
}

#[test]
fn pipelined_ring_hides_the_latency() {
    // The same ring in 5 segments per chunk: 2(W-1)/W x payload / rate + L = 1.25 s.
    let c = Case { segment_elems: 1_250_000, ..Case::base() };
    let t = closed_form(&c, 125e6);
    assert!((t - 1.25).abs() < 1e-3, "{t}");
    check(&c, 125e6);
}

#[test]
fn the_slowest_link_sets_the_pace() {
    // W = 6 uint8 ring; one directed link (2 -> 3) is 4x slower than the others.
    let c = Case {
        world: 6,
        elems: 60_000_000,
        segment_elems: 2_500_000,
        codec: CodecKind::Uint8,
        rate: |a, b| if (a, b) == (2, 3) { 62.5e6 } else { 250e6 },
        latency: Duration::from_millis(30),
        ..Case::base()
    };
    check(&c, 62.5e6);
}

#[test]
fn parallel_shard_rings_share_the_nic() {
    // W = 5, 8 rings per node over 8 streams of 500 Mbit/s each, but a 2 Gbit/s NIC: the
    // bottleneck is the NIC (250 MB/s), not 8 x 62.5 MB/s = 500 MB/s.
    let c = Case {
        world: 5,
        elems: 80_000_000,
        segment_elems: 1_000_000,
        codec: CodecKind::Uint8,
        rate: |_, _| 62.5e6,
        latency: Duration::from_millis(20),
        shards: 8,
        streams: Some(8),
        nic: Some(250e6),
        ..Case::base()
    };
    // Each of the 8 rings gets 1/8 of the NIC.
    check(&c, 250e6 / 8.0);
}

#[test]
fn a_replayed_churn_free_scenario_matches_the_closed_form() {
    // The whole stack (mesh, 8 shard rings per node, transport, bandwidth model) from a
    // scenario: 4 nodes of 8 GPUs, the 1B model in uint8 (1.236 GB), 2 Gbit/s per node pair
    // shared by the 8 rings (streams = 1), 20 ms one-way. The fluid model alone (`tcp =
    // "none"`): the closed form has no TCP start-up term.
    let toml = r#"
name = "closed-form"
seed = 9
[model]
preset = "1b"
[diloco]
inner_steps = 20
codec = "uint8"
[mesh]
join_window = "1s"
[[regions]]
name = "r"
[[links]]
from = "r"
to = "r"
bandwidth = "2Gbit/s"
latency = "20ms"
[[nodes]]
name = "n"
count = 4
gpus = 8
step_time = "1s"
[stop]
outer_steps = 3
[sim]
tick = "1ms"
tcp = "none"
"#;
    let s =
        loco_core::scenario::Scenario::from_toml_str(toml, "closed-form.toml").expect("scenario");
    let out = loco_sim::replay(&s, loco_sim::ReplayOptions::default()).expect("replay");
    assert!(out.summary.invariants.ok, "{:?}", out.summary.invariants.violations);
    let params = s.model().param_count() as usize;
    // The simulator's pipelining unit for sizes only: a quarter of a chunk.
    let chunk = params / 8 / 4;
    let c = Case {
        elems: params,
        segment_elems: chunk.div_ceil(4),
        codec: CodecKind::Uint8,
        rate: |_, _| 0.0,
        latency: Duration::from_millis(20),
        shards: 8,
        streams: Some(1),
        ..Case::base()
    };
    // Each ring gets 1/8 of the pair's 250 MB/s. A row's all-reduce runs from the release to
    // the commit: the ring, then `Done` to the coordinator and `Commit` back (two latencies).
    let ring = closed_form(&c, 250e6 / 8.0);
    let expected = ring + 2.0 * 0.020;
    let bw_only = 2.0 * 3.0 / 4.0 * s.model().payload_bytes(CodecKind::Uint8) as f64 / 250e6;
    assert!((ring - bw_only) / bw_only < 0.02, "{ring} vs {bw_only}");
    assert_eq!(out.rows.len(), 12);
    for r in &out.rows {
        let err = (r.allreduce_s - expected).abs() / expected;
        assert!(err < 0.05, "{}: {} s, closed form {expected:.3} s", r.node, r.allreduce_s);
    }
    eprintln!(
        "scenario: closed form {expected:.3} s, rows {:?}",
        out.rows.iter().map(|r| r.allreduce_s).collect::<Vec<_>>()
    );
}
