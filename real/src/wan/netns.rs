//! The hosts of an emulated network: one network namespace per host, each holding one TUN
//! device (`loco0`) with the host's address, whose other end is a file descriptor of the
//! launcher's [`Router`](super::Router).
//!
//! A namespace has no other interface than its loopback and `loco0`, and no route but the
//! range's own (198.18.0.0/15), so nothing a process inside sends can leave it except through
//! the router, which delivers only to the other hosts of the same run. The namespaces are the
//! run's own: named after the launcher's pid, removed when [`Hosts`] is dropped, and those of a
//! launcher that died without removing them are removed by the next one.

use super::WanError;
use super::addr::{PREFIX_LEN, host_addr};
use loco_core::NodeId;
use std::io::Write;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

/// The name of the TUN device inside each namespace.
pub const DEVICE: &str = "loco0";
/// The prefix of every namespace a run creates.
const PREFIX: &str = "loco";

/// One host of the network.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Host {
    /// The node (or [`NodeId::COORDINATOR`]).
    pub id: NodeId,
    /// Its namespace's name (`ip netns exec NAME ...` runs a process there).
    pub netns: String,
    /// Its address.
    pub addr: Ipv4Addr,
}

/// The namespaces of a run; dropping it removes them.
#[derive(Debug)]
pub struct Hosts {
    hosts: Vec<Host>,
}

/// Why this process cannot build an emulated network, or `None` when it can.
pub fn unavailable() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("it needs root (network namespaces and TUN devices)".into());
    }
    if !std::path::Path::new("/dev/net/tun").exists() {
        return Some("/dev/net/tun is missing".into());
    }
    match Command::new("ip").arg("-V").stdout(Stdio::null()).stderr(Stdio::null()).status() {
        Ok(s) if s.success() => None,
        _ => Some("the `ip` command (iproute2) is missing".into()),
    }
}

fn run_ip(args: &[&str], batch: Option<&str>) -> Result<(), WanError> {
    let what = format!("ip {}", args.join(" "));
    let mut cmd = Command::new("ip");
    cmd.args(args).stdout(Stdio::null()).stderr(Stdio::piped());
    cmd.stdin(if batch.is_some() { Stdio::piped() } else { Stdio::null() });
    let mut child = cmd.spawn().map_err(|source| WanError::Spawn { what: what.clone(), source })?;
    if let (Some(text), Some(mut stdin)) = (batch, child.stdin.take()) {
        stdin
            .write_all(text.as_bytes())
            .map_err(|source| WanError::Spawn { what: what.clone(), source })?;
    }
    let out = child
        .wait_with_output()
        .map_err(|source| WanError::Spawn { what: what.clone(), source })?;
    if out.status.success() {
        Ok(())
    } else {
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        Err(WanError::Command { what, status: out.status.to_string(), stderr })
    }
}

/// Removes the namespaces of launchers that are no longer running.
fn remove_stale() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).stderr(Stdio::null()).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(name) = line.split_whitespace().next() else { continue };
        let Some(pid) = name.strip_prefix(PREFIX).and_then(|r| r.split('h').next()) else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else { continue };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            tracing::info!(netns = name, "removing the namespace of a launcher that is gone");
            let _ = run_ip(&["netns", "del", name], None);
        }
    }
}

impl Hosts {
    /// Creates a namespace and a TUN device of `mtu` bytes for each of `ids`, and returns them
    /// with the device handles (the router's ends, in the order of `ids`).
    pub fn create(ids: &[NodeId], mtu: u16) -> Result<(Hosts, Vec<tun::Device>), WanError> {
        if let Some(why) = unavailable() {
            return Err(WanError::Unavailable { why });
        }
        remove_stale();
        let pid = std::process::id();
        let mut hosts = Hosts { hosts: Vec::with_capacity(ids.len()) };
        let mut devices = Vec::with_capacity(ids.len());
        let mut moves = String::new();
        for (k, &id) in ids.iter().enumerate() {
            let addr = host_addr(id).ok_or(WanError::NodeOutOfRange { node: id })?;
            let netns = format!("{PREFIX}{pid}h{k}");
            run_ip(&["netns", "add", &netns], None)?;
            hosts.hosts.push(Host { id, netns: netns.clone(), addr });
            // A name unique among this machine's own interfaces until it moves and is renamed.
            let tmp = format!("lc{pid:x}_{k:x}");
            let mut cfg = tun::Configuration::default();
            cfg.tun_name(&tmp).mtu(mtu);
            cfg.platform_config(|p| {
                p.ensure_root_privileges(false);
            });
            let dev = tun::create(&cfg)
                .map_err(|e| WanError::Tun { device: tmp.clone(), message: e.to_string() })?;
            devices.push(dev);
            moves.push_str(&format!("link set {tmp} netns {netns}\n"));
        }
        // The devices stay attached to their descriptors when they move.
        run_ip(&["-batch", "-"], Some(&moves))?;
        for (k, h) in hosts.hosts.iter().enumerate() {
            let tmp = format!("lc{pid:x}_{k:x}");
            let setup = format!(
                "link set lo up\n\
                 link set {tmp} name {DEVICE}\n\
                 link set {DEVICE} addrgenmode none\n\
                 addr add {}/{PREFIX_LEN} dev {DEVICE}\n\
                 link set {DEVICE} mtu {mtu} up\n",
                h.addr
            );
            run_ip(&["-netns", &h.netns, "-batch", "-"], Some(&setup))?;
        }
        for d in &devices {
            d.set_nonblock()
                .map_err(|e| WanError::Tun { device: DEVICE.into(), message: e.to_string() })?;
        }
        Ok((hosts, devices))
    }

    /// The hosts, in the order they were created.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// The host of `id`.
    pub fn host(&self, id: NodeId) -> Option<&Host> {
        self.hosts.iter().find(|h| h.id == id)
    }

    /// A command that runs `program` in `id`'s namespace (`ip netns exec NS program`): the same
    /// process (ip execs it), so its pid is the program's.
    pub fn command(&self, id: NodeId, program: &std::path::Path) -> Option<Command> {
        let h = self.host(id)?;
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &h.netns]).arg(program);
        Some(c)
    }

    /// The namespace file of `id`, for `setns`.
    pub fn netns_path(&self, id: NodeId) -> Option<std::path::PathBuf> {
        self.host(id).map(|h| std::path::Path::new("/run/netns").join(&h.netns))
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for h in &self.hosts {
            if let Err(e) = run_ip(&["netns", "del", &h.netns], None) {
                tracing::warn!(netns = %h.netns, "removing the namespace: {e}");
            }
        }
    }
}

/// Moves the calling thread into `id`'s namespace: sockets it opens afterwards are that host's.
/// For a thread of its own (the namespace is per thread).
pub fn enter(hosts: &Hosts, id: NodeId) -> Result<(), WanError> {
    let path = hosts.netns_path(id).ok_or(WanError::NodeOutOfRange { node: id })?;
    enter_path(&path)
}

/// Moves the calling thread into the namespace whose file is `path`.
pub fn enter_path(path: &std::path::Path) -> Result<(), WanError> {
    let f = std::fs::File::open(path).map_err(|source| WanError::Spawn {
        what: format!("opening {}", path.display()),
        source,
    })?;
    nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| WanError::Spawn {
        what: format!("entering {}", path.display()),
        source: e.into(),
    })
}
