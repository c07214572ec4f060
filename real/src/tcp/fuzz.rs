//! Entry points for the coverage-guided fuzz targets in `fuzz/` (feature `fuzzing`). Each feeds
//! hostile bytes to one decoder of the transport, on one thread, with no sockets; what it must
//! show is that the decoder answers (a frame, a refusal, an error) and never panics, and that a
//! forged input is never taken as authentic. Run them with `scripts/fuzz.sh`.

use super::*;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::ReadBuf;

/// The peer's side of a connection: reads come from the fuzzer's bytes, then the end; writes
/// are taken and dropped.
struct Scripted {
    input: Vec<u8>,
    at: usize,
}

impl AsyncRead for Scripted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let rest = &self.input[self.at..];
        let n = rest.len().min(buf.remaining());
        buf.put_slice(&rest[..n]);
        self.at += n;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Scripted {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        b: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Poll::Ready(Ok(b.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// The secret of the fuzzed connections that use one.
const SECRET: &[u8] = b"the fuzzer's run secret";

/// Frames a target reads at most from one input.
const MAX_FRAMES: usize = 64;

/// How a fuzzed connection is secured: 0 plaintext, 1 the run secret, otherwise the secret and
/// node keys (as node `me`, with a roster of the coordinator's and node 1's fixed keys).
fn cfg(mode: u8, me: NodeId) -> TcpConfig {
    use crate::identity::{Identity, NodeKey, Roster};
    let key =
        |id: NodeId| NodeKey::from_private([if id == NodeId::COORDINATOR { 1 } else { 2 }; 32]);
    let identity = (mode > 1).then(|| {
        let ids = [NodeId::COORDINATOR, NodeId(1)];
        let roster = Roster::new(ids.into_iter().map(|id| (id, key(id).public())).collect());
        let roster = roster.expect("two distinct keys");
        Arc::new(Identity::new(me, key(me), roster).expect("the roster has its key"))
    });
    TcpConfig {
        max_body: 1 << 20,
        frame_timeout: Duration::from_secs(1),
        secret: (mode > 0).then(|| SECRET.to_vec()),
        identity,
        ..TcpConfig::default()
    }
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    thread_local! {
        static RT: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a current-thread runtime");
    }
    RT.with(|rt| rt.block_on(f))
}

/// Reads frames until the end, an error or [`MAX_FRAMES`]; gives how many were whole frames.
async fn read_frames<R: AsyncRead + Unpin>(r: &mut R, cfg: &TcpConfig) -> usize {
    let mut whole = 0;
    for _ in 0..MAX_FRAMES {
        match read_frame(r, cfg).await {
            Ok(Some(Incoming::Frame(f))) => {
                if let Body::Bytes(b) = &f.body {
                    assert!(b.len() as u64 <= cfg.max_body, "a body above max_body was taken");
                }
                whole += 1;
            }
            Ok(Some(Incoming::Directory(_))) => whole += 1,
            Ok(None) | Err(_) => break,
        }
    }
    whole
}

/// The frame decoder on the bytes after a handshake: gives how many whole frames it read.
pub fn frames(bytes: &[u8]) -> usize {
    let c = cfg(0, NodeId::COORDINATOR);
    block_on(read_frames(&mut &bytes[..], &c))
}

/// One frame written with `kind`, `header` and `body` under a right length and checksum, so
/// that the header decoder sees arbitrary bytes; then the frame decoder on it.
pub fn checksummed(kind: u8, header: &[u8], body: &[u8]) -> usize {
    frames(&encode_parts(kind, header, body))
}

/// The acceptor's handshake, then its frame reader, with `bytes` as everything the dialer
/// sends, the connection secured as `mode` says ([`cfg`]: 0 none, 1 the secret, 2 keys). With
/// a secret, nothing after the hello may be taken: the fuzzer cannot know the handshake's keys.
pub fn accept(bytes: &[u8], mode: u8) -> usize {
    let secret = mode > 0;
    let c = cfg(mode, NodeId::COORDINATOR);
    block_on(async {
        let s = Scripted { input: bytes.to_vec(), at: 0 };
        match accept_handshake(s, &c).await {
            Ok((_, _, mut r)) => {
                assert!(!secret, "a forged secured handshake was accepted");
                read_frames(&mut r, &c).await
            }
            Err(_) => 0,
        }
    })
}

/// The dialer's handshake with `bytes` as everything the acceptor answers, secured as `mode`
/// says. With a secret it must fail: the answer would have to come from the holder of the
/// dialer's ephemeral key.
pub fn dial(bytes: &[u8], mode: u8) -> bool {
    let secret = mode > 0;
    let c = cfg(mode, NodeId(1));
    block_on(async {
        let s = Scripted { input: bytes.to_vec(), at: 0 };
        let ok = dial_handshake(s, NodeId(1), 7000, NodeId::COORDINATOR, &c).await.is_ok();
        assert!(!(ok && secret), "a forged secured answer was accepted");
        ok
    })
}

/// A genuine secured connection whose reader then gets `bytes` as further records: nothing of
/// them may come out of the reader (they cannot carry a valid tag). Gives the bytes read.
pub fn secured_records(bytes: &[u8]) -> usize {
    // What the pipe holds before anyone reads it.
    let bytes = &bytes[..bytes.len().min(32 << 10)];
    block_on(async {
        let hello = plain_hello(PROTOCOL_VERSION, NodeId(1), 0, Security::Secret);
        let (hs, first) = secure::first_flight(&hello, SECRET, None).expect("a first flight");
        let (mut d, mut a) = tokio::io::duplex(1 << 16);
        d.write_all(&first).await.expect("duplex write");
        let resp = secure::accept_first(&mut a, &hello, SECRET, None)
            .await
            .expect("reading the first flight")
            .expect("the right secret");
        let acc = secure::accept_second(&mut a, resp).await.expect("the answer");
        let dial = secure::dial_second(&mut d, hs).await.expect("the dialer's keys");
        let mut w = secure::SecureWriter::new(d, dial);
        w.write_all(b"genuine").await.expect("a record");
        w.flush().await.expect("flush");
        let mut d = w.into_inner();
        d.write_all(bytes).await.expect("duplex write");
        drop(d);
        let mut r = secure::SecureReader::new(a, acc);
        let mut got = [0u8; 7];
        r.read_exact(&mut got).await.expect("the genuine record");
        assert_eq!(&got, b"genuine");
        let mut rest = Vec::new();
        let _ = r.read_to_end(&mut rest).await;
        assert!(rest.is_empty(), "{} forged bytes came out of a secured reader", rest.len());
        rest.len()
    })
}
