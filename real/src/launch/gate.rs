//! The start gate: the scenario's time 0, shared by the workers a launch starts together.
//!
//! Those workers load libtorch and build their model at different speeds (a second or more,
//! and on a loaded machine several). Each says `ready` on the status channel and then waits at
//! the gate; once all are ready (or [`super::READY_LIMIT`] passed) the launcher writes the Unix
//! time to ask to join at into the gate file, and every one asks then. Without the gate the
//! first one ready would open the coordinator's join window while the launcher's clock, and
//! with it every timed event of the scenario, starts only at the last one: the mesh would run
//! ahead of the scenario's time by the spread of the start-ups.
//!
//! The file holds one decimal number and is written whole (a temporary file renamed into
//! place): a reader sees either nothing or the whole time.

use std::path::Path;
use std::time::Duration;

/// How often a waiting worker looks at the gate.
const POLL: Duration = Duration::from_millis(5);

/// Why a worker could not pass the gate.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    /// Nothing was written in time.
    #[error("{}: the launcher did not open the start gate within {waited:?}", .path.display())]
    Timeout {
        /// The gate file.
        path: std::path::PathBuf,
        /// How long the worker waited.
        waited: Duration,
    },
    /// The file holds something else than a time.
    #[error("{}: expected a Unix time in seconds, got {text:?}", .path.display())]
    Malformed {
        /// The gate file.
        path: std::path::PathBuf,
        /// What it holds (at most 64 bytes of it).
        text: String,
    },
    /// Writing it failed.
    #[error("writing the start gate {}: {source}", .path.display())]
    Io {
        /// The gate file.
        path: std::path::PathBuf,
        /// The failure.
        source: std::io::Error,
    },
}

/// Opens the gate: every worker waiting at `path` asks to join at `unix_s`.
pub fn open(path: &Path, unix_s: f64) -> Result<(), GateError> {
    let io = |source| GateError::Io { path: path.to_path_buf(), source };
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, format!("{unix_s:.6}\n")).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// Waits at most `limit` for the gate at `path` to open; returns the Unix time to join at.
pub fn wait(path: &Path, limit: Duration) -> Result<f64, GateError> {
    let polls = limit.as_millis() / POLL.as_millis() + 1;
    for _ in 0..polls {
        match std::fs::read(path) {
            Ok(bytes) => return parse(path, &bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::thread::sleep(POLL),
            Err(source) => return Err(GateError::Io { path: path.to_path_buf(), source }),
        }
    }
    Err(GateError::Timeout { path: path.to_path_buf(), waited: limit })
}

fn parse(path: &Path, bytes: &[u8]) -> Result<f64, GateError> {
    let malformed = || GateError::Malformed {
        path: path.to_path_buf(),
        text: String::from_utf8_lossy(&bytes[..bytes.len().min(64)]).into_owned(),
    };
    let text = std::str::from_utf8(bytes).map_err(|_| malformed())?;
    text.trim().parse::<f64>().ok().filter(|t| t.is_finite() && *t >= 0.0).ok_or_else(malformed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_reads_the_time_the_launcher_wrote_and_refuses_anything_else() {
        let dir = tempfile::tempdir().unwrap();
        let gate = dir.path().join("start");
        let e = wait(&gate, Duration::from_millis(20)).unwrap_err();
        assert!(matches!(e, GateError::Timeout { .. }), "{e}");
        open(&gate, 1_800_000_000.25).unwrap();
        assert_eq!(wait(&gate, Duration::ZERO).unwrap(), 1_800_000_000.25);
        for bad in ["soon\n", "-1\n", "NaN\n", ""] {
            std::fs::write(&gate, bad).unwrap();
            let e = wait(&gate, Duration::ZERO).unwrap_err();
            assert!(matches!(e, GateError::Malformed { .. }), "{bad:?}: {e}");
        }
    }
}
