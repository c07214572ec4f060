//! The Llama-3 model of the real backend.
//!
//! This module's top level is pure (no libtorch): the parameter layout of a [`ModelSpec`], which
//! fixes the order of the flat vectors DiLoCo's outer state is built from, and the compute
//! [`Precision`]. The model itself, `Llama`, needs the `torch` feature.
//!
//! # Parameters, in order
//!
//! The order of the forward pass; names as in torchtitan (PRIME's model code); shapes are
//! `[out, in]` for projections (`x @ w^T`), `hd = dim / heads`:
//!
//! | name | shape |
//! |---|---|
//! | `tok_embeddings.weight` | `[vocab, dim]` |
//! | `layers.{i}.attention_norm.weight` | `[dim]` |
//! | `layers.{i}.attention.wq.weight` | `[heads * hd, dim]` |
//! | `layers.{i}.attention.wk.weight` | `[kv_heads * hd, dim]` |
//! | `layers.{i}.attention.wv.weight` | `[kv_heads * hd, dim]` |
//! | `layers.{i}.attention.wo.weight` | `[dim, heads * hd]` |
//! | `layers.{i}.ffn_norm.weight` | `[dim]` |
//! | `layers.{i}.feed_forward.w1.weight` | `[ffn, dim]` (gate) |
//! | `layers.{i}.feed_forward.w2.weight` | `[dim, ffn]` (down) |
//! | `layers.{i}.feed_forward.w3.weight` | `[ffn, dim]` (up) |
//! | `norm.weight` | `[dim]` |
//! | `output.weight` | `[vocab, dim]`, absent with tied embeddings |
//!
//! Flat vectors (`Llama::flat_params`, the trainer's state) are these tensors' values, each
//! row-major, one after the other in this order. The layout depends on the spec alone, so every
//! process computes the same one.

#[cfg(feature = "torch")]
pub(crate) mod llama;

#[cfg(feature = "torch")]
pub use llama::{Llama, ModelError, tch_device};

pub use loco_core::scenario::ModelSpec;

/// One parameter tensor: its name and shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamSpec {
    /// Its name (see the module docs).
    pub name: String,
    /// Its shape.
    pub shape: Vec<usize>,
}

impl ParamSpec {
    /// Its number of values.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Every parameter tensor of `spec`, in the fixed order of the module docs.
pub fn param_specs(spec: &ModelSpec) -> Vec<ParamSpec> {
    let d = spec.dim as usize;
    let hd = spec.head_dim() as usize;
    let q = spec.heads as usize * hd;
    let kv = spec.kv_heads as usize * hd;
    let f = spec.ffn as usize;
    let v = spec.vocab as usize;
    let p = |name: String, shape: &[usize]| ParamSpec { name, shape: shape.to_vec() };
    let mut out = Vec::with_capacity(spec.layers as usize * 9 + 3);
    out.push(p("tok_embeddings.weight".into(), &[v, d]));
    for i in 0..spec.layers {
        let l = format!("layers.{i}");
        out.push(p(format!("{l}.attention_norm.weight"), &[d]));
        out.push(p(format!("{l}.attention.wq.weight"), &[q, d]));
        out.push(p(format!("{l}.attention.wk.weight"), &[kv, d]));
        out.push(p(format!("{l}.attention.wv.weight"), &[kv, d]));
        out.push(p(format!("{l}.attention.wo.weight"), &[d, q]));
        out.push(p(format!("{l}.ffn_norm.weight"), &[d]));
        out.push(p(format!("{l}.feed_forward.w1.weight"), &[f, d]));
        out.push(p(format!("{l}.feed_forward.w2.weight"), &[d, f]));
        out.push(p(format!("{l}.feed_forward.w3.weight"), &[f, d]));
    }
    out.push(p("norm.weight".into(), &[d]));
    if !spec.tied_embeddings {
        out.push(p("output.weight".into(), &[v, d]));
    }
    out
}

/// A shape loco cannot build: the spec's field, its value and what was expected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadShape {
    /// The field of the spec.
    pub field: &'static str,
    /// Its value.
    pub value: u32,
    /// What was expected.
    pub expected: &'static str,
}

