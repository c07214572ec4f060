//! The launcher's end of the status channel between `loco launch` and its workers: one Unix
//! socket ([`StatusHub`]), a token per process, every connection read by one `poll(2)` loop.
//! [`crate::worker_status`] describes the channel, and holds its wire format and the worker's
//! end; this module reads it as [`StatusMsg`]s of [`MetricsLine`]s.
//!
//! The hub is bounded: a line is at most [`MAX_LINE`] bytes (a longer one is skipped to its end),
//! a malformed line is logged and ignored, a connection without a valid `hello` within
//! [`HELLO_TIMEOUT_S`] is dropped, and at most [`MAX_CONNECTIONS`] are open.

use crate::node::MetricsLine;
use std::collections::HashMap;
use std::io::{ErrorKind, Read};
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use crate::worker_status::{MAX_LINE, MAX_PENDING, SOCKET_ENV, StatusSender, TOKEN_ENV};

/// One line on the status channel as the launcher reads it.
pub type StatusMsg = crate::worker_status::StatusMsg<MetricsLine>;

/// The most connections the launcher keeps open.
pub const MAX_CONNECTIONS: usize = 256;
/// Seconds a new connection has to send its `hello`.
pub const HELLO_TIMEOUT_S: f64 = 5.0;

/// What the launcher hears from its processes.
#[derive(Clone, Debug)]
pub enum StatusEvent {
    /// A line from the process registered under `key`.
    Message {
        /// The key given to [`StatusHub::register`].
        key: usize,
        /// The line.
        msg: StatusMsg,
    },
    /// The process's connection closed: it exited, or closed the channel.
    Closed {
        /// The key given to [`StatusHub::register`].
        key: usize,
    },
}

/// One accepted connection.
struct Conn {
    stream: UnixStream,
    /// The process, once it said `hello` with its token.
    key: Option<usize>,
    /// The current line so far.
    buf: Vec<u8>,
    /// Dropping the rest of a line that was too long.
    skipping: bool,
    opened_s: f64,
    /// Set when the connection is to go.
    closed: bool,
}

/// The launcher's end: one listening socket, a token per process, every connection read by one
/// `poll(2)` loop.
pub struct StatusHub {
    listener: UnixListener,
    path: PathBuf,
    tokens: HashMap<String, usize>,
    conns: Vec<Conn>,
}

impl std::fmt::Debug for StatusHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusHub")
            .field("path", &self.path)
            .field("connections", &self.conns.len())
            .finish_non_exhaustive()
    }
}

/// The longest socket path bound in place (Linux's `sun_path` holds 108 bytes with its NUL);
/// longer ones are bound in the temporary directory instead.
const MAX_SOCKET_PATH: usize = 100;

impl StatusHub {
    /// Binds the socket at `path` (an older socket file there is replaced), or, when `path` is
    /// too long for a socket, at a short path in the temporary directory.
    pub fn bind(path: &Path) -> std::io::Result<StatusHub> {
        let mut path = std::path::absolute(path)?;
        if path.as_os_str().len() > MAX_SOCKET_PATH {
            path = std::env::temp_dir().join(format!(
                "loco-status-{}-{}.sock",
                std::process::id(),
                token()?
            ));
        }
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let listener = UnixListener::bind(&path)?;
        listener.set_nonblocking(true)?;
        Ok(StatusHub { listener, path, tokens: HashMap::new(), conns: Vec::new() })
    }

    /// Where the socket is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A fresh token for the process `key`; it is good for one connection.
    pub fn register(&mut self, key: usize) -> std::io::Result<String> {
        let t = token()?;
        self.tokens.insert(t.clone(), key);
        Ok(t)
    }

