//! The mesh's two state machines under messages decoded from hostile bytes: a coordinator with
//! members (every message as from any of eight nodes) and a member (every message as from the
//! coordinator or a peer), with time moving on between them. Header bytes are decoded as the
//! transport decodes them (`postcard`); what decodes to a mesh message is applied. Never a
//! panic; the coordinator's members are distinct and its epoch never goes back.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use loco_core::mesh::{Coordinator, Held, Member, MeshConfig, MeshMsg};
use loco_core::transport::Header;
use loco_core::{NodeId, Time};
use std::time::Duration;

#[derive(Arbitrary, Debug)]
struct Step {
    /// The sender (node 0 to 7, or the coordinator for 255).
    from: u8,
    /// Milliseconds before it arrives.
    after_ms: u16,
    /// The header bytes, as they would come off the wire.
    header: Vec<u8>,
}

fuzz_target!(|steps: Vec<Step>| {
    let cfg = MeshConfig { min_members: 2, max_update_ratio: 10.0, ..MeshConfig::default() };
    let mut coord = Coordinator::new(cfg.clone());
    let mut member = Member::new(NodeId(3), 1, cfg, 1);
    let mut now = Time::ZERO;
    // Two members join first, so that messages reach a formed mesh too.
    for id in [0, 1] {
        let join = MeshMsg::Join { incarnation: 0, held: Some(Held::default()), finished: 0 };
        coord.handle_message(now, NodeId(id), join);
    }
    let _ = member.join(now);
    let mut epoch = coord.epoch();
    for s in steps.into_iter().take(256) {
        now = now + Duration::from_millis(u64::from(s.after_ms));
        coord.handle_timeout(now);
        member.handle_timeout(now);
        let Ok(Header::Mesh(msg)) = postcard::from_bytes::<Header>(&s.header) else { continue };
        let from = if s.from == 255 { NodeId::COORDINATOR } else { NodeId(u32::from(s.from % 8)) };
        if from != NodeId::COORDINATOR {
            coord.handle_message(now, from, msg.clone());
        }
        member.handle_message(now, from, msg);
        while coord.poll_action().is_some() {}
        while member.poll_action().is_some() {}
        let members = coord.members();
        assert!(members.windows(2).all(|w| w[0] < w[1]), "members {members:?}");
        assert!(coord.epoch() >= epoch, "the epoch went back");
        epoch = coord.epoch();
    }
});
