//! The status channel between `loco launch` and its workers: liveness and progress, pushed. This
//! module is the channel's wire format and the worker's end ([`StatusSender`]); the launcher's
//! end is [`crate::launch::status`]. It names no metrics type: a worker forwards its
//! [`MetricsLine`](crate::node::MetricsLine)s as they are, so that the worker's code can use this
//! module without `node` and `launch` depending on each other.
//!
//! The launcher binds one Unix socket ([`StatusHub`](crate::launch::StatusHub)) and gives each worker process its path and
//! a token of its own in the environment ([`SOCKET_ENV`], [`TOKEN_ENV`]). The worker connects
//! ([`StatusSender::from_env`]) and writes JSON lines of [`StatusMsg`]: `hello` with its token,
//! `ready` once its model is loaded, every metrics line it writes, and `stopped`. A worker run by
//! hand has neither variable and no channel. The metrics files stay the record of a run; this
//! channel only tells the launcher, as it happens, that a worker is up, how far the run is, and
//! that a worker is gone (its end of the socket closes when the process exits, whatever killed it).
//!
//! Why a socket path and a token rather than an inherited pipe: inheriting a descriptor other
//! than 0-2 through `std::process::Command` needs `unsafe` (`pre_exec`, or a raw descriptor
//! number turned back into a file) or clearing close-on-exec in a process that may spawn from
//! several threads; a path and a token pass through the environment, which any spawner sets, and
//! the token both names the process a connection belongs to and keeps strays out. The
//! environment rather than a flag keeps the token out of `ps` and the worker's command line as
//! it is.
//!
//! Both ends are bounded: a line is at most [`MAX_LINE`] bytes (a longer one is skipped to its
//! end), a malformed line is logged and ignored, a connection without a valid `hello` within
//! [`HELLO_TIMEOUT_S`](crate::launch::status::HELLO_TIMEOUT_S) is dropped, and at most [`MAX_CONNECTIONS`](crate::launch::status::MAX_CONNECTIONS) are open. The worker never
//! blocks on the channel: its socket is non-blocking, unsent bytes wait in a buffer of at most
//! [`MAX_PENDING`] bytes, and a line that does not fit is dropped whole (never torn).

use loco_core::digest::WeightsDigest;
use serde::{Deserialize, Serialize};
use std::io::{ErrorKind, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The environment variable holding the status socket's path.
pub const SOCKET_ENV: &str = "LOCO_STATUS_SOCKET";
/// The environment variable holding the worker's token on the status socket.
pub const TOKEN_ENV: &str = "LOCO_STATUS_TOKEN";
/// The longest line either end accepts, newline included.
pub const MAX_LINE: usize = 64 * 1024;
/// The most bytes a worker keeps waiting for the socket.
pub const MAX_PENDING: usize = 1 << 20;

/// One line on the status channel, worker to launcher; `L` is the metrics line it forwards (the
/// launcher reads [`MetricsLine`](crate::node::MetricsLine)s:
/// [`crate::launch::StatusMsg`]).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum StatusMsg<L> {
    /// The first line: the token the launcher gave this process.
    Hello {
        /// The token.
        token: String,
    },
    /// The model is loaded; the worker is about to join (or to wait for its time to join).
    Ready,
    /// A line the worker wrote to its metrics file.
    Metrics {
        /// The line.
        line: L,
    },
    /// The worker's run ended (its last line; the process exits next).
    Stopped {
        /// Why, as the worker says it (an error's message when it failed).
        reason: String,
        /// Outer steps it committed.
        committed: u64,
        /// The digest of its outer weights (`None`, written as the empty string, when it held
        /// none).
        #[serde(with = "loco_core::digest::hex_or_empty")]
        weights_hash: Option<WeightsDigest>,
    },
}

/// A worker's end of the status channel. Cheap to clone (one shared connection); sending never
/// blocks and never fails: a broken channel is logged once and then stays silent.
#[derive(Clone)]
pub struct StatusSender {
    inner: Arc<Mutex<SenderInner>>,
}

