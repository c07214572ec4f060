//! PRIME's uint8 codebook codec (reference.md, "uint8 codec").
//!
//! # Scheme
//!
//! For a chunk `x` of `n` values:
//!
//! - `s = sqrt(sum(x^2) / max(m - 1, 1))`, where the sum and `m` run over the *finite* values only
//!   (PRIME's `||x|| / sqrt(n - 1)`; `max(.., 1)` defines the one-element chunk, where PRIME divided
//!   by zero);
//! - `scale = 6 s / 256`, and the values are binned by
//!   `q = clamp(round_half_even(x / scale) + 128, 0, 255)` (computed as `x * (1 / scale)`, a
//!   multiplication by the reciprocal): 256 bins of width `scale` centred on zero, so `|x|` below
//!   about 2.97 s (exactly: `-2.988 s < x < 2.965 s`) lands in an interior bin `1..=254` and the
//!   rest shares the two end bins;
//! - the table holds, for every bin, the **mean of the original values** that landed in it (0 for
//!   an empty bin), and a value decodes to `table[q]`.
//!
//! # Defined results on degenerate input
//!
//! - Empty chunk: the table is all zeros and there are no codes.
//! - All zeros (or no finite non-zero value at all): `scale` would be 0 (PRIME's defect 9, a division
//!   by zero); loco bins with a unit reciprocal instead, so every zero lands in bin 128 and decodes
//!   to exactly 0.
//! - One element: `s = |x|`, the value lands in bin 171 alone and decodes to exactly itself. More
//!   generally a bin holding one distinct value decodes it exactly.
//! - NaN lands in the bin of 0 (128), `+inf` in bin 255, `-inf` in bin 0. Non-finite values never
//!   enter the statistics or the table, so the table is always finite and decoding never yields
//!   NaN or inf: NaN decodes to the mean of the finite values in bin 128, `+-inf` to the mean of the
//!   finite values in the end bin (0 when there are none).
//! - Chunks of tiny values, whose reciprocal bin width does not fit an f32 (RMS below about
//!   1e-37, subnormals included), are first multiplied by 2^64 (exact), so they are binned like
//!   any other chunk.
//!
//! # Layout (little endian)
//!
//! `encoded_len(n) = 1024 + n` bytes: the table, 256 `f32` (bin 0 first), then the `n` codes, one
//! byte each, in input order. One byte per value plus 1 KiB per call.
//!
//! # Cost
//!
//! Encoding reads the input twice. First a statistics pass: sums of squares in f32 vector lanes
//! per block of 1024 values, added up in f64 (blocks with non-finite, huge or tiny values are
//! summed again in f64). Then, when every value is finite and moderate (the *plain* path), a
//! software pipeline: the vector quantisation of a group of values writes the codes and, per
//! value, the pair `[x - centre(bin), 1]`, while the scalar histogram update of the group before
//! it adds each pair into its bin. The bins live in four interleaved f32 histograms on the stack
//! (consecutive values in the same bin do not wait on each other's stores), flushed into f64 every
//! 65536 values; summing offsets from the bin centre keeps a table entry within about 1e-6 of a
//! bin width of the exact mean, and exact for a bin holding one value. Otherwise (the *general*
//! path: NaN, inf, |x| > 2^100, or a tiny chunk) the values themselves are summed in f64, finite
//! values only. Decoding is one table lookup and one add per value, eight codes per load; a large
//! `decode` writes through streaming stores (see `stream`). The ring's reduce steps
//! (`reduce_encode`, `reduce_average`) compute the sum into the caller's scratch segment and
//! gather the statistics in the same pass, block by block while each block is in the L1 cache,
//! so the statistics pass does not read the values again. Nothing is allocated.
//!
//! The histogram update bounds the plain path: one read-add-write of a bin per value, which no
//! vector instruction does. The portable kernel (groups of 32, auto-vectorised for the x86-64
//! baseline, SSE2) passes codes and pairs through small buffers, so each update also loads its
//! code and its pair. On x86-64 processors with AVX2 (checked at run time) the `x86` submodule's
//! kernel does the same arithmetic with AVX2 intrinsics, eight values per vector, and hands the
//! codes (eight bytes in one integer) and the pairs to the update in registers: one load per
//! value instead of three. Its codes and tables are identical to the portable kernel's, bit for
//! bit (property-tested); the module is the codec's only `unsafe` (the call into the
//! `target_feature` function, after the feature check).
//!
//! Measured by `loco bench codec` (single core, 2^24 values of N(0,1), release build, on a
//! 2-core AMD EPYC shared with other work): encoding runs at 0.36-0.44x a memcpy of the same f32
//! buffer with the AVX2 kernel, median about 0.39x over 28 runs (one run on a busy machine fell
//! to 0.29x), against about 0.30x with the portable kernel; about 2 ms of its 8 ms go to the
//! statistics pass, which is bound by memory. Decode-accumulate runs at 0.84-1.07x a memcpy.

