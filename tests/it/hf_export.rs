//! `loco export --format hf` and `[real] init`: a checkpoint's outer weights as a Hugging Face
//! `LlamaForCausalLM`, the logits Hugging Face's own code computes from it against loco's, and a
//! run that starts from such a directory.

use crate::common::{TestContext, stderr, stdout};
use loco_core::scenario::Preset;
use loco_real::checkpoint::{CheckpointConfig, Checkpointer, Snapshot};
use loco_real::hf;
use std::fs;
use std::path::{Path, PathBuf};

/// Distinct small values, the length of `spec`'s parameters.
fn values(n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-4).collect()
}

/// A checkpoint of node `node-a` under `root` whose outer weights are `outer`, for the tiny model,
/// recording `model` (`None`: a checkpoint written before checkpoints recorded it).
fn tiny_checkpoint(
    root: &Path,
    outer: &[f32],
    model: Option<loco_core::scenario::ModelSpec>,
) -> PathBuf {
    let layout = loco_real::model::param_layout(&Preset::Tiny.spec());
    let mut ck = Checkpointer::new(CheckpointConfig {
        model,
        dir: root.to_path_buf(),
        scenario: "tiny-real".into(),
        node: "node-a".into(),
        keep: 2,
        remote: None,
    })
    .unwrap();
    let snap = Snapshot {
        outer_step: 4,
        inner_step: 40,
        layout,
        outer: outer.to_vec(),
        params: outer.iter().map(|x| x + 1.0).collect(),
        ..Snapshot::default()
    };
    ck.save(snap).unwrap();
    ck.flush().unwrap().unwrap().path
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    v.sort();
    v
}

