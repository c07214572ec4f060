//! Shared fixtures: run the built `loco` binary in a fresh temporary directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A test's sandbox: a temporary directory and the binary under test.
pub(crate) struct TestContext {
    dir: tempfile::TempDir,
}

impl TestContext {
    pub(crate) fn new() -> TestContext {
        TestContext { dir: tempfile::tempdir().expect("temp dir") }
    }

    /// The temporary directory (outputs go here).
    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The repository root (scenarios/ lives there).
    pub(crate) fn repo() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
    }

    /// Runs `loco ARGS...` in the repository root and returns its output.
    pub(crate) fn loco(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_loco"))
            .args(args)
            .current_dir(Self::repo())
            .env_remove("LOCO_LOG")
            .output()
            .expect("run loco")
    }
}

/// Stdout as text.
pub(crate) fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Stderr as text.
pub(crate) fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs of real processes are timed (heartbeats, timeouts): one at a time within this test
/// binary, so that they do not starve each other of the machine's cores.
pub(crate) fn one_real_run_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One row of a CSV file, by column name.
pub type Row = BTreeMap<String, String>;

/// Reads a CSV file with a header into rows by column name; panics naming the file.
pub fn read_csv(path: &Path) -> Vec<Row> {
    let mut r = csv::Reader::from_path(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let header: Vec<String> = r.headers().expect("a header").iter().map(str::to_string).collect();
    r.records()
        .map(|rec| {
            header.iter().cloned().zip(rec.expect("a record").iter().map(str::to_string)).collect()
        })
        .collect()
}
