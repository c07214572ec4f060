//! Conformance of the two backends: every scenario of `scenarios/faults/` played by `loco replay`
//! (the simulator) and by `loco launch --synthetic-params` (real processes on loopback), and their
//! full event streams compared, and their outer weights (digests) and losses after every step.
//!
//! What is compared (docs/conformance.md says why each rule is what it is):
//!
//! - `events.csv`, split into streams that each have one author, so that the order inside a
//!   stream is causal in both backends: `run` (rows without a node: the coordinator's epochs,
//!   retries and stop, the run's start), `coord/<node>` (what the coordinator wrote about a node:
//!   `join-request`, `admit`, its `evict`, a reported `allreduce-failed`) and `<node>` (what the
//!   node wrote itself, and its process events: `start`, `crash`, `hang`, ...). Each row becomes
//!   its kind, its epoch and the protocol facts of its detail (an eviction's reason, an epoch's
//!   members, a recovery's senders, a crash's phase, the outer step of an admission); times,
//!   free-text details and the real backend's node ids (`n3` for `late`) are normalised away, and
//!   `checkpoint` rows are dropped (the simulator writes no checkpoints).
//! - `outer_steps.csv`: in each backend every node with a digest after a step has the same one,
//!   and then, node by node and step by step, the two backends' digests and losses must be the
//!   same bits: both train `loco_core::node::synthetic` (`--synthetic-params` = `[sim] elements`)
//!   on a ring in node-id order (`[mesh] ring = "ids"` in every fault scenario), so where the
//!   membership story is the same so are the sums. A node with a digest in only one backend, or
//!   another digest or loss, is a difference like any other.
//!
//! The streams are diffed (longest common subsequence, per stream). Every difference left must be
//! listed in this scenario's allow-list with its reason ([`Why`]), and every listed difference
//! must appear (except those that [`Allowed::timing`] marks as decided by the real backend's
//! timing): a new difference fails, and so does a fixed one, until docs/conformance.md and the
//! list below are updated together.

use crate::common::{Row, TestContext, one_real_run_at_a_time, read_csv, stderr, stdout};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::PathBuf;

/// Which backend a difference is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Sim,
    Real,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Sim => "sim",
            Side::Real => "real",
        }
    }
}

/// One backend's run of a scenario.
struct Played {
    dir: PathBuf,
    events: Vec<Row>,
    rows: Vec<Row>,
}

impl Played {
    fn read(dir: PathBuf) -> Played {
        let events = read_csv(&dir.join("events.csv"));
        let rows = read_csv(&dir.join("outer_steps.csv"));
        Played { dir, events, rows }
    }

    fn events_text(&self) -> String {
        std::fs::read_to_string(self.dir.join("events.csv")).unwrap_or_default()
    }
}

/// Plays `scenarios/faults/<name>.toml` in both backends (the real one as tests/it/faults.rs
/// does: a synthetic objective, checkpoints in the context, a timeout).
fn play(ctx: &TestContext, name: &str) -> (Played, Played) {
    let scenario = format!("scenarios/faults/{name}.toml");
    let sim = ctx.path().join("sim");
    let o = ctx.loco(&["replay", &scenario, "--out", sim.to_str().unwrap()]);
    assert!(o.status.success(), "replay: stdout: {}\nstderr: {}", stdout(&o), stderr(&o));
    let real = ctx.path().join("real");
    let ckpt = ctx.path().join("ckpt");
    // The simulator's vector length, so that both train the same objective on the same weights,
    // and a ring in id order, so that both add the pseudo-gradients in the same order.
    let s = loco_core::scenario::Scenario::load(TestContext::repo().join(&scenario)).unwrap();
    assert_eq!(s.sim().numerics, loco_core::scenario::Numerics::Real, "{scenario}: [sim] numerics");
    assert_eq!(
        s.mesh().ring_order,
        loco_core::mesh::RingOrder::Ids,
        "{scenario}: [mesh] ring = \"ids\" (docs/conformance.md)"
    );
    let elements = s.sim().elements.to_string();
    let o = {
        let _turn = one_real_run_at_a_time();
        ctx.loco(&[
            "launch",
            &scenario,
            "--out",
            real.to_str().unwrap(),
            "--checkpoint-dir",
            ckpt.to_str().unwrap(),
            "--timeout",
            "120",
            "--synthetic-params",
            &elements,
        ])
    };
    assert!(o.status.success(), "launch: stdout: {}\nstderr: {}", stdout(&o), stderr(&o));
    (Played::read(sim), Played::read(real))
}

