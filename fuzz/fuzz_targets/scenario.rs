//! The scenario parser and validator on arbitrary text: an error or a scenario, never a panic.
//! Seeded with the shipped scenarios (scripts/fuzz.sh).
#![no_main]

use libfuzzer_sys::fuzz_target;
use loco_core::scenario::Scenario;

fuzz_target!(|bytes: &[u8]| {
    if let Ok(text) = std::str::from_utf8(bytes)
        && let Ok(s) = Scenario::from_toml_str(text, "fuzz.toml")
    {
        // What replay and launch ask of every valid scenario first.
        assert!(!s.nodes().is_empty(), "a valid scenario without nodes");
    }
});
