//! The small HTTP server a process runs to be watched: `GET /metrics` (an
//! [`Exporter`]'s figures for Prometheus), and a live page of the run (`GET /`, a page whose
//! script listens to `GET /events`, server-sent events carrying each new view).
//!
//! hyper serves HTTP/1.1, one request per connection. Bounded: at most [`MAX_CONNECTIONS`] at
//! once (a further one is closed unanswered), a request's head must arrive within
//! [`HEAD_TIMEOUT`], an answer other than the event stream must be sent within
//! [`ANSWER_TIMEOUT`]; at most [`MAX_STREAMS`] event streams, each pinging every
//! [`PING_EVERY`] so that a page gone frees its connection. With a token, every path asks for
//! it (`?token=TOKEN` or `Authorization: Bearer TOKEN`; 403 otherwise): served beyond loopback,
//! a run's figures go to whoever knows the token only.

use crate::exporter::{CONTENT_TYPE, Exporter};
use futures::StreamExt;
use http_body_util::{BodyExt, Full, StreamBody, combinators::UnsyncBoxBody};
use hyper::body::{Bytes, Frame};
use hyper::{Method, StatusCode, header};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::watch;

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 64;
/// Event streams open at once (each holds a connection while its page is open); a further one
/// is answered 503.
pub const MAX_STREAMS: usize = 16;
/// How often an idle event stream sends a comment: a page gone is noticed at the next write.
pub const PING_EVERY: Duration = Duration::from_secs(5);
/// How long a connection may take to send its request's head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a connection may last, from its start to its answer's end, unless that answer is an
/// event stream (a client that does not read its answer loses the connection then).
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

const EVENT_STREAM: &str = "text/event-stream";

/// The live page's path for its events.
pub const EVENTS_PATH: &str = "/events";

/// The environment variable holding the token asked of HTTP requests beyond loopback.
pub const TOKEN_ENV: &str = "LOCO_HTTP_TOKEN";

/// The token a server on `addr` asks for: none on loopback; beyond it [`TOKEN_ENV`]'s, or a
/// fresh random one (which the caller prints with the server's address).
pub fn token_for(addr: SocketAddr) -> Option<String> {
    if addr.ip().is_loopback() {
        return None;
    }
    match std::env::var(TOKEN_ENV) {
        Ok(t) if !t.is_empty() => Some(t),
        _ => {
            let bytes: [u8; 16] = rand::random();
            Some(bytes.iter().map(|b| format!("{b:02x}")).collect())
        }
    }
}

/// A live page: the page itself, and the latest message for its event stream (one JSON text per
/// update; the stream ends when the sender is dropped).
#[derive(Clone, Debug)]
pub struct Live {
    /// The page served at `/`.
    pub page: Arc<String>,
    /// The latest message.
    pub updates: watch::Receiver<Arc<String>>,
}

/// What a server answers.
#[derive(Clone, Debug, Default)]
pub struct Site {
    /// `/metrics`, when set.
    pub exporter: Option<Exporter>,
    /// `/` and [`EVENTS_PATH`], when set.
    pub live: Option<Live>,
    /// The token every request must carry (`?token=...`), when set.
    pub token: Option<String>,
}

/// Binds `addr` for [`serve`]; returns the listener and the address it got (for port 0).
pub async fn bind(addr: SocketAddr) -> std::io::Result<(tokio::net::TcpListener, SocketAddr)> {
    let l = tokio::net::TcpListener::bind(addr).await?;
    let at = l.local_addr()?;
    Ok((l, at))
}

