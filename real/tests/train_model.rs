//! The Llama model and its trainer on the CPU (libtorch): learning, flat parameters, state
//! export and import, the causal mask, AdamW by hand, accumulation, errors.
#![cfg(feature = "torch")]

use loco_core::scenario::{ModelSpec, Preset};
use loco_real::data::{DataLoader, DataSource, Order, Shard};
use loco_real::model::{Llama, ModelError, Precision, param_layout};
use loco_real::train::{LrSchedule, TrainConfig, TrainError, Trainer};
use std::path::PathBuf;
use tch::{Device, Tensor};

/// The tiny spec. Also sets one torch thread: the tests of this binary run in parallel on
/// small CI machines, where more threads per test only contend (and run several times slower).
fn tiny() -> ModelSpec {
    tch::set_num_threads(1);
    Preset::Tiny.spec()
}

fn config(lr: f64) -> TrainConfig {
    TrainConfig {
        seq_len: 64,
        micro_batch: 8,
        batch_rows: 16,
        schedule: LrSchedule { peak: lr, warmup_steps: 0, decay: None },
        betas: (0.9, 0.95),
        eps: 1e-8,
        weight_decay: 0.1,
        grad_clip: 1.0,
        z_loss: 2e-4,
        precision: Precision::F32,
    }
}

fn genesis(order: Order) -> DataLoader {
    let path = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../data/genesis-kjv.txt"));
    DataLoader::new(&DataSource::File(path), 64, 256, Shard::WHOLE, order).unwrap()
}

fn logits(model: &Llama, tokens: &[i64], rows: i64) -> Vec<f32> {
    let input = Tensor::from_slice(tokens).view([rows, -1]);
    let out = tch::no_grad(|| model.forward(&input)).unwrap();
    Vec::<f32>::try_from(&out.reshape([-1])).unwrap()
}

#[test]
fn tiny_loss_drops_on_the_shipped_text() {
    let cfg = TrainConfig {
        schedule: LrSchedule { peak: 1e-2, warmup_steps: 3, decay: None },
        ..config(0.0)
    };
    let mut t = Trainer::new(&tiny(), cfg, Device::Cpu, 7).unwrap();
    let mut data = genesis(Order::Shuffled { seed: 7 });
    let held_out = {
        let mut l = genesis(Order::Shuffled { seed: 1234 });
        l.next_batch(32).unwrap()
    };
    let before = t.eval_loss(&held_out).unwrap();
    let mut losses = Vec::new();
    for _ in 0..30 {
        let s = t.inner_step(&data.next_batch(16).unwrap()).unwrap();
        assert!(s.grad_norm.is_finite() && s.z_loss > 0.0);
        losses.push(s.loss);
    }
    let after = t.eval_loss(&held_out).unwrap();
    println!("losses: {losses:.3?}; held-out {before:.3} -> {after:.3}");
    // Uniform over 256 bytes is ln 256 = 5.55; a unigram model of English bytes is about 3.0.
    assert!(before > 5.0, "initial held-out loss {before}");
    assert!(losses[0] > 5.0, "first loss {}", losses[0]);
    assert!(after < 3.0, "held-out loss after 30 steps: {after}");
    assert!(losses[29] < 3.0, "last training loss {}", losses[29]);
    assert_eq!(t.step(), 30);
}

#[test]
fn trainers_can_move_between_threads() {
    fn send<T: Send + 'static>() {}
    send::<Trainer>();
    send::<Llama>();
}

#[test]
fn parameter_count_and_layout_match_the_spec() {
    let tied = ModelSpec { tied_embeddings: true, ..tiny() };
    let mha = ModelSpec { kv_heads: 4, layers: 3, ..tiny() };
    for spec in [tiny(), tied, mha] {
        let m = Llama::new(&spec, Device::Cpu, Precision::F32, 1).unwrap();
        assert_eq!(m.num_params() as u64, spec.param_count());
        let sizes: Vec<(String, usize)> = m
            .param_specs()
            .iter()
            .zip(m.params())
            .map(|(p, t)| (p.name.clone(), t.numel()))
            .collect();
        assert_eq!(sizes, param_layout(&spec));
        assert_eq!(m.param_layout(), param_layout(&spec));
        assert!(m.params().iter().all(|t| t.requires_grad() && t.kind() == tch::Kind::Float));
    }
    assert_eq!(Llama::new(&tiny(), Device::Cpu, Precision::F32, 1).unwrap().num_params(), 131_392);
}

