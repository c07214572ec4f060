//! Where each host of an emulated network lives: one address of the benchmarking range
//! 198.18.0.0/15 (RFC 2544) per host, and the name of its network namespace.
//!
//! The coordinator is host 1 (198.18.0.1) and node `k` is host `k + 2`, so that every node of a
//! scenario of up to 131,069 nodes has an address and the mapping needs no table.

use loco_core::NodeId;
use std::net::Ipv4Addr;

/// The first address of the range (198.18.0.0).
const BASE: u32 = u32::from_be_bytes([198, 18, 0, 0]);
/// The range's prefix length.
pub const PREFIX_LEN: u8 = 15;
/// Addresses in the range.
const SIZE: u32 = 1 << (32 - PREFIX_LEN);

/// The index of `host` in the range, if it fits.
fn index(host: NodeId) -> Option<u32> {
    let i = if host == NodeId::COORDINATOR { 1 } else { host.0.checked_add(2)? };
    // The last address is the range's broadcast.
    (i < SIZE - 1).then_some(i)
}

/// The address of `host`; `None` for a node id too large for the range.
pub fn host_addr(host: NodeId) -> Option<Ipv4Addr> {
    index(host).map(|i| Ipv4Addr::from(BASE + i))
}

/// The host at `addr`, if it is one of the range's host addresses.
pub fn host_of(addr: Ipv4Addr) -> Option<NodeId> {
    let i = u32::from(addr).checked_sub(BASE)?;
    match i {
        1 => Some(NodeId::COORDINATOR),
        i if (2..SIZE - 1).contains(&i) => Some(NodeId(i - 2)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_and_addresses_map_both_ways_inside_the_range() {
        assert_eq!(host_addr(NodeId::COORDINATOR), Some(Ipv4Addr::new(198, 18, 0, 1)));
        assert_eq!(host_addr(NodeId(0)), Some(Ipv4Addr::new(198, 18, 0, 2)));
        assert_eq!(host_addr(NodeId(300)), Some(Ipv4Addr::new(198, 18, 1, 46)));
        for id in [0, 1, 253, 254, 70_000, SIZE - 4] {
            let a = host_addr(NodeId(id)).expect("in range");
            assert!(a.octets()[0] == 198 && (a.octets()[1] & 0xfe) == 18, "{a}");
            assert_eq!(host_of(a), Some(NodeId(id)));
        }
        assert_eq!(host_of(Ipv4Addr::new(198, 18, 0, 1)), Some(NodeId::COORDINATOR));
        assert_eq!(host_addr(NodeId(SIZE - 3)), None, "the broadcast address is no host's");
        assert_eq!(host_of(Ipv4Addr::new(198, 18, 0, 0)), None);
        assert_eq!(host_of(Ipv4Addr::new(198, 20, 0, 2)), None);
        assert_eq!(host_of(Ipv4Addr::new(127, 0, 0, 1)), None);
        assert_eq!(host_addr(NodeId(u32::MAX - 1)), None);
    }
}
