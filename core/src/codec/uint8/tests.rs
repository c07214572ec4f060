use super::*;
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;

fn normal(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.sample::<f32, _>(StandardNormal)).collect()
}

fn encode(x: &[f32]) -> Vec<u8> {
    let mut e = vec![0u8; Uint8.encoded_len(x.len())];
    Uint8.encode(x, &mut e);
    e
}

fn decode(e: &[u8], n: usize) -> Vec<f32> {
    let mut d = vec![0.0f32; n];
    Uint8.decode(e, &mut d);
    d
}

/// PRIME's s over the finite values, in f64, computed independently of the codec.
fn rms_s(x: &[f32]) -> f64 {
    let f: Vec<f64> = x.iter().filter(|v| v.is_finite()).map(|&v| f64::from(v)).collect();
    let ss: f64 = f.iter().map(|v| v * v).sum();
    (ss / (f.len().max(2) - 1) as f64).sqrt()
}

/// reference.md test case 1: every table entry is the mean of the values in its bin (to
/// 1e-5 of a bin width: the plain path sums offsets from the bin centre in f32 windows), 0 for
/// an empty bin; checked against a sum in f64 over the codes the encoder wrote.
#[test]
fn table_is_per_bin_mean_and_zero_for_empty_bins() {
    let cases = [(1usize, 1u64), (3, 2), (255, 3), (257, 4), (4097, 5), (100_000, 6), (1 << 20, 7)];
    for (n, seed) in cases {
        for scale_by in [1.0f32, 3e-20, 7e15] {
            let x: Vec<f32> = normal(n, seed).iter().map(|v| v * scale_by).collect();
            let e = encode(&x);
            let table = read_table(&e);
            let width = 6.0 * rms_s(&x) / 256.0;
            let mut sum = [0.0f64; 256];
            let mut count = [0u64; 256];
            for (&v, &q) in x.iter().zip(&e[TABLE_BYTES..]) {
                sum[usize::from(q)] += f64::from(v);
                count[usize::from(q)] += 1;
            }
            let mut empty = 0;
            for b in 0..256 {
                if count[b] == 0 {
                    assert_eq!(table[b], 0.0, "n {n}: empty bin {b}");
                    empty += 1;
                } else {
                    let mean = sum[b] / count[b] as f64;
                    let err = (f64::from(table[b]) - mean).abs();
                    let tol = 1e-6 * width + 1e-7 * mean.abs();
                    assert!(err <= tol, "n {n} x{scale_by}: bin {b}: {} vs {mean}", table[b]);
                }
            }
            // Small inputs leave bins empty, so the zero rule is exercised.
            if n < 256 {
                assert!(empty >= 256 - n);
            }
        }
    }
}

/// reference.md test case 1: the codes follow q = clamp(round(x / scale) + 128, 0, 255), and
/// values within about +-2.99 s land in interior bins.
#[test]
fn codes_follow_the_bin_formula_and_interior_range() {
    let x = normal(200_000, 7);
    let e = encode(&x);
    let s = rms_s(&x);
    let scale = 6.0 * s / 256.0;
    let (mut interior, mut outer) = (0usize, 0usize);
    for (&v, &q) in x.iter().zip(&e[TABLE_BYTES..]) {
        let y = f64::from(v) / scale;
        let expect = (y.round() + 128.0).clamp(0.0, 255.0);
        // Away from a rounding boundary the code is exactly the formula's.
        if (y - y.floor() - 0.5).abs() > 1e-3 {
            assert_eq!(f64::from(q), expect, "x {v} y {y}");
        } else {
            assert!((f64::from(q) - expect).abs() <= 1.0);
        }
        let r = f64::from(v) / s;
        if r > -2.985 && r < 2.96 {
            assert!((1..=254).contains(&q), "x = {r} s landed in bin {q}");
            interior += 1;
        }
        if r < -2.995 {
            assert_eq!(q, 0, "x = {r} s");
            outer += 1;
        }
        if r > 2.97 {
            assert_eq!(q, 255, "x = {r} s");
            outer += 1;
        }
    }
    // Both rules were exercised: about 0.3% of N(0,1) is beyond 3 s.
    assert!(interior > 190_000 && outer > 100, "interior {interior} outer {outer}");
}

