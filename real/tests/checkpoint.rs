//! Checkpoints: bit-exact round trips, digests, crash leftovers, keep-last-k, the remote copy,
//! broken files. No libtorch. (reference.md test case 15: the hashes at save equal those at load.)
//! The asynchrony test (save returns before the write completes) is a unit test in
//! real/src/checkpoint.rs, where the writer can be held at a gate instead of timed.

use loco_real::checkpoint::{
    Buffer, CheckpointConfig, CheckpointError, Checkpointer, LoadedCheckpoint, META_FILE,
    MODEL_FILE, Snapshot, latest, list, load, step_dir_name,
};
use loco_real::data::DataPosition;
use loco_real::train::TrainerState;
use std::fs;
use std::path::{Path, PathBuf};

/// Deterministic values covering every class of finite bit pattern: -0.0, subnormals, the
/// extremes, random bits elsewhere (a pattern that would be a NaN or an infinity has its
/// exponent's top bit cleared: a checkpoint holds finite values only).
fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9) | 1;
    let mut v: Vec<f32> = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let f = f32::from_bits(x);
            if f.is_finite() { f } else { f32::from_bits(x & !0x4000_0000) }
        })
        .collect();
    let special = [-0.0, f32::from_bits(1), f32::MAX, f32::MIN, f32::MIN_POSITIVE, 0.0];
    for (slot, s) in v.iter_mut().zip(special) {
        *slot = s;
    }
    v
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn layout() -> Vec<(String, usize)> {
    vec![
        ("embed".to_string(), 96),
        ("layers.0.w".to_string(), 64),
        ("layers.0.empty".to_string(), 0),
        ("norm".to_string(), 8),
    ]
}

fn snapshot(step: u64) -> Snapshot {
    let n = layout().iter().map(|(_, k)| k).sum();
    let pos = DataPosition { epoch: 1, offset: 40 + step };
    Snapshot {
        outer_step: step,
        inner_step: step * 50 + 3,
        data_position: serde_json::to_value(pos).unwrap(),
        layout: layout(),
        outer: values(n, 1 + step as u32),
        momentum: values(n, 100 + step as u32),
        params: values(n, 200 + step as u32),
        exp_avg: values(n, 300 + step as u32),
        exp_avg_sq: values(n, 400 + step as u32),
        residual: values(n, 500 + step as u32),
    }
}

fn config(root: &Path, keep: usize, remote: Option<PathBuf>) -> CheckpointConfig {
    CheckpointConfig {
        model: None,
        dir: root.to_path_buf(),
        scenario: "unit".to_string(),
        node: "node-a".to_string(),
        keep,
        remote,
    }
}

fn assert_same(got: &Snapshot, want: &Snapshot) {
    assert_eq!(got.outer_step, want.outer_step);
    assert_eq!(got.inner_step, want.inner_step);
    assert_eq!(got.data_position, want.data_position);
    assert_eq!(got.layout, want.layout);
    for b in Buffer::ALL {
        assert_eq!(bits(got.buffer(b)), bits(want.buffer(b)), "buffer {}", b.name());
    }
}

/// Saves and waits, asserting success without problems.
fn save_now(ck: &mut Checkpointer, s: Snapshot) -> PathBuf {
    ck.save(s).unwrap();
    ck.flush().unwrap().unwrap().path
}

fn steps(root: &Path) -> Vec<u64> {
    list(root, "node-a").unwrap().into_iter().map(|(s, _)| s).collect()
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    v.sort();
    v
}

