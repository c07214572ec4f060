//! `loco launch`: real processes on loopback, from a scenario file.

use crate::common::{TestContext, one_real_run_at_a_time, stderr, stdout};
use std::collections::BTreeMap;

fn csv_rows(path: &std::path::Path) -> Vec<BTreeMap<String, String>> {
    let text = std::fs::read_to_string(path).expect("csv");
    let mut lines = text.lines();
    let header: Vec<String> = lines.next().unwrap().split(',').map(str::to_string).collect();
    lines.map(|l| header.iter().cloned().zip(l.split(',').map(str::to_string)).collect()).collect()
}

/// `s` without its terminal colour sequences (`ESC [ ... m`).
#[cfg(feature = "torch")]
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn hashes_agree(rows: &[BTreeMap<String, String>]) -> usize {
    let mut by_step: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for r in rows {
        by_step
            .entry(r["outer_step"].parse().unwrap())
            .or_default()
            .push(r["weights_hash"].clone());
    }
    for (step, hs) in &by_step {
        assert!(hs.iter().all(|h| h == &hs[0] && !h.is_empty()), "step {step}: {hs:?}");
    }
    by_step.len()
}

/// The protocol end to end without libtorch: a synthetic objective, the same churn.
#[test]
fn launch_with_a_synthetic_model_survives_the_crash_and_the_join() {
    let _turn = one_real_run_at_a_time();
    let ctx = TestContext::new();
    let out = ctx.path().join("run");
    let o = ctx.loco(&[
        "launch",
        "scenarios/tiny-real.toml",
        "--synthetic-params",
        "20000",
        "--out",
        out.to_str().unwrap(),
        "--timeout",
        "120",
    ]);
    assert!(o.status.success(), "stdout: {}\nstderr: {}", stdout(&o), stderr(&o));
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["backend"], "real");
    assert_eq!(summary["invariants"]["ok"], true);
    let rows = csv_rows(&out.join("outer_steps.csv"));
    assert!(hashes_agree(&rows) >= 10);
    assert!(out.join("report.html").exists());
}

/// reference.md's real test: workers train the tiny model with DiLoCo (uint8); one is killed
/// (SIGKILL) and a new one joins by live recovery; after every outer step the workers' outer
/// weights are bit-identical, and the loss goes down.
#[cfg(feature = "torch")]
#[test]
fn launch_trains_the_tiny_model_across_processes_with_a_crash_and_a_join() {
    let _turn = one_real_run_at_a_time();
    let ctx = TestContext::new();
    let out = ctx.path().join("run");
    let o = ctx.loco(&[
        "launch",
        "scenarios/tiny-real.toml",
        "--out",
        out.to_str().unwrap(),
        "--timeout",
        "300",
    ]);
    assert!(o.status.success(), "stdout: {}\nstderr: {}", stdout(&o), stderr(&o));
    let rows = csv_rows(&out.join("outer_steps.csv"));
    let steps = hashes_agree(&rows);
    assert_eq!(steps, 40);
    let nodes: std::collections::BTreeSet<&str> = rows.iter().map(|r| r["node"].as_str()).collect();
    assert!(nodes.contains("late") && nodes.contains("n-0") && nodes.contains("n-1"), "{nodes:?}");
    let loss = |step: u64| -> f64 {
        let r = rows
            .iter()
            .find(|r| r["outer_step"] == step.to_string() && r["node"] == "n-0")
            .unwrap();
        r["loss"].parse().unwrap()
    };
    assert!(loss(39) < loss(0) - 1.0, "loss {} -> {}", loss(0), loss(39));
    let events = std::fs::read_to_string(out.join("events.csv")).unwrap();
    for kind in [",crash,n-1,", ",evict,n-1,", ",recovery-done,late,"] {
        assert!(events.contains(kind), "no {kind} in events:\n{events}");
    }
}

/// Nodes of two devices: each worker trains the tiny model sharded over two CPU devices (the
/// code path of a node of G GPUs) and runs a ring per shard; through a crash and a join by live
/// recovery the replicas stay bit-identical after every outer step, and the loss goes down.
#[cfg(feature = "torch")]
#[test]
fn launch_trains_nodes_of_two_sharded_devices_through_a_crash_and_a_join() {
    let _turn = one_real_run_at_a_time();
    let ctx = TestContext::new();
    let out = ctx.path().join("run");
    // The workers' logs (on the launcher's stderr) say what each trains on.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_loco"))
        .args(["launch", "scenarios/tiny-real-2gpu.toml", "--timeout", "300", "--out"])
        .arg(&out)
        .current_dir(TestContext::repo())
        .env("LOCO_LOG", "loco::real_cmd=info")
        .env("NO_COLOR", "1")
        .output()
        .expect("run loco");
    assert!(o.status.success(), "stdout: {}\nstderr: {}", stdout(&o), stderr(&o));
    let rows = csv_rows(&out.join("outer_steps.csv"));
    assert_eq!(hashes_agree(&rows), 20);
    let loss = |step: &str| -> f64 {
        let r = rows.iter().find(|r| r["outer_step"] == step && r["node"] == "n-0").unwrap();
        r["loss"].parse().unwrap()
    };
    assert!(loss("19") < loss("0") - 0.5, "loss {} -> {}", loss("0"), loss("19"));
    // The sharded nodes evaluate the global weights: the same held-out loss on every node of a
    // step, falling.
    let eval = |step: &str| -> Vec<f64> {
        let at = rows.iter().filter(|r| r["outer_step"] == step && !r["eval_loss"].is_empty());
        at.map(|r| r["eval_loss"].parse().unwrap()).collect()
    };
    for step in ["0", "5", "10", "15"] {
        let e = eval(step);
        assert!(!e.is_empty() && e.iter().all(|x| x == &e[0]), "step {step}: {e:?}");
    }
    assert!(eval("15")[0] < eval("0")[0] - 0.5, "held-out {:?} -> {:?}", eval("0"), eval("15"));
    assert!(rows.iter().any(|r| r["node"] == "late"), "the joiner trains");
    let events = std::fs::read_to_string(out.join("events.csv")).unwrap();
    for kind in [",crash,n-1,", ",evict,n-1,", ",recovery-done,late,"] {
        assert!(events.contains(kind), "no {kind} in events:\n{events}");
    }
    // Each of the three workers said it trains on two devices.
    let ready: Vec<String> =
        stderr(&o).lines().filter(|l| l.contains("model ready")).map(strip_ansi).collect();
    assert_eq!(ready.len(), 3, "{ready:?}");
    assert!(ready.iter().all(|l| l.contains("devices=2")), "{ready:?}");
}

