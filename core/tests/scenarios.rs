//! Every shipped scenario file loads and validates (reference.md, test case 16), and the
//! INTELLECT-1 ones describe what the report describes.

use loco_core::NodeId;
use loco_core::codec::CodecKind;
use loco_core::scenario::{ChurnAction, Numerics, Preset, Published, Scenario};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios")
}

/// Every `*.toml` in scenarios/, sorted by file name.
fn files() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir())
        .expect("scenarios/ is readable")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    out.sort();
    out
}

fn load(name: &str) -> Scenario {
    let path = dir().join(name);
    Scenario::load(&path).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn every_scenario_file_validates() {
    let files = files();
    assert!(files.len() >= 9, "expected the shipped scenarios, found {files:?}");
    let mut names = BTreeSet::new();
    for path in &files {
        let s = Scenario::load(path).unwrap_or_else(|e| panic!("{e}"));
        // The scenario's name is its file name: `loco replay intellect1-global` finds it.
        let stem = path.file_stem().and_then(|s| s.to_str()).expect("a UTF-8 file name");
        assert_eq!(s.name(), stem, "{}", path.display());
        assert!(names.insert(s.name().to_owned()), "duplicate scenario name {}", s.name());
        assert!(s.description().is_some_and(|d| !d.is_empty()), "{stem}: no description");
        // Every file starts with a comment header saying what it models and assumes.
        let text = std::fs::read_to_string(path).expect("readable");
        assert!(text.starts_with("# "), "{stem}: no comment header");
        assert!(text.contains("Models:") && text.contains("Assumes"), "{stem}: header");
        // Node names are unique and ids are positions.
        let node_names: BTreeSet<&str> = s.nodes().iter().map(|n| n.name.as_str()).collect();
        assert_eq!(node_names.len(), s.nodes().len(), "{stem}");
        for (i, n) in s.nodes().iter().enumerate() {
            assert_eq!(n.id, NodeId(i as u32));
            for m in s.nodes() {
                assert!(s.node_link(n.id, m.id).is_some(), "{stem}: {} -> {}", n.name, m.name);
            }
        }
        assert!(s.initial_nodes().count() >= 1, "{stem}: nobody at the start");
        let times: Vec<Duration> = s.churn().iter().map(|e| e.at).collect();
        assert!(times.windows(2).all(|w| w[0] <= w[1]), "{stem}: churn not sorted");
        // The same text gives the same scenario (no hidden state, no randomness in loading).
        assert_eq!(Scenario::from_toml_str(&text, "again.toml").unwrap(), s);
    }
}

#[test]
fn the_default_scenario_is_intellect1_global() {
    let s = load("intellect1-global.toml");
    assert_eq!(s.published(), Some(Published::Global));
    assert_eq!(s.nodes().len(), 14);
    assert!(s.nodes().iter().all(|n| n.gpus == 8));
    assert_eq!(s.total_gpus(), 112);
    assert_eq!(s.regions().len(), 3);
    assert_eq!(s.model().preset, Some(Preset::B10));
    let params = s.model().param_count() as f64;
    assert!((params / 10.21e9 - 1.0).abs() < 0.01, "{params}");
    assert_eq!(s.diloco().inner_steps, 100);
    assert_eq!(s.diloco().codec, CodecKind::Uint8);
    assert!(s.nodes().iter().all(|n| n.step_time == Duration::from_millis(22_800)));
    // Link rates stay within the report's 250 Mbit/s (achieved) to 4 Gbit/s (measured).
    for l in s.links() {
        let (lo, hi) = l.bandwidth.range().expect("a validated link");
        assert!(lo.bits_per_sec() >= 250e6 && hi.bits_per_sec() <= 4e9, "{l:?}");
    }
    assert_eq!(s.sim().numerics, Numerics::Virtual);
}

#[test]
fn published_settings_are_covered() {
    assert_eq!(load("intellect1-usa.toml").published(), Some(Published::Usa));
    assert_eq!(load("intellect1-usa-eu.toml").published(), Some(Published::UsaEu));
    assert_eq!(load("intellect1-usa.toml").regions().len(), 1);
    assert_eq!(load("intellect1-usa-eu.toml").regions().len(), 2);
}

#[test]
fn drop_4_of_12_drops_four_at_once() {
    let s = load("drop-4-of-12.toml");
    assert_eq!(s.nodes().len(), 12);
    let crashes: Vec<&Vec<NodeId>> = s
        .churn()
        .iter()
        .filter_map(|e| match &e.action {
            ChurnAction::Crash(ids) => Some(ids),
            _ => None,
        })
        .collect();
    assert_eq!(crashes.len(), 1);
    assert_eq!(crashes[0].len(), 4);
}

#[test]
fn small_scenarios_are_small() {
    for name in ["small.toml", "tiny-real.toml"] {
        let s = load(name);
        assert_eq!(s.model().preset, Some(Preset::Tiny), "{name}");
        assert_eq!(s.sim().numerics, Numerics::Real, "{name}");
        assert!(s.stop().outer_steps.is_some_and(|n| n <= 40), "{name}");
        let kinds: Vec<&ChurnAction> = s.churn().iter().map(|e| &e.action).collect();
        assert!(kinds.iter().any(|a| matches!(a, ChurnAction::Crash(_))), "{name}: no crash");
        assert!(kinds.iter().any(|a| matches!(a, ChurnAction::Join(_))), "{name}: no join");
    }
    assert_eq!(load("small.toml").nodes().len(), 4);
    assert_eq!(load("tiny-real.toml").nodes().len(), 3);
}

// ----- untrusted files: no scenario text panics the parser -----

/// Every number of a shipped scenario replaced by a hostile value, and arbitrary byte edits:
/// the parser and the validation answer `Ok` or an error, never a panic. More cases:
/// `PROPTEST_CASES=100000 cargo test -p loco-core --release --test scenarios hostile`.
mod hostile {
    use super::*;
    use proptest::prelude::*;

    fn texts() -> Vec<String> {
        files().iter().map(|p| std::fs::read_to_string(p).expect("readable")).collect()
    }

    /// The byte ranges of the numbers in `s`.
    fn numbers(s: &str) -> Vec<std::ops::Range<usize>> {
        let b = s.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < b.len() {
            let starts = b[i].is_ascii_digit() && (i == 0 || !b[i - 1].is_ascii_alphanumeric());
            if starts {
                let j = (i..b.len())
                    .find(|&j| !(b[j].is_ascii_digit() || b"._eE+-".contains(&b[j])))
                    .unwrap_or(b.len());
                out.push(i..j);
                i = j;
            } else {
                i += 1;
            }
        }
        out
    }

    const HOSTILE: [&str; 14] = [
        "0",
        "-1",
        "-0.0",
        "1e308",
        "-1e308",
        "nan",
        "inf",
        "-inf",
        "18446744073709551615",
        "-9223372036854775808",
        "9223372036854775807",
        "1e-320",
        "\"x\"",
        "[]",
    ];

    /// Every number of every shipped scenario replaced, one at a time, by each hostile value
    /// (deterministic: found a heartbeat timeout of 2^64 - 1 s and a step time times its
    /// jitter that overflowed a Duration and panicked).
    #[test]
    fn each_number_replaced_by_each_hostile_value_is_refused_or_taken() {
        let mut parsed = 0;
        for text in texts() {
            for r in numbers(&text) {
                for v in HOSTILE {
                    let mut t = text.clone();
                    t.replace_range(r.clone(), v);
                    let _ = Scenario::from_toml_str(&t, "hostile.toml");
                    parsed += 1;
                }
            }
        }
        assert!(parsed > 1000, "{parsed}");
    }

    /// Texts the fuzz target (`scripts/fuzz.sh`) found to panic the parser: the error locator
    /// re-parsed them with toml_edit 0.23, which panicked on a dotted key after a stray `=`
    /// ("all items have spans"); toml_edit 0.25 answers an error.
    #[test]
    fn texts_the_fuzzer_found_are_errors() {
        for text in ["==\n.=", "[diloco]\n===:===0\n"] {
            let err = Scenario::from_toml_str(text, "fuzzed.toml").unwrap_err();
            assert!(err.to_string().starts_with("fuzzed.toml:"), "{err}");
        }
    }

    proptest! {
        #[test]
        fn hostile_numbers_never_panic(file in any::<prop::sample::Index>(),
                                       picks in prop::collection::vec((any::<prop::sample::Index>(), 0..HOSTILE.len()), 1..4)) {
            let texts = texts();
            let mut text = file.get(&texts).clone();
            for (at, v) in picks {
                let nums = numbers(&text);
                if nums.is_empty() {
                    break;
                }
                let r = at.get(&nums).clone();
                text.replace_range(r, HOSTILE[v]);
            }
            let _ = Scenario::from_toml_str(&text, "hostile.toml");
        }

        #[test]
        fn byte_edits_never_panic(file in any::<prop::sample::Index>(),
                                  edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0..3u8), 1..8)) {
            let texts = texts();
            let mut bytes = file.get(&texts).clone().into_bytes();
            for (at, byte, op) in edits {
                if bytes.is_empty() {
                    break;
                }
                let i = at.index(bytes.len());
                match op {
                    0 => bytes[i] = byte,
                    1 => bytes.insert(i, byte),
                    _ => {
                        bytes.remove(i);
                    }
                }
            }
            let text = String::from_utf8_lossy(&bytes);
            let _ = Scenario::from_toml_str(&text, "hostile.toml");
        }
    }
}