#[test]
fn save_then_load_is_bit_exact_with_its_metadata() {
    let root = tempfile::tempdir().unwrap();
    let mut ck = Checkpointer::new(config(root.path(), 3, None)).unwrap();
    let s = snapshot(7);
    let ticket = ck.save(s.clone()).unwrap();
    assert!(ticket.previous.is_none());
    let saved = ck.flush().unwrap().unwrap();
    assert_eq!(saved.path, root.path().join("node-a").join("step-00000007"));
    assert_eq!(saved.counter, ticket.counter);
    assert!(saved.remote.is_none() && saved.removed.is_empty() && saved.problems.is_empty());
    assert_eq!(names(&saved.path), [META_FILE, MODEL_FILE]);
    let model_len = fs::metadata(saved.path.join(MODEL_FILE)).unwrap().len();
    assert!(model_len > 5 * 168 * 4, "{model_len}");
    assert_eq!(saved.bytes, model_len + fs::metadata(saved.path.join(META_FILE)).unwrap().len());

    let loaded: LoadedCheckpoint = latest(root.path(), "node-a").unwrap().unwrap();
    assert_eq!(loaded.path, saved.path);
    assert_same(&loaded.snapshot, &s);
    let m = &loaded.meta;
    assert_eq!((m.format.as_str(), m.format_version), ("loco-checkpoint", 1));
    assert_eq!((m.scenario.as_str(), m.node.as_str()), ("unit", "node-a"));
    assert_eq!((m.outer_step, m.inner_step, m.counter), (7, 353, ticket.counter));
    assert_eq!(m.layout, layout());
    assert_eq!(m.buffers, Buffer::ALL.to_vec());
    // Test case 15: the digests recorded at save are those of the state, and verified at load.
    assert_eq!(m.digests, s.digests());
    assert_eq!(m.digests.len(), 6 * 4);
    assert!(m.digests.values().all(|d| d.to_string().len() == 64));
    let pos: DataPosition = serde_json::from_value(m.data_position.clone()).unwrap();
    assert_eq!(pos, DataPosition { epoch: 1, offset: 47 });
    assert_eq!(load(&saved.path).unwrap().meta, loaded.meta);
    // The tensor file is ordinary safetensors with the model's names.
    let bytes = fs::read(saved.path.join(MODEL_FILE)).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor("outer/layers.0.w").unwrap();
    assert_eq!((t.dtype(), t.shape()), (safetensors::Dtype::F32, &[64][..]));
    assert_eq!(&t.data()[..4], &s.outer[96].to_le_bytes());
}

#[test]
fn the_same_snapshot_gives_the_same_tensor_file() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let pa = save_now(&mut Checkpointer::new(config(a.path(), 1, None)).unwrap(), snapshot(2));
    let pb = save_now(&mut Checkpointer::new(config(b.path(), 1, None)).unwrap(), snapshot(2));
    assert_eq!(fs::read(pa.join(MODEL_FILE)).unwrap(), fs::read(pb.join(MODEL_FILE)).unwrap());
    assert_eq!(fs::read(pa.join(META_FILE)).unwrap(), fs::read(pb.join(META_FILE)).unwrap());
}

#[test]
fn absent_buffers_round_trip_empty() {
    let root = tempfile::tempdir().unwrap();
    let mut ck = Checkpointer::new(config(root.path(), 1, None)).unwrap();
    // Error feedback off: no residual either.
    let s = Snapshot {
        exp_avg: Vec::new(),
        exp_avg_sq: Vec::new(),
        residual: Vec::new(),
        ..snapshot(1)
    };
    save_now(&mut ck, s.clone());
    let loaded = latest(root.path(), "node-a").unwrap().unwrap();
    assert_eq!(loaded.meta.buffers, [Buffer::Outer, Buffer::Momentum, Buffer::Params]);
    assert_eq!(loaded.meta.digests.len(), 3 * 4);
    assert!(loaded.snapshot.exp_avg.is_empty() && loaded.snapshot.exp_avg_sq.is_empty());
    assert!(loaded.snapshot.residual.is_empty());
    assert_same(&loaded.snapshot, &s);
}

