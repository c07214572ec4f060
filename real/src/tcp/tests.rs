//! Loopback tests of the TCP transport (127.0.0.1 only; every loop is bounded).

use super::*;
use bytes::Bytes;
use loco_core::allreduce::{RingConfig, run_ring};
use loco_core::codec::CodecKind;
use loco_core::digest::Blake3Digest;
use loco_core::ids::{Epoch, Weight};
use loco_core::transport::{CollectiveHeader, Phase, StateHeader};

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn collective(i: u32) -> Frame {
    Frame {
        header: Header::Collective(CollectiveHeader {
            epoch: Epoch(1),
            op: 0,
            shard: 0,
            phase: Phase::ReduceScatter,
            step: 0,
            chunk: 0,
            segment: i,
            weight_sum: 1.0,
        }),
        body: Body::Bytes(Bytes::from(vec![i as u8; 1000 + i as usize])),
    }
}

async fn pair(cfg: TcpConfig) -> (TcpTransport, TcpTransport) {
    let mut a = TcpTransport::bind(NodeId(0), loopback(), cfg.clone()).await.unwrap();
    let mut b = TcpTransport::bind(NodeId(1), loopback(), cfg).await.unwrap();
    a.set_peer_addr(NodeId(1), b.local_addr());
    b.set_peer_addr(NodeId(0), a.local_addr());
    (a, b)
}

async fn recv_within(t: &mut TcpTransport) -> Option<(NodeId, Frame)> {
    tokio::time::timeout(Duration::from_secs(5), t.recv()).await.ok().and_then(Result::ok)
}

#[tokio::test]
async fn frames_arrive_intact_and_in_order_on_one_stream() {
    let (mut a, mut b) = pair(TcpConfig::default()).await;
    for i in 0..50 {
        a.send(NodeId(1), collective(i)).await.unwrap();
    }
    for i in 0..50 {
        let (from, f) = recv_within(&mut b).await.expect("frame");
        assert_eq!(from, NodeId(0));
        assert_eq!(f, collective(i));
    }
    assert_eq!(b.stats().frames_received.load(Ordering::Relaxed), 50);
    assert_eq!(b.stats().corrupt_frames.load(Ordering::Relaxed), 0);
}