/// Checks that the model can be built with `spec`: every size at least 1, `dim` a multiple of
/// `heads`, `heads` of `kv_heads`, and an even head size (RoPE rotates pairs).
pub fn check_shape(spec: &ModelSpec) -> Result<(), BadShape> {
    let bad = |field, value, expected| Err(BadShape { field, value, expected });
    for (field, value) in [
        ("layers", spec.layers),
        ("dim", spec.dim),
        ("heads", spec.heads),
        ("kv_heads", spec.kv_heads),
        ("ffn", spec.ffn),
        ("vocab", spec.vocab),
        ("seq_len", spec.seq_len),
    ] {
        if value == 0 {
            return bad(field, value, "at least 1");
        }
    }
    if !spec.dim.is_multiple_of(spec.heads) {
        return bad("dim", spec.dim, "a multiple of heads");
    }
    if !spec.heads.is_multiple_of(spec.kv_heads) {
        return bad("heads", spec.heads, "a multiple of kv_heads");
    }
    if !spec.head_dim().is_multiple_of(2) {
        return bad("dim", spec.dim, "dim / heads even (RoPE rotates pairs)");
    }
    Ok(())
}

/// `(name, numel)` of every parameter tensor, in order: the input of
/// `loco_core::diloco::buckets_from_sizes` for one bucket per tensor.
pub fn param_layout(spec: &ModelSpec) -> Vec<(String, usize)> {
    param_specs(spec).into_iter().map(|p| (p.name.clone(), p.numel())).collect()
}

/// `(name, numel)` per layer, in order: `tok_embeddings`, `layers.0`, ..., `norm`, and `output`
/// unless tied. The same flat order as [`param_layout`], grouped: one bucket per layer.
pub fn layer_layout(spec: &ModelSpec) -> Vec<(String, usize)> {
    let mut out: Vec<(String, usize)> = Vec::new();
    for p in param_specs(spec) {
        let group = match p.name.strip_prefix("layers.") {
            Some(rest) => format!("layers.{}", rest.split('.').next().unwrap_or(rest)),
            None => p.name.split('.').next().unwrap_or(&p.name).to_owned(),
        };
        match out.last_mut() {
            Some((name, n)) if *name == group => *n += p.numel(),
            _ => out.push((group, p.numel())),
        }
    }
    out
}

pub use loco_core::scenario::Precision;

#[cfg(test)]
mod tests {
    use super::*;
    use loco_core::scenario::Preset;

    #[test]
    fn layouts_sum_to_the_spec_count() {
        for p in Preset::ALL {
            let spec = p.spec();
            let total: usize = param_layout(&spec).iter().map(|(_, n)| n).sum();
            assert_eq!(total as u64, spec.param_count(), "{p}");
            let by_layer = layer_layout(&spec);
            assert_eq!(by_layer.iter().map(|(_, n)| n).sum::<usize>(), total);
            let tied = usize::from(spec.tied_embeddings);
            assert_eq!(by_layer.len(), spec.layers as usize + 3 - tied, "{p}");
            assert_eq!(by_layer[1].0, "layers.0");
            assert_eq!(
                by_layer.last().map(|l| l.0.as_str()),
                Some(if tied == 1 { "norm" } else { "output" })
            );
        }
    }

    #[test]
    fn tiny_layout_by_hand() {
        let spec = Preset::Tiny.spec();
        let layout = param_layout(&spec);
        // 1 embedding + 2 layers x 9 + norm + output.
        assert_eq!(layout.len(), 21);
        assert_eq!(layout[0], ("tok_embeddings.weight".to_owned(), 256 * 64));
        // kv: 2 heads of 16.
        assert_eq!(layout[3], ("layers.0.attention.wk.weight".to_owned(), 32 * 64));
        assert_eq!(layout[8], ("layers.0.feed_forward.w2.weight".to_owned(), 64 * 192));
        assert_eq!(layout[20], ("output.weight".to_owned(), 256 * 64));
        let names: std::collections::BTreeSet<_> = layout.iter().map(|l| &l.0).collect();
        assert_eq!(names.len(), layout.len(), "names are unique");
    }
}
