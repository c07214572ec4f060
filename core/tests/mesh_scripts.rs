//! Mesh scenarios as data (raft-rs's testdata style): each `testdata/mesh/*.txt` is a script of
//! commands, a line `----`, and the expected trace. Run with `LOCO_REWRITE=1` to rewrite the
//! expected part from the actual output (then review the diff).
//!
//! Commands, one per line (`#` starts a comment):
//!
//! ```text
//! config KEY=VALUE ...      min_members, join_window, heartbeat_timeout, barrier_timeout,
//!                           compute_timeout, allreduce_timeout, sync_timeout, max_retries
//!                           (durations: 30s, 500ms), join_mode=blocking|non-blocking
//! workload COMPUTE ALLREDUCE SYNC
//! start n0 n1 ...           nodes that join now
//! run DURATION              advance the virtual clock
//! join nX                   a node starts and joins
//! crash nX | hang nX | restart nX | leave nX [graceful|panic|signal]
//! restart-same nX           restart with the incarnation of its last process
//! skew nX SECONDS           the clock offset of node nX when it starts (later)
//! coordinator-crash
//! ```
//!
//! The trace lists, with their time, the coordinator's membership events and the members'
//! admissions and stops.

use loco_core::NodeId;
use loco_core::mesh::{
    CoordinatorAction, JoinMode, LeaveReason, MemberAction, MeshConfig, MeshEvent,
};
use loco_core::testing::{Network, TraceKind, Workload};
use std::fmt::Write as _;
mod common;
use common::{duration, node};
use std::time::Duration;

fn render(net: &Network) -> String {
    let mut out = String::new();
    for t in net.trace() {
        let line = match &t.what {
            TraceKind::Coordinator(CoordinatorAction::Event(e)) => match e {
                MeshEvent::JoinQueued { .. }
                | MeshEvent::EpochFormed { .. }
                | MeshEvent::Released { .. }
                | MeshEvent::Committed { .. }
                | MeshEvent::StepSkipped { .. }
                | MeshEvent::JoinRefused { .. }
                | MeshEvent::NoSyncedMember { .. } => e.to_string(),
                _ => continue,
            },
            TraceKind::Member(MemberAction::Admitted { epoch, .. }) => {
                format!("admitted in {epoch}")
            }
            TraceKind::Member(MemberAction::Stop(r)) => format!("stop: {r}"),
            TraceKind::Member(MemberAction::CoordinatorSilent { silent_for, waits, .. }) => {
                format!(
                    "coordinator silent for {:.1}s, waiting {:.1}s more",
                    silent_for.as_secs_f64(),
                    waits.as_secs_f64()
                )
            }
            TraceKind::Fault(f) if !f.starts_with("start") => format!("fault: {f}"),
            _ => continue,
        };
        let _ = writeln!(out, "{:>9} {:<11} {line}", t.at.to_string(), t.node.to_string());
    }
    out
}

fn run_script(script: &str) -> Result<String, String> {
    let mut cfg = MeshConfig { join_window: Duration::ZERO, ..MeshConfig::default() };
    let mut workload =
        Workload::new(Duration::from_secs(60), Duration::from_secs(10), Duration::from_secs(20));
    let mut net: Option<Network> = None;
    let mut skew: std::collections::BTreeMap<NodeId, f64> = std::collections::BTreeMap::new();
    for (i, raw) in script.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let err = |e: String| format!("line {}: {e}", i + 1);
        let words: Vec<&str> = line.split_whitespace().collect();
        if net.is_none() && !matches!(words[0], "config" | "workload") {
            net = Some(Network::new(cfg.clone(), 1));
        }
        match (words[0], &words[1..]) {
            ("config", kvs) => {
                for kv in kvs.iter() {
                    let (k, v) = kv
                        .split_once('=')
                        .ok_or_else(|| err(format!("{kv}: expected KEY=VALUE")))?;
                    match k {
                        "min_members" => {
                            cfg.min_members =
                                v.parse().map_err(|_| err(format!("{v}: expected a count")))?
                        }
                        "max_retries" => {
                            cfg.max_retries =
                                v.parse().map_err(|_| err(format!("{v}: expected a count")))?
                        }
                        "join_window" => cfg.join_window = duration(v).map_err(err)?,
                        "heartbeat_timeout" => cfg.heartbeat_timeout = duration(v).map_err(err)?,
                        "barrier_timeout" => cfg.barrier_timeout = duration(v).map_err(err)?,
                        "compute_timeout" => cfg.compute_timeout = duration(v).map_err(err)?,
                        "allreduce_timeout" => cfg.allreduce_timeout = duration(v).map_err(err)?,
                        "sync_timeout" => cfg.sync_timeout = duration(v).map_err(err)?,
                        "join_mode" => {
                            cfg.join_mode = match v {
                                "blocking" => JoinMode::Blocking,
                                "non-blocking" => JoinMode::NonBlocking,
                                _ => {
                                    return Err(err(format!(
                                        "{v}: expected blocking or non-blocking"
                                    )));
                                }
                            }
                        }
                        _ => return Err(err(format!("unknown config key {k}"))),
                    }
                }
                cfg.validate().map_err(|e| err(e.to_string()))?;
            }
            ("workload", [c, a, s]) => {
                workload = Workload::new(
                    duration(c).map_err(err)?,
                    duration(a).map_err(err)?,
                    duration(s).map_err(err)?,
                );
            }
            (cmd, args) => {
                let net = net.as_mut().ok_or_else(|| err("no network".into()))?;
                match (cmd, args) {
                    ("start" | "join", ids) => {
                        for id in ids.iter() {
                            let id = node(id).map_err(err)?;
                            let offset = skew.get(&id).copied().unwrap_or(0.0);
                            net.add_node_with(id, workload.clone(), 1, offset);
                        }
                    }
                    ("run", [d]) => {
                        net.run_for(duration(d).map_err(err)?).map_err(|e| err(e.to_string()))?
                    }
                    ("crash", [n]) => net.crash(node(n).map_err(err)?),
                    ("hang", [n]) => net.hang(node(n).map_err(err)?),
                    ("restart", [n]) => net.restart(node(n).map_err(err)?, workload.clone()),
                    ("restart-same", [n]) => {
                        net.restart_same_incarnation(node(n).map_err(err)?, workload.clone())
                    }
                    ("leave", [n, rest @ ..]) => {
                        let reason = match rest.first().copied().unwrap_or("graceful") {
                            "graceful" => LeaveReason::Graceful,
                            "panic" => LeaveReason::Panic,
                            "signal" => LeaveReason::Signal,
                            r => {
                                return Err(err(format!(
                                    "{r}: expected graceful, panic or signal"
                                )));
                            }
                        };
                        net.leave(node(n).map_err(err)?, reason);
                    }
                    ("skew", [n, s]) => {
                        let secs: f64 =
                            s.parse().map_err(|_| err(format!("{s}: expected seconds")))?;
                        skew.insert(node(n).map_err(err)?, secs);
                    }
                    ("coordinator-crash", []) => net.crash_coordinator(),
                    _ => return Err(err(format!("cannot parse `{line}`"))),
                }
            }
        }
    }
    Ok(net.map(|n| render(&n)).unwrap_or_default())
}

#[test]
fn mesh_scripts() {
    common::run_scripts("mesh", 3, run_script, |_, _| {});
}