/// Node names, and the real backend's spelling of node ids in details (`n3`) mapped to them.
struct Names {
    by_id: BTreeMap<String, String>,
    known: BTreeSet<String>,
}

impl Names {
    fn of(runs: [&Played; 2]) -> Names {
        let mut by_id = BTreeMap::new();
        let mut known = BTreeSet::new();
        for p in runs {
            for r in &p.rows {
                by_id.insert(format!("n{}", r["node_id"]), r["node"].clone());
                known.insert(r["node"].clone());
            }
            known.extend(p.events.iter().map(|e| e["node"].clone()).filter(|n| !n.is_empty()));
        }
        Names { by_id, known }
    }

    /// The node names in `text`, whichever way it spells them, in the order they appear.
    fn in_text(&self, text: &str) -> Vec<String> {
        text.split([' ', ',', ';', '(', ')'])
            .map(|w| self.by_id.get(w).map_or(w, String::as_str))
            .filter(|w| self.known.contains(*w))
            .map(str::to_string)
            .collect()
    }

    /// `text` with the real backend's node ids written as names.
    fn rename(&self, text: &str) -> String {
        text.split(' ')
            .map(|w| self.by_id.get(w).map_or(w, String::as_str))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Which stream a row belongs to: its author (see the module doc).
fn stream(e: &Row) -> String {
    let node = &e["node"];
    if node.is_empty() {
        return "run".to_string();
    }
    let d = &e["detail"];
    let coordinators = match e["kind"].as_str() {
        "join-request" | "admit" => true,
        "evict" => !d.starts_with("evicted by"),
        "allreduce-failed" => d.starts_with("attempt "),
        _ => false,
    };
    if coordinators { format!("coord/{node}") } else { node.clone() }
}

/// The words after `key` up to the next comma or semicolon.
fn after<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let at = text.find(key)? + key.len();
    text[at..].split([',', ';']).next()
}

/// A row as compared: its kind, its epoch (`-` when it has none) and the protocol facts of its
/// detail; `None` for rows not compared (checkpoints).
fn normalised(e: &Row, names: &Names) -> Option<String> {
    let kind = e["kind"].as_str();
    let d = e["detail"].as_str();
    let epoch = if e["epoch"].is_empty() { "-".to_string() } else { format!("e{}", e["epoch"]) };
    let fact: Option<String> = match kind {
        "checkpoint" => return None,
        // The run's: its members; a node's: how many members its view has.
        "epoch" => d.split_once(": ").map(|(_, m)| m.to_string()),
        "evict" | "skip-step" => Some(d.to_string()),
        "retry" if e["node"].is_empty() => Some(d.to_string()),
        "retry" => Some(match after(d, "all-reduce ").and_then(|op| op.split('/').next()) {
            Some(op) => format!("aborted all-reduce of {op}"),
            None => d.to_string(),
        }),
        "allreduce-failed" => Some(names.rename(d)),
        "start" | "join" => after(d, "outer step ").map(|s| format!("at outer step {s}")),
        "coordinator-lost" => after(d, "outer step ").map(|s| format!("holds outer step {s}")),
        "crash" => after(d, "during ").map(|p| format!("during {}", p.split(' ').next().unwrap())),
        "recovery-start" => {
            let who = d.split(';').next().unwrap_or_default();
            let mut senders = names.in_text(who);
            senders.sort();
            Some(format!("from {}", senders.join(" ")))
        }
        "recovery-done" => Some(match d.strip_prefix("sent") {
            Some(rest) => format!("sent to {}", names.in_text(rest).join(" ")),
            None => "received".to_string(),
        }),
        _ => None,
    };
    Some(match fact {
        Some(f) => format!("{kind} {epoch} ({f})"),
        None => format!("{kind} {epoch}"),
    })
}

fn streams(p: &Played, names: &Names) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for e in &p.events {
        if let Some(n) = normalised(e, names) {
            out.entry(stream(e)).or_default().push(n);
        }
    }
    out
}

/// One line of a diff: in both, only in the simulator's, only in the real one's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Both,
    Only(Side),
}

