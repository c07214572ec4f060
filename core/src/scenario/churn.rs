//! Validation of `[[churn]]`: each entry resolved to node and region ids, the `for` of an entry
//! turned into its own ending event, joins folded into the nodes' start times, and the sorted
//! events played against each node's state so that an event that cannot happen is an error.

use super::error::{ErrorKind, FieldPath, PathError};
use super::fields::{
    Pending, R, conflict, duration, expected, missing, one_of_text, positive_duration, quoted,
    rate, region_ref, unknown, varying,
};
use super::raw::RawChurn;
use super::units::format_duration;
use super::{
    ChurnAction, ChurnEvent, Cut, EventSource, FaultPhase, LinkSpec, NodeSpec, Region, RegionId,
};
use crate::ids::NodeId;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Join,
    Leave,
    Crash,
    Hang,
    Resume,
    Restart,
    Partition,
    Heal,
    Degrade,
    Restore,
    CoordinatorCrash,
    CoordinatorPause,
}

const KINDS: [(&str, Kind); 12] = [
    ("join", Kind::Join),
    ("leave", Kind::Leave),
    ("crash", Kind::Crash),
    ("hang", Kind::Hang),
    ("resume", Kind::Resume),
    ("restart", Kind::Restart),
    ("partition", Kind::Partition),
    ("heal", Kind::Heal),
    ("degrade", Kind::Degrade),
    ("restore", Kind::Restore),
    ("coordinator-crash", Kind::CoordinatorCrash),
    ("coordinator-pause", Kind::CoordinatorPause),
];

impl Kind {
    fn name(self) -> &'static str {
        KINDS.iter().find(|(_, k)| *k == self).map_or("?", |(n, _)| n)
    }

    /// The optional fields an event of this kind accepts (besides `at` and `kind`).
    fn accepts(self, field: &str) -> bool {
        let node = matches!(field, "node" | "nodes");
        let link = matches!(field, "from" | "to" | "oneway");
        match self {
            Kind::Crash => node || matches!(field, "during" | "step"),
            Kind::Join | Kind::Leave | Kind::Resume | Kind::Restart => node,
            Kind::Hang => node || field == "for",
            Kind::Partition => node || link || field == "for",
            Kind::Heal => node || link,
            Kind::Degrade => link || matches!(field, "bandwidth" | "latency" | "jitter" | "for"),
            Kind::Restore => link,
            Kind::CoordinatorCrash => false,
            Kind::CoordinatorPause => field == "for",
        }
    }
}

/// A node's state while the events are played.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    NotStarted,
    Running,
    Hung(Duration),
    Crashed(Duration),
    Left(Duration),
}

impl State {
    fn describe(self, start: Duration) -> String {
        match self {
            State::NotStarted if start.is_zero() => "it never starts".to_owned(),
            State::NotStarted => {
                format!("it has not started yet (it starts at {})", format_duration(start))
            }
            State::Running => "it is running".to_owned(),
            State::Hung(t) => format!("it hangs since {}", format_duration(t)),
            State::Crashed(t) => format!("it crashed at {}", format_duration(t)),
            State::Left(t) => format!("it left at {}", format_duration(t)),
        }
    }
}

/// What generates events besides the file's `[[churn]]`: its `[[failures]]` processes and
/// `[[diurnal]]` windows, drawn
/// from its seed, until its stop time unless they say.
pub(super) struct Generators<'a> {
    pub(super) failures: &'a [super::raw::RawFailures],
    pub(super) diurnal: &'a [super::raw::RawDiurnal],
    pub(super) arrivals: &'a [super::raw::RawArrivals],
    pub(super) seed: u64,
    pub(super) stop_time: Option<Duration>,
}