#[test]
fn trainer_state_round_trips_through_a_checkpoint() {
    let root = tempfile::tempdir().unwrap();
    let n = 168;
    let finite =
        |seed: u32| -> Vec<f32> { (0..n).map(|i| (i as f32 + seed as f32) * 0.25).collect() };
    let st = TrainerState {
        step: 321,
        layout: layout(),
        params: finite(1),
        exp_avg: finite(2),
        exp_avg_sq: finite(3),
    };
    let s = Snapshot::from_trainer(
        4,
        serde_json::json!({"epoch": 0, "offset": 9}),
        finite(4),
        finite(5),
        st.clone(),
    );
    assert_eq!(s.inner_step, 321);
    save_now(&mut Checkpointer::new(config(root.path(), 1, None)).unwrap(), s);
    let loaded = latest(root.path(), "node-a").unwrap().unwrap();
    let back = loaded.snapshot.trainer_state();
    assert_eq!(back, st);
    assert_eq!(back.fingerprint(), st.fingerprint());
    assert_eq!(bits(&loaded.snapshot.outer), bits(&finite(4)));
}

fn flip(path: &Path, at: usize) {
    let mut bytes = fs::read(path).unwrap();
    bytes[at] ^= 0x01;
    fs::write(path, bytes).unwrap();
}

#[test]
fn digests_detect_a_flipped_byte_and_name_the_tensor() {
    let root = tempfile::tempdir().unwrap();
    let dir = save_now(&mut Checkpointer::new(config(root.path(), 1, None)).unwrap(), snapshot(3));
    let model = dir.join(MODEL_FILE);
    let pristine = fs::read(&model).unwrap();
    let (header, meta) = safetensors::SafeTensors::read_metadata(&pristine).unwrap();
    for tensor in ["momentum/layers.0.w", "params/norm", "outer/embed"] {
        fs::write(&model, &pristine).unwrap();
        let (start, end) = meta.info(tensor).unwrap().data_offsets;
        flip(&model, 8 + header + (start + end) / 2);
        let err = load(&dir).unwrap_err();
        let CheckpointError::Digest { path, tensor: named, expected, got } = &err else {
            panic!("expected a digest error, got {err}")
        };
        assert_eq!((path, named.as_str()), (&model, tensor));
        assert_ne!(expected, got);
        let msg = err.to_string();
        assert!(msg.contains("model.safetensors") && msg.contains(tensor), "{msg}");
        assert!(msg.contains(&expected.to_string()) && msg.contains(&got.to_string()), "{msg}");
        assert!(
            latest(root.path(), "node-a").is_err(),
            "latest does not hide a damaged checkpoint"
        );
    }
    fs::write(&model, &pristine).unwrap();
    assert!(load(&dir).is_ok());
    // A digest edited in meta.json is caught the same way.
    let meta_path = dir.join(META_FILE);
    let mut m: serde_json::Value = serde_json::from_slice(&fs::read(&meta_path).unwrap()).unwrap();
    m["digests"]["exp_avg/norm"] = serde_json::Value::String("0".repeat(64));
    fs::write(&meta_path, serde_json::to_vec(&m).unwrap()).unwrap();
    assert!(
        matches!(load(&dir), Err(CheckpointError::Digest { tensor, expected, .. }) if tensor == "exp_avg/norm" && expected.to_string() == "0".repeat(64))
    );
}