/// The shortest edit from `a` (the simulator's) to `b` (the real one's): longest common
/// subsequence, ties broken towards the simulator's line first.
fn diff<'a>(a: &'a [String], b: &'a [String]) -> Vec<(Op, &'a str)> {
    let (n, m) = (a.len(), b.len());
    let mut lcs = vec![vec![0usize; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] =
                if a[i] == b[j] { lcs[i + 1][j + 1] + 1 } else { lcs[i + 1][j].max(lcs[i][j + 1]) };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < n || j < m {
        if i < n && j < m && a[i] == b[j] {
            out.push((Op::Both, a[i].as_str()));
            i += 1;
            j += 1;
        } else if i < n && (j == m || lcs[i + 1][j] >= lcs[i][j + 1]) {
            out.push((Op::Only(Side::Sim), a[i].as_str()));
            i += 1;
        } else {
            out.push((Op::Only(Side::Real), b[j].as_str()));
            j += 1;
        }
    }
    out
}

/// A difference as the allow-lists spell it: `"<stream> <sim|real>: <event>"`, the event being
/// only in that backend's stream.
fn line(stream: &str, side: Side, event: &str) -> String {
    format!("{stream} {}: {event}", side.name())
}

/// Step -> node -> (digest, loss), for the rows with a digest, after checking that in this
/// backend all the nodes with a digest after a step have the same one.
fn digests(side: Side, p: &Played) -> BTreeMap<u64, BTreeMap<String, (String, String)>> {
    let mut by_step: BTreeMap<u64, BTreeMap<String, (String, String)>> = BTreeMap::new();
    for r in p.rows.iter().filter(|r| !r["weights_hash"].is_empty()) {
        by_step
            .entry(r["outer_step"].parse().unwrap())
            .or_default()
            .insert(r["node"].clone(), (r["weights_hash"].clone(), r["loss"].clone()));
    }
    for (step, hashes) in &by_step {
        let distinct: BTreeSet<&String> = hashes.values().map(|(h, _)| h).collect();
        assert_eq!(
            distinct.len(),
            1,
            "{}: the replicas differ after step {step}: {hashes:?}",
            side.name()
        );
    }
    by_step
}

/// The differences of two runs' `outer_steps.csv`, as lines of stream `digests`: `step S NODE`
/// (that node has a digest after step S only in that backend), and, on the real side,
/// `step S NODE: another digest` or `step S NODE: another loss` (both have one, and they differ:
/// the backends train the same objective, `loco_core::node::synthetic`, so on the same story
/// their weights and losses are the same bits).
fn digest_diff(sim: &Played, real: &Played) -> Vec<String> {
    let (s, r) = (digests(Side::Sim, sim), digests(Side::Real, real));
    let mut out = Vec::new();
    let none = BTreeMap::new();
    for step in s.keys().chain(r.keys()).collect::<BTreeSet<_>>() {
        let (a, b) = (s.get(step).unwrap_or(&none), r.get(step).unwrap_or(&none));
        for (n, (hash, loss)) in a {
            match b.get(n) {
                None => out.push(line("digests", Side::Sim, &format!("step {step} {n}"))),
                Some((h, _)) if h != hash => out.push(line(
                    "digests",
                    Side::Real,
                    &format!("step {step} {n}: another digest"),
                )),
                Some((_, l)) if l != loss => {
                    out.push(line("digests", Side::Real, &format!("step {step} {n}: another loss")))
                }
                Some(_) => {}
            }
        }
        for n in b.keys().filter(|n| !a.contains_key(*n)) {
            out.push(line("digests", Side::Real, &format!("step {step} {n}")));
        }
    }
    out
}

/// Why a difference is allowed. docs/conformance.md has a section per reason, named by its
/// [`Why::id`]; the `likely bug` ones are differences the unification of the backends should
/// remove (then the test fails on the listed line that is gone, and the entry goes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Why {
    /// Which survivor notices the broken ring first (or none before the eviction) is a race.
    RingFailureNoticeRace,
    /// Two joiners started at once queue in the order they arrive, and get their senders by it.
    JoinerQueueRace,
    /// A non-blocking joiner's state may arrive after the step it was admitted at closes.
    NonBlockingStateArrival,
    /// When the coordinator dies the real backend writes no run-level `stop` row.
    NoRunStopWithoutCoordinator,
}

impl Why {
    const ALL: [Why; 4] = [
        Why::RingFailureNoticeRace,
        Why::JoinerQueueRace,
        Why::NonBlockingStateArrival,
        Why::NoRunStopWithoutCoordinator,
    ];

    /// The name docs/conformance.md gives it.
    fn id(self) -> &'static str {
        match self {
            Why::RingFailureNoticeRace => "ring-failure-notice-race",
            Why::JoinerQueueRace => "joiner-queue-race",
            Why::NonBlockingStateArrival => "non-blocking-state-arrival",
            Why::NoRunStopWithoutCoordinator => "no-run-stop-without-coordinator",
        }
    }

    /// Expected (the backends must differ there) or a likely bug (they should not).
    fn likely_bug(self) -> bool {
        !matches!(
            self,
            Why::RingFailureNoticeRace | Why::JoinerQueueRace | Why::NonBlockingStateArrival
        )
    }
}

