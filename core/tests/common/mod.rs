//! What the script-driven tests share: `testdata/<dir>/*.txt` files, each a script, a line
//! `----`, and the expected trace.

use loco_core::ids::NodeId;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A script's duration: `30s`, `500ms`, `1.5s`.
pub fn duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .map(|i| s.split_at(i))
        .ok_or_else(|| format!("{s}: expected a duration like 30s or 500ms"))?;
    let v: f64 = num.parse().map_err(|_| format!("{s}: expected a number"))?;
    match unit {
        "s" => Ok(Duration::from_secs_f64(v)),
        "ms" => Ok(Duration::from_secs_f64(v / 1000.0)),
        _ => Err(format!("{s}: expected a unit s or ms")),
    }
}

/// A script's node: `n3`.
pub fn node(s: &str) -> Result<NodeId, String> {
    s.strip_prefix('n')
        .and_then(|n| n.parse().ok())
        .map(NodeId)
        .ok_or_else(|| format!("{s}: expected a node like n3"))
}

/// A node like `n3`, or `coordinator` (for a link's end).
#[allow(dead_code)] // Not every test binary that includes this module cuts links.
pub fn host(s: &str) -> Result<NodeId, String> {
    if s == "coordinator" { Ok(NodeId::COORDINATOR) } else { node(s) }
}

fn scripts(dir: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/testdata").join(dir);
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{} is not readable: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "txt"))
        .collect();
    v.sort();
    v
}

/// Runs every script of `testdata/<dir>` (at least `min` of them) through `run` and compares
/// the trace with the expected one; `check` sees each trace first. With `LOCO_REWRITE` set the
/// expected part is rewritten from the actual output instead (review the diff).
pub fn run_scripts(
    dir: &str,
    min: usize,
    run: impl Fn(&str) -> Result<String, String>,
    check: impl Fn(&Path, &str),
) {
    let rewrite = std::env::var_os("LOCO_REWRITE").is_some();
    let files = scripts(dir);
    assert!(files.len() >= min, "scripts found: {files:?}");
    let mut failed = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).expect("readable script");
        let (script, expected) = text.split_once("\n----\n").unwrap_or((text.as_str(), ""));
        let got = run(script).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        check(&path, &got);
        if rewrite {
            std::fs::write(&path, format!("{script}\n----\n{got}")).expect("writable script");
        } else if got != expected {
            eprintln!("{}: expected\n{expected}\ngot\n{got}", path.display());
            failed.push(path);
        }
    }
    assert!(failed.is_empty(), "traces differ (LOCO_REWRITE=1 rewrites): {failed:?}");
}