use super::{BadEncoding, Codec, CodecKind};

#[cfg(target_arch = "x86_64")]
mod x86;

/// Bytes of the table at the start of every encoded chunk: 256 little-endian f32.
pub(crate) const TABLE_BYTES: usize = 256 * 4;

/// PRIME's 8-bit codebook scheme: 256 bins of width `6 s / 256` around zero, decoded by per-bin
/// means (see the module documentation for the exact rules and layout).
#[derive(Clone, Copy, Debug, Default)]
pub struct Uint8;

/// Vector lanes the loops are written for (the compiler maps them onto SIMD registers).
const LANES: usize = 16;
/// Values per chunk of the general path's quantise-then-histogram loop: input and codes stay in L1
/// between the two passes.
const CHUNK: usize = 2048;
/// Values per group of the plain path's software pipeline.
const GROUP: usize = 32;
/// Number of interleaved histograms.
const HISTS: usize = 4;
/// Entries per histogram: 256 bins and some padding, so that the histograms are not a multiple of
/// 4 KiB apart (a load from one would wait on a store to another at the same page offset).
const HIST_LEN: usize = 256 + 8;
#[cfg(target_arch = "x86_64")]
const _: () = assert!(GROUP.is_multiple_of(x86::STEP), "the AVX2 kernel takes whole groups");
/// Values between two flushes of the f32 histograms into f64: at most 16384 per histogram, so
/// counts are exact and the offset sums keep about 1e-6 of a bin width. The first window is one
/// [`GROUP`] shorter (where the first pipelined loop flushed; kept so that tables do not change).
const FLUSH: usize = 65536;
/// Adding 1.5 * 2^23 to a float in [0, 2^22) rounds it to an integer (half to even, the default
/// rounding mode), which then sits in the low mantissa bits.
const ROUND_MAGIC: f32 = 12_582_912.0;
/// Values per block of the statistics pass.
const STAT_BLOCK: usize = 1024;
/// A block whose f32 sum of squares is below this is summed again in f64 (subnormal squares).
const STAT_F32_MIN: f64 = 8.077_935_669_463_161e-28; // 2^-90
/// Values above this magnitude take the general path (their offsets could overflow f32 sums).
const PLAIN_MAX: f32 = 1_267_650_600_228_229_401_496_703_205_376.0; // 2^100
/// Pre-multiplier for chunks whose reciprocal bin width does not fit an f32.
const TINY_PRE: f32 = 18_446_744_073_709_551_616.0; // 2^64

/// What the statistics pass learns about a chunk.
struct Stats {
    /// Sum of the squares of the finite values.
    sum_sq: f64,
    /// Number of finite values.
    finite: u64,
    /// Every value is finite and at most [`PLAIN_MAX`] in magnitude.
    plain: bool,
}

/// Sum of squares and count of the finite values of `src`.
///
/// Squares are summed in `LANES` f32 lanes per block of [`STAT_BLOCK`] values (vectorised: one
/// multiply and one add per vector), then the lanes in f64. A block whose f32 sum is not finite
/// (NaN, inf, or squares beyond f32) or tiny is summed again in f64, over its finite values.
fn stats(src: &[f32]) -> Stats {
    let mut st = Stats::new();
    for block in src.chunks(STAT_BLOCK) {
        st.add_block(block);
    }
    st
}

impl Stats {
    fn new() -> Self {
        Stats { sum_sq: 0.0, finite: 0, plain: true }
    }