/// An allowed difference: the diff lines it accounts for, and why.
struct Allowed {
    why: Why,
    line: String,
    /// The real backend's timing decides whether the line appears: allowed, not required.
    timing: bool,
}

/// A scenario's allow-list, built with one helper per kind of difference: single lines, and
/// groups of alternatives of which exactly one must appear whole (a race with two outcomes).
#[derive(Default)]
struct List(Vec<Allowed>, Vec<Vec<(Why, Vec<String>)>>);

impl List {
    fn always(&mut self, why: Why, stream: &str, side: Side, events: &[&str]) -> &mut List {
        for e in events {
            self.0.push(Allowed { why, line: line(stream, side, e), timing: false });
        }
        self
    }

    fn maybe(&mut self, why: Why, stream: &str, side: Side, events: &[&str]) -> &mut List {
        for e in events {
            self.0.push(Allowed { why, line: line(stream, side, e), timing: true });
        }
        self
    }

    /// A new group of alternatives, with its first: these lines, all of them.
    fn either(&mut self, why: Why, lines: Vec<String>) -> &mut List {
        self.1.push(vec![(why, lines)]);
        self
    }

    /// Another alternative of the last group.
    fn or(&mut self, why: Why, lines: Vec<String>) -> &mut List {
        self.1.last_mut().expect("either first").push((why, lines));
        self
    }

    /// A member killed in the all-reduce of epoch 1 (n-1 in a ring of three): which of the two
    /// survivors reports the broken ring is the real backend's race.
    fn broken_ring(&mut self) -> &mut List {
        self.maybe(
            Why::RingFailureNoticeRace,
            "coord/n-0",
            Side::Sim,
            &["allreduce-failed e1 (attempt 0)"],
        );
        self.maybe(
            Why::RingFailureNoticeRace,
            "coord/n-2",
            Side::Real,
            &["allreduce-failed e1 (attempt 0)"],
        );
        self
    }
}

/// The allow-list of each scenario of `scenarios/faults/` (docs/conformance.md, "The allow-list").
fn allowed(scenario: &str) -> List {
    let mut l = List::default();
    match scenario {
        "coordinator-crash" => {
            l.always(Why::NoRunStopWithoutCoordinator, "run", Side::Sim, &["stop -"]);
        }
        "crash-in-compute"
        | "crash-in-checkpoint"
        | "crash-in-reduce-scatter"
        | "crash-in-all-gather" => {
            let phase = scenario.strip_prefix("crash-in-").unwrap();
            if matches!(phase, "reduce-scatter" | "all-gather") {
                l.broken_ring();
            }
        }
        "crash-in-state-send" => {}
        // A crash in the inner steps of sync DiLoCo: nothing in flight.
        "sparse-crash-join" => {}
        // The crash lands in the inner steps while the step before's all-reduce runs beside
        // them: the ring breaks as in a crash in the reduce-scatter.
        "overlap-crash-join" | "overlap-delay-crash-join" | "streaming-crash-join" => {
            l.broken_ring();
        }
        // Played in the process (its heartbeats go on), the hang tells the simulator's story.
        "hang" => {}
        "join-during-change" => {}
        "join-non-blocking" => {
            // Admitted at step 4; how many steps its state takes to arrive depends on the load.
            let early: Vec<String> = (4..9).map(|s| format!("step {s} late")).collect();
            let early: Vec<&str> = early.iter().map(String::as_str).collect();
            l.maybe(Why::NonBlockingStateArrival, "digests", Side::Sim, &early);
        }
        "leave" => {}
        "two-senders" => {}
        "coordinator-pause" => {}
        "two-joiners" => {
            // The queue's order (late-a first in the simulator) gives late-a n-0 and late-b n-1;
            // in the real run the joiner that arrives first is first, and gets n-0: either the
            // other way round, or the same senders as in the simulator (no difference).
            let swapped = vec![
                line("late-a", Side::Sim, "recovery-start e2 (from n-0)"),
                line("late-a", Side::Real, "recovery-start e2 (from n-1)"),
                line("late-b", Side::Sim, "recovery-start e2 (from n-1)"),
                line("late-b", Side::Real, "recovery-start e2 (from n-0)"),
            ];
            l.either(Why::JoinerQueueRace, swapped).or(Why::JoinerQueueRace, Vec::new());
        }
        other => panic!("no allow-list for scenario {other:?}: add one (and docs/conformance.md)"),
    }
    l
}