/// A peer sending faster than this node takes frames fills the receive queue only up to its
/// byte budget: the reader waits (and TCP's window holds the sender back) until frames are
/// taken, and then every frame arrives, in order.
#[tokio::test]
async fn the_receive_queue_holds_no_more_body_bytes_than_its_budget() {
    let cfg = TcpConfig { inbox_bytes: 1 << 20, ..TcpConfig::default() };
    let (mut a, mut b) = pair(cfg).await;
    let big = |i: u8| Frame { body: Body::Bytes(Bytes::from(vec![i; 400 << 10])), ..collective(0) };
    for i in 0..10 {
        a.send(NodeId(1), big(i)).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Two bodies of 400 KiB fit the 1 MiB budget; the reader holds a third while it waits.
    let read = b.stats().frames_received.load(Ordering::Relaxed);
    assert!((2..=3).contains(&read), "{read} frames read past a full queue");
    for i in 0..10 {
        let (_, f) = recv_within(&mut b).await.expect("frame");
        assert_eq!(f, big(i));
    }
}

#[tokio::test]
async fn ring_allreduce_over_tcp_with_several_streams_gives_identical_replicas() {
    ring_over_tcp(TcpConfig { streams: 3, ..TcpConfig::default() }).await;
}

/// The same through the encrypted records of a run with a secret (segments of several records).
#[tokio::test]
async fn ring_allreduce_over_secured_tcp_gives_identical_replicas() {
    let secret = Some(b"ring secret".to_vec());
    ring_over_tcp(TcpConfig { streams: 2, secret, ..TcpConfig::default() }).await;
}

async fn ring_over_tcp(cfg: TcpConfig) {
    let world = 3;
    let mut ts = Vec::new();
    for i in 0..world {
        ts.push(TcpTransport::bind(NodeId(i), loopback(), cfg.clone()).await.unwrap());
    }
    let addrs: Vec<_> = ts.iter().map(|t| t.local_addr()).collect();
    for t in &mut ts {
        for (j, addr) in addrs.iter().enumerate() {
            t.set_peer_addr(NodeId(j as u32), *addr);
        }
    }
    let ring: Vec<NodeId> = (0..world).map(NodeId).collect();
    let n = 300_003;
    let mut data: Vec<Vec<f32>> = (0..world)
        .map(|r| (0..n).map(|i| ((i * 7 + r as usize * 13) % 101) as f32 - 50.0).collect())
        .collect();
    let want: Vec<f32> =
        (0..n).map(|i| data.iter().map(|d| d[i]).sum::<f32>() / world as f32).collect();
    let runs = ts.iter_mut().zip(data.iter_mut()).zip(&ring).map(|((t, d), &me)| {
        let mut c = RingConfig::new(Epoch(1), 0, ring.clone(), me, CodecKind::Uint8);
        c.segment_elems = 200_000;
        run_ring(t, c, Some(d.as_mut_slice()), n, Weight::ONE)
    });
    let results = tokio::time::timeout(Duration::from_secs(30), futures::future::join_all(runs))
        .await
        .expect("all-reduce finished");
    for r in results {
        r.unwrap();
    }
    for d in &data[1..] {
        assert!(d.iter().zip(&data[0]).all(|(x, y)| x.to_bits() == y.to_bits()), "replicas differ");
    }
    let err: f32 = data[0].iter().zip(&want).map(|(g, w)| (g - w).powi(2)).sum::<f32>().sqrt()
        / want.iter().map(|w| w * w).sum::<f32>().sqrt();
    assert!(err < 0.03, "uint8 error {err}");
}

/// A body longer than a piece is written piece by piece, in the same bytes as one write, and a
/// flipped bit anywhere in it fails the checksum at the end.
#[tokio::test]
async fn a_large_body_is_hashed_piece_by_piece_and_checked_whole() {
    let body: Vec<u8> = (0..3 * PIECE + 17).map(|i| (i % 251) as u8).collect();
    let frame = Frame { header: collective(1).header, body: Body::Bytes(Bytes::from(body)) };
    let msg = Outgoing::Frame(frame.clone());
    let mut wire = Vec::new();
    let n = write_msg(&mut wire, &msg).await.unwrap();
    assert_eq!(n as usize, wire.len());
    assert_eq!(wire, encode_msg(&msg).unwrap(), "in pieces or in one write, the same bytes");
    let cfg = TcpConfig::default();
    let got = read_frame(&mut &wire[..], &cfg).await;
    assert!(matches!(got, Ok(Some(Incoming::Frame(ref f))) if *f == frame));
    for at in [PREFIX_LEN + 30, wire.len() - CHECKSUM_LEN - PIECE - 3, wire.len() - 1] {
        let mut bad = wire.clone();
        bad[at] ^= 0x10;
        match read_frame(&mut &bad[..], &cfg).await {
            Err(e) => assert!(e.contains("checksum"), "byte {at}: {e}"),
            Ok(_) => panic!("a flipped bit at byte {at} went through"),
        }
    }
}

/// A state piece's frame (kind 2) is checksummed over its header only: its body goes through
/// (the joiner checks it against the digest in the header), a changed header does not, and
/// kind 2 carries nothing but state pieces.
#[tokio::test]
async fn a_state_piece_is_checksummed_over_its_header_and_its_body_left_to_its_digest() {
    let body: Vec<u8> = (0..2 * STATE_CHUNK + 5).map(|i| (i % 253) as u8).collect();
    let header = Header::State(StateHeader {
        epoch: Epoch(2),
        outer_step: 4,
        offset: 0,
        total: body.len() as u64,
        digest: Some(Blake3Digest::from_bytes([0xcd; 32])),
        piece: loco_core::node::state::piece_digest(&body),
        part: 0,
    });
    let frame = Frame { header, body: Body::Bytes(Bytes::from(body)) };
    let msg = Outgoing::Frame(frame.clone());
    let mut wire = Vec::new();
    let n = write_msg(&mut wire, &msg).await.unwrap();
    assert_eq!(wire[0], KIND_STATE);
    assert_eq!(n as usize, wire.len());
    assert_eq!(wire, encode_msg(&msg).unwrap(), "in chunks or in one write, the same bytes");
    let cfg = TcpConfig::default();
    assert!(
        matches!(read_frame(&mut &wire[..], &cfg).await, Ok(Some(Incoming::Frame(ref f))) if *f == frame)
    );
    // A changed body byte reaches the joiner, whose check refuses it.
    let mut bad = wire.clone();
    let at = wire.len() - CHECKSUM_LEN - 10;
    bad[at] ^= 0x10;
    match read_frame(&mut &bad[..], &cfg).await {
        Ok(Some(Incoming::Frame(Frame { header: Header::State(h), body: Body::Bytes(b) }))) => {
            assert_ne!(loco_core::node::state::piece_digest(&b), h.piece);
        }
        other => panic!("the body is the joiner's to check: {other:?}"),
    }
    let mut bad = wire.clone();
    bad[PREFIX_LEN + 2] ^= 0x10;
    assert!(read_frame(&mut &bad[..], &cfg).await.unwrap_err().contains("checksum"));
    // Another header under kind 2: refused.
    let other = postcard::to_allocvec(&collective(1).header).unwrap();
    let wire = encode_parts(KIND_STATE, &other, &[1, 2, 3]);
    assert!(read_frame(&mut &wire[..], &cfg).await.unwrap_err().contains("not a state piece"));
}

#[tokio::test]
async fn a_body_length_is_not_reserved_before_its_bytes_arrive() {
    // A peer announces a 1 TiB body (within a limit raised to allow it) and sends 1 KiB of it:
    // reserving the announced length up front would abort the process (no such memory).
    let cfg = TcpConfig { max_body: 2 << 40, ..TcpConfig::default() };
    let header = postcard::to_allocvec(&collective(1).header).unwrap();
    let mut wire = vec![KIND_FRAME];
    wire.extend_from_slice(&(header.len() as u32).to_le_bytes());
    wire.extend_from_slice(&(1u64 << 40).to_le_bytes());
    wire.extend_from_slice(&header);
    wire.extend_from_slice(&[7; 1024]);
    match read_frame(&mut &wire[..], &cfg).await {
        Err(e) => assert!(e.contains("closed inside a frame"), "{e}"),
        Ok(_) => panic!("a truncated frame was accepted"),
    }
    // A body larger than the first reservation grows into place and is checked whole.
    let body: Vec<u8> =
        (0..BODY_RESERVE as usize + 3 * PIECE + 17).map(|i| (i % 253) as u8).collect();
    let frame = Frame { header: collective(2).header, body: Body::Bytes(Bytes::from(body)) };
    let wire = encode_msg(&Outgoing::Frame(frame.clone())).unwrap();
    let got = read_frame(&mut &wire[..], &cfg).await;
    assert!(matches!(got, Ok(Some(Incoming::Frame(ref f))) if *f == frame));
}

#[tokio::test]
async fn a_corrupt_frame_is_dropped_counted_and_the_link_recovers() {
    let (mut a, mut b) = pair(TcpConfig::default()).await;
    // A raw peer that completes the handshake as node 0, then sends a frame with a bad checksum.
    let mut raw = TcpStream::connect(b.local_addr()).await.unwrap();
    raw.write_all(&hello(PROTOCOL_VERSION, NodeId(0), 0, None)).await.unwrap();
    let mut reply = [0u8; 3];
    raw.read_exact(&mut reply).await.unwrap();
    assert_eq!(reply[0], HelloStatus::Ok as u8);
    let mut bytes = encode_msg(&Outgoing::Frame(collective(7))).unwrap();
    *bytes.last_mut().unwrap() ^= 0xff; // break the checksum
    raw.write_all(&bytes).await.unwrap();
    // The connection is closed by the receiver.
    let mut buf = [0u8; 1];
    let closed = tokio::time::timeout(Duration::from_secs(5), raw.read(&mut buf)).await.unwrap();
    assert!(matches!(closed, Ok(0) | Err(_)));
    assert_eq!(b.stats().corrupt_frames.load(Ordering::Relaxed), 1);
    // A well-behaved peer still gets through.
    a.send(NodeId(1), collective(1)).await.unwrap();
    let (_, f) = recv_within(&mut b).await.expect("frame");
    assert_eq!(f, collective(1));
    assert_eq!(b.stats().frames_received.load(Ordering::Relaxed), 1);
}

/// A peer that sends a frame one byte at a time, slower than the frame timeout allows, is cut
/// off when the timeout runs out, and the endpoint goes on serving the others.
#[tokio::test]
async fn a_peer_sending_a_byte_at_a_time_is_cut_off_at_the_frame_timeout() {
    let cfg = TcpConfig { frame_timeout: Duration::from_millis(600), ..TcpConfig::default() };
    let (mut a, mut b) = pair(cfg).await;
    let mut raw = TcpStream::connect(b.local_addr()).await.unwrap();
    raw.write_all(&hello(PROTOCOL_VERSION, NodeId(7), 0, None)).await.unwrap();
    let mut reply = [0u8; HELLO_REPLY_LEN];
    raw.read_exact(&mut reply).await.unwrap();
    assert_eq!(reply[0], HelloStatus::Ok as u8);
    let wire = encode_msg(&Outgoing::Frame(collective(1))).unwrap();
    let started = tokio::time::Instant::now();
    let mut sent = 0;
    // At most 20 bytes, one every 100 ms: the frame is far from done when its 600 ms run out.
    for byte in wire.iter().take(20) {
        if raw.write_all(&[*byte]).await.is_err() {
            break;
        }
        sent += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
        if b.stats().corrupt_frames.load(Ordering::Relaxed) > 0 {
            break;
        }
    }
    assert_eq!(b.stats().corrupt_frames.load(Ordering::Relaxed), 1, "{sent} bytes sent");
    assert!(started.elapsed() < Duration::from_secs(2));
    a.send(NodeId(1), collective(2)).await.unwrap();
    assert_eq!(recv_within(&mut b).await, Some((NodeId(0), collective(2))));
}

#[tokio::test]
async fn a_peer_speaking_another_version_is_refused_with_a_reason() {
    let (_a, b) = pair(TcpConfig::default()).await;
    let mut raw = TcpStream::connect(b.local_addr()).await.unwrap();
    let mut hello = Vec::new();
    hello.extend_from_slice(&MAGIC);
    hello.extend_from_slice(&(PROTOCOL_VERSION - 1).to_le_bytes());
    hello.extend_from_slice(&5u32.to_le_bytes());
    hello.extend_from_slice(&0u16.to_le_bytes());
    hello.extend_from_slice(&[0; 32]);
    raw.write_all(&hello).await.unwrap();
    let mut reply = [0u8; 3];
    raw.read_exact(&mut reply).await.unwrap();
    assert_eq!(reply[0], HelloStatus::BadVersion as u8);
    assert_eq!(u16::from_le_bytes([reply[1], reply[2]]), PROTOCOL_VERSION);
    for _ in 0..50 {
        if b.stats().rejected_handshakes.load(Ordering::Relaxed) == 1 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the refusal was not counted");
}

#[tokio::test]
async fn a_dialer_without_the_secret_is_refused_and_one_with_it_is_not() {
    let secret = Some(b"run secret".to_vec());
    let mut good = TcpTransport::bind(
        NodeId(0),
        loopback(),
        TcpConfig { secret: secret.clone(), ..TcpConfig::default() },
    )
    .await
    .unwrap();
    let mut bad = TcpTransport::bind(
        NodeId(2),
        loopback(),
        TcpConfig { secret: Some(b"guess".to_vec()), ..TcpConfig::default() },
    )
    .await
    .unwrap();
    let mut b =
        TcpTransport::bind(NodeId(1), loopback(), TcpConfig { secret, ..TcpConfig::default() })
            .await
            .unwrap();
    good.set_peer_addr(NodeId(1), b.local_addr());
    bad.set_peer_addr(NodeId(1), b.local_addr());
    // The dial runs in the background: the refusal is heard as the peer unreachable (and
    // logged as a warning with its reason), and counted where it was refused.
    bad.send(NodeId(1), collective(0)).await.unwrap();
    let heard = tokio::time::timeout(Duration::from_secs(5), bad.unreachable().next()).await;
    assert_eq!(heard, Ok(NodeId(1)));
    assert_eq!(b.stats().rejected_handshakes.load(Ordering::Relaxed), 1);
    good.send(NodeId(1), collective(3)).await.unwrap();
    let (from, f) = recv_within(&mut b).await.expect("frame");
    assert_eq!((from, f), (NodeId(0), collective(3)));
}

/// A one-connection proxy from a dialer to `to` that records what the dialer sends, and flips
/// the byte at `flip` of that stream on its way (an attacker on the path).
async fn tap(to: SocketAddr, flip: Option<usize>) -> (SocketAddr, Arc<std::sync::Mutex<Vec<u8>>>) {
    let listener = TcpListener::bind(loopback()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let rec = seen.clone();
    tokio::spawn(async move {
        let (client, _) = listener.accept().await.unwrap();
        let server = TcpStream::connect(to).await.unwrap();
        let (mut cr, mut cw) = client.into_split();
        let (mut sr, mut sw) = server.into_split();
        tokio::spawn(async move { tokio::io::copy(&mut sr, &mut cw).await });
        let mut buf = vec![0u8; 1 << 16];
        for _ in 0..10_000 {
            let n = match cr.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let at = rec.lock().unwrap().len();
            if let Some(f) = flip.filter(|f| (at..at + n).contains(f)) {
                buf[f - at] ^= 0x01;
            }
            rec.lock().unwrap().extend_from_slice(&buf[..n]);
            if sw.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    });
    (addr, seen)
}

/// With a secret, a recorded connection replayed byte for byte gets nowhere (its keys died with
/// the dialer's ephemeral key), and a byte changed on the path closes the connection: the frame
/// is neither delivered twice nor delivered altered.
#[tokio::test]
async fn a_replayed_or_altered_secured_connection_is_refused() {
    let cfg = TcpConfig { secret: Some(b"run secret".to_vec()), ..TcpConfig::default() };
    let (mut a, mut b) = pair(cfg.clone()).await;
    let (via, seen) = tap(b.local_addr(), None).await;
    a.set_peer_addr(NodeId(1), via);
    a.send(NodeId(1), collective(3)).await.unwrap();
    assert_eq!(recv_within(&mut b).await, Some((NodeId(0), collective(3))));
    let recording = seen.lock().unwrap().clone();
    assert!(recording.len() > HELLO_LEN + 48 + 2 * 16, "{} bytes", recording.len());
    // The replay: the first Noise message is accepted (it cannot be told from a new one), the
    // confirmation that follows is not.
    let mut raw = TcpStream::connect(b.local_addr()).await.unwrap();
    raw.write_all(&recording).await.unwrap();
    let mut reply = [0u8; HELLO_REPLY_LEN];
    raw.read_exact(&mut reply).await.unwrap();
    assert_eq!(reply[0], HelloStatus::Ok as u8);
    let got = tokio::time::timeout(Duration::from_secs(1), b.recv()).await;
    assert!(got.is_err(), "the replay delivered {got:?}");
    assert_eq!(b.stats().rejected_handshakes.load(Ordering::Relaxed), 1);
    assert_eq!(b.stats().frames_received.load(Ordering::Relaxed), 1);
    // A bit flipped in the frame's record, on a fresh connection through the tap.
    let (mut c, _) = pair(cfg).await;
    let flip = recording.len() - 20;
    let (via, _) = tap(b.local_addr(), Some(flip)).await;
    c.set_peer_addr(NodeId(1), via);
    c.send(NodeId(1), collective(4)).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(1), b.recv()).await;
    assert!(got.is_err(), "an altered record delivered {got:?}");
    assert_eq!(b.stats().corrupt_frames.load(Ordering::Relaxed), 1);
}

/// A peer that is gone is heard as unreachable in bounded time; a peer without an address fails
/// the send at once.
#[tokio::test]
async fn an_unreachable_peer_is_heard_in_bounded_time() {
    let cfg = TcpConfig { connect_timeout: Duration::from_secs(2), ..TcpConfig::default() };
    let (mut a, b) = pair(cfg).await;
    let gone = b.local_addr();
    drop(b);
    a.set_peer_addr(NodeId(1), gone);
    let r = tokio::time::timeout(Duration::from_secs(1), a.send(NodeId(1), collective(0))).await;
    assert_eq!(r.expect("bounded"), Ok(()));
    let heard = tokio::time::timeout(Duration::from_secs(5), a.unreachable().next()).await;
    assert_eq!(heard, Ok(NodeId(1)));
    let r = a.send(NodeId(9), collective(0)).await;
    assert_eq!(r, Err(TransportError::Unreachable(NodeId(9))));
}

#[tokio::test]
async fn addresses_are_learned_from_handshakes_and_passed_on_in_directories() {
    // Only the coordinator's address is configured; members learn each other's from it.
    let cfg = TcpConfig::default();
    let mut coord = TcpTransport::bind(NodeId::COORDINATOR, loopback(), cfg.clone()).await.unwrap();
    let mut m: Vec<TcpTransport> = Vec::new();
    for i in 0..2 {
        let mut t = TcpTransport::bind(NodeId(i), loopback(), cfg.clone()).await.unwrap();
        t.set_peer_addr(NodeId::COORDINATOR, coord.local_addr());
        t.send(NodeId::COORDINATOR, collective(i)).await.unwrap();
        recv_within(&mut coord).await.expect("hello frame");
        m.push(t);
    }
    let learned = coord.peer_addrs();
    assert_eq!(learned.get(&NodeId(0)), Some(&m[0].local_addr()));
    assert_eq!(learned.get(&NodeId(1)), Some(&m[1].local_addr()));
    let entries: Vec<_> = learned.into_iter().collect();
    for i in 0..2 {
        coord.send_directory(NodeId(i), entries.clone()).await.unwrap();
        coord.send(NodeId(i), collective(9)).await.unwrap();
        recv_within(&mut m[i as usize]).await.expect("frame after the directory");
    }
    assert_eq!(m[0].peer_addrs().get(&NodeId(1)), Some(&m[1].local_addr()));
    let (a, b) = m.split_at_mut(1);
    a[0].send(NodeId(1), collective(5)).await.unwrap();
    let (from, f) = recv_within(&mut b[0]).await.expect("peer frame");
    assert_eq!((from, f), (NodeId(0), collective(5)));
}

#[tokio::test]
async fn a_directory_from_a_member_is_refused_and_moves_nobody() {
    let (mut a, mut b) = pair(TcpConfig::default()).await;
    let coord_addr = "198.18.0.1:7000".parse().unwrap();
    b.set_peer_addr(NodeId::COORDINATOR, coord_addr);
    let before = b.peer_addrs();
    // Member 0 tells member 1 that the coordinator and member 0 itself listen elsewhere.
    let lie: SocketAddr = "198.18.0.66:1".parse().unwrap();
    a.send_directory(NodeId(1), vec![(NodeId::COORDINATOR, lie), (NodeId(0), lie)]).await.unwrap();
    // The receiver drops the connection; a frame sent after the directory does not arrive on it.
    let _ = a.send(NodeId(1), collective(1)).await;
    for _ in 0..100 {
        if b.stats().unauthorised.load(Ordering::Relaxed) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(b.stats().unauthorised.load(Ordering::Relaxed), 1);
    assert_eq!(b.peer_addrs(), before, "a member's directory moved a peer");
    assert_eq!(b.peer_addrs().get(&NodeId::COORDINATOR), Some(&coord_addr));
}

/// A large state frame does not hold up the collective frames sent after it: the state has a
/// connection of its own, so the small frame arrives first, and the state arrives intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_state_frame_does_not_hold_up_the_collective_frames_behind_it() {
    let (mut a, mut b) = pair(TcpConfig::default()).await;
    let big = Bytes::from(vec![7u8; 256 << 20]);
    let state = Frame {
        header: Header::State(StateHeader {
            epoch: Epoch(1),
            outer_step: 3,
            offset: 0,
            total: big.len() as u64,
            digest: None,
            piece: Blake3Digest::default(),
            part: 0,
        }),
        body: Body::Bytes(big.clone()),
    };
    // A collective frame first, so that the ordinary connection exists before the state's.
    a.send(NodeId(1), collective(0)).await.unwrap();
    assert_eq!(recv_within(&mut b).await.expect("first frame").1, collective(0));
    a.send(NodeId(1), state).await.unwrap();
    a.send(NodeId(1), collective(1)).await.unwrap();
    let (_, first) = recv_within(&mut b).await.expect("a frame");
    assert_eq!(first, collective(1), "the collective frame came first");
    let (_, second) = tokio::time::timeout(Duration::from_secs(30), b.recv())
        .await
        .expect("the state within 30 s")
        .unwrap();
    assert!(matches!(second.header, Header::State(_)));
    assert!(matches!(&second.body, Body::Bytes(x) if *x == big));
}

/// A listener on `addr` whose accept queue is full: further SYNs are dropped, as in a
/// partition (the kernel drops a SYN for a full queue). Returns the listener and the filler.
fn blackhole(addr: SocketAddr) -> (std::os::fd::OwnedFd, std::net::TcpStream) {
    use nix::sys::socket::{
        AddressFamily, Backlog, SockFlag, SockType, SockaddrIn, bind, listen, setsockopt, socket,
        sockopt,
    };
    let SocketAddr::V4(v4) = addr else { panic!("IPv4 loopback expected") };
    let fd = socket(AddressFamily::Inet, SockType::Stream, SockFlag::empty(), None).unwrap();
    setsockopt(&fd, sockopt::ReuseAddr, &true).unwrap();
    // The closed listener's task may take a moment to go.
    let mut bound = Err(nix::errno::Errno::EADDRINUSE);
    for _ in 0..50 {
        bound = bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &SockaddrIn::from(v4));
        if bound.is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bound.unwrap();
    listen(&fd, Backlog::new(0).unwrap()).unwrap();
    let filler = std::net::TcpStream::connect(addr).unwrap();
    (fd, filler)
}

#[tokio::test]
async fn a_reset_peer_is_dialled_again_in_the_background_without_holding_the_sender() {
    let (mut a, mut b) = pair(TcpConfig::default()).await;
    let addr = b.local_addr();
    a.send(NodeId(1), collective(1)).await.unwrap();
    recv_within(&mut b).await.expect("connected");
    // The peer's address now drops SYNs (a partition), and the sender gives its connection up
    // (as the coordinator does for a node it evicted after its silence): each send reports the
    // peer unreachable at once instead of waiting for a dial (10 s by default).
    drop(b);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (hole, filler) = blackhole(addr);
    a.reset(NodeId(1));
    for i in 0..5 {
        let t0 = tokio::time::Instant::now();
        let r = a.send(NodeId(1), collective(i)).await;
        assert!(t0.elapsed() < Duration::from_millis(500), "send {i} held for {:?}", t0.elapsed());
        assert_eq!(r, Err(TransportError::Unreachable(NodeId(1))), "send {i}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The partition heals: a process listens there again; a later send finds the connection
    // that the background dial made.
    drop((hole, filler));
    let mut b2 = TcpTransport::bind(NodeId(1), addr, TcpConfig::default()).await.unwrap();
    let mut arrived = None;
    for i in 0..100u32 {
        if a.send(NodeId(1), collective(1000 + i)).await.is_ok()
            && let Ok(Ok(got)) = tokio::time::timeout(Duration::from_millis(50), b2.recv()).await
        {
            arrived = Some(got);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (from, _) = arrived.expect("connected again within 10 s");
    assert_eq!(from, NodeId(0));
}

/// Hostile bytes after a handshake: the frame reader answers a frame, a clean end or an error,
/// never a panic, and reserves no more than it may. With a right checksum over arbitrary header
/// bytes the header decoder sees them too. More cases: `PROPTEST_CASES=1000000 cargo test -p
/// loco-real --release --lib hostile`.
mod hostile {
    use super::*;
    use proptest::prelude::*;
    use proptest::strategy::ValueTree;

    fn cfg() -> TcpConfig {
        TcpConfig {
            max_body: 1 << 20,
            frame_timeout: Duration::from_secs(1),
            ..TcpConfig::default()
        }
    }

    fn read(bytes: &[u8]) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let _ = rt.block_on(read_frame(&mut &bytes[..], &cfg()));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            read(&bytes);
        }

        #[test]
        fn checksummed_arbitrary_headers(kind in 0..4u8,
                                          header in prop::collection::vec(any::<u8>(), 1..256),
                                          body in prop::collection::vec(any::<u8>(), 0..256)) {
            read(&encode_parts(kind, &header, &body));
        }

        #[test]
        fn valid_frames_with_bytes_changed(at in any::<prop::sample::Index>(), x in 1..=255u8,
                                            cut in any::<prop::sample::Index>()) {
            let frame = Frame {
                header: Header::State(StateHeader {
                    epoch: Epoch(3),
                    outer_step: 7,
                    offset: 128,
                    total: 4096,
                    digest: Some(Blake3Digest::from_bytes([0xab; 32])),
                    piece: Blake3Digest::from_bytes([9; 32]),
                    part: 1,
                }),
                body: Body::Bytes(Bytes::from(vec![5u8; 300])),
            };
            let mut wire = encode_msg(&Outgoing::Frame(frame)).unwrap();
            let i = at.index(wire.len());
            wire[i] ^= x;
            read(&wire);
            let n = cut.index(wire.len());
            read(&wire[..n]);
        }
    }

    /// Records of arbitrary bytes, and a legitimate record with a byte changed, reach a secured
    /// reader: it errors, it does not panic, and it delivers nothing unauthenticated.
    #[test]
    fn a_secured_reader_takes_no_forged_record() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let secret = b"k".as_slice();
            let hello = plain_hello(PROTOCOL_VERSION, NodeId(1), 0, Security::Secret);
            let mut runner = proptest::test_runner::TestRunner::default();
            let strategy = prop::collection::vec(any::<u8>(), 0..300);
            for _ in 0..64 {
                let junk = strategy.new_tree(&mut runner).unwrap().current();
                let (hs, first) = secure::first_flight(&hello, secret, None).unwrap();
                let (mut d, mut a) = tokio::io::duplex(1 << 16);
                d.write_all(&first).await.unwrap();
                let resp =
                    secure::accept_first(&mut a, &hello, secret, None).await.unwrap().unwrap();
                let acc = secure::accept_second(&mut a, resp).await.unwrap();
                let dial = secure::dial_second(&mut d, hs).await.unwrap();
                // A real record, then one of junk with a plausible length.
                let mut w = secure::SecureWriter::new(d, dial);
                w.write_all(b"hello").await.unwrap();
                w.flush().await.unwrap();
                let mut d = w.into_inner();
                let mut forged = (junk.len() as u16).to_le_bytes().to_vec();
                forged.extend_from_slice(&junk);
                d.write_all(&forged).await.unwrap();
                drop(d);
                let mut r = secure::SecureReader::new(a, acc);
                let mut got = [0u8; 5];
                r.read_exact(&mut got).await.unwrap();
                assert_eq!(&got, b"hello");
                let mut rest = Vec::new();
                assert!(r.read_to_end(&mut rest).await.is_err(), "junk of {} bytes", junk.len());
                assert!(rest.is_empty(), "{rest:?}");
            }
        });
    }
}

/// With `state_streams` connections for the state, the pieces go round them (each opened once,
/// at the first state frame) and every piece arrives intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_frames_go_round_the_state_connections() {
    let (mut a, mut b) = pair(TcpConfig { state_streams: 3, ..TcpConfig::default() }).await;
    a.send(NodeId(1), collective(0)).await.unwrap();
    assert_eq!(recv_within(&mut b).await.expect("first frame").1, collective(0));
    let piece = |i: u64| Frame {
        header: Header::State(StateHeader {
            epoch: Epoch(1),
            outer_step: 3,
            offset: i * 1000,
            total: 9000,
            digest: None,
            piece: Blake3Digest::default(),
            part: 0,
        }),
        body: Body::Bytes(Bytes::from(vec![i as u8; 1000])),
    };
    for i in 0..9 {
        a.send(NodeId(1), piece(i)).await.unwrap();
    }
    let mut got = Vec::new();
    for _ in 0..9 {
        got.push(recv_within(&mut b).await.expect("a piece").1);
    }
    got.sort_by_key(|f| match &f.header {
        Header::State(h) => h.offset,
        _ => u64::MAX,
    });
    assert_eq!(got, (0..9).map(piece).collect::<Vec<_>>());
    // The ordinary connection and three for the state.
    assert_eq!(b.stats().accepted_connections.load(Ordering::Relaxed), 4);
}

/// A flood of connections that never authenticate (2,000, held open) neither stops the listener
/// nor delays an honest peer: the oldest handshakes in flight are evicted to make room, so no more
/// than [`MAX_HANDSHAKES`] are ever held, and a peer that dials afterwards is heard at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_flooding_a_listener_do_not_keep_a_peer_out() {
    let (mut a, mut b) = pair(TcpConfig::default()).await;
    let target = b.local_addr();
    let mut idle = Vec::new();
    let t0 = tokio::time::Instant::now();
    for _ in 0..2000 {
        match tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(target)).await {
            Ok(Ok(s)) => idle.push(s),
            other => panic!("connection {} to the listener: {other:?}", idle.len()),
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "the flood is bounded in time");
    }
    // Every idle connection was accepted (so evicted or in flight); none was authenticated.
    let evicted = |b: &TcpTransport| b.stats().evicted_handshakes.load(Ordering::Relaxed);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while evicted(&b) < (2000 - MAX_HANDSHAKES) as u64 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(evicted(&b) >= (2000 - MAX_HANDSHAKES) as u64, "evicted {}", evicted(&b));
    assert_eq!(b.stats().accepted_connections.load(Ordering::Relaxed), 0);
    // An honest peer, dialling now while the idle connections stay open, is heard at once.
    let sent = tokio::time::Instant::now();
    a.send(NodeId(1), collective(7)).await.unwrap();
    let (from, f) = recv_within(&mut b).await.expect("the honest peer's frame");
    assert_eq!((from, f), (NodeId(0), collective(7)));
    assert!(sent.elapsed() < Duration::from_secs(2), "heard after {:?}", sent.elapsed());
    drop(idle);
}