    /// Adds one block of [`STAT_BLOCK`] values (or the last, shorter one) to the statistics.
    #[inline]
    fn add_block(&mut self, block: &[f32]) {
        let st = self;
        let mut acc = [0.0f32; LANES];
        let mut body = block.chunks_exact(LANES);
        for c in &mut body {
            for i in 0..LANES {
                acc[i] += c[i] * c[i];
            }
        }
        for (a, &x) in acc.iter_mut().zip(body.remainder()) {
            *a += x * x;
        }
        let sum = acc.iter().map(|&a| f64::from(a)).sum::<f64>();
        if sum.is_finite() && sum >= STAT_F32_MIN {
            st.sum_sq += sum;
            st.finite += block.len() as u64;
        } else if sum == 0.0 && block.iter().fold(0u32, |acc, x| acc | (x.to_bits() << 1)) == 0 {
            // All zeros (either sign).
            st.finite += block.len() as u64;
        } else {
            for &x in block {
                if x.is_finite() {
                    st.sum_sq += f64::from(x) * f64::from(x);
                    st.finite += 1;
                    st.plain &= x.abs() <= PLAIN_MAX;
                } else {
                    st.plain = false;
                }
            }
        }
    }
}

/// How a chunk with these statistics is binned: `(pre, inv)`, where a value's bin is computed from
/// `x * pre * inv`; `pre` is 1 except for chunks of tiny values.
fn scaling(sum_sq: f64, finite: u64) -> (f32, f32) {
    let s = (sum_sq / finite.saturating_sub(1).max(1) as f64).sqrt();
    let scale = 6.0 * s / 256.0;
    if scale > 0.0 {
        let inv = 1.0 / scale;
        if inv < f64::from(f32::MAX) / 2.0 {
            // Never 0: scale <= 6 * sqrt(2) * f32::MAX / 256, so inv is a normal f32.
            (1.0, inv as f32)
        } else {
            // s > 1e-45 (some finite non-zero value), so inv / 2^64 < 2^100.
            (TINY_PRE, (inv / f64::from(TINY_PRE)) as f32)
        }
    } else {
        // All finite values are zero (or there is none): any positive reciprocal bins zeros
        // into 128 and +-inf into the end bins.
        (1.0, 1.0)
    }
}

/// `clamp(y, -128, 127) + 128` plus the rounding magic, for a `y` that is not NaN: one rounding
/// to an integer (half to even), whose low byte of bits is the code `q = round(y) + 128`, and
/// `result - (ROUND_MAGIC + 128)` is exactly `q - 128`.
#[inline(always)]
fn magic(y: f32) -> f32 {
    // +-inf saturate here.
    let t = if y < 127.0 { y } else { 127.0 };
    let t = if t > -128.0 { t } else { -128.0 };
    t + (ROUND_MAGIC + 128.0)
}

/// The code of one value, given the reciprocal of the bin width; NaN goes to bin 128.
#[inline(always)]
fn bin(x: f32, inv: f32) -> u8 {
    // NaN -> 0 (the comparison is false only for NaN).
    #[allow(clippy::eq_op)]
    let x = if x == x { x } else { 0.0 };
    // Truncation intended: the low byte of the mantissa is round(t) in 0..=255.
    magic(x * inv).to_bits() as u8
}

/// The centre of bin `q` in input units, as an f32 computed the same way everywhere.
#[inline(always)]
fn centre(q_minus_128: f32, scale: f32) -> f32 {
    q_minus_128 * scale
}

/// Per-bin `[offset sum, count]` accumulators of the plain path, `HISTS` interleaved copies.
type Hists32 = [[[f32; 2]; HIST_LEN]; HISTS];
/// Per-bin `[sum, count]` accumulators in f64.
type Hists64 = [[[f64; 2]; HIST_LEN]; HISTS];

/// The plain path (every value finite and moderate, no pre-multiplier): writes the codes, and for
/// each value the pair `[x - centre(q), 1]` the histogram adds up.
#[inline(always)]
fn quantise_plain(src: &[f32], codes: &mut [u8], pairs: &mut [[f32; 2]], inv: f32, scale: f32) {
    let one = |x: f32, q: &mut u8, p: &mut [f32; 2]| {
        let m = magic(x * inv);
        // Truncation intended: the code is the low byte.
        *q = m.to_bits() as u8;
        // m - (magic + 128) is exactly q - 128.
        *p = [x - centre(m - (ROUND_MAGIC + 128.0), scale), 1.0];
    };
    let mut s = src.chunks_exact(LANES);
    let mut c = codes.chunks_exact_mut(LANES);
    let mut p = pairs.chunks_exact_mut(LANES);
    for ((sc, cc), pc) in (&mut s).zip(&mut c).zip(&mut p) {
        for i in 0..LANES {
            one(sc[i], &mut cc[i], &mut pc[i]);
        }
    }
    let rest = s.remainder().iter().zip(c.into_remainder()).zip(p.into_remainder());
    for ((x, q), pr) in rest {
        one(*x, q, pr);
    }
}

