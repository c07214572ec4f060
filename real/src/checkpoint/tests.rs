use super::*;
use std::sync::{Arc, Condvar, Mutex};

fn snapshot(n: usize, step: u64) -> Snapshot {
    let layout = vec![("a".to_string(), n / 2), ("b".to_string(), n - n / 2)];
    let v: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 + step as f32).collect();
    Snapshot {
        outer_step: step,
        inner_step: step * 10,
        data_position: serde_json::json!({"epoch": 0, "offset": step}),
        layout,
        outer: v.clone(),
        momentum: v.clone(),
        params: v.clone(),
        exp_avg: v.clone(),
        exp_avg_sq: v.clone(),
        residual: v,
    }
}

#[test]
fn step_dir_names_round_trip_and_tmp_names_are_not_steps() {
    assert_eq!(step_dir_name(7), "step-00000007");
    assert_eq!(parse_step_dir("step-00000007"), Some(7));
    assert_eq!(parse_step_dir(&step_dir_name(123_456_789_012)), Some(123_456_789_012));
    for bad in [
        "step-",
        "step-00000007.tmp-3",
        "step-7x",
        "step--1",
        "steps-1",
        "step-00000007.tmp-deleted",
    ] {
        assert_eq!(parse_step_dir(bad), None, "{bad}");
    }
}

/// Saving is asynchronous: with the writer held at the gate, `save` has returned, the save is
/// in flight, and no checkpoint exists; opening the gate lets it complete. No timing involved.
#[test]
fn save_returns_before_the_write_completes() {
    let root = tempfile::tempdir().unwrap();
    let cfg = CheckpointConfig {
        model: None,
        dir: root.path().to_path_buf(),
        scenario: "s".into(),
        node: "n0".into(),
        keep: 2,
        remote: None,
    };
    let mut ck = Checkpointer::new(cfg).unwrap();
    let gate: Gate = Arc::new((Mutex::new(false), Condvar::new()));
    ck.gate = Some(gate.clone());
    let ticket = ck.save(snapshot(1 << 20, 3)).unwrap();
    assert!(!ticket.waited);
    assert!(ticket.previous.is_none());
    assert!(ck.in_flight());
    assert!(ck.poll().is_none());
    assert!(list(root.path(), "n0").unwrap().is_empty());
    assert!(latest(root.path(), "n0").unwrap().is_none());
    {
        let (lock, cv) = &*gate;
        *lock.lock().unwrap() = true;
        cv.notify_all();
    }
    let saved = ck.wait().unwrap().unwrap();
    assert_eq!(saved.outer_step, 3);
    assert!(!ck.in_flight());
    assert!(ck.wait().is_none());
    let loaded = latest(root.path(), "n0").unwrap().unwrap();
    assert_eq!(loaded.meta.outer_step, 3);
    assert_eq!(loaded.snapshot.params.len(), 1 << 20);
}

#[test]
fn bad_configs_are_rejected() {
    let base = CheckpointConfig {
        model: None,
        dir: PathBuf::from("/nonexistent-ckpt"),
        scenario: "s".into(),
        node: "n".into(),
        keep: 1,
        remote: None,
    };
    for node in ["", ".", "..", "a/b", "a.tmp-1"] {
        let cfg = CheckpointConfig { node: node.into(), ..base.clone() };
        assert!(
            matches!(cfg.validate(), Err(CheckpointError::Config { field: "node", .. })),
            "{node:?}"
        );
    }
    let cfg = CheckpointConfig { keep: 0, ..base.clone() };
    assert!(matches!(cfg.validate(), Err(CheckpointError::Config { field: "keep", .. })));
    let cfg = CheckpointConfig { remote: Some(base.dir.clone()), ..base.clone() };
    assert!(matches!(cfg.validate(), Err(CheckpointError::Config { field: "remote", .. })));
    assert!(base.validate().is_ok());
}