/// reference.md: the relative RMS error of one quantisation of N(0,1) is about 1.6%.
#[test]
fn relative_rms_error_on_normal_data_is_about_1_6_percent() {
    let n = 1_000_000;
    let x = normal(n, 42);
    let d = decode(&encode(&x), n);
    let (mut err, mut norm) = (0.0f64, 0.0f64);
    for (a, b) in x.iter().zip(&d) {
        err += f64::from(a - b).powi(2);
        norm += f64::from(*a).powi(2);
    }
    let rel = (err / norm).sqrt();
    assert!((0.0145..0.0175).contains(&rel), "relative RMS error {rel}");
}

/// PRIME's defect 9: all zeros and a single element divided by zero.
#[test]
fn all_zeros_decode_to_zero() {
    for n in [1usize, 2, 3, 17, 4096, 5000] {
        let x = vec![0.0f32; n];
        let e = encode(&x);
        assert!(e[TABLE_BYTES..].iter().all(|&q| q == 128));
        assert!(decode(&e, n).iter().all(|&v| v == 0.0 && v.is_sign_positive()));
    }
}

#[test]
fn one_element_decodes_exactly() {
    for v in [1.0f32, -3.5, 1e-30, -7.25e30, f32::MIN_POSITIVE, 1e-45, f32::MAX, f32::MIN] {
        let e = encode(&[v]);
        assert_eq!(decode(&e, 1), vec![v], "value {v}");
    }
}

#[test]
fn constant_chunk_decodes_to_the_constant() {
    for (n, v) in [(1023usize, -0.375f32), (4099, 0.1), (70_000, -3.3e-7)] {
        let d = decode(&encode(&vec![v; n]), n);
        assert!(d.iter().all(|&y| y == d[0]), "one bin, one value");
        assert!((d[0] - v).abs() <= 1e-6 * v.abs(), "{v} -> {}", d[0]);
    }
}

#[test]
fn non_finite_values_follow_the_documented_rule() {
    let mut x = normal(1000, 9);
    x[10] = f32::NAN;
    x[20] = f32::INFINITY;
    x[30] = f32::NEG_INFINITY;
    x[40] = -f32::NAN;
    let e = encode(&x);
    let q = &e[TABLE_BYTES..];
    assert_eq!((q[10], q[20], q[30], q[40]), (128, 255, 0, 128));
    let table = read_table(&e);
    assert!(table.iter().all(|t| t.is_finite()));
    // The finite values are binned as if the others were not there.
    let finite: Vec<f32> = x.iter().copied().filter(|v| v.is_finite()).collect();
    let e2 = encode(&finite);
    let codes: Vec<u8> = q.iter().zip(&x).filter(|(_, v)| v.is_finite()).map(|(&q, _)| q).collect();
    assert_eq!(codes, &e2[TABLE_BYTES..]);
    // Same means; the finite-only chunk takes the plain path, whose sums round differently.
    for (a, b) in table.iter().zip(read_table(&e2)) {
        assert!((a - b).abs() <= 1e-6 * a.abs().max(1e-3), "{a} vs {b}");
    }
    let d = decode(&e, x.len());
    assert!(d.iter().all(|v| v.is_finite()));
    assert_eq!(d[10], table[128]);
    assert_eq!(d[20], table[255]);
}

#[test]
fn only_non_finite_values_decode_to_zero() {
    let x = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0];
    let e = encode(&x);
    assert_eq!(&e[TABLE_BYTES..], &[128, 255, 0, 128]);
    assert_eq!(decode(&e, 4), vec![0.0; 4]);
}

#[test]
fn empty_chunk_is_a_zero_table() {
    let e = encode(&[]);
    assert_eq!(e.len(), TABLE_BYTES);
    assert!(e.iter().all(|&b| b == 0));
    let mut d: [f32; 0] = [];
    Uint8.decode_accumulate(&e, &mut d);
}

