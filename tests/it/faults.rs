//! The fault-injection suite: every scenario of `scenarios/faults/` played by `loco launch`
//! with real processes and signals on loopback (a synthetic objective, each inner step paced to
//! the scenario's `step_time`), and by `loco replay` in the simulator.
//!
//! Each test checks what a user relies on after that fault: the run finishes (or, for the
//! coordinator, stops as designed); after every outer step the members' outer weights are
//! bit-identical; every checkpoint directory on disk is complete and verifies; a joiner's state
//! hash-equals the state its senders committed; events.csv says what happened; and the simulator
//! tells the same membership story (the same epochs with the same members, the same evictions).

use crate::common::{Row, TestContext, one_real_run_at_a_time, read_csv, stderr, stdout};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A finished run: its directory and files.
struct Run {
    out: PathBuf,
    ckpt: PathBuf,
    events: Vec<Row>,
    rows: Vec<Row>,
}

impl Run {
    fn read(out: PathBuf, ckpt: PathBuf) -> Run {
        let events = read_csv(&out.join("events.csv"));
        let rows = read_csv(&out.join("outer_steps.csv"));
        Run { out, ckpt, events, rows }
    }

    fn has_event(&self, kind: &str, node: &str, detail: &str) -> bool {
        self.events
            .iter()
            .any(|e| e["kind"] == kind && e["node"] == node && e["detail"].contains(detail))
    }

    fn assert_event(&self, kind: &str, node: &str, detail: &str) {
        assert!(
            self.has_event(kind, node, detail),
            "no {kind} event of {node:?} with {detail:?} in {}:\n{}",
            self.out.display(),
            self.events_text()
        );
    }

    fn events_text(&self) -> String {
        std::fs::read_to_string(self.out.join("events.csv")).unwrap_or_default()
    }

    /// Outer steps recorded, after checking that every node that recorded a step holds the same
    /// outer weights after it. Only a row of weight 0 (a non-blocking joiner still receiving the
    /// state) may have no digest.
    fn steps_with_identical_replicas(&self) -> usize {
        let mut by_step: BTreeMap<u64, BTreeMap<String, String>> = BTreeMap::new();
        for r in &self.rows {
            if r["weights_hash"].is_empty() && r["weight"].parse::<f64>().unwrap() == 0.0 {
                continue;
            }
            by_step
                .entry(r["outer_step"].parse().unwrap())
                .or_default()
                .insert(r["node"].clone(), r["weights_hash"].clone());
        }
        for (step, hashes) in &by_step {
            let distinct: BTreeSet<&String> = hashes.values().collect();
            assert!(
                distinct.len() == 1 && !hashes.values().any(String::is_empty),
                "step {step}: {hashes:?}"
            );
        }
        by_step.len()
    }

    fn hash_after(&self, step: u64) -> Option<String> {
        self.rows
            .iter()
            .find(|r| r["outer_step"] == step.to_string() && !r["weights_hash"].is_empty())
            .map(|r| r["weights_hash"].clone())
    }

    /// Every joiner's received state equals what the members committed: the weights it reports
    /// after "as of outer step S" are the members' weights after step S - 1, or, when it replayed
    /// R steps committed meanwhile (non-blocking mode), after step S - 1 + R. Returns how many.
    fn joiners_match_their_senders(&self) -> usize {
        let mut n = 0;
        for e in self
            .events
            .iter()
            .filter(|e| e["kind"] == "recovery-done" && e["detail"].starts_with("received"))
        {
            let d = &e["detail"];
            let as_of: u64 = field_after(d, "as of outer step ").parse().unwrap();
            let weights = field_after(d, "weights ");
            let replayed: u64 = d
                .split(", ")
                .find_map(|p| p.strip_suffix(" step(s) replayed"))
                .map_or(0, |r| r.parse().unwrap());
            if as_of + replayed > 0 {
                let step = as_of + replayed - 1;
                let want = self.hash_after(step).expect("the members' row of that step");
                assert_eq!(weights, want, "joiner {}: {d}", e["node"]);
            }
            n += 1;
        }
        n
    }

