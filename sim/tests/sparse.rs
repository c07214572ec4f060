//! The sparse codec in the simulator: a gathering all-reduce with error feedback keeps the
//! replicas bit-identical through a crash and a join, and moves what its schedule says.

use loco_core::codec::CodecKind;
use loco_core::metrics::EventKind;
use loco_core::scenario::ExecutorKind;
use loco_core::scenario::Scenario;
use loco_sim::{ReplayOptions, RunOutput, replay};
use std::collections::BTreeMap;
use std::path::PathBuf;

fn scenario(name: &str, edit: impl Fn(String) -> String) -> Scenario {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scenarios").join(name);
    let text = std::fs::read_to_string(&path).expect("scenario");
    Scenario::from_toml_str(&edit(text), name).unwrap_or_else(|e| panic!("{e}"))
}

fn run(s: &Scenario, opts: ReplayOptions) -> RunOutput {
    let out = replay(s, opts).expect("replay");
    assert!(out.summary.invariants.ok, "{:?}", out.summary.invariants.violations);
    out
}

/// Every node that committed an outer step holds the same weights after it.
fn assert_replicas_agree(out: &RunOutput) {
    let mut by_step: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for r in &out.rows {
        if let Some(h) = &r.weights_hash {
            by_step.entry(r.outer_step).or_default().push(h.to_string());
        }
    }
    assert!(!by_step.is_empty());
    for (step, hashes) in by_step {
        assert!(hashes.windows(2).all(|w| w[0] == w[1]), "step {step}: {hashes:?}");
    }
}

#[test]
fn sparse_with_error_feedback_survives_a_crash_and_a_join_with_identical_replicas() {
    let s = scenario("small.toml", |t| t.replace(r#"codec = "uint8""#, r#"codec = "sparse""#));
    assert!(matches!(s.diloco().codec, CodecKind::Sparse(_)));
    assert_eq!(s.diloco().error_feedback, Some(loco_core::scenario::DEFAULT_ERROR_FEEDBACK));
    for executor in [ExecutorKind::Turmoil, ExecutorKind::Events] {
        let out = run(&s, ReplayOptions { executor: Some(executor), ..ReplayOptions::default() });
        assert_eq!(out.summary.outer_steps, 10, "{executor:?}");
        let of = |kind: EventKind, node: &str| {
            out.events.iter().filter(|e| e.kind == kind && e.node.as_deref() == Some(node)).count()
        };
        assert_eq!(of(EventKind::Evict, "n-2"), 1, "{executor:?}");
        assert_eq!(of(EventKind::RecoveryDone, "n-3"), 1, "{executor:?}");
        assert_replicas_agree(&out);
    }
}

#[test]
fn a_gathering_ring_sends_w_minus_one_contributions() {
    // Two outer steps of INTELLECT-1's 14 nodes, virtual numerics: each node sends every other
    // node's contribution on once, W - 1 sparse encodings of the model, against a summing
    // ring's 2 (W - 1) / W uint8 encodings.
    let bytes = |codec: &str| {
        let s = scenario("intellect1-global.toml", |t| {
            t.replace(r#"codec = "uint8""#, &format!("codec = \"{codec}\""))
        });
        let out = run(&s, ReplayOptions { max_outer_steps: Some(2), ..ReplayOptions::default() });
        let params = s.model().param_count();
        let payload = s.model().payload_bytes(s.diloco().codec);
        let mut sent: Vec<u64> = out.rows.iter().map(|r| r.bytes_sent).collect();
        sent.sort_unstable();
        (sent[sent.len() / 2], payload, params, s.nodes().len() as u64)
    };
    let (sparse, sparse_payload, params, w) = bytes("sparse");
    let (uint8, uint8_payload, _, _) = bytes("uint8");
    assert!(uint8_payload >= 50 * sparse_payload, "{uint8_payload} vs {sparse_payload}");
    assert!(sparse_payload * 50 <= params, "1% of {params} values in {sparse_payload} bytes");
    // The median row's bytes: its all-reduce, and the same bandwidth probes in both runs.
    let want = (w - 1) * sparse_payload;
    let ring = 2 * (w - 1) * uint8_payload / w;
    eprintln!("sparse {sparse} (gather {want}), uint8 {uint8} (ring {ring})");
    assert!(sparse >= want && uint8 >= ring, "sparse {sparse} vs {want}, uint8 {uint8} vs {ring}");
    let (extra_sparse, extra_uint8) = (sparse - want, uint8 - ring);
    assert!(extra_sparse.abs_diff(extra_uint8) < want / 20, "{extra_sparse} vs {extra_uint8}");
}
