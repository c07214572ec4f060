//! `[[failures]]` and `[[diurnal]]`: per-node failure and repair processes, and daily offline
//! windows, so that a large scenario need not list every event. A `[[failures]]` entry is
//! expanded, when the scenario is loaded, into `crash` (or `leave`, or `hang`) events and the
//! `restart` (or `resume`) that ends each outage, per node:
//!
//! - time to the next failure: Weibull with the entry's `shape` (1: exponential), scaled so
//!   that its mean is `mtbf`; measured from the node's start (or `from`) and from each repair;
//!   or one of the observed up times `up` (a trace's empirical distribution), each as likely;
//! - outage: exponential with mean `repair`, or one of the observed outages `down` (a node
//!   whose repair would end after `until` stays down);
//! - every draw comes from the ChaCha stream of (the scenario's `seed`, the entry and the node,
//!   [`Purpose::Failures`]): the same file gives the same events to both backends and to every
//!   replay (`--seed` changes the run, not the file's events); `loco churn SCENARIO` prints them.
//!
//! A `[[diurnal]]` entry makes each of its nodes leave every day at `offline_at` (plus a seeded
//! jitter) and restart `offline_for` later.
//!
//! The events join the file's own `[[churn]]` and are checked with them: a generated crash of a
//! node the file has already stopped is an error that names both.

use super::error::FieldPath;
use super::fields::{
    Pending, R, conflict, duration, expected, missing, one_of_text, positive_duration, quoted,
    region_ref,
};
use super::raw::{RawArrivals, RawDiurnal, RawFailures, RawScalar};
use super::{ChurnAction, ChurnEvent, EventSource, NodeSpec, Region};
use crate::ids::NodeId;
use crate::rng::{Purpose, stream};
use rand::Rng;
use std::time::Duration;

/// Events one entry may generate for one node: a bound on a typo's cost (an `mtbf` of seconds
/// over a year).
pub(super) const MAX_EVENTS_PER_NODE: usize = 100_000;

/// Events all the entries of one kind may generate together: a bound on a file's memory.
pub(super) const MAX_EVENTS: usize = 2_000_000;

/// The error for an entry whose events pass [`MAX_EVENTS`].
fn too_many(p: &FieldPath, field: &str, given: String) -> super::error::PathError {
    expected(
        &p.key(field),
        format!("fewer events: the generated churn passes {MAX_EVENTS} events here"),
        given,
    )
}

/// What a failure does, and what ends it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Crash,
    Leave,
    Hang,
}

const KINDS: [(&str, Kind); 3] =
    [("crash", Kind::Crash), ("leave", Kind::Leave), ("hang", Kind::Hang)];

/// A distribution of durations, in seconds.
enum Draw {
    /// Weibull of this scale and shape (inverse CDF).
    Weibull { scale: f64, shape: f64 },
    /// Exponential of this mean.
    Exponential(f64),
    /// One of these observed durations, each as likely (a trace's empirical distribution).
    Observed(Vec<f64>),
}

impl Draw {
    fn draw(&self, rng: &mut impl Rng) -> f64 {
        // One uniform draw each, so that a Weibull or exponential entry expands as it always has.
        let u: f64 = rng.random::<f64>();
        match self {
            // 1 - u lies in (0, 1].
            Draw::Weibull { scale, shape } => scale * (-(1.0 - u).ln()).powf(1.0 / shape),
            Draw::Exponential(mean) => -mean * (1.0 - u).ln(),
            Draw::Observed(v) => v[((u * v.len() as f64) as usize).min(v.len() - 1)],
        }
    }
}

/// Most durations a trace (`up`, `down`) may list.
const MAX_OBSERVED: usize = 100_000;

/// The durations of a trace: at least one, each positive.
fn observed(p: &FieldPath, raw: &[RawScalar]) -> R<Vec<f64>> {
    if raw.is_empty() || raw.len() > MAX_OBSERVED {
        return Err(expected(
            p,
            format!("a list of 1 to {MAX_OBSERVED} observed durations, like [\"3h\", \"40min\"]"),
            format!("{} values", raw.len()),
        ));
    }
    raw.iter()
        .enumerate()
        .map(|(i, r)| positive_duration(&p.index(i), r).map(|d| d.as_secs_f64()))
        .collect()
}

