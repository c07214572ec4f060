//! A node's first message to a peer takes the real transport's handshake: TCP's SYN and SYN-ACK,
//! then the hello and its answer, then the message: two and a half round trips (docs/fidelity.md,
//! measured in the emulated network). With `[sim] tcp = "none"` (the fluid model without TCP's
//! dynamics) a first message takes one round trip, as the calibrated scenarios assume.

use loco_core::metrics::EventKind;
use loco_core::scenario::Scenario;
use loco_sim::{ReplayOptions, replay};

/// When the coordinator queued the first join request, in a run whose only link has a one-way
/// latency of `latency_ms`.
fn first_request_s(latency_ms: u64, tcp: &str) -> f64 {
    let text = format!(
        "name = \"first-contact\"\nseed = 1\n[model]\npreset = \"tiny\"\n[diloco]\ninner_steps = 2\n\
         [mesh]\nheartbeat = \"500ms\"\nheartbeat_timeout = \"3s\"\nmin_members = 2\n\
         [[regions]]\nname = \"r\"\n[[links]]\nfrom = \"r\"\nto = \"r\"\nbandwidth = \"100Mbit/s\"\n\
         latency = \"{latency_ms}ms\"\n[[nodes]]\nname = \"n\"\ncount = 2\nstep_time = \"100ms\"\n\
         [stop]\nouter_steps = 2\n[sim]\ntcp = \"{tcp}\"\n"
    );
    let s = Scenario::from_toml_str(&text, "first-contact.toml").expect("scenario");
    let run = replay(&s, ReplayOptions::default()).expect("replay");
    run.events
        .iter()
        .find(|e| e.kind == EventKind::JoinRequest)
        .map(|e| e.time_s)
        .expect("a join request")
}

#[test]
fn a_first_message_takes_the_handshake_s_round_trips() {
    // Each way across the link takes its latency and up to a tick (1 ms) of the simulator's.
    let near =
        |t: f64, ways: f64, one_way: f64| t >= ways * one_way && t <= ways * (one_way + 0.0015);
    for latency_ms in [20, 60, 150] {
        let one_way = latency_ms as f64 / 1000.0;
        for tcp in ["cubic", "bbr"] {
            let t = first_request_s(latency_ms, tcp);
            assert!(near(t, 5.0, one_way), "{tcp}, {latency_ms} ms: {t} s");
        }
        let t = first_request_s(latency_ms, "none");
        assert!(near(t, 2.0, one_way), "none, {latency_ms} ms: {t} s");
    }
}