#[test]
fn initialisation_is_seeded() {
    let a = Llama::new(&tiny(), Device::Cpu, Precision::F32, 5).unwrap().flat_params().unwrap();
    let b = Llama::new(&tiny(), Device::Cpu, Precision::F32, 5).unwrap().flat_params().unwrap();
    let c = Llama::new(&tiny(), Device::Cpu, Precision::F32, 6).unwrap().flat_params().unwrap();
    assert_eq!(a, b);
    assert_ne!(a, c);
    // The embedding (std 1) comes first, the attention norm of layer 0 (ones) right after it.
    let emb = 256 * 64;
    let var = a[..emb].iter().map(|x| f64::from(*x).powi(2)).sum::<f64>() / emb as f64;
    assert!((0.9..1.0).contains(&var), "embedding variance {var} (truncated normal, std 1)");
    assert!(a[emb..emb + 64].iter().all(|&x| x == 1.0));
}

#[test]
fn flat_params_round_trip_exactly() {
    let mut m = Llama::new(&tiny(), Device::Cpu, Precision::F32, 3).unwrap();
    let tokens: Vec<i64> = (0..64).map(|i| (i * 37) % 256).collect();
    let original = m.flat_params().unwrap();
    let y0 = logits(&m, &tokens, 1);
    let shifted: Vec<f32> =
        original.iter().enumerate().map(|(i, x)| x + (i % 7) as f32 * 0.25).collect();
    m.set_flat_params(&shifted).unwrap();
    assert_eq!(m.flat_params().unwrap(), shifted);
    assert_ne!(logits(&m, &tokens, 1), y0);
    m.set_flat_params(&original).unwrap();
    assert_eq!(m.flat_params().unwrap(), original);
    assert_eq!(logits(&m, &tokens, 1), y0);
    let mut into = vec![0.0; original.len()];
    m.flat_params_into(&mut into).unwrap();
    assert_eq!(into, original);
    let err = m.set_flat_params(&original[1..]).unwrap_err();
    assert!(matches!(err, ModelError::FlatLength { expected: 131_392, got: 131_391, .. }), "{err}");
}

#[test]
fn export_and_import_continue_bit_identically() {
    let mut data = genesis(Order::Sequential);
    let mut a = Trainer::new(&tiny(), config(3e-3), Device::Cpu, 1).unwrap();
    for _ in 0..3 {
        a.inner_step(&data.next_batch(16).unwrap()).unwrap();
    }
    let state = a.export_state().unwrap();
    assert_eq!(state.step, 3);
    assert!(state.exp_avg_sq.iter().any(|&v| v > 0.0));
    // A trainer from another seed takes the state over, moments and schedule included.
    let mut b = Trainer::new(&tiny(), config(3e-3), Device::Cpu, 99).unwrap();
    assert_ne!(b.export_state().unwrap().fingerprint(), state.fingerprint());
    b.import_state(&state).unwrap();
    assert_eq!(b.export_state().unwrap(), state);
    assert_eq!(b.step(), 3);
    for _ in 0..2 {
        let batch = data.next_batch(16).unwrap();
        let sa = a.inner_step(&batch).unwrap();
        let sb = b.inner_step(&batch).unwrap();
        assert_eq!(sa, sb);
        assert_eq!(sa.loss.to_bits(), sb.loss.to_bits());
    }
    assert_eq!(a.export_state().unwrap().fingerprint(), b.export_state().unwrap().fingerprint());
    // A trainer that did not import differs.
    let mut c = Trainer::new(&tiny(), config(3e-3), Device::Cpu, 99).unwrap();
    let batch = data.next_batch(16).unwrap();
    assert_ne!(c.inner_step(&batch).unwrap().loss, a.inner_step(&batch).unwrap().loss);

    // The state of another shape is refused, naming the first tensor that differs.
    let other = ModelSpec { ffn: 128, ..tiny() };
    let mut d = Trainer::new(&other, config(3e-3), Device::Cpu, 1).unwrap();
    let err = d.import_state(&state).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("layers.0.feed_forward.w1.weight (8192 values)"), "{msg}");
    assert!(msg.contains("(12288 values)"), "{msg}");
    assert_eq!(d.step(), 0);
}

