//! The node machine driven whole (member, rings, outer step, recovery, accounting) over the
//! seeded in-memory network of `loco_core::testing::nodes`, with real numerics: every byte of
//! the rings and of the state transfers is real, and the tests check that the replicas end
//! bit-identical.
//!
//! Scenarios as data (raft-rs's testdata style): each `testdata/node/*.txt` is a script, a line
//! `----`, and the expected trace. `LOCO_REWRITE=1` rewrites the expected part (then review the
//! diff). Commands, one per line (`#` starts a comment):
//!
//! ```text
//! config KEY=VALUE ...      min_members, join_window, heartbeat_timeout, barrier_timeout,
//!                           allreduce_timeout, sync_timeout, max_retries,
//!                           state_senders, join_mode=blocking|non-blocking (durations: 30s, 500ms)
//! params N                  parameters of the model (default 4096)
//! mode sync|overlap|streaming [P]   the DiLoCo mode (P fragments in streaming mode)
//! compute DURATION          time of one outer step's inner steps (default 60s)
//! start n0 n1 ...           nodes that join now (the first command that is not config/params/compute
//!                           builds the network)
//! join nX                   a node (re)starts and joins
//! run DURATION              advance the virtual clock
//! until released STEP ATTEMPT | until recovery nX | until stop nX    run until it happens (1 h at most)
//! slow nA nB BYTES_PER_SEC  the bandwidth of the link nA -> nB
//! crash nX | hang nX | resume nX | leave nX | coordinator-crash
//! cut nA nB | heal          frames between nA and nB (or `coordinator`) are lost both ways;
//!                           every cut heals
//! cut-oneway nA nB          frames from nA to nB are lost
//! coordinator-pause D | coordinator-cut-off D   the coordinator stops, or runs hearing nobody
//! coordinator-restart       a new coordinator process that knows nobody takes its place
//! diverge nX                nX's inner weights of the step under way come out NaN
//! spray nX                  nX also sends its ring frames to every other node
//! liar nX                   nX reports every attempt failed and sends no ring frame
//! withhold nX               nX sends no ring frame and reports nothing
//! ```
//!
//! The trace lists the coordinator's epochs, releases, commits and skips, the nodes' events and
//! stops, the faults, any violation, and at the end which nodes agree on each step's weights.

use loco_core::NodeId;
use loco_core::diloco::Mode;
use loco_core::mesh::{EvictReason, JoinMode, MeshConfig, MeshEvent};
use loco_core::node::machine::NodeEvent;
use loco_core::testing::nodes::{NodeNet, PieceFault, Seen};
use loco_core::time::Time;
use std::fmt::Write as _;
mod common;
use common::{duration, host, node};
use std::time::Duration;

fn name(n: NodeId) -> String {
    if n == NodeId::COORDINATOR { "coordinator".into() } else { format!("n{}", n.0) }
}

fn render(net: &NodeNet) -> String {
    let mut out = String::new();
    for r in net.record() {
        let line = match &r.what {
            Seen::Mesh(
                e @ (MeshEvent::EpochFormed { .. }
                | MeshEvent::Released { .. }
                | MeshEvent::Committed { .. }
                | MeshEvent::StepSkipped { .. }
                | MeshEvent::NoSyncedMember { .. }),
            ) => e.to_string(),
            Seen::Mesh(_) => continue,
            Seen::Node(ev) => format!("{}: {}", ev.kind(), ev.detail(&name)),
            Seen::Stop { reason, rejoin } => {
                format!("stop{}: {reason}", if *rejoin { " (rejoin)" } else { "" })
            }
            Seen::Violation(v) => format!("VIOLATION {v}"),
            Seen::Fault(f) => format!("fault: {f}"),
        };
        let _ = writeln!(out, "{:>9} {:<11} {line}", r.at.to_string(), name(r.node));
    }
    for (step, by) in net.hashes() {
        let nodes: Vec<String> = by.keys().map(|n| name(*n)).collect();
        let verdict = if net.disagreements().contains(step) { "DISAGREE" } else { "agree" };
        let _ = writeln!(out, "weights after step {step}: {} {verdict}", nodes.join(" "));
    }
    out
}

fn until(net: &mut NodeNet, what: &[&str]) -> Result<(), String> {
    let seen = |net: &NodeNet, f: &dyn Fn(&Seen, NodeId) -> bool| {
        net.record().iter().any(|r| f(&r.what, r.node))
    };
    let before = net.record().len();
    let deadline = net.now() + Duration::from_secs(3600);
    let held = match what {
        ["released", step, attempt] => {
            let (s, a): (u64, u32) = (
                step.parse().map_err(|_| format!("{step}: expected a step"))?,
                attempt.parse().map_err(|_| format!("{attempt}: expected an attempt"))?,
            );
            net.run_until_cond(deadline, |n| {
                n.record()[before..].iter().any(|r| {
                    matches!(&r.what, Seen::Mesh(MeshEvent::Released { outer_step, attempt, .. })
                        if *outer_step == s && *attempt == a)
                })
            })
        }
        ["recovery", n] => {
            let id = node(n)?;
            net.run_until_cond(deadline, |net| {
                net.record()[before..].iter().any(|r| {
                    r.node == id && matches!(r.what, Seen::Node(NodeEvent::RecoveryStart { .. }))
                })
            })
        }
        ["stop", n] => {
            let id = node(n)?;
            net.run_until_cond(deadline, |net| {
                net.record()[before..]
                    .iter()
                    .any(|r| r.node == id && matches!(r.what, Seen::Stop { .. }))
            })
        }
        _ => return Err(format!("cannot parse `until {}`", what.join(" "))),
    }
    .map_err(|e| e.to_string())?;
    let _ = seen;
    if held { Ok(()) } else { Err(format!("`until {}` never happened", what.join(" "))) }
}

fn run_script(script: &str) -> Result<String, String> {
    script_net(script).map(|net| net.map(|n| render(&n)).unwrap_or_default())
}

