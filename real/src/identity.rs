//! Who is who: per-node static keys and the run's roster.
//!
//! With a run secret alone, every member proves that it knows the secret, and nothing more: any
//! member could claim any node id at a handshake, the coordinator's included. With a roster, an
//! id is bound to a key: each node holds an X25519 static key ([`NodeKey`], made by
//! `loco keygen`, kept private on its machine) and the roster ([`Roster`], the same file on
//! every machine) names every node's public key. The handshake ([`crate::tcp`]) then proves
//! both the secret and the key of the id a dialer claims, and the key of the node it dials: a
//! key that is not the roster's for the id it claims is refused, logged and counted.
//!
//! Files:
//! - a key file holds one line of 64 hex digits (the private key) and comment lines; it is
//!   written with mode 0600 and refused when others may read it, as ssh refuses a private key;
//! - a roster is TOML with one table, `[keys]`, of node names (the scenario's, and
//!   `coordinator`) to public keys in hex; `loco keygen` prints a node's line.
//!
//! ```toml
//! [keys]
//! coordinator = "4c1e...64 hex digits"
//! us-east-0 = "9a07..."
//! ```

use loco_core::digest::Digest;
use loco_core::ids::NodeId;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// The name the coordinator has in a roster.
pub const COORDINATOR_NAME: &str = "coordinator";

/// What went wrong with a key file or a roster; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// The file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A key file that would be overwritten.
    #[error(
        "{path}: exists already; a node key is never overwritten (remove it first, or choose another path)"
    )]
    Exists {
        /// The file.
        path: PathBuf,
    },
    /// A private key that others may read.
    #[error("{path}: permissions {mode:03o} let others read this private key; `chmod 600` it")]
    TooOpen {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// A file whose content is not what it should be.
    #[error("{path}: {field}: expected {expected}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Where in it.
        field: String,
        /// What was expected, and what was found.
        expected: String,
    },
}

/// A node's public key (X25519), written as 64 hex digits.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PublicKey(pub [u8; 32]);

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&Digest::from_bytes(self.0), f)
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({self})")
    }
}

impl std::str::FromStr for PublicKey {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        s.parse::<Digest<32>>()
            .map(|d| PublicKey(*d.as_bytes()))
            .map_err(|_| format!("a public key of 64 hex digits, not {s:?}"))
    }
}

impl PublicKey {
    /// The first 16 hex digits, for logs.
    pub fn short(&self) -> String {
        self.to_string()[..16].to_string()
    }
}

/// A node's static key pair. The private half never leaves the process (nor its logs: the
/// `Debug` form shows the public half only).
#[derive(Clone)]
pub struct NodeKey {
    private: [u8; 32],
    public: PublicKey,
}

impl fmt::Debug for NodeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodeKey {{ public: {} }}", self.public)
    }
}

/// The Noise parameters the keys are made for (X25519).
fn keypair_from(private: [u8; 32]) -> NodeKey {
    // X25519 public key = private * basepoint, as snow computes it for its static key.
    let public = x25519_public(&private);
    NodeKey { private, public: PublicKey(public) }
}

fn x25519_public(private: &[u8; 32]) -> [u8; 32] {
    // snow exposes the public half only through a keypair it generates; derive it with the
    // same resolver: a handshake state built with this private key reports its public key.
    let params: snow::params::NoiseParams =
        "Noise_N_25519_ChaChaPoly_BLAKE2s".parse().expect("valid noise parameters");
    let resolver = snow::resolvers::DefaultResolver;
    let mut dh = snow::resolvers::CryptoResolver::resolve_dh(&resolver, &params.dh)
        .expect("the default resolver has X25519");
    dh.set(private);
    let mut out = [0u8; 32];
    out.copy_from_slice(dh.pubkey());
    out
}

impl NodeKey {
    /// A fresh key from the operating system's random source.
    pub fn generate() -> NodeKey {
        keypair_from(rand::random())
    }

    /// The key with this private half (tests, fuzzing).
    pub fn from_private(private: [u8; 32]) -> NodeKey {
        keypair_from(private)
    }

    /// Its public half.
    pub fn public(&self) -> PublicKey {
        self.public
    }

    /// Its private half (for the handshake).
    pub(crate) fn private(&self) -> &[u8; 32] {
        &self.private
    }