#[test]
fn attention_is_causal() {
    let m = Llama::new(&tiny(), Device::Cpu, Precision::F32, 2).unwrap();
    let tokens: Vec<i64> = (0..64).map(|i| (i * 31 + 5) % 256).collect();
    let y = logits(&m, &tokens, 1);
    let mut last = tokens.clone();
    last[63] = 0;
    let y_last = logits(&m, &last, 1);
    // Positions 0..63 do not see token 63; position 63 does.
    assert_eq!(y[..63 * 256], y_last[..63 * 256]);
    assert_ne!(y[63 * 256..], y_last[63 * 256..]);
    let mut first = tokens.clone();
    first[0] = 1;
    let y_first = logits(&m, &first, 1);
    for pos in 0..64 {
        assert_ne!(y[pos * 256..(pos + 1) * 256], y_first[pos * 256..(pos + 1) * 256], "{pos}");
    }
    // Rows of a batch are independent; shorter sequences are a prefix of longer ones.
    let two: Vec<i64> = tokens.iter().chain(&last).copied().collect();
    assert_eq!(logits(&m, &two, 2)[..64 * 256], y[..]);
    let short = logits(&m, &tokens[..10], 1);
    let close = short.iter().zip(&y[..10 * 256]).all(|(a, b)| (a - b).abs() < 1e-4);
    assert!(close);
    let too_long: Vec<i64> = vec![1; 65];
    let err = m.forward(&Tensor::from_slice(&too_long).view([1, 65])).unwrap_err();
    assert!(matches!(err, ModelError::BadInput { max_seq: 64, .. }), "{err}");
}

#[test]
fn adamw_first_step_by_hand() {
    // After one step from zero moments: m = (1 - b1) g, v = (1 - b2) g^2 and
    // p1 = p0 (1 - lr wd) - lr m / (1 - b1) / (sqrt(v / (1 - b2)) + eps).
    let (lr, wd, b1, b2, eps) = (1e-2f64, 0.1, 0.9, 0.95, 1e-8);
    let cfg = TrainConfig { grad_clip: 0.0, z_loss: 0.0, ..config(lr) };
    let mut t = Trainer::new(&tiny(), cfg, Device::Cpu, 4).unwrap();
    let p0 = t.flat_params().unwrap();
    let s = t.inner_step(&genesis(Order::Sequential).next_batch(16).unwrap()).unwrap();
    assert_eq!((s.step, s.lr, s.z_loss, s.tokens), (0, lr, 0.0, 16 * 64));
    let st = t.export_state().unwrap();
    let (mut moved, mut with_grad) = (0, 0);
    for (i, &p) in p0.iter().enumerate() {
        let (m, v, p) = (f64::from(st.exp_avg[i]), f64::from(st.exp_avg_sq[i]), f64::from(p));
        let g = m / (1.0 - b1);
        assert!((v - (1.0 - b2) * g * g).abs() <= 1e-5 * v.abs() + 1e-30, "v[{i}]");
        let want = p * (1.0 - lr * wd) - lr * g / ((v / (1.0 - b2)).sqrt() + eps);
        let got = f64::from(st.params[i]);
        assert!((got - want).abs() <= 1e-6 * want.abs().max(1.0), "p[{i}]: {got} vs {want}");
        with_grad += usize::from(m != 0.0);
        moved += usize::from((got - p * (1.0 - lr * wd)).abs() > 0.99 * lr);
    }
    // Adam's first step moves almost every weight that has a gradient by lr (the embedding rows
    // of bytes absent from the batch have none).
    println!("{moved} of {with_grad} weights with a gradient moved by lr ({} weights)", p0.len());
    assert!(with_grad > p0.len() * 3 / 4 && with_grad < p0.len(), "{with_grad}");
    assert!(moved > with_grad * 19 / 20, "{moved} of {with_grad}");
}

#[test]
fn micro_batches_accumulate_to_the_full_batch() {
    let batch = genesis(Order::Sequential).next_batch(8).unwrap();
    let run = |micro_batch| {
        let cfg = TrainConfig { micro_batch, ..config(1e-3) };
        let mut t = Trainer::new(&tiny(), cfg, Device::Cpu, 8).unwrap();
        let s = t.inner_step(&batch).unwrap();
        (s, t.flat_params().unwrap())
    };
    let (whole, p_whole) = run(8);
    for mb in [1, 3] {
        let (s, p) = run(mb);
        assert!((s.loss - whole.loss).abs() < 1e-5, "{mb}: {} vs {}", s.loss, whole.loss);
        assert!((s.z_loss - whole.z_loss).abs() < 1e-9);
        assert!((s.grad_norm - whole.grad_norm).abs() < 1e-4 * whole.grad_norm);
        let max = p.iter().zip(&p_whole).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(max < 1e-5, "micro-batch {mb}: parameters differ by {max}");
    }
}

#[test]
fn z_loss_is_the_squared_max_logit() {
    let batch = genesis(Order::Sequential).next_batch(2).unwrap();
    let cfg = TrainConfig { z_loss: 0.5, micro_batch: 2, ..config(0.0) };
    let mut t = Trainer::new(&tiny(), cfg, Device::Cpu, 9).unwrap();
    let input: Vec<i64> = batch.chunks(65).flat_map(|r| r[..64].to_vec()).collect();
    let y = logits(t.model(), &input, 2);
    let want = 0.5
        * y.chunks(256)
            .map(|row| f64::from(row.iter().copied().fold(f32::MIN, f32::max)).powi(2))
            .sum::<f64>()
        / 128.0;
    let s = t.inner_step(&batch).unwrap();
    assert!((s.z_loss - want).abs() < 1e-5 * want, "{} vs {want}", s.z_loss);
}