impl std::fmt::Debug for StatusSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusSender").finish_non_exhaustive()
    }
}

struct SenderInner {
    stream: Option<UnixStream>,
    /// Bytes of whole lines not yet taken by the socket.
    pending: Vec<u8>,
    /// Lines dropped because `pending` was full.
    dropped: u64,
}

impl SenderInner {
    /// Writes what the socket takes now.
    fn try_flush(&mut self) {
        let Some(stream) = self.stream.as_mut() else { return };
        while !self.pending.is_empty() {
            match stream.write(&self.pending) {
                Ok(0) => {
                    self.close("the launcher closed the channel".into());
                    return;
                }
                Ok(n) => {
                    self.pending.drain(..n.min(self.pending.len()));
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    self.close(e.to_string());
                    return;
                }
            }
        }
    }

    fn close(&mut self, why: String) {
        tracing::warn!("status channel closed: {why}; the worker goes on without it");
        self.stream = None;
        self.pending = Vec::new();
    }
}

impl StatusSender {
    /// Connects to the launcher named by [`SOCKET_ENV`] and [`TOKEN_ENV`]; `None` when this
    /// process was not started by a launcher, or (logged) when the socket cannot be reached.
    pub fn from_env() -> Option<StatusSender> {
        let path = std::env::var_os(SOCKET_ENV).filter(|p| !p.is_empty())?;
        let token = std::env::var(TOKEN_ENV).unwrap_or_default();
        match StatusSender::connect(Path::new(&path), &token) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(
                    "status channel {}: {e}; the worker goes on without it",
                    Path::new(&path).display()
                );
                None
            }
        }
    }

    /// Connects to the status socket at `path` and says `hello` with `token`.
    pub fn connect(path: &Path, token: &str) -> std::io::Result<StatusSender> {
        let stream = UnixStream::connect(path)?;
        stream.set_nonblocking(true)?;
        let s = StatusSender {
            inner: Arc::new(Mutex::new(SenderInner {
                stream: Some(stream),
                pending: Vec::new(),
                dropped: 0,
            })),
        };
        s.send(&StatusMsg::<()>::Hello { token: token.to_owned() });
        Ok(s)
    }

    /// Says the model is loaded.
    pub fn ready(&self) {
        self.send(&StatusMsg::<()>::Ready);
    }

    /// Forwards a line of the metrics file (a [`MetricsLine`](crate::node::MetricsLine)).
    pub fn metrics<L: Serialize>(&self, line: &L) {
        self.send(&StatusMsg::Metrics { line });
    }

    /// Says the worker stopped, and waits (at most about a second) for what is pending to leave.
    pub fn stopped(&self, reason: &str, committed: u64, weights_hash: Option<WeightsDigest>) {
        self.send(&StatusMsg::<()>::Stopped { reason: reason.to_owned(), committed, weights_hash });
        for _ in 0..200 {
            let mut g = self.lock();
            g.try_flush();
            if g.pending.is_empty() || g.stream.is_none() {
                return;
            }
            drop(g);
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Lines dropped so far because the launcher did not take them in time.
    pub fn dropped(&self) -> u64 {
        self.lock().dropped
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SenderInner> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn send<L: Serialize>(&self, msg: &StatusMsg<L>) {
        let mut line = match serde_json::to_vec(msg) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!("status line not sent: {e}");
                return;
            }
        };
        line.push(b'\n');
        if line.len() > MAX_LINE {
            tracing::debug!(bytes = line.len(), "status line over the limit; not sent");
            return;
        }
        let mut g = self.lock();
        if g.stream.is_none() {
            return;
        }
        g.try_flush();
        if g.pending.len().saturating_add(line.len()) > MAX_PENDING {
            g.dropped = g.dropped.saturating_add(1);
            return;
        }
        g.pending.extend_from_slice(&line);
        g.try_flush();
    }
}
