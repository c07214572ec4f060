//! The DiLoCo outer state in flat fp32 buffers.
//!
//! Every node keeps the last global weights (`outer`), the pseudo-gradient of the current round
//! and the outer optimiser's Nesterov momentum, each one flat `Vec<f32>` of the model's parameter
//! count, bucketed by layer so the all-reduce can send layer by layer. The inner optimiser is the
//! backend's business.
//!
//! One outer step, for every node:
//! 1. `pseudo_gradient = outer - inner` ([`OuterState::compute_pseudo_gradient`]);
//! 2. the pseudo-gradients are averaged by the ring all-reduce (weighted);
//! 3. the outer SGD step with Nesterov momentum, with torch's semantics
//!    (`buf = m*buf + g; outer -= lr*(g + m*buf)`; [`OuterState::apply_outer_step`]);
//! 4. the inner weights are set to the new outer weights (the backend copies `outer` back).
//!
//! # Overlapped and streaming DiLoCo ([`Mode`])
//!
//! In `overlap` and `streaming` mode the inner steps never wait for the all-reduce: the
//! model is cut into `P` fragments ([`Schedule`]; `P = 1` in overlap mode), round `r` (every
//! `H / P` inner steps) synchronises fragment `r mod P`, and its all-reduce runs while the next
//! round computes. The node keeps one more local buffer, the *anchor* `A` (the global weights
//! its local trajectory last merged), and at the end of every round
//! ([`OuterState::overlap_round`]):
//!
//! 1. **merge** the fragment synchronised one round ago, whose average has been applied to the
//!    global weights `G` since: `inner += G - A`, then `A = G`: the inner weights take the
//!    global update in place of the estimate they took at the sync, and keep all the local
//!    progress made since (Streaming DiLoCo's merge would discard part of it);
//! 2. **sync** this round's fragment: `own = A - inner` (the local progress since the last
//!    merge) goes into the all-reduce, and the inner weights take an *eager* outer step with
//!    `own` standing in for the average on the way (the outer optimiser's step from `G` and
//!    the momentum, as the commit will apply it): `inner += (1 - mix) * (eager - inner)`, then
//!    `A = inner`. Without it the outer momentum acts on pseudo-gradients a round stale
//!    (`loco bench quality`: +6.2% eval loss in overlap mode, +0.97% streaming; with it +5.2%
//!    and +0.6%). Eager Updates' estimate (Kale et al. 2025: this node's share of its fresh
//!    pseudo-gradient plus the others' part of their last average) made the overlapped run
//!    oscillate here (+50%): consecutive pseudo-gradients were not alike enough to stand in
//!    for each other, while the node's own fresh one is.
//!
//! Every inner step's progress is counted in exactly one pseudo-gradient (with `mix = 0`), and
//! `G` and the momentum stay bit-identical on every replica (they change only by averaged
//! steps). A step the mesh skips ([`OuterState::skip_round`]) owes the node's progress again:
//! the fragment's next sync sends it instead of losing it.

use crate::allreduce::schedule::chunk_range;
use serde::{Deserialize, Serialize};
use std::ops::Range;
use std::sync::Arc;

/// Settings of the outer optimiser. `Default` gives DiLoCo's: lr 0.7, momentum 0.9, Nesterov.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct OuterConfig {
    /// Outer learning rate.
    pub lr: f32,
    /// Momentum coefficient.
    pub momentum: f32,
    /// Nesterov momentum (torch `SGD(nesterov=True)`); plain momentum when false.
    pub nesterov: bool,
    /// Error feedback (`[diloco] error_feedback`): the decay `beta` of the residual, what the
    /// codec did not send of this node's contributions. Each outer step contributes
    /// `beta * residual + pseudo-gradient`, and the residual becomes what of that was not sent
    /// ([`OuterState::keep_residual`]). `None`: no residual.
    #[serde(default)]
    pub feedback: Option<f32>,
}

impl Default for OuterConfig {
    fn default() -> Self {
        OuterConfig { lr: 0.7, momentum: 0.9, nesterov: true, feedback: None }
    }
}