/// Runs a script and gives back its network (none for a script that builds none).
fn script_net(script: &str) -> Result<Option<NodeNet>, String> {
    let mut cfg = MeshConfig { join_window: Duration::ZERO, ..MeshConfig::default() };
    let mut params = 4096usize;
    let mut compute = Duration::from_secs(60);
    let mut mode = (Mode::Sync, 1u32);
    let mut net: Option<NodeNet> = None;
    for (i, raw) in script.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let err = |e: String| format!("line {}: {e}", i + 1);
        let words: Vec<&str> = line.split_whitespace().collect();
        if net.is_none() && !matches!(words[0], "config" | "params" | "compute" | "mode") {
            let mut n = NodeNet::new(cfg.clone(), params, compute, 1);
            n.set_mode(mode.0, mode.1, 0.0);
            net = Some(n);
        }
        let count = |v: &str| v.parse::<usize>().map_err(|_| err(format!("{v}: expected a count")));
        match (words[0], &words[1..]) {
            ("config", kvs) => {
                for kv in kvs.iter() {
                    let (k, v) = kv
                        .split_once('=')
                        .ok_or_else(|| err(format!("{kv}: expected KEY=VALUE")))?;
                    match k {
                        "min_members" => cfg.min_members = count(v)?,
                        "join_window" => cfg.join_window = duration(v).map_err(err)?,
                        "max_retries" => cfg.max_retries = count(v)? as u32,
                        "state_senders" => cfg.state_senders = count(v)?,
                        "heartbeat_timeout" => cfg.heartbeat_timeout = duration(v).map_err(err)?,
                        "barrier_timeout" => cfg.barrier_timeout = duration(v).map_err(err)?,
                        "allreduce_timeout" => {
                            cfg.allreduce_timeout = duration(v).map_err(err)?;
                        }
                        "sync_timeout" => cfg.sync_timeout = duration(v).map_err(err)?,
                        "progress_timeout" => {
                            cfg.progress_timeout = duration(v).map_err(err)?;
                        }
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
            ("params", [n]) => params = count(n)?,
            ("mode", [m, rest @ ..]) => {
                let m: Mode = m.parse().map_err(err)?;
                let p = match rest {
                    [p] => count(p)? as u32,
                    _ => 1,
                };
                mode = (m, p);
            }
            ("compute", [d]) => compute = duration(d).map_err(err)?,
            (cmd, args) => {
                let net = net.as_mut().ok_or_else(|| err("no network".into()))?;
                match (cmd, args) {
                    ("start" | "join", ids) => {
                        for id in ids.iter() {
                            net.add(node(id).map_err(err)?);
                        }
                    }
                    ("run", [d]) => {
                        net.run_for(duration(d).map_err(err)?).map_err(|e| err(e.to_string()))?
                    }
                    ("until", what) => until(net, what).map_err(err)?,
                    ("slow", [a, b, bw]) => {
                        let bw: f64 =
                            bw.parse().map_err(|_| err(format!("{bw}: expected bytes/s")))?;
                        net.set_bandwidth(node(a).map_err(err)?, node(b).map_err(err)?, bw);
                    }
                    ("crash", [n]) => net.crash(node(n).map_err(err)?),
                    ("hang", [n]) => net.hang(node(n).map_err(err)?, true),
                    ("resume", [n]) => net.hang(node(n).map_err(err)?, false),
                    ("leave", [n]) => net.leave(node(n).map_err(err)?),
                    ("coordinator-crash", []) => net.crash_coordinator(),
                    ("coordinator-restart", []) => net.restart_coordinator(),
                    ("coordinator-pause", [d]) => {
                        net.pause_coordinator(duration(d).map_err(err)?);
                    }
                    ("coordinator-cut-off", [d]) => {
                        net.isolate_coordinator(duration(d).map_err(err)?);
                    }
                    ("spray", [n]) => net.spray_collectives(node(n).map_err(err)?),
                    ("liar", [n]) => net.fail_every_attempt(node(n).map_err(err)?),
                    ("withhold", [n]) => net.withhold_ring_frames(node(n).map_err(err)?),
                    ("cut", [a, b]) => net.cut(host(a).map_err(err)?, host(b).map_err(err)?),
                    ("cut-oneway", [a, b]) => {
                        net.cut_oneway(host(a).map_err(err)?, host(b).map_err(err)?);
                    }
                    ("heal", []) => net.recover(),
                    ("diverge", [n]) => {
                        let step = net.coordinator().map_or(0, |c| c.outer_step());
                        net.diverge(node(n).map_err(err)?, step);
                    }
                    _ => return Err(err(format!("cannot parse `{line}`"))),
                }
            }
        }
    }
    Ok(net)
}

#[test]
fn node_scripts() {
    common::run_scripts("node", 4, run_script, |path, got| {
        assert!(
            !got.contains("VIOLATION") && !got.contains("DISAGREE"),
            "{}:\n{got}",
            path.display()
        );
    });
}

// ----- the same stories, asserted in code -----

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn formed(cfg: MeshConfig, n: u32) -> NodeNet {
    let cfg = MeshConfig { min_members: n as usize, join_window: Duration::ZERO, ..cfg };
    let mut net = NodeNet::new(cfg, 4096, secs(60), 7);
    for i in 0..n {
        net.add(NodeId(i));
    }
    net
}

fn node_events(net: &NodeNet, id: NodeId) -> Vec<NodeEvent> {
    net.record()
        .iter()
        .filter(|r| r.node == id)
        .filter_map(|r| match &r.what {
            Seen::Node(e) => Some(e.clone()),
            _ => None,
        })
        .collect()
}

/// How many epochs evicted someone.
fn evictions(net: &NodeNet) -> usize {
    net.record()
        .iter()
        .filter(|r| {
            matches!(&r.what, Seen::Mesh(MeshEvent::EpochFormed { evicted, .. }) if !evicted.is_empty())
        })
        .count()
}

/// The incarnations of nodes 0..n (a new membership has a new one).
fn incarnations(net: &NodeNet, n: u32) -> Vec<u64> {
    (0..n).map(|i| net.node(NodeId(i)).unwrap().member().incarnation()).collect()
}

/// The coordinator's events, in order.
fn mesh_events(net: &NodeNet) -> impl Iterator<Item = &MeshEvent> {
    net.record().iter().filter_map(|r| match &r.what {
        Seen::Mesh(e) => Some(e),
        _ => None,
    })
}

fn assert_clean(net: &NodeNet) {
    assert!(net.violations().is_empty(), "{:?}", net.violations());
    assert!(net.disagreements().is_empty(), "{:?}", net.hashes());
    assert!(!net.hashes().is_empty());
}

#[test]
fn three_nodes_commit_steps_with_identical_weights_and_rows() {
    let mut net = formed(MeshConfig::default(), 3);
    net.run_for(secs(200)).unwrap();
    assert_eq!(net.coordinator().unwrap().outer_step(), 3);
    for s in 0..3 {
        assert_eq!(net.hashes()[&s].len(), 3, "step {s}");
    }
    assert_clean(&net);
    // Each member's last barrier arrival (step 2's) carried its weights' digest after the two
    // steps it had applied, the same for all (the coordinator compares them).
    let held: Vec<_> =
        net.coordinator().unwrap().state().members.values().map(|m| m.held_at_barrier).collect();
    assert!(
        held.iter().all(|h| h.is_some_and(|h| h.outer_step == 2 && h.digest.is_some())),
        "{held:?}"
    );
    assert!(held.windows(2).all(|w| w[0] == w[1]), "{held:?}");
    // Rows: one per node and step, compute 60 s each, the weights' digest filled in.
    assert_eq!(net.rows().len(), 9);
    for r in net.rows() {
        assert!((r.compute_s - 60.0).abs() < 1e-9, "{r:?}");
        assert_eq!(r.weights_hash, Some(net.hashes()[&r.outer_step][&NodeId(r.node_id)]));
        assert!(r.bytes_sent > 2 * 4096, "{r:?}");
    }
}

#[test]
fn a_due_checkpoint_comes_with_the_committed_state_copied_by_the_commit_job() {
    let cfg = MeshConfig { min_members: 2, join_window: Duration::ZERO, ..MeshConfig::default() };
    let mut net = NodeNet::new(cfg, 4096, secs(60), 7);
    net.set_checkpoint_every(2);
    net.add(NodeId(0));
    net.add(NodeId(1));
    net.run_for(secs(300)).unwrap();
    assert_clean(&net);
    let steps: Vec<u64> = net.snapshots().iter().map(|(_, s, _)| *s).collect();
    assert_eq!(steps, [1, 1, 3, 3], "every second step, on both nodes");
    for (id, step, digest) in net.snapshots() {
        assert_eq!(digest.as_ref(), Some(&net.hashes()[step][id]), "n{} step {step}", id.0);
    }
}

#[test]
fn a_crash_in_the_all_reduce_is_retried_without_the_dead_node() {
    let mut net = formed(MeshConfig::default(), 3);
    // Slow links: the all-reduce of step 0 takes seconds.
    for a in 0..3 {
        for b in 0..3 {
            net.set_bandwidth(NodeId(a), NodeId(b), 10_000.0);
        }
    }
    let released = |n: &NodeNet, attempt: u32| {
        n.record().iter().any(|r| {
            matches!(&r.what, Seen::Mesh(MeshEvent::Released { outer_step: 0, attempt: a, .. }) if *a == attempt)
        })
    };
    assert!(net.run_until_cond(Time::from_secs_f64(600.0), |n| released(n, 0)).unwrap());
    net.run_for(Duration::from_millis(200)).unwrap();
    net.crash(NodeId(2));
    assert!(net.run_until_cond(Time::from_secs_f64(600.0), |n| released(n, 1)).unwrap());
    net.run_for(secs(30)).unwrap();
    assert_eq!(net.hashes()[&0].keys().copied().collect::<Vec<_>>(), vec![NodeId(0), NodeId(1)]);
    assert_clean(&net);
    let row = net.rows().iter().find(|r| r.outer_step == 0 && r.node_id == 0).unwrap();
    assert_eq!((row.retries, row.world), (1, 2), "{row:?}");
}

fn join_story(mode: JoinMode) -> NodeNet {
    let mut net = formed(MeshConfig { join_mode: mode, ..MeshConfig::default() }, 3);
    net.run_for(secs(30)).unwrap();
    // The state (32 KiB) reaches the joiner in ~100 s: longer than an outer step.
    for s in 0..3 {
        net.set_bandwidth(NodeId(s), NodeId(3), 300.0);
    }
    net.add(NodeId(3));
    net.run_for(secs(600)).unwrap();
    net
}

#[test]
fn a_blocking_joiner_receives_the_state_while_the_others_wait() {
    let net = join_story(JoinMode::Blocking);
    let ev = node_events(&net, NodeId(3));
    assert!(matches!(ev[0], NodeEvent::Admitted { .. }), "{ev:?}");
    assert!(ev.iter().any(|e| matches!(e, NodeEvent::RecoveryDone { replayed: 0, .. })), "{ev:?}");
    // Every step after it joined counts it; the others' weights are the same as its own.
    let last = *net.hashes().keys().last().unwrap();
    assert_eq!(net.hashes()[&last].len(), 4);
    assert_clean(&net);
    let rec: f64 = net.rows().iter().filter(|r| r.node_id == 3).map(|r| r.recovery_s).sum();
    assert!(rec > 50.0, "recovery_s {rec}");
}

#[test]
fn a_non_blocking_joiner_replays_the_steps_committed_while_its_state_came() {
    let net = join_story(JoinMode::NonBlocking);
    let ev = node_events(&net, NodeId(3));
    let replayed = ev.iter().find_map(|e| match e {
        NodeEvent::RecoveryDone { replayed, .. } => Some(*replayed),
        _ => None,
    });
    assert!(replayed.is_some_and(|r| r >= 1), "{ev:?}");
    // Once synced it reports its weights, and they are the others'.
    assert!(net.hashes().values().any(|by| by.len() == 4), "{:?}", net.hashes());
    assert_clean(&net);
}

#[test]
fn a_sender_dying_mid_transfer_leaves_the_joiner_with_the_pieces_it_holds() {
    let cfg = MeshConfig { state_senders: 2, ..MeshConfig::default() };
    let mut net = formed(cfg, 3);
    net.run_for(secs(30)).unwrap();
    for s in 0..3 {
        net.set_bandwidth(NodeId(s), NodeId(3), 300.0);
    }
    net.add(NodeId(3));
    let fetching = |n: &NodeNet| n.node(NodeId(3)).is_some_and(|x| x.is_fetching());
    assert!(net.run_until_cond(Time::from_secs_f64(600.0), fetching).unwrap());
    net.run_for(secs(20)).unwrap();
    let first = node_events(&net, NodeId(3))
        .into_iter()
        .find_map(|e| match e {
            NodeEvent::RecoveryStart { senders, .. } => Some(senders),
            _ => None,
        })
        .unwrap();
    assert_eq!(first.len(), 2, "{first:?}");
    net.crash(first[0]);
    net.run_for(secs(600)).unwrap();
    let ev = node_events(&net, NodeId(3));
    let kept = ev.iter().find_map(|e| match e {
        NodeEvent::RecoveryStart { kept_bytes: Some(k), senders, .. } => {
            assert!(!senders.contains(&first[0]), "{senders:?}");
            Some(*k)
        }
        _ => None,
    });
    assert!(kept.is_some_and(|k| k > 0), "{ev:?}");
    assert!(ev.iter().any(|e| matches!(e, NodeEvent::RecoveryDone { .. })), "{ev:?}");
    assert_clean(&net);
}

/// A joiner whose state meets `fault` on its way (the senders' links slow enough for the
/// transfer to take several pieces' time), run until it should hold the state.
fn faulted_join(fault: PieceFault) -> NodeNet {
    let cfg = MeshConfig { state_senders: 2, ..MeshConfig::default() };
    let mut net = formed(cfg, 3);
    net.run_for(secs(30)).unwrap();
    for s in 0..3 {
        net.set_bandwidth(NodeId(s), NodeId(3), 300.0);
    }
    net.fault_next_piece(fault);
    net.add(NodeId(3));
    net.run_for(secs(900)).unwrap();
    net
}

/// Bytes of state pieces node `to` received, by the record of what the joiner held: the
/// `bytes` of its `RecoveryDone`.
fn recovered(net: &NodeNet, id: NodeId) -> Option<u64> {
    node_events(net, id).into_iter().find_map(|e| match e {
        NodeEvent::RecoveryDone { bytes, .. } => Some(bytes),
        _ => None,
    })
}

/// A piece damaged on its way (its bytes changed, the header intact) is found when the
/// copy is verified; the joiner asks its senders again at once, receives it, and holds the
/// same weights as the others (the one violation is the rejected copy).
#[test]
fn a_damaged_piece_is_detected_and_fetched_again() {
    let net = faulted_join(PieceFault::Damaged);
    assert!(recovered(&net, NodeId(3)).is_some(), "{:?}", node_events(&net, NodeId(3)));
    let v = net.violations();
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].contains("digest"), "{v:?}");
    assert!(net.disagreements().is_empty(), "{:?}", net.hashes());
    let last = *net.hashes().keys().last().unwrap();
    assert_eq!(net.hashes()[&last].len(), 4, "the joiner takes part");
}

