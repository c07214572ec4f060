//! Error feedback ([`OuterConfig::feedback`]): the residual a node keeps of what its codec did
//! not send, and what the codec sent ([`SentContribution`]).

use super::{DilocoError, OuterState};
use std::ops::Range;

/// What a node's codec sent of its contribution to a committed all-reduce: its encoded parts,
/// each with the range of values it holds ([`OuterState::keep_residual`]).
#[derive(Clone, Debug, PartialEq)]
pub struct SentContribution {
    /// The codec the parts are in.
    pub codec: crate::codec::CodecKind,
    /// The parts, in order, each with its range of the values.
    pub parts: Vec<(Range<usize>, bytes::Bytes)>,
}

impl SentContribution {
    /// What a gathering ring of one shard sends of `values`: each segment of `segment_elems`
    /// values encoded on its own.
    pub fn encode(
        codec: crate::codec::CodecKind,
        values: &[f32],
        segment_elems: usize,
    ) -> SentContribution {
        use crate::allreduce::schedule::{segment_count, segment_range};
        let c = codec.codec();
        let len = values.len();
        let parts = (0..segment_count(len, segment_elems))
            .map(|j| {
                let r = segment_range(&(0..len), segment_elems, j);
                let mut buf = vec![0u8; c.encoded_len(r.len())];
                c.encode(&values[r.clone()], &mut buf);
                (r, bytes::Bytes::from(buf))
            })
            .collect();
        SentContribution { codec, parts }
    }
}

impl OuterState {
    /// Error feedback's residual (empty without error feedback): what this node's codec has
    /// not sent yet of its contributions. Part of a node's checkpoint, not of the mesh's state.
    pub fn residual(&self) -> &[f32] {
        &self.residual
    }

    /// Restores the residual of a checkpoint.
    ///
    /// # Errors
    /// A residual of another length, or one given without error feedback configured.
    pub fn set_residual(&mut self, residual: Vec<f32>) -> Result<(), DilocoError> {
        if self.cfg.feedback.is_none() || residual.len() != self.len() {
            let expected = if self.cfg.feedback.is_some() { self.len() } else { 0 };
            return Err(DilocoError::Length { what: "residual", expected, got: residual.len() });
        }
        self.residual = residual;
        Ok(())
    }

    /// Error feedback, after a valid pseudo-gradient: it becomes this step's contribution,
    /// `beta * residual + pseudo-gradient`. Nothing without error feedback.
    pub fn add_residual(&mut self) {
        let Some(beta) = self.cfg.feedback else { return };
        if self.residual.len() != self.pseudo_gradient.len() {
            return;
        }
        for (g, e) in self.pseudo_gradient.iter_mut().zip(&self.residual) {
            *g += beta * e;
        }
    }

    /// Error feedback, at the commit of an all-reduce this node contributed to: the residual
    /// becomes the contribution (still in the pseudo-gradient buffer) less what the codec sent
    /// of it. Call before the average replaces the buffer. Values outside the parts (none,
    /// for a whole contribution) keep their residual. Parts that do not fit are ignored.
    pub fn keep_residual(&mut self, sent: &SentContribution) {
        if self.cfg.feedback.is_none() || self.residual.len() != self.pseudo_gradient.len() {
            return;
        }
        let codec = sent.codec.codec();
        let mut decoded = Vec::new();
        for (range, bytes) in &sent.parts {
            let (Some(g), Some(e)) =
                (self.pseudo_gradient.get(range.clone()), self.residual.get_mut(range.clone()))
            else {
                continue;
            };
            if codec.encoded_len(range.len()) != bytes.len() {
                continue;
            }
            decoded.clear();
            decoded.resize(range.len(), 0.0);
            codec.decode(bytes, &mut decoded);
            for ((e, g), d) in e.iter_mut().zip(g).zip(&decoded) {
                *e = g - d;
            }
        }
    }

    /// True for a model with no parameters.
    pub fn is_empty(&self) -> bool {
        self.outer.is_empty()
    }
}