#[test]
fn truncated_or_garbage_files_are_errors_not_panics() {
    let root = tempfile::tempdir().unwrap();
    let dir = save_now(&mut Checkpointer::new(config(root.path(), 1, None)).unwrap(), snapshot(5));
    let model = dir.join(MODEL_FILE);
    let pristine = fs::read(&model).unwrap();
    let header = u64::from_le_bytes(pristine[..8].try_into().unwrap()) as usize;
    let cuts = [
        0,
        3,
        8,
        9,
        8 + header / 2,
        8 + header,
        8 + header + 1,
        pristine.len() / 2,
        pristine.len() - 1,
    ];
    for cut in cuts {
        fs::write(&model, &pristine[..cut]).unwrap();
        let err = load(&dir).unwrap_err();
        assert!(
            matches!(&err, CheckpointError::SafeTensors { path, .. } if *path == model),
            "cut {cut}: {err}"
        );
        assert!(err.to_string().contains("model.safetensors"), "{err}");
    }
    // Bytes appended, or a header length pointing past the end.
    fs::write(&model, [&pristine[..], &[0u8; 4]].concat()).unwrap();
    assert!(matches!(load(&dir), Err(CheckpointError::SafeTensors { .. })));
    let mut huge = pristine.clone();
    huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    fs::write(&model, &huge).unwrap();
    assert!(matches!(load(&dir), Err(CheckpointError::SafeTensors { .. })));
    fs::remove_file(&model).unwrap();
    assert!(matches!(load(&dir), Err(CheckpointError::Io { path, .. }) if path == model));
    fs::write(&model, &pristine).unwrap();
    assert!(load(&dir).is_ok());

    let meta_path = dir.join(META_FILE);
    let meta_text = fs::read(&meta_path).unwrap();
    fs::write(&meta_path, &meta_text[..meta_text.len() / 2]).unwrap();
    let err = load(&dir).unwrap_err();
    assert!(matches!(&err, CheckpointError::MetaJson { path, .. } if *path == meta_path), "{err}");
    assert!(err.to_string().contains("meta.json"), "{err}");

    let mut m: serde_json::Value = serde_json::from_slice(&meta_text).unwrap();
    m["format_version"] = 99.into();
    fs::write(&meta_path, serde_json::to_vec(&m).unwrap()).unwrap();
    let err = load(&dir).unwrap_err();
    assert!(err.to_string().contains("format version 99"), "{err}");

    let mut m: serde_json::Value = serde_json::from_slice(&meta_text).unwrap();
    m["outer_step"] = 6.into();
    fs::write(&meta_path, serde_json::to_vec(&m).unwrap()).unwrap();
    let err = load(&dir).unwrap_err();
    assert!(
        err.to_string().contains("outer step is 6, but the directory is step-00000005"),
        "{err}"
    );

    // A layout that claims more than the file holds: a clear error, no huge allocation.
    let mut m: serde_json::Value = serde_json::from_slice(&meta_text).unwrap();
    m["layout"][0][1] = (usize::MAX / 8).into();
    fs::write(&meta_path, serde_json::to_vec(&m).unwrap()).unwrap();
    let err = load(&dir).unwrap_err();
    assert!(matches!(&err, CheckpointError::Meta { .. } | CheckpointError::Tensor { .. }), "{err}");
    fs::write(&meta_path, &meta_text).unwrap();
    assert!(load(&dir).is_ok());
}

#[test]
fn a_missing_or_extra_tensor_is_named() {
    let root = tempfile::tempdir().unwrap();
    let dir = save_now(&mut Checkpointer::new(config(root.path(), 1, None)).unwrap(), snapshot(1));
    let model = dir.join(MODEL_FILE);
    let pristine = fs::read(&model).unwrap();
    let st = safetensors::SafeTensors::deserialize(&pristine).unwrap();
    let mut all = st.tensors();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    let without: Vec<_> = all.iter().filter(|(n, _)| n != "exp_avg_sq/embed").cloned().collect();
    fs::write(&model, safetensors::serialize(without, None).unwrap()).unwrap();
    let err = load(&dir).unwrap_err();
    assert!(
        matches!(&err, CheckpointError::Tensor { tensor, what, .. } if tensor == "exp_avg_sq/embed" && what == "missing"),
        "{err}"
    );
    let extra_data = [0u8; 8];
    let extra = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2], &extra_data)
        .unwrap();
    let mut with: Vec<_> = all.clone();
    with.push(("params/ghost".to_string(), extra));
    fs::write(&model, safetensors::serialize(with, None).unwrap()).unwrap();
    let err = load(&dir).unwrap_err();
    assert!(
        matches!(&err, CheckpointError::Tensor { tensor, .. } if tensor == "params/ghost"),
        "{err}"
    );
}