/// A connection that opens and says nothing is closed after the hello's limit, well before the
/// whole handshake's (`connect_timeout`).
#[tokio::test]
async fn a_silent_connection_is_closed_at_the_hello_limit() {
    let b = TcpTransport::bind(NodeId(1), loopback(), TcpConfig::default()).await.unwrap();
    let mut s = TcpStream::connect(b.local_addr()).await.unwrap();
    let t0 = tokio::time::Instant::now();
    let mut buf = [0u8; 8];
    let r = tokio::time::timeout(Duration::from_secs(9), s.read(&mut buf)).await;
    assert!(matches!(r, Ok(Ok(0)) | Ok(Err(_))), "closed, not {r:?}");
    let waited = t0.elapsed();
    assert!(waited >= HELLO_TIMEOUT - Duration::from_millis(100), "closed after {waited:?}");
    assert!(waited < TcpConfig::default().connect_timeout, "closed after {waited:?}");
    assert_eq!(b.stats().rejected_handshakes.load(Ordering::Relaxed), 1);
}

/// Makes node 2's address a black hole (its listener gone, and a socket with a full backlog that
/// answers no SYN), then sends five rounds from `a` to it and to `b`: each round returns within
/// 300 ms and `b` gets every frame. Returns the black hole, to keep it open.
async fn sends_to_a_black_hole_hold_up_nothing(
    a: &mut TcpTransport,
    b: &mut TcpTransport,
) -> (std::os::fd::OwnedFd, std::net::TcpStream) {
    let gone = TcpTransport::bind(NodeId(2), loopback(), TcpConfig::default()).await.unwrap();
    let hole_addr = gone.local_addr();
    drop(gone);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let hole = blackhole(hole_addr);
    a.set_peer_addr(NodeId(2), hole_addr);
    for i in 0..5u32 {
        let t0 = tokio::time::Instant::now();
        a.send(NodeId(2), collective(i)).await.unwrap();
        a.send(NodeId(1), collective(i)).await.unwrap();
        assert!(t0.elapsed() < Duration::from_millis(300), "sends held for {:?}", t0.elapsed());
        let (from, f) = recv_within(b).await.expect("the reachable peer's frame");
        assert_eq!((from, f), (NodeId(0), collective(i)));
    }
    hole
}