    /// Every complete checkpoint directory loads and verifies (tensors, digests, metadata); a
    /// process killed mid-save may leave only `*.tmp*` directories, which loading ignores.
    fn checkpoints_verify(&self) -> usize {
        let mut n = 0;
        for node in std::fs::read_dir(&self.ckpt).into_iter().flatten() {
            let node = node.unwrap();
            let name = node.file_name().into_string().unwrap();
            for (step, dir) in loco_real::checkpoint::list(&self.ckpt, &name).unwrap() {
                let ck = loco_real::checkpoint::load(&dir).unwrap_or_else(|e| {
                    panic!("{}: a half-written checkpoint: {e}", dir.display())
                });
                assert_eq!(ck.meta.outer_step, step);
                n += 1;
            }
        }
        n
    }

    /// The membership story: each epoch with its members, the evictions into it with their
    /// reason, and which nodes stopped because the coordinator was lost.
    fn story(&self) -> Vec<String> {
        let mut out = Vec::new();
        for e in &self.events {
            match e["kind"].as_str() {
                "epoch" if e["node"].is_empty() => {
                    out.push(format!("epoch {}: {}", e["epoch"], e["detail"]))
                }
                // The coordinator's record (a woken worker's own "evicted by" is not part of it).
                "evict" if !e["detail"].starts_with("evicted by") => out
                    .push(format!("epoch {}: evicted {} ({})", e["epoch"], e["node"], e["detail"])),
                "coordinator-lost" => out.push(format!("{} lost the coordinator", e["node"])),
                _ => {}
            }
        }
        out.sort();
        out.dedup();
        out
    }
}

fn field_after<'a>(text: &'a str, key: &str) -> &'a str {
    let at = text.find(key).unwrap_or_else(|| panic!("no {key:?} in {text:?}")) + key.len();
    text[at..].split([',', ' ']).next().unwrap()
}

fn scenario(name: &str) -> String {
    format!("scenarios/faults/{name}.toml")
}

/// `loco launch` of a scenario with the synthetic objective; asserts that it succeeded.
fn launch(ctx: &TestContext, scenario: &str, extra: &[&str]) -> Run {
    let mut args = vec!["--synthetic-params", "20000"];
    args.extend_from_slice(extra);
    launch_model(ctx, scenario, &args)
}

/// `loco launch` of a scenario with its own model (or what `extra` says); asserts success.
fn launch_model(ctx: &TestContext, scenario: &str, extra: &[&str]) -> Run {
    let _turn = one_real_run_at_a_time();
    let out = ctx.path().join("run");
    let ckpt = ctx.path().join("ckpt");
    let mut args = vec![
        "launch",
        scenario,
        "--out",
        out.to_str().unwrap(),
        "--checkpoint-dir",
        ckpt.to_str().unwrap(),
        "--timeout",
        "120",
    ];
    args.extend_from_slice(extra);
    let o = ctx.loco(&args);
    assert!(o.status.success(), "stdout: {}\nstderr: {}", stdout(&o), stderr(&o));
    Run::read(out, ckpt)
}

/// `loco replay` of the same scenario.
fn replay(ctx: &TestContext, scenario: &str) -> Run {
    let out = ctx.path().join("sim");
    let o = ctx.loco(&["replay", scenario, "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "stdout: {}\nstderr: {}", stdout(&o), stderr(&o));
    Run::read(out.clone(), out.join("no-checkpoints"))
}

/// Launches and replays `name`, checks what every fault must keep, and that both backends tell
/// the same membership story. The context keeps the run's files.
fn play(name: &str) -> (TestContext, Run) {
    let ctx = TestContext::new();
    let path = scenario(name);
    let real = launch(&ctx, &path, &[]);
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(real.out.join("summary.json")).unwrap())
            .unwrap();
    assert_eq!(summary["invariants"]["ok"], true, "{summary}");
    assert!(summary["extra"]["stale_frames_rejected"].as_u64().is_some(), "{summary}");
    assert!(real.steps_with_identical_replicas() >= 4, "{}", real.events_text());
    assert!(real.checkpoints_verify() >= 2, "no checkpoints in {}", real.ckpt.display());
    real.joiners_match_their_senders();
    let sim = replay(&ctx, &path);
    // Both backends count the collective frames of epochs left behind.
    let sim_summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(sim.out.join("summary.json")).unwrap())
            .unwrap();
    assert!(sim_summary["extra"]["stale_frames_rejected"].as_u64().is_some(), "{sim_summary}");
    assert_eq!(
        real.story(),
        sim.story(),
        "real:\n{}\nsimulated:\n{}",
        real.events_text(),
        sim.events_text()
    );
    (ctx, real)
}

