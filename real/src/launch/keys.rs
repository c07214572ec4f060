//! The credentials of a launch's processes: the run's secret when the user gave none, and a
//! fresh key per node and for the coordinator, made for each run (`nodes/keys/`), the
//! coordinator's roster that names them all, and each worker's roster that names only the
//! coordinator and itself (it learns the others' keys from the coordinator's directories), so
//! that the processes of a run with a secret bind their ids to keys as a run across machines
//! does.

use super::LaunchError;
use crate::identity::{COORDINATOR_NAME, NodeKey, Roster};
use loco_core::ids::NodeId;
use loco_core::scenario::Scenario;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The coordinator's roster's file name in the keys directory.
pub(super) const ROSTER: &str = "roster.toml";

/// A worker's roster's file name in the keys directory.
pub(super) fn worker_roster(name: &str) -> String {
    format!("{name}.roster.toml")
}

/// Writes a key for every node of `s` and for the coordinator into `dir` (emptied first: the
/// keys are this run's), and the roster; gives `dir`.
pub(super) fn make(s: &Scenario, dir: &Path) -> Result<PathBuf, LaunchError> {
    let io = |action, path: &Path| {
        let path = path.to_path_buf();
        move |source| LaunchError::Io { action, path, source }
    };
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(io("removing", dir))?;
    }
    std::fs::create_dir_all(dir).map_err(io("creating", dir))?;
    let mut names = BTreeMap::new();
    let mut keys = BTreeMap::new();
    let all = std::iter::once((NodeId::COORDINATOR, COORDINATOR_NAME.to_string()))
        .chain(s.nodes().iter().map(|n| (n.id, n.name.clone())));
    for (id, name) in all {
        let path = dir.join(format!("{name}.key"));
        let key = NodeKey::create(&path).map_err(|e| LaunchError::Io {
            action: "writing",
            path: path.clone(),
            source: std::io::Error::other(e.to_string()),
        })?;
        keys.insert(id, key.public());
        names.insert(id, name);
    }
    // Fresh keys from the system's random source do not repeat.
    let roster = Roster::new(keys).map_err(|id| LaunchError::Io {
        action: "making the roster of",
        path: dir.to_path_buf(),
        source: std::io::Error::other(format!("node {id}'s key is another node's too")),
    })?;
    let name = |id: NodeId| names.get(&id).cloned().unwrap_or_default();
    let path = dir.join(ROSTER);
    std::fs::write(&path, roster.to_toml(name)).map_err(io("writing", &path))?;
    for n in s.nodes() {
        let own = [n.id, NodeId::COORDINATOR].into_iter();
        let own = own.filter_map(|id| Some((id, *roster.key(id)?))).collect();
        let own = Roster::new(own).unwrap_or_default();
        let path = dir.join(worker_roster(&n.name));
        std::fs::write(&path, own.to_toml(name)).map_err(io("writing", &path))?;
    }
    Ok(dir.to_path_buf())
}

/// Whether the user gave the run a secret: the scenario's `secret_env` variable, or `[real]
/// secret`.
pub(super) fn secret_given(s: &Scenario) -> bool {
    let real = s.real();
    std::env::var(&real.secret_env).is_ok_and(|v| !v.is_empty()) || real.secret.is_some()
}

/// A secret for a run whose processes listen beyond loopback and whose user gave none (neither
/// the scenario's `secret_env` variable nor `[real] secret`): every connection of the run is
/// then authenticated and encrypted with it. `None` when the user gave one (the processes
/// inherit the variable, or read the file).
pub(super) fn run_secret(s: &Scenario) -> Option<String> {
    if secret_given(s) {
        return None;
    }
    let bytes: [u8; 32] = rand::random();
    Some(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