pub(super) fn churn(
    raw: &[RawChurn],
    generators: &Generators<'_>,
    nodes: &mut [NodeSpec],
    start_given: &[bool],
    regions: &[Region],
    links: &[LinkSpec],
) -> R<Vec<ChurnEvent>> {
    let p = FieldPath::root().key("churn");
    let names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
    let mut pending: Vec<Pending> = Vec::new();
    // Which churn entry starts each node that has no `start`.
    let mut joined_by: BTreeMap<usize, usize> = BTreeMap::new();

    for (i, c) in raw.iter().enumerate() {
        let e = Entry::parse(i, p.index(i), c, &names)?;
        let out = &mut pending;
        match e.kind {
            Kind::Join => {
                let ids = e.join(nodes, start_given, &mut joined_by, &p)?;
                e.push_start(out, ChurnAction::Join(ids));
            }
            Kind::Leave => e.push_start(out, ChurnAction::Leave(e.node_ids()?)),
            Kind::Crash => e.push_start(out, ChurnAction::Crash(e.node_ids()?)),
            Kind::Resume => e.push_start(out, ChurnAction::Resume(e.node_ids()?)),
            Kind::Restart => e.push_start(out, ChurnAction::Restart(e.node_ids()?)),
            Kind::Hang => {
                let ids = e.node_ids()?;
                e.push_start(out, ChurnAction::Hang(ids.clone()));
                e.push_end(out, ChurnAction::Resume(ids));
            }
            Kind::Partition | Kind::Heal => e.cut(regions, out)?,
            Kind::Degrade | Kind::Restore => e.link(regions, links, out)?,
            Kind::CoordinatorCrash => e.push_start(out, ChurnAction::CoordinatorCrash),
            Kind::CoordinatorPause => {
                if e.end_at.is_none() {
                    return Err(missing(
                        &e.cp.key("for"),
                        r#"how long the coordinator's process is stopped, like "18s""#,
                    ));
                }
                e.push_start(out, ChurnAction::CoordinatorPause);
                e.push_end(out, ChurnAction::CoordinatorResume);
            }
        }
    }

    let g = generators;
    // Joins of nodes whose `start` is later than 0, one event per [[nodes]] entry, first.
    let mut starts = node_starts(nodes, start_given);
    starts.extend(pending);
    // Arrivals set their nodes' starts; then the processes run from each node's start.
    starts.extend(super::failures::arrivals(g.arrivals, nodes, start_given, regions, g.seed)?);
    starts.extend(super::failures::failures(g.failures, nodes, regions, g.seed, g.stop_time)?);
    starts.extend(super::failures::diurnal(g.diurnal, nodes, regions, g.seed, g.stop_time)?);
    let mut all = starts;
    all.sort_by_key(|e| e.event.at);
    play(&all, nodes, regions)?;
    Ok(all.into_iter().map(|e| e.event).collect())
}

/// One `[[churn]]` entry with the fields every kind shares checked and resolved.
struct Entry<'a> {
    /// Its index in `[[churn]]`.
    i: usize,
    /// Its path.
    cp: FieldPath,
    c: &'a RawChurn,
    at: Duration,
    kind: Kind,
    during: Option<FaultPhase>,
    from_step: Option<u64>,
    /// When its `for` ends.
    end_at: Option<Duration>,
    /// It names `node` or `nodes`.
    has_nodes: bool,
    /// The nodes named, with the path of each name.
    ids: Vec<NodeId>,
    node_paths: Vec<FieldPath>,
}