/// Claims the first unclaimed `found` line equal to `line` for `why`.
fn take(found: &[String], verdict: &mut [Option<Why>], line: &str, why: Why) -> bool {
    match (0..found.len()).find(|&i| verdict[i].is_none() && found[i] == line) {
        Some(i) => {
            verdict[i] = Some(why);
            true
        }
        None => false,
    }
}

/// Judges each found difference against the list: the reason that allows it, or `None` (new);
/// and the listed differences that did not appear.
fn judge(list: &List, found: &[String]) -> (Vec<Option<Why>>, Vec<(Why, String)>) {
    let mut verdict = vec![None; found.len()];
    let mut gone = Vec::new();
    for a in list.0.iter().filter(|a| !a.timing) {
        if !take(found, &mut verdict, &a.line, a.why) {
            gone.push((a.why, a.line.clone()));
        }
    }
    for group in &list.1 {
        let fits = |lines: &[String], verdict: &[Option<Why>]| {
            let mut v = verdict.to_vec();
            lines.iter().all(|l| take(found, &mut v, l, Why::JoinerQueueRace))
        };
        match group.iter().find(|(_, lines)| fits(lines, &verdict)) {
            Some((why, lines)) => {
                for l in lines {
                    take(found, &mut verdict, l, *why);
                }
            }
            None => gone.extend(
                group[0].1.iter().map(|l| (group[0].0, format!("{l} (or its alternatives)"))),
            ),
        }
    }
    for a in list.0.iter().filter(|a| a.timing) {
        take(found, &mut verdict, &a.line, a.why);
    }
    (verdict, gone)
}

/// How far the real run may fall behind the simulated one before its timed faults may land in
/// another outer step: the largest lag of the start of outer steps 1 to 3 (before any fault),
/// each counted from the start of step 0 (the scenario's clock starts once the processes are
/// ready; their start-up is not part of the run).
const MAX_LAG_S: f64 = 0.12;

/// Plays `name` in both backends and requires that they differ exactly as its allow-list says.
/// A failed comparison of a real run whose pace differed from the scenario's (a loaded machine:
/// its faults and joins, timed in seconds, may land in another outer step) is played again,
/// twice at most.
fn conforms(name: &str) {
    for attempt in 1..=3 {
        let ctx = TestContext::new();
        let (sim, real) = play(&ctx, name);
        let Err(report) = compare(name, &sim, &real) else { return };
        let Some(why) = off_pace(&sim, &real) else {
            panic!("{report}\n\nattempt {attempt}: the real run kept the scenario's pace");
        };
        if attempt == 3 {
            panic!("{report}\n\nattempt {attempt}: {why}");
        }
        eprintln!("{name}: attempt {attempt}: {why}; playing it again. It differed:\n{report}");
    }
}

/// Why the real run did not keep the simulated one's pace, if it did not: its outer steps 1-3
/// started late, or a node's first outer step (a joiner's admission, a non-blocking joiner's
/// state arriving) is another one.
fn off_pace(sim: &Played, real: &Played) -> Option<String> {
    let lag = lag_s(sim, real);
    if lag > MAX_LAG_S {
        return Some(format!(
            "the real run started its outer steps 1-3 up to {lag:.2} s after the simulated one \
             (at most {MAX_LAG_S} s keeps the scenario's pace)"
        ));
    }
    // Each node's first outer step, and its first counted one (weight above 0).
    let first = |p: &Played, counted: bool| {
        let mut m: BTreeMap<String, u64> = BTreeMap::new();
        for r in &p.rows {
            if counted && r["weight"].parse::<f64>().unwrap() <= 0.0 {
                continue;
            }
            let step: u64 = r["outer_step"].parse().unwrap();
            let e = m.entry(r["node"].clone()).or_insert(step);
            *e = (*e).min(step);
        }
        m
    };
    let mut moved = Vec::new();
    for (counted, what) in [(false, "first outer step"), (true, "first outer step counted")] {
        let (s, r) = (first(sim, counted), first(real, counted));
        for (n, k) in &s {
            match r.get(n) {
                Some(j) if j != k => moved
                    .push(format!("{n}'s {what} is {j} in the real run, {k} in the simulated one")),
                _ => {}
            }
        }
    }
    (!moved.is_empty()).then(|| moved.join("; "))
}

