use super::*;
use loco_core::scenario::Preset;

#[test]
fn wsd_schedule_by_hand() {
    let s = LrSchedule { peak: 1.0, warmup_steps: 10, decay: Some(Decay { start: 20, steps: 16 }) };
    assert_eq!(s.lr_at(0), 0.0);
    assert_eq!(s.lr_at(5), 0.5);
    assert_eq!(s.lr_at(10), 1.0);
    assert_eq!(s.lr_at(19), 1.0);
    assert_eq!(s.lr_at(20), 1.0);
    // (24 - 20) / 16 = 1/4, sqrt = 1/2.
    assert_eq!(s.lr_at(24), 0.5);
    // 9/16 -> 1 - 3/4.
    assert_eq!(s.lr_at(29), 0.25);
    assert_eq!(s.lr_at(36), 0.0);
    assert_eq!(s.lr_at(1000), 0.0);
    assert_eq!(LrSchedule::constant(0.3).lr_at(0), 0.3);
    // The same schedule as the scenario's.
    let diloco = DilocoSpec {
        inner_lr: 3e-4,
        warmup_steps: 7,
        decay: Some(Decay { start: 50, steps: 30 }),
        ..DilocoSpec::default()
    };
    let cfg = TrainConfig::from_scenario(&Preset::Tiny.spec(), &diloco, &RealSpec::default());
    for step in 0..100 {
        assert_eq!(cfg.schedule.lr_at(step), diloco.inner_lr_at(step), "step {step}");
    }
}

#[test]
fn config_from_scenario_and_validation() {
    let spec = Preset::Tiny.spec();
    let real = RealSpec { micro_batch: 4, seq_len: Some(32), ..RealSpec::default() };
    let diloco = DilocoSpec { batch_tokens: 256, ..DilocoSpec::default() };
    let cfg = TrainConfig::from_scenario(&spec, &diloco, &real);
    assert_eq!((cfg.seq_len, cfg.micro_batch, cfg.batch_rows), (32, 4, 8));
    assert_eq!(cfg.betas, (0.9, 0.95));
    assert_eq!(cfg.z_loss, 2e-4);
    assert_eq!(cfg.precision, Precision::F32);
    let bf16 = RealSpec { precision: Precision::Bf16, ..real.clone() };
    assert_eq!(TrainConfig::from_scenario(&spec, &diloco, &bf16).precision, Precision::Bf16);
    cfg.validate(&spec).unwrap();
    let too_long = TrainConfig { seq_len: 65, ..cfg.clone() };
    let err = too_long.validate(&spec).unwrap_err().to_string();
    assert!(err.contains("seq_len = 65") && err.contains("1 ..= 64"), "{err}");
    let bad_beta = TrainConfig { betas: (0.9, 1.0), ..cfg.clone() };
    assert!(matches!(bad_beta.validate(&spec), Err(TrainError::BadConfig { field: "betas", .. })));
    let nan = TrainConfig { weight_decay: f64::NAN, ..cfg };
    assert!(matches!(
        nan.validate(&spec),
        Err(TrainError::BadConfig { field: "weight_decay", .. })
    ));
}

#[test]
fn fingerprints_see_every_bit() {
    let s = TrainerState {
        step: 3,
        layout: vec![("a".into(), 2)],
        params: vec![1.0, 2.0],
        exp_avg: vec![0.0, 0.0],
        exp_avg_sq: vec![0.0, 0.0],
    };
    let mut t = s.clone();
    assert_eq!(s.fingerprint(), t.fingerprint());
    t.exp_avg_sq[1] = -0.0;
    assert_ne!(s.fingerprint(), t.fingerprint());
    let mut u = s.clone();
    u.step = 4;
    assert_ne!(s.fingerprint(), u.fingerprint());
}
