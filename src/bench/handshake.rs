//! `loco bench handshake`: what a connection's handshake costs in each security mode.

use crate::cli::HandshakeBench;
use anyhow::{Result, anyhow};
use loco_real::tcp::cost::{HandshakeMode, handshakes};

/// One mode's figure.
#[derive(serde::Serialize)]
struct Row {
    mode: &'static str,
    /// Both ends' CPU per handshake, microseconds (the best measurement).
    micros: f64,
    /// Against the secret alone, measured in the same run.
    vs_secret: f64,
}

const MODES: [(HandshakeMode, &str); 3] = [
    (HandshakeMode::Plain, "plain (no secret)"),
    (HandshakeMode::Secret, "secret (Noise NNpsk0)"),
    (HandshakeMode::Keyed, "secret + node keys (Noise IKpsk1)"),
];

/// Measures every mode `repeats` times, interleaved (the machine's noise falls on all alike),
/// and prints the best of each.
pub(crate) fn run(a: &HandshakeBench) -> Result<()> {
    if a.count == 0 || a.repeats == 0 {
        return Err(crate::InputError(anyhow!("--count and --repeats: expected at least 1")).into());
    }
    let mut best = [f64::INFINITY; 3];
    for _ in 0..a.repeats {
        for (i, (mode, _)) in MODES.iter().enumerate() {
            let started = crate::clock::now();
            handshakes(*mode, a.count).map_err(|e| anyhow!("{e}"))?;
            let t = crate::clock::now().duration_since(started);
            best[i] = best[i].min(t.as_secs_f64() * 1e6 / a.count as f64);
        }
    }
    let rows: Vec<Row> = MODES
        .iter()
        .zip(best)
        .map(|((_, mode), micros)| Row { mode, micros, vs_secret: micros / best[1] })
        .collect();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!("handshake, both ends on one thread ({} handshakes, best of {}):", a.count, a.repeats);
    println!("{:<36} {:>12} {:>10}", "mode", "us each", "vs secret");
    for r in &rows {
        println!("{:<36} {:>12.1} {:>9.2}x", r.mode, r.micros, r.vs_secret);
    }
    Ok(())
}