/// A member that sends a joiner a forged state, consistent in itself (its digests made from the
/// forged weights), while it reports at the barrier what it holds: the joiner checks the state
/// against what the members vouch for (`Sync`'s majority), refuses it, and tells the
/// coordinator, which assigns it another sender; the joiner completes from the honest one and
/// holds the same weights as the others. Before, it installed the forged state.
#[test]
fn a_forged_state_is_refused_and_the_joiner_completes_from_an_honest_sender() {
    let mut net = formed(MeshConfig::default(), 3);
    net.run_for(secs(70)).unwrap();
    net.forge_states(NodeId(0));
    net.add(NodeId(3));
    net.run_for(secs(600)).unwrap();
    let starts: Vec<Vec<NodeId>> = node_events(&net, NodeId(3))
        .into_iter()
        .filter_map(|e| match e {
            NodeEvent::RecoveryStart { senders, .. } => Some(senders),
            _ => None,
        })
        .collect();
    assert_eq!(starts, vec![vec![NodeId(0)], vec![NodeId(1)]], "assigned, then reassigned");
    assert!(recovered(&net, NodeId(3)).is_some(), "{:?}", node_events(&net, NodeId(3)));
    let v = net.violations();
    // The forged copy refused, and its pieces sent again refused as they came: all from n0.
    assert!(v.iter().any(|v| v.contains("not the state the members hold")), "{v:?}");
    assert!(v.iter().all(|v| v.contains("from n0") && v.contains("the members hold")), "{v:?}");
    assert!(net.disagreements().is_empty(), "{:?}", net.hashes());
    let last = *net.hashes().keys().last().unwrap();
    assert_eq!(net.hashes()[&last].len(), 4, "the joiner takes part");
}

/// A piece lost on its way (a frame dropped with its connection): the joiner, with pieces
/// and then none for `state_resend_after`, asks its senders for what it lacks and completes
/// within the wait and one more transfer of the piece, long before `sync_timeout`.
#[test]
fn a_lost_piece_is_asked_for_again_after_the_quiet_wait() {
    let net = faulted_join(PieceFault::Lost);
    assert!(recovered(&net, NodeId(3)).is_some(), "{:?}", node_events(&net, NodeId(3)));
    assert_clean(&net);
    let last = *net.hashes().keys().last().unwrap();
    assert_eq!(net.hashes()[&last].len(), 4, "the joiner takes part");
    // Without the ask the fetch would wait for sync_timeout (an hour): the run is 15 minutes.
    let rec: f64 = net.rows().iter().filter(|r| r.node_id == 3).map(|r| r.recovery_s).sum();
    assert!(rec > 60.0, "the ask waits for state_resend_after: recovery_s {rec}");
}