    /// Writes a fresh key to `path` (mode 0600; never over an existing file).
    pub fn create(path: &Path) -> Result<NodeKey, IdentityError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let key = NodeKey::generate();
        let io = |source| IdentityError::Io { path: path.to_path_buf(), source };
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists => {
                    IdentityError::Exists { path: path.to_path_buf() }
                }
                _ => io(e),
            })?;
        let text = format!(
            "# loco node key: private, keep it on this machine. Public key: {}\n{}\n",
            key.public,
            Digest::from_bytes(key.private)
        );
        f.write_all(text.as_bytes()).and_then(|()| f.sync_all()).map_err(io)?;
        Ok(key)
    }

    /// Reads the key in `path`, refusing one that others may read.
    pub fn load(path: &Path) -> Result<NodeKey, IdentityError> {
        use std::os::unix::fs::PermissionsExt;
        let io = |source| IdentityError::Io { path: path.to_path_buf(), source };
        let meta = std::fs::metadata(path).map_err(io)?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(IdentityError::TooOpen { path: path.to_path_buf(), mode });
        }
        if meta.len() > 4096 {
            return Err(invalid(path, "the file", format!("a key file, not {} bytes", meta.len())));
        }
        let text = std::fs::read_to_string(path).map_err(io)?;
        let mut lines =
            text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#'));
        let (Some(line), None) = (lines.next(), lines.next()) else {
            return Err(invalid(path, "the key", "one line of 64 hex digits".into()));
        };
        let private = line
            .parse::<Digest<32>>()
            .map_err(|_| invalid(path, "the key", "one line of 64 hex digits".into()))?;
        Ok(keypair_from(*private.as_bytes()))
    }
}

fn invalid(path: &Path, field: &str, expected: String) -> IdentityError {
    IdentityError::Invalid { path: path.to_path_buf(), field: field.into(), expected }
}

/// The run's roster: every node's public key, by id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Roster {
    keys: BTreeMap<NodeId, PublicKey>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoster {
    keys: BTreeMap<String, String>,
}

impl Roster {
    /// A roster of these keys; `Err` names an id whose key another id has already (one key per
    /// id, or a node could speak as either).
    pub fn new(keys: BTreeMap<NodeId, PublicKey>) -> Result<Roster, NodeId> {
        let mut seen = BTreeMap::new();
        for (&id, key) in &keys {
            if seen.insert(*key, id).is_some() {
                return Err(id);
            }
        }
        Ok(Roster { keys })
    }

    /// Reads the roster in `path`; `id_of` gives the node id of a name (the scenario's nodes,
    /// and [`COORDINATOR_NAME`]), `None` for a name the run does not have.
    pub fn load(
        path: &Path,
        id_of: impl Fn(&str) -> Option<NodeId>,
    ) -> Result<Roster, IdentityError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| IdentityError::Io { path: path.to_path_buf(), source })?;
        let raw: RawRoster = toml::from_str(&text).map_err(|e| {
            invalid(
                path,
                "the roster",
                format!("a `[keys]` table of node = \"public key\" ({})", e.message()),
            )
        })?;
        let mut keys = BTreeMap::new();
        let mut names = BTreeMap::new();
        for (name, key) in &raw.keys {
            let field = format!("keys.{name}");
            let id = id_of(name).ok_or_else(|| {
                invalid(path, &field, "a node of the scenario, or `coordinator`".into())
            })?;
            let key: PublicKey = key.parse().map_err(|e| invalid(path, &field, e))?;
            if let Some(other) = names.insert(key, name) {
                return Err(invalid(
                    path,
                    &field,
                    format!("a key of its own (node {other} has the same key)"),
                ));
            }
            keys.insert(id, key);
        }
        Ok(Roster { keys })
    }

    /// The number of keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether it has no keys.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The key of `id`.
    pub fn key(&self, id: NodeId) -> Option<&PublicKey> {
        self.keys.get(&id)
    }

    /// The id whose key `key` is.
    pub fn id_of(&self, key: &PublicKey) -> Option<NodeId> {
        self.keys.iter().find(|(_, k)| *k == key).map(|(&id, _)| id)
    }

    /// Writes the roster as its file's text, with each id's `name`.
    pub fn to_toml(&self, name: impl Fn(NodeId) -> String) -> String {
        let mut out = String::from(
            "# The run's nodes and their public keys (`loco keygen` prints a node's line).\n[keys]\n",
        );
        for (&id, key) in &self.keys {
            out.push_str(&format!("{} = \"{key}\"\n", toml_key(&name(id))));
        }
        out
    }
}

/// `name` as a TOML key: bare where it may be, quoted otherwise.
fn toml_key(name: &str) -> String {
    let bare =
        !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if bare { name.to_string() } else { format!("{name:?}") }
}