/// The largest delay of the real run's start of outer steps 1 to 3 (first node to start each,
/// counted from the start of step 0) against the simulated run's.
fn lag_s(sim: &Played, real: &Played) -> f64 {
    let starts = |p: &Played| {
        let mut m: BTreeMap<u64, f64> = BTreeMap::new();
        for r in &p.rows {
            let step: u64 = r["outer_step"].parse().unwrap();
            let t: f64 = r["start_s"].parse().unwrap();
            let e = m.entry(step).or_insert(t);
            *e = e.min(t);
        }
        m
    };
    let (s, r) = (starts(sim), starts(real));
    let since_0 = |m: &BTreeMap<u64, f64>, k: u64| Some(m.get(&k)? - m.get(&0)?);
    (1..4).filter_map(|k| Some(since_0(&r, k)? - since_0(&s, k)?)).fold(0.0, f64::max)
}

/// The comparison of two runs of `name`: `Err` with a readable diff when they differ otherwise
/// than its allow-list says.
fn compare(name: &str, sim: &Played, real: &Played) -> Result<(), String> {
    let names = Names::of([sim, real]);
    let (a, b) = (streams(sim, &names), streams(real, &names));
    let none = Vec::new();
    let mut per_stream: Vec<(String, Vec<(Op, String)>)> = Vec::new();
    for s in a.keys().chain(b.keys()).collect::<BTreeSet<_>>() {
        let d = diff(a.get(s).unwrap_or(&none), b.get(s).unwrap_or(&none));
        per_stream.push((s.clone(), d.into_iter().map(|(op, e)| (op, e.to_string())).collect()));
    }
    let digest_lines = digest_diff(sim, real);
    per_stream.push((
        "digests".to_string(),
        digest_lines
            .iter()
            .map(|l| {
                let side = if l.starts_with("digests sim") { Side::Sim } else { Side::Real };
                (Op::Only(side), l.split_once(": ").unwrap().1.to_string())
            })
            .collect(),
    ));
    let found: Vec<String> = per_stream
        .iter()
        .flat_map(|(s, d)| {
            d.iter().filter_map(move |(op, e)| match op {
                Op::Only(side) => Some(line(s, *side, e)),
                Op::Both => None,
            })
        })
        .collect();
    let (verdict, gone) = judge(&allowed(name), &found);
    let new = verdict.iter().filter(|v| v.is_none()).count();
    let clean = new == 0 && gone.is_empty();
    if clean && std::env::var_os("LOCO_CONFORMANCE_SHOW").is_none() {
        return Ok(());
    }
    let mut report = format!(
        "conformance of {name}: {new} new difference(s), {} listed difference(s) not seen\n\
         (`-` only in the simulator's run, `+` only in the real one's; the reasons are explained \
         in docs/conformance.md)\n",
        gone.len()
    );
    let mut k = 0;
    for (s, d) in &per_stream {
        if d.iter().all(|(op, _)| *op == Op::Both) {
            continue;
        }
        writeln!(report, "\n{s}").unwrap();
        for (op, e) in d {
            match op {
                Op::Both => writeln!(report, "    {e}").unwrap(),
                Op::Only(side) => {
                    let mark = if *side == Side::Sim { '-' } else { '+' };
                    let why = match verdict[k] {
                        Some(w) => format!("allowed: {}", w.id()),
                        None => "NEW".to_string(),
                    };
                    k += 1;
                    writeln!(report, "  {mark} {e:<60} {why}").unwrap();
                }
            }
        }
    }
    if !gone.is_empty() {
        writeln!(
            report,
            "\nlisted but not seen (fixed? then remove them from the allow-list and from \
             docs/conformance.md):"
        )
        .unwrap();
        for (why, l) in &gone {
            writeln!(report, "  {l}    [{}]", why.id()).unwrap();
        }
    }
    if clean {
        // LOCO_CONFORMANCE_SHOW=1: the allowed differences of a run that conforms.
        eprintln!("{report}");
        return Ok(());
    }
    write!(
        report,
        "\nsimulated events.csv:\n{}\nreal events.csv:\n{}",
        sim.events_text(),
        real.events_text()
    )
    .unwrap();
    Err(report)
}

macro_rules! scenarios {
    ($($test:ident = $name:literal,)*) => {
        $(
            #[test]
            fn $test() {
                conforms($name);
            }
        )*
        /// Every scenario with a test here.
        const SCENARIOS: &[&str] = &[$($name),*];
    };
}

