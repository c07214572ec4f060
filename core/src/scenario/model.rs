//! The model a scenario trains: a Llama-3-style decoder (RMSNorm, RoPE, grouped-query attention,
//! SwiGLU, no biases), from a preset or given shape by shape, with the counts derived from it.

use crate::codec::CodecKind;
use serde::{Deserialize, Serialize};
use std::fmt;

/// A named model shape.
///
/// | preset | layers | dim | heads | kv heads | ffn | vocab | seq | tied | parameters |
/// |---|---|---|---|---|---|---|---|---|---|
/// | `tiny` | 2 | 64 | 4 | 2 | 192 | 256 (bytes) | 64 | no | 131,392 |
/// | `150m` | 16 | 768 | 12 | 4 | 2048 | 32000 | 2048 | no | 149.8M |
/// | `1b` | 16 | 2048 | 32 | 8 | 8192 | 128256 | 4096 | yes | 1.236B |
/// | `10b` | 42 | 4096 | 32 | 8 | 14336 | 128256 | 8192 | no | 10.21B |
///
/// All use RoPE theta 500000 and RMSNorm epsilon 1e-5. `10b` is INTELLECT-1; `1b` is the shape of
/// Llama-3.2-1B (tied embeddings); `150m` is a Llama-3-style shape of PRIME's 150M size with the
/// 32000-token Llama-2 vocabulary (a 128256 vocabulary alone would exceed 150M); `tiny` trains in
/// seconds on a CPU, on byte-level tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Preset {
    /// A CPU-sized model for tests and demos.
    #[serde(rename = "tiny")]
    Tiny,
    /// About 150M parameters.
    #[serde(rename = "150m")]
    M150,
    /// About 1.2B parameters.
    #[serde(rename = "1b")]
    B1,
    /// INTELLECT-1's 10.2B.
    #[serde(rename = "10b")]
    B10,
}

impl Preset {
    /// Every preset, smallest first.
    pub const ALL: [Preset; 4] = [Preset::Tiny, Preset::M150, Preset::B1, Preset::B10];

    /// The name written in scenario files.
    pub fn name(self) -> &'static str {
        match self {
            Preset::Tiny => "tiny",
            Preset::M150 => "150m",
            Preset::B1 => "1b",
            Preset::B10 => "10b",
        }
    }

    /// The preset named `name`.
    pub fn from_name(name: &str) -> Option<Preset> {
        Preset::ALL.into_iter().find(|p| p.name() == name)
    }

    /// The preset's shape.
    pub fn spec(self) -> ModelSpec {
        let (layers, dim, heads, kv_heads, ffn, vocab, seq_len, tied) = match self {
            Preset::Tiny => (2, 64, 4, 2, 192, 256, 64, false),
            Preset::M150 => (16, 768, 12, 4, 2048, 32_000, 2048, false),
            Preset::B1 => (16, 2048, 32, 8, 8192, 128_256, 4096, true),
            Preset::B10 => (42, 4096, 32, 8, 14_336, 128_256, 8192, false),
        };
        ModelSpec {
            preset: Some(self),
            layers,
            dim,
            heads,
            kv_heads,
            ffn,
            vocab,
            seq_len,
            rope_theta: DEFAULT_ROPE_THETA,
            norm_eps: DEFAULT_NORM_EPS,
            tied_embeddings: tied,
        }
    }
}

impl fmt::Display for Preset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// RoPE base frequency unless given (Llama 3, INTELLECT-1).
pub const DEFAULT_ROPE_THETA: f64 = 500_000.0;
/// RMSNorm epsilon unless given (Llama 3).
pub const DEFAULT_NORM_EPS: f64 = 1e-5;

/// The shape of the model. Validated: every size is at least 1, `dim` is a multiple of `heads`,
/// `heads` a multiple of `kv_heads`, and every count below fits a `u64`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelSpec {
    /// The preset it started from, if any (fields given in the file override the preset's).
    pub preset: Option<Preset>,
    /// Transformer blocks.
    pub layers: u32,
    /// Hidden size.
    pub dim: u32,
    /// Attention (query) heads.
    pub heads: u32,
    /// Key/value heads (grouped-query attention; equal to `heads` for multi-head attention).
    pub kv_heads: u32,
    /// Hidden size of the SwiGLU feed-forward block.
    pub ffn: u32,
    /// Vocabulary size.
    pub vocab: u32,
    /// Training sequence length, in tokens.
    pub seq_len: u32,
    /// RoPE base frequency.
    pub rope_theta: f64,
    /// RMSNorm epsilon.
    pub norm_eps: f64,
    /// Whether the output projection shares the token embedding matrix.
    pub tied_embeddings: bool,
}

impl ModelSpec {
    /// Size of one attention head: `dim / heads`.
    pub fn head_dim(&self) -> u32 {
        self.dim / self.heads.max(1)
    }

    fn embedding_params(&self) -> u128 {
        u128::from(self.vocab) * u128::from(self.dim)
    }

    /// Parameters of one transformer block: q and o (`dim x dim` each), k and v (`dim x kv_heads
    /// x head_dim` each), the three SwiGLU matrices (`dim x ffn` each) and two RMSNorm weights.
    fn block_params(&self) -> u128 {
        let d = u128::from(self.dim);
        let kv = u128::from(self.kv_heads) * u128::from(self.head_dim());
        2 * d * d + 2 * d * kv + 3 * d * u128::from(self.ffn) + 2 * d
    }

    fn param_count_wide(&self) -> u128 {
        let heads = if self.tied_embeddings { 1 } else { 2 };
        u128::from(self.layers) * self.block_params()
            + heads * self.embedding_params()
            + u128::from(self.dim)
    }