#[test]
fn a_hung_node_is_evicted_rejoins_when_it_works_again_and_catches_up() {
    let cfg = MeshConfig { barrier_timeout: secs(120), ..MeshConfig::default() };
    let mut net = formed(cfg, 3);
    net.run_for(secs(30)).unwrap();
    net.hang(NodeId(1), true);
    net.run_for(secs(300)).unwrap();
    assert!(!net.coordinator().unwrap().members().contains(&NodeId(1)), "evicted");
    // A hung node learns of its eviction when it works again (its heartbeats went on, its
    // membership actions waited), and its supervisor restarts it.
    net.hang(NodeId(1), false);
    let stops: Vec<bool> = net
        .record()
        .iter()
        .filter(|r| r.node == NodeId(1))
        .filter_map(|r| match &r.what {
            Seen::Stop { rejoin, .. } => Some(*rejoin),
            _ => None,
        })
        .collect();
    assert_eq!(stops.first(), Some(&true), "evicted, to rejoin");
    net.run_for(secs(600)).unwrap();
    let ev = node_events(&net, NodeId(1));
    assert!(ev.iter().filter(|e| matches!(e, NodeEvent::Admitted { .. })).count() >= 2, "{ev:?}");
    assert!(ev.iter().any(|e| matches!(e, NodeEvent::RecoveryDone { .. })), "{ev:?}");
    let last = *net.hashes().keys().last().unwrap();
    assert!(net.hashes()[&last].contains_key(&NodeId(1)));
    assert_clean(&net);
}

#[test]
fn runs_are_deterministic() {
    let run = || {
        let mut net = formed(MeshConfig::default(), 4);
        net.set_drop_rate(0.01);
        net.run_for(secs(100)).unwrap();
        net.add(NodeId(9));
        net.run_for(secs(300)).unwrap();
        format!("{:?} {:?}", net.record(), net.hashes())
    };
    assert_eq!(run(), run());
}