/// Adds every pair into the bin named by the matching code, round-robin over the histograms so
/// that consecutive values in the same bin do not wait on each other's stores. Codes are read
/// eight at a time.
#[inline(always)]
fn scatter_plain(codes: &[u8], pairs: &[[f32; 2]], h: &mut Hists32) {
    let [h0, h1, h2, h3] = h;
    let add = |b: &mut [f32; 2], p: &[f32; 2]| {
        b[0] += p[0];
        b[1] += p[1];
    };
    let bin = |w: u64, k: u32| usize::from((w >> (8 * k)) as u8);
    let mut c = codes.chunks_exact(8);
    let mut p = pairs.chunks_exact(8);
    for (q, pr) in (&mut c).zip(&mut p) {
        let w = u64::from_le_bytes([q[0], q[1], q[2], q[3], q[4], q[5], q[6], q[7]]);
        add(&mut h0[bin(w, 0)], &pr[0]);
        add(&mut h1[bin(w, 1)], &pr[1]);
        add(&mut h2[bin(w, 2)], &pr[2]);
        add(&mut h3[bin(w, 3)], &pr[3]);
        add(&mut h0[bin(w, 4)], &pr[4]);
        add(&mut h1[bin(w, 5)], &pr[5]);
        add(&mut h2[bin(w, 6)], &pr[6]);
        add(&mut h3[bin(w, 7)], &pr[7]);
    }
    for (q, pr) in c.remainder().iter().zip(p.remainder()) {
        add(&mut h0[usize::from(*q)], pr);
    }
}

/// Adds the f32 histograms into the f64 totals and clears them.
fn flush(h: &mut Hists32, total: &mut [[f64; 2]; 256]) {
    for hist in h.iter_mut() {
        for (t, b) in total.iter_mut().zip(hist.iter_mut()) {
            t[0] += f64::from(b[0]);
            t[1] += f64::from(b[1]);
            *b = [0.0; 2];
        }
    }
}

/// The plain path: returns per bin `[sum of (x - centre), count]`.
///
/// The values are taken in windows of [`FLUSH`] (the first one a [`GROUP`] shorter), each run
/// through [`plain_kernel`] and flushed into f64; the last `len % GROUP` values go through the
/// same steps unpipelined (the last `len % 8` into histogram 0). With `fast`, the kernel is the
/// x86-64 AVX2 one where the processor has it (same results, bit for bit).
fn encode_plain(
    src: &[f32],
    codes: &mut [u8],
    inv: f32,
    scale: f32,
    fast: bool,
) -> [[f64; 2]; 256] {
    let mut h: Hists32 = [[[0.0; 2]; HIST_LEN]; HISTS];
    let mut total = [[0.0f64; 2]; 256];
    let main = src.len() / GROUP * GROUP;
    let (src_main, src_tail) = src.split_at(main);
    let (codes_main, codes_tail) = codes.split_at_mut(main);
    let (mut start, mut end) = (0, FLUSH - GROUP);
    while start < main {
        let stop = end.min(main);
        let (s, c) = (&src_main[start..stop], &mut codes_main[start..stop]);
        #[cfg(target_arch = "x86_64")]
        let done = fast && x86::plain_kernel(s, c, inv, scale, &mut h);
        #[cfg(not(target_arch = "x86_64"))]
        let done = {
            let _ = fast;
            false
        };
        if !done {
            plain_kernel(s, c, inv, scale, &mut h);
        }
        if stop < main {
            flush(&mut h, &mut total);
        }
        (start, end) = (stop, end + FLUSH);
    }
    let mut pairs = [[0.0f32; 2]; GROUP];
    let tail = &mut pairs[..src_tail.len()];
    quantise_plain(src_tail, codes_tail, tail, inv, scale);
    scatter_plain(codes_tail, tail, &mut h);
    flush(&mut h, &mut total);
    total
}