/// How long an acceptor waits for the coordinator to name the key of an id it does not know yet
/// (a node admitted a moment ago may dial before the directory that names it arrives here).
pub const VOUCH_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// A node's identity in a run: its key, the roster that binds ids to keys (the file's, reloaded
/// when it changes), and, at a member, the keys the coordinator named in its directories.
///
/// The coordinator is the authority on who is in the run: its roster names every node it
/// admits, and it tells its members the keys of the peers it tells them to reach, over its own
/// authenticated connection. So a member's roster needs only the coordinator's key and its
/// own, and a node is added to a running mesh by adding its line to the coordinator's roster.
#[derive(Debug)]
pub struct Identity {
    /// This node's key.
    pub key: NodeKey,
    me: NodeId,
    roster: std::sync::RwLock<Roster>,
    vouched: std::sync::Mutex<BTreeMap<NodeId, PublicKey>>,
    changed: tokio::sync::Notify,
}

impl Identity {
    /// The identity of node `me`: `Err` says what is wrong when the roster gives `me` another key
    /// or none (this node could reach nobody, and nobody would take it).
    pub fn new(me: NodeId, key: NodeKey, roster: Roster) -> Result<Identity, String> {
        check_own(me, &key, &roster)?;
        Ok(Identity {
            key,
            me,
            roster: std::sync::RwLock::new(roster),
            vouched: std::sync::Mutex::new(BTreeMap::new()),
            changed: tokio::sync::Notify::new(),
        })
    }

    /// The node this identity is.
    pub fn me(&self) -> NodeId {
        self.me
    }

    /// The key of `id`: this node's own, the coordinator's from the roster, another node's as
    /// the coordinator last named it, else the roster's.
    pub fn key_of(&self, id: NodeId) -> Option<PublicKey> {
        if id == self.me {
            return Some(self.key.public());
        }
        let vouched = self.vouched.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = vouched.get(&id).filter(|_| id != NodeId::COORDINATOR) {
            return Some(*k);
        }
        drop(vouched);
        self.roster.read().unwrap_or_else(|e| e.into_inner()).key(id).copied()
    }

    /// The id whose key `key` is, for logs.
    pub fn id_of(&self, key: &PublicKey) -> Option<NodeId> {
        let vouched = self.vouched.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((&id, _)) = vouched.iter().find(|(_, k)| *k == key) {
            return Some(id);
        }
        drop(vouched);
        self.roster.read().unwrap_or_else(|e| e.into_inner()).id_of(key)
    }

    /// Takes a new roster (its file changed); `Err` (and the old one kept) when it no longer
    /// gives this node its key.
    pub fn set_roster(&self, roster: Roster) -> Result<(), String> {
        check_own(self.me, &self.key, &roster)?;
        *self.roster.write().unwrap_or_else(|e| e.into_inner()) = roster;
        self.changed.notify_waiters();
        Ok(())
    }

    /// The keys the coordinator named (a directory): taken for every id but this node's and the
    /// coordinator's, which only the roster names.
    pub fn vouch(&self, keys: impl IntoIterator<Item = (NodeId, PublicKey)>) {
        let mut vouched = self.vouched.lock().unwrap_or_else(|e| e.into_inner());
        for (id, key) in keys {
            if id != self.me && id != NodeId::COORDINATOR {
                vouched.insert(id, key);
            }
        }
        drop(vouched);
        self.changed.notify_waiters();
    }

    /// The key of `id`, waiting up to `within` for a roster or a directory to name it.
    pub async fn wait_for_key(&self, id: NodeId, within: std::time::Duration) -> Option<PublicKey> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let Some(k) = self.key_of(id) {
                return Some(k);
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return self.key_of(id);
            }
        }
    }
}