/// How the outer step meets the inner steps (`[diloco] mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// DiLoCo as INTELLECT-1 ran it: the inner steps wait for every all-reduce.
    #[default]
    Sync,
    /// One-step-delayed outer updates: the all-reduce of step `t` runs while step `t + 1`
    /// computes, and is merged at its end.
    Overlap,
    /// Streaming DiLoCo: `P` fragments synchronised at staggered times, each all-reduce
    /// overlapping the next `H / P` inner steps.
    Streaming,
}

impl Mode {
    /// The name in scenario files.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Sync => "sync",
            Mode::Overlap => "overlap",
            Mode::Streaming => "streaming",
        }
    }

    /// Whether the inner steps go on while the all-reduce runs.
    pub fn overlaps(self) -> bool {
        self != Mode::Sync
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "sync" => Ok(Mode::Sync),
            "overlap" => Ok(Mode::Overlap),
            "streaming" => Ok(Mode::Streaming),
            _ => Err(format!("`{s}` is not a mode: sync, overlap or streaming")),
        }
    }
}

/// Which values each round synchronises: the mode, its fragments, how many rounds apart the
/// syncs are, and the merge's mix.
#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    /// The mode.
    pub mode: Mode,
    /// The fragments, tiling `0..params` in order (one, the whole model, unless streaming).
    pub fragments: Vec<Range<usize>>,
    /// Rounds from one sync to the next (at least 1): the last round of each `every`
    /// synchronises the next fragment, the others nothing. A sync's average is merged at the
    /// end of the round after it, so `every > 1` (the scenario's `sync_delay` shorter than a
    /// round) merges it part-way into the period it runs beside.
    pub every: u64,
    /// The merge keeps `mix` of the local weights (`0`: all of the global update).
    pub mix: f32,
}

impl Schedule {
    /// Sync DiLoCo over `params` values.
    pub fn sync(params: usize) -> Schedule {
        Schedule { mode: Mode::Sync, fragments: fragments(params, &[], 1), every: 1, mix: 0.0 }
    }

    /// `mode` over a model of `params` values whose layers (tensors) have the lengths `layers`
    /// (in order; empty: cut anywhere), with `fragments` fragments in streaming mode (one
    /// otherwise) following layer boundaries ([`fragments`]).
    pub fn new(mode: Mode, params: usize, layers: &[usize], fragments: u32, mix: f32) -> Schedule {
        let p = if mode == Mode::Streaming { fragments.max(1) } else { 1 };
        Schedule { mode, fragments: self::fragments(params, layers, p), every: 1, mix }
    }

    /// This schedule with a sync every `every` rounds (at least 1; sync mode keeps 1).
    pub fn with_sync_every(mut self, every: u64) -> Schedule {
        self.every = if self.mode.overlaps() { every.max(1) } else { 1 };
        self
    }

    /// The fragment round `round` synchronises: empty (at the next fragment's start) in the
    /// rounds between two syncs.
    pub fn fragment(&self, round: u64) -> Range<usize> {
        let p = self.fragments.len().max(1) as u64;
        let k = self.every.max(1);
        let f = self.fragments.get(((round / k) % p) as usize).cloned().unwrap_or(0..0);
        if round % k == k - 1 { f } else { f.start..f.start }
    }

    /// The fragment merged at the end of round `round` (the one synchronised a round before).
    pub fn merged(&self, round: u64) -> Option<Range<usize>> {
        round.checked_sub(1).map(|r| self.fragment(r))
    }
}

/// One value's outer step with torch's SGD semantics: `buf = m*buf + g`; Nesterov:
/// `w -= lr*(g + m*buf)`, else `w -= lr*buf`. Returns the new weight and momentum. Every outer
/// step (and overlapped DiLoCo's eager estimate of one) goes through it, so that a node alone
/// lands exactly where its commit will.
#[inline(always)]
fn outer_update(cfg: OuterConfig, w: f32, buf: f32, g: f32) -> (f32, f32) {
    let OuterConfig { lr, momentum: m, nesterov, .. } = cfg;
    let buf = m * buf + g;
    let d = if nesterov { g + m * buf } else { buf };
    (w - lr * d, buf)
}