/// The plain path's kernel over a multiple of [`GROUP`] values starting at a multiple of 4: the
/// codes, and the pairs added into the histograms, value `i` into histogram `i % 4`.
///
/// A software pipeline over groups of [`GROUP`] values: the vector quantisation of one group is
/// followed by the scalar histogram update of the group before it, so that the processor overlaps
/// the two (they use different execution units).
fn plain_kernel(src: &[f32], codes: &mut [u8], inv: f32, scale: f32, h: &mut Hists32) {
    let mut pa = [[0.0f32; 2]; GROUP];
    let mut pb = [[0.0f32; 2]; GROUP];
    // Codes of the previous iteration's second group, whose pairs are in `pb`.
    let mut pending: Option<&[u8]> = None;
    let mut s = src.chunks_exact(2 * GROUP);
    let mut c = codes.chunks_exact_mut(2 * GROUP);
    for (sg, cg) in (&mut s).zip(&mut c) {
        let (s0, s1) = sg.split_at(GROUP);
        let (c0, c1) = cg.split_at_mut(GROUP);
        quantise_plain(s0, c0, &mut pa, inv, scale);
        if let Some(q) = pending {
            scatter_plain(q, &pb, h);
        }
        quantise_plain(s1, c1, &mut pb, inv, scale);
        scatter_plain(c0, &pa, h);
        pending = Some(c1);
    }
    if let Some(q) = pending {
        scatter_plain(q, &pb, h);
    }
    // An odd number of groups leaves one.
    let (s, c) = (s.remainder(), c.into_remainder());
    let last = &mut pa[..s.len()];
    quantise_plain(s, c, last, inv, scale);
    scatter_plain(c, last, h);
}

/// Quantises `src` into `dst` (same length), vectorised. With `PRE`, values are first multiplied
/// by `pre`.
#[inline(always)]
fn quantise<const PRE: bool>(src: &[f32], dst: &mut [u8], pre: f32, inv: f32) {
    let b = |x: f32| if PRE { bin(x * pre, inv) } else { bin(x, inv) };
    let mut s = src.chunks_exact(LANES);
    let mut d = dst.chunks_exact_mut(LANES);
    for (sc, dc) in (&mut s).zip(&mut d) {
        for i in 0..LANES {
            dc[i] = b(sc[i]);
        }
    }
    for (x, q) in s.remainder().iter().zip(d.into_remainder()) {
        *q = b(*x);
    }
}

/// The general path (non-finite, huge or tiny values): per-bin `[sum of x, count]` in f64 over
/// the finite values.
fn encode_general(src: &[f32], codes: &mut [u8], pre: f32, inv: f32) -> [[f64; 2]; 256] {
    let mut h: Hists64 = [[[0.0; 2]; HIST_LEN]; HISTS];
    let add = |b: &mut [f64; 2], x: f32| {
        let finite = x.is_finite();
        b[0] += if finite { f64::from(x) } else { 0.0 };
        b[1] += if finite { 1.0 } else { 0.0 };
    };
    for (s, c) in src.chunks(CHUNK).zip(codes.chunks_mut(CHUNK)) {
        if pre == 1.0 {
            quantise::<false>(s, c, pre, inv);
        } else {
            quantise::<true>(s, c, pre, inv);
        }
        let [h0, h1, h2, h3] = &mut h;
        let mut xs = s.chunks_exact(HISTS);
        let mut qs = c.chunks_exact(HISTS);
        for (x, q) in (&mut xs).zip(&mut qs) {
            add(&mut h0[usize::from(q[0])], x[0]);
            add(&mut h1[usize::from(q[1])], x[1]);
            add(&mut h2[usize::from(q[2])], x[2]);
            add(&mut h3[usize::from(q[3])], x[3]);
        }
        for (x, q) in xs.remainder().iter().zip(qs.remainder()) {
            add(&mut h0[usize::from(*q)], *x);
        }
    }
    let mut total = [[0.0f64; 2]; 256];
    for hist in &h {
        for (t, b) in total.iter_mut().zip(hist) {
            t[0] += b[0];
            t[1] += b[1];
        }
    }
    total
}