fn check_own(me: NodeId, key: &NodeKey, roster: &Roster) -> Result<(), String> {
    match roster.key(me) {
        Some(k) if *k == key.public() => Ok(()),
        Some(k) => Err(format!(
            "the roster gives this node the key {}, not this key's {}",
            k.short(),
            key.public().short()
        )),
        None => {
            Err(format!("the roster has no key for this node (its public key is {})", key.public()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_file_is_private_read_back_and_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.key");
        let key = NodeKey::create(&path).unwrap();
        assert!(matches!(NodeKey::create(&path), Err(IdentityError::Exists { .. })));
        let back = NodeKey::load(&path).unwrap();
        assert_eq!(back.public(), key.public());
        assert_eq!(back.private(), key.private());
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(NodeKey::load(&path), Err(IdentityError::TooOpen { mode: 0o644, .. })));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&path, "# nothing\nnot hex\n").unwrap();
        let e = NodeKey::load(&path).unwrap_err().to_string();
        assert!(e.contains("node.key") && e.contains("64 hex digits"), "{e}");
    }

    /// The coordinator's directory names other nodes' keys (over a roster's), never this node's
    /// or the coordinator's; a new roster is taken only while it still gives this node its key;
    /// a wait for a key ends when one is named.
    #[tokio::test]
    async fn keys_come_from_the_roster_and_the_coordinators_word() {
        let (me, c, other) = (NodeKey::generate(), NodeKey::generate(), NodeKey::generate());
        let roster = |keys: &[(NodeId, &NodeKey)]| {
            Roster::new(keys.iter().map(|(id, k)| (*id, k.public())).collect()).unwrap()
        };
        let id = Identity::new(
            NodeId(0),
            me.clone(),
            roster(&[(NodeId(0), &me), (NodeId::COORDINATOR, &c)]),
        );
        let id = std::sync::Arc::new(id.unwrap());
        assert_eq!(id.key_of(NodeId(1)), None);
        let stray = NodeKey::generate().public();
        id.vouch([(NodeId(0), stray), (NodeId::COORDINATOR, stray)]);
        assert_eq!(id.key_of(NodeId(0)), Some(me.public()));
        assert_eq!(id.key_of(NodeId::COORDINATOR), Some(c.public()));
        let waiting = tokio::spawn({
            let id = id.clone();
            async move { id.wait_for_key(NodeId(1), std::time::Duration::from_secs(5)).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        id.vouch([(NodeId(1), other.public())]);
        assert_eq!(waiting.await.unwrap(), Some(other.public()));
        assert_eq!(id.id_of(&other.public()), Some(NodeId(1)));
        // A roster without this node's key is refused; one with it is taken.
        assert!(id.set_roster(roster(&[(NodeId::COORDINATOR, &c)])).is_err());
        assert_eq!(id.key_of(NodeId::COORDINATOR), Some(c.public()));
        let c2 = NodeKey::generate();
        id.set_roster(roster(&[(NodeId(0), &me), (NodeId::COORDINATOR, &c2)])).unwrap();
        assert_eq!(id.key_of(NodeId::COORDINATOR), Some(c2.public()));
    }

    #[test]
    fn the_public_key_is_x25519_of_the_private_one() {
        // RFC 7748, section 6.1: Alice's private and public keys.
        let private = "77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a"
            .parse::<Digest<32>>();
        let key = NodeKey::from_private(*private.unwrap().as_bytes());
        assert_eq!(
            key.public().to_string(),
            "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a"
        );
    }

    #[test]
    fn a_roster_binds_names_to_keys_and_refuses_what_it_cannot_bind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("roster.toml");
        let (a, b) = (NodeKey::generate().public(), NodeKey::generate().public());
        let id_of = |n: &str| match n {
            "coordinator" => Some(NodeId::COORDINATOR),
            "n-0" => Some(NodeId(0)),
            "n-1" => Some(NodeId(1)),
            _ => None,
        };
        let roster = Roster::new([(NodeId::COORDINATOR, a), (NodeId(0), b)].into()).unwrap();
        let name = |id: NodeId| {
            if id == NodeId::COORDINATOR { "coordinator".into() } else { format!("n-{}", id.0) }
        };
        std::fs::write(&path, roster.to_toml(name)).unwrap();
        assert_eq!(Roster::load(&path, id_of).unwrap(), roster);
        assert_eq!(roster.id_of(&b), Some(NodeId(0)));
        for (text, needle) in [
            (format!("[keys]\nn-9 = \"{a}\"\n"), "keys.n-9"),
            (format!("[keys]\nn-0 = \"{a}\"\nn-1 = \"{a}\"\n"), "keys.n-1"),
            ("[keys]\nn-0 = \"abc\"\n".to_string(), "64 hex digits"),
            ("[nodes]\n".to_string(), "[keys]"),
        ] {
            std::fs::write(&path, text).unwrap();
            let e = Roster::load(&path, id_of).unwrap_err().to_string();
            assert!(e.contains("roster.toml") && e.contains(needle), "{e}");
        }
        assert_eq!(Roster::new([(NodeId(0), a), (NodeId(1), a)].into()), Err(NodeId(1)));
        assert!(Identity::new(NodeId(0), NodeKey::generate(), roster.clone()).is_err());
        assert!(Identity::new(NodeId(1), NodeKey::generate(), roster).is_err());
    }
}
