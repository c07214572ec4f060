//! # loco-sim
//!
//! loco's deterministic simulator backend. (Being built: issue 4.)