/// `p` contiguous fragments tiling `0..params` that cut only between layers (when `layers`,
/// their lengths in order, tile `params` and number at least `p`), each as close as the layers
/// allow to `params / p`; otherwise (a model of fewer layers than fragments, a synthetic vector)
/// cut at `params * k / p`.
pub fn fragments(params: usize, layers: &[usize], p: u32) -> Vec<Range<usize>> {
    let p = p.max(1) as usize;
    let tiles = layers.len() >= p
        && layers.iter().try_fold(0usize, |a, &l| a.checked_add(l)) == Some(params);
    let mut cuts = Vec::with_capacity(p + 1);
    cuts.push(0);
    for k in 1..p {
        // The ideal cut, rounded down; then the nearest layer boundary.
        let ideal = (params as u128 * k as u128 / p as u128) as usize;
        let cut = if tiles && !layers.is_empty() {
            let mut at = 0usize;
            let mut best = 0usize;
            for &l in layers {
                if at.abs_diff(ideal) < best.abs_diff(ideal) {
                    best = at;
                }
                at += l;
            }
            if at.abs_diff(ideal) < best.abs_diff(ideal) {
                best = at;
            }
            best
        } else {
            ideal
        };
        let prev = *cuts.last().unwrap_or(&0);
        cuts.push(cut.max(prev));
    }
    cuts.push(params);
    cuts.windows(2).map(|w| w[0]..w[1]).collect()
}

/// A named contiguous range of the flat buffers (one layer or parameter tensor).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bucket {
    /// Name of the tensor or layer.
    pub name: String,
    /// Its values in the flat buffers.
    pub range: Range<usize>,
}

/// Builds contiguous buckets from `(name, len)` pairs, in order.
pub fn buckets_from_sizes<S: Into<String>>(
    sizes: impl IntoIterator<Item = (S, usize)>,
) -> Vec<Bucket> {
    let mut at = 0;
    sizes
        .into_iter()
        .map(|(name, len)| {
            let b = Bucket { name: name.into(), range: at..at + len };
            at += len;
            b
        })
        .collect()
}

/// Errors of the outer state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DilocoError {
    /// A buffer of the wrong length was given.
    #[error("{what}: expected {expected} values, got {got}")]
    Length {
        /// Which buffer.
        what: &'static str,
        /// The parameter count.
        expected: usize,
        /// What was given.
        got: usize,
    },
    /// Buckets do not tile the buffers.
    #[error("buckets must tile 0..{len} contiguously; bucket `{name}` starts at {start}")]
    Buckets {
        /// The parameter count.
        len: usize,
        /// The offending bucket.
        name: String,
        /// Where it starts.
        start: usize,
    },
}

/// `n` zeros whose pages are resident: written once now, so that the first writes into them
/// later (a joiner's momentum, received by live recovery while the mesh waits) do not stop for
/// the kernel to hand out and clear fresh pages.
fn resident_zeros(n: usize) -> Vec<f32> {
    let mut v = vec![0.0f32; n];
    // One write per 4 KiB page (freshly allocated zeros are only mapped, not yet backed).
    for i in (0..n).step_by(1024) {
        v[i] = std::hint::black_box(0.0);
    }
    v
}

/// Values below which a pass over the outer state stays on one thread (a thread costs more).
const SHARD_MIN: usize = 1 << 20;

/// How many shards a pass over `len` values runs in: `shards`, fewer where a shard would hold
/// under [`SHARD_MIN`] values, at least one.
fn shards_for(len: usize, shards: usize) -> usize {
    shards.clamp(1, (len / SHARD_MIN).max(1))
}

/// Runs `f` on each shard `chunk_range(len, k, s)` of `v` (its range and its values), one
/// thread per shard when there are several; returns what each returned, in shard order.
fn sharded<R: Send>(
    v: &mut [f32],
    shards: usize,
    f: impl Fn(Range<usize>, &mut [f32]) -> R + Sync,
) -> Vec<R> {
    let len = v.len();
    let k = shards_for(len, shards);
    if k == 1 {
        return vec![f(0..len, v)];
    }
    let mut parts = Vec::with_capacity(k);
    let mut rest = v;
    for s in 0..k {
        let (head, tail) = std::mem::take(&mut rest).split_at_mut(chunk_range(len, k, s).len());
        parts.push((chunk_range(len, k, s), head));
        rest = tail;
    }
    std::thread::scope(|scope| {
        let f = &f;
        let handles: Vec<_> =
            parts.into_iter().map(|(r, p)| scope.spawn(move || f(r, p))).collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    })
}