    /// Waits at most `timeout` for something to read, then takes every connection and line that
    /// is there. `now_s` (seconds, any fixed origin) times out connections that never said hello.
    pub fn wait(&mut self, now_s: f64, timeout: Duration) -> Vec<StatusEvent> {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        let ms = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
        let ready: Vec<bool> = {
            let mut fds = Vec::with_capacity(self.conns.len() + 1);
            fds.push(PollFd::new(self.listener.as_fd(), PollFlags::POLLIN));
            for c in &self.conns {
                fds.push(PollFd::new(c.stream.as_fd(), PollFlags::POLLIN));
            }
            match poll(&mut fds, PollTimeout::from(ms)) {
                Ok(_) => fds.iter().map(|f| f.any().unwrap_or(false)).collect(),
                Err(nix::errno::Errno::EINTR) => vec![false; fds.len()],
                Err(e) => {
                    tracing::warn!("status channel: poll: {e}");
                    std::thread::sleep(timeout.min(Duration::from_millis(100)));
                    vec![true; fds.len()]
                }
            }
        };
        let mut events = Vec::new();
        for (i, _) in ready.iter().enumerate().skip(1).filter(|(_, r)| **r) {
            if let Some(c) = self.conns.get_mut(i - 1) {
                read_conn(c, &mut self.tokens, &mut events);
            }
        }
        if ready.first().copied().unwrap_or(false) {
            self.accept(now_s, &mut events);
        }
        for c in &mut self.conns {
            if c.key.is_none() && !c.closed && now_s - c.opened_s > HELLO_TIMEOUT_S {
                tracing::warn!("status channel: a connection said no hello in time; closed");
                c.closed = true;
            }
        }
        self.conns.retain(|c| !c.closed);
        events
    }

    fn accept(&mut self, now_s: f64, events: &mut Vec<StatusEvent>) {
        // Bounded: at most as many as may be open.
        for _ in 0..MAX_CONNECTIONS {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    if self.conns.len() >= MAX_CONNECTIONS {
                        tracing::warn!(
                            "status channel: {MAX_CONNECTIONS} connections open; refused one"
                        );
                        continue;
                    }
                    if let Err(e) = stream.set_nonblocking(true) {
                        tracing::warn!("status channel: {e}");
                        continue;
                    }
                    let mut c = Conn {
                        stream,
                        key: None,
                        buf: Vec::new(),
                        skipping: false,
                        opened_s: now_s,
                        closed: false,
                    };
                    // What it sent already (a short-lived process may have said everything).
                    read_conn(&mut c, &mut self.tokens, events);
                    if !c.closed {
                        self.conns.push(c);
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::warn!("status channel: accept: {e}");
                    return;
                }
            }
        }
    }
}

