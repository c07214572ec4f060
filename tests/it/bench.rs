//! `loco bench codec`, `allreduce`, `recovery`, `outer`, `quality` and `train`.

use crate::common::{TestContext, stderr, stdout};

#[test]
fn bench_allreduce_json_has_the_contract_fields() {
    let ctx = TestContext::new();
    let out = ctx.loco(&[
        "bench",
        "allreduce",
        "--world",
        "4",
        "--elements",
        "100000",
        "--codec",
        "uint8",
        "--json",
    ]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    assert_eq!(v["codec"], "uint8");
    assert_eq!(v["world"], 4);
    assert_eq!(v["elements"], 100000);
    assert!(v["seconds"].as_f64().unwrap() > 0.0);
    assert_eq!(v["replicas_identical"], true);
    let err = v["rel_rms_error"].as_f64().unwrap();
    assert!(err > 0.0 && err < 0.03, "uint8 W=4 error {err}");
    // 2(W-1)/W x 100000 values at one byte each, plus the 1 KiB tables of the segments.
    let bytes = v["bytes_sent_per_rank"].as_u64().unwrap();
    assert!((150_000..150_000 + 6 * 1024 + 1).contains(&bytes), "bytes {bytes}");
}

/// Over TCP with `--repeat`: one process per rank, each repetition timed, the best reported, the
/// replicas identical in the last one, and the CPU per rank measured.
#[test]
fn bench_allreduce_over_tcp_repeats_and_reports_the_best_and_the_cpu() {
    let ctx = TestContext::new();
    let out = ctx.loco(&[
        "bench",
        "allreduce",
        "--backend",
        "tcp",
        "--world",
        "3",
        "--elements",
        "200000",
        "--codec",
        "uint8",
        "--repeat",
        "3",
        "--json",
    ]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    assert_eq!(v["backend"], "tcp");
    assert_eq!(v["replicas_identical"], true);
    let reps: Vec<f64> =
        v["repetitions"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
    assert_eq!(reps.len(), 3);
    assert!(reps.iter().all(|&t| t > 0.0), "{reps:?}");
    let best = reps.iter().copied().fold(f64::INFINITY, f64::min);
    assert_eq!(v["seconds"].as_f64().unwrap(), best);
    let cpu = v["cpu_seconds_per_rank"].as_f64().unwrap();
    assert!(cpu > 0.0, "CPU per rank {cpu}");
    let err = v["rel_rms_error"].as_f64().unwrap();
    assert!(err > 0.0 && err < 0.03, "uint8 W=3 error {err}");
}

/// Live recovery on real processes: two senders share a state out, the joiner verifies it (the
/// process checks the values too); the senders send their snapshots' buffers as they are, so
/// neither allocates anything near the state's size.
#[test]
fn bench_recovery_moves_a_verified_state_and_reports_each_process() {
    let ctx = TestContext::new();
    let out =
        ctx.loco(&["bench", "recovery", "--bytes", "24MB", "--senders", "2", "--secure", "--json"]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    // 3M parameters: outer weights and momentum, and the 24-byte header.
    let total = v["state_bytes"].as_u64().unwrap();
    assert_eq!(total, 24_000_024);
    assert_eq!(v["senders"], 2);
    assert_eq!(v["secure"], true);
    assert!(v["gbps"].as_f64().unwrap() > 0.0 && v["memcpy_gbps"].as_f64().unwrap() > 0.0);
    let nodes = v["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 3);
    assert_eq!(nodes[0]["role"], "joiner");
    let sent: u64 = nodes[1..].iter().map(|n| n["state_bytes"].as_u64().unwrap()).sum();
    assert_eq!(sent, total, "the senders' shares make the state once");
    for n in &nodes[1..] {
        assert!(n["state_bytes"].as_u64().unwrap() > 0, "each sender sends a share");
        let beyond = n["peak_rss_bytes"].as_u64().unwrap() - n["base_rss_bytes"].as_u64().unwrap();
        assert!(beyond < total / 2, "a sender allocated {beyond} bytes beyond its state");
        assert!(n["cpu_seconds"].as_f64().unwrap() > 0.0);
    }
    let bad = ctx.loco(&["bench", "recovery", "--senders", "0"]);
    assert_eq!(bad.status.code(), Some(2), "stderr: {}", stderr(&bad));
    assert!(stderr(&bad).contains("--senders"), "{}", stderr(&bad));
}

#[test]
fn bench_codec_prints_memcpy_and_ratios() {
    let ctx = TestContext::new();
    let out =
        ctx.loco(&["bench", "codec", "--elements", "65536", "--repeats", "1", "--threads", "2"]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let text = stdout(&out);
    for needle in ["memcpy", "uint8", "int8-block", "fp16", "bf16", "fp32", "check"] {
        assert!(text.contains(needle), "missing {needle} in:\n{text}");
    }
}

/// `loco bench outer` at a small size: the four parts of the commit's work, their sum per
/// parameter (the `[sim] outer_cost` figure), the memcpy beside them, and the presets' seconds.
#[test]
fn bench_outer_reports_the_cost_per_parameter_and_the_presets() {
    let ctx = TestContext::new();
    let out = ctx.loco(&["bench", "outer", "--params", "200000", "--repeats", "2", "--json"]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    assert_eq!((v["params"].as_u64(), v["bytes"].as_u64()), (Some(200_000), Some(800_000)));
    let parts: Vec<&str> =
        v["parts"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(parts, ["pseudo-gradient", "outer step", "set params", "digest"]);
    let sum: f64 =
        v["parts"].as_array().unwrap().iter().map(|p| p["seconds"].as_f64().unwrap()).sum();
    let cost = v["outer_cost"].as_f64().unwrap();
    assert!(cost > 0.0 && (cost * 200_000.0 - sum).abs() < 1e-9 * sum.max(1e-9), "{cost} {sum}");
    assert!(v["memcpy_gbps"].as_f64().unwrap() > 0.0);
    let presets: Vec<&str> =
        v["presets"].as_array().unwrap().iter().map(|p| p["preset"].as_str().unwrap()).collect();
    assert_eq!(presets, ["150m", "1b", "10b"]);
    let ten_b = &v["presets"][2];
    let want = ten_b["params"].as_f64().unwrap() * cost;
    assert!((ten_b["seconds"].as_f64().unwrap() - want).abs() < 1e-9 * want);

    let out = ctx.loco(&["bench", "outer", "--params", "1000", "--repeats", "1"]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let text = stdout(&out);
    for needle in ["memcpy", "digest", "total", "[sim] outer_cost = ", "10b"] {
        assert!(text.contains(needle), "missing {needle} in:\n{text}");
    }
    for flag in ["--params", "--repeats"] {
        let out = ctx.loco(&["bench", "outer", flag, "0"]);
        assert_eq!(out.status.code(), Some(2));
        assert!(stderr(&out).contains(flag), "{}", stderr(&out));
    }
}

#[test]
fn bad_flags_exit_2_and_name_the_flag() {
    let ctx = TestContext::new();
    let out = ctx.loco(&["bench", "allreduce", "--codec", "int3"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("int3"), "{}", stderr(&out));
    let out = ctx.loco(&["bench", "allreduce", "--world", "0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--world"), "{}", stderr(&out));
    let out = ctx.loco(&["bench", "allreduce", "--repeat", "0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--repeat"), "{}", stderr(&out));
}

/// `loco bench quality --json` at a toy size (2 workers, 2 outer steps of 3 inner steps, from 3
/// pretraining steps), with `extra` arguments.
#[cfg(feature = "torch")]
fn toy_quality<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["bench", "quality", "--json", "--workers", "2", "--inner-steps", "3"];
    args.extend(["--outer-steps", "2", "--pretrain-steps", "3"]);
    args.extend_from_slice(extra);
    args
}

/// `loco bench quality` at a toy size: the four runs, their accounting, and the same figures
/// from the same seed (one libtorch thread, seeded weights and data order).
#[cfg(feature = "torch")]
#[test]
fn bench_quality_is_deterministic_and_accounts_its_runs() {
    let ctx = TestContext::new();
    let args = toy_quality(&["--seed", "5"]);
    let run = || {
        let out = ctx.loco(&args);
        // Exit 1 only says a claim failed, which a 6-step run may well do.
        assert!(matches!(out.status.code(), Some(0 | 1)), "stderr: {}", stderr(&out));
        let v: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("JSON");
        assert_eq!(out.status.code() == Some(0), claims_hold(&v), "exit code vs claims");
        v
    };
    let (a, b) = (run(), run());
    let names: Vec<&str> =
        a["runs"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["single", "diloco-fp32", "diloco-uint8", "data-parallel"]);
    assert_eq!((a["pretrain_steps"].as_u64(), a["workers"].as_u64()), (Some(3), Some(2)));
    // 5% of the 3,197 sequences of 65 bytes held out, one dropped between the sets.
    assert_eq!(
        (a["train_sequences"].as_u64(), a["eval_sequences"].as_u64()),
        (Some(3037), Some(160))
    );
    for (ra, rb) in a["runs"].as_array().unwrap().iter().zip(b["runs"].as_array().unwrap()) {
        let name = ra["name"].as_str().unwrap();
        assert_eq!(ra["curve"], rb["curve"], "{name}: not reproducible");
        let curve = ra["curve"].as_array().unwrap();
        assert_eq!(curve.len(), 3, "{name}: eval at steps 0, 3, 6");
        let first = curve[0]["eval_loss"].as_f64().unwrap();
        let last = ra["final_eval_loss"].as_f64().unwrap();
        // Every run starts from the same pretrained weights and learns.
        assert_eq!(first, a["runs"][0]["curve"][0]["eval_loss"].as_f64().unwrap(), "{name}");
        assert!(last < first && last > 1.0, "{name}: {first} -> {last}");
        assert_eq!(ra["steps_per_worker"], 6, "{name}");
        assert_eq!(ra["replicas_identical"], true, "{name}");
    }
    let r = &a["runs"];
    assert_eq!(r[0]["compute_batches"], 6);
    for i in 1..4 {
        assert_eq!(r[i]["compute_batches"], 12);
    }
    assert_eq!((r[1]["sync_rounds"].as_u64(), r[3]["sync_rounds"].as_u64()), (Some(2), Some(6)));
    // fp32: 2 all-reduces of 2 (W-1)/W x 4 bytes x 131,392 parameters; uint8 about a quarter.
    let fp32 = r[1]["bytes_per_worker"].as_u64().unwrap();
    let uint8 = r[2]["bytes_per_worker"].as_u64().unwrap();
    assert!((2 * 4 * 131_392..2 * 4 * 131_392 + 4096).contains(&fp32), "fp32 bytes {fp32}");
    assert!(uint8 > fp32 / 5 && uint8 < fp32 / 3, "uint8 bytes {uint8}");
    let rel = a["claims"]["uint8_vs_fp32"].as_f64().unwrap();
    let (l1, l2) =
        (r[1]["final_eval_loss"].as_f64().unwrap(), r[2]["final_eval_loss"].as_f64().unwrap());
    assert!((rel - (l2 / l1 - 1.0)).abs() < 1e-12, "{rel}");
}

/// `--also-codec` adds one DiLoCo run per further codec (repeats, fp32 and uint8 ignored), after
/// uint8's, with its loss relative to fp32's; the claims are unchanged by it.
#[cfg(feature = "torch")]
#[test]
fn bench_quality_runs_the_further_codecs_it_is_given() {
    let ctx = TestContext::new();
    let also =
        ["--also-codec", "int8-block", "--also-codec", "uint8", "--also-codec", "int8-block"];
    let out = ctx.loco(&toy_quality(&also));
    assert!(matches!(out.status.code(), Some(0 | 1)), "stderr: {}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    let r = v["runs"].as_array().unwrap();
    let names: Vec<&str> = r.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["single", "diloco-fp32", "diloco-uint8", "diloco-int8-block", "data-parallel"]
    );
    let also = v["also_vs_fp32"].as_array().unwrap();
    assert_eq!(also.len(), 1, "{also:?}");
    assert_eq!(also[0]["codec"], "int8-block");
    let loss = |i: usize| r[i]["final_eval_loss"].as_f64().unwrap();
    let rel = also[0]["vs_fp32"].as_f64().unwrap();
    assert!((rel - (loss(3) / loss(1) - 1.0)).abs() < 1e-12, "{rel}");
    assert_eq!(r[3]["replicas_identical"], true);
    assert_eq!(
        (r[3]["sync_rounds"].as_u64(), r[3]["compute_batches"].as_u64()),
        (Some(2), Some(12))
    );
    // About uint8's bytes: one byte per value, and a 4-byte scale per 256 values.
    let (u8b, i8b) =
        (r[2]["bytes_per_worker"].as_u64().unwrap(), r[3]["bytes_per_worker"].as_u64().unwrap());
    assert!(i8b * 10 > u8b * 9 && i8b * 10 < u8b * 11, "uint8 {u8b} int8-block {i8b}");
    let bad = ctx.loco(&["bench", "quality", "--also-codec", "int4"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(stderr(&bad).contains("--also-codec"), "{}", stderr(&bad));
}

#[cfg(feature = "torch")]
fn claims_hold(v: &serde_json::Value) -> bool {
    let c = &v["claims"];
    c["diloco_beats_single"] == true
        && c["uint8_within_tolerance"] == true
        && c["replicas_identical"] == true
        && v["modes"].as_array().is_none_or(|m| m.iter().all(|m| m["holds"] == true))
}

/// `loco bench quality --json --inner-steps 20 --outer-steps 5` with `more`: its JSON, after
/// checking that the exit code says whether the claims held, and that the one `--mode` run
/// (named `run`) ended within 1% of sync DiLoCo fp32 with bit-identical replicas.
#[cfg(feature = "torch")]
fn short_mode_run(ctx: &TestContext, more: &[&str], run: &str) -> serde_json::Value {
    let mut args = vec!["bench", "quality", "--json", "--inner-steps", "20", "--outer-steps", "5"];
    args.extend_from_slice(more);
    let out = ctx.loco(&args);
    assert!(matches!(out.status.code(), Some(0 | 1)), "stderr: {}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    assert_eq!(out.status.code() == Some(0), claims_hold(&v), "exit code vs claims");
    let m = &v["modes"][0];
    assert_eq!(m["run"], run);
    let vs = m["vs_sync_fp32"].as_f64().unwrap();
    assert!(vs.abs() <= 0.01 && m["holds"] == true, "{run} against sync fp32: {vs:+.4}");
    assert_eq!(v["runs"][3]["replicas_identical"], true);
    v
}

/// The README's claim in short: streaming DiLoCo (4 fragments, the 4-bit codec, each
/// all-reduce landing a round late) ends within 1% of sync DiLoCo fp32's eval loss at equal
/// tokens; its replicas stay bit-identical, and its 24 all-reduces of a quarter of the model
/// at 0.516 bytes a value (20 rounds and the flush) send about 6.5 times less than fp32's 5.
#[cfg(feature = "torch")]
#[test]
fn bench_quality_streaming_ends_within_one_percent_of_sync() {
    let ctx = TestContext::new();
    let v =
        short_mode_run(&ctx, &["--mode", "streaming", "--fragments", "4"], "streaming-int4-block");
    let r = v["runs"].as_array().unwrap();
    let names: Vec<&str> = r.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["single", "diloco-fp32", "diloco-uint8", "streaming-int4-block", "data-parallel"]
    );
    let s = &r[3];
    assert_eq!((s["sync_rounds"].as_u64(), s["compute_batches"].as_u64()), (Some(24), Some(400)));
    let (fp32, int4) =
        (r[1]["bytes_per_worker"].as_u64().unwrap(), s["bytes_per_worker"].as_u64().unwrap());
    assert!(int4 * 6 < fp32 && int4 * 9 > fp32, "fp32 {fp32} streaming int4-block {int4}");
}

/// The README's claim for overlapped DiLoCo in short: with each average merged halfway into
/// the next round (`--sync-delay`, half of H), it ends within 1% of sync DiLoCo fp32's eval
/// loss at equal tokens, with bit-identical replicas; the rounds between two syncs send
/// nothing (5 syncs of the whole model and the flush).
#[cfg(feature = "torch")]
#[test]
fn bench_quality_overlap_merged_halfway_ends_within_one_percent_of_sync() {
    let ctx = TestContext::new();
    let v = short_mode_run(
        &ctx,
        &["--mode", "overlap", "--sync-delay", "10"],
        "overlap-int4-block-delay10",
    );
    let r = &v["runs"][3];
    assert_eq!((r["sync_rounds"].as_u64(), r["compute_batches"].as_u64()), (Some(6), Some(400)));
    let (fp32, int4) = (
        v["runs"][1]["bytes_per_worker"].as_u64().unwrap(),
        r["bytes_per_worker"].as_u64().unwrap(),
    );
    assert!(int4 * 6 < fp32, "fp32 {fp32} overlap int4-block {int4}");
    // A delay that does not divide H is refused, naming the flag.
    let bad = ctx.loco(&["bench", "quality", "--mode", "overlap", "--sync-delay", "7"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(stderr(&bad).contains("--sync-delay"), "{}", stderr(&bad));
}

/// Without libtorch the quality benchmark says how to get it, and bad flags name themselves.
#[test]
fn bench_quality_explains_its_requirements() {
    let ctx = TestContext::new();
    let out = ctx.loco(&["bench", "quality", "--workers", "0"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    if cfg!(feature = "torch") {
        assert!(err.contains("--workers"), "{err}");
    } else {
        assert!(err.contains("--features torch"), "{err}");
    }
}

/// `loco bench train` on the tiny preset: its figures follow from each other (tokens/s from the
/// step times, flops from PRIME's formula, MFU from the peak given), and the loss is a loss.
#[cfg(feature = "torch")]
#[test]
fn bench_train_figures_follow_from_its_measurements() {
    let ctx = TestContext::new();
    let out = ctx.loco(&[
        "bench",
        "train",
        "--preset",
        "tiny",
        "--micro-batch",
        "2",
        "--batch-rows",
        "4",
        "--seq-len",
        "32",
        "--steps",
        "3",
        "--warmup",
        "1",
        "--threads",
        "1",
        "--peak-flops",
        "1e11",
        "--json",
    ]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    let f = |k: &str| v[k].as_f64().unwrap_or_else(|| panic!("{k} in {v}"));
    assert_eq!((v["preset"].as_str(), v["device"].as_str()), (Some("tiny"), Some("cpu")));
    assert_eq!(v["precision"], "f32", "the CPU default");
    assert_eq!(v["torch_threads"], 1);
    assert_eq!((v["batch_rows"].as_u64(), v["micro_batch"].as_u64()), (Some(4), Some(2)));
    assert_eq!(v["tokens_per_step"], 4 * 32);
    // PRIME's formula at the sequence length trained (32): 2 layers, 4 heads of 16.
    let non_embedding = v["non_embedding_params"].as_u64().unwrap();
    // Untied: only the input embedding (256 x 64) is left out of the count.
    assert_eq!(v["params"].as_u64().unwrap(), non_embedding + 256 * 64);
    assert_eq!(v["flops_per_token"].as_u64().unwrap(), 6 * non_embedding + 12 * 2 * 4 * 16 * 32);
    let steps: Vec<f64> =
        v["step_seconds"].as_array().unwrap().iter().map(|s| s.as_f64().unwrap()).collect();
    assert_eq!(steps.len(), 3);
    assert!(steps.iter().all(|s| *s > 0.0));
    let tps = 3.0 * 128.0 / steps.iter().sum::<f64>();
    assert!((f("tokens_per_second") / tps - 1.0).abs() < 1e-9, "{v}");
    let achieved = tps * f("flops_per_token");
    assert!((f("achieved_flops") / achieved - 1.0).abs() < 1e-9);
    assert!((f("mfu") / (achieved / 1e11) - 1.0).abs() < 1e-9);
    let mut sorted = steps.clone();
    sorted.sort_by(f64::total_cmp);
    assert_eq!(f("median_step_seconds"), sorted[1]);
    // Byte-level tokens start near ln(256) = 5.5 nats.
    assert!((4.0..7.0).contains(&f("first_loss")), "{v}");
    assert!(f("last_loss").is_finite());
    assert!(v["peak_rss_bytes"].as_u64().unwrap() > 10 << 20);
    assert!(v["memory_plan"].as_str().unwrap().contains("on cpu for weights"), "{v}");
}

/// `bench train --plan`: a node's memory plan without libtorch or allocation. The 10B preset
/// sharded over 8 GPUs fits an H100's 80 GB per device; on one it does not; fewer layers need
/// less; bad flags are refused by name.
#[test]
fn bench_train_plans_the_10b_preset_over_eight_gpus() {
    let ctx = TestContext::new();
    let plan = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec!["bench", "train", "--preset", "10b", "--device", "cuda:0", "--plan"];
        args.extend_from_slice(extra);
        args.push("--json");
        let out = ctx.loco(&args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        serde_json::from_str(&stdout(&out)).expect("JSON")
    };
    let gib = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap() as f64 / (1u64 << 30) as f64;
    let eight = plan(&["--gpus", "8"]);
    assert_eq!(eight["gpus"], 8);
    assert!(gib(&eight, "per_device_bytes") < 80.0 * 1e9 / (1u64 << 30) as f64, "{eight}");
    assert!((gib(&eight, "host_bytes") - 152.2).abs() < 0.1, "{eight}");
    assert!(eight["plan"].as_str().unwrap().contains("on each of cuda:0..cuda:7"), "{eight}");
    let one = plan(&[]);
    assert!(gib(&one, "per_device_bytes") > 141.0, "one H200 is not enough: {one}");
    let few = plan(&["--gpus", "8", "--layers", "4"]);
    assert!(few["per_device_bytes"].as_u64() < eight["per_device_bytes"].as_u64());
    assert_eq!(few["preset"], "10b (4 layers)");
    for (flag, value, expected) in [
        ("--gpus", "0", "--gpus: expected 1 ..= 1024"),
        ("--layers", "0", "--layers: expected at least 1"),
    ] {
        let out = ctx.loco(&["bench", "train", "--plan", flag, value]);
        assert_eq!(out.status.code(), Some(2));
        assert!(stderr(&out).contains(expected), "{}", stderr(&out));
    }
}

/// `bench train --gpus 2` on the CPU: one model sharded over two devices, each shard reported
/// against the plan, MFU against both devices' peak.
#[cfg(feature = "torch")]
#[test]
fn bench_train_on_two_sharded_cpu_devices_reports_each_shard() {
    let ctx = TestContext::new();
    let out = ctx.loco(&[
        "bench",
        "train",
        "--preset",
        "tiny",
        "--gpus",
        "2",
        "--micro-batch",
        "2",
        "--seq-len",
        "32",
        "--steps",
        "2",
        "--warmup",
        "0",
        "--threads",
        "1",
        "--peak-flops",
        "1e11",
        "--json",
    ]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    assert_eq!((v["gpus"].as_u64(), v["batch_rows"].as_u64()), (Some(2), Some(4)), "{v}");
    let shards = v["shards"].as_array().unwrap();
    assert_eq!(shards.len(), 2);
    let params = v["params"].as_u64().unwrap();
    assert_eq!(shards.iter().map(|s| s["values"].as_u64().unwrap()).sum::<u64>(), params);
    for s in shards {
        // 131,392 values split evenly: each shard holds what the plan says, 16 bytes a value.
        assert_eq!(s["held_bytes"], s["plan_bytes"], "{v}");
        assert_eq!(s["held_bytes"].as_u64().unwrap(), 16 * params / 2);
        assert!(s["plan_device_bytes"].as_u64() > s["plan_bytes"].as_u64());
    }
    let mfu = v["mfu"].as_f64().unwrap();
    let want = v["achieved_flops"].as_f64().unwrap() / 2e11;
    assert!((mfu / want - 1.0).abs() < 1e-9, "{v}");
    assert!(v["memory_plan"].as_str().unwrap().contains("on cpu (2 devices)"), "{v}");
    let phase = |k: &str| v["phases"][k].as_f64().unwrap_or_else(|| panic!("{k} in {v}"));
    assert!(phase("compute") > 0.0 && phase("reduce_scatter") > 0.0 && phase("update") > 0.0);
    assert!(phase("gather") >= 0.0);
}

/// `bench train` refuses bad flags by name, and without libtorch says how to get it.
#[test]
fn bench_train_explains_bad_flags_and_its_requirements() {
    let ctx = TestContext::new();
    let out = ctx.loco(&["bench", "train", "--preset", "3b"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("expected one of tiny, 150m, 1b, 10b"), "{}", stderr(&out));
    let out = ctx.loco(&["bench", "train", "--device", "gpu0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("expected cpu, cuda or cuda:N"), "{}", stderr(&out));
    let out = ctx.loco(&["bench", "train", "--seq-len", "65"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    if cfg!(feature = "torch") {
        assert!(err.contains("--seq-len: expected 1 ..= 64"), "{err}");
    } else {
        assert!(err.contains("--features torch"), "{err}");
    }
}

/// The gloo comparison script: both implementations' rows, pooled over interleaved rounds, with
/// the machine's figures. Small sizes (it is the script's plumbing that is tested here, not the
/// ratios); needs the PyTorch environment, which the torch-feature test command has set up.
#[cfg(feature = "torch")]
#[test]
fn the_gloo_comparison_script_prints_both_implementations() {
    let _one = crate::common::one_real_run_at_a_time();
    let out = std::process::Command::new("bash")
        .args(["scripts/bench-allreduce-vs-gloo.sh", "2", "20000", "2", "2"])
        .current_dir(TestContext::repo())
        .env("LOCO_BIN", env!("CARGO_BIN_EXE_loco"))
        .env_remove("LOCO_LOG")
        .output()
        .expect("run the script");
    let text = stdout(&out);
    assert!(out.status.success(), "stdout: {text}\nstderr: {}", stderr(&out));
    assert!(
        text.contains("over 2 processes on loopback, 4 repetitions each in 2 round(s)"),
        "{text}"
    );
    assert!(text.contains("memcpy on one core"), "{text}");
    for name in ["torch gloo fp32", "loco ring fp32", "loco ring uint8", "loco ring int8-block"] {
        let row = text.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("{text}"));
        let figures: Vec<f64> =
            row[name.len()..].split_whitespace().map(|f| f.parse().expect("a number")).collect();
        assert_eq!(figures.len(), 5, "{row}");
        assert!(figures.iter().all(|f| f.is_finite() && *f > 0.0), "{row}");
        // Best at most the median; gloo's own ratios are 1.
        assert!(figures[0] <= figures[2], "{row}");
        if name.starts_with("torch") {
            assert_eq!((figures[1], figures[3]), (1.0, 1.0), "{row}");
        }
    }
    assert!(text.contains("the targets, uint8 at most 0.5x gloo and fp32 at most 1.2x"), "{text}");
    // A bad argument is refused before anything runs.
    let bad = std::process::Command::new("bash")
        .args(["scripts/bench-allreduce-vs-gloo.sh", "four"])
        .current_dir(TestContext::repo())
        .output()
        .expect("run the script");
    assert_eq!(bad.status.code(), Some(2));
    assert!(stderr(&bad).contains("got 'four'"), "{}", stderr(&bad));
}