#[test]
fn a_crash_leftover_tmp_directory_is_ignored_then_cleaned() {
    let root = tempfile::tempdir().unwrap();
    let node_dir = root.path().join("node-a");
    let last_counter;
    {
        let mut ck = Checkpointer::new(config(root.path(), 5, None)).unwrap();
        save_now(&mut ck, snapshot(1));
        let p2 = save_now(&mut ck, snapshot(2));
        last_counter = load(&p2).unwrap().meta.counter;
        // A crash while writing step 3: a tmp directory with a half-written tensor file and even a
        // complete-looking meta.json.
        let tmp = node_dir.join("step-00000003.tmp-57");
        fs::create_dir(&tmp).unwrap();
        let model = fs::read(p2.join(MODEL_FILE)).unwrap();
        fs::write(tmp.join(MODEL_FILE), &model[..model.len() / 3]).unwrap();
        fs::copy(p2.join(META_FILE), tmp.join(META_FILE)).unwrap();
        // And one crashed while replacing step 9.
        fs::create_dir(node_dir.join("step-00000009.tmp-replaced-58")).unwrap();
    }
    assert_eq!(steps(root.path()), [1, 2]);
    let loaded = latest(root.path(), "node-a").unwrap().unwrap();
    assert_eq!(loaded.meta.outer_step, 2);
    assert_same(&loaded.snapshot, &snapshot(2));

    // A new checkpointer (the restarted node) removes the leftovers and counts past them.
    let mut ck = Checkpointer::new(config(root.path(), 5, None)).unwrap();
    assert_eq!(names(&node_dir), ["step-00000001", "step-00000002"]);
    let ticket = ck.save(snapshot(3)).unwrap();
    assert!(ticket.counter > 58 && ticket.counter > last_counter, "{}", ticket.counter);
    ck.flush().unwrap();
    assert_eq!(latest(root.path(), "node-a").unwrap().unwrap().meta.counter, ticket.counter);
}

/// A crash between the two renames that replace a step (the old one renamed aside, the new one
/// not yet in place) keeps that step: it is listed and loaded from where it was put aside, and
/// the restarted node's checkpointer puts it back.
#[test]
fn a_crash_between_the_two_renames_of_a_replacement_keeps_the_step() {
    let root = tempfile::tempdir().unwrap();
    let node_dir = root.path().join("node-a");
    {
        let mut ck = Checkpointer::new(config(root.path(), 5, None)).unwrap();
        save_now(&mut ck, snapshot(1));
        let p2 = save_now(&mut ck, snapshot(2));
        let counter = load(&p2).unwrap().meta.counter;
        // Saving step 2 again: the new copy is complete in its tmp directory, the old one has
        // been renamed aside, and then the process dies.
        let new = node_dir.join(format!("step-00000002.tmp-{}", counter + 1));
        fs::create_dir(&new).unwrap();
        for f in [MODEL_FILE, META_FILE] {
            fs::copy(p2.join(f), new.join(f)).unwrap();
        }
        fs::rename(&p2, node_dir.join(format!("step-00000002.tmp-replaced-{}", counter + 1)))
            .unwrap();
    }
    assert_eq!(steps(root.path()), [1, 2]);
    let loaded = latest(root.path(), "node-a").unwrap().unwrap();
    assert_eq!(loaded.meta.outer_step, 2);
    assert_same(&loaded.snapshot, &snapshot(2));

    let mut ck = Checkpointer::new(config(root.path(), 5, None)).unwrap();
    assert_eq!(names(&node_dir), ["step-00000001", "step-00000002"]);
    assert_same(&latest(root.path(), "node-a").unwrap().unwrap().snapshot, &snapshot(2));
    save_now(&mut ck, snapshot(3));
    assert_eq!(steps(root.path()), [1, 2, 3]);
}

