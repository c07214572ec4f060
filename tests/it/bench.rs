//! `loco bench codec` and `loco bench allreduce`.

use crate::common::{TestContext, stderr, stdout};

#[test]
fn bench_allreduce_json_has_the_contract_fields() {
    let ctx = TestContext::new();
    let out = ctx.loco(&[
        "bench", "allreduce", "--world", "4", "--elements", "100000", "--codec", "uint8", "--json",
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

#[test]
fn bench_codec_prints_memcpy_and_ratios() {
    let ctx = TestContext::new();
    let out = ctx.loco(&["bench", "codec", "--elements", "65536", "--repeats", "1", "--threads", "2"]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let text = stdout(&out);
    for needle in ["memcpy", "uint8", "int8-block", "fp16", "bf16", "fp32"] {
        assert!(text.contains(needle), "missing {needle} in:\n{text}");
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
}