impl<'a> Entry<'a> {
    /// Checks the fields of entry `i` (at `cp`) that do not depend on its kind's meaning, and
    /// resolves its node names among `names`.
    fn parse(i: usize, cp: FieldPath, c: &'a RawChurn, names: &[String]) -> R<Entry<'a>> {
        let at = match &c.at {
            Some(a) => duration(&cp.key("at"), a)?,
            None => return Err(missing(&cp.key("at"), r#"the time of the event, like "3h""#)),
        };
        let kind = match &c.kind {
            Some(k) => KINDS.iter().find(|(n, _)| n == k).map(|(_, k)| *k).ok_or_else(|| {
                let names: Vec<&str> = KINDS.iter().map(|(n, _)| *n).collect();
                expected(&cp.key("kind"), one_of_text(&names), quoted(k))
            })?,
            None => return Err(missing(&cp.key("kind"), "the kind of event, like \"crash\"")),
        };
        check_fields(&cp, c, kind)?;
        let during = match &c.during {
            Some(d) => Some(FaultPhase::parse(d).ok_or_else(|| {
                let names: Vec<&str> = FaultPhase::ALL.iter().map(|(n, _)| *n).collect();
                expected(&cp.key("during"), one_of_text(&names), quoted(d))
            })?),
            None => None,
        };
        if c.step.is_some() && during.is_none() {
            return Err(missing(
                &cp.key("during"),
                "the phase the crash strikes in (`step` arms a crash with `during`)",
            ));
        }
        let for_ = c.for_.as_ref().map(|f| positive_duration(&cp.key("for"), f)).transpose()?;
        let end_at = match for_ {
            Some(d) => Some(at.checked_add(d).ok_or_else(|| {
                expected(
                    &cp.key("for"),
                    "a shorter duration",
                    c.for_.as_ref().map_or(String::new(), |f| f.to_string()),
                )
            })?),
            None => None,
        };
        let has_nodes = c.node.is_some() || c.nodes.is_some();
        let mut node_paths = Vec::new();
        let mut ids = Vec::new();
        if has_nodes {
            for (id, np) in node_list(&cp, c, names)? {
                ids.push(id);
                node_paths.push(np);
            }
        }
        let from_step = c.step;
        Ok(Entry { i, cp, c, at, kind, during, from_step, end_at, has_nodes, ids, node_paths })
    }

    /// Queues an event of this entry.
    fn push(
        &self,
        out: &mut Vec<Pending>,
        action: ChurnAction,
        source: EventSource,
        path: FieldPath,
        at: Duration,
    ) {
        // The end of a `for` blames the `for` itself, not the node names.
        let node_paths = match source {
            EventSource::ChurnEnd(_) => Vec::new(),
            _ => self.node_paths.clone(),
        };
        let (during, from_step) = match source {
            EventSource::Churn(_) => (self.during, self.from_step),
            _ => (None, None),
        };
        let event = ChurnEvent { at, action, source, during, from_step };
        out.push(Pending { event, path, node_paths });
    }

    /// Queues the event the entry describes, at its `at`.
    fn push_start(&self, out: &mut Vec<Pending>, action: ChurnAction) {
        self.push(out, action, EventSource::Churn(self.i), self.cp.clone(), self.at);
    }

    /// Queues the event that ends it when its `for` is over, if it has one.
    fn push_end(&self, out: &mut Vec<Pending>, action: ChurnAction) {
        if let Some(end) = self.end_at {
            self.push(out, action, EventSource::ChurnEnd(self.i), self.cp.key("for"), end);
        }
    }

    /// The nodes of a kind that needs some.
    fn node_ids(&self) -> R<Vec<NodeId>> {
        if self.ids.is_empty() {
            Err(missing(&self.cp.key("node"), r#"node = "name" or nodes = ["a", "b"]"#))
        } else {
            Ok(self.ids.clone())
        }
    }

    /// `from` and `to` resolved to regions (`None` when neither is given and not `required`),
    /// with `oneway`.
    fn region_pair(
        &self,
        regions: &[Region],
        required: bool,
    ) -> R<Option<(RegionId, RegionId, bool)>> {
        let (cp, c) = (&self.cp, self.c);
        match (&c.from, &c.to) {
            (Some(f), Some(t)) => {
                let from = region_ref(&cp.key("from"), f, regions)?;
                let to = region_ref(&cp.key("to"), t, regions)?;
                Ok(Some((from, to, c.oneway.unwrap_or(false))))
            }
            (Some(_), None) => Err(missing(&cp.key("to"), "the other region")),
            (None, Some(_)) => Err(missing(&cp.key("from"), "the other region")),
            (None, None) if required => Err(missing(&cp.key("from"), "a region name (with to)")),
            (None, None) => Ok(None),
        }
    }

    /// A `join`: its nodes start at its `at` (a time after 0), each once, and none that has a
    /// `start` of its own. `p` is the path of `[[churn]]`.
    fn join(
        &self,
        nodes: &mut [NodeSpec],
        start_given: &[bool],
        joined_by: &mut BTreeMap<usize, usize>,
        p: &FieldPath,
    ) -> R<Vec<NodeId>> {
        let ids = self.node_ids()?;
        if self.at.is_zero() {
            return Err(expected(
                &self.cp.key("at"),
                "a time after 0s (nodes present from the start need no join event)",
                self.c.at.as_ref().map_or(String::new(), |a| a.to_string()),
            ));
        }
        for (id, np) in ids.iter().zip(&self.node_paths) {
            let k = id.0 as usize;
            if start_given[k] {
                let entry = FieldPath::root().key("nodes").index(nodes[k].entry).key("start");
                return Err(conflict(
                    np,
                    format!(
                        "node {:?} already has a start ({entry} = {}); a join event cannot start it again (restart brings back a node that crashed or left)",
                        nodes[k].name,
                        format_duration(nodes[k].start)
                    ),
                ));
            }
            if let Some(first) = joined_by.insert(k, self.i) {
                return Err(conflict(
                    np,
                    format!(
                        "node {:?} already joins at {} ({})",
                        nodes[k].name,
                        format_duration(nodes[k].start),
                        p.index(first)
                    ),
                ));
            }
            nodes[k].start = self.at;
        }
        Ok(ids)
    }

    /// A `partition` (healed at the end of its `for`) or a `heal` (of every partition when it
    /// names no cut): between two regions, or of nodes from the rest.
    fn cut(&self, regions: &[Region], out: &mut Vec<Pending>) -> R<()> {
        let (cp, c) = (&self.cp, self.c);
        let pair = self.region_pair(regions, false)?;
        let cut = match (pair, self.has_nodes) {
            (Some(_), true) => {
                let field = if c.nodes.is_some() { "nodes" } else { "node" };
                return Err(conflict(&cp.key(field), "give regions (from, to) or nodes, not both"));
            }
            (Some((from, to, oneway)), false) => {
                if from == to {
                    return Err(expected(
                        &cp.key("to"),
                        "a region other than `from`",
                        quoted(&regions[to.0 as usize].name),
                    ));
                }
                Some(normal_cut(Cut::Regions { from, to, oneway }))
            }
            (None, true) => {
                if c.oneway.is_some() {
                    return Err(conflict(
                        &cp.key("oneway"),
                        "`oneway` applies to a partition between regions",
                    ));
                }
                Some(normal_cut(Cut::Nodes(self.ids.clone())))
            }
            (None, false) => None,
        };
        if self.kind == Kind::Heal {
            self.push_start(out, ChurnAction::Heal(cut));
        } else {
            let Some(cut) = cut else {
                return Err(missing(
                    &cp.key("from"),
                    "two regions (from, to) or node/nodes to cut off",
                ));
            };
            self.push_start(out, ChurnAction::Partition(cut.clone()));
            self.push_end(out, ChurnAction::Heal(Some(cut)));
        }
        Ok(())
    }

    /// A `degrade` of a link (restored at the end of its `for`) or its `restore`: the link
    /// must exist in each direction it changes.
    fn link(&self, regions: &[Region], links: &[LinkSpec], out: &mut Vec<Pending>) -> R<()> {
        let (cp, c, kind) = (&self.cp, self.c, self.kind);
        let Some((from, to, oneway)) = self.region_pair(regions, true)? else {
            return Err(missing(&cp.key("from"), "a region name (with to)"));
        };
        for (x, y) in if oneway { vec![(from, to)] } else { vec![(from, to), (to, from)] } {
            if !links.iter().any(|l| l.serves(x, y)) {
                return Err(PathError::new(
                    cp.key("from"),
                    ErrorKind::NoLink {
                        from: regions[x.0 as usize].name.clone(),
                        to: regions[y.0 as usize].name.clone(),
                        needed_by: format!("needed by this {} event", kind.name()),
                    },
                ));
            }
        }
        if kind == Kind::Restore {
            self.push_start(out, ChurnAction::Restore { from, to, oneway });
            return Ok(());
        }
        let bandwidth =
            c.bandwidth.as_ref().map(|b| varying(&cp.key("bandwidth"), b, rate)).transpose()?;
        let latency =
            c.latency.as_ref().map(|l| varying(&cp.key("latency"), l, duration)).transpose()?;
        let jitter = c.jitter.as_ref().map(|j| duration(&cp.key("jitter"), j)).transpose()?;
        if bandwidth.is_none() && latency.is_none() && jitter.is_none() {
            return Err(missing(
                &cp.key("bandwidth"),
                "bandwidth, latency or jitter: what the link changes to",
            ));
        }
        self.push_start(out, ChurnAction::Degrade { from, to, oneway, bandwidth, latency, jitter });
        self.push_end(out, ChurnAction::Restore { from, to, oneway });
        Ok(())
    }
}

/// Rejects the optional fields of entry `c` (at `cp`) that its `kind` does not take.
fn check_fields(cp: &FieldPath, c: &RawChurn, kind: Kind) -> R<()> {
    let present = [
        ("node", c.node.is_some()),
        ("nodes", c.nodes.is_some()),
        ("from", c.from.is_some()),
        ("to", c.to.is_some()),
        ("oneway", c.oneway.is_some()),
        ("bandwidth", c.bandwidth.is_some()),
        ("latency", c.latency.is_some()),
        ("jitter", c.jitter.is_some()),
        ("for", c.for_.is_some()),
        ("during", c.during.is_some()),
        ("step", c.step.is_some()),
    ];
    for (field, given) in present {
        if given && !kind.accepts(field) {
            return Err(conflict(
                &cp.key(field),
                format!("`{field}` does not apply to a {} event", kind.name()),
            ));
        }
    }
    Ok(())
}

/// The joins of the nodes whose `start` is later than 0: one event per `[[nodes]]` entry.
fn node_starts(nodes: &[NodeSpec], start_given: &[bool]) -> Vec<Pending> {
    let mut starts: Vec<Pending> = Vec::new();
    for (k, n) in nodes.iter().enumerate() {
        if !start_given[k] || n.start.is_zero() {
            continue;
        }
        let path = FieldPath::root().key("nodes").index(n.entry).key("start");
        match starts.last_mut() {
            Some(last) if last.event.source == EventSource::NodeStart(n.entry) => {
                if let ChurnAction::Join(ids) = &mut last.event.action {
                    ids.push(n.id);
                }
                last.node_paths.push(path);
            }
            _ => starts.push(Pending {
                event: ChurnEvent {
                    at: n.start,
                    action: ChurnAction::Join(vec![n.id]),
                    source: EventSource::NodeStart(n.entry),
                    during: None,
                    from_step: None,
                },
                path: path.clone(),
                node_paths: vec![path],
            }),
        }
    }
    starts
}

/// Resolves `node` or `nodes` of a churn entry to ids, with the path of each name.
fn node_list(cp: &FieldPath, c: &RawChurn, names: &[String]) -> R<Vec<(NodeId, FieldPath)>> {
    let list: Vec<(String, FieldPath)> = match (&c.node, &c.nodes) {
        (Some(_), Some(_)) => {
            return Err(conflict(&cp.key("nodes"), "give node or nodes, not both"));
        }
        (Some(n), None) => vec![(n.clone(), cp.key("node"))],
        (None, Some(ns)) if ns.is_empty() => {
            return Err(expected(&cp.key("nodes"), "at least one node name", "[]"));
        }
        (None, Some(ns)) => {
            ns.iter().enumerate().map(|(j, n)| (n.clone(), cp.key("nodes").index(j))).collect()
        }
        (None, None) => Vec::new(),
    };
    let mut out: Vec<(NodeId, FieldPath)> = Vec::with_capacity(list.len());
    for (name, path) in list {
        let Some(k) = names.iter().position(|n| *n == name) else {
            return Err(unknown(&path, "node", &name, names.to_vec()));
        };
        let id = NodeId(k as u32);
        if let Some((_, first)) = out.iter().find(|(o, _)| *o == id) {
            return Err(PathError::new(
                path,
                ErrorKind::Duplicate { what: "node", name, first: first.to_string() },
            ));
        }
        out.push((id, path));
    }
    Ok(out)
}

/// One form per cut, so that a heal matches its partition: regions in order unless one-way,
/// nodes sorted.
fn normal_cut(cut: Cut) -> Cut {
    match cut {
        Cut::Regions { from, to, oneway: false } if to < from => {
            Cut::Regions { from: to, to: from, oneway: false }
        }
        Cut::Nodes(mut ids) => {
            ids.sort();
            Cut::Nodes(ids)
        }
        other => other,
    }
}

/// Plays the sorted events and rejects the ones that cannot happen.
fn play(events: &[Pending], nodes: &[NodeSpec], regions: &[Region]) -> R<()> {
    let mut state: Vec<State> = nodes
        .iter()
        .map(|n| if n.start.is_zero() { State::Running } else { State::NotStarted })
        .collect();
    let mut cuts: Vec<Cut> = Vec::new();
    let mut degraded: BTreeSet<(RegionId, RegionId)> = BTreeSet::new();
    let mut coordinator_crashed: Option<Duration> = None;
    let mut coordinator_paused: Option<Duration> = None;
    let rname = |r: RegionId| regions[r.0 as usize].name.clone();
    for e in events {
        if play_nodes(e, nodes, &mut state)? {
            continue;
        }
        let at = e.event.at;
        let t = format_duration(at);
        match &e.event.action {
            ChurnAction::Partition(cut) => {
                if cuts.contains(cut) {
                    return Err(conflict(
                        &e.path,
                        format!("this partition is already in place at {t}"),
                    ));
                }
                cuts.push(cut.clone());
            }
            ChurnAction::Heal(Some(cut)) => {
                let Some(pos) = cuts.iter().position(|c| c == cut) else {
                    return Err(conflict(&e.path, format!("no such partition is in place at {t}")));
                };
                cuts.remove(pos);
            }
            ChurnAction::Heal(None) => {
                if cuts.is_empty() {
                    return Err(conflict(&e.path, format!("no partition is in place at {t}")));
                }
                cuts.clear();
            }
            ChurnAction::Degrade { from, to, oneway, .. } => {
                degraded.insert((*from, *to));
                if !oneway {
                    degraded.insert((*to, *from));
                }
            }
            ChurnAction::Restore { from, to, oneway } => {
                let dirs = if *oneway || from == to {
                    vec![(*from, *to)]
                } else {
                    vec![(*from, *to), (*to, *from)]
                };
                for (x, y) in dirs {
                    if !degraded.remove(&(x, y)) {
                        return Err(conflict(
                            &e.path,
                            format!(
                                "the link {:?} -> {:?} is not degraded at {t}",
                                rname(x),
                                rname(y)
                            ),
                        ));
                    }
                }
            }
            ChurnAction::CoordinatorCrash => {
                if let Some(when) = coordinator_crashed {
                    return Err(conflict(
                        &e.path,
                        format!("the coordinator already crashed at {}", format_duration(when)),
                    ));
                }
                if let Some(when) = coordinator_paused {
                    return Err(conflict(
                        &e.path,
                        format!(
                            "the coordinator is paused at {t} (since {}): a crash comes after \
                             its pause ends",
                            format_duration(when)
                        ),
                    ));
                }
                coordinator_crashed = Some(at);
            }
            ChurnAction::CoordinatorPause => {
                if let Some(when) = coordinator_crashed {
                    return Err(conflict(
                        &e.path,
                        format!("the coordinator crashed at {}", format_duration(when)),
                    ));
                }
                if let Some(when) = coordinator_paused {
                    return Err(conflict(
                        &e.path,
                        format!(
                            "the coordinator is already paused at {t} (since {})",
                            format_duration(when)
                        ),
                    ));
                }
                coordinator_paused = Some(at);
            }
            ChurnAction::CoordinatorResume => coordinator_paused = None,
            // Played by `play_nodes`.
            ChurnAction::Join(_)
            | ChurnAction::Leave(_)
            | ChurnAction::Crash(_)
            | ChurnAction::Hang(_)
            | ChurnAction::Resume(_)
            | ChurnAction::Restart(_) => {}
        }
    }
    Ok(())
}

/// Plays an event on nodes (join, leave, crash, hang, resume, restart) against the nodes'
/// `state`, rejecting it when a node is not in a state it applies to; `Ok(false)` for an
/// event of another kind.
fn play_nodes(e: &Pending, nodes: &[NodeSpec], state: &mut [State]) -> R<bool> {
    let at = e.event.at;
    let t = format_duration(at);
    let step = |ids: &[NodeId],
                verb: &str,
                ok: fn(State) -> bool,
                next: State,
                state: &mut [State]|
     -> R<()> {
        for (j, id) in ids.iter().enumerate() {
            let k = id.0 as usize;
            if !ok(state[k]) {
                let path = e.node_paths.get(j).unwrap_or(&e.path);
                return Err(conflict(
                    path,
                    format!(
                        "cannot {verb} node {:?} at {t}: {}",
                        nodes[k].name,
                        state[k].describe(nodes[k].start)
                    ),
                ));
            }
            state[k] = next;
        }
        Ok(())
    };
    match &e.event.action {
        ChurnAction::Join(ids) => {
            step(ids, "start", |s| s == State::NotStarted, State::Running, state)?
        }
        ChurnAction::Leave(ids) => {
            step(ids, "stop", |s| s == State::Running, State::Left(at), state)?
        }
        ChurnAction::Crash(ids) => {
            step(
                ids,
                "crash",
                |s| matches!(s, State::Running | State::Hung(_)),
                State::Crashed(at),
                state,
            )?;
        }
        ChurnAction::Hang(ids) => {
            step(ids, "hang", |s| s == State::Running, State::Hung(at), state)?
        }
        ChurnAction::Resume(ids) => {
            step(ids, "resume", |s| matches!(s, State::Hung(_)), State::Running, state)?;
        }
        ChurnAction::Restart(ids) => {
            step(
                ids,
                "restart",
                |s| matches!(s, State::Crashed(_) | State::Left(_)),
                State::Running,
                state,
            )?;
        }
        _ => return Ok(false),
    }
    Ok(true)
}