/// A state holding a NaN or an infinity is neither written (the older checkpoints stay the
/// newest) nor loaded, and the error names the tensor and the value.
#[test]
fn a_diverged_state_is_neither_saved_nor_loaded() {
    let root = tempfile::tempdir().unwrap();
    let mut ck = Checkpointer::new(config(root.path(), 5, None)).unwrap();
    let good = save_now(&mut ck, snapshot(1));
    let mut bad = snapshot(2);
    bad.params[96 + 4] = f32::NAN;
    ck.save(bad).unwrap();
    let err = ck.flush().unwrap_err();
    let CheckpointError::NotFinite { tensor, index, value, .. } = &err else {
        panic!("expected a not-finite error, got {err}")
    };
    assert_eq!((tensor.as_str(), index), ("params/layers.0.w", &4));
    assert!(value.is_nan());
    assert!(err.to_string().contains("params/layers.0.w"), "{err}");
    assert_eq!(names(&root.path().join("node-a")), ["step-00000001"]);

    // A file whose bytes and digests agree but hold an infinity is refused at load.
    let model = good.join(MODEL_FILE);
    let mut bytes = fs::read(&model).unwrap();
    let (header, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let (start, end) = meta.info("outer/norm").unwrap().data_offsets;
    let at = 8 + header + start + 4 * 3;
    bytes[at..at + 4].copy_from_slice(&f32::NEG_INFINITY.to_le_bytes());
    let digest = blake3::hash(&bytes[8 + header + start..8 + header + end]).to_hex().to_string();
    fs::write(&model, &bytes).unwrap();
    let meta_path = good.join(META_FILE);
    let mut m: serde_json::Value = serde_json::from_slice(&fs::read(&meta_path).unwrap()).unwrap();
    m["digests"]["outer/norm"] = serde_json::Value::String(digest);
    fs::write(&meta_path, serde_json::to_vec(&m).unwrap()).unwrap();
    let err = load(&good).unwrap_err();
    assert!(
        matches!(&err, CheckpointError::NotFinite { tensor, index: 3, value, .. } if tensor == "outer/norm" && *value == f32::NEG_INFINITY),
        "{err}"
    );
}

#[test]
fn keep_last_k_deletes_only_the_oldest() {
    let root = tempfile::tempdir().unwrap();
    let mut ck = Checkpointer::new(config(root.path(), 3, None)).unwrap();
    for step in 1..=6u64 {
        ck.save(snapshot(step)).unwrap();
        let saved = ck.flush().unwrap().unwrap();
        let want: Vec<u64> = (step.saturating_sub(2).max(1)..=step).collect();
        assert_eq!(steps(root.path()), want, "after saving step {step}");
        let removed: Vec<PathBuf> = if step > 3 {
            vec![root.path().join("node-a").join(step_dir_name(step - 3))]
        } else {
            Vec::new()
        };
        assert_eq!(saved.removed, removed);
        // Nothing else is left behind.
        let dirs = names(&root.path().join("node-a"));
        assert_eq!(dirs, want.iter().map(|&s| step_dir_name(s)).collect::<Vec<_>>());
    }
    // The kept ones are intact.
    for (step, path) in list(root.path(), "node-a").unwrap() {
        assert_same(&load(&path).unwrap().snapshot, &snapshot(step));
    }
}

#[test]
fn back_to_back_saves_wait_and_none_is_skipped() {
    let root = tempfile::tempdir().unwrap();
    let mut ck = Checkpointer::new(config(root.path(), 10, None)).unwrap();
    let mut outcomes = Vec::new();
    let mut counters = Vec::new();
    for step in 1..=4u64 {
        let t = ck.save(snapshot(step)).unwrap();
        counters.push(t.counter);
        outcomes.extend(t.previous);
    }
    outcomes.extend(ck.wait());
    assert!(ck.wait().is_none() && ck.poll().is_none() && !ck.in_flight());
    let saved: Vec<u64> = outcomes.into_iter().map(|o| o.unwrap().outer_step).collect();
    assert_eq!(saved, [1, 2, 3, 4]);
    assert_eq!(steps(root.path()), [1, 2, 3, 4]);
    assert!(counters.windows(2).all(|w| w[0] < w[1]), "{counters:?}");
}

#[test]
fn saving_a_step_again_replaces_it() {
    let root = tempfile::tempdir().unwrap();
    let mut ck = Checkpointer::new(config(root.path(), 2, None)).unwrap();
    save_now(&mut ck, snapshot(4));
    let again = Snapshot { inner_step: 999, ..snapshot(4) };
    save_now(&mut ck, again.clone());
    assert_eq!(names(&root.path().join("node-a")), ["step-00000004"]);
    let loaded = latest(root.path(), "node-a").unwrap().unwrap();
    assert_eq!(loaded.meta.inner_step, 999);
    assert_same(&loaded.snapshot, &again);
}

#[test]
fn the_remote_copy_appears_and_verifies() {
    let (root, remote) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut ck =
        Checkpointer::new(config(root.path(), 2, Some(remote.path().to_path_buf()))).unwrap();
    for step in 1..=3u64 {
        ck.save(snapshot(step)).unwrap();
        let saved = ck.flush().unwrap().unwrap();
        let want = remote.path().join("node-a").join(step_dir_name(step));
        assert_eq!(saved.remote.as_ref(), Some(&want));
        let copy = load(&want).unwrap();
        let local = load(&saved.path).unwrap();
        assert_eq!(copy.meta, local.meta);
        assert_same(&copy.snapshot, &snapshot(step));
    }
    assert_eq!(steps(remote.path()), [2, 3]);
    assert_eq!(steps(root.path()), [2, 3]);
    assert_eq!(names(&remote.path().join("node-a")), ["step-00000002", "step-00000003"]);
    let from_remote = latest(remote.path(), "node-a").unwrap().unwrap();
    assert_eq!(from_remote.meta.outer_step, 3);
}

#[test]
fn an_unwritable_remote_is_a_problem_not_a_lost_checkpoint() {
    let root = tempfile::tempdir().unwrap();
    let blocker = root.path().join("not-a-dir");
    fs::write(&blocker, b"file").unwrap();
    let mut ck =
        Checkpointer::new(config(&root.path().join("ck"), 1, Some(blocker.clone()))).unwrap();
    ck.save(snapshot(1)).unwrap();
    let saved = ck.wait().unwrap().unwrap();
    assert!(saved.remote.is_none());
    assert_eq!(saved.problems.len(), 1);
    assert!(saved.problems[0].to_string().contains("not-a-dir"), "{}", saved.problems[0]);
    assert!(latest(&root.path().join("ck"), "node-a").unwrap().is_some());
    ck.save(snapshot(2)).unwrap();
    assert!(ck.flush().is_err(), "flush reports the problem");
}

#[test]
fn an_inconsistent_snapshot_is_refused_at_once() {
    let root = tempfile::tempdir().unwrap();
    let mut ck = Checkpointer::new(config(root.path(), 1, None)).unwrap();
    let mut s = snapshot(1);
    s.momentum.pop();
    let err = ck.save(s).unwrap_err();
    assert!(
        err.to_string().contains("buffer momentum has 167 values, the layout has 168"),
        "{err}"
    );
    let mut s = snapshot(1);
    s.layout[1].0 = "embed".to_string();
    assert!(ck.save(s).unwrap_err().to_string().contains("`embed` appears twice"));
    assert!(!ck.in_flight() && ck.wait().is_none());
    assert!(steps(root.path()).is_empty());
    assert!(latest(root.path(), "node-a").unwrap().is_none());
    assert!(latest(root.path(), "nobody").unwrap().is_none());
    assert!(latest(root.path(), "../x").is_err());
}

#[test]
fn latest_checks_the_node() {
    let root = tempfile::tempdir().unwrap();
    let dir = save_now(&mut Checkpointer::new(config(root.path(), 1, None)).unwrap(), snapshot(1));
    let other = root.path().join("node-b");
    fs::create_dir(&other).unwrap();
    fs::rename(&dir, other.join("step-00000001")).unwrap();
    let err = latest(root.path(), "node-b").unwrap_err();
    assert!(err.to_string().contains("node is \"node-a\", expected \"node-b\""), "{err}");
}

/// Random byte edits of the tensor file and of the metadata: `load` answers a checkpoint or an
/// error, never a panic. More cases: `PROPTEST_CASES=100000 cargo test -p loco-real --release
/// --test checkpoint hostile`.
#[test]
fn hostile_edits_of_either_file_are_errors_not_panics() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    let root = tempfile::tempdir().unwrap();
    let dir = save_now(&mut Checkpointer::new(config(root.path(), 1, None)).unwrap(), snapshot(5));
    let files = [dir.join(MODEL_FILE), dir.join(META_FILE)];
    let pristine: Vec<Vec<u8>> = files.iter().map(|f| fs::read(f).unwrap()).collect();
    let edits =
        prop::collection::vec((0..2usize, any::<prop::sample::Index>(), any::<u8>(), 0..3u8), 1..6);
    let mut runner = TestRunner::new(Config { failure_persistence: None, ..Config::default() });
    runner
        .run(&edits, |edits| {
            let mut bytes = pristine.clone();
            for (f, at, byte, op) in edits {
                let b = &mut bytes[f];
                if b.is_empty() {
                    continue;
                }
                let i = at.index(b.len());
                match op {
                    0 => b[i] = byte,
                    1 => b.insert(i, byte),
                    _ => {
                        b.remove(i);
                    }
                }
            }
            for (f, b) in files.iter().zip(&bytes) {
                fs::write(f, b).unwrap();
            }
            let _ = load(&dir);
            Ok(())
        })
        .unwrap();
    for (f, b) in files.iter().zip(&pristine) {
        fs::write(f, b).unwrap();
    }
    assert!(load(&dir).is_ok());
}