/// Expands every `[[failures]]` entry into its events (unsorted), with the paths to blame.
pub(super) fn failures(
    raw: &[RawFailures],
    nodes: &[NodeSpec],
    regions: &[Region],
    seed: u64,
    stop_time: Option<Duration>,
) -> R<Vec<Pending>> {
    let mut out = Vec::new();
    for (i, f) in raw.iter().enumerate() {
        let p = FieldPath::root().key("failures").index(i);
        let kind = match &f.kind {
            None => Kind::Crash,
            Some(k) => KINDS.iter().find(|(n, _)| n == k).map(|(_, k)| *k).ok_or_else(|| {
                let names: Vec<&str> = KINDS.iter().map(|(n, _)| *n).collect();
                expected(&p.key("kind"), one_of_text(&names), quoted(k))
            })?,
        };
        let up = up_times(&p, f)?;
        let down = outages(&p, f)?;
        let rate_field = if f.up.is_some() { "up" } else { "mtbf" };
        let rate_given = || match (&f.mtbf, &f.up) {
            (Some(m), _) => m.to_string(),
            (_, Some(u)) => format!("{} observed up times", u.len()),
            _ => String::new(),
        };
        let from =
            f.from.as_ref().map(|x| duration(&p.key("from"), x)).transpose()?.unwrap_or_default();
        let until = match (&f.until, stop_time) {
            (Some(u), _) => duration(&p.key("until"), u)?,
            (None, Some(t)) => t,
            (None, None) => {
                return Err(missing(&p.key("until"), "when the failures end (or a [stop] time)"));
            }
        };
        if until <= from {
            return Err(expected(
                &p.key("until"),
                "a time after `from`",
                super::units::format_duration(until),
            ));
        }
        let chosen = select(&p, f.nodes.as_deref(), f.region.as_deref(), nodes, regions)?;
        for id in chosen {
            let node = &nodes[id.0 as usize];
            let subject = (u64::from(id.0) << 32) | i as u64;
            let mut rng = stream(seed, subject, Purpose::Failures);
            let mut t = node.start.max(from).as_secs_f64();
            let end = until.as_secs_f64();
            let mut count = 0usize;
            loop {
                t += up.draw(&mut rng);
                if t >= end {
                    break;
                }
                let outage = down.draw(&mut rng);
                let (fail, back) = match kind {
                    Kind::Crash => (ChurnAction::Crash(vec![id]), ChurnAction::Restart(vec![id])),
                    Kind::Leave => (ChurnAction::Leave(vec![id]), ChurnAction::Restart(vec![id])),
                    Kind::Hang => (ChurnAction::Hang(vec![id]), ChurnAction::Resume(vec![id])),
                };
                // Whole milliseconds: the events print and read back as written.
                let at = ms(t);
                if out.len() >= MAX_EVENTS {
                    return Err(too_many(&p, rate_field, rate_given()));
                }
                out.push(pending(at, fail, EventSource::Failures(i), &p));
                t += outage.max(0.001);
                count += 1;
                if t >= end {
                    break;
                }
                let back_at = ms(t).max(at + Duration::from_millis(1));
                out.push(pending(back_at, back, EventSource::Failures(i), &p));
                if count >= MAX_EVENTS_PER_NODE {
                    return Err(expected(
                        &p.key(rate_field),
                        format!(
                            "a longer time between failures: node {:?} fails more than {MAX_EVENTS_PER_NODE} times before `until`",
                            node.name
                        ),
                        rate_given(),
                    ));
                }
            }
        }
    }
    Ok(out)
}

/// Up times of entry `f` (at `p`): Weibull of mean `mtbf`, or drawn from the observed ones
/// (`up`).
fn up_times(p: &FieldPath, f: &RawFailures) -> R<Draw> {
    Ok(match (&f.mtbf, &f.up) {
        (Some(_), Some(_)) => {
            return Err(expected(
                &p.key("up"),
                "either `mtbf` (and `shape`) or `up`, not both",
                "both".to_owned(),
            ));
        }
        (Some(m), None) => {
            let mtbf = positive_duration(&p.key("mtbf"), m)?;
            let shape = f.shape.unwrap_or(1.0);
            if !(shape.is_finite() && (0.1..=20.0).contains(&shape)) {
                return Err(expected(
                    &p.key("shape"),
                    "a Weibull shape in [0.1, 20] (1: exponential)",
                    shape.to_string(),
                ));
            }
            // The Weibull scale whose mean is `mtbf`: mean = scale * Gamma(1 + 1 / shape).
            let scale = mtbf.as_secs_f64() / gamma(1.0 + 1.0 / shape);
            Draw::Weibull { scale, shape }
        }
        (None, Some(trace)) => {
            if f.shape.is_some() {
                return Err(expected(
                    &p.key("shape"),
                    "no Weibull shape with observed up times (`up`)",
                    f.shape.unwrap_or_default().to_string(),
                ));
            }
            Draw::Observed(observed(&p.key("up"), trace)?)
        }
        (None, None) => {
            return Err(missing(
                &p.key("mtbf"),
                r#"the mean time between failures, like "6h" (or observed up times, `up`)"#,
            ));
        }
    })
}