/// Values for the fast-path comparisons: N(0,1) at a random scale, with some zeros, NaN,
/// infinities, huge and tiny values and outliers mixed in.
fn mixed_value() -> impl Strategy<Value = f32> {
    prop_oneof![
        20 => (-4.0f32..4.0, -40i32..40).prop_map(|(v, e)| v * 2f32.powi(e)),
        1 => Just(0.0f32),
        1 => Just(-0.0f32),
        1 => Just(f32::NAN),
        1 => Just(f32::INFINITY),
        1 => Just(f32::NEG_INFINITY),
        1 => Just(f32::MAX),
        1 => Just(1.3e38f32),
        1 => Just(1e-42f32),
        1 => Just(-f32::MIN_POSITIVE),
        1 => any::<f32>(),
    ]
}

proptest! {
    /// The AVX2 kernel (where the processor has it) and the portable one give the same bytes.
    #[test]
    fn fast_path_is_byte_identical_to_the_portable_path(
        x in proptest::collection::vec(mixed_value(), 0..2100),
        finite_only in any::<bool>(),
        scale_by in prop_oneof![Just(1.0f32), Just(1e-30f32), Just(3e30f32), 1e-3f32..1e3],
    ) {
        let x: Vec<f32> = x
            .iter()
            .map(|v| v * scale_by)
            .filter(|v| !finite_only || v.is_finite())
            .collect();
        let mut fast = vec![0u8; Uint8.encoded_len(x.len())];
        let mut portable = fast.clone();
        super::encode(&x, &mut fast, true);
        super::encode(&x, &mut portable, false);
        prop_assert_eq!(fast, portable);
    }

    /// The kernels alone, on the plain path's inputs with bin widths from very narrow (most
    /// values clamped into the end bins) to very wide, and histograms not starting at zero.
    #[test]
    fn kernels_agree_bit_for_bit(
        x in proptest::collection::vec(-1e6f32..1e6, 0..40),
        groups in 0usize..6,
        inv in prop_oneof![1e-6f32..1e-3, 1e-3f32..1.0, 1.0f32..1e4],
        start in -100.0f32..100.0,
    ) {
        #[cfg(target_arch = "x86_64")]
        {
            let n = groups * GROUP;
            let src: Vec<f32> = (0..n).map(|i| x.get(i % x.len().max(1)).copied().unwrap_or(0.0)
                * (1.0 + i as f32 * 1e-3)).collect();
            let scale = 1.0 / inv;
            let mut h_fast: Hists32 = [[[start, 2.0]; HIST_LEN]; HISTS];
            let mut h_portable = h_fast;
            let mut c_fast = vec![0u8; n];
            let mut c_portable = vec![1u8; n];
            if x86::plain_kernel(&src, &mut c_fast, inv, scale, &mut h_fast) {
                plain_kernel(&src, &mut c_portable, inv, scale, &mut h_portable);
                prop_assert_eq!(c_fast, c_portable);
                for (a, b) in h_fast.iter().flatten().zip(h_portable.iter().flatten()) {
                    prop_assert_eq!(a.map(f32::to_bits), b.map(f32::to_bits));
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (x, groups, inv, start);
    }
}

/// Both paths across the flush windows' edges (first window 65504 values, then 65536).
#[test]
fn fast_path_matches_across_flush_windows() {
    let x = normal(200_000, 13);
    for n in [65471, 65503, 65504, 65505, 65514, 65535, 65536, 65567, 131040, 131073, 200_000] {
        let mut fast = vec![0u8; Uint8.encoded_len(n)];
        let mut portable = fast.clone();
        super::encode(&x[..n], &mut fast, true);
        super::encode(&x[..n], &mut portable, false);
        assert!(fast == portable, "n {n}");
    }
}

#[test]
fn huge_and_tiny_values_stay_finite() {
    let big: Vec<f32> = normal(3000, 11).iter().map(|v| v * 1e37).collect();
    let tiny: Vec<f32> = normal(3000, 12).iter().map(|v| v * 1e-42).collect();
    for x in [big, tiny] {
        let d = decode(&encode(&x), x.len());
        assert!(d.iter().all(|v| v.is_finite()));
        // The decode keeps the sign of the larger values.
        let max = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        for (a, b) in x.iter().zip(&d) {
            if a.abs() > 0.5 * max {
                assert_eq!(a.is_sign_positive(), b.is_sign_positive());
            }
        }
    }
}
