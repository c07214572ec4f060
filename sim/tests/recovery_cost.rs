//! `[sim] state_prepare_cost` and `state_receive_cost`: live recovery's CPU time. A sender's
//! preparation delays its first piece by the bytes it digests then (not those digested ahead,
//! after its outer step) x the first; a joiner holds a
//! verified state no sooner than its fetch's start + the state's bytes x the second, so on a fast
//! link the recovery lasts that long, and with both 0 it is the network's time alone.

use loco_core::metrics::EventKind;
use loco_core::scenario::Scenario;
mod common;

use common::{run, three_tiny_nodes};
use loco_sim::RunOutput;

/// Three one-GPU nodes, the tiny model (virtual numerics: 16 bytes of state per parameter), 5
/// inner steps of 1 s, on 1 Gbit/s links; `j` starts at 9 s and joins (blocking mode). The
/// other CPU terms are 0, so that the network's time alone is known to the millisecond.
fn scenario(prepare: f64, receive: f64) -> Scenario {
    let rest = format!(
        "[[nodes]]\nname = \"j\"\ncount = 1\nstep_time = \"1s\"\nstart = \"9s\"\n\
         [stop]\nouter_steps = 5\n[sim]\ntick = \"1ms\"\nouter_cost = 0\n\
         encode_cost = 0\ndecode_cost = 0\n\
         state_prepare_cost = {prepare:e}\nstate_receive_cost = {receive:e}\n"
    );
    three_tiny_nodes("recovery-cost", 11, &rest)
}

/// The joiner's recovery: (start, done, bytes received), from its events.
fn recovery(out: &RunOutput) -> (f64, f64, u64) {
    let of = |kind| {
        let e: Vec<_> = out
            .events
            .iter()
            .filter(|e| e.kind == kind && e.node.as_deref() == Some("j"))
            .collect();
        assert_eq!(e.len(), 1, "{kind:?}: {e:?}");
        e[0].clone()
    };
    let (start, done) = (of(EventKind::RecoveryStart), of(EventKind::RecoveryDone));
    // "received {bytes} bytes of state from ..."
    let bytes = done
        .detail
        .strip_prefix("received ")
        .and_then(|d| d.split(' ').next())
        .and_then(|b| b.parse().ok())
        .unwrap_or_else(|| panic!("{done:?}"));
    (start.time_s, done.time_s, bytes)
}

/// The joiner's recovery with both costs 0 (start, done): the network's time alone (its 2.1 MB
/// over a new cubic connection: the start-up dominates), exactly as the simulator gave it before
/// it charged either cost (with its connections' handshake, which puts the start three one-way
/// latencies later than it was without).
const FREE_RECOVERY: (f64, f64) = (11.096, 11.321);

#[test]
fn a_joiners_receive_cost_bounds_its_recovery_and_zero_costs_change_nothing() {
    let free = run(&scenario(0.0, 0.0));
    let (s0, d0, bytes) = recovery(&free);
    let network = d0 - s0;
    assert!((s0 - FREE_RECOVERY.0).abs() < 1e-6, "free recovery {s0} to {d0}");
    assert!((d0 - FREE_RECOVERY.1).abs() < 1e-6, "free recovery {s0} to {d0}");
    assert_eq!(bytes, 2_102_272);
    // 30 s of intake on a link that carries the state in well under a second.
    let charged = 30.0;
    let slow = run(&scenario(0.0, charged / bytes as f64));
    let (s1, d1, bytes1) = recovery(&slow);
    assert_eq!(bytes1, bytes);
    // The fetch starts when it did; the state is held when the intake is done, not before.
    assert!((s1 - s0).abs() < 1e-9, "{s1} vs {s0}");
    assert!(d1 - s1 >= charged - 1e-3, "{s1} to {d1}");
    assert!(d1 - s1 <= charged + 0.05, "{s1} to {d1}");
    assert!((d1 - s1) - network >= charged - network - 1e-3);
    // The others waited for it at the boundary (blocking mode): the run ends that much later.
    assert_eq!((free.summary.outer_steps, slow.summary.outer_steps), (5, 5));
    let end = |o: &RunOutput| o.rows.iter().map(|r| r.end_s).fold(0.0, f64::max);
    assert!(end(&slow) - end(&free) >= charged - network - 0.1, "{} {}", end(&slow), end(&free));
    // The joiner's row of that step books the wait as recovery.
    let rec = |o: &RunOutput| {
        o.rows.iter().filter(|r| r.node == "j").map(|r| r.recovery_s).fold(0.0, f64::max)
    };
    assert!(rec(&slow) >= charged - 1e-3, "{}", rec(&slow));
    assert!(rec(&free) < 1.0, "{}", rec(&free));
}

/// The sender digested its replicated part ahead, after its outer step, as a worker does: its
/// first piece waits only for the digest of its own part.
#[test]
fn a_senders_prepare_cost_delays_the_first_piece_by_what_was_not_digested_ahead() {
    let (s0, d0, bytes) = recovery(&run(&scenario(0.0, 0.0)));
    // Hashing the whole state (both parts) would take 10 s; the own part is what is left.
    let prepare = 10.0;
    let own = bytes - loco_core::node::state::encoded_len(bytes / 16);
    let left = prepare * own as f64 / bytes as f64;
    let out = run(&scenario(prepare / bytes as f64, 0.0));
    let (s1, d1, _) = recovery(&out);
    assert!((s1 - s0).abs() < 1e-9, "{s1} vs {s0}");
    assert!((d1 - s1) - (d0 - s0) >= left - 0.05, "{s1} to {d1}, free {s0} to {d0}");
    assert!(d1 - s1 <= left + (d0 - s0) + 0.1, "{s1} to {d1}");
}

#[test]
fn the_charged_replay_is_deterministic() {
    let s = scenario(1e-6, 5e-6);
    let (a, b) = (run(&s), run(&s));
    assert_eq!(a.events, b.events);
    assert_eq!(a.rows, b.rows);
}