/// The outer state of one node.
///
/// The outer weights and momentum are shared buffers, copied on write: a snapshot
/// ([`shared_buffers`](Self::shared_buffers), what a live-recovery sender sends from) costs no
/// copy, and the outer step that follows copies a buffer only while a snapshot still holds it.
#[derive(Clone, Debug, PartialEq)]
pub struct OuterState {
    cfg: OuterConfig,
    outer: Arc<Vec<f32>>,
    pseudo_gradient: Vec<f32>,
    momentum: Arc<Vec<f32>>,
    /// The anchor of overlapped and streaming DiLoCo (the global weights last merged; local,
    /// never sent); empty until [`anchor_here`](Self::anchor_here).
    anchor: Vec<f32>,
    buckets: Vec<Bucket>,
    steps: u64,
    /// Error feedback's residual ([`OuterConfig::feedback`]): local, never sent, zero at the
    /// start and in a received state; empty without error feedback.
    residual: Vec<f32>,
}

impl OuterState {
    /// Starts from the initial global weights, with zero momentum and one bucket per entry of
    /// `buckets` (which must tile the weights; empty means one bucket for everything).
    pub fn new(
        cfg: OuterConfig,
        weights: impl Into<Arc<Vec<f32>>>,
        buckets: Vec<Bucket>,
    ) -> Result<OuterState, DilocoError> {
        OuterState::build(cfg, weights.into(), None, buckets)
    }

    /// [`new`](Self::new), with `momentum` (of the weights' length) or zeros.
    fn build(
        cfg: OuterConfig,
        weights: Arc<Vec<f32>>,
        momentum: Option<Arc<Vec<f32>>>,
        buckets: Vec<Bucket>,
    ) -> Result<OuterState, DilocoError> {
        let n = weights.len();
        let buckets = if buckets.is_empty() {
            vec![Bucket { name: "all".into(), range: 0..n }]
        } else {
            buckets
        };
        let mut at = 0;
        for b in &buckets {
            if b.range.start != at || b.range.end < b.range.start {
                return Err(DilocoError::Buckets {
                    len: n,
                    name: b.name.clone(),
                    start: b.range.start,
                });
            }
            at = b.range.end;
        }
        if at != n {
            let last = buckets.last().map(|b| b.name.clone()).unwrap_or_default();
            return Err(DilocoError::Buckets { len: n, name: last, start: at });
        }
        Ok(OuterState {
            cfg,
            pseudo_gradient: vec![0.0; n],
            momentum: momentum.unwrap_or_else(|| Arc::new(resident_zeros(n))),
            outer: weights,
            anchor: Vec::new(),
            buckets,
            steps: 0,
            residual: if cfg.feedback.is_some() { resident_zeros(n) } else { Vec::new() },
        })
    }

    /// Restores a state (live recovery, checkpoints): weights and momentum as they were.
    pub fn restore(
        cfg: OuterConfig,
        weights: impl Into<Arc<Vec<f32>>>,
        momentum: impl Into<Arc<Vec<f32>>>,
        buckets: Vec<Bucket>,
        steps: u64,
    ) -> Result<OuterState, DilocoError> {
        let (weights, momentum) = (weights.into(), momentum.into());
        if momentum.len() != weights.len() {
            return Err(DilocoError::Length {
                what: "momentum",
                expected: weights.len(),
                got: momentum.len(),
            });
        }
        let mut s = OuterState::build(cfg, weights, Some(momentum), buckets)?;
        s.steps = steps;
        Ok(s)
    }

    /// Number of parameters.
    pub fn len(&self) -> usize {
        self.outer.len()
    }

    /// The outer optimiser's settings.
    pub fn config(&self) -> OuterConfig {
        self.cfg
    }

    /// The last global weights.
    pub fn outer(&self) -> &[f32] {
        &self.outer
    }

    /// The Nesterov momentum buffer.
    pub fn momentum(&self) -> &[f32] {
        &self.momentum
    }

