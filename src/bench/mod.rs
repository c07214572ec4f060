//! `loco bench ...`: reproducible performance figures.

pub(crate) mod allreduce;
pub mod codec;
pub(crate) mod data;
pub(crate) mod handshake;
pub(crate) mod outer;
pub(crate) mod quality;
pub(crate) mod recovery;
pub(crate) mod train;

/// `n` free loopback ports: bound, then released for the benchmark's child processes to bind.
pub(crate) fn free_loopback_ports(n: usize) -> std::io::Result<Vec<u16>> {
    let ls: Vec<std::net::TcpListener> =
        (0..n).map(|_| std::net::TcpListener::bind(("127.0.0.1", 0))).collect::<Result<_, _>>()?;
    ls.iter().map(|l| l.local_addr().map(|a| a.port())).collect()
}

/// A secret made for one benchmark run's processes only (hex).
pub(crate) fn fresh_secret() -> String {
    rand::random::<[u8; 16]>().iter().map(|b| format!("{b:02x}")).collect()
}
