//! The transport's security when the run has a secret: a Noise handshake on every connection
//! (`Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s`, the `snow` crate; with a roster
//! `Noise_IKpsk1_25519_ChaChaPoly_BLAKE2s`, below), then every byte of the connection encrypted
//! and authenticated in records.
//!
//! Why Noise with a pre-shared key, as WireGuard uses it: the run's secret is the only credential
//! its nodes share, and NNpsk0 turns it into a mutual proof of knowledge with fresh ephemeral
//! keys on both sides, so every connection has its own keys (forward secrecy, and a recorded
//! handshake cannot be replayed: its keys die with the ephemeral secret that made them). TLS with
//! a pre-shared key would do the same with far more machinery (certificates unused, a larger
//! dependency); `snow` is small, pure Rust, and follows the Noise specification revision 34.
//!
//! The handshake, after the plaintext hello (which names the protocol version, so a version
//! mismatch still gets its reason; the hello is the Noise prologue, so it is authenticated
//! too):
//!
//! 1. dialer -> acceptor: Noise message 1 (`psk, e`), `u16` length first;
//! 2. acceptor -> dialer: the hello reply (a [`super::HelloStatus`]: a first message that does
//!    not authenticate under this run's key is `BadSecret`), then Noise message 2 (`e, ee`);
//! 3. dialer -> acceptor: the first record of the connection, which must hold the hello again.
//!    Message 1 alone could be a recording; only a dialer that holds the ephemeral key of this
//!    handshake can write a record the acceptor decrypts, so the acceptor takes the connection
//!    (and learns the dialer's address) only after it.
//!
//! With a roster ([`crate::identity`]) message 1 is IK's `e, es, s, ss` with the secret mixed in
//! at its end (`psk1`) and message 2 is `e, ee, se`: the dialer encrypts to the static key the
//! roster gives the node it dials and sends its own static key inside, so the acceptor learns
//! from message 1 both that the secret is right and which key dials (it compares it with the
//! roster's for the id the hello claims), and only the holder of the dialed node's key can
//! read message 1 or write message 2. Still one round trip; the confirmation record stays
//! (message 1 can be replayed).
//!
//! A record is a `u16` length and a ChaCha20-Poly1305 message of at most 65535 bytes (64 KiB of
//! the frame stream, plus its 16-byte tag), with the implicit counter nonce of Noise's transport
//! mode: a record dropped, reordered, replayed or altered fails the next decryption, and the
//! connection is closed. The frames inside keep their own format ([`super::read_frame`]).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

/// The Noise protocol of a run with a secret alone.
const PATTERN: &str = "Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s";
/// The Noise protocol of a run with a roster: the dialer knows the acceptor's static key from
/// the roster and sends its own, encrypted, in message 1, which the secret authenticates too
/// (`psk1`), so the acceptor knows who dials, and whether the secret is right, from message 1.
const PATTERN_KEYED: &str = "Noise_IKpsk1_25519_ChaChaPoly_BLAKE2s";
/// Largest Noise message.
const MAX_MESSAGE: usize = 65535;
/// The AEAD tag.
const TAG: usize = 16;
/// Largest plaintext of one record.
pub(super) const MAX_PLAIN: usize = MAX_MESSAGE - TAG;
/// Largest handshake message (message 1 is 48 bytes, or 96 keyed; message 2 is 48).
const MAX_HANDSHAKE: usize = 1024;

/// The pre-shared key of a run: derived from its secret (any length) for this use only.
fn psk(secret: &[u8]) -> [u8; 32] {
    blake3::derive_key("loco 2026 noise psk", secret)
}

/// The static keys of a keyed handshake: this node's private key, and (for the dialer) the
/// public key the roster gives the node it dials.
#[derive(Clone, Copy)]
pub(super) struct Keys<'a> {
    pub(super) local: &'a [u8; 32],
    pub(super) remote: Option<&'a [u8; 32]>,
}

