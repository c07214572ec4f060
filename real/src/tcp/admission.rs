//! Admission control of a listener, before anyone is authenticated: a bound on the handshakes in
//! flight, a short limit for the hello, a back-off on `accept` errors, and a file-descriptor
//! limit raised at start.
//!
//! The bound evicts the **oldest** handshake in flight rather than refusing the newest: a peer's
//! handshake ends within a few round trips, while a connection that opens and stays silent (a
//! flood, or a port scanner) is the oldest one soon, so a flood of idle connections costs honest
//! peers at most a redial, never a listener that refuses everyone until its timeouts run out.
//! No per-address quota: peers may share an address (a NAT, loopback), and a quota there would
//! let one of them lock out the others.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

/// Handshakes in flight at once on one listener.
pub const MAX_HANDSHAKES: usize = 128;

/// Limit for a new connection's hello (its first bytes): a dialer sends it as soon as it is
/// connected, so this is a round trip and a few retransmissions at most.
pub(super) const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// The handshakes in flight on one listener.
#[derive(Debug)]
pub(super) struct Admission {
    cap: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    next: u64,
    /// By age (admission order): dropping a sender tells that handshake it was evicted.
    in_flight: BTreeMap<u64, oneshot::Sender<()>>,
}

/// One admitted handshake; dropping it (the handshake ended) frees its place.
#[derive(Debug)]
pub(super) struct Slot {
    id: u64,
    admission: Arc<Admission>,
    evicted: oneshot::Receiver<()>,
}

impl Admission {
    /// At most `cap` (at least 1) handshakes in flight.
    pub(super) fn new(cap: usize) -> Arc<Admission> {
        Arc::new(Admission { cap: cap.max(1), state: Mutex::default() })
    }

    /// Admits a new handshake; when `cap` are in flight, the oldest is evicted first. Returns the
    /// slot and whether one was evicted.
    pub(super) fn admit(self: &Arc<Self>) -> (Slot, bool) {
        let (tx, rx) = oneshot::channel();
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let evicted = s.in_flight.len() >= self.cap && s.in_flight.pop_first().is_some();
        let id = s.next;
        s.next += 1;
        s.in_flight.insert(id, tx);
        (Slot { id, admission: self.clone(), evicted: rx }, evicted)
    }

    /// Handshakes in flight now.
    #[cfg(test)]
    pub(super) fn in_flight(&self) -> usize {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).in_flight.len()
    }
}

impl Slot {
    /// Completes when this handshake has been evicted to make room for a newer one.
    pub(super) async fn evicted(&mut self) {
        // The sender is only ever dropped (evicted) or kept until the slot drops.
        let _ = (&mut self.evicted).await;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut s = self.admission.state.lock().unwrap_or_else(|e| e.into_inner());
        s.in_flight.remove(&self.id);
    }
}

/// The pause after an `accept` error (out of file descriptors, out of memory): doubling from
/// 10 ms to 1 s, and back to none after a success, so that a listener out of descriptors neither
/// spins on a core nor stays deaf once they are free again.
#[derive(Debug, Default)]
pub(super) struct Backoff {
    errors: u32,
}

impl Backoff {
    /// The pause before the next `accept` after an error (and whether this is the first error
    /// in a row, to be logged).
    pub(super) fn failed(&mut self) -> (Duration, bool) {
        let first = self.errors == 0;
        let ms = 10u64.saturating_mul(1 << self.errors.min(7)).min(1000);
        self.errors = self.errors.saturating_add(1);
        (Duration::from_millis(ms), first)
    }

    /// An `accept` succeeded.
    pub(super) fn succeeded(&mut self) {
        self.errors = 0;
    }
}

/// Raises this process's soft limit of open files to its hard limit, once: a node holds a
/// connection per peer and stream, and a listener under a flood needs room to accept and evict.
/// Best effort: a refusal is logged.
pub fn raise_fd_limit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        use nix::sys::resource::{Resource, getrlimit, setrlimit};
        match getrlimit(Resource::RLIMIT_NOFILE) {
            Ok((soft, hard)) if soft < hard => {
                if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
                    tracing::debug!("raising the open-files limit from {soft} to {hard}: {e}");
                }
            }
            Ok(_) => {}
            Err(e) => tracing::debug!("reading the open-files limit: {e}"),
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_handshake_makes_room_and_ended_ones_free_theirs() {
        let a = Admission::new(3);
        let (mut s0, e0) = a.admit();
        let (s1, e1) = a.admit();
        let (s2, e2) = a.admit();
        assert!(!e0 && !e1 && !e2);
        assert_eq!(a.in_flight(), 3);
        let (s3, e3) = a.admit();
        assert!(e3, "the fourth evicts one");
        assert_eq!(a.in_flight(), 3);
        // The oldest (s0) was the one told.
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(5), s0.evicted()).await.unwrap();
        });
        drop(s0);
        assert_eq!(a.in_flight(), 3, "an evicted slot's drop frees nothing twice");
        drop(s1);
        assert_eq!(a.in_flight(), 2);
        let (_s4, e4) = a.admit();
        assert!(!e4, "a place freed by an ended handshake is taken without evicting");
        drop((s2, s3));
        assert_eq!(a.in_flight(), 1);
    }

    #[test]
    fn accept_errors_back_off_to_a_second_and_reset() {
        let mut b = Backoff::default();
        let pauses: Vec<(Duration, bool)> = (0..10).map(|_| b.failed()).collect();
        assert_eq!(pauses[0], (Duration::from_millis(10), true));
        assert_eq!(pauses[1], (Duration::from_millis(20), false));
        assert!(pauses.windows(2).all(|w| w[0].0 <= w[1].0));
        assert_eq!(pauses[9].0, Duration::from_secs(1));
        b.succeeded();
        assert_eq!(b.failed(), (Duration::from_millis(10), true));
    }
}