scenarios! {
    coordinator_crash = "coordinator-crash",
    coordinator_pause = "coordinator-pause",
    crash_in_all_gather = "crash-in-all-gather",
    crash_in_checkpoint = "crash-in-checkpoint",
    crash_in_compute = "crash-in-compute",
    crash_in_reduce_scatter = "crash-in-reduce-scatter",
    crash_in_state_send = "crash-in-state-send",
    hang = "hang",
    join_during_change = "join-during-change",
    join_non_blocking = "join-non-blocking",
    leave = "leave",
    overlap_crash_join = "overlap-crash-join",
    overlap_delay_crash_join = "overlap-delay-crash-join",
    sparse_crash_join = "sparse-crash-join",
    streaming_crash_join = "streaming-crash-join",
    two_joiners = "two-joiners",
    two_senders = "two-senders",
}

/// Every scenario of `scenarios/faults/` has a test here, and docs/conformance.md lists every
/// reason under the right heading ("Expected" or "Likely bugs") and, per scenario, exactly the
/// reasons its allow-list uses.
#[test]
fn every_scenario_is_checked_and_every_allowed_difference_documented() {
    let dir = TestContext::repo().join("scenarios/faults");
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().into_string().ok())
        .filter_map(|f| f.strip_suffix(".toml").map(str::to_string))
        .collect();
    on_disk.sort();
    assert_eq!(on_disk, SCENARIOS, "a test per scenario of {}", dir.display());
    let doc = std::fs::read_to_string(TestContext::repo().join("docs/conformance.md")).unwrap();
    let bugs_at = doc.find("\n## Likely bugs").expect("a \"## Likely bugs\" section");
    let expected_at = doc.find("\n## Expected").expect("an \"## Expected\" section");
    for why in Why::ALL {
        let heading = format!("\n### `{}`", why.id());
        let at = doc.find(&heading).unwrap_or_else(|| panic!("no {heading:?} in the document"));
        let under_bugs = (bugs_at < at) && (expected_at < bugs_at || at < expected_at);
        assert_eq!(under_bugs, why.likely_bug(), "{} is under the wrong heading", why.id());
    }
    for name in SCENARIOS {
        let l = allowed(name);
        let mut used: BTreeSet<&str> = l.0.iter().map(|a| a.why.id()).collect();
        used.extend(l.1.iter().flatten().map(|(w, _)| w.id()));
        let row = doc
            .lines()
            .find(|r| r.starts_with(&format!("| `{name}` |")))
            .unwrap_or_else(|| panic!("no table row for {name} in the document"));
        let listed: BTreeSet<&str> =
            row.split('`').skip(3).step_by(2).filter(|id| !id.is_empty()).collect();
        assert_eq!(listed, used, "the document's row for {name}: {row}");
    }
}

