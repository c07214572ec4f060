//! The small HTTP server a process runs to be watched: `GET /metrics` (an
//! [`Exporter`]'s figures for Prometheus), and a live page of the run (`GET /`, a page whose
//! script listens to `GET /events`, server-sent events carrying each new view).
//!
//! hyper serves HTTP/1.1, one request per connection. Bounded: at most [`MAX_CONNECTIONS`] at
//! once (a further one is closed unanswered), a request's head must arrive within
//! [`HEAD_TIMEOUT`], an answer other than the event stream must be sent within
//! [`ANSWER_TIMEOUT`]. With a token, every path asks for `?token=TOKEN` (403 otherwise): a page
//! served beyond loopback shows a run's figures to whoever knows the token only.

use crate::exporter::{CONTENT_TYPE, Exporter};
use futures::StreamExt;
use http_body_util::{BodyExt, Full, StreamBody, combinators::UnsyncBoxBody};
use hyper::body::{Bytes, Frame};
use hyper::{Method, StatusCode, header};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 32;
/// How long a connection may take to send its request's head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// How long an answer other than the event stream may take.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// The live page's path for its events.
pub const EVENTS_PATH: &str = "/events";

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
        let site = site.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let site = site.clone();
                async move { Ok::<_, Infallible>(answer(&req, &site)) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEAD_TIMEOUT)
                .keep_alive(false)
                .serve_connection(io, service);
            let _ = conn.await;
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

/// Whether `query` holds `token=TOKEN`.
fn has_token(query: Option<&str>, token: &str) -> bool {
    query.is_some_and(|q| q.split('&').any(|kv| kv.strip_prefix("token=") == Some(token)))
}

fn answer<B>(req: &hyper::Request<B>, site: &Site) -> hyper::Response<Body> {
    let plain = "text/plain; charset=utf-8";
    if let Some(t) = &site.token {
        if !has_token(req.uri().query(), t) {
            return text(StatusCode::FORBIDDEN, plain, "a token is needed: ?token=...\n".into());
        }
    }
    if !matches!(*req.method(), Method::GET | Method::HEAD) {
        return text(StatusCode::METHOD_NOT_ALLOWED, plain, "GET only\n".into());
    }
    match (req.uri().path(), &site.exporter, &site.live) {
        ("/metrics", Some(e), _) => text(StatusCode::OK, CONTENT_TYPE, e.encode()),
        ("/", _, Some(live)) => {
            text(StatusCode::OK, "text/html; charset=utf-8", String::clone(&live.page))
        }
        (EVENTS_PATH, _, Some(live)) => events(live.updates.clone()),
        _ => text(StatusCode::NOT_FOUND, plain, "not found\n".into()),
    }
}

/// The event stream: the latest message at once, then each new one, until the sender goes.
fn events(mut updates: watch::Receiver<Arc<String>>) -> hyper::Response<Body> {
    updates.mark_changed();
    let stream = futures::stream::unfold(updates, |mut rx| async move {
        rx.changed().await.ok()?;
        let msg = rx.borrow_and_update().clone();
        // One `data:` line: the message is JSON, which holds no raw newline.
        let frame = Frame::data(Bytes::from(format!("data: {msg}\n\n")));
        Some((Ok::<_, Infallible>(frame), rx))
    });
    let body = StreamBody::new(StreamExt::boxed(stream));
    let mut r = hyper::Response::new(body.boxed_unsync());
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, header::HeaderValue::from_static("text/event-stream"));
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
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
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
            let refused = get(addr, "/").await;
            assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
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