/// With [`TcpConfig::dial_in_background`] (the coordinator's), a send to a peer whose address
/// drops SYNs returns at once and holds up no send to anyone else; the dial's failure shows at
/// a later send, after `connect_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_hole_peer_holds_up_no_send_when_dials_run_in_the_background() {
    let cfg = TcpConfig {
        dial_in_background: true,
        connect_timeout: Duration::from_secs(2),
        ..TcpConfig::default()
    };
    let (mut a, mut b) = pair(cfg).await;
    let (hole, filler) = sends_to_a_black_hole_hold_up_nothing(&mut a, &mut b).await;
    // After the dial's limit, a send reports the peer unreachable, and the next dials again.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let r = a.send(NodeId(2), collective(9)).await;
    assert_eq!(r, Err(TransportError::Unreachable(NodeId(2))));
    assert!(a.send(NodeId(2), collective(10)).await.is_ok(), "queued behind a new dial");
    drop((hole, filler));
}

/// A worker's endpoint (default settings): its first dial to a peer whose address drops SYNs
/// holds up none of its sends either (a worker's heartbeats go out on the same loop as its ring
/// frames), and the failure is heard from [`TcpTransport::unreachable`] once the dial's limit
/// has passed; the frames sent meanwhile to the reachable peer all arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_dial_to_a_black_hole_holds_up_no_send_and_is_heard_as_unreachable() {
    let cfg = TcpConfig { connect_timeout: Duration::from_secs(2), ..TcpConfig::default() };
    assert!(!cfg.dial_in_background);
    let (mut a, mut b) = pair(cfg).await;
    let unreachable = a.unreachable();
    let t0 = tokio::time::Instant::now();
    let (hole, filler) = sends_to_a_black_hole_hold_up_nothing(&mut a, &mut b).await;
    let heard = tokio::time::timeout(Duration::from_secs(5), unreachable.next()).await;
    assert_eq!(heard, Ok(NodeId(2)));
    let after = t0.elapsed();
    assert!(after >= Duration::from_millis(1900), "heard after {after:?}, before the limit");
    // Heard once: nothing more waits.
    let again = tokio::time::timeout(Duration::from_millis(200), unreachable.next()).await;
    assert!(again.is_err(), "{again:?}");
    drop((hole, filler));
}