impl Drop for StatusHub {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Reads what `c` has (at most 64 reads of 8 KiB, so one chatty process cannot hold the loop),
/// turning whole lines into events.
fn read_conn(c: &mut Conn, tokens: &mut HashMap<String, usize>, events: &mut Vec<StatusEvent>) {
    let mut chunk = [0u8; 8192];
    for _ in 0..64 {
        match c.stream.read(&mut chunk) {
            Ok(0) => {
                c.closed = true;
                if let Some(key) = c.key {
                    events.push(StatusEvent::Closed { key });
                }
                return;
            }
            Ok(n) => {
                for piece in chunk.get(..n).unwrap_or_default().split_inclusive(|&b| b == b'\n') {
                    take_piece(c, piece, tokens, events);
                    if c.closed {
                        return;
                    }
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::warn!("status channel: read: {e}");
                c.closed = true;
                if let Some(key) = c.key {
                    events.push(StatusEvent::Closed { key });
                }
                return;
            }
        }
    }
}

/// Adds a piece of a line (ending in a newline or not) to `c`'s line, and takes the line when it
/// is whole.
fn take_piece(
    c: &mut Conn,
    piece: &[u8],
    tokens: &mut HashMap<String, usize>,
    events: &mut Vec<StatusEvent>,
) {
    let (body, whole) = match piece.strip_suffix(b"\n") {
        Some(b) => (b, true),
        None => (piece, false),
    };
    if c.skipping {
        c.skipping = !whole;
        return;
    }
    if c.buf.len().saturating_add(body.len()) >= MAX_LINE {
        tracing::warn!("status channel: a line over {MAX_LINE} bytes; ignored");
        c.buf = Vec::new();
        c.skipping = !whole;
        return;
    }
    c.buf.extend_from_slice(body);
    if !whole {
        return;
    }
    let line = std::mem::take(&mut c.buf);
    let msg: StatusMsg = match serde_json::from_slice(&line) {
        Ok(m) => m,
        Err(e) => {
            let shown = String::from_utf8_lossy(line.get(..line.len().min(80)).unwrap_or_default())
                .into_owned();
            tracing::warn!(key = ?c.key, "status channel: a malformed line ({e}): {shown:?}; ignored");
            if c.key.is_none() {
                c.closed = true; // a stranger: no hello
            }
            return;
        }
    };
    match (c.key, msg) {
        (None, StatusMsg::Hello { token }) => match tokens.remove(&token) {
            Some(key) => c.key = Some(key),
            None => {
                tracing::warn!("status channel: a hello with an unknown token; closed");
                c.closed = true;
            }
        },
        (None, _) => {
            tracing::warn!("status channel: a connection spoke before its hello; closed");
            c.closed = true;
        }
        (Some(key), StatusMsg::Hello { .. }) => {
            tracing::warn!(key, "status channel: a second hello; ignored");
        }
        (Some(key), msg) => events.push(StatusEvent::Message { key, msg }),
    }
}

/// 128 random bits, in hex.
fn token() -> std::io::Result<String> {
    use rand::TryRngCore;
    let mut b = [0u8; 16];
    rand::rngs::OsRng.try_fill_bytes(&mut b).map_err(std::io::Error::other)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use loco_core::metrics::{EventKind, EventRow};
    use std::io::Write;

    fn hub() -> (tempfile::TempDir, StatusHub) {
        let dir = tempfile::tempdir().unwrap();
        let hub = StatusHub::bind(&dir.path().join("status.sock")).unwrap();
        (dir, hub)
    }

    /// Waits until `n` events came (at most 100 rounds of 20 ms).
    fn collect(hub: &mut StatusHub, n: usize) -> Vec<StatusEvent> {
        let mut all = Vec::new();
        for _ in 0..100 {
            all.extend(hub.wait(0.0, Duration::from_millis(20)));
            if all.len() >= n {
                break;
            }
        }
        all
    }

    fn kinds(ev: &[StatusEvent]) -> Vec<String> {
        ev.iter()
            .map(|e| match e {
                StatusEvent::Message { key, msg } => {
                    let k = match msg {
                        StatusMsg::Hello { .. } => "hello",
                        StatusMsg::Ready => "ready",
                        StatusMsg::Metrics { .. } => "metrics",
                        StatusMsg::Stopped { .. } => "stopped",
                    };
                    format!("{key}:{k}")
                }
                StatusEvent::Closed { key } => format!("{key}:closed"),
            })
            .collect()
    }

    #[test]
    fn a_sender_s_lines_arrive_in_order_and_its_exit_closes_the_channel() {
        let (_d, mut hub) = hub();
        let token = hub.register(7).unwrap();
        let s = StatusSender::connect(hub.path(), &token).unwrap();
        s.ready();
        s.metrics(&MetricsLine::Event(EventRow::new(0.5, EventKind::Start).node("n-0")));
        let hash = "00000000000000ab".parse().ok();
        s.stopped("the run is over", 3, hash);
        drop(s);
        let ev = collect(&mut hub, 4);
        assert_eq!(kinds(&ev), ["7:ready", "7:metrics", "7:stopped", "7:closed"]);
        match &ev[2] {
            StatusEvent::Message {
                msg: StatusMsg::Stopped { committed, weights_hash, .. },
                ..
            } => {
                assert_eq!((*committed, *weights_hash), (3, hash));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn malformed_and_overlong_lines_are_ignored_and_the_next_line_counts() {
        let (_d, mut hub) = hub();
        let token = hub.register(1).unwrap();
        let mut raw = UnixStream::connect(hub.path()).unwrap();
        let hello = format!("{{\"kind\":\"hello\",\"token\":\"{token}\"}}\n");
        raw.write_all(hello.as_bytes()).unwrap();
        raw.write_all(b"not json\n{\"kind\":\"nope\"}\n\xff\xfe\n\n").unwrap();
        // A line three times the limit, in pieces, then a good one right after its newline.
        let long = vec![b'x'; 3 * MAX_LINE];
        let writer = std::thread::Builder::new()
            .spawn(move || {
                raw.write_all(&long).unwrap();
                raw.write_all(b"\n{\"kind\":\"ready\"}\n").unwrap();
                raw
            })
            .unwrap();
        let ev = collect(&mut hub, 1);
        let raw = writer.join().unwrap();
        assert_eq!(kinds(&ev), ["1:ready"]);
        drop(raw);
        assert_eq!(kinds(&collect(&mut hub, 1)), ["1:closed"]);
    }

    #[test]
    fn strangers_wrong_tokens_and_reused_tokens_are_shut_out() {
        let (_d, mut hub) = hub();
        let token = hub.register(2).unwrap();
        let mut garbage = UnixStream::connect(hub.path()).unwrap();
        garbage.write_all(b"GET / HTTP/1.1\n").unwrap();
        let mut early = UnixStream::connect(hub.path()).unwrap();
        early.write_all(b"{\"kind\":\"ready\"}\n").unwrap();
        let wrong = StatusSender::connect(hub.path(), "0123").unwrap();
        wrong.ready();
        let good = StatusSender::connect(hub.path(), &token).unwrap();
        good.ready();
        let again = StatusSender::connect(hub.path(), &token).unwrap();
        again.ready();
        let ev = collect(&mut hub, 2);
        assert_eq!(kinds(&ev), ["2:ready"], "only the first holder of the token is heard");
        // The strangers' connections were closed by the hub.
        let mut buf = [0u8; 1];
        garbage.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        assert_eq!(garbage.read(&mut buf).unwrap(), 0);
        assert_eq!(hub.conns.len(), 1, "only the good connection is kept");
    }

    #[test]
    fn a_connection_that_never_says_hello_is_dropped_after_the_timeout() {
        let (_d, mut hub) = hub();
        let _silent = UnixStream::connect(hub.path()).unwrap();
        assert!(hub.wait(0.0, Duration::from_millis(50)).is_empty());
        assert_eq!(hub.conns.len(), 1);
        assert!(hub.wait(HELLO_TIMEOUT_S + 1.0, Duration::ZERO).is_empty());
        assert_eq!(hub.conns.len(), 0);
    }

    #[test]
    fn a_sender_without_a_launcher_drops_lines_instead_of_blocking() {
        let (_d, mut hub) = hub();
        let token = hub.register(3).unwrap();
        let s = StatusSender::connect(hub.path(), &token).unwrap();
        // Nobody reads: the socket's buffer fills, then the pending buffer, then lines drop.
        let row = MetricsLine::Event(
            EventRow::new(0.0, EventKind::Start).node("n").detail("x".repeat(4000)),
        );
        for _ in 0..2000 {
            s.metrics(&row);
        }
        assert!(s.dropped() > 0, "8 MB of lines do not fit");
        // Every line the hub then reads is whole.
        let ev = collect(&mut hub, 10);
        assert!(!ev.is_empty());
        assert!(ev.iter().all(|e| matches!(e, StatusEvent::Message { key: 3, .. })));
    }

    #[test]
    fn the_socket_file_goes_with_the_hub_and_long_paths_move_to_the_temp_dir() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("d".repeat(120)).join("status.sock");
        std::fs::create_dir_all(deep.parent().unwrap()).unwrap();
        let hub = StatusHub::bind(&deep).unwrap();
        let p = hub.path().to_path_buf();
        assert!(p.as_os_str().len() <= MAX_SOCKET_PATH + 60 && p.exists(), "{}", p.display());
        drop(hub);
        assert!(!p.exists());
    }
}