    /// Hands out the outer weights' and momentum's buffers when nothing else shares them,
    /// leaving this state without parameters until [`put_buffers`](Self::put_buffers): a
    /// joiner writes the state it receives into the buffers it holds anyway.
    pub fn take_buffers(&mut self) -> Option<[Vec<f32>; 2]> {
        let (Some(outer), Some(momentum)) =
            (Arc::get_mut(&mut self.outer), Arc::get_mut(&mut self.momentum))
        else {
            return None;
        };
        Some([std::mem::take(outer), std::mem::take(momentum)])
    }

    /// Gives back buffers handed out by [`take_buffers`](Self::take_buffers) (their values are
    /// whatever was written meanwhile); ignored unless both have the pseudo-gradient's length.
    pub fn put_buffers(&mut self, [outer, momentum]: [Vec<f32>; 2]) {
        let n = self.pseudo_gradient.len();
        if outer.len() == n && momentum.len() == n {
            (self.outer, self.momentum) = (Arc::new(outer), Arc::new(momentum));
        }
    }

    /// The outer weights' and momentum's buffers, shared (no copy): a snapshot that stays as it
    /// is, since the next outer step copies a buffer still shared before it writes.
    pub fn shared_buffers(&self) -> [Arc<Vec<f32>>; 2] {
        [Arc::clone(&self.outer), Arc::clone(&self.momentum)]
    }

    /// The pseudo-gradient buffer (before the all-reduce: this node's; after: the average).
    pub fn pseudo_gradient(&self) -> &[f32] {
        &self.pseudo_gradient
    }

    /// Mutable pseudo-gradient, for the all-reduce to average in place.
    pub fn pseudo_gradient_mut(&mut self) -> &mut [f32] {
        &mut self.pseudo_gradient
    }

    /// Moves the pseudo-gradient buffer out (for an all-reduce that owns its payload); put it
    /// back with [`put_pseudo_gradient`](Self::put_pseudo_gradient).
    pub fn take_pseudo_gradient(&mut self) -> Vec<f32> {
        std::mem::take(&mut self.pseudo_gradient)
    }

    /// Puts the pseudo-gradient buffer back.
    pub fn put_pseudo_gradient(&mut self, g: Vec<f32>) -> Result<(), DilocoError> {
        self.check("pseudo-gradient", g.len())?;
        self.pseudo_gradient = g;
        Ok(())
    }

    /// The layer buckets.
    pub fn buckets(&self) -> &[Bucket] {
        &self.buckets
    }

    /// Outer steps applied so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// `pseudo_gradient = outer - inner`. Call again to restore the kept pseudo-gradient before
    /// retrying a failed all-reduce (the inner weights have not changed). Returns how many of
    /// its values are not finite (NaN or infinite: a diverged inner loop), counted in the same
    /// pass; such a pseudo-gradient must not be averaged.
    pub fn compute_pseudo_gradient(&mut self, inner: &[f32]) -> Result<usize, DilocoError> {
        self.compute_pseudo_gradient_sharded(inner, 1)
    }

    /// [`compute_pseudo_gradient`](Self::compute_pseudo_gradient) over `shards` threads, one
    /// per shard `chunk_range(len, shards, s)` (a node's G rings' shards): the same values, in
    /// a G-th of the time where there are the cores.
    pub fn compute_pseudo_gradient_sharded(
        &mut self,
        inner: &[f32],
        shards: usize,
    ) -> Result<usize, DilocoError> {
        self.check("inner weights", inner.len())?;
        let outer: &[f32] = &self.outer;
        let bad = sharded(&mut self.pseudo_gradient, shards, |range, g| {
            let mut bad = 0usize;
            for ((g, o), i) in g.iter_mut().zip(&outer[range.clone()]).zip(&inner[range]) {
                *g = o - i;
                bad += usize::from(!g.is_finite());
            }
            bad
        });
        Ok(bad.into_iter().sum())
    }

    /// Like [`compute_pseudo_gradient`](Self::compute_pseudo_gradient), without a copy of the
    /// inner weights: `fill` writes them into the pseudo-gradient buffer, which is then turned
    /// into `outer - inner` in place. Keeps the outer state at three fp32 copies of the model.
    pub fn compute_pseudo_gradient_with<E>(
        &mut self,
        fill: impl FnOnce(&mut [f32]) -> Result<(), E>,
    ) -> Result<(), E> {
        fill(&mut self.pseudo_gradient)?;
        for (g, o) in self.pseudo_gradient.iter_mut().zip(self.outer.iter()) {
            *g = o - *g;
        }
        Ok(())
    }