fn builder<'a>(
    prologue: &'a [u8],
    key: &'a [u8; 32],
    keys: Option<Keys<'a>>,
) -> Result<snow::Builder<'a>, String> {
    let pattern = if keys.is_some() { PATTERN_KEYED } else { PATTERN };
    let params = pattern.parse().map_err(|e| format!("noise parameters: {e:?}"))?;
    let mut b = snow::Builder::new(params);
    let e = |e: snow::Error| format!("noise set-up: {e}");
    if let Some(k) = keys {
        b = b.local_private_key(k.local).map_err(e)?;
        if let Some(r) = k.remote {
            b = b.remote_public_key(r).map_err(e)?;
        }
    }
    b.psk(u8::from(keys.is_some()), key).and_then(|b| b.prologue(prologue)).map_err(e)
}

/// The dialer's side before the reply: its handshake state and message 1 (length first).
pub(super) fn first_flight(
    hello: &[u8],
    secret: &[u8],
    keys: Option<Keys<'_>>,
) -> Result<(snow::HandshakeState, Vec<u8>), String> {
    let key = psk(secret);
    let mut hs = builder(hello, &key, keys)?.build_initiator().map_err(|e| e.to_string())?;
    let out = write_handshake(&mut hs)?;
    Ok((hs, out))
}

/// The next handshake message of `hs`, `u16` length first.
fn write_handshake(hs: &mut snow::HandshakeState) -> Result<Vec<u8>, String> {
    let mut msg = vec![0u8; MAX_HANDSHAKE];
    let n = hs.write_message(&[], &mut msg).map_err(|e| e.to_string())?;
    let mut out = Vec::with_capacity(2 + n);
    out.extend_from_slice(&(n as u16).to_le_bytes());
    out.extend_from_slice(&msg[..n]);
    Ok(out)
}

/// Reads one length-prefixed handshake message.
async fn read_handshake<R: AsyncRead + Unpin>(s: &mut R) -> Result<Vec<u8>, String> {
    let mut len = [0u8; 2];
    s.read_exact(&mut len).await.map_err(|e| format!("reading the noise handshake: {e}"))?;
    let n = usize::from(u16::from_le_bytes(len));
    if n == 0 || n > MAX_HANDSHAKE {
        return Err(format!("noise handshake message of {n} bytes"));
    }
    let mut msg = vec![0u8; n];
    s.read_exact(&mut msg).await.map_err(|e| format!("reading the noise handshake: {e}"))?;
    Ok(msg)
}

/// The acceptor's side, message 1: `Ok(state)` when it authenticates under this run's key (and,
/// keyed, under this node's static key; the dialer's is then the state's remote static key).
pub(super) async fn accept_first<R: AsyncRead + Unpin>(
    s: &mut R,
    hello: &[u8],
    secret: &[u8],
    local: Option<&[u8; 32]>,
) -> Result<Result<snow::HandshakeState, String>, String> {
    let msg = read_handshake(s).await?;
    let key = psk(secret);
    let keys = local.map(|local| Keys { local, remote: None });
    let mut hs = builder(hello, &key, keys)?.build_responder().map_err(|e| e.to_string())?;
    let mut payload = vec![0u8; MAX_HANDSHAKE];
    Ok(hs.read_message(&msg, &mut payload).map(|_| hs).map_err(|e| e.to_string()))
}

/// The acceptor's side, message 2 (after its reply): writes it and returns the transport.
pub(super) async fn accept_second<W: AsyncWrite + Unpin>(
    s: &mut W,
    mut hs: snow::HandshakeState,
) -> Result<snow::TransportState, String> {
    let out = write_handshake(&mut hs)?;
    s.write_all(&out).await.map_err(|e| format!("answering the noise handshake: {e}"))?;
    hs.into_transport_mode().map_err(|e| e.to_string())
}

/// The dialer's side, message 2 (after an `Ok` reply): the transport.
pub(super) async fn dial_second<R: AsyncRead + Unpin>(
    s: &mut R,
    mut hs: snow::HandshakeState,
) -> Result<snow::TransportState, String> {
    let msg = read_handshake(s).await?;
    let mut payload = vec![0u8; MAX_HANDSHAKE];
    hs.read_message(&msg, &mut payload).map_err(|e| format!("noise handshake: {e}"))?;
    hs.into_transport_mode().map_err(|e| e.to_string())
}