    fn flops_per_token_wide(&self) -> u128 {
        6 * self.non_embedding_wide()
            + 12 * u128::from(self.layers)
                * u128::from(self.heads)
                * u128::from(self.head_dim())
                * u128::from(self.seq_len)
    }

    fn non_embedding_wide(&self) -> u128 {
        if self.tied_embeddings {
            // The shared matrix still does the output projection, so its flops count.
            self.param_count_wide()
        } else {
            self.param_count_wide() - self.embedding_params()
        }
    }

    /// Whether every count fits a `u64` (checked by validation).
    pub(crate) fn counts_fit(&self) -> bool {
        u64::try_from(self.flops_per_token_wide()).is_ok()
            && u64::try_from(self.param_count_wide()).is_ok()
    }

    /// Every parameter: blocks, final norm, token embedding and (unless tied) output projection.
    /// 10,211,381,248 for the `10b` preset.
    pub fn param_count(&self) -> u64 {
        u64::try_from(self.param_count_wide()).unwrap_or(u64::MAX)
    }

    /// Parameters other than the input token embedding (torchtitan's and PRIME's
    /// `exclude_embedding`): the matrices that do matmuls for each token. With tied embeddings the
    /// shared matrix is counted, since it still does the output projection.
    pub fn non_embedding_params(&self) -> u64 {
        u64::try_from(self.non_embedding_wide()).unwrap_or(u64::MAX)
    }

    /// Training flops per token, PRIME's formula: `6 * non_embedding_params + 12 * layers * heads
    /// * head_dim * seq_len` (the second term is attention over the sequence).
    pub fn flops_per_token(&self) -> u64 {
        u64::try_from(self.flops_per_token_wide()).unwrap_or(u64::MAX)
    }

    /// Bytes of one whole copy of the parameters encoded by `codec` in one piece (`uint8` adds
    /// its 1 KiB table once; a ring that encodes per segment adds one table per segment).
    pub fn payload_bytes(&self, codec: CodecKind) -> u64 {
        let n = self.param_count();
        match usize::try_from(n) {
            Ok(n) => u64::try_from(codec.codec().encoded_len(n)).unwrap_or(u64::MAX),
            // A 32-bit host: estimate from the per-value size.
            Err(_) => match codec {
                CodecKind::Fp32 => n.saturating_mul(4),
                CodecKind::Fp16 | CodecKind::Bf16 => n.saturating_mul(2),
                CodecKind::Uint8 | CodecKind::Int8Block => n,
                CodecKind::Int4Block => n.div_ceil(2),
                CodecKind::Sparse(_) => (n as f64 * codec.bytes_per_value()).ceil() as u64,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intellect1_counts() {
        let m = Preset::B10.spec();
        let n = m.param_count() as f64;
        assert!((n / 10.21e9 - 1.0).abs() < 0.01, "{n}");
        assert_eq!(m.param_count(), 10_211_381_248);
        assert_eq!(m.head_dim(), 128);
        let emb = 128_256u64 * 4096;
        assert_eq!(m.non_embedding_params(), m.param_count() - emb);
        let attn = 12 * 42 * 32 * 128 * 8192u64;
        assert_eq!(m.flops_per_token(), 6 * (m.param_count() - emb) + attn);
        // reference.md: 40.8 GB in fp32, 10.2 GB in int8.
        assert_eq!(m.payload_bytes(CodecKind::Fp32), 4 * m.param_count());
        assert_eq!(m.payload_bytes(CodecKind::Bf16), 2 * m.param_count());
        assert_eq!(m.payload_bytes(CodecKind::Uint8), m.param_count() + 1024);
        let gb = m.payload_bytes(CodecKind::Fp32) as f64 / 1e9;
        assert!((gb - 40.8).abs() < 0.1, "{gb}");
        assert!(m.payload_bytes(CodecKind::Int8Block) > m.param_count());
        let int4 = m.payload_bytes(CodecKind::Int4Block);
        assert!(int4 > m.param_count() / 2 && int4 < m.param_count() * 52 / 100, "{int4}");
    }

    #[test]
    fn preset_sizes() {
        let tiny = Preset::Tiny.spec();
        assert_eq!(tiny.param_count(), 131_392);
        let m150 = Preset::M150.spec().param_count() as f64;
        assert!((m150 / 150e6 - 1.0).abs() < 0.02, "{m150}");
        let b1 = Preset::B1.spec();
        assert_eq!(b1.param_count(), 1_235_814_400);
        // Tied: the shared matrix is counted once, and counts as non-embedding.
        assert_eq!(b1.non_embedding_params(), b1.param_count());
        for p in Preset::ALL {
            assert_eq!(Preset::from_name(p.name()), Some(p));
            let s = p.spec();
            assert_eq!(s.dim % s.heads, 0);
            assert_eq!(s.heads % s.kv_heads, 0);
            assert!(s.counts_fit());
        }
        assert_eq!(Preset::from_name("7b"), None);
    }

    #[test]
    fn multi_head_attention_counts() {
        // One block of dim 8, 2 heads, MHA, ffn 16: 4*64 + 3*128 + 16 = 656; vocab 10 untied.
        let m = ModelSpec {
            preset: None,
            layers: 1,
            dim: 8,
            heads: 2,
            kv_heads: 2,
            ffn: 16,
            vocab: 10,
            seq_len: 4,
            rope_theta: DEFAULT_ROPE_THETA,
            norm_eps: DEFAULT_NORM_EPS,
            tied_embeddings: false,
        };
        assert_eq!(m.param_count(), 656 + 2 * 80 + 8);
        assert_eq!(m.non_embedding_params(), 656 + 80 + 8);
        assert_eq!(m.flops_per_token(), 6 * 744 + 12 * 2 * 4 * 4);
    }
}
