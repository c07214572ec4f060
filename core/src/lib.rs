//! # loco-core
//!
//! Everything both of loco's backends share, as pure code: no sockets, no clocks, no threads.
//!
//! - [`codec`]: fp32, fp16/bf16, PRIME's uint8 codebook and a blockwise int8 codec, on `&[f32]`.
//! - [`allreduce`]: the ring all-reduce as a sans-IO state machine (reduce-scatter with fp32
//!   accumulation, an all-gather that forwards the owner's bytes so replicas end bit-identical),
//!   weighted, pipelined, and with a virtual mode that moves lengths only.
//! - [`diloco`]: the outer state (weights, pseudo-gradient, Nesterov momentum) in flat fp32 buffers.
//! - [`mesh`]: the elastic device mesh (membership, epochs, heartbeats, joins, evictions).
//! - [`scenario`]: the scenario/config file both backends read, validated.
//! - [`transport`]: the message-level transport trait and an in-memory implementation.
//! - [`metrics`]: the one event schema both backends write.
//! - [`digest`]: digests as typed values, written as the hex text users read.
//! - [`time`], [`ids`]: injected time and the newtypes that carry invariants.
//!
//! A two-node all-reduce over the in-memory transport:
//!
//! ```
//! use loco_core::allreduce::{RingConfig, run_ring};
//! use loco_core::codec::CodecKind;
//! use loco_core::ids::{Epoch, NodeId, Weight};
//! use loco_core::transport::memory::network;
//!
//! let ring = vec![NodeId(0), NodeId(1)];
//! let mut eps = network(&ring);
//! let mut b = eps.pop().unwrap();
//! let mut a = eps.pop().unwrap();
//! let mut xa = vec![1.0f32; 10];
//! let mut xb = vec![3.0f32; 10];
//! let cfg = |me| RingConfig::new(Epoch(1), 0, ring.clone(), me, CodecKind::Fp32);
//! futures::executor::block_on(async {
//!     let (ra, rb) = futures::join!(
//!         run_ring(&mut a, cfg(NodeId(0)), Some(&mut xa), 10, Weight::ONE),
//!         run_ring(&mut b, cfg(NodeId(1)), Some(&mut xb), 10, Weight::ONE),
//!     );
//!     ra.unwrap();
//!     rb.unwrap();
//! });
//! assert_eq!(xa, vec![2.0; 10]);
//! assert_eq!(xa, xb);
//! ```
#![warn(missing_docs, unreachable_pub)]

pub mod allreduce;
pub mod codec;
pub mod digest;
pub mod diloco;
pub mod ids;
pub mod mesh;
pub mod metrics;
pub mod node;
pub mod rng;
pub mod scenario;
pub mod time;
pub mod transport;

#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use ids::{Epoch, NodeId, Rank, Weight};
pub use time::Time;