/// The normalisation and the diff on small inputs (no run needed).
#[test]
fn rows_are_normalised_to_their_protocol_facts_and_diffed_per_stream() {
    let row = |kind: &str, node: &str, epoch: &str, detail: &str| -> Row {
        [("kind", kind), ("node", node), ("epoch", epoch), ("detail", detail)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let names = Names {
        by_id: [("n0", "n-0"), ("n1", "n-1"), ("n3", "late")]
            .into_iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect(),
        known: ["n-0", "n-1", "late"].into_iter().map(str::to_string).collect(),
    };
    let n = |r: &Row| normalised(r, &names);
    let real = row("recovery-start", "late", "3", "senders now n1, n0; 65536 bytes already held");
    assert_eq!(n(&real).unwrap(), "recovery-start e3 (from n-0 n-1)");
    let sim = row("recovery-start", "late", "3", "from n-0 n-1");
    assert_eq!(n(&real), n(&sim));
    let sent = row("recovery-done", "n-1", "2", "sent 65536 bytes of state (share 2 of 2) to n3");
    assert_eq!(n(&sent).unwrap(), "recovery-done e2 (sent to late)");
    let crash = row("crash", "n-1", "", "SIGKILL during all-gather (fault injection)");
    assert_eq!(n(&crash).unwrap(), "crash - (during all-gather)");
    assert_eq!(n(&row("checkpoint", "n-1", "1", "saved step-2")), None);
    assert_eq!(n(&row("epoch", "", "2", "2 members: n-0 late")).unwrap(), "epoch e2 (n-0 late)");
    assert_eq!(n(&row("epoch", "n-0", "2", "e2: 2 members")).unwrap(), "epoch e2 (2 members)");
    let abort = row("retry", "n-0", "2", "all-reduce e1/op 262144 aborted");
    assert_eq!(n(&abort).unwrap(), "retry e2 (aborted all-reduce of e1)");
    assert_eq!(stream(&row("evict", "n-1", "2", "heartbeat timeout")), "coord/n-1");
    assert_eq!(stream(&row("evict", "n-1", "1", "evicted by the coordinator (x)")), "n-1");
    assert_eq!(stream(&row("allreduce-failed", "n-2", "1", "n1 unreachable")), "n-2");
    assert_eq!(stream(&row("allreduce-failed", "n-2", "1", "attempt 0")), "coord/n-2");
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let (a, b) = (s(&["x", "y", "z"]), s(&["x", "w", "z", "v"]));
    assert_eq!(
        diff(&a, &b),
        vec![
            (Op::Both, "x"),
            (Op::Only(Side::Sim), "y"),
            (Op::Only(Side::Real), "w"),
            (Op::Both, "z"),
            (Op::Only(Side::Real), "v"),
        ]
    );
    // Judging: an always line must appear, a timing line may, one alternative must appear whole.
    let mut l = List::default();
    l.always(Why::NoRunStopWithoutCoordinator, "run", Side::Sim, &["stop -"])
        .maybe(Why::RingFailureNoticeRace, "n-0", Side::Real, &["x"])
        .either(Why::NonBlockingStateArrival, vec!["a".into(), "b".into()])
        .or(Why::JoinerQueueRace, vec!["c".into()]);
    let found = s(&["run sim: stop -", "c", "new"]);
    let (v, gone) = judge(&l, &found);
    assert_eq!(v, vec![Some(Why::NoRunStopWithoutCoordinator), Some(Why::JoinerQueueRace), None]);
    assert!(gone.is_empty());
    let (_, gone) = judge(&l, &s(&["a"]));
    assert_eq!(gone.len(), 3, "the stop line, and the first alternative: {gone:?}");
}

/// Both backends make a node from a scenario through the one translation
/// ([`loco_core::node::config`]): what a simulated host and a real worker hand it besides the
/// scenario may differ only in the executor's own facts (padding, modelled collectives, the
/// inner optimiser's state, the clock's offset, the checkpoint directory), so a joiner with two senders is sent the same
/// pieces by the same senders in both, and every protocol setting is the same.
#[test]
fn both_backends_make_the_same_node_from_a_scenario() {
    use loco_core::ids::NodeId;
    use loco_core::node::config::ExecutorSide;
    use loco_core::node::machine::{NodeConfig, Numerics};
    let path = TestContext::repo().join("scenarios/faults/two-senders.toml");
    let s = loco_core::scenario::Scenario::load(&path).unwrap();
    assert_eq!(s.mesh().state_senders, 2);
    let initial: Vec<f32> = (0..16).map(|i| i as f32 * 1e-3).collect();
    let opts = loco_real::node::WorkerOptions {
        scenario: std::sync::Arc::new(s.clone()),
        id: NodeId(0),
        incarnation: 1,
        coordinator: "127.0.0.1:1".parse().unwrap(),
        listen: "127.0.0.1:0".parse().unwrap(),
        tcp: Default::default(),
        metrics: None,
        time_offset_s: 2.5,
        checkpoint: None,
        resume: None,
        faults: Vec::new(),
        status: None,
        exporter: None,
        hang: None,
    };
    // The executor's own facts, set alike so that the rest must be equal (whether a node writes
    // checkpoints is the scenario's `[real] checkpoint_dir`, or a worker's command line).
    let alike = |mut side: ExecutorSide| {
        side.checkpoints = false;
        side.virtual_padding = false;
        side.modelled_collectives = false;
        side.own_max = 0;
        side.offset_s = 0.0;
        side
    };
    for n in s.nodes() {
        let sim = loco_sim::executor_side(&s, Numerics::Real { initial: initial.clone() }, false);
        let real = loco_real::node::executor_side(&opts, initial.clone(), Vec::new(), 1 << 20);
        let sim = NodeConfig::for_node(&s, n.id, alike(sim)).unwrap();
        let real = NodeConfig::for_node(&s, n.id, alike(real)).unwrap();
        assert_eq!(
            format!("{sim:?}"),
            format!("{real:?}"),
            "node {}: the two backends' settings differ beyond the executors' facts",
            n.name
        );
        assert!(
            matches!(
                sim.state_pieces,
                loco_core::node::machine::StatePieces::PerJoinerShard { .. }
            ),
            "one state-piece rule: {:?}",
            sim.state_pieces
        );
    }
}