/// n-1 killed in `phase`: evicted by its silence; the survivors finish every step together,
/// retrying the step whose all-reduce it broke.
fn killed_during(phase: &str, retried: bool) {
    let (_ctx, r) = play(&format!("crash-in-{phase}"));
    r.assert_event("crash", "n-1", &format!("SIGKILL during {phase}"));
    r.assert_event("evict", "n-1", "heartbeat timeout");
    if retried {
        r.assert_event("retry", "", "attempt 1 on 2 nodes");
    }
    assert_eq!(r.steps_with_identical_replicas(), 16);
}

#[test]
fn a_worker_killed_during_its_inner_steps_is_evicted_and_the_rest_go_on() {
    killed_during("compute", false);
}

#[test]
fn a_worker_killed_during_the_reduce_scatter_makes_the_survivors_retry_the_step() {
    killed_during("reduce-scatter", true);
}

#[test]
fn a_worker_killed_during_the_all_gather_makes_the_survivors_retry_the_step() {
    killed_during("all-gather", true);
}

#[test]
fn a_worker_killed_while_writing_a_checkpoint_leaves_only_complete_ones() {
    let (_ctx, r) = play("crash-in-checkpoint");
    r.assert_event("crash", "n-1", "SIGKILL during checkpoint");
    r.assert_event("evict", "n-1", "heartbeat timeout");
    // `play` loaded and verified every `step-<N>` directory, n-1's included; the one being written
    // when it died is either complete or a `*.tmp-*` directory that listing ignores.
    let n1 = loco_real::checkpoint::list(&r.ckpt, "n-1").unwrap();
    assert!(!n1.is_empty(), "n-1 wrote checkpoints before it died");
    let entries: Vec<String> = std::fs::read_dir(r.ckpt.join("n-1"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(
        entries.iter().all(|e| e.starts_with("step-")),
        "only checkpoint directories, complete or temporary: {entries:?}"
    );
    assert_eq!(r.steps_with_identical_replicas(), 16);
}

#[test]
fn a_sender_killed_mid_transfer_leaves_the_joiner_the_rest_from_the_others() {
    let (_ctx, r) = play("crash-in-state-send");
    r.assert_event("crash", "n-0", "SIGKILL during state-send");
    r.assert_event("evict", "n-0", "heartbeat timeout");
    // The joiner keeps the pieces it already holds and gets the rest from the new senders.
    r.assert_event("recovery-start", "late", "already held are kept");
    r.assert_event("recovery-done", "late", "received");
    assert_eq!(r.joiners_match_their_senders(), 1);
    let late: Vec<&Row> = r.rows.iter().filter(|x| x["node"] == "late").collect();
    assert!(late.len() >= 8, "the joiner trained {} steps", late.len());
}

#[test]
fn a_worker_stopped_with_sigterm_leaves_gracefully_without_a_timeout() {
    let (_ctx, r) = play("leave");
    r.assert_event("leave", "n-1", "left the mesh");
    assert!(!r.has_event("evict", "n-1", ""), "a graceful leave is not an eviction");
    assert_eq!(r.steps_with_identical_replicas(), 16);
}

/// A hung node (the scenario's `hang`, played in the process: its work stops, its heartbeats go
/// on) is waited for at the barrier, not evicted: its hang (2 s) is longer than the heartbeat
/// timeout (1.5 s) and shorter than the barrier timeout (20 s). The simulator tells the same
/// story (tests/it/conformance.rs).
#[test]
fn a_hung_worker_keeps_beating_and_is_waited_for() {
    let ctx = TestContext::new();
    let r = launch(&ctx, &scenario("hang"), &[]);
    r.assert_event("hang", "n-1", "hangs (keeps beating)");
    r.assert_event("hang", "n-1", "resumes");
    let changes = ["evict", "leave", "restart", "coordinator-lost"];
    let changed: Vec<_> =
        r.events.iter().filter(|e| changes.contains(&e["kind"].as_str())).collect();
    assert!(changed.is_empty(), "{changed:?}\n{}", r.events_text());
    assert_eq!(r.steps_with_identical_replicas(), 16);
    assert!(r.checkpoints_verify() >= 2);
    // The others waited for it at the barrier, most of its hang (2 s) in one outer step.
    let longest = r
        .rows
        .iter()
        .filter(|x| x["node"] == "n-0")
        .filter_map(|x| x["barrier_s"].parse::<f64>().ok())
        .fold(0.0f64, f64::max);
    assert!(longest >= 1.5, "n-0 waited at most {longest} s at a barrier");
}

#[test]
fn a_joiner_arriving_during_an_eviction_is_admitted_after_it() {
    let (_ctx, r) = play("join-during-change");
    r.assert_event("crash", "n-1", "SIGKILL");
    r.assert_event("recovery-done", "late", "received");
    assert_eq!(r.joiners_match_their_senders(), 1);
}

#[test]
fn two_joiners_at_once_are_admitted_together_each_with_the_state() {
    let (_ctx, r) = play("two-joiners");
    assert_eq!(r.joiners_match_their_senders(), 2);
    assert!(
        r.story().iter().any(|s| s.contains("5 members: n-0 n-1 n-2 late-a late-b")),
        "{:?}",
        r.story()
    );
}

#[test]
fn a_non_blocking_joiner_counts_with_weight_zero_until_it_holds_the_state() {
    let (_ctx, r) = play("join-non-blocking");
    r.assert_event("recovery-done", "late", "received");
    assert_eq!(r.joiners_match_their_senders(), 1);
    let late: Vec<(f64, bool)> = r
        .rows
        .iter()
        .filter(|x| x["node"] == "late")
        .map(|x| (x["weight"].parse().unwrap(), x["weights_hash"].is_empty()))
        .collect();
    // Weight 0 until it holds the state (how many steps that takes depends on the machine's
    // load), then weight 1 to the end; no digest only while it does not hold the state.
    let zeros = late.iter().take_while(|(w, _)| *w == 0.0).count();
    assert!(zeros >= 1, "the joiner's first step has weight 0: {late:?}");
    assert!(zeros < late.len(), "it ends up counting: {late:?}");
    assert!(late[zeros..].iter().all(|&(w, empty)| w == 1.0 && !empty), "{late:?}");
    let unsynced = late.iter().take_while(|(_, empty)| *empty).count();
    assert!(unsynced <= zeros, "it counts only once it holds the state: {late:?}");
    assert!(late[unsynced..].iter().all(|(_, empty)| !empty), "{late:?}");
}

#[test]
fn when_the_coordinator_dies_the_members_checkpoint_and_stop_and_the_run_resumes() {
    let (_ctx, r) = play("coordinator-crash");
    // Each member writes the loss once, however often it then tries to rejoin (a bounded number
    // of times, docs/lifecycle.md) before it exits.
    for n in ["n-0", "n-1", "n-2"] {
        r.assert_event("coordinator-lost", n, "coordinator lost");
        let lost = r.events.iter().filter(|e| e["kind"] == "coordinator-lost" && e["node"] == n);
        assert_eq!(lost.count(), 1, "{n}:\n{}", r.events_text());
    }
    // Nothing committed is lost: every member checkpointed its last committed step.
    let last: u64 = r.rows.iter().map(|x| x["outer_step"].parse::<u64>().unwrap()).max().unwrap();
    for n in ["n-0", "n-1", "n-2"] {
        let steps: Vec<u64> =
            loco_real::checkpoint::list(&r.ckpt, n).unwrap().into_iter().map(|(s, _)| s).collect();
        assert_eq!(steps.last(), Some(&(last + 1)), "{n}: checkpoints {steps:?}");
    }
}

/// The coordinator stopped (SIGSTOP) for three heartbeat timeouts, past the members' coordinator
/// timeout: the members say so once each and wait for it, still members; when it runs again it
/// evicts nobody and the run finishes every step with the same members.
#[test]
fn a_coordinator_paused_for_three_heartbeat_timeouts_evicts_nobody() {
    let (_ctx, r) = play("coordinator-pause");
    r.assert_event("coordinator-pause", "", "paused");
    r.assert_event("coordinator-pause", "", "runs again");
    for n in ["n-0", "n-1", "n-2"] {
        r.assert_event("coordinator-lost", n, "still a member");
        let lost = r.events.iter().filter(|e| e["kind"] == "coordinator-lost" && e["node"] == n);
        assert_eq!(lost.count(), 1, "{n}:\n{}", r.events_text());
    }
    let changes = ["evict", "leave", "join", "restart"];
    let changed: Vec<_> =
        r.events.iter().filter(|e| changes.contains(&e["kind"].as_str())).collect();
    assert!(changed.is_empty(), "{changed:?}\n{}", r.events_text());
    let epochs = r.events.iter().filter(|e| e["kind"] == "epoch" && e["node"].is_empty());
    assert_eq!(epochs.count(), 1, "{}", r.events_text());
    assert_eq!(r.steps_with_identical_replicas(), 16, "{}", r.events_text());
}

/// Resuming from a checkpoint continues the run exactly: the same weights after every step and
/// the same loss, as the run that was never interrupted.
#[test]
fn a_run_resumed_from_a_checkpoint_continues_exactly() {
    resume_continues_exactly(&["--synthetic-params", "20000"], None);
}

/// The same with the sparse codec: error feedback's residual, which the next contributions add,
/// comes back from the checkpoint exactly (a residual restarted at zero sends other values).
#[test]
fn a_sparse_run_resumed_from_a_checkpoint_continues_exactly() {
    resume_continues_exactly(&["--synthetic-params", "20000"], Some("sparse"));
}

/// The same with the tiny Llama: parameters, AdamW moments and step, the schedule and the data
/// position all come back from the checkpoint.
#[cfg(feature = "torch")]
#[test]
fn the_tiny_model_resumed_from_a_checkpoint_continues_exactly() {
    resume_continues_exactly(&[], None);
}

fn resume_continues_exactly(model: &[&str], codec: Option<&str>) {
    let ctx = TestContext::new();
    let s = resumable_scenario(&ctx, codec);
    let full = launch_model(&ctx, s.to_str().unwrap(), model);
    assert_eq!(full.steps_with_identical_replicas(), 12);
    // Resume from step 6 in a copy of the checkpoints (the resumed run writes its own).
    let ctx2 = TestContext::new();
    copy_dir(&full.ckpt, &ctx2.path().join("ckpt"));
    let mut args = model.to_vec();
    args.extend_from_slice(&["--resume-step", "6"]);
    let resumed = launch_model(&ctx2, s.to_str().unwrap(), &args);
    resumed.assert_event("start", "n-0", "resumed from checkpoint");
    let key = |r: &Row| (r["outer_step"].parse::<u64>().unwrap(), r["node"].clone());
    let want: BTreeMap<(u64, String), (String, String)> = full
        .rows
        .iter()
        .map(|r| (key(r), (r["weights_hash"].clone(), r["loss"].clone())))
        .collect();
    let got: BTreeMap<(u64, String), (String, String)> = resumed
        .rows
        .iter()
        .map(|r| (key(r), (r["weights_hash"].clone(), r["loss"].clone())))
        .collect();
    assert_eq!(got.keys().map(|(s, _)| *s).min(), Some(6), "the resumed run starts at step 6");
    assert_eq!(got.len(), 12, "6 steps of 2 nodes: {got:?}");
    for (k, v) in &got {
        assert_eq!(Some(v), want.get(k), "step {} of {}", k.0, k.1);
    }
}

/// Two nodes (a ring of two has one order, so the sums are the same run to run), no churn,
/// 12 outer steps, every checkpoint kept.
fn resumable_scenario(ctx: &TestContext, codec: Option<&str>) -> PathBuf {
    let mut text = std::fs::read_to_string(TestContext::repo().join(scenario("leave"))).unwrap();
    if let Some(c) = codec {
        text = text.replace("codec = \"uint8\"", &format!("codec = \"{c}\""));
        assert!(text.contains(&format!("codec = \"{c}\"")));
    }
    let cut = text.find("[[churn]]").unwrap();
    let end = text.find("[stop]").unwrap();
    let text = format!("{}{}", &text[..cut], &text[end..])
        .replace("count = 3", "count = 2")
        .replace("min_members = 3", "min_members = 2")
        .replace("outer_steps = 16", "outer_steps = 12")
        .replace("keep = 2", "keep = 20");
    let path = ctx.path().join("resume.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

/// Peers that must not get in, while a run with a secret trains: one speaking an older protocol
/// version, one guessing the run's secret, one whose first handshake message is right (a
/// recording) but that cannot write this connection's records, and a member (the run's secret
/// and its own key) claiming another member's id or the coordinator's, or holding a key the
/// roster does not have. Each is refused or cut off and logged; the run goes on untouched.
#[test]
fn strangers_old_versions_and_forged_handshakes_are_refused_and_the_run_goes_on() {
    use loco_core::ids::NodeId;
    use loco_real::identity::{NodeKey, Roster};
    use loco_real::tcp::{HELLO_REPLY_LEN, HelloStatus, PROTOCOL_VERSION, hello, hello_keyed};
    use std::io::{Read, Write};
    let _turn = one_real_run_at_a_time();
    let ctx = TestContext::new();
    let out = ctx.path().join("run");
    let secret = b"5d0b8e2f7a1c94e63b0d5f8a2c7e1b94";
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_loco"))
        .args(["launch", &scenario("leave"), "--synthetic-params", "20000", "--timeout", "120"])
        .arg("--out")
        .arg(&out)
        .arg("--checkpoint-dir")
        .arg(ctx.path().join("ckpt"))
        .current_dir(TestContext::repo())
        .env("LOCO_SECRET", std::str::from_utf8(secret).unwrap())
        .env_remove("LOCO_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let addr_file = out.join("nodes").join("coordinator.addr");
    let mut waited = 0;
    let addr: std::net::SocketAddr = loop {
        if let Some(a) =
            std::fs::read_to_string(&addr_file).ok().and_then(|t| t.trim().parse().ok())
        {
            break a;
        }
        waited += 1;
        assert!(waited < 300, "the coordinator did not start");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let knock = |h: Vec<u8>| -> (std::net::TcpStream, u8) {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
        s.write_all(&h).unwrap();
        let mut reply = [0u8; HELLO_REPLY_LEN];
        s.read_exact(&mut reply).unwrap();
        (s, reply[0])
    };
    let stranger = NodeId(77);
    let (_, old) = knock(hello(PROTOCOL_VERSION - 1, stranger, 0, Some(secret)));
    assert_eq!(old, HelloStatus::BadVersion as u8);
    // The launch made every process a key, and the roster (public) says whose is whose; the
    // member n-0's key is the attacker's.
    let keys = out.join("nodes").join("keys");
    let member = NodeKey::load(&keys.join("n-0.key")).unwrap();
    let roster = Roster::load(&keys.join("roster.toml"), |n| match n {
        "coordinator" => Some(NodeId::COORDINATOR),
        n => n.strip_prefix("n-").and_then(|i| i.parse().ok()).map(NodeId),
    })
    .unwrap();
    let coordinator = *roster.key(NodeId::COORDINATOR).unwrap();
    let (_, unknown) = knock(hello_keyed(NodeId(0), 0, b"a guess", &member, &coordinator));
    assert_eq!(unknown, HelloStatus::BadSecret as u8);
    for claimed in [NodeId(1), NodeId::COORDINATOR] {
        let (_, as_other) = knock(hello_keyed(claimed, 0, secret, &member, &coordinator));
        assert_eq!(as_other, HelloStatus::BadIdentity as u8, "n-0's key claiming {claimed}");
    }
    let stray = NodeKey::generate();
    let (_, unknown_key) = knock(hello_keyed(NodeId(0), 0, secret, &stray, &coordinator));
    assert_eq!(unknown_key, HelloStatus::BadIdentity as u8);
    let (_, keyless) = knock(hello(PROTOCOL_VERSION, NodeId(0), 0, Some(secret)));
    assert_eq!(keyless, HelloStatus::BadIdentity as u8);
    // A first Noise message under the secret and n-0's own key, then a record that is not this
    // handshake's.
    let (mut s, ok) = knock(hello_keyed(NodeId(0), 0, secret, &member, &coordinator));
    assert_eq!(ok, HelloStatus::Ok as u8);
    let mut forged = vec![64, 0];
    forged.extend_from_slice(&[0xA5; 64]);
    s.write_all(&forged).unwrap();
    let mut rest = Vec::new();
    // The acceptor's second Noise message, then the close (a timeout would be an error here).
    let closed = s.read_to_end(&mut rest);
    assert!(
        closed.is_ok()
            || closed.as_ref().is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "the forged connection is closed: {closed:?}"
    );
    let o = child.wait_with_output().unwrap();
    let err = stderr(&o);
    assert!(o.status.success(), "stdout: {}\nstderr: {err}", stdout(&o));
    let old_version = format!("speaks protocol version {}", PROTOCOL_VERSION - 1);
    for needle in [
        old_version.as_str(),
        "does not know the run secret",
        "did not confirm",
        "with n0's key",
        "claimed to be n1",
        "claimed to be coordinator",
        "a key no node of the roster has",
        "runs without a node key",
    ] {
        assert!(err.contains(needle), "no {needle:?} in the log:\n{err}");
    }
    let r = Run::read(out, ctx.path().join("ckpt"));
    assert_eq!(r.steps_with_identical_replicas(), 16);
}

/// Bad scenario files stop `loco launch` before any process starts: exit 2, the file, the line
/// and column, the field and what was expected; no run directory.
#[test]
fn bad_scenario_files_are_refused_before_anything_starts() {
    let ctx = TestContext::new();
    let good = std::fs::read_to_string(TestContext::repo().join(scenario("leave"))).unwrap();
    let cases: [(&str, &str, &str, &[&str]); 5] = [
        ("wrong type", "heartbeat = \"200ms\"", "heartbeat = 200", &["mesh.heartbeat", "expected"]),
        (
            "unknown field",
            "[real]\n",
            "[real]\ncheckpoint_evry = 2\n",
            &["checkpoint_evry", "unknown field"],
        ),
        ("impossible count", "count = 3", "count = 0", &["nodes[0].count", "expected"]),
        (
            "unknown phase",
            "kind = \"leave\"",
            "kind = \"crash\"\nduring = \"lunch\"",
            &["churn[0].during", "\"lunch\""],
        ),
        (
            "impossible churn",
            "node = \"n-1\"",
            "node = \"n-9\"",
            &["churn[0].node", "unknown node \"n-9\""],
        ),
    ];
    for (what, from, to, needles) in cases {
        assert!(good.contains(from), "{what}: {from:?} not in the scenario");
        let path = ctx.path().join("bad.toml");
        std::fs::write(&path, good.replacen(from, to, 1)).unwrap();
        let out = ctx.path().join("run");
        let o = ctx.loco(&[
            "launch",
            path.to_str().unwrap(),
            "--synthetic-params",
            "100",
            "--out",
            out.to_str().unwrap(),
        ]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{what}: {err}");
        assert!(err.contains("bad.toml:"), "{what}: no file:line:col in {err}");
        for n in needles {
            assert!(err.contains(n), "{what}: no {n:?} in {err}");
        }
        assert!(!out.exists(), "{what}: a run directory for a run that did not start");
    }
}
