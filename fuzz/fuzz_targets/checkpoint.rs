//! The checkpoint loader on a checkpoint's two files (the safetensors file and meta.json):
//! byte edits of a genuine checkpoint, or any bytes at all. An error or a checkpoint, never a
//! panic, and nothing allocated beyond what the files hold; a checkpoint that loads after edits
//! has every tensor's digest right (so it is the genuine one, or edits that kept it whole).
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use loco_real::checkpoint::{CheckpointConfig, Checkpointer, Snapshot, load_bytes, step_dir_name};
use std::path::{Path, PathBuf};

struct Pristine {
    dir: PathBuf,
    meta: Vec<u8>,
    model: Vec<u8>,
}

fn pristine() -> &'static Pristine {
    static P: std::sync::OnceLock<Pristine> = std::sync::OnceLock::new();
    P.get_or_init(|| {
        let root =
            std::env::temp_dir().join(format!("loco-fuzz-checkpoint-{}", std::process::id()));
        let layout = vec![
            ("embed".to_string(), 24),
            ("layers.0.w".to_string(), 16),
            ("norm".to_string(), 0),
        ];
        let n: usize = layout.iter().map(|(_, k)| k).sum();
        let v = |seed: f32| (0..n).map(|i| i as f32 * seed - 1.0).collect::<Vec<f32>>();
        let snapshot = Snapshot {
            outer_step: 3,
            inner_step: 150,
            data_position: serde_json::json!({"epoch": 1, "offset": 40}),
            layout,
            outer: v(0.5),
            momentum: v(0.25),
            params: v(0.125),
            exp_avg: v(2.0),
            exp_avg_sq: v(4.0),
            residual: v(0.0625),
        };
        let cfg = CheckpointConfig {
            model: None,
            dir: root.clone(),
            scenario: "fuzz".into(),
            node: "node-a".into(),
            keep: 1,
            remote: None,
        };
        let mut ck = Checkpointer::new(cfg).expect("a checkpointer");
        ck.save(snapshot).expect("saved");
        let saved = ck.flush().expect("flushed").expect("a checkpoint").path;
        let read = |f: &str| std::fs::read(saved.join(f)).expect("readable");
        let p = Pristine {
            dir: Path::new("node-a").join(step_dir_name(3)),
            meta: read(loco_real::checkpoint::META_FILE),
            model: read(loco_real::checkpoint::MODEL_FILE),
        };
        let _ = std::fs::remove_dir_all(&root);
        assert!(load_bytes(&p.dir, &p.meta, &p.model).is_ok(), "the pristine checkpoint loads");
        p
    })
}

#[derive(Arbitrary, Debug)]
struct Edit {
    meta: bool,
    at: u32,
    byte: u8,
    op: u8,
}

#[derive(Arbitrary, Debug)]
enum Input {
    Edits(Vec<Edit>),
    Raw { meta: Vec<u8>, model: Vec<u8> },
}

fuzz_target!(|input: Input| {
    let p = pristine();
    let (meta, model) = match input {
        Input::Edits(edits) => {
            let (mut meta, mut model) = (p.meta.clone(), p.model.clone());
            for e in edits.into_iter().take(16) {
                let b = if e.meta { &mut meta } else { &mut model };
                if b.is_empty() {
                    continue;
                }
                let i = e.at as usize % b.len();
                match e.op % 3 {
                    0 => b[i] = e.byte,
                    1 => b.insert(i, e.byte),
                    _ => {
                        b.remove(i);
                    }
                }
            }
            (meta, model)
        }
        Input::Raw { meta, model } => (meta, model),
    };
    if let Ok(ck) = load_bytes(&p.dir, &meta, &model) {
        // Every tensor's digest was checked against meta.json; the model bytes that loaded
        // hold each buffer whole.
        let n: usize = ck.snapshot.layout.iter().map(|(_, k)| k).sum();
        assert!(ck.snapshot.outer.len() == n || ck.snapshot.outer.is_empty());
    }
});
