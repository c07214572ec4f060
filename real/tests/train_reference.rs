//! The model and the inner step against an independent PyTorch implementation
//! (`train_reference.py`, torchtitan-style, with `torch.optim.AdamW`, `LambdaLR`,
//! `clip_grad_norm_` and PRIME's max-z-loss), run by the interpreter of the libtorch this crate
//! links (`$LOCO_PYTHON`, exported by `scripts/torch-env.sh`).
#![cfg(feature = "torch")]

use loco_core::scenario::{ModelSpec, Preset};
use loco_real::model::{Llama, Precision};
use loco_real::train::{LrSchedule, TrainConfig, Trainer};
use std::path::Path;
use tch::{Device, Tensor};

fn write_f32(path: &Path, v: &[f32]) {
    std::fs::write(path, v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
}

fn read<const N: usize, T>(path: &Path, f: impl Fn([u8; N]) -> T) -> Vec<T> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    bytes.chunks_exact(N).map(|c| f(c.try_into().unwrap())).collect()
}

struct Case {
    name: &'static str,
    spec: ModelSpec,
    cfg: TrainConfig,
    steps: usize,
    rows: usize,
}

#[test]
fn matches_pytorch() {
    let python = std::env::var("LOCO_PYTHON")
        .expect("LOCO_PYTHON is not set: `source scripts/torch-env.sh` before testing with --features torch");
    let tiny = Preset::Tiny.spec();
    let cfg = TrainConfig {
        seq_len: 64,
        micro_batch: 2,
        batch_rows: 3,
        schedule: LrSchedule { peak: 1e-2, warmup_steps: 2, decay: None },
        betas: (0.9, 0.95),
        eps: 1e-8,
        weight_decay: 0.1,
        grad_clip: 0.5,
        z_loss: 1e-3,
        precision: Precision::F32,
    };
    let cases = [
        Case { name: "tiny", spec: tiny.clone(), cfg: cfg.clone(), steps: 4, rows: 3 },
        Case {
            name: "tied-mha",
            spec: ModelSpec { tied_embeddings: true, kv_heads: 4, layers: 1, seq_len: 32, ..tiny },
            cfg: TrainConfig { seq_len: 32, micro_batch: 4, ..cfg },
            steps: 3,
            rows: 4,
        },
    ];
    let dir = tempfile::tempdir().unwrap();
    let mut ours = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let case = dir.path().join(c.name);
        std::fs::create_dir(&case).unwrap();
        let s = &c.spec;
        let json = serde_json::json!({
            "layers": s.layers, "dim": s.dim, "heads": s.heads, "kv_heads": s.kv_heads,
            "ffn": s.ffn, "vocab": s.vocab, "rope_theta": s.rope_theta, "norm_eps": s.norm_eps,
            "tied": s.tied_embeddings, "seq_len": c.cfg.seq_len, "micro_batch": c.cfg.micro_batch,
            "lr": c.cfg.schedule.peak, "warmup_steps": c.cfg.schedule.warmup_steps,
            "beta1": c.cfg.betas.0, "beta2": c.cfg.betas.1, "eps": c.cfg.eps,
            "weight_decay": c.cfg.weight_decay, "grad_clip": c.cfg.grad_clip,
            "z_loss": c.cfg.z_loss, "steps": c.steps,
        });
        std::fs::write(case.join("case.json"), json.to_string()).unwrap();
        let row = c.cfg.seq_len + 1;
        let tokens: Vec<i64> =
            (0..c.rows * row).map(|j| ((j * 53 + 7 * i + 11) % s.vocab as usize) as i64).collect();
        std::fs::write(
            case.join("tokens.bin"),
            tokens.iter().flat_map(|t| t.to_le_bytes()).collect::<Vec<u8>>(),
        )
        .unwrap();
        let model = Llama::new(s, Device::Cpu, Precision::F32, 42 + i as u64).unwrap();
        write_f32(&case.join("params.bin"), &model.flat_params().unwrap());
        let input: Vec<i64> =
            tokens.chunks(row).flat_map(|r| r[..c.cfg.seq_len].to_vec()).collect();
        let logits =
            tch::no_grad(|| model.forward(&Tensor::from_slice(&input).view([c.rows as i64, -1])))
                .unwrap();
        let logits = Vec::<f32>::try_from(&logits.reshape([-1])).unwrap();
        let mut t = Trainer::new(s, c.cfg.clone(), Device::Cpu, 42 + i as u64).unwrap();
        let stats: Vec<_> = (0..c.steps).map(|_| t.inner_step(&tokens).unwrap()).collect();
        ours.push((case, logits, stats, t.flat_params().unwrap(), model.flat_params().unwrap()));
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/train_reference.py");
    let out = std::process::Command::new(&python).arg(script).arg(dir.path()).output().unwrap();
    assert!(out.status.success(), "{python} {script}: {}", String::from_utf8_lossy(&out.stderr));

    for (case, logits, stats, after, before) in ours {
        let name = case.file_name().unwrap().to_string_lossy().into_owned();
        let ref_logits = read(&case.join("logits.bin"), f32::from_le_bytes);
        assert_eq!(ref_logits.len(), logits.len());
        let max = logits.iter().zip(&ref_logits).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(max < 1e-5, "{name}: logits differ by {max}");
        let ref_stats = read(&case.join("stats.bin"), f64::from_le_bytes);
        for (s, r) in stats.iter().zip(ref_stats.chunks(3)) {
            assert!(
                (s.loss - r[0]).abs() < 1e-5,
                "{name} step {}: loss {} vs {}",
                s.step,
                s.loss,
                r[0]
            );
            assert!(
                (s.z_loss - r[1]).abs() < 1e-7,
                "{name} step {}: z {} vs {}",
                s.step,
                s.z_loss,
                r[1]
            );
            assert!((s.grad_norm - r[2]).abs() < 1e-5 * r[2], "{name} step {}: norm", s.step);
        }
        // The clip was active (norms above 0.5), the warmup's step 0 has lr 0.
        assert!(ref_stats.chunks(3).any(|r| r[2] > 0.5), "{name}: {ref_stats:?}");
        assert_eq!(stats[0].lr, 0.0);
        let ref_after = read(&case.join("params_after.bin"), f32::from_le_bytes);
        let max = after.iter().zip(&ref_after).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        let moved = after.iter().zip(&before).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(max < 1e-5 && moved > 1e-2, "{name}: parameters differ by {max} (moved {moved})");
        println!(
            "{name}: logits, losses and parameters after {} steps match PyTorch (max diff {max:e})",
            stats.len()
        );
    }
}
