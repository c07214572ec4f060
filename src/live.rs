//! `loco launch --http ADDR` and `loco coordinator --http ADDR`: a live page of the run, served
//! while it goes.
//!
//! The launcher hands over every metrics line as it comes (the workers' through their status
//! channel, the coordinator's from its file); a coordinator its own; a drawing thread keeps the rows and events and, at
//! most once a second when something changed, draws the report's views from them
//! ([`loco_reports::live_fragment`], the report's own drawing) and hands the result to the page's
//! event stream ([`loco_real::http`]). When the run ends the page shows the run's report, drawn
//! from the same record as `report.html`, and stops listening.

use anyhow::{Context, Result};
use loco_core::metrics::{EventRow, OuterStepRow, RunMeta, Summary, summarize};
use loco_core::scenario::Scenario;
use loco_real::http::{EVENTS_PATH, Live, Site};
use loco_real::node::MetricsLine;
use loco_reports::Run;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, mpsc};
use std::time::Duration;
use tokio::sync::watch;

/// The most often the page is redrawn.
const REDRAW_EVERY: Duration = Duration::from_secs(1);

/// A live page being served.
pub(crate) struct LivePage {
    lines: Option<mpsc::Sender<MetricsLine>>,
    drawer: Option<std::thread::JoinHandle<String>>,
    updates: Arc<watch::Sender<Arc<String>>>,
    /// The page's address (with its token, when it has one).
    pub(crate) url: String,
}

/// One message of the event stream.
fn message(status: &str, html: &str, ended: bool) -> Arc<String> {
    let m = serde_json::json!({ "status": status, "html": html, "ended": ended });
    Arc::new(m.to_string())
}

impl LivePage {
    /// Serves the live page of a run of `s` on `addr` (beyond loopback, behind a token:
    /// `LOCO_HTTP_TOKEN`, or one made for this run, shown in the page's address): a launch's,
    /// or a coordinator's.
    #[allow(clippy::disallowed_methods)] // the server and the drawing run beside the launcher
    pub(crate) fn start(addr: SocketAddr, s: &Scenario) -> Result<LivePage> {
        let token = loco_real::http::token_for(addr);
        let (tx, rx) = watch::channel(message("waiting for the run to start", "", false));
        let title = format!("loco live: {}", s.name());
        let page = Arc::new(loco_reports::live_page(&title, EVENTS_PATH));
        let site = Site { exporter: None, live: Some(Live { page, updates: rx }), token };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the live page's runtime")?;
        let (listener, at) = rt
            .block_on(loco_real::http::bind(addr))
            .with_context(|| format!("--http {addr}: cannot listen there"))?;
        let url = match &site.token {
            Some(t) => format!("http://{at}/?token={t}"),
            None => format!("http://{at}/"),
        };
        std::thread::Builder::new()
            .name("live-page".into())
            .spawn(move || rt.block_on(loco_real::http::serve(listener, site)))
            .context("starting the live page's server")?;
        let updates = Arc::new(tx);
        let (lines, incoming) = mpsc::channel();
        let meta = live_meta(s);
        let u = updates.clone();
        let drawer: std::thread::JoinHandle<String> = std::thread::Builder::new()
            .name("live-draw".into())
            .spawn(move || draw_loop(&incoming, &meta, &u))
            .context("starting the live page's drawing")?;
        Ok(LivePage { lines: Some(lines), drawer: Some(drawer), updates, url })
    }

    /// Takes one metrics line of the run (cheap: the drawing thread does the work).
    pub(crate) fn line(&self, l: &MetricsLine) {
        if let Some(tx) = &self.lines {
            let _ = tx.send(l.clone());
        }
    }

    /// Where the lines of a process that is not the launcher go (the coordinator's own).
    pub(crate) fn sender(&self) -> Option<mpsc::Sender<MetricsLine>> {
        self.lines.clone()
    }

    /// The run ended: the page shows `record` (the run's report, drawn from its record; `None`:
    /// the last view, drawn from every line taken) under `status`; the event stream then ends.
    pub(crate) fn finish(mut self, status: &str, record: Option<Run>) {
        self.lines = None;
        let last = self.drawer.take().and_then(|d| d.join().ok()).unwrap_or_default();
        let msg = match record.map(|r| loco_reports::live_fragment(&r)) {
            Some(Ok(html)) => message(status, &html, true),
            Some(Err(e)) => message(&format!("{status}; drawing the report failed: {e}"), "", true),
            None => message(status, &last, true),
        };
        self.updates.send_replace(msg);
        // Let open pages take the last view before the process exits.
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// What a live summary knows of the run: the scenario's facts (no wall time or violations yet).
fn live_meta(s: &Scenario) -> RunMeta {
    RunMeta {
        scenario: s.name().to_string(),
        seed: s.seed(),
        backend: "real".into(),
        inner_steps_per_outer: Some(s.diloco().round_steps()),
        mfu_basis: s.mfu_basis(1),
        diloco: s.diloco().facts(),
        ..RunMeta::default()
    }
}

/// Keeps the rows and events that come on `incoming` and redraws the page from them at most
/// every [`REDRAW_EVERY`] while something changed, until every sender is gone; returns the last
/// view, drawn from every line.
#[allow(clippy::disallowed_methods)] // paces the drawing on the wall clock
fn draw_loop(
    incoming: &mpsc::Receiver<MetricsLine>,
    meta: &RunMeta,
    updates: &watch::Sender<Arc<String>>,
) -> String {
    let (mut rows, mut events): (Vec<OuterStepRow>, Vec<EventRow>) = Default::default();
    let mut changed = false;
    let mut drawn: Option<std::time::Instant> = None;
    let started = std::time::Instant::now();
    let mut meta = meta.clone();
    let mut last = String::new();
    loop {
        let mut done = false;
        match incoming.recv_timeout(REDRAW_EVERY) {
            Ok(MetricsLine::Row(r)) => {
                rows.push(r);
                changed = true;
            }
            Ok(MetricsLine::Event(e)) => {
                events.push(e);
                changed = true;
            }
            Ok(_) | Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => done = true,
        }
        let early = drawn.is_some_and(|t| t.elapsed() < REDRAW_EVERY);
        if !changed || (early && !done) {
            if done {
                return last;
            }
            continue;
        }
        changed = false;
        drawn = Some(std::time::Instant::now());
        events.sort_by(|a, b| a.time_s.total_cmp(&b.time_s));
        meta.wall_seconds = started.elapsed().as_secs_f64();
        let summary: Summary = summarize(&meta, &rows, &events);
        let status = format!(
            "live: {:.0} s on the run's clock, {} outer steps, {} events",
            summary.simulated_seconds,
            summary.outer_steps,
            events.len()
        );
        let run = Run { dir: PathBuf::new(), summary, rows: rows.clone(), events: events.clone() };
        match loco_reports::live_fragment(&run) {
            Ok(html) => {
                updates.send_replace(message(&status, &html, false));
                last = html;
            }
            Err(e) => tracing::warn!("drawing the live page: {e}"),
        }
        if done {
            return last;
        }
    }
}