/// Reads the table at the head of an encoded chunk.
#[inline(always)]
fn read_table(src: &[u8]) -> [f32; 256] {
    let mut table = [0.0f32; 256];
    for (t, b) in table.iter_mut().zip(src[..TABLE_BYTES].chunks_exact(4)) {
        *t = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
    table
}

/// Looks every code up in the table and applies `f(dst value, decoded value)`. The lookups of
/// `LANES` codes go to a small array first, so that the adds and stores to `dst` vectorise.
#[inline(always)]
fn decode_with(src: &[u8], dst: &mut [f32], f: impl Fn(&mut f32, f32)) {
    decode_table(&read_table(src), &src[TABLE_BYTES..], dst, f);
}

/// [`decode_with`] of codes whose table has been read.
#[inline(always)]
fn decode_table(table: &[f32; 256], codes: &[u8], dst: &mut [f32], f: impl Fn(&mut f32, f32)) {
    let mut c = codes.chunks_exact(LANES);
    let mut d = dst.chunks_exact_mut(LANES);
    for (cc, dc) in (&mut c).zip(&mut d) {
        // Codes eight at a time from one load.
        let lo = u64::from_le_bytes([cc[0], cc[1], cc[2], cc[3], cc[4], cc[5], cc[6], cc[7]]);
        let hi = u64::from_le_bytes([cc[8], cc[9], cc[10], cc[11], cc[12], cc[13], cc[14], cc[15]]);
        let mut v = [0.0f32; LANES];
        for k in 0..8 {
            v[k] = table[usize::from((lo >> (8 * k)) as u8)];
            v[k + 8] = table[usize::from((hi >> (8 * k)) as u8)];
        }
        for i in 0..LANES {
            f(&mut dc[i], v[i]);
        }
    }
    for (q, o) in c.remainder().iter().zip(d.into_remainder()) {
        f(o, table[usize::from(*q)]);
    }
}

/// The reduce step of [`Uint8::reduce_encode`] and [`Uint8::reduce_average`] in one pass:
/// `out[i] = (weigh(own[i]) + decode(src)[i]) / div` (no division without `div`), with the same
/// f32 operations as the default methods' separate passes, and the statistics of `out` gathered
/// block by block while each block is still in the L1 cache. `own` is only read: on the
/// reduce-scatter's middle hops its values are never needed again, and writing them back to
/// memory was a third of the hop's memory traffic.
fn combine(src: &[u8], own: &[f32], weight: f32, div: Option<f32>, out: &mut [f32]) -> Stats {
    match div {
        None if weight == 0.0 => combine_with(src, own, out, |_, v| 0.0 + v),
        None if weight == 1.0 => combine_with(src, own, out, |o, v| o + v),
        None => combine_with(src, own, out, |o, v| weight * o + v),
        Some(d) if weight == 0.0 => combine_with(src, own, out, |_, v| (0.0 + v) / d),
        Some(d) if weight == 1.0 => combine_with(src, own, out, |o, v| (o + v) / d),
        Some(d) => combine_with(src, own, out, |o, v| (weight * o + v) / d),
    }
}

#[inline(always)]
fn combine_with(src: &[u8], own: &[f32], out: &mut [f32], f: impl Fn(f32, f32) -> f32) -> Stats {
    let table = read_table(src);
    let codes = &src[TABLE_BYTES..];
    let mut st = Stats::new();
    let blocks =
        out.chunks_mut(STAT_BLOCK).zip(own.chunks(STAT_BLOCK)).zip(codes.chunks(STAT_BLOCK));
    for ((o, x), q) in blocks {
        let mut oc = o.chunks_exact_mut(LANES);
        let mut xc = x.chunks_exact(LANES);
        let mut qc = q.chunks_exact(LANES);
        for ((ol, xl), ql) in (&mut oc).zip(&mut xc).zip(&mut qc) {
            let mut v = [0.0f32; LANES];
            for k in 0..LANES {
                v[k] = table[usize::from(ql[k])];
            }
            for k in 0..LANES {
                ol[k] = f(xl[k], v[k]);
            }
        }
        let rest = oc.into_remainder().iter_mut().zip(xc.remainder()).zip(qc.remainder());
        for ((ol, xl), ql) in rest {
            *ol = f(*xl, table[usize::from(*ql)]);
        }
        st.add_block(o);
    }
    st
}

/// Encodes `src` into `dst` (of [`Codec::encoded_len`] bytes); with `fast`, the plain path may use
/// the x86-64 AVX2 kernel (same bytes).
fn encode(src: &[f32], dst: &mut [u8], fast: bool) {
    encode_with(src, &stats(src), dst, fast);
}

/// [`encode`] with the statistics of `src` already gathered.
fn encode_with(src: &[f32], st: &Stats, dst: &mut [u8], fast: bool) {
    let (table_bytes, codes) = dst.split_at_mut(TABLE_BYTES);
    let (pre, inv) = scaling(st.sum_sq, st.finite);
    // Bin centres of the plain path, in input units.
    let scale = 1.0 / inv;
    let plain = st.plain && pre == 1.0;
    let sums = if plain {
        encode_plain(src, codes, inv, scale, fast)
    } else {
        encode_general(src, codes, pre, inv)
    };
    for (b, (out, [sum, count])) in table_bytes.chunks_exact_mut(4).zip(sums).enumerate() {
        let mean = if count == 0.0 {
            0.0
        } else if plain {
            let c = centre(b as f32 - 128.0, scale);
            (f64::from(c) + sum / count) as f32
        } else {
            (sum / count) as f32
        };
        out.copy_from_slice(&mean.to_le_bytes());
    }
}

impl Codec for Uint8 {
    fn kind(&self) -> CodecKind {
        CodecKind::Uint8
    }

    fn encoded_len(&self, n: usize) -> usize {
        TABLE_BYTES + n
    }

    /// The table only: every code decodes to one of its entries.
    fn check(&self, src: &[u8]) -> Result<(), BadEncoding> {
        let table = src.get(..TABLE_BYTES).unwrap_or(src);
        super::check_f32s(table, "table entry")
    }

    fn encode(&self, src: &[f32], dst: &mut [u8]) {
        assert_eq!(dst.len(), self.encoded_len(src.len()), "uint8 encode: wrong buffer length");
        encode(src, dst, true);
    }

    fn decode_accumulate(&self, src: &[u8], dst: &mut [f32]) {
        assert_eq!(src.len(), self.encoded_len(dst.len()), "uint8 decode: wrong buffer length");
        decode_with(src, dst, |d, v| *d += v);
    }

    /// Large outputs are written with streaming stores where the processor has them (the same
    /// bits; see `stream`).
    fn decode(&self, src: &[u8], dst: &mut [f32]) {
        assert_eq!(src.len(), self.encoded_len(dst.len()), "uint8 decode: wrong buffer length");
        let table = read_table(src);
        let codes = &src[TABLE_BYTES..];
        #[cfg(target_arch = "x86_64")]
        {
            let one = |i: usize| table[usize::from(codes[i])];
            let block = |i: usize, out: &mut [f32; super::stream::BLOCK]| {
                let q = &codes[i..i + super::stream::BLOCK];
                for (o, c) in out.iter_mut().zip(q) {
                    *o = table[usize::from(*c)];
                }
            };
            if super::stream::fill(dst, one, block) {
                return;
            }
        }
        decode_table(&table, codes, dst, |d, v| *d = v);
    }

    /// Fused: the reduce and the encoder's statistics in one pass into `scratch`, then the
    /// encoder's second pass from there (see `combine`).
    fn reduce_encode(
        &self,
        src: &[u8],
        own: &[f32],
        weight: f32,
        scratch: &mut [f32],
        dst: &mut [u8],
    ) {
        super::assert_reduce_lengths(self, src, own.len(), dst);
        let acc = &mut scratch[..own.len()];
        let st = combine(src, own, weight, None, acc);
        encode_with(acc, &st, dst, true);
    }

    /// Fused as [`reduce_encode`](Self::reduce_encode), with the division; `own` is read once
    /// and written once, by the decode.
    fn reduce_average(
        &self,
        src: &[u8],
        own: &mut [f32],
        weight: f32,
        weight_sum: f64,
        scratch: &mut [f32],
        dst: &mut [u8],
    ) {
        super::assert_reduce_lengths(self, src, own.len(), dst);
        let acc = &mut scratch[..own.len()];
        let st = if weight_sum > 0.0 {
            combine(src, own, weight, Some(weight_sum as f32), acc)
        } else {
            acc.fill(0.0);
            stats(acc)
        };
        encode_with(acc, &st, dst, true);
        self.decode(dst, own);
    }
}

#[cfg(test)]
mod tests;
