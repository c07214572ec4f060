//! What the script-driven tests share: `testdata/<dir>/*.txt` files, each a script, a line
//! `----`, and the expected trace.

use std::path::{Path, PathBuf};

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