    /// Applies the averaged pseudo-gradient held in the buffer: one outer SGD step with torch's
    /// semantics (`buf = m*buf + g`; Nesterov: `outer -= lr*(g + m*buf)`; else `outer -= lr*buf`).
    /// Afterwards the backend copies [`outer`](Self::outer) into the inner model.
    pub fn apply_outer_step(&mut self) {
        self.apply_outer_step_sharded(1);
    }

    /// [`apply_outer_step`](Self::apply_outer_step) over `shards` threads, one per shard (see
    /// [`compute_pseudo_gradient_sharded`](Self::compute_pseudo_gradient_sharded)): the same
    /// values.
    pub fn apply_outer_step_sharded(&mut self, shards: usize) {
        let cfg = self.cfg;
        // Copies a buffer only while a snapshot still holds it.
        let (outer, momentum) = (Arc::make_mut(&mut self.outer), Arc::make_mut(&mut self.momentum));
        let g: &[f32] = &self.pseudo_gradient;
        let len = outer.len();
        let mut pairs: Vec<(&mut [f32], &mut [f32])> = Vec::new();
        let (mut w_rest, mut b_rest): (&mut [f32], &mut [f32]) = (outer, momentum);
        let k = shards_for(len, shards);
        for s in 0..k {
            let n = chunk_range(len, k, s).len();
            let (w, wr) = std::mem::take(&mut w_rest).split_at_mut(n);
            let (b, br) = std::mem::take(&mut b_rest).split_at_mut(n);
            (w_rest, b_rest) = (wr, br);
            pairs.push((w, b));
        }
        let step = |s: usize, (w, b): (&mut [f32], &mut [f32])| {
            let g = &g[chunk_range(len, k, s)];
            for ((w, buf), &g) in w.iter_mut().zip(b.iter_mut()).zip(g) {
                (*w, *buf) = outer_update(cfg, *w, *buf, g);
            }
        };
        if k == 1 {
            pairs.into_iter().for_each(|p| step(0, p));
        } else {
            std::thread::scope(|scope| {
                for (s, p) in pairs.into_iter().enumerate() {
                    let step = &step;
                    scope.spawn(move || step(s, p));
                }
            });
        }
        self.steps += 1;
    }

    /// Skips the outer update of this round (every member does the same when the all-reduce
    /// could not complete within its retries): weights and momentum are unchanged, the step is
    /// counted, and the backend resets the inner weights to [`outer`](Self::outer).
    pub fn skip_outer_step(&mut self) {
        self.pseudo_gradient.fill(0.0);
        self.steps += 1;
    }

    /// Applies an averaged pseudo-gradient `avg` of the values in `range` only (a streaming
    /// fragment): the outer step of [`apply_outer_step`](Self::apply_outer_step) on those
    /// values, leaving this node's own pseudo-gradient in the buffer (the merge needs it).
    pub fn apply_outer_step_to(
        &mut self,
        range: Range<usize>,
        avg: &[f32],
    ) -> Result<(), DilocoError> {
        if range.end > self.outer.len() || range.len() != avg.len() {
            return Err(DilocoError::Length {
                what: "fragment average",
                expected: range.len(),
                got: avg.len(),
            });
        }
        let cfg = self.cfg;
        let (outer, momentum) = (Arc::make_mut(&mut self.outer), Arc::make_mut(&mut self.momentum));
        let (w, b) = (&mut outer[range.clone()], &mut momentum[range]);
        for ((w, buf), &g) in w.iter_mut().zip(b).zip(avg) {
            (*w, *buf) = outer_update(cfg, *w, *buf, g);
        }
        self.steps += 1;
        Ok(())
    }

    /// Whether the anchor of overlapped DiLoCo is set ([`anchor_here`](Self::anchor_here)).
    pub fn is_anchored(&self) -> bool {
        !self.outer.is_empty() && self.anchor.len() == self.outer.len()
    }

    /// Starts a local trajectory from the global weights: the anchor becomes a copy of them and
    /// the pseudo-gradient held is zeroed (nothing of this node is in flight).
    pub fn anchor_here(&mut self) {
        self.anchor.clear();
        self.anchor.extend_from_slice(&self.outer);
        self.pseudo_gradient.fill(0.0);
    }