/// Outages of entry `f` (at `p`): exponential of mean `repair`, or drawn from the observed
/// ones (`down`).
fn outages(p: &FieldPath, f: &RawFailures) -> R<Draw> {
    Ok(match (&f.repair, &f.down) {
        (Some(_), Some(_)) => {
            return Err(expected(
                &p.key("down"),
                "either `repair` or `down`, not both",
                "both".to_owned(),
            ));
        }
        (Some(r), None) => Draw::Exponential(positive_duration(&p.key("repair"), r)?.as_secs_f64()),
        (None, Some(trace)) => Draw::Observed(observed(&p.key("down"), trace)?),
        (None, None) => {
            return Err(missing(
                &p.key("repair"),
                r#"the mean time to repair, like "10min" (or observed outages, `down`)"#,
            ));
        }
    })
}

/// Expands every `[[diurnal]]` entry: each day, each of its nodes leaves at `offline_at` (plus
/// a seeded draw in `[0, jitter)` per node and day) and restarts `offline_for` later; days
/// before the node's start or `from` are skipped, nothing happens from `until` on.
pub(super) fn diurnal(
    raw: &[RawDiurnal],
    nodes: &[NodeSpec],
    regions: &[Region],
    seed: u64,
    stop_time: Option<Duration>,
) -> R<Vec<Pending>> {
    const DAY: f64 = 86_400.0;
    let mut out = Vec::new();
    for (i, d) in raw.iter().enumerate() {
        let p = FieldPath::root().key("diurnal").index(i);
        let at = match &d.offline_at {
            Some(a) => duration(&p.key("offline_at"), a)?,
            None => {
                return Err(missing(
                    &p.key("offline_at"),
                    r#"the time of day the nodes go offline, like "22h""#,
                ));
            }
        };
        if at.as_secs_f64() >= DAY {
            return Err(expected(
                &p.key("offline_at"),
                "a time of day, under 24h",
                super::units::format_duration(at),
            ));
        }
        let span = match &d.offline_for {
            Some(f) => positive_duration(&p.key("offline_for"), f)?,
            None => {
                return Err(missing(
                    &p.key("offline_for"),
                    r#"how long they stay offline, like "8h""#,
                ));
            }
        };
        let jitter = d
            .jitter
            .as_ref()
            .map(|j| duration(&p.key("jitter"), j))
            .transpose()?
            .unwrap_or_default();
        if (span + jitter).as_secs_f64() >= DAY {
            return Err(expected(
                &p.key("offline_for"),
                "with the jitter, under 24h",
                super::units::format_duration(span),
            ));
        }
        let from =
            d.from.as_ref().map(|x| duration(&p.key("from"), x)).transpose()?.unwrap_or_default();
        let until = match (&d.until, stop_time) {
            (Some(u), _) => duration(&p.key("until"), u)?,
            (None, Some(t)) => t,
            (None, None) => {
                return Err(missing(&p.key("until"), "when the windows end (or a [stop] time)"));
            }
        };
        let days = (until.as_secs_f64() / DAY).ceil() as u64;
        if days > MAX_EVENTS_PER_NODE as u64 {
            return Err(expected(
                &p.key("until"),
                format!("at most {MAX_EVENTS_PER_NODE} days"),
                super::units::format_duration(until),
            ));
        }
        for id in select(&p, d.nodes.as_deref(), d.region.as_deref(), nodes, regions)? {
            let node = &nodes[id.0 as usize];
            let mut rng = stream(seed, (u64::from(id.0) << 32) | i as u64, Purpose::Diurnal);
            let first = node.start.max(from).as_secs_f64();
            for day in 0..days {
                let shift = rng.random::<f64>() * jitter.as_secs_f64();
                let off = day as f64 * DAY + at.as_secs_f64() + shift;
                if off < first {
                    continue;
                }
                if off >= until.as_secs_f64() {
                    break;
                }
                let leave = ms(off);
                if out.len() >= MAX_EVENTS {
                    return Err(too_many(&p, "until", super::units::format_duration(until)));
                }
                out.push(pending(leave, ChurnAction::Leave(vec![id]), EventSource::Diurnal(i), &p));
                let back = off + span.as_secs_f64();
                if back >= until.as_secs_f64() {
                    break;
                }
                out.push(pending(
                    ms(back),
                    ChurnAction::Restart(vec![id]),
                    EventSource::Diurnal(i),
                    &p,
                ));
            }
        }
    }
    Ok(out)
}