/// A first dial refused at once (nobody listens) is heard as unreachable at once; the next send
/// dials again, and a peer that listens by then gets it.
#[tokio::test]
async fn a_refused_first_dial_is_heard_at_once_and_the_next_send_dials_again() {
    let (mut a, _b) = pair(TcpConfig::default()).await;
    let late = TcpTransport::bind(NodeId(2), loopback(), TcpConfig::default()).await.unwrap();
    let addr = late.local_addr();
    drop(late);
    a.set_peer_addr(NodeId(2), addr);
    a.send(NodeId(2), collective(1)).await.unwrap();
    let heard = tokio::time::timeout(Duration::from_secs(2), a.unreachable().next()).await;
    assert_eq!(heard, Ok(NodeId(2)));
    let Ok(mut c) = TcpTransport::bind(NodeId(2), addr, TcpConfig::default()).await else {
        return; // The port was taken meanwhile: nothing to check.
    };
    a.send(NodeId(2), collective(2)).await.unwrap();
    let (from, f) = recv_within(&mut c).await.expect("the frame after the peer listens");
    assert_eq!((from, f), (NodeId(0), collective(2)));
}

/// One id opening connections without end (a member of the run, which holds the secret) keeps
/// at most [`MAX_CONNECTIONS_PER_PEER`] open at the receiver: each one past that closes its
/// oldest, and the newest still delivers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_peer_holds_at_most_its_cap_of_connections_open() {
    let mut b = TcpTransport::bind(NodeId(1), loopback(), TcpConfig::default()).await.unwrap();
    let extra = 20;
    let mut senders = Vec::new();
    for i in 0..MAX_CONNECTIONS_PER_PEER + extra {
        let mut c = TcpTransport::bind(NodeId(5), loopback(), TcpConfig::default()).await.unwrap();
        c.set_peer_addr(NodeId(1), b.local_addr());
        c.send(NodeId(1), collective(i as u32)).await.unwrap();
        let (from, _) = recv_within(&mut b).await.expect("each connection's first frame");
        assert_eq!(from, NodeId(5));
        senders.push(c);
    }
    let evicted = b.stats().evicted_connections.load(Ordering::Relaxed);
    assert_eq!(evicted, extra as u64);
    let newest = senders.last_mut().unwrap();
    newest.send(NodeId(1), collective(9999)).await.unwrap();
    let (from, f) = recv_within(&mut b).await.expect("the newest connection still delivers");
    assert_eq!((from, f), (NodeId(5), collective(9999)));
}