/// Serves `site` on `listener` until dropped. An `accept` error (out of descriptors, say) waits
/// a little before the next try.
pub async fn serve(listener: tokio::net::TcpListener, site: Site) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let streams = Arc::new(tokio::sync::Semaphore::new(MAX_STREAMS));
    let site = Arc::new(site);
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!("http: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            continue; // dropping the stream closes it
        };
        let (site, streams) = (site.clone(), streams.clone());
        tokio::spawn(async move {
            // Whether this connection's answer is an event stream, which may last.
            let streaming = Arc::new(AtomicBool::new(false));
            let s = streaming.clone();
            let service = hyper::service::service_fn(move |req| {
                let (site, streams, s) = (site.clone(), streams.clone(), s.clone());
                async move {
                    let r = answer(&req, &site, &streams);
                    let stream = r.headers().get(header::CONTENT_TYPE)
                        == Some(&header::HeaderValue::from_static(EVENT_STREAM));
                    s.store(stream, Ordering::Relaxed);
                    Ok::<_, Infallible>(r)
                }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEAD_TIMEOUT)
                .keep_alive(false)
                .serve_connection(io, service);
            let mut conn = std::pin::pin!(conn);
            let timed = tokio::time::timeout(ANSWER_TIMEOUT, conn.as_mut()).await;
            if timed.is_err() && streaming.load(Ordering::Relaxed) {
                let _ = conn.await;
            }
            drop(permit);
        });
    }
}

type Body = UnsyncBoxBody<Bytes, Infallible>;

