//! Newtypes that carry identity and ordering invariants.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A node of the run (a machine with one or more GPUs). The coordinator has its own id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NodeId(pub u32);

impl NodeId {
    /// The id the coordinator uses on the transport.
    pub const COORDINATOR: NodeId = NodeId(u32::MAX);
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == NodeId::COORDINATOR {
            write!(f, "coordinator")
        } else {
            write!(f, "n{}", self.0)
        }
    }
}

/// A position in a ring (0..world).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Rank(pub u32);

impl fmt::Display for Rank {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "r{}", self.0)
    }
}

/// A membership version. Every change of the mesh creates a new, strictly larger epoch, and every
/// message of a collective carries the epoch it belongs to.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Epoch(pub u64);

impl Epoch {
    /// The epoch after this one.
    #[must_use]
    pub fn next(self) -> Epoch {
        Epoch(self.0 + 1)
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "e{}", self.0)
    }
}

/// The weight of one contribution to a weighted average: finite and non-negative. A joiner that
/// has no pseudo-gradient yet contributes with weight 0.
/// Deserialising checks the same as [`Weight::new`]: a frame cannot carry a NaN, an infinite or
/// a negative weight into an average.
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd, Serialize, Deserialize)]
#[serde(try_from = "f32")]
pub struct Weight(f32);

impl TryFrom<f32> for Weight {
    type Error = String;
    fn try_from(w: f32) -> Result<Self, Self::Error> {
        Weight::new(w).ok_or_else(|| format!("weight {w}: expected finite and non-negative"))
    }
}

impl Weight {
    /// Weight 1, the usual contribution.
    pub const ONE: Weight = Weight(1.0);
    /// Weight 0: present in the ring, but not counted in the average.
    pub const ZERO: Weight = Weight(0.0);

    /// A weight, or `None` when `w` is negative, NaN or infinite.
    pub fn new(w: f32) -> Option<Weight> {
        (w.is_finite() && w >= 0.0).then_some(Weight(w))
    }

    /// The value.
    pub fn get(self) -> f32 {
        self.0
    }
}

impl Default for Weight {
    fn default() -> Self {
        Weight::ONE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_weight_that_new_refuses_does_not_deserialise_either() {
        use serde::de::{IntoDeserializer, value::Error};
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -1.0, -0.5] {
            let r = Weight::deserialize(IntoDeserializer::<Error>::into_deserializer(bad));
            assert!(r.is_err(), "{bad} gave {r:?}");
        }
        for good in [0.0f32, 0.5, 3.0] {
            let w = Weight::deserialize(IntoDeserializer::<Error>::into_deserializer(good));
            assert_eq!(w.unwrap().get(), good);
        }
        assert_eq!(serde_json::to_string(&Weight::ONE).unwrap(), "1.0");
    }
}