/// Expands every `[[arrivals]]` entry: its nodes (none with a `start` or a join of its own)
/// join one after another, the times between arrivals exponential with mean `every` from
/// `from`, in the order listed (or of their ids). Sets each node's start.
pub(super) fn arrivals(
    raw: &[RawArrivals],
    nodes: &mut [NodeSpec],
    start_given: &[bool],
    regions: &[Region],
    seed: u64,
) -> R<Vec<Pending>> {
    let mut out = Vec::new();
    let mut arriving = vec![false; nodes.len()];
    for (i, a) in raw.iter().enumerate() {
        let p = FieldPath::root().key("arrivals").index(i);
        let every = match &a.every {
            Some(e) => positive_duration(&p.key("every"), e)?,
            None => {
                return Err(missing(
                    &p.key("every"),
                    r#"the mean time between arrivals, like "30min""#,
                ));
            }
        };
        let from =
            a.from.as_ref().map(|x| duration(&p.key("from"), x)).transpose()?.unwrap_or_default();
        let explicit = a.nodes.is_some();
        let chosen: Vec<NodeId> =
            select(&p, a.nodes.as_deref(), a.region.as_deref(), nodes, regions)?
                .into_iter()
                // Without a list: the nodes of the selection that start with the run.
                .filter(|id| {
                    explicit
                        || (nodes[id.0 as usize].start.is_zero() && !start_given[id.0 as usize])
                })
                .collect();
        let mut rng = stream(seed, i as u64, Purpose::Arrivals);
        let mut t = from.as_secs_f64();
        for id in chosen {
            let k = id.0 as usize;
            let n = &nodes[k];
            if start_given[k] || !n.start.is_zero() || arriving[k] {
                return Err(conflict(
                    &p.key("nodes"),
                    format!(
                        "node {:?} already starts at {} (a start, a join or another arrival)",
                        n.name,
                        super::units::format_duration(n.start)
                    ),
                ));
            }
            t += -every.as_secs_f64() * (1.0 - rng.random::<f64>()).ln();
            let at = ms(t).max(Duration::from_millis(1));
            nodes[k].start = at;
            arriving[k] = true;
            out.push(pending(at, ChurnAction::Join(vec![id]), EventSource::Arrivals(i), &p));
        }
    }
    Ok(out)
}

fn ms(secs: f64) -> Duration {
    Duration::from_millis((secs * 1e3).round() as u64)
}

fn pending(at: Duration, action: ChurnAction, source: EventSource, p: &FieldPath) -> Pending {
    let event = ChurnEvent { at, action, source, during: None, from_step: None };
    Pending { event, path: p.clone(), node_paths: Vec::new() }
}

/// The nodes of an entry: `nodes`, or those of `region`, or all.
fn select(
    p: &FieldPath,
    names: Option<&[String]>,
    region: Option<&str>,
    nodes: &[NodeSpec],
    regions: &[Region],
) -> R<Vec<NodeId>> {
    match (names, region) {
        (Some(_), Some(_)) => Err(conflict(&p.key("region"), "give nodes or region, not both")),
        (Some(names), None) => {
            if names.is_empty() {
                return Err(expected(&p.key("nodes"), "at least one node name", "[]"));
            }
            let mut ids = Vec::with_capacity(names.len());
            for (j, name) in names.iter().enumerate() {
                let Some(n) = nodes.iter().find(|n| n.name == *name) else {
                    let all = nodes.iter().map(|n| n.name.clone()).collect();
                    return Err(super::fields::unknown(
                        &p.key("nodes").index(j),
                        "node",
                        name,
                        all,
                    ));
                };
                if ids.contains(&n.id) {
                    return Err(conflict(
                        &p.key("nodes").index(j),
                        format!("node {name:?} is listed twice"),
                    ));
                }
                ids.push(n.id);
            }
            Ok(ids)
        }
        (None, Some(r)) => {
            let region = region_ref(&p.key("region"), r, regions)?;
            Ok(nodes.iter().filter(|n| n.region == region).map(|n| n.id).collect())
        }
        (None, None) => Ok(nodes.iter().map(|n| n.id).collect()),
    }
}

/// The gamma function (Lanczos' approximation, g = 7, 9 terms: about 15 significant digits for
/// the arguments here, 1.05 to 11).
fn gamma(x: f64) -> f64 {
    const G: f64 = 7.0;
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        return std::f64::consts::PI / ((std::f64::consts::PI * x).sin() * gamma(1.0 - x));
    }
    let x = x - 1.0;
    let mut a = C[0];
    let t = x + G + 0.5;
    for (k, c) in C.iter().enumerate().skip(1) {
        a += c / (x + k as f64);
    }
    (2.0 * std::f64::consts::PI).sqrt() * t.powf(x + 0.5) * (-t).exp() * a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gamma_by_hand() {
        for (x, want) in
            [(1.0, 1.0), (2.0, 1.0), (3.0, 2.0), (5.0, 24.0), (1.5, 0.886_226_925_452_758)]
        {
            assert!((gamma(x) - want).abs() < 1e-12 * want, "gamma({x}) = {}", gamma(x));
        }
    }
}