/// A resume starts from a step only where every node's checkpoint holds the same replicated
/// state (outer weights and momentum; the inner state is each node's own): the newest such
/// step, skipping a newer one where one node differs; a step asked for where they differ is
/// refused, naming the nodes by what they hold.
#[test]
fn a_resume_takes_the_newest_step_whose_replicated_state_every_node_shares() {
    use loco_real::launch::{LaunchError, agreed_step};
    let root = tempfile::tempdir().unwrap();
    let nodes: Vec<String> = ["n-0", "n-1", "n-2"].iter().map(|s| s.to_string()).collect();
    for (i, node) in nodes.iter().enumerate() {
        let cfg = CheckpointConfig { node: node.clone(), keep: 4, ..config(root.path(), 4, None) };
        let mut ck = Checkpointer::new(cfg).unwrap();
        for step in [1, 2, 3] {
            let mut s = snapshot(step);
            // Each node's inner state is its own.
            s.params = values(s.params.len(), 900 + i as u32);
            // At step 3, n-2 holds other outer weights (a replica that diverged, or a
            // checkpoint of another run).
            if i == 2 && step == 3 {
                s.outer = values(s.outer.len(), 777);
            }
            save_now(&mut ck, s);
        }
    }
    assert_eq!(agreed_step(root.path(), &nodes, None).unwrap(), 2);
    assert_eq!(agreed_step(root.path(), &nodes, Some(1)).unwrap(), 1);
    let err = agreed_step(root.path(), &nodes, Some(3)).unwrap_err();
    assert!(matches!(err, LaunchError::CheckpointsDiffer { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("step 3: n-0 n-1 | n-2"), "{text}");
    assert!(text.contains("--resume-step"), "{text}");
    // Momentum counts too: with n-1's step 2 changed as well, only step 1 is shared.
    let dir = root.path().join("n-1").join(step_dir_name(2));
    let meta_path = dir.join(META_FILE);
    let mut meta: serde_json::Value =
        serde_json::from_slice(&fs::read(&meta_path).unwrap()).unwrap();
    let digests = meta["digests"].as_object_mut().unwrap();
    let key = digests.keys().find(|k| k.starts_with("momentum/")).unwrap().clone();
    digests.insert(key, serde_json::json!("00".repeat(32)));
    fs::write(&meta_path, serde_json::to_vec_pretty(&meta).unwrap()).unwrap();
    assert_eq!(agreed_step(root.path(), &nodes, None).unwrap(), 1);
    // A node without checkpoints leaves no common step.
    let more = [nodes.clone(), vec!["n-3".to_string()]].concat();
    let err = agreed_step(root.path(), &more, None).unwrap_err();
    assert!(matches!(err, LaunchError::NoCommonCheckpoint { .. }), "{err}");
}