#[test]
fn bf16_computes_close_to_f32() {
    let batch = genesis(Order::Sequential).next_batch(4).unwrap();
    let f32_loss =
        Trainer::new(&tiny(), config(0.0), Device::Cpu, 5).unwrap().eval_loss(&batch).unwrap();
    let cfg = TrainConfig { precision: Precision::Bf16, ..config(1e-3) };
    let mut t = Trainer::new(&tiny(), cfg, Device::Cpu, 5).unwrap();
    let bf16_loss = t.eval_loss(&batch).unwrap();
    assert!((f32_loss - bf16_loss).abs() < 0.05, "{f32_loss} vs {bf16_loss}");
    assert_ne!(f32_loss, bf16_loss, "bf16 really computes in bf16");
    // Master weights and moments stay fp32 and the step works.
    t.inner_step(&batch).unwrap();
    assert!(t.model().params().iter().all(|p| p.kind() == tch::Kind::Float));
}

#[test]
fn bad_input_and_non_finite_steps_change_nothing() {
    let mut t = Trainer::new(&tiny(), config(1e-3), Device::Cpu, 6).unwrap();
    let before = t.export_state().unwrap();
    let err = t.inner_step(&[1; 64]).unwrap_err();
    assert!(matches!(err, TrainError::BadBatch { len: 64, row: 65 }), "{err}");
    assert!(matches!(t.inner_step(&[]), Err(TrainError::BadBatch { len: 0, .. })));
    let mut batch = vec![1i64; 130];
    batch[70] = 256;
    let err = t.inner_step(&batch).unwrap_err();
    assert!(
        matches!(err, TrainError::TokenOutOfRange { index: 70, token: 256, vocab: 256 }),
        "{err}"
    );
    batch[70] = -1;
    assert!(matches!(t.inner_step(&batch), Err(TrainError::TokenOutOfRange { index: 70, .. })));
    // NaN weights: the step is refused and the state is what it was.
    let mut nan = before.clone();
    nan.params[0] = f32::NAN;
    t.import_state(&nan).unwrap();
    batch[70] = 0;
    let err = t.inner_step(&batch).unwrap_err();
    assert!(matches!(err, TrainError::NonFinite { step: 0, .. }), "{err}");
    let after = t.export_state().unwrap();
    assert_eq!(after.step, 0);
    assert_eq!(after.exp_avg, before.exp_avg);
    assert!(after.params[0].is_nan() && after.params[1..] == before.params[1..]);
    // A bad config is refused up front.
    let err = Trainer::new(&tiny(), TrainConfig { micro_batch: 0, ..config(1e-3) }, Device::Cpu, 1)
        .unwrap_err();
    assert!(matches!(err, TrainError::BadConfig { field: "micro_batch", .. }), "{err}");
}

/// The held-out loss of the global weights is taken with those weights swapped in, and leaves
/// the node's own (inner) parameters exactly as they were.
#[test]
fn held_out_evaluation_swaps_the_global_weights_in_and_back() {
    use loco_real::inner::{InnerLoop, NodeTrainer, TchInner};
    let spec = tiny();
    let trainer = Trainer::new(&spec, config(1e-2), Device::Cpu, 3).unwrap();
    let global = trainer.model().flat_params().unwrap();
    let mut held_out = genesis(Order::Sequential);
    let rows = held_out.next_batch(8).unwrap();
    let fresh = trainer.eval_loss(&rows).unwrap();
    let mut inner = TchInner::new(NodeTrainer::One(trainer), genesis(Order::Sequential))
        .with_held_out(rows.clone());
    for _ in 0..5 {
        inner.step().unwrap();
    }
    let mut own = vec![0.0f32; inner.num_params()];
    inner.params_into(&mut own).unwrap();
    assert_ne!(own, global, "the inner steps moved the weights");
    let at_global = inner.eval_loss(&global).unwrap().unwrap();
    assert_eq!(at_global, fresh, "the loss of the global weights, not the node's own");
    let mut after = vec![0.0f32; inner.num_params()];
    inner.params_into(&mut after).unwrap();
    assert_eq!(after, own, "the node's own parameters are back, bit for bit");
    let at_own = inner.eval_loss(&own).unwrap().unwrap();
    assert!(at_own < at_global, "trained weights fit the text better: {at_own} vs {at_global}");
    // A weights vector of the wrong length is an error, and the parameters stay.
    assert!(inner.eval_loss(&global[1..]).is_err());
    inner.params_into(&mut after).unwrap();
    assert_eq!(after, own);
}
