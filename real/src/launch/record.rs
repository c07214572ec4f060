//! The record of a finished launch: the processes' metrics files merged, the invariants
//! checked (core's [`InvariantChecker`] over the coordinator's formed epochs and the workers'
//! checks, and the rows' digests per step), the summary computed. The files are the record; the status channel is not read here.

use super::LaunchError;
use crate::node::{CheckLine, MetricsLine};
use loco_core::digest::WeightsDigest;
use loco_core::ids::{Epoch, NodeId};
use loco_core::metrics::{EventRow, InvariantChecker, OuterStepRow, RunMeta, Summary, summarize};
use loco_core::scenario::Scenario;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The merged metrics of a run.
pub(crate) struct Record {
    pub(crate) summary: Summary,
    pub(crate) rows: Vec<OuterStepRow>,
    pub(crate) events: Vec<EventRow>,
    pub(crate) peaks: BTreeMap<String, u64>,
}

/// Reads a metrics file's lines; a missing file has none. A process killed mid-write may leave
/// a torn last line: lines that do not parse are skipped.
pub fn read_lines(path: &Path) -> Result<Vec<MetricsLine>, LaunchError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(LaunchError::Io { action: "reading", path: path.to_path_buf(), source });
        }
    };
    Ok(text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect())
}

/// Merges the processes' metrics in `nodes_dir` with the launcher's own `events`, checks the
/// invariants, and summarises the run.
pub(crate) fn collect(
    s: &Scenario,
    nodes_dir: &Path,
    mut events: Vec<EventRow>,
    wall: f64,
    failures: &[String],
) -> Result<Record, LaunchError> {
    let mut rows: Vec<OuterStepRow> = Vec::new();
    let mut peaks: BTreeMap<String, u64> = BTreeMap::new();
    // Each process counts from 0: its last (largest) count, summed over processes.
    let mut stale: BTreeMap<(String, u64), u64> = BTreeMap::new();
    let mut formed: Vec<(Epoch, Vec<NodeId>)> = Vec::new();
    let mut checks: Vec<(NodeId, CheckLine)> = Vec::new();
    let io = |source| LaunchError::Io { action: "listing", path: nodes_dir.to_path_buf(), source };
    let mut files: Vec<PathBuf> = std::fs::read_dir(nodes_dir)
        .map_err(io)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    files.sort();
    for f in &files {
        for line in read_lines(f)? {
            match line {
                MetricsLine::Row(r) => rows.push(r),
                MetricsLine::Event(e) => events.push(e),
                MetricsLine::Counters { node, incarnation, stale_frames_rejected } => {
                    let n = stale.entry((node, incarnation)).or_default();
                    *n = (*n).max(stale_frames_rejected);
                }
                MetricsLine::Resources { node, peak_rss_bytes } => {
                    if let Some(b) = peak_rss_bytes {
                        let p = peaks.entry(node).or_default();
                        *p = (*p).max(b);
                    }
                }
                MetricsLine::EpochFormed { epoch, members } => formed.push((epoch, members)),
                MetricsLine::Check { node, check } => checks.push((node, check)),
            }
        }
    }
    events.sort_by(|a, b| a.time_s.total_cmp(&b.time_s));
    // Invariant: after each outer step, every node holds the same outer weights.
    let mut by_step: BTreeMap<u64, BTreeMap<String, WeightsDigest>> = BTreeMap::new();
    // (No digest is a non-blocking joiner's step before it holds the state.)
    for r in &rows {
        if let Some(h) = r.weights_hash {
            by_step.entry(r.outer_step).or_default().insert(r.node.clone(), h);
        }
    }
    // The invariants both backends check: every epoch formed first, then the checks in order.
    let names = s.node_names();
    let mut checker = InvariantChecker::new(names);
    for (epoch, members) in &formed {
        checker.epoch_formed(*epoch, members);
    }
    for (node, check) in &checks {
        check.feed(*node, &mut checker);
    }
    let mut violations = checker.violations();
    for (step, hashes) in &by_step {
        let distinct: BTreeSet<&WeightsDigest> = hashes.values().collect();
        if distinct.len() > 1 {
            // Each digest quoted, as a map of names to text.
            let shown: BTreeMap<&str, String> =
                hashes.iter().map(|(n, h)| (n.as_str(), h.to_string())).collect();
            violations.push(format!("outer step {step}: replicas differ: {shown:?}"));
        }
    }
    for name in failures {
        violations.push(format!("worker {name} failed (exit status not 0); see the log"));
    }
    if rows.is_empty() {
        violations.push("no outer step was committed".to_string());
    }
    let meta = RunMeta {
        scenario: s.name().to_string(),
        seed: s.seed(),
        backend: "real".into(),
        wall_seconds: wall,
        published: None,
        inner_steps_per_outer: Some(s.diloco().round_steps()),
        // One device per worker (the real backend does not shard a node over G devices yet).
        mfu_basis: s.mfu_basis(1),
        violations,
        diloco: s.diloco().facts(),
        extra: BTreeMap::from([
            ("peak_rss_bytes".to_string(), serde_json::json!(peaks)),
            ("stale_frames_rejected".to_string(), serde_json::json!(stale.values().sum::<u64>())),
        ]),
    };
    let summary = summarize(&meta, &rows, &events);
    Ok(Record { summary, rows, events, peaks })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn write(path: &Path, lines: &[MetricsLine]) {
        let mut f = std::fs::File::create(path).unwrap();
        for l in lines {
            writeln!(f, "{}", serde_json::to_string(l).unwrap()).unwrap();
        }
    }

    fn counters(node: &str, incarnation: u64, stale: u64) -> MetricsLine {
        MetricsLine::Counters { node: node.into(), incarnation, stale_frames_rejected: stale }
    }

    fn small() -> Scenario {
        Scenario::load(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/small.toml"),
        )
        .unwrap()
    }

    fn formed(epoch: u64, members: &[NodeId]) -> MetricsLine {
        MetricsLine::EpochFormed { epoch: Epoch(epoch), members: members.to_vec() }
    }

    fn check(node: NodeId, check: CheckLine) -> MetricsLine {
        MetricsLine::Check { node, check }
    }

    /// A worker's view of an epoch that differs from the coordinator's fails the run's
    /// invariants, whichever file is read first.
    #[test]
    fn a_view_that_differs_from_the_formed_epoch_is_a_violation() {
        let dir = tempfile::tempdir().unwrap();
        let s = small();
        let ids: Vec<NodeId> = s.nodes().iter().map(|n| n.id).collect();
        assert!(ids.len() >= 2);
        let (a, b) = (ids[0], ids[1]);
        let name_a = s.nodes()[0].name.clone();
        let view = |members: Vec<NodeId>| CheckLine::View {
            epoch: Epoch(1),
            members,
            what: "view".into(),
        };
        // The worker's file sorts before the coordinator's: epochs are fed first all the same.
        write(
            &dir.path().join("a.jsonl"),
            &[check(a, view(vec![a, b])), check(a, view(vec![a])), counters("a", 1, 0)],
        );
        write(&dir.path().join("coordinator.jsonl"), &[formed(1, &[b, a])]);
        let r = collect(&s, dir.path(), Vec::new(), 1.0, &[]).unwrap();
        assert!(!r.summary.invariants.ok);
        let v = &r.summary.invariants.violations;
        let want = format!(
            "members disagree on epoch e1: {name_a} holds [{a}] (view), the coordinator formed [{a} {b}]"
        );
        assert!(v.contains(&want), "{v:?}");
        assert_eq!(v.iter().filter(|m| m.contains("members disagree")).count(), 1, "{v:?}");
    }

    /// An all-reduce whose chunks did not carry the ring's total weight fails the invariants.
    #[test]
    fn a_bad_weight_sum_is_a_violation() {
        let dir = tempfile::tempdir().unwrap();
        let s = small();
        let a = s.nodes()[0].id;
        let sums = |sums: Vec<f64>| CheckLine::AllReduceWeights {
            what: "outer step 0 attempt 0 of e1".into(),
            sums,
            total: 2.0,
        };
        write(
            &dir.path().join("a.jsonl"),
            &[check(a, sums(vec![2.0, 2.0])), check(a, sums(vec![2.0, 1.0]))],
        );
        let r = collect(&s, dir.path(), Vec::new(), 1.0, &[]).unwrap();
        assert!(!r.summary.invariants.ok);
        let v = &r.summary.invariants.violations;
        assert_eq!(
            v.iter()
                .filter(
                    |m| m.contains("saw a chunk with weight sum 1 but the ring's weights sum to 2")
                )
                .count(),
            1,
            "{v:?}"
        );
    }

    /// Files without checks or formed epochs (and torn lines) read as before.
    #[test]
    fn files_without_checks_have_no_check_violations() {
        let dir = tempfile::tempdir().unwrap();
        let s = small();
        write(&dir.path().join("a.jsonl"), &[counters("a", 1, 0)]);
        std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join("a.jsonl"))
            .unwrap()
            .write_all(b"{\"Check\":{\"node\":0,\"check\":{\"View\"")
            .unwrap();
        let r = collect(&s, dir.path(), Vec::new(), 1.0, &[]).unwrap();
        // Only the run's own complaint: no rows at all.
        assert_eq!(r.summary.invariants.violations, vec!["no outer step was committed".to_owned()]);
    }

    /// Each process writes its running count; the summary takes each process's last and sums
    /// them, so that a restarted node's second process adds to its first.
    #[test]
    fn stale_frames_are_summed_over_processes() {
        let dir = tempfile::tempdir().unwrap();
        let s = Scenario::load(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/small.toml"),
        )
        .unwrap();
        // One file per node: its incarnations append to it.
        write(
            &dir.path().join("a.jsonl"),
            &[counters("a", 1, 3), counters("a", 1, 5), counters("a", 2, 2)],
        );
        write(&dir.path().join("b.jsonl"), &[counters("b", 1, 1)]);
        let r = collect(&s, dir.path(), Vec::new(), 1.0, &[]).unwrap();
        assert_eq!(r.summary.extra["stale_frames_rejected"], serde_json::json!(5 + 2 + 1));
    }
}