/// Learned addresses are kept for the peers the caller names and for those connected now;
/// the others (ids that connected once and left) are forgotten, so they cannot accumulate.
#[tokio::test]
async fn learned_addresses_are_kept_only_while_named_or_connected() {
    let (mut a, mut b) = pair(TcpConfig::default()).await;
    a.send(NodeId(1), collective(1)).await.unwrap();
    recv_within(&mut b).await.expect("a's frame");
    // Ids 5..25 connect, are learned, and go.
    for id in 5..25u32 {
        let mut c = TcpTransport::bind(NodeId(id), loopback(), TcpConfig::default()).await.unwrap();
        c.set_peer_addr(NodeId(1), b.local_addr());
        c.send(NodeId(1), collective(id)).await.unwrap();
        recv_within(&mut b).await.expect("a passing id's frame");
    }
    assert_eq!(b.peer_addrs().len(), 21);
    // Their connections close as their endpoints drop.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        b.retain_peer_addrs(|id| id == NodeId(7));
        let left: Vec<NodeId> = b.peer_addrs().into_keys().collect();
        if left == [NodeId(0), NodeId(7)] {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "still known: {left:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The connected peer is still heard and answered.
    a.send(NodeId(1), collective(2)).await.unwrap();
    assert_eq!(recv_within(&mut b).await.expect("a's frame").0, NodeId(0));
    b.send(NodeId(0), collective(3)).await.unwrap();
    assert_eq!(recv_within(&mut a).await.expect("b's frame").0, NodeId(1));
}

/// A control message carries no body, a probe at most `PROBE_MAX_BYTES`: a frame announcing
/// more is refused from its header, before a byte of its body is read.
#[tokio::test]
async fn a_body_beyond_its_kinds_limit_is_refused_before_it_is_read() {
    let cfg = TcpConfig::default();
    let announce = |header: &Header, blen: u64| {
        let header = postcard::to_allocvec(header).unwrap();
        let mut wire = vec![KIND_FRAME];
        wire.extend_from_slice(&(header.len() as u32).to_le_bytes());
        wire.extend_from_slice(&blen.to_le_bytes());
        wire.extend_from_slice(&header);
        wire // no body: a refusal must not wait for one
    };
    let beat = Header::Mesh(MeshMsg::HeartbeatAck);
    let probe = Header::Mesh(MeshMsg::Probe { round: 1, seq: 1 });
    for (header, blen, limit) in [
        (&beat, 10, 0),
        (&probe, PROBE_MAX_BYTES + 1, PROBE_MAX_BYTES),
        (&probe, 1 << 30, PROBE_MAX_BYTES),
    ] {
        let e = read_frame(&mut &announce(header, blen)[..], &cfg).await.unwrap_err();
        assert!(e.contains(&format!("above the limit {limit} for its kind")), "{e}");
    }
    // A probe's padding within the limit is read.
    let frame = Frame { header: probe, body: Body::Bytes(Bytes::from(vec![0u8; 4096])) };
    let wire = encode_msg(&Outgoing::Frame(frame.clone())).unwrap();
    let got = read_frame(&mut &wire[..], &cfg).await;
    assert!(matches!(got, Ok(Some(Incoming::Frame(ref f))) if *f == frame));
}

/// Twenty connections each streaming a 32 MiB body to a node that takes no frame: one body is
/// read (it takes the whole 4 MiB budget), the other nineteen wait unread, held back by TCP,
/// so the senders get no further than the kernel's buffers. When the node takes its frames,
/// every one arrives whole. Reading a body before taking its share of the budget would have
/// read all 640 MiB.
#[tokio::test]
async fn twenty_connections_streaming_huge_bodies_are_read_only_within_the_budget() {
    const BODY: usize = 32 << 20;
    const PEERS: u32 = 20;
    let cfg = TcpConfig { inbox_bytes: 4 << 20, max_body: 64 << 20, ..TcpConfig::default() };
    let mut b = TcpTransport::bind(NodeId(1), loopback(), cfg).await.unwrap();
    let written = Arc::new(AtomicU64::new(0));
    let mut senders = Vec::new();
    for i in 0..PEERS {
        let (addr, written) = (b.local_addr(), written.clone());
        senders.push(tokio::spawn(async move {
            let mut raw = TcpStream::connect(addr).await.unwrap();
            raw.write_all(&hello(PROTOCOL_VERSION, NodeId(10 + i), 0, None)).await.unwrap();
            let mut reply = [0u8; HELLO_REPLY_LEN];
            raw.read_exact(&mut reply).await.unwrap();
            let frame =
                Frame { body: Body::Bytes(Bytes::from(vec![i as u8; BODY])), ..collective(i) };
            let wire = encode_msg(&Outgoing::Frame(frame)).unwrap();
            for piece in wire.chunks(64 << 10) {
                raw.write_all(piece).await.unwrap();
                written.fetch_add(piece.len() as u64, Ordering::Relaxed);
            }
            raw
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let held = written.load(Ordering::Relaxed);
    let all = u64::from(PEERS) * BODY as u64;
    eprintln!("sent before any frame was taken: {} MiB of {} MiB", held >> 20, all >> 20);
    assert!(
        held < all / 2,
        "{} MiB of {} MiB sent before any frame was taken",
        held >> 20,
        all >> 20
    );
    assert!(b.stats().frames_received.load(Ordering::Relaxed) <= 1);
    let mut from = std::collections::BTreeSet::new();
    for _ in 0..PEERS {
        let (peer, f) = recv_within(&mut b).await.expect("every frame, once taken");
        assert_eq!(f.body.len(), BODY as u64);
        from.insert(peer);
    }
    assert_eq!(from.len(), PEERS as usize);
    for s in senders {
        drop(s.await.unwrap());
    }
}

/// A peer that completes the handshake and then reads nothing loses its connection once a
/// message has waited `frame_timeout` to be taken: the queue of what was sent to it goes with
/// the connection, and a send after that hears the peer is unreachable (before, the writer
/// waited on it for ever and every frame sent to it stayed queued in memory).
#[tokio::test]
async fn a_peer_that_stops_reading_loses_its_connection_and_its_queue() {
    let listener = tokio::net::TcpListener::bind(loopback()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let deaf = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut hello = [0u8; HELLO_LEN];
        s.read_exact(&mut hello).await.unwrap();
        let mut reply = vec![HelloStatus::Ok as u8];
        reply.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
        s.write_all(&reply).await.unwrap();
        tokio::time::sleep(Duration::from_secs(10)).await; // reads nothing
        drop(s);
    });
    let cfg = TcpConfig { frame_timeout: Duration::from_millis(500), ..TcpConfig::default() };
    let mut a = TcpTransport::bind(NodeId(0), loopback(), cfg).await.unwrap();
    a.set_peer_addr(NodeId(9), addr);
    let big =
        |i: u32| Frame { body: Body::Bytes(Bytes::from(vec![1u8; 1 << 20])), ..collective(i) };
    // Far more than the kernel's buffers hold.
    for i in 0..64 {
        a.send(NodeId(9), big(i)).await.unwrap();
    }
    let gave_up = tokio::time::Instant::now() + Duration::from_secs(5);
    let mut refused = false;
    while tokio::time::Instant::now() < gave_up && !refused {
        tokio::time::sleep(Duration::from_millis(100)).await;
        refused = a.send(NodeId(9), collective(100)).await.is_err();
    }
    assert!(refused, "a peer reading nothing kept its connection");
    deaf.abort();
}

/// A large header is charged to the receive budget at what it may decode to: a peer sending
/// frames whose headers are 300 KB of ids, to a node that takes none, gets only as many read as
/// the budget holds at sixteen times their length; every one arrives once the node takes them.
#[tokio::test]
async fn large_headers_are_charged_to_the_budget_at_their_decoded_size() {
    let cfg = TcpConfig { inbox_bytes: 16 << 20, ..TcpConfig::default() };
    let (_a, mut b) = pair(cfg).await;
    let results: Vec<loco_core::mesh::ProbeResult> = (0..30_000)
        .map(|i| loco_core::mesh::ProbeResult { peer: NodeId(i), bytes_per_sec: 1.0 })
        .collect();
    let big = Frame::control(MeshMsg::ProbeReport { round: 1, results });
    let wire = encode_msg(&Outgoing::Frame(big.clone())).unwrap();
    let hlen = wire.len();
    assert!(hlen > 250_000, "{hlen} bytes");
    let mut raw = TcpStream::connect(b.local_addr()).await.unwrap();
    raw.write_all(&hello(PROTOCOL_VERSION, NodeId(5), 0, None)).await.unwrap();
    let mut reply = [0u8; HELLO_REPLY_LEN];
    raw.read_exact(&mut reply).await.unwrap();
    let writer = tokio::spawn(async move {
        for _ in 0..40 {
            if raw.write_all(&wire).await.is_err() {
                break;
            }
        }
        raw
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let read = b.stats().frames_received.load(Ordering::Relaxed);
    let fit = (16u64 << 20) / (hlen as u64 * 16) + 1;
    assert!(read <= fit, "{read} frames of {hlen}-byte headers read past a full budget");
    for _ in 0..40 {
        let (from, f) = recv_within(&mut b).await.expect("every frame, once taken");
        assert_eq!((from, &f), (NodeId(5), &big));
    }
    drop(writer.await.unwrap());
}

/// Keys for nodes 0, 1, 2 and the coordinator, and the roster of the first three.
fn keyed_run() -> (BTreeMap<NodeId, crate::identity::NodeKey>, crate::identity::Roster) {
    use crate::identity::{NodeKey, Roster};
    let keys: BTreeMap<NodeId, NodeKey> = [NodeId(0), NodeId(1), NodeId(2), NodeId::COORDINATOR]
        .into_iter()
        .map(|id| (id, NodeKey::generate()))
        .collect();
    let roster = Roster::new(
        keys.iter().filter(|(id, _)| **id != NodeId(2)).map(|(&id, k)| (id, k.public())).collect(),
    )
    .unwrap();
    (keys, roster)
}

fn keyed_cfg(key: &crate::identity::NodeKey, roster: &crate::identity::Roster) -> TcpConfig {
    let me = roster.id_of(&key.public()).expect("a key of the roster");
    let identity = crate::identity::Identity::new(me, key.clone(), roster.clone()).unwrap();
    TcpConfig {
        secret: Some(b"run secret".to_vec()),
        identity: Some(Arc::new(identity)),
        ..TcpConfig::default()
    }
}

/// What node `b` answers a raw hello, and whether the refusal was counted as one for a key.
async fn knock(b: &TcpTransport, hello: Vec<u8>) -> u8 {
    let mut raw = TcpStream::connect(b.local_addr()).await.unwrap();
    raw.write_all(&hello).await.unwrap();
    let mut reply = [0u8; HELLO_REPLY_LEN];
    raw.read_exact(&mut reply).await.unwrap();
    reply[0]
}

/// With a roster, nodes holding their own keys talk; a member holding the run secret and its
/// own key cannot claim another member's id, nor the coordinator's; a key outside the roster
/// and a dialer without a key are refused too. Each refusal is counted as one for a key.
#[tokio::test]
async fn with_a_roster_an_id_is_bound_to_its_key() {
    let (keys, roster) = keyed_run();
    let mut a = TcpTransport::bind(NodeId(0), loopback(), keyed_cfg(&keys[&NodeId(0)], &roster))
        .await
        .unwrap();
    let mut b = TcpTransport::bind(NodeId(1), loopback(), keyed_cfg(&keys[&NodeId(1)], &roster))
        .await
        .unwrap();
    a.set_peer_addr(NodeId(1), b.local_addr());
    a.send(NodeId(1), collective(1)).await.unwrap();
    assert_eq!(recv_within(&mut b).await, Some((NodeId(0), collective(1))));
    let to_b = roster.key(NodeId(1)).unwrap();
    let secret = b"run secret";
    // Node 0's key claiming node 1's id, and the coordinator's.
    for claimed in [NodeId(1), NodeId::COORDINATOR] {
        let h = hello_keyed(claimed, 0, secret, &keys[&NodeId(0)], to_b);
        assert_eq!(knock(&b, h).await, HelloStatus::BadIdentity as u8);
    }
    // A key the roster does not have (node 2's), claiming node 0's id.
    let h = hello_keyed(NodeId(0), 0, secret, &keys[&NodeId(2)], to_b);
    assert_eq!(knock(&b, h).await, HelloStatus::BadIdentity as u8);
    // The secret without a key.
    let h = hello(PROTOCOL_VERSION, NodeId(0), 0, Some(secret));
    assert_eq!(knock(&b, h).await, HelloStatus::BadIdentity as u8);
    // The right key under a wrong secret, and a dialler that takes another node for node 1.
    let h = hello_keyed(NodeId(0), 0, b"a guess", &keys[&NodeId(0)], to_b);
    assert_eq!(knock(&b, h).await, HelloStatus::BadSecret as u8);
    let h = hello_keyed(NodeId(0), 0, secret, &keys[&NodeId(0)], &keys[&NodeId(2)].public());
    assert_eq!(knock(&b, h).await, HelloStatus::BadSecret as u8);
    for _ in 0..100 {
        if b.stats().rejected_handshakes.load(Ordering::Relaxed) == 6 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(b.stats().rejected_handshakes.load(Ordering::Relaxed), 6);
    assert_eq!(b.stats().refused_identities.load(Ordering::Relaxed), 4);
    // Node 0 still gets through, and nothing of the refused reached the node.
    a.send(NodeId(1), collective(2)).await.unwrap();
    assert_eq!(recv_within(&mut b).await, Some((NodeId(0), collective(2))));
}

/// A dialer checks whom it reached: a member listening where node 1 should be (its address
/// learned wrongly, or redirected) cannot take node 1's traffic, for it lacks node 1's key.
#[tokio::test]
async fn a_dialer_reaches_only_the_holder_of_the_peers_key() {
    let (keys, roster) = keyed_run();
    let mut a = TcpTransport::bind(NodeId(0), loopback(), keyed_cfg(&keys[&NodeId(0)], &roster))
        .await
        .unwrap();
    // Node 2's key, listening as if it were node 1 (its roster names it node 2's key for 1).
    let mut forged = roster.clone();
    forged = crate::identity::Roster::new(
        [NodeId(0), NodeId(1)]
            .into_iter()
            .map(|id| {
                let k = if id == NodeId(1) {
                    keys[&NodeId(2)].public()
                } else {
                    *forged.key(id).unwrap()
                };
                (id, k)
            })
            .collect(),
    )
    .unwrap();
    let ident =
        crate::identity::Identity::new(NodeId(1), keys[&NodeId(2)].clone(), forged).unwrap();
    let cfg = TcpConfig {
        secret: Some(b"run secret".to_vec()),
        identity: Some(Arc::new(ident)),
        ..TcpConfig::default()
    };
    let mut impostor = TcpTransport::bind(NodeId(1), loopback(), cfg).await.unwrap();
    a.set_peer_addr(NodeId(1), impostor.local_addr());
    a.send(NodeId(1), collective(1)).await.unwrap();
    let heard = tokio::time::timeout(Duration::from_secs(5), a.unreachable().next()).await;
    assert_eq!(heard, Ok(NodeId(1)));
    let got = tokio::time::timeout(Duration::from_millis(300), impostor.recv()).await;
    assert!(got.is_err(), "the impostor got {got:?}");
}

/// The coordinator names its members' keys in its directories: members whose rosters hold only
/// the coordinator's key and their own reach each other, also when a member dials before the
/// directory that names it reached its peer (the acceptor waits for it); a member's directory
/// is refused and vouches for nothing.
#[tokio::test]
async fn members_learn_each_others_keys_from_the_coordinators_directory() {
    use crate::identity::{Identity, Roster};
    let (keys, full) = keyed_run();
    let secret = Some(b"run secret".to_vec());
    let mut ids = BTreeMap::new();
    let mut bind = |me: NodeId, roster: Roster| {
        let identity = Arc::new(Identity::new(me, keys[&me].clone(), roster).unwrap());
        ids.insert(me, identity.clone());
        let cfg =
            TcpConfig { secret: secret.clone(), identity: Some(identity), ..TcpConfig::default() };
        TcpTransport::bind(me, loopback(), cfg)
    };
    let own = |me: NodeId| {
        Roster::new(
            [me, NodeId::COORDINATOR].into_iter().map(|i| (i, *full.key(i).unwrap())).collect(),
        )
        .unwrap()
    };
    let mut c = bind(NodeId::COORDINATOR, full.clone()).await.unwrap();
    let mut a = bind(NodeId(0), own(NodeId(0))).await.unwrap();
    let mut b = bind(NodeId(1), own(NodeId(1))).await.unwrap();
    for (id, t) in [(NodeId(0), &a), (NodeId(1), &b)] {
        c.set_peer_addr(id, t.local_addr());
    }
    a.set_peer_addr(NodeId::COORDINATOR, c.local_addr());
    assert_eq!(ids[&NodeId(0)].key_of(NodeId(1)), None);
    // Node 0 hears of node 1 first and dials it at once; node 1 hears of node 0 half a second
    // later, while node 0's handshake waits.
    c.send_directory(NodeId(0), vec![(NodeId(1), b.local_addr())]).await.unwrap();
    for _ in 0..100 {
        if ids[&NodeId(0)].key_of(NodeId(1)).is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(ids[&NodeId(0)].key_of(NodeId(1)), full.key(NodeId(1)).copied());
    assert_eq!(a.peer_addrs().get(&NodeId(1)), Some(&b.local_addr()));
    a.send(NodeId(1), collective(5)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    c.send_directory(NodeId(1), vec![(NodeId(0), a.local_addr())]).await.unwrap();
    assert_eq!(recv_within(&mut b).await, Some((NodeId(0), collective(5))));
    assert_eq!(b.stats().refused_identities.load(Ordering::Relaxed), 0);
    // A member's directory: refused, its key not taken.
    let stray = crate::identity::NodeKey::generate().public();
    let forged = Outgoing::Directory(vec![(NodeId(7), a.local_addr(), Some(stray))]);
    let peer = a.connect(NodeId(1)).await.unwrap();
    peer.streams[0].send(forged).ok();
    for _ in 0..100 {
        if b.stats().unauthorised.load(Ordering::Relaxed) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(b.stats().unauthorised.load(Ordering::Relaxed), 1);
    assert_eq!(ids[&NodeId(1)].key_of(NodeId(7)), None);
}