/// The writing end of a secured connection: buffers up to [`MAX_PLAIN`] bytes, seals them into
/// a record when full or on `flush`.
pub(super) struct SecureWriter<W> {
    inner: W,
    noise: snow::TransportState,
    plain: Vec<u8>,
    out: Vec<u8>,
    sent: usize,
}

impl<W: AsyncWrite + Unpin> SecureWriter<W> {
    pub(super) fn new(inner: W, noise: snow::TransportState) -> Self {
        SecureWriter {
            inner,
            noise,
            plain: Vec::with_capacity(MAX_PLAIN),
            out: Vec::with_capacity(2 + MAX_MESSAGE),
            sent: 0,
        }
    }

    /// The stream beneath (tests and fuzzing: to write forged records after real ones).
    #[cfg(any(test, feature = "fuzzing"))]
    pub(super) fn into_inner(self) -> W {
        self.inner
    }

    /// Writes out the sealed record under way, then seals and writes what is buffered.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            while self.sent < self.out.len() {
                let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.out[self.sent..]))?;
                if n == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                self.sent += n;
            }
            self.out.clear();
            self.sent = 0;
            if self.plain.is_empty() {
                return Poll::Ready(Ok(()));
            }
            self.out.resize(2 + self.plain.len() + TAG, 0);
            let n = self
                .noise
                .write_message(&self.plain, &mut self.out[2..])
                .map_err(|e| io::Error::other(e.to_string()))?;
            // n <= MAX_MESSAGE: the plaintext is at most MAX_PLAIN.
            self.out[..2].copy_from_slice(&(n as u16).to_le_bytes());
            self.out.truncate(2 + n);
            self.plain.clear();
        }
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for SecureWriter<W> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.plain.len() == MAX_PLAIN {
            ready!(this.poll_drain(cx))?;
        }
        let n = data.len().min(MAX_PLAIN - this.plain.len());
        this.plain.extend_from_slice(&data[..n]);
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

/// The reading end of a secured connection: reads and opens records, serves their plaintext.
/// End of stream is clean only between records.
pub(super) struct SecureReader<R> {
    inner: R,
    noise: snow::TransportState,
    /// The record being read: its length prefix, then its message.
    rec: Vec<u8>,
    have: usize,
    in_body: bool,
    plain: Vec<u8>,
    pos: usize,
}

impl<R: AsyncRead + Unpin> SecureReader<R> {
    pub(super) fn new(inner: R, noise: snow::TransportState) -> Self {
        SecureReader {
            inner,
            noise,
            rec: vec![0u8; 2],
            have: 0,
            in_body: false,
            plain: Vec::with_capacity(MAX_PLAIN),
            pos: 0,
        }
    }
}

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

impl<R: AsyncRead + Unpin> AsyncRead for SecureReader<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.pos < this.plain.len() {
                let n = buf.remaining().min(this.plain.len() - this.pos);
                buf.put_slice(&this.plain[this.pos..this.pos + n]);
                this.pos += n;
                return Poll::Ready(Ok(()));
            }
            while this.have < this.rec.len() {
                let mut rb = ReadBuf::new(&mut this.rec[this.have..]);
                ready!(Pin::new(&mut this.inner).poll_read(cx, &mut rb))?;
                let n = rb.filled().len();
                if n == 0 {
                    if !this.in_body && this.have == 0 {
                        return Poll::Ready(Ok(())); // closed between records
                    }
                    return Poll::Ready(Err(io::ErrorKind::UnexpectedEof.into()));
                }
                this.have += n;
            }
            this.have = 0;
            if this.in_body {
                this.plain.resize(this.rec.len(), 0);
                let n = this
                    .noise
                    .read_message(&this.rec, &mut this.plain)
                    .map_err(|e| invalid(format!("a record does not authenticate: {e}")))?;
                this.plain.truncate(n);
                this.pos = 0;
                this.rec.resize(2, 0);
                this.in_body = false;
            } else {
                let n = usize::from(u16::from_le_bytes([this.rec[0], this.rec[1]]));
                if n <= TAG {
                    return Poll::Ready(Err(invalid(format!("a record of {n} bytes"))));
                }
                this.rec.resize(n, 0);
                this.in_body = true;
            }
        }
    }
}