/// A model that cannot fit this machine stops before anything starts, with the memory plan.
#[test]
fn launch_refuses_a_model_that_does_not_fit_with_its_memory_plan() {
    let ctx = TestContext::new();
    let out = ctx.path().join("run");
    let o =
        ctx.loco(&["launch", "scenarios/intellect1-global.toml", "--out", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    for needle in ["nothing was started", "GiB", "AdamW state", "outer momentum"] {
        assert!(err.contains(needle), "no {needle:?} in: {err}");
    }
    assert!(!out.exists(), "no output directory for a run that did not start");
}

/// A coordinator or worker that would listen beyond loopback without a run secret refuses to
/// start (exit 2), and says how to give one; with the secret it gets past that check.
#[test]
fn a_process_listening_beyond_loopback_without_a_secret_refuses_to_start() {
    // An address of the benchmarking range that nothing here assigns: binding it fails.
    let listen = "198.19.255.254:0";
    let command = |args: &[&str], secret: Option<&str>| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_loco"));
        c.args(args).current_dir(TestContext::repo()).env_remove("LOCO_LOG");
        match secret {
            Some(k) => c.env("LOCO_SECRET", k),
            None => c.env_remove("LOCO_SECRET"),
        };
        c
    };
    let worker =
        ["worker", "scenarios/small.toml", "--id", "0", "--coordinator", "127.0.0.1:9", "--listen"];
    let coordinator = ["coordinator", "scenarios/small.toml", "--listen"];
    for args in [&worker[..], &coordinator[..]] {
        let args = [args, &[listen]].concat();
        let o = command(&args, None).output().expect("run loco");
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        let err = stderr(&o);
        for needle in ["scenarios/small.toml", listen, "without a run secret", "LOCO_SECRET"] {
            assert!(err.contains(needle), "no {needle:?} in: {err}");
        }
    }
    // A weak secret is refused the same way, saying why.
    let o = command(&[&worker[..], &[listen]].concat(), Some("a run secret")).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("weak run secret"), "{}", stderr(&o));
    // A strong secret without a roster: refused too, saying how to make keys.
    let strong = Some("q8Zr2LmX0vYp4TnW7sKd1A");
    for args in [&worker[..], &coordinator[..]] {
        let o = command(&[args, &[listen]].concat(), strong).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        for needle in ["without a roster", "loco keygen", "--key"] {
            assert!(stderr(&o).contains(needle), "no {needle:?} in: {}", stderr(&o));
        }
    }
    // Keys made with `loco keygen` and their lines gathered into a roster.
    let ctx = TestContext::new();
    let mut lines = String::from("[keys]\n");
    for name in ["coordinator", "n-0"] {
        let file = ctx.path().join(format!("{name}.key"));
        let o =
            command(&["keygen", file.to_str().unwrap(), "--name", name], None).output().unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        lines.push_str(&String::from_utf8_lossy(&o.stdout));
        // Never over an existing key.
        let again = command(&["keygen", file.to_str().unwrap()], None).output().unwrap();
        assert_eq!(again.status.code(), Some(2), "{}", stderr(&again));
        assert!(stderr(&again).contains("exists already"), "{}", stderr(&again));
    }
    let roster = ctx.path().join("roster.toml");
    std::fs::write(&roster, &lines).unwrap();
    let key = |name: &str| ctx.path().join(format!("{name}.key")).to_str().unwrap().to_string();
    let roster = roster.to_str().unwrap().to_string();
    // The coordinator's key given as a worker's: refused, naming the roster.
    let wrong = ["--key", &key("coordinator"), "--roster", &roster, "--listen", listen];
    let o = command(&[&worker[..6], &wrong].concat(), strong).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("roster gives this node the key"), "{}", stderr(&o));
    // With a strong secret, its key and the roster, the worker gets past the checks (and fails
    // to bind the address instead).
    let right = ["--key", &key("n-0"), "--roster", &roster, "--listen", listen];
    let mut child = command(&[&worker[..6], &right].concat(), strong)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run loco");
    for _ in 0..200 {
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = child.kill();
    let o = child.wait_with_output().expect("wait");
    for refusal in ["without a run secret", "without a roster", "roster gives"] {
        assert!(!stderr(&o).contains(refusal), "{}", stderr(&o));
    }
}