fn text(status: StatusCode, kind: &str, body: String) -> hyper::Response<Body> {
    let mut r = hyper::Response::new(Full::new(Bytes::from(body)).boxed_unsync());
    *r.status_mut() = status;
    if let Ok(v) = header::HeaderValue::from_str(kind) {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    r
}

/// Equal bytes, compared in time independent of where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// Whether `req` carries `token`: `?token=TOKEN` in its query, or `Authorization: Bearer TOKEN`
/// (Prometheus's `authorization` setting).
fn has_token<B>(req: &hyper::Request<B>, token: &str) -> bool {
    let t = token.as_bytes();
    let in_query = req.uri().query().is_some_and(|q| {
        q.split('&').any(|kv| kv.strip_prefix("token=").is_some_and(|v| same(v.as_bytes(), t)))
    });
    let in_header = req
        .headers()
        .get(header::AUTHORIZATION)
        .is_some_and(|v| v.as_bytes().strip_prefix(b"Bearer ").is_some_and(|v| same(v, t)));
    in_query || in_header
}

fn answer<B>(
    req: &hyper::Request<B>,
    site: &Site,
    streams: &Arc<tokio::sync::Semaphore>,
) -> hyper::Response<Body> {
    let plain = "text/plain; charset=utf-8";
    if let Some(t) = &site.token
        && !has_token(req, t)
    {
        let msg = "a token is needed: ?token=TOKEN or Authorization: Bearer TOKEN\n";
        return text(StatusCode::FORBIDDEN, plain, msg.into());
    }
    if !matches!(*req.method(), Method::GET | Method::HEAD) {
        return text(StatusCode::METHOD_NOT_ALLOWED, plain, "GET only\n".into());
    }
    match (req.uri().path(), &site.exporter, &site.live) {
        ("/metrics", Some(e), _) => text(StatusCode::OK, CONTENT_TYPE, e.encode()),
        ("/", _, Some(live)) => {
            text(StatusCode::OK, "text/html; charset=utf-8", String::clone(&live.page))
        }
        (EVENTS_PATH, _, Some(live)) => match streams.clone().try_acquire_owned() {
            Ok(permit) => events(live.updates.clone(), permit),
            Err(_) => text(StatusCode::SERVICE_UNAVAILABLE, plain, "too many pages open\n".into()),
        },
        _ => text(StatusCode::NOT_FOUND, plain, "not found\n".into()),
    }
}

/// The event stream: the latest message at once, then each new one, and a comment every
/// [`PING_EVERY`] without one, until the sender goes. It holds `permit` while open.
fn events(
    mut updates: watch::Receiver<Arc<String>>,
    permit: tokio::sync::OwnedSemaphorePermit,
) -> hyper::Response<Body> {
    updates.mark_changed();
    let stream = futures::stream::unfold((updates, permit), |(mut rx, permit)| async move {
        let text = tokio::select! {
            changed = rx.changed() => {
                changed.ok()?;
                // One `data:` line: the message is JSON, which holds no raw newline.
                let msg = rx.borrow_and_update().clone();
                format!("data: {msg}\n\n")
            }
            () = tokio::time::sleep(PING_EVERY) => ":\n\n".to_string(),
        };
        Some((Ok::<_, Infallible>(Frame::data(Bytes::from(text))), (rx, permit)))
    });
    let body = StreamBody::new(StreamExt::boxed(stream));
    let mut r = hyper::Response::new(body.boxed_unsync());
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, header::HeaderValue::from_static(EVENT_STREAM));
    h.insert(header::CACHE_CONTROL, header::HeaderValue::from_static("no-store"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::MetricsLine;
    use loco_core::metrics::{EventKind, EventRow};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: SocketAddr, path: &str) -> String {
        get_with(addr, path, "").await
    }

    async fn get_with(addr: SocketAddr, path: &str, headers: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\n{headers}Connection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
    }

    /// `/metrics` answers the exporter's text; paths not served get 404.
    #[test]
    fn the_server_answers_metrics_and_refuses_other_paths() {
        rt().block_on(async {
            let e = Exporter::coordinator();
            e.observe(&MetricsLine::Event(EventRow::new(1.0, EventKind::Join)));
            let (l, addr) = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
            tokio::spawn(serve(l, Site { exporter: Some(e), ..Site::default() }));
            let ok = get(addr, "/metrics").await;
            assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
            assert!(ok.contains("loco_events_total{kind=\"join\"} 1"), "{ok}");
            assert!(ok.contains("openmetrics-text"), "{ok}");
            for path in ["/", EVENTS_PATH, "/nothing"] {
                let missing = get(addr, path).await;
                assert!(missing.starts_with("HTTP/1.1 404"), "{path}: {missing}");
            }
        });
    }

    /// The event stream sends the latest message, then each update, and ends with its sender;
    /// with a token, a request without it is refused.
    #[test]
    fn the_event_stream_follows_the_updates_and_the_token_is_asked_for() {
        rt().block_on(async {
            let (tx, rx) = watch::channel(Arc::new("\"first\"".to_string()));
            let live = Live { page: Arc::new("<p>page</p>".into()), updates: rx };
            let site = Site { live: Some(live), token: Some("k3y".into()), ..Site::default() };
            let (l, addr) = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
            tokio::spawn(serve(l, site));
            for (path, headers) in [
                ("/", ""),
                ("/?token=k3", ""),
                ("/?token=k3y0", ""),
                ("/", "Authorization: Bearer k3z\r\n"),
                (EVENTS_PATH, ""),
            ] {
                let refused = get_with(addr, path, headers).await;
                assert!(refused.starts_with("HTTP/1.1 403"), "{path} {headers}: {refused}");
            }
            let bearer = get_with(addr, "/", "Authorization: Bearer k3y\r\n").await;
            assert!(bearer.starts_with("HTTP/1.1 200"), "{bearer}");
            let page = get(addr, "/?token=k3y").await;
            assert!(page.starts_with("HTTP/1.1 200") && page.ends_with("<p>page</p>"), "{page}");
            let reader = tokio::spawn(get(addr, "/events?token=k3y"));
            tokio::time::sleep(Duration::from_millis(200)).await;
            tx.send(Arc::new("\"second\"".into())).unwrap();
            tokio::time::sleep(Duration::from_millis(200)).await;
            drop(tx);
            let stream = tokio::time::timeout(Duration::from_secs(10), reader)
                .await
                .expect("the stream ends with its sender")
                .unwrap();
            assert!(stream.contains("text/event-stream"), "{stream}");
            let first = stream.find("data: \"first\"\n\n").expect("the first message");
            let second = stream.find("data: \"second\"\n\n").expect("the update");
            assert!(first < second, "{stream}");
        });
    }
}