/// A node whose inner loop diverged (NaN and infinities in its weights) is not averaged: it asks
/// for weight 0, says so in its events and its row, takes the others' average, and the replicas
/// stay identical and finite, whatever the codec would have done with the NaN.
#[test]
fn a_diverged_pseudo_gradient_is_withheld_and_the_others_average_is_taken() {
    let mut net = formed(MeshConfig::default(), 3);
    net.diverge(NodeId(2), 1);
    net.run_for(secs(200)).unwrap();
    assert_eq!(net.coordinator().unwrap().outer_step(), 3);
    assert_clean(&net);
    let weights: Vec<(u64, Vec<f32>)> = net
        .record()
        .iter()
        .filter_map(|r| match &r.what {
            Seen::Mesh(MeshEvent::Released { outer_step, weights, .. }) => {
                Some((*outer_step, weights.iter().map(|w| w.get()).collect()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        weights,
        [(0, vec![1.0, 1.0, 1.0]), (1, vec![1.0, 1.0, 0.0]), (2, vec![1.0, 1.0, 1.0])]
    );
    let withheld: Vec<NodeEvent> = node_events(&net, NodeId(2))
        .into_iter()
        .filter(|e| matches!(e, NodeEvent::Withheld { .. }))
        .collect();
    assert!(
        matches!(withheld[..], [NodeEvent::Withheld { outer_step: 1, values: 586, of: 4096, .. }]),
        "{withheld:?}"
    );
    assert!(node_events(&net, NodeId(0)).iter().all(|e| !matches!(e, NodeEvent::Withheld { .. })));
    for r in net.rows().iter().filter(|r| r.outer_step == 1) {
        assert_eq!(r.weight, if r.node_id == 2 { 0.0 } else { 1.0 }, "{r:?}");
    }
    for i in 0..3 {
        let outer = net.node(NodeId(i)).unwrap().outer().unwrap();
        assert!(outer.outer().iter().all(|w| w.is_finite()), "n{i}");
    }
}

// ----- chaos: seeded random faults, invariants checked at every commit -----

/// A seeded script of `events` random faults among `nodes` nodes: crashes and restarts, graceful
/// leaves and rejoins, hangs and resumes, cuts of single links (both ways or one way) and heals,
/// diverged inner loops, pauses of the coordinator (up to five heartbeat timeouts: past the
/// members' coordinator timeout, under their `rejoin_for`), one member that sprays its ring
/// frames at every node, one that fails every attempt and one that silently sends no ring
/// frame (named by its successors after the 30-s progress timeout), a few seconds apart; then everything heals, every node comes back, and the mesh runs on.
/// At least `min_members + 2` nodes stay up, so the mesh may always go on.
fn chaos_script(seed: u64, nodes: u32, events: usize, mode: &str) -> String {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let min_members = 4;
    // Odd seeds join without blocking: the joiner computes at weight 0 while its state comes.
    let join_mode = if seed % 2 == 1 { "non-blocking" } else { "blocking" };
    let mut s = format!(
        "# chaos seed {seed}: {nodes} nodes, {events} events\nmode {mode}\n\
         config min_members={min_members} join_window=5s heartbeat_timeout=6s barrier_timeout=120s \
         allreduce_timeout=120s progress_timeout=30s sync_timeout=120s join_mode={join_mode}\n\
         params 1024\ncompute 20s\nstart"
    );
    for i in 0..nodes {
        s.push_str(&format!(" n{i}"));
    }
    s.push('\n');
    // 0 up, 1 down (crashed or left), 2 hung, 3 failing every attempt.
    let mut state = vec![0u8; nodes as usize];
    let mut cuts = 0;
    let mut sprayer = false;
    let mut liar = false;
    let mut withholder = false;
    // Script time, and when the coordinator runs again after its last pause: a pause starts
    // only once members have heard it again since the last one (two pauses back to back are one
    // pause as long as both, past the members' `rejoin_for`: a coordinator lost).
    let (mut clock_ms, mut resumed_ms) = (0u64, 0u64);
    for _ in 0..events {
        let run_ms = rng.random_range(500..15_000);
        clock_ms += run_ms;
        s.push_str(&format!("run {run_ms}ms\n"));
        let n = rng.random_range(0..nodes) as usize;
        let up = state.iter().filter(|&&x| x == 0).count();
        let line = match (rng.random_range(0..10), state[n]) {
            (8, _) if clock_ms >= resumed_ms + 4_000 => {
                let pause_ms = rng.random_range(1_000..30_000);
                resumed_ms = clock_ms + pause_ms;
                // A third of the time its uplink goes down instead: it runs, hearing nobody; a
                // sixth of the time a new process that knows nobody takes its place.
                match rng.random_range(0..6) {
                    0 => "coordinator-restart".to_string(),
                    1 | 2 => format!("coordinator-cut-off {pause_ms}ms"),
                    _ => format!("coordinator-pause {pause_ms}ms"),
                }
            }
            (9, 0) if !sprayer => {
                sprayer = true;
                format!("spray n{n}")
            }
            (0, 0) if up > min_members + 2 => {
                state[n] = 1;
                format!("crash n{n}")
            }
            // A member that fails every attempt it is released into, for the rest of the run.
            (7, 0) if !liar && up > min_members + 2 => {
                liar = true;
                state[n] = 3;
                format!("liar n{n}")
            }
            // One that silently stalls every all-reduce it is in.
            (6, 0) if !withholder && up > min_members + 2 => {
                withholder = true;
                state[n] = 3;
                format!("withhold n{n}")
            }
            (1, 0) if up > min_members + 2 => {
                state[n] = 1;
                format!("leave n{n}")
            }
            (2, 0) if up > min_members + 2 => {
                state[n] = 2;
                format!("hang n{n}")
            }
            (3, 0) => format!("diverge n{n}"),
            (4, _) if cuts < 3 => {
                cuts += 1;
                let m = (n as u32 + rng.random_range(1..nodes)) % nodes;
                let how = if rng.random_bool(0.5) { "cut" } else { "cut-oneway" };
                // A quarter of the cuts are between a member and the coordinator, either way.
                match rng.random_range(0..8) {
                    0 => format!("{how} n{n} coordinator"),
                    1 => format!("{how} coordinator n{n}"),
                    _ => format!("{how} n{n} n{m}"),
                }
            }
            (5, _) if cuts > 0 => {
                cuts = 0;
                "heal".to_string()
            }
            (_, 1) => {
                state[n] = 0;
                format!("join n{n}")
            }
            (_, 2) => {
                state[n] = 0;
                format!("resume n{n}")
            }
            _ => continue,
        };
        s.push_str(&line);
        s.push('\n');
    }
    s.push_str("heal\n");
    for (i, st) in state.iter().enumerate() {
        match st {
            1 => s.push_str(&format!("join n{i}\n")),
            2 => s.push_str(&format!("resume n{i}\n")),
            _ => {}
        }
    }
    s
}

/// One chaos run: the script, then 20 minutes with no fault. Checks: no node saw a violation
/// (every ring's weight sums equal its release's, so no admitted contribution was lost or
/// counted twice; releases name the epoch's members; state pieces came from assigned senders),
/// every node that committed a step holds the same weights after it, one coordinator decided
/// every step (no split brain: the harness has one), and the mesh commits again after the last
/// fault: at least `min_progress` steps in those 20 minutes. `Err` holds the script that
/// reproduces a failure (save it to testdata/node/ to keep it).
fn chaos_run(
    seed: u64,
    nodes: u32,
    events: usize,
    min_progress: u64,
    mode: &str,
) -> Result<Chaos, String> {
    let script = chaos_script(seed, nodes, events, mode);
    let fail = |why: String| format!("{why}\nreproduce with this script:\n{script}");
    let mut net = script_net(&script).map_err(fail)?.ok_or_else(|| fail("no network".into()))?;
    let before = net.coordinator().map_or(0, |c| c.outer_step());
    net.run_for(Duration::from_secs(1200)).map_err(|e| fail(e.to_string()))?;
    let after = net.coordinator().map_or(0, |c| c.outer_step());
    if !net.violations().is_empty() {
        return Err(fail(format!("violations: {:?}", net.violations())));
    }
    if !net.disagreements().is_empty() {
        return Err(fail(format!("replicas differ after steps {:?}", net.disagreements())));
    }
    // Every process that held the training state gone (the joiners had not received it yet):
    // the run stops by design, to be resumed from checkpoints.
    let lost =
        net.record().iter().any(|r| matches!(r.what, Seen::Mesh(MeshEvent::NoSyncedMember { .. })));
    if lost {
        return Ok(Chaos::StateLost { at_step: after });
    }
    if after < before + min_progress {
        return Err(fail(format!(
            "no progress after the last fault: step {before} then {after} 20 minutes later"
        )));
    }
    Ok(Chaos::Went { steps: after, committed: net.hashes().len() as u64 })
}

/// How a chaos run ended.
enum Chaos {
    /// It went on after the last fault; `steps` committed or skipped in all, `committed` of
    /// them committed.
    Went { steps: u64, committed: u64 },
    /// Every holder of the training state was lost: the run stopped, as it must.
    StateLost { at_step: u64 },
}

/// 50 seeds of 16 nodes and 200 random faults each (a few seconds of CI). More:
/// `LOCO_CHAOS_SEEDS=5000 cargo test -p loco-core --features testing --release --test
/// node_machine chaos -- --nocapture` (prints the tally).
#[test]
fn chaos_seeds_keep_every_invariant() {
    let seeds: u64 =
        std::env::var("LOCO_CHAOS_SEEDS").ok().and_then(|v| v.parse().ok()).unwrap_or(50);
    let (mut went, mut steps, mut lost) = (0u64, 0u64, Vec::new());
    let (mut pauses, mut sprays, mut coordinator_cuts, mut cut_offs) = (0, 0, 0, 0usize);
    let (mut restarts, mut liars, mut withholders) = (0, 0, 0);
    let mut committed = 0u64;
    for seed in 0..seeds {
        let script = chaos_script(seed, 16, 200, "sync");
        pauses += script.matches("coordinator-pause").count();
        cut_offs += script.matches("coordinator-cut-off").count();
        restarts += script.matches("coordinator-restart").count();
        liars += script.matches("liar").count();
        withholders += script.matches("withhold").count();
        coordinator_cuts +=
            script.lines().filter(|l| l.starts_with("cut") && l.contains("coordinator")).count();
        sprays += script.matches("spray").count();
        match chaos_run(seed, 16, 200, 5, "sync") {
            Ok(Chaos::Went { steps: s, committed: c }) => {
                went += 1;
                steps += s;
                committed += c;
            }
            Ok(Chaos::StateLost { at_step }) => lost.push((seed, at_step)),
            Err(e) => panic!("chaos seed {seed} failed: {e}"),
        }
    }
    eprintln!(
        "chaos: {seeds} seeds x 200 faults on 16 nodes ({pauses} coordinator pauses, \
         {cut_offs} cut-offs of the coordinator from everyone, {restarts} coordinators restarted \
         knowing nobody, {liars} members failing every attempt, {withholders} withholding their \
         ring frames, {coordinator_cuts} cuts between a \
         member and the coordinator, {sprays} spraying members): {went} went on ({steps} steps, \
         {committed} committed), {} lost every holder of the state and \
         stopped {lost:?}",
        lost.len()
    );
    assert!(pauses > seeds as usize && sprays * 2 > seeds as usize, "{pauses} {sprays}");
    assert!(coordinator_cuts > seeds as usize / 2, "{coordinator_cuts}");
    assert!(cut_offs > seeds as usize / 2, "{cut_offs}");
    assert!(restarts > seeds as usize / 2, "{restarts}");
    assert!(liars * 2 > seeds as usize, "{liars}");
    assert!(withholders * 2 > seeds as usize, "{withholders}");
    // Losing every state holder takes crashes of all of them while the joiners wait: rare.
    assert!(went * 10 >= seeds * 9, "{} of {seeds} seeds lost the state", lost.len());
    assert!(steps > went * 10, "{steps} steps over {went} seeds");
    assert!(committed * 2 > steps, "{committed} of {steps} steps committed");
}

// ----- overlapped and streaming DiLoCo -----

fn formed_in(mode: Mode, fragments: u32, cfg: MeshConfig, n: u32) -> NodeNet {
    let cfg = MeshConfig { min_members: n as usize, join_window: Duration::ZERO, ..cfg };
    let mut net = NodeNet::new(cfg, 4096, secs(60), 7);
    net.set_mode(mode, fragments, 0.0);
    for i in 0..n {
        net.add(NodeId(i));
    }
    net
}

/// Rows of one node in step order.
fn rows_of(net: &NodeNet, id: u32) -> Vec<loco_core::metrics::OuterStepRow> {
    let mut rows: Vec<_> = net.rows().iter().filter(|r| r.node_id == id).cloned().collect();
    rows.sort_by_key(|r| r.outer_step);
    rows
}

/// Three nodes in `mode` whose links carry 1,000 bytes/s: an all-reduce of the 4096-value
/// model (fp32) takes about 20 s, a third of a round's compute. Run for `run` seconds.
fn slow_links(mode: Mode, fragments: u32, run: u64) -> NodeNet {
    let mut net = formed_in(mode, fragments, MeshConfig::default(), 3);
    for a in 0..3 {
        for b in 0..3 {
            net.set_bandwidth(NodeId(a), NodeId(b), 1_000.0);
        }
    }
    net.run_for(secs(run)).unwrap();
    net
}

/// In overlap and streaming modes the inner steps do not wait for an all-reduce shorter than
/// them: the rows of a node tile its time (each ends where the next starts), hold the compute
/// of their round and little else, and the all-reduce's time is not a wait.
/// Sync mode on the same links waits for every all-reduce.
#[test]
fn overlapped_rounds_compute_back_to_back_with_identical_weights() {
    let sync = slow_links(Mode::Sync, 1, 600);
    assert_clean(&sync);
    let waited = rows_of(&sync, 0);
    assert!(waited[1..].iter().all(|r| r.compute_s / r.wall_s() < 0.85), "{waited:?}");
    for (mode, p) in [(Mode::Overlap, 1), (Mode::Streaming, 4)] {
        let net = slow_links(mode, p, 600);
        assert_clean(&net);
        for id in 0..3 {
            let rows = rows_of(&net, id);
            assert!(rows.len() >= 8, "{mode}: {rows:?}");
            for w in rows.windows(2) {
                assert!((w[0].end_s - w[1].start_s).abs() < 1e-9, "{mode}: {w:?}");
            }
            for r in &rows {
                assert!((r.compute_s - 60.0).abs() < 1e-9, "{mode}: {r:?}");
                assert!(r.compute_s / r.wall_s() > 0.99, "{mode}: {r:?}");
            }
            // Each row carries its step's all-reduce, which ran beside the next round, and the
            // weights after it (the same on every node: `assert_clean`).
            assert!(
                rows.iter()
                    .all(|r| r.allreduce_wall_s > 1.0 && r.allreduce_s < 0.5 && r.world == 3),
                "{mode}: {rows:?}"
            );
            for r in &rows {
                assert_eq!(
                    r.weights_hash,
                    Some(net.hashes()[&r.outer_step][&NodeId(id)]),
                    "{mode}"
                );
            }
        }
        if mode == Mode::Streaming {
            // A quarter of the model per round.
            let (part, full) = (rows_of(&net, 0)[3].bytes_sent, waited[3].bytes_sent);
            assert!(part * 3 < full, "streaming {part} bytes a round, sync {full}");
        }
    }
}

/// A crash while an all-reduce runs beside the next round's compute: the all-reduce is
/// retried without the dead node from the pseudo-gradients kept, the compute goes on, and the
/// survivors' weights agree.
#[test]
fn a_crash_in_an_overlapped_all_reduce_is_retried_and_compute_goes_on() {
    for (mode, p) in [(Mode::Overlap, 1), (Mode::Streaming, 2)] {
        let mut net = formed_in(mode, p, MeshConfig::default(), 3);
        for a in 0..3 {
            for b in 0..3 {
                net.set_bandwidth(NodeId(a), NodeId(b), 3_000.0);
            }
        }
        let released = |n: &NodeNet, attempt: u32| {
            n.record().iter().any(|r| {
                matches!(&r.what, Seen::Mesh(MeshEvent::Released { outer_step: 0, attempt: a, .. }) if *a == attempt)
            })
        };
        assert!(net.run_until_cond(Time::from_secs_f64(600.0), |n| released(n, 0)).unwrap());
        net.run_for(Duration::from_millis(500)).unwrap();
        net.crash(NodeId(2));
        assert!(net.run_until_cond(Time::from_secs_f64(900.0), |n| released(n, 1)).unwrap());
        net.run_for(secs(300)).unwrap();
        assert_clean(&net);
        assert_eq!(net.hashes()[&0].keys().copied().collect::<Vec<_>>(), [NodeId(0), NodeId(1)]);
        assert!(net.coordinator().unwrap().outer_step() >= 3, "{mode}");
    }
}

/// Joiners in both join modes while fragments are in flight: the joiner takes part in the
/// all-reduce under way with weight 0, ends with the others' weights, and nothing is lost.
#[test]
fn joiners_in_overlap_modes_end_with_the_others_weights() {
    for (mode, p) in [(Mode::Overlap, 1), (Mode::Streaming, 4)] {
        for join in [JoinMode::Blocking, JoinMode::NonBlocking] {
            let cfg = MeshConfig { join_mode: join, ..MeshConfig::default() };
            let mut net = formed_in(mode, p, cfg, 3);
            net.run_for(secs(90)).unwrap();
            for s in 0..3 {
                net.set_bandwidth(NodeId(s), NodeId(3), 300.0);
            }
            net.add(NodeId(3));
            net.run_for(secs(900)).unwrap();
            assert_clean(&net);
            let ev = node_events(&net, NodeId(3));
            assert!(ev.iter().any(|e| matches!(e, NodeEvent::RecoveryDone { .. })), "{ev:?}");
            let last = *net.hashes().keys().last().unwrap();
            assert_eq!(net.hashes()[&last].len(), 4, "{mode} {join:?}: {:?}", net.hashes());
        }
    }
}

/// The chaos of `chaos_seeds_keep_every_invariant` in overlap and streaming modes: crashes,
/// leaves, hangs, cuts and joins while all-reduces run beside the compute.
#[test]
fn chaos_seeds_keep_every_invariant_in_overlap_modes() {
    for mode in ["overlap", "streaming 4"] {
        let mut went = 0;
        for seed in 0..20 {
            match chaos_run(seed, 12, 120, 5, mode) {
                Ok(Chaos::Went { .. }) => went += 1,
                Ok(Chaos::StateLost { .. }) => {}
                Err(e) => panic!("{mode}: chaos seed {seed} failed: {e}"),
            }
        }
        assert!(went >= 18, "{mode}: {went} of 20 seeds went on");
    }
}

/// A coordinator that was not running (SIGSTOP, a paused VM) for longer than the members'
/// coordinator timeout (and less than their `rejoin_for`) judges nobody by that silence, and its
/// members wait for it: when it runs again it evicts no member, and training goes on.
#[test]
fn a_paused_coordinator_evicts_nobody_when_it_runs_again() {
    let cfg = MeshConfig::default();
    let mut net = formed(cfg.clone(), 3);
    net.run_for(secs(30)).unwrap();
    let steps_before = net.hashes().len();
    let pause = cfg.rejoin_for - cfg.heartbeat_interval;
    assert!(pause > cfg.coordinator_timeout);
    net.pause_coordinator(pause);
    net.run_for(pause + secs(120)).unwrap();
    let members = net.coordinator().unwrap().members();
    assert_eq!(members.len(), 3, "evicted after its own pause: {members:?}");
    assert_eq!(evictions(&net), 0);
    assert!(net.hashes().len() > steps_before, "training went on");
    assert_clean(&net);
}

/// A coordinator cut off from every member (its uplink down: both ways, or only what it hears)
/// for longer than the heartbeat timeout and shorter than `rejoin_for` evicts nobody: it hears
/// nobody, so the silence is its own; the members wait for it, still members, and when it hears
/// them again it credits the gap to everyone. A member that died during the cut is evicted
/// afterwards all the same.
#[test]
fn a_coordinator_cut_off_from_every_member_evicts_nobody() {
    let cfg = MeshConfig::default();
    for (cut_ms, oneway) in [(7_000u64, false), (12_000, true), (20_000, false), (33_000, false)] {
        let mut net = formed(cfg.clone(), 3);
        net.run_for(secs(30)).unwrap();
        let steps_before = net.hashes().len();
        let before = incarnations(&net, 3);
        for n in 0..3 {
            if oneway {
                net.cut_oneway(NodeId(n), NodeId::COORDINATOR);
            } else {
                net.cut(NodeId(n), NodeId::COORDINATOR);
            }
        }
        net.run_for(Duration::from_millis(cut_ms)).unwrap();
        net.recover();
        net.run_for(secs(120)).unwrap();
        assert_eq!(evictions(&net), 0, "a {cut_ms} ms cut (one-way: {oneway})");
        let after = incarnations(&net, 3);
        assert_eq!(after, before, "a {cut_ms} ms cut (one-way: {oneway})");
        assert!(net.hashes().len() > steps_before, "training went on after a {cut_ms} ms cut");
        assert_clean(&net);
    }
    // A member that dies while the coordinator is cut off is evicted once it hears the others.
    let mut net = formed(cfg.clone(), 3);
    net.run_for(secs(30)).unwrap();
    for n in 0..3 {
        net.cut(NodeId(n), NodeId::COORDINATOR);
    }
    net.run_for(secs(5)).unwrap();
    net.crash(NodeId(2));
    net.run_for(secs(10)).unwrap();
    net.recover();
    net.run_for(secs(60)).unwrap();
    let members = net.coordinator().unwrap().members();
    assert_eq!(members, vec![NodeId(0), NodeId(1)], "the dead member is evicted after the cut");
}

/// A member that sends its ring frames to nodes that are not its neighbours (a stray or hostile
/// sender) stalls nobody: the frames are counted and dropped where they land, and every step
/// commits at its first attempt with identical weights.
#[test]
fn ring_frames_from_a_node_that_is_not_the_neighbour_are_dropped_not_a_failed_attempt() {
    let mut net = formed(MeshConfig::default(), 3);
    net.run_for(secs(5)).unwrap();
    net.spray_collectives(NodeId(1));
    net.run_for(secs(200)).unwrap();
    assert_eq!(net.coordinator().unwrap().outer_step(), 3);
    let rows = net.rows();
    assert!(!rows.is_empty());
    assert!(
        rows.iter().all(|r| r.retries == 0),
        "a retry: {:?}",
        rows.iter().map(|r| r.retries).collect::<Vec<_>>()
    );
    let foreign: u64 =
        (0..3).map(|i| net.node(NodeId(i)).map_or(0, |n| n.ring_counters().foreign)).sum();
    assert!(foreign > 0, "no frame was sprayed at a non-neighbour");
    assert_clean(&net);
}

/// A member that reports every attempt failed and sends no ring frame (it still beats), while
/// nobody else reports a failure, is evicted after [`BLAME_LIMIT`] attempts in a row, and the
/// others commit the step. Its process joins again, and is evicted again each time: every step
/// commits, where before each was retried and skipped.
#[test]
fn a_member_failing_every_attempt_alone_is_evicted_and_training_goes_on() {
    use loco_core::mesh::BLAME_LIMIT;
    let mut net = formed(MeshConfig::default(), 4);
    net.run_for(secs(5)).unwrap();
    net.fail_every_attempt(NodeId(3));
    net.run_for(secs(600)).unwrap();
    let mut failures_before = None;
    let mut failures = 0;
    let mut evictions = Vec::new();
    for r in net.record() {
        match &r.what {
            Seen::Mesh(MeshEvent::AllReduceFailed { .. }) => failures += 1,
            Seen::Mesh(MeshEvent::EpochFormed { evicted, .. }) if !evicted.is_empty() => {
                failures_before.get_or_insert(failures);
                evictions.push(evicted.clone());
            }
            _ => {}
        }
    }
    assert!(!evictions.is_empty());
    assert!(
        evictions.iter().all(|e| e == &[(NodeId(3), EvictReason::Uncorroborated)]),
        "{evictions:?}"
    );
    assert_eq!(failures_before, Some(BLAME_LIMIT as usize), "evicted at the limit");
    let committed = net.hashes().values().filter(|by| by.len() >= 3).count();
    assert!(committed >= 3, "training went on: {:?}", net.hashes().keys());
    assert_clean(&net);
}

/// A member whose ring frames carry a NaN: its right neighbour refuses them before decoding and
/// fails the attempt naming it; the retry gives it another successor, which names it too, and
/// it alone is evicted (named by two). Each time it joins again the same happens. No replica
/// ever holds a value that is not finite, the replicas stay identical, and training goes on.
#[test]
fn a_member_sending_values_that_are_not_finite_is_named_by_two_and_evicted() {
    let mut net = formed(MeshConfig::default(), 5);
    net.run_for(secs(5)).unwrap();
    net.poison_values(NodeId(3));
    net.run_for(secs(900)).unwrap();
    let (mut accusations, mut evictions) = (Vec::new(), Vec::new());
    for e in mesh_events(&net) {
        match e {
            MeshEvent::AllReduceFailed { node, accused, .. } => accusations.push((*node, *accused)),
            MeshEvent::EpochFormed { evicted, .. } if !evicted.is_empty() => {
                evictions.push(evicted.clone());
            }
            _ => {}
        }
    }
    assert!(!evictions.is_empty(), "{accusations:?}");
    assert!(accusations.iter().all(|(by, a)| *a == Some(NodeId(3)) && *by != NodeId(3)));
    for evicted in &evictions {
        assert_eq!(evicted, &[(NodeId(3), EvictReason::Accused)], "{accusations:?}");
    }
    // Two names per eviction, from two members (the retry gave it another successor).
    for pair in accusations.chunks(2).filter(|p| p.len() == 2) {
        assert_ne!(pair[0].0, pair[1].0, "{accusations:?}");
    }
    assert!(accusations.len() <= 2 * evictions.len() + 1, "{accusations:?}");
    // The bar doubles from twice the heartbeat timeout: within 900 s at most log2(900 / 6) + 1.
    let bound = (900.0 / MeshConfig::default().heartbeat_timeout.as_secs_f64()).log2() + 1.0;
    assert!(evictions.len() as f64 <= bound, "the bar grows: {evictions:?}");
    // Every refusal is the accuser's, of values from node 3.
    let v = net.violations();
    assert!(
        !v.is_empty() && v.iter().all(|v| v.contains("not finite") || v.contains("NaN")),
        "{v:?}"
    );
    assert!(net.disagreements().is_empty(), "{:?}", net.hashes());
    let committed = net.hashes().values().filter(|by| by.len() == 4).count();
    assert!(committed >= 3, "training went on: {:?}", net.hashes().keys());
    for id in (0..5).map(NodeId) {
        let Some(outer) = net.node(id).and_then(|n| n.outer()) else { continue };
        assert!(outer.outer().iter().all(|x| x.is_finite()), "{id}'s weights are finite");
    }
}

/// The guard on the averaged update: one node's pseudo-gradient multiplied by 1,000 at one
/// outer step makes the average's norm far beyond the running median; every member skips that
/// step, the event names the node, and the steps before and after commit with identical
/// replicas. With the guard off the same update is committed.
#[test]
fn an_update_a_thousand_times_too_large_is_skipped_by_all_and_its_node_named() {
    for guarded in [true, false] {
        let ratio = if guarded { 10.0 } else { 0.0 };
        let mut net = formed(MeshConfig { max_update_ratio: ratio, ..MeshConfig::default() }, 4);
        net.run_for(secs(400)).unwrap();
        let bad = net.coordinator().unwrap().outer_step() + 1;
        assert!(bad >= 6, "history first: {bad}");
        net.scale_update(NodeId(2), bad, 1000.0);
        net.run_for(secs(400)).unwrap();
        let refused: Vec<_> = mesh_events(&net)
            .filter_map(|e| match e {
                MeshEvent::UpdateRefused { outer_step, outlier, stopping, .. } => {
                    Some((*outer_step, *outlier, *stopping))
                }
                _ => None,
            })
            .collect();
        let committed = |s: u64| net.hashes().get(&s).is_some_and(|by| by.len() == 4);
        if guarded {
            assert_eq!(refused, vec![(bad, Some(NodeId(2)), false)]);
            assert!(!committed(bad), "step {bad} skipped: {:?}", net.hashes().keys());
        } else {
            assert!(refused.is_empty(), "{refused:?}");
            assert!(committed(bad));
        }
        assert!((0..bad).all(committed), "{:?}", net.hashes().keys());
        assert!((bad + 1..bad + 4).all(committed), "{:?}", net.hashes().keys());
        assert_clean(&net);
    }
}

/// Updates refused three steps in a row stop the run, every member told why.
#[test]
fn updates_refused_three_steps_in_a_row_stop_the_run() {
    use loco_core::mesh::{StopReason, UPDATE_REFUSALS_LIMIT};
    let mut net = formed(MeshConfig { max_update_ratio: 10.0, ..MeshConfig::default() }, 4);
    net.run_for(secs(400)).unwrap();
    let bad = net.coordinator().unwrap().outer_step() + 1;
    for k in 0..u64::from(UPDATE_REFUSALS_LIMIT) {
        net.scale_update(NodeId(1), bad + k, 1000.0);
    }
    net.run_for(secs(400)).unwrap();
    let stopping: Vec<bool> = mesh_events(&net)
        .filter_map(|e| match e {
            MeshEvent::UpdateRefused { stopping, .. } => Some(*stopping),
            _ => None,
        })
        .collect();
    assert_eq!(stopping, [false, false, true]);
    assert!(net.coordinator().unwrap().is_stopped());
    let why = StopReason::UpdatesRefused { outer_step: 0, last_committed: None }.to_string();
    let why = why.split(" at outer step").next().unwrap_or_default().to_owned();
    let stops = net
        .record()
        .iter()
        .filter(
            |r| matches!(&r.what, Seen::Stop { reason, rejoin: false } if reason.starts_with(&why)),
        )
        .count();
    assert_eq!(
        stops,
        4,
        "every member told: {:?}",
        net.record().iter().filter(|r| matches!(r.what, Seen::Stop { .. })).collect::<Vec<_>>()
    );
}

/// Pauses of the coordinator past the heartbeat timeout and short of the members' `rejoin_for`,
/// started anywhere between two heartbeats, evict nobody: silence is judged only over time it ran and heard, even when the
/// pause ends just after a member's deadline (late by less than a heartbeat interval) and the
/// first message it handles then is not a heartbeat.
#[test]
fn a_coordinator_pause_shorter_than_rejoin_for_at_any_phase_of_the_heartbeats_evicts_nobody() {
    let cfg = MeshConfig::default();
    // Pauses past the heartbeat timeout (6 s), to the coordinator timeout (18 s: 3 x the
    // heartbeat timeout, when members notice the silence) and past it, short of `rejoin_for`.
    for offset_ms in (0..2000).step_by(100) {
        for pause_ms in [3_000u64, 5_500, 12_000, 18_000, 30_000] {
            let mut net = formed(cfg.clone(), 3);
            net.run_for(Duration::from_millis(30_000 + offset_ms)).unwrap();
            let before = incarnations(&net, 3);
            net.pause_coordinator(Duration::from_millis(pause_ms));
            // A joiner's `Join`, sent at once, waits with the heartbeats and is handled first.
            net.add(NodeId(3));
            net.run_for(secs(60)).unwrap();
            assert_eq!(evictions(&net), 0, "a {pause_ms} ms pause {offset_ms} ms after a round");
            // Nobody gave up its membership (a new one would have a new incarnation).
            let after = incarnations(&net, 3);
            assert_eq!(after, before, "a {pause_ms} ms pause {offset_ms} ms after a round");
            // Each founder wrote the silence once if it outlasted the coordinator timeout.
            let lost = net
                .record()
                .iter()
                .filter(|r| matches!(&r.what, Seen::Node(NodeEvent::CoordinatorLost { .. })))
                .count();
            let past = Duration::from_millis(pause_ms) >= cfg.coordinator_timeout;
            let want = if past { 3..=4 } else { 0..=0 };
            assert!(want.contains(&lost), "{lost} losses in a {pause_ms} ms pause");
        }
    }
}

/// The members of each epoch the coordinator formed, in order.
fn epochs(net: &NodeNet) -> Vec<Vec<NodeId>> {
    net.record()
        .iter()
        .filter_map(|r| match &r.what {
            Seen::Mesh(MeshEvent::EpochFormed { members, .. }) => Some(members.clone()),
            _ => None,
        })
        .collect()
}

/// A coordinator restarted among nodes that hold different states founds the new mesh on the
/// state most of them hold at the highest step; the others receive it. Here node 2 is a fresh
/// process (the initial weights) and node 3 was still receiving the state when the coordinator
/// went: both join the new mesh with the survivors' weights, and every replica stays identical.
#[test]
fn a_restarted_coordinator_founds_the_mesh_on_the_newest_state_and_replicas_stay_identical() {
    let mut net = formed(MeshConfig::default(), 3);
    net.run_for(secs(200)).unwrap();
    let before = net.coordinator().unwrap().outer_step();
    assert!(before >= 3, "steps committed before the restart: {before}");
    // Node 3 joins over a slow link: it is receiving the state when the coordinator goes.
    for from in 0..3 {
        net.set_bandwidth(NodeId(from), NodeId(3), 2_000.0);
    }
    net.add(NodeId(3));
    let deadline = net.now() + secs(600);
    let fetching = |n: &NodeNet| n.node(NodeId(3)).is_some_and(|n| n.recovery_progress().is_some());
    assert!(net.run_until_cond(deadline, fetching).unwrap(), "node 3 receives the state");
    net.crash(NodeId(2));
    net.restart_coordinator();
    net.add(NodeId(2));
    for from in 0..3 {
        net.set_bandwidth(NodeId(from), NodeId(3), 1e9);
    }
    net.run_for(secs(600)).unwrap();
    assert_clean(&net);
    let c = net.coordinator().unwrap();
    assert!(c.outer_step() > before + 2, "the new mesh went on from step {before}");
    let founded = epochs(&net).into_iter().find(|m| !m.contains(&NodeId(2))).unwrap();
    assert_eq!(founded, vec![NodeId(0), NodeId(1)], "founded on the survivors' state");
    assert_eq!(c.members().len(), 4, "the others joined and received the state");
    let last = *net.hashes().keys().last().unwrap();
    assert_eq!(net.hashes()[&last].len(), 4, "every node's weights after step {last}");
}

/// A member that beats and reaches every barrier but sends no ring frame, and says nothing:
/// its successor hears nothing from it for the progress timeout and names it; the retry gives it
/// another successor, which names it too, and it is evicted (named by two). Each stalled step
/// costs two progress timeouts, not the all-reduce timeout, and the others commit.
#[test]
fn a_member_that_sends_no_ring_frames_is_named_by_two_successors_and_evicted() {
    let cfg = MeshConfig { progress_timeout: secs(30), ..MeshConfig::default() };
    let mut net = formed(cfg, 5);
    net.run_for(secs(5)).unwrap();
    net.withhold_ring_frames(NodeId(2));
    net.run_for(secs(1200)).unwrap();
    let (mut named, mut evictions) = (Vec::new(), Vec::new());
    for e in mesh_events(&net) {
        match e {
            MeshEvent::AllReduceFailed { node, accused: Some(a), .. } if *a == NodeId(2) => {
                named.push(*node);
            }
            MeshEvent::EpochFormed { evicted, .. } if !evicted.is_empty() => {
                evictions.push(evicted.clone());
            }
            _ => {}
        }
    }
    assert!(!evictions.is_empty(), "never evicted; named by {named:?}");
    assert_eq!(evictions[0], vec![(NodeId(2), EvictReason::Accused)], "{evictions:?}");
    let mut distinct = named.clone();
    distinct.sort();
    distinct.dedup();
    assert!(distinct.len() >= 2, "named by {named:?}");
    // Nobody else is ever evicted for it.
    assert!(evictions.iter().flatten().all(|(id, _)| *id == NodeId(2)), "{evictions:?}");
    assert!(net.disagreements().is_empty(), "{:?}", net.hashes());
    let committed = net.hashes().values().filter(|by| by.len() >= 4).count();
    assert!(committed >= 5, "training went on: {:?}", net.hashes().keys());
    assert_clean(&net);
}

/// A member evicted as uncorroborated is admitted again only after a wait that doubles with
/// each such eviction: over two hours of 60-s steps a member failing every attempt is evicted
/// a handful of times, not at every boundary, and the others commit nearly every step.
#[test]
fn a_member_failing_every_attempt_is_admitted_again_less_and_less_often() {
    let mut net = formed(MeshConfig::default(), 4);
    net.run_for(secs(5)).unwrap();
    net.fail_every_attempt(NodeId(3));
    net.run_for(secs(7200)).unwrap();
    let evicted: Vec<Time> = net
        .record()
        .iter()
        .filter(|r| {
            matches!(&r.what, Seen::Mesh(MeshEvent::EpochFormed { evicted, .. })
                if evicted.contains(&(NodeId(3), EvictReason::Uncorroborated)))
        })
        .map(|r| r.at)
        .collect();
    let gaps: Vec<f64> =
        evicted.windows(2).map(|w| w[1].saturating_since(w[0]).as_secs_f64()).collect();
    assert!(evicted.len() >= 3, "evicted {} times", evicted.len());
    assert!(gaps.windows(2).all(|g| g[1] >= g[0]), "the waits grow: {gaps:?}");
    assert!(gaps.last().unwrap() > &gaps[0], "the waits grow: {gaps:?}");
    let steps = net.coordinator().unwrap().outer_step();
    let committed = net.hashes().values().filter(|by| by.len() >= 3).count() as u64;
    eprintln!(
        "a member failing every attempt for 2 h: evicted {} times, waits {gaps:.0?} s, \
         {committed} of {steps} steps committed",
        evicted.len()
    );
    assert!(committed * 10 >= steps * 8, "{committed} of {steps} steps committed");
    assert_clean(&net);
}