/// The command without libtorch: a node directory (its newest step) or a step directory, the
/// outer weights exactly, sharding, the tokenizer, and the errors of a wrong invocation.
#[test]
fn export_writes_a_checkpoint_s_outer_weights_as_a_hugging_face_directory() {
    let ctx = TestContext::new();
    let n = Preset::Tiny.spec().param_count() as usize;
    let outer = values(n);
    let step = tiny_checkpoint(&ctx.path().join("ckpt"), &outer, None);
    let node = ctx.path().join("ckpt/node-a");
    let tokenizer = ctx.path().join("tok.json");
    fs::write(&tokenizer, b"{\"model\": {}}").unwrap();
    let out = ctx.path().join("hf");
    let o = ctx.loco(&[
        "export",
        node.to_str().unwrap(),
        "--format",
        "hf",
        "--out",
        out.to_str().unwrap(),
        "--scenario",
        "scenarios/tiny-real.toml",
        "--tokenizer",
        tokenizer.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "stdout: {}\nstderr: {}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("outer step 4"), "{}", stdout(&o));
    assert_eq!(names(&out), ["config.json", "model.safetensors", "tokenizer.json"]);
    assert_eq!(fs::read(out.join("tokenizer.json")).unwrap(), fs::read(&tokenizer).unwrap());
    let m = hf::read(&out).unwrap();
    assert_eq!(m.flat, outer, "the outer weights, not the inner parameters");
    assert_eq!(m.spec.layers, 2);

    // The step directory itself, in shards of at most 64 KiB.
    let sharded = ctx.path().join("hf-sharded");
    let o = ctx.loco(&[
        "export",
        step.to_str().unwrap(),
        "--out",
        sharded.to_str().unwrap(),
        "--scenario",
        "scenarios/tiny-real.toml",
        "--shard-size",
        "65536",
    ]);
    assert!(o.status.success(), "stdout: {}\nstderr: {}", stdout(&o), stderr(&o));
    let files = names(&sharded);
    assert!(files.contains(&"model.safetensors.index.json".to_string()), "{files:?}");
    let shards = files.iter().filter(|f| f.starts_with("model-00001-of-")).count();
    assert_eq!(shards, 1, "{files:?}");
    assert!(!files.contains(&"model.safetensors".to_string()), "{files:?}");
    assert_eq!(hf::read(&sharded).unwrap().flat, outer);

    // A checkpoint that records its model needs no scenario, and exports the same files.
    let recorded = tiny_checkpoint(&ctx.path().join("ckpt2"), &outer, Some(Preset::Tiny.spec()));
    let alone = ctx.path().join("hf-alone");
    let o = ctx.loco(&["export", recorded.to_str().unwrap(), "--out", alone.to_str().unwrap()]);
    assert!(o.status.success(), "stdout: {}\nstderr: {}", stdout(&o), stderr(&o));
    assert_eq!(names(&alone), ["config.json", "model.safetensors"]);
    for f in ["config.json", "model.safetensors"] {
        assert_eq!(fs::read(alone.join(f)).unwrap(), fs::read(out.join(f)).unwrap(), "{f}");
    }
    // A scenario whose model has the same layout but another RoPE theta than the recorded one.
    let other = ctx.path().join("other-theta.toml");
    let text = fs::read_to_string(TestContext::repo().join("scenarios/tiny-real.toml")).unwrap();
    fs::write(&other, text.replace("preset = \"tiny\"", "preset = \"tiny\"\nrope_theta = 1000.0"))
        .unwrap();
    let o = ctx.loco(&[
        "export",
        recorded.to_str().unwrap(),
        "--out",
        alone.to_str().unwrap(),
        "--scenario",
        other.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("records a model that differs"), "{}", stderr(&o));

    // Without the scenario (an older checkpoint); with another model's; not a checkpoint.
    let cases: [(&[&str], &str); 3] = [
        (&[node.to_str().unwrap()], "pass --scenario FILE"),
        (
            &[node.to_str().unwrap(), "--scenario", "scenarios/real-150m.toml"],
            "the checkpoint's parameters are not those of the model",
        ),
        (
            &[ctx.path().to_str().unwrap(), "--scenario", "scenarios/tiny-real.toml"],
            "no checkpoint there",
        ),
    ];
    for (args, says) in cases {
        let mut all = vec!["export", "--out", out.to_str().unwrap()];
        all.extend_from_slice(args);
        let o = ctx.loco(&all);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{args:?}: {}", stderr(&o));
    }
}

/// A scenario `name` in `dir`: the tiny model on two processes, a few outer steps, checkpoints,
/// and `extra` lines appended to `[real]`.
#[cfg(feature = "torch")]
fn scenario(dir: &Path, name: &str, inner_lr: &str, extra: &str) -> PathBuf {
    let text = format!(
        r#"name = "{name}"
seed = 3

[model]
preset = "tiny"

[diloco]
inner_steps = 5
codec = "fp32"
inner_lr = {inner_lr}
warmup_steps = 5
batch_tokens = 256

[mesh]
heartbeat = "500ms"
heartbeat_timeout = "2s"
barrier_timeout = "30s"
join_window = "1s"
min_members = 2
probe = "100ms"

[[regions]]
name = "local"

[[links]]
from = "local"
to = "local"
bandwidth = "10Gbit/s"
latency = "100us"

[[nodes]]
name = "n"
count = 2
step_time = "100ms"

[stop]
outer_steps = 3
time = "5min"

[real]
network = "loopback"
device = "cpu"
micro_batch = 4
seq_len = 64
{extra}
"#
    );
    let path = dir.join(format!("{name}.toml"));
    fs::write(&path, text).unwrap();
    path
}

/// `loco launch` of `scenario` (workers' logs at `LOCO_LOG=log` on its stderr).
#[cfg(feature = "torch")]
fn launch(scenario: &Path, out: &Path, log: &str) -> std::process::Output {
    let _turn = crate::common::one_real_run_at_a_time();
    std::process::Command::new(env!("CARGO_BIN_EXE_loco"))
        .args(["launch", scenario.to_str().unwrap(), "--timeout", "300", "--out"])
        .arg(out)
        .current_dir(TestContext::repo())
        .env("LOCO_LOG", log)
        .env("NO_COLOR", "1")
        .output()
        .expect("run loco")
}

/// The fixed batch of token ids both sides compute logits for: 2 sequences of 16.
#[cfg(feature = "torch")]
const BATCH: [usize; 2] = [2, 16];

#[cfg(feature = "torch")]
fn batch_ids() -> Vec<i64> {
    (0..BATCH[0] * BATCH[1]).map(|i| ((i * 37 + 11) % 256) as i64).collect()
}

/// loco's logits (fp32, CPU) of `flat` for [`batch_ids`].
#[cfg(feature = "torch")]
fn loco_logits(spec: &loco_core::scenario::ModelSpec, flat: &[f32]) -> Vec<f32> {
    use loco_core::scenario::Precision;
    let mut m = loco_real::model::Llama::new(spec, tch::Device::Cpu, Precision::F32, 0).unwrap();
    m.set_flat_params(flat).unwrap();
    let input = tch::Tensor::from_slice(&batch_ids()).view([BATCH[0] as i64, BATCH[1] as i64]);
    let logits = m.forward(&input).unwrap();
    logits.reshape([-1]).try_into().unwrap()
}

/// Hugging Face's logits for [`batch_ids`] of each directory in `dirs`: `LlamaForCausalLM`
/// loaded in fp32 by transformers, in the Python of `LOCO_PYTHON`.
#[cfg(feature = "torch")]
fn hf_logits(dirs: &[&Path], work: &Path) -> Vec<Vec<f32>> {
    const SCRIPT: &str = r#"
import json, sys
import torch
from transformers import LlamaForCausalLM
shape, ids = json.loads(sys.argv[1]), json.loads(sys.argv[2])
for model_dir, out in zip(sys.argv[3::2], sys.argv[4::2]):
    model = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor(ids, dtype=torch.long).view(*shape)).logits
    assert logits.dtype == torch.float32, logits.dtype
    with open(out, "w") as f:
        json.dump(logits.flatten().tolist(), f)
"#;
    let python = std::env::var("LOCO_PYTHON").expect(
        "LOCO_PYTHON is not set: `source scripts/torch-env.sh` sets it to the Python with \
         transformers that this test compares loco's logits against",
    );
    let outs: Vec<PathBuf> =
        (0..dirs.len()).map(|i| work.join(format!("hf-logits-{i}.json"))).collect();
    let mut cmd = std::process::Command::new(&python);
    cmd.args(["-c", SCRIPT])
        .arg(serde_json::to_string(&BATCH).unwrap())
        .arg(serde_json::to_string(&batch_ids()).unwrap());
    for (d, o) in dirs.iter().zip(&outs) {
        cmd.arg(d).arg(o);
    }
    let o = cmd.env("TRANSFORMERS_OFFLINE", "1").env("HF_HUB_OFFLINE", "1").output().unwrap();
    assert!(o.status.success(), "{python}: stdout: {}\nstderr: {}", stdout(&o), stderr(&o));
    outs.iter()
        .map(|p| {
            let v: Vec<f64> = serde_json::from_slice(&fs::read(p).unwrap()).unwrap();
            v.into_iter().map(|x| x as f32).collect()
        })
        .collect()
}

#[cfg(feature = "torch")]
fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Trains the tiny model on two processes with checkpoints, exports the outer weights, and
/// checks that Hugging Face's LlamaForCausalLM computes loco's logits from them (within 1e-4 in
/// fp32); a tied-embedding model too. Then a run with `[real] init` = that export, whose inner
/// steps cannot move the weights (learning rate 1e-30), checkpoints them unchanged: exported
/// again, the files are byte-identical, with nodes of one device and of two (sharded). And a scenario whose model
/// is not the export's is refused before anything starts, naming the field.
#[cfg(feature = "torch")]
#[test]
fn a_trained_model_exports_to_hugging_face_logits_and_a_run_starts_from_the_export() {
    let ctx = TestContext::new();
    let dir = ctx.path();
    let s1 = scenario(dir, "train", "1e-3", "checkpoint_dir = \"ckpt\"");
    let o = launch(&s1, &dir.join("run1"), "warn");
    assert!(o.status.success(), "stdout: {}\nstderr: {}", stdout(&o), stderr(&o));
    let exported = dir.join("hf");
    let o = ctx.loco(&[
        "export",
        dir.join("ckpt/n-0").to_str().unwrap(),
        "--format",
        "hf",
        "--out",
        exported.to_str().unwrap(),
        "--scenario",
        s1.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "stdout: {}\nstderr: {}", stdout(&o), stderr(&o));
    let ck = loco_real::checkpoint::latest(&dir.join("ckpt"), "n-0").unwrap().unwrap();
    let step = format!("outer step {}", ck.meta.outer_step);
    assert!(stdout(&o).contains(&step), "{step}: {}", stdout(&o));
    let spec = Preset::Tiny.spec();
    let read = hf::read(&exported).unwrap();
    assert_eq!(read.flat, ck.snapshot.outer, "the export reads back exactly");

    // A tied model with seeded weights, written by the library.
    let tied = loco_core::scenario::ModelSpec { tied_embeddings: true, ..spec.clone() };
    let tied_flat = loco_real::model::Llama::new(
        &tied,
        tch::Device::Cpu,
        loco_core::scenario::Precision::F32,
        11,
    )
    .unwrap()
    .flat_params()
    .unwrap();
    let tied_dir = dir.join("hf-tied");
    hf::write(&tied_dir, &tied, &hf::HfConfig::from_spec(&tied), &tied_flat, 1 << 16).unwrap();

    let theirs = hf_logits(&[&exported, &tied_dir], dir);
    let diff = max_abs_diff(&loco_logits(&spec, &ck.snapshot.outer), &theirs[0]);
    let diff_tied = max_abs_diff(&loco_logits(&tied, &tied_flat), &theirs[1]);
    eprintln!("max |loco - transformers| logit difference: trained {diff:e}, tied {diff_tied:e}");
    assert!(diff <= 1e-4, "trained model: logits differ by {diff}");
    assert!(diff_tied <= 1e-4, "tied model: logits differ by {diff_tied}");

    // A run from the export that cannot move the weights: its first checkpoint holds them.
    // Nodes of one device, then of two (the sharded trainer).
    let digest = loco_core::node::digest::weights_digest(&read.flat).to_string();
    for (name, gpus) in [("init", 1), ("init-sharded", 2)] {
        let s2 =
            scenario(dir, name, "1e-30", &format!("checkpoint_dir = \"ck-{name}\"\ninit = \"hf\""));
        let text = fs::read_to_string(&s2)
            .unwrap()
            .replace("count = 2\n", &format!("count = 2\ngpus = {gpus}\n"));
        fs::write(&s2, text).unwrap();
        let o = launch(&s2, &dir.join(format!("run-{name}")), "loco::export_cmd=info");
        assert!(o.status.success(), "{name}: stdout: {}\nstderr: {}", stdout(&o), stderr(&o));
        let logged = stderr(&o)
            .lines()
            .filter(|l| {
                l.contains("initial weights from a Hugging Face model") && l.contains(&digest)
            })
            .count();
        assert_eq!(logged, 2, "{name}: each worker logs the weights {digest}:\n{}", stderr(&o));
        let again = dir.join(format!("hf-{name}"));
        let o = ctx.loco(&[
            "export",
            dir.join(format!("ck-{name}/n-1")).to_str().unwrap(),
            "--out",
            again.to_str().unwrap(),
            "--scenario",
            s2.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{name}: stdout: {}\nstderr: {}", stdout(&o), stderr(&o));
        assert_eq!(names(&again), names(&exported));
        for f in names(&exported) {
            let same = fs::read(exported.join(&f)).unwrap() == fs::read(again.join(&f)).unwrap();
            assert!(same, "{name}: {f} differs");
        }
    }

    // A scenario whose model is not the export's stops at the launch, naming the field.
    let s3 = scenario(dir, "wrong", "1e-3", "init = \"hf\"");
    let text = fs::read_to_string(&s3)
        .unwrap()
        .replace("preset = \"tiny\"", "preset = \"tiny\"\nlayers = 3");
    fs::write(&s3, text).unwrap();
    let o = launch(&s3, &dir.join("run3"), "warn");
    assert_eq!(o.status.code(), Some(2), "stdout: {}\nstderr: {}", stdout(&o), stderr(&o));
    assert!(
        stderr(&o).contains("[model] layers = 3 but the config's num_hidden_layers = 2"),
        "{}",
        stderr(&o)
    );
}
