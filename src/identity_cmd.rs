//! `loco keygen`, and the identity (key and roster) of a coordinator or worker process.

use crate::InputError;
use anyhow::{Result, anyhow};
use loco_core::ids::NodeId;
use loco_core::scenario::Scenario;
use loco_real::identity::{COORDINATOR_NAME, Identity, NodeKey, Roster};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// `loco keygen`.
#[derive(Debug, clap::Args)]
pub(crate) struct KeygenArgs {
    /// The key file to write (mode 0600; an existing file is never overwritten). With
    /// --public, the key file to read.
    pub(crate) file: PathBuf,
    /// The node's name in the roster line printed (the scenario's name of the node, or
    /// `coordinator`); default: the file's name without its extension.
    #[arg(long)]
    pub(crate) name: Option<String>,
    /// Print the roster line of an existing key file instead of making one.
    #[arg(long)]
    pub(crate) public: bool,
}

/// A process's key and roster, on the command line (both override the scenario).
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct IdentityArgs {
    /// This node's key file (`loco keygen`). Default: `<checkpoint dir>/<node>.key`
    /// (`coordinator.key` for the coordinator), beside the node's checkpoints.
    #[arg(long, value_name = "FILE")]
    pub(crate) key: Option<PathBuf>,
    /// The run's roster: every node's public key (overrides `[real] roster`).
    #[arg(long, value_name = "FILE")]
    pub(crate) roster: Option<PathBuf>,
}

/// `loco keygen`: writes a fresh key, or reads one, and prints its roster line.
pub(crate) fn keygen(a: &KeygenArgs) -> Result<()> {
    let name = a.name.clone().unwrap_or_else(|| {
        a.file.file_stem().map_or("node".into(), |s| s.to_string_lossy().into_owned())
    });
    let key = if a.public {
        NodeKey::load(&a.file).map_err(|e| InputError(anyhow!(e)))?
    } else {
        let key = NodeKey::create(&a.file).map_err(|e| InputError(anyhow!(e)))?;
        eprintln!(
            "loco: wrote {} (private: it stays on this machine); add this line under [keys] in \
             the coordinator's roster, and in this node's own roster beside the coordinator's \
             line:",
            a.file.display()
        );
        key
    };
    let line = Roster::new([(NodeId(0), key.public())].into())
        .map(|r| r.to_toml(|_| name.clone()))
        .unwrap_or_default();
    // The roster's text has a comment and the table's name first: print the line alone.
    if let Some(l) = line.lines().last() {
        println!("{l}");
    }
    Ok(())
}

/// The id a roster name stands for in scenario `s`.
fn id_of(s: &Scenario, name: &str) -> Option<NodeId> {
    if name == COORDINATOR_NAME {
        return Some(NodeId::COORDINATOR);
    }
    s.node_by_name(name).map(|n| n.id)
}

/// The identity of process `me` (named `name`) of scenario `s` at `path`, and its roster's
/// file: `None` without a roster where the process listens on loopback; a refusal (exit 2,
/// saying what to do) without one beyond it, or with a key the roster does not give this node.
pub(crate) fn identity(
    s: &Scenario,
    path: &Path,
    a: &IdentityArgs,
    checkpoint_root: Option<PathBuf>,
    (me, name): (NodeId, &str),
    listen: SocketAddr,
) -> Result<Option<(Arc<Identity>, PathBuf)>> {
    let base = loco_real::launch::scenario_base(path);
    let roster_path = a.roster.clone().or_else(|| s.real().roster.as_ref().map(|r| base.join(r)));
    let input = |msg: String| -> anyhow::Error { InputError(anyhow!(msg)).into() };
    let Some(roster_path) = roster_path else {
        if listen.ip().is_loopback() {
            return Ok(None);
        }
        return Err(input(format!(
            "{}: refusing to listen on {listen} without a roster: with the run secret alone any \
             member can claim another's node id, the coordinator's included. On each machine \
             make its node's key (`loco keygen ckpt/{name}.key --name {name}`), gather the lines \
             it prints into one file under `[keys]`, give that file to every process as \
             `[real] roster` or --roster, and each process its key with --key (default \
             <checkpoint dir>/<node>.key)",
            path.display()
        )));
    };
    if s.real().secret.is_none()
        && std::env::var(&s.real().secret_env).map_or(true, |v| v.is_empty())
    {
        return Err(input(format!(
            "{}: a roster ({}) needs the run secret too (in {} or `[real] secret`): the \
             handshake proves both",
            path.display(),
            roster_path.display(),
            s.real().secret_env
        )));
    }
    if s.node_by_name(COORDINATOR_NAME).is_some() {
        return Err(input(format!(
            "{}: a node is named `{COORDINATOR_NAME}`, which a roster keeps for the coordinator: \
             rename it",
            path.display()
        )));
    }
    let key_path = a
        .key
        .clone()
        .or_else(|| checkpoint_root.map(|d| d.join(format!("{name}.key"))))
        .ok_or_else(|| {
            input(format!(
                "{}: this run has a roster ({}): give this node's key with --key FILE (`loco \
                 keygen FILE --name {name}` makes one), or a checkpoint directory to find it in \
                 as {name}.key",
                path.display(),
                roster_path.display()
            ))
        })?;
    let key = NodeKey::load(&key_path).map_err(|e| match e {
        loco_real::identity::IdentityError::Io { source, .. }
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            input(format!(
                "{}: no such key file (this run has a roster, {}): make this node's key with \
                 `loco keygen {} --name {name}` and add the line it prints to the roster, or \
                 give another with --key",
                key_path.display(),
                roster_path.display(),
                key_path.display()
            ))
        }
        e => input(e.to_string()),
    })?;
    let roster = Roster::load(&roster_path, |n| id_of(s, n)).map_err(|e| input(e.to_string()))?;
    if me != NodeId::COORDINATOR && roster.key(NodeId::COORDINATOR).is_none() {
        return Err(input(format!(
            "{}: no key for `{COORDINATOR_NAME}`: a worker's roster names the coordinator's key \
             (and its own; the coordinator tells it the others')",
            roster_path.display()
        )));
    }
    let identity = Identity::new(me, key, roster)
        .map_err(|e| input(format!("{}: node {name}: {e}", roster_path.display())))?;
    Ok(Some((Arc::new(identity), roster_path)))
}

/// How often a process looks at its roster file for changes.
const ROSTER_POLL: std::time::Duration = std::time::Duration::from_secs(5);

/// Reads the roster again whenever its file changes (polled every [`ROSTER_POLL`]), on the
/// runtime this is called in, for as long as the process runs: a node is added to a running
/// mesh by adding its line to the coordinator's roster. A roster that does not read, or no
/// longer gives this node its key, is refused with a warning and the one in use is kept.
pub(crate) fn watch_roster(identity: Arc<Identity>, path: PathBuf, s: Arc<Scenario>) {
    let stamp = |p: &Path| std::fs::metadata(p).and_then(|m| Ok((m.modified()?, m.len()))).ok();
    let mut last = stamp(&path);
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(ROSTER_POLL).await;
            let now = stamp(&path);
            if now == last {
                continue;
            }
            last = now;
            let taken =
                Roster::load(&path, |n| id_of(&s, n)).map_err(|e| e.to_string()).and_then(|r| {
                    let n = r.len();
                    identity.set_roster(r).map(|()| n)
                });
            match taken {
                Ok(n) => tracing::info!("{}: roster read again: {n} keys", path.display()),
                Err(e) => {
                    tracing::warn!("{}: roster not taken, the one in use kept: {e}", path.display())
                }
            }
        }
    });
}