    /// The end of one round of overlapped or streaming DiLoCo (see the module documentation):
    /// merges `merge` (the fragment synchronised a round ago) into `inner` with `mix`, then puts
    /// `anchor - inner` of `sync` into the pseudo-gradient buffer. Returns the non-finite values
    /// found there: then the node's local trajectory is dropped (`inner` and the anchor become
    /// the global weights, the fragment's pseudo-gradient zeros), as a sync node's is at every
    /// commit. Without an anchor, or for an `inner` that is not valid for this round
    /// (`valid = false`: a joiner that computed from weights it has since replaced), the
    /// trajectory starts here and the pseudo-gradient is zeros.
    pub fn overlap_round(
        &mut self,
        inner: &mut [f32],
        merge: Option<Range<usize>>,
        sync: Range<usize>,
        mix: f32,
        valid: bool,
    ) -> Result<usize, DilocoError> {
        self.check("inner weights", inner.len())?;
        if sync.end > self.outer.len() || merge.as_ref().is_some_and(|m| m.end > self.outer.len()) {
            return Err(DilocoError::Length {
                what: "fragment",
                expected: self.outer.len(),
                got: sync.end.max(merge.map_or(0, |m| m.end)),
            });
        }
        if !valid || !self.is_anchored() {
            self.restart_trajectory(inner);
            return Ok(0);
        }
        if let Some(m) = merge {
            let (g, a, x) = (&self.outer[m.clone()], &mut self.anchor[m.clone()], &mut inner[m]);
            for ((x, a), &g) in x.iter_mut().zip(a).zip(g) {
                *x += g - *a;
                *a = g;
            }
        }
        let mut bad = 0usize;
        let (a, d, x) = (
            &self.anchor[sync.clone()],
            &mut self.pseudo_gradient[sync.clone()],
            &inner[sync.clone()],
        );
        for ((d, &a), &x) in d.iter_mut().zip(a).zip(x) {
            *d = a - x;
            bad += usize::from(!d.is_finite());
        }
        if bad > 0 {
            self.restart_trajectory(inner);
            return Ok(bad);
        }
        // The eager step: this node's pseudo-gradient stands in for the average on the way,
        // through the outer optimiser as the commit will apply it (the same operations, so a
        // node alone lands exactly where its commit will).
        let cfg = self.cfg;
        let keep = 1.0 - mix;
        let (g, buf, d) = (
            &self.outer[sync.clone()],
            &self.momentum[sync.clone()],
            &self.pseudo_gradient[sync.clone()],
        );
        let (a, x) = (&mut self.anchor[sync.clone()], &mut inner[sync]);
        for ((((x, a), &g), &buf), &d) in x.iter_mut().zip(a).zip(g).zip(buf).zip(d) {
            let (proxy, _) = outer_update(cfg, g, buf, d);
            *x += keep * (proxy - *x);
            *a = *x;
        }
        Ok(bad)
    }

    /// A round of overlapped DiLoCo whose all-reduce the mesh skipped: this node's progress
    /// in `fragment`, which its eager step took, is owed again (the merge moves the inner
    /// weights back by the eager step, and the next sync of the fragment sends the progress).
    pub fn skip_round(&mut self, fragment: Range<usize>) {
        if self.is_anchored() && fragment.end <= self.anchor.len() {
            let (a, d) = (&mut self.anchor[fragment.clone()], &mut self.pseudo_gradient[fragment]);
            for (a, d) in a.iter_mut().zip(d.iter_mut()) {
                *a += *d;
                *d = 0.0;
            }
        }
        self.steps += 1;
    }

    /// `inner` and the anchor become the global weights; nothing of this node is in flight.
    fn restart_trajectory(&mut self, inner: &mut [f32]) {
        inner.copy_from_slice(&self.outer);
        self.anchor_here();
    }

    fn check(&self, what: &'static str, got: usize) -> Result<(), DilocoError> {
        if got == self.outer.len() {
            Ok(())
        } else {
            Err(DilocoError::Length { what, expected: self.outer.len(), got })
        }
    }
}

mod feedback;
pub use feedback::SentContribution;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod overlap_tests;
