//! Tests every codec shares: lengths, accumulation, degenerate input, relative accuracy, and
//! property tests. Codec-specific rules are tested in each codec's file.

use super::*;
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;

/// Lengths that divide by nothing in particular, around the block and chunk sizes.
const LENGTHS: [usize; 10] = [0, 1, 3, 255, 256, 257, 1023, 4097, 4096 * 2 + 5, 70_001];

fn normal(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.sample::<f32, _>(StandardNormal)).collect()
}

/// Encodes into a buffer pre-filled with `fill`.
fn encode_over(c: &dyn Codec, x: &[f32], fill: u8) -> Vec<u8> {
    let mut e = vec![fill; c.encoded_len(x.len())];
    c.encode(x, &mut e);
    e
}

fn decode(c: &dyn Codec, e: &[u8], n: usize) -> Vec<f32> {
    let mut d = vec![f32::NAN; n];
    c.decode(e, &mut d);
    d
}

fn rel_rms(x: &[f32], y: &[f32]) -> f64 {
    let (mut err, mut norm) = (0.0f64, 0.0f64);
    for (a, b) in x.iter().zip(y) {
        err += (f64::from(*a) - f64::from(*b)).powi(2);
        norm += f64::from(*a).powi(2);
    }
    (err / norm).sqrt()
}

#[test]
fn kinds_and_lengths_agree() {
    for kind in CodecKind::ALL {
        let c = kind.codec();
        assert_eq!(c.kind(), kind);
        assert_eq!(kind.name().parse::<CodecKind>(), Ok(kind));
        for n in LENGTHS {
            let x = normal(n, n as u64);
            // Every byte is written: the result does not depend on the buffer's old content.
            let a = encode_over(c, &x, 0x00);
            let b = encode_over(c, &x, 0xff);
            assert_eq!(a, b, "{kind} n {n}");
            assert_eq!(a.len(), c.encoded_len(n));
        }
    }
    let per_value = |k: CodecKind, n: usize| k.codec().encoded_len(n) as f64 / n as f64;
    assert_eq!(per_value(CodecKind::Fp32, 1000), 4.0);
    assert_eq!(per_value(CodecKind::Fp16, 1000), 2.0);
    assert_eq!(per_value(CodecKind::Bf16, 1000), 2.0);
    assert_eq!(Uint8.encoded_len(1000), 1024 + 1000);
    assert_eq!(Int8Block.encoded_len(1000), 1000 + 4 * 4);
    assert_eq!(Int8Block.encoded_len(1024), 1024 + 4 * 4);
    assert_eq!(Int8Block.encoded_len(0), 0);
    // int4-block: ceil(n / 2) bytes of codes plus one 4-byte scale per started block of 256.
    for (n, len) in [(0, 0), (1, 5), (255, 132), (256, 132), (257, 137), (513, 269)] {
        assert_eq!(Int4Block.encoded_len(n), len, "n {n}");
    }
    assert_eq!(Int4Block.encoded_len(1024), 512 + 4 * 4);
}

#[test]
fn decode_accumulate_adds_decode_to_what_was_there() {
    for kind in CodecKind::ALL {
        let c = kind.codec();
        for n in LENGTHS {
            let x = normal(n, 100 + n as u64);
            let prev = normal(n, 200 + n as u64);
            let e = encode_over(c, &x, 0);
            let d = decode(c, &e, n);
            let mut acc = prev.clone();
            c.decode_accumulate(&e, &mut acc);
            for i in 0..n {
                assert_eq!(acc[i].to_bits(), (prev[i] + d[i]).to_bits(), "{kind} n {n} i {i}");
            }
        }
    }
}

#[test]
fn fp32_round_trip_is_bit_exact() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let x: Vec<f32> = (0..10_007).map(|_| f32::from_bits(rng.random())).collect();
    let e = encode_over(&Fp32, &x, 0);
    assert_eq!(&e[..4], &x[0].to_le_bytes());
    let d = decode(&Fp32, &e, x.len());
    assert!(x.iter().zip(&d).all(|(a, b)| a.to_bits() == b.to_bits()));
}

/// The codecs rank as documented on N(0,1) data: fp32 exact, then bf16 < fp16 in bits kept,
/// int8-block more accurate than PRIME's uint8 for about the same bytes, and int4-block's 15
/// levels about 18 times less accurate than int8-block's 255 for about half the bytes.
#[test]
fn accuracy_ranks_as_documented() {
    let n = 300_000;
    let x = normal(n, 5);
    let err = |k: CodecKind| rel_rms(&x, &decode(k.codec(), &encode_over(k.codec(), &x, 0), n));
    let (fp32, fp16, bf16, uint8, int8, int4) = (
        err(CodecKind::Fp32),
        err(CodecKind::Fp16),
        err(CodecKind::Bf16),
        err(CodecKind::Uint8),
        err(CodecKind::Int8Block),
        err(CodecKind::Int4Block),
    );
    assert_eq!(fp32, 0.0);
    // Uniform rounding error of relative half-ulp 2^-11 / 2^-8: RMS about a third of it.
    assert!(fp16 > 1e-4 && fp16 < 3e-4, "fp16 {fp16}");
    assert!(bf16 > 1e-3 && bf16 < 2.5e-3, "bf16 {bf16}");
    assert!(int8 < uint8 * 0.8, "int8-block {int8} uint8 {uint8}");
    assert!(bf16 < int8, "bf16 {bf16} int8-block {int8}");
    assert!(Int8Block.encoded_len(n) <= Uint8.encoded_len(n) + n / 50);
    // Steps of absmax / 7 (absmax about 2.9 per block): uniform error, RMS step / sqrt(12).
    assert!(int4 > 0.09 && int4 < 0.15, "int4-block {int4}");
    assert!(int4 > int8 * 10.0 && int4 < int8 * 25.0, "int4-block {int4} int8-block {int8}");
    assert_eq!(2 * Int4Block.encoded_len(n) - Int8Block.encoded_len(n), 4 * n.div_ceil(256));
}

/// reference.md test case 2 for every codec: degenerate input gives the documented result.
#[test]
fn degenerate_input_is_defined_for_every_codec() {
    for kind in CodecKind::ALL {
        let c = kind.codec();
        // Empty.
        let e = encode_over(c, &[], 0);
        assert_eq!(e.len(), c.encoded_len(0));
        let mut nothing: [f32; 0] = [];
        c.decode_accumulate(&e, &mut nothing);
        // All zeros of odd lengths decode to zeros.
        for n in [1usize, 3, 255, 257, 1023, 4097] {
            let d = decode(c, &encode_over(c, &vec![0.0; n], 0), n);
            assert!(d.iter().all(|&v| v == 0.0), "{kind} zeros n {n}");
        }
        // One element of a representable value is exact.
        for v in [1.0f32, -0.5, 0.25, -3.0] {
            assert_eq!(decode(c, &encode_over(c, &[v], 0), 1), vec![v], "{kind} {v}");
        }
        // NaN/inf: the 8-bit codecs always decode to finite values, the float codecs keep them.
        let x = [0.5f32, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.25];
        let d = decode(c, &encode_over(c, &x, 0), x.len());
        match kind {
            CodecKind::Uint8
            | CodecKind::Int8Block
            | CodecKind::Int4Block
            | CodecKind::Sparse(_) => {
                assert!(d.iter().all(|v| v.is_finite()), "{kind} {d:?}")
            }
            CodecKind::Fp32 | CodecKind::Fp16 | CodecKind::Bf16 => {
                assert!(d[1].is_nan(), "{kind}");
                assert_eq!(&d[2..4], &[f32::INFINITY, f32::NEG_INFINITY], "{kind}");
                assert_eq!(d[0], 0.5);
            }
        }
    }
}

/// Finite values of any magnitude the codec can represent.
fn finite_values(max_len: usize) -> impl Strategy<Value = Vec<f32>> {
    let scaled = (-1.0f32..1.0, -45i32..39).prop_map(|(m, e)| m * 10f32.powi(e));
    let any = prop::num::f32::NORMAL | prop::num::f32::SUBNORMAL | prop::num::f32::ZERO;
    prop::collection::vec(prop_oneof![4 => scaled, 1 => any, 1 => Just(0.0f32)], 0..max_len)
}

/// Largest magnitude each codec maps to a finite value.
fn finite_range(kind: CodecKind) -> f32 {
    match kind {
        CodecKind::Fp16 => 65504.0,
        CodecKind::Bf16 => f32::from_bits(0x7f7f_7fff),
        _ => f32::MAX,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Encode never panics, writes exactly `encoded_len` bytes whatever was in the buffer, and a
    /// finite input in the codec's range decodes to finite values.
    #[test]
    fn encode_is_total_and_decode_finite(x in finite_values(5000)) {
        for kind in CodecKind::ALL {
            let c = kind.codec();
            let e = encode_over(c, &x, 0xa5);
            prop_assert_eq!(e.len(), c.encoded_len(x.len()));
            prop_assert_eq!(&e, &encode_over(c, &x, 0x5a));
            let d = decode(c, &e, x.len());
            let range = finite_range(kind);
            for (a, b) in x.iter().zip(&d) {
                if a.abs() <= range {
                    prop_assert!(b.is_finite(), "{} {:e} -> {:e}", kind, a, b);
                }
            }
            // What a node encodes from values in range passes its peers' check.
            if x.iter().all(|a| a.abs() <= range) {
                prop_assert_eq!(c.check(&e), Ok(()), "{}", kind);
            }
        }
    }

    /// Int8Block: every value is within half its block's scale (plus f32 rounding).
    #[test]
    fn int8_block_error_is_at_most_half_a_step(x in finite_values(5000)) {
        let e = encode_over(&Int8Block, &x, 0);
        let d = decode(&Int8Block, &e, x.len());
        for (b, (xs, ds)) in x.chunks(256).zip(d.chunks(256)).enumerate() {
            let h = &e[b * 260..b * 260 + 4];
            let scale = f32::from_le_bytes([h[0], h[1], h[2], h[3]]);
            let absmax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            prop_assert!((scale - absmax / 127.0).abs() <= scale * 1e-6);
            // f64: the bound itself must not round.
            let bound = f64::from(scale) * (0.5 + 1e-4) + 128.0 * 2f64.powi(-150);
            for (a, r) in xs.iter().zip(ds) {
                let err = (f64::from(*a) - f64::from(*r)).abs();
                prop_assert!(err <= bound, "block {} {:e} -> {:e}, scale {:e}", b, a, r, scale);
            }
        }
    }

    /// Int4Block: the scale is absmax / 7 and every value is within half of it, absmax / 14
    /// (plus f32 rounding).
    #[test]
    fn int4_block_error_is_at_most_half_a_step(x in finite_values(5000)) {
        let e = encode_over(&Int4Block, &x, 0);
        let d = decode(&Int4Block, &e, x.len());
        for (b, (xs, ds)) in x.chunks(256).zip(d.chunks(256)).enumerate() {
            let h = &e[b * 132..b * 132 + 4];
            let scale = f32::from_le_bytes([h[0], h[1], h[2], h[3]]);
            let absmax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            prop_assert!((scale - absmax / 7.0).abs() <= scale * 1e-6);
            // f64: the bound itself must not round.
            let bound = f64::from(absmax) / 14.0 + f64::from(scale) * 1e-6 + 8.0 * 2f64.powi(-150);
            for (a, r) in xs.iter().zip(ds) {
                let err = (f64::from(*a) - f64::from(*r)).abs();
                prop_assert!(err <= bound, "block {} {:e} -> {:e}, scale {:e}", b, a, r, scale);
            }
        }
    }

    /// Decoding arbitrary bytes (corrupt or hostile input) never panics.
    #[test]
    fn decode_of_arbitrary_bytes_never_panics(n in 0usize..2000, seed in any::<u64>()) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        for kind in CodecKind::ALL {
            let c = kind.codec();
            let bytes: Vec<u8> = (0..c.encoded_len(n)).map(|_| rng.random()).collect();
            let mut d = vec![0.0f32; n];
            c.decode_accumulate(&bytes, &mut d);
            c.decode(&bytes, &mut d);
        }
    }

    /// Bytes that pass the check decode to finite values, whatever they are; for the float
    /// codecs, which send values as they are, bytes that fail it decode to a value that is not
    /// finite at the index named.
    #[test]
    fn checked_bytes_decode_to_finite_values(n in 0usize..700, seed in any::<u64>()) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        for kind in CodecKind::ALL {
            let c = kind.codec();
            let mut bytes: Vec<u8> = (0..c.encoded_len(n)).map(|_| rng.random()).collect();
            if rng.random_bool(0.5) {
                // Mostly good bytes: an encoding of values with one byte flipped.
                let x: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect();
                c.encode(&x, &mut bytes);
                if let Some(b) = (!bytes.is_empty()).then(|| rng.random_range(0..bytes.len())) {
                    bytes[b] ^= 1 << rng.random_range(0..8);
                }
            }
            let d = decode(c, &bytes, n);
            match c.check(&bytes) {
                Ok(()) => prop_assert!(d.iter().all(|v| v.is_finite()), "{} passed {:?}", kind, d),
                Err(e) => if matches!(kind, CodecKind::Fp32 | CodecKind::Fp16 | CodecKind::Bf16) {
                    prop_assert_eq!(e.what, "value");
                    prop_assert!(!d[e.index].is_finite(), "{} {}", kind, e);
                    prop_assert!(d[..e.index].iter().all(|v| v.is_finite()), "{} {}", kind, e);
                }
            }
        }
    }
}

/// A scale or a table entry that is not finite is refused and named, as is a scale no encoder
/// writes (negative, or one whose largest code would overflow); values are named by index.
#[test]
fn the_check_names_what_is_not_finite() {
    let x: Vec<f32> = (0..600).map(|i| (i as f32 - 300.0) / 300.0).collect();
    let cases: [(CodecKind, usize, f32, &str, usize); 8] = [
        (CodecKind::Int8Block, 260, f32::NAN, "block scale", 1),
        (CodecKind::Int8Block, 0, -1.0, "block scale", 0),
        (CodecKind::Int8Block, 520, f32::MAX, "block scale", 2),
        (CodecKind::Int4Block, 132, f32::INFINITY, "block scale", 1),
        (CodecKind::Uint8, 4 * 17, f32::NAN, "table entry", 17),
        (CodecKind::Fp32, 4 * 599, f32::NEG_INFINITY, "value", 599),
        (CodecKind::Fp16, 2 * 5, f32::NAN, "value", 5),
        (CodecKind::Bf16, 2 * 7, f32::INFINITY, "value", 7),
    ];
    for (kind, at, bad, what, index) in cases {
        let c = kind.codec();
        let mut e = encode_over(c, &x, 0);
        assert_eq!(c.check(&e), Ok(()), "{kind}");
        match kind {
            CodecKind::Fp16 => {
                e[at..at + 2].copy_from_slice(&half::f16::from_f32(bad).to_le_bytes())
            }
            CodecKind::Bf16 => {
                e[at..at + 2].copy_from_slice(&half::bf16::from_f32(bad).to_le_bytes())
            }
            _ => e[at..at + 4].copy_from_slice(&bad.to_le_bytes()),
        }
        let got = c.check(&e).expect_err("refused");
        assert_eq!((got.what, got.index), (what, index), "{kind}: {got}");
        assert!(got.value.is_nan() && bad.is_nan() || got.value == bad, "{kind}: {got}");
    }
}

/// The fused reduce steps give the bytes (and values) of the separate passes they replace, for
/// every codec, weight and weight sum, at lengths around the statistics block and the streaming
/// threshold, and at every alignment of the values.
#[test]
fn fused_reduce_steps_equal_the_separate_passes_for_every_codec() {
    let big = (1 << 15) + 1029;
    for n in [1usize, 17, 1023, 1024, 1025, 5000, big] {
        let own: Vec<f32> = (0..n + 7).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let other: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
        for kind in CodecKind::ALL {
            let c = kind.codec();
            let mut src = vec![0u8; c.encoded_len(n)];
            c.encode(&other, &mut src);
            for (w, offset) in [(0.0f32, 0usize), (1.0, 1), (0.5, 3), (1.0, 7)] {
                let own = &own[offset..offset + n];
                // Middle hop: encode(weigh(own) + decode(src)).
                let mut acc: Vec<f32> =
                    own.iter().map(|o| if w == 0.0 { 0.0 } else { w * o }).collect();
                c.decode_accumulate(&src, &mut acc);
                let mut want = vec![0u8; src.len()];
                c.encode(&acc, &mut want);
                let mut got = vec![0xa5u8; src.len()];
                let mut scratch = vec![f32::NAN; n + 3];
                c.reduce_encode(&src, own, w, &mut scratch, &mut got);
                assert_eq!(got, want, "{kind} n {n} weight {w}");
                // Owner: the average, its bytes, and the decoded bytes as the values.
                for ws in [0.0f64, 1.0, 3.0] {
                    let avg: Vec<f32> = if ws > 0.0 {
                        acc.iter().map(|a| a / ws as f32).collect()
                    } else {
                        vec![0.0; n]
                    };
                    let mut want = vec![0u8; src.len()];
                    c.encode(&avg, &mut want);
                    let mut want_values = vec![0.0f32; n];
                    c.decode(&want, &mut want_values);
                    let mut got = vec![0x5au8; src.len()];
                    let mut values = own.to_vec();
                    c.reduce_average(&src, &mut values, w, ws, &mut scratch, &mut got);
                    assert_eq!(got, want, "{kind} n {n} weight {w} sum {ws}");
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&values), bits(&want_values), "{kind} n {n} w {w} sum {ws}");
                }
            }
        }
    }
}

/// Decoding into outputs long enough for streaming stores, at every alignment, gives the bits of
/// the ordinary loop, which `decode_accumulate` into zeros runs.
#[test]
fn large_decodes_equal_accumulation_into_zeros() {
    let n = (1 << 15) + 100;
    let x = normal(n, 5);
    for kind in CodecKind::ALL {
        let c = kind.codec();
        let mut e = vec![0u8; c.encoded_len(n)];
        c.encode(&x, &mut e);
        let mut want = vec![0.0f32; n];
        c.decode_accumulate(&e, &mut want);
        let mut buf = vec![f32::NAN; n + 8];
        for offset in 0..8 {
            let dst = &mut buf[offset..offset + n];
            c.decode(&e, dst);
            for (i, (a, b)) in dst.iter().zip(&want).enumerate() {
                // 0 + v is v, except that -0 becomes +0.
                assert!(a.to_bits() == b.to_bits() || *a == 0.0 && *b == 0.0, "{kind} {i}");
            }
        }
    }
}

/// int4-block on N(0,1) at the lengths the brief names: each value within absmax / 14 of its
/// block, and the final partial block and odd count handled (the last byte's high nibble 0).
#[test]
fn int4_block_round_trip_is_within_half_a_step() {
    for n in [1usize, 2, 3, 255, 256, 257, 511, 513, 4097] {
        let x = normal(n, 40 + n as u64);
        let e = encode_over(&Int4Block, &x, 0xff);
        assert_eq!(e.len(), Int4Block.encoded_len(n));
        let d = decode(&Int4Block, &e, n);
        for (xs, ds) in x.chunks(256).zip(d.chunks(256)) {
            let absmax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            for (a, r) in xs.iter().zip(ds) {
                let err = f64::from((a - r).abs());
                assert!(err <= f64::from(absmax) / 14.0 * (1.0 + 1e-5), "n {n} {a} -> {r}");
            }
        }
        if n % 2 == 1 {
            assert_eq!(e[e.len() - 1] >> 4, 0, "n {n}: high nibble of the last byte");
        }
    }
}

/// int4-block's degenerate input: zeros are scale 0 and codes 0; NaN decodes to 0 and +-inf to
/// +-absmax of the block's finite values; nothing finite decodes to zeros.
#[test]
fn int4_block_zeros_and_non_finite_values() {
    for n in [1usize, 255, 256, 257, 513] {
        let e = encode_over(&Int4Block, &vec![0.0; n], 0xff);
        assert!(e.iter().all(|&b| b == 0), "n {n}");
        assert!(decode(&Int4Block, &e, n).iter().all(|&v| v == 0.0), "n {n}");
    }
    let x = [0.5f32, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.25, 1.75];
    let d = decode(&Int4Block, &encode_over(&Int4Block, &x, 0), x.len());
    assert!(d.iter().all(|v| v.is_finite()), "{d:?}");
    assert_eq!(d[1], 0.0);
    assert!(
        (d[2] - 1.75).abs() <= 1.75 * f32::EPSILON && (d[3] + 1.75).abs() <= 1.75 * f32::EPSILON
    );
    for x in [[f32::NAN; 3], [f32::INFINITY, f32::NEG_INFINITY, f32::NAN]] {
        let e = encode_over(&Int4Block, &x, 0xff);
        assert_eq!(&e[..4], &[0; 4], "scale 0");
        assert!(decode(&Int4Block, &e, 3).iter().all(|&v| v == 0.0));
    }
}

/// int4-block's decode_accumulate adds the decoded values to what was there.
#[test]
fn int4_block_decode_accumulate_adds() {
    let x = normal(1000, 9);
    let e = encode_over(&Int4Block, &x, 0);
    let d = decode(&Int4Block, &e, x.len());
    let mut acc = vec![1.5f32; x.len()];
    Int4Block.decode_accumulate(&e, &mut acc);
    Int4Block.decode_accumulate(&e, &mut acc);
    for i in 0..x.len() {
        assert_eq!(acc[i], 1.5 + d[i] + d[i], "i {i}");
    }
}

#[test]
fn values_in_inverts_the_encoded_length() {
    for kind in CodecKind::ALL {
        for n in [0u64, 1, 2, 3, 255, 256, 257, 1000, 1 << 20, (1 << 20) + 7] {
            let bytes = kind.codec().encoded_len(n as usize) as u64;
            let got = kind.values_in(bytes);
            let fits = kind.codec().encoded_len(got as usize) as u64 == bytes;
            if kind.sums_in_ring() {
                assert!(
                    fits && (got == n || got + 1 == n),
                    "{kind}: {n} values in {bytes} bytes, got {got}"
                );
            } else {
                // A sparse chunk of `keep` values or more weighs what a whole one does: the
                // most values that fit, whole chunks for whole chunks.
                assert!(fits && got >= n, "{kind}: {n} values in {bytes} bytes, got {got}");
                if n % 4096 == 0 {
                    assert_eq!(got, n, "{kind}: whole chunks");
                }
            }
        }
    }
}

/// The sparse codec keeps the `keep` largest magnitudes of each chunk (ties to the lower index),
/// each decoded within half a level of its value, and nothing else.
#[test]
fn sparse_keeps_the_largest_values_of_each_chunk() {
    for bits in [2u8, 4] {
        let spec = SparseSpec { chunk: 256, keep: 8, bits };
        let c = CodecKind::Sparse(spec).codec();
        for n in [256usize, 1000, 7] {
            let x = normal(n, 7 + n as u64);
            let d = decode(c, &encode_over(c, &x, 0x33), n);
            for (start, xs) in x.chunks(256).enumerate().map(|(k, xs)| (k * 256, xs)) {
                let mut order: Vec<usize> = (0..xs.len()).collect();
                order.sort_by(|&a, &b| xs[b].abs().total_cmp(&xs[a].abs()).then(a.cmp(&b)));
                let kept: Vec<usize> = order[..xs.len().min(8)].to_vec();
                let lo = kept.iter().map(|&i| xs[i].abs()).fold(f32::INFINITY, f32::min);
                let hi = kept.iter().map(|&i| xs[i].abs()).fold(0.0, f32::max);
                let half = (hi - lo) / ((1u32 << (bits - 1)) - 1) as f32 / 2.0;
                for i in 0..xs.len() {
                    let got = d[start + i];
                    if kept.contains(&i) {
                        assert_eq!(got.signum(), xs[i].signum(), "bits {bits} n {n} i {i}");
                        assert!((got - xs[i]).abs() <= half * 1.0001 + 1e-6, "{got} {}", xs[i]);
                    } else {
                        assert_eq!(got, 0.0, "bits {bits} n {n}: {i} not kept");
                    }
                }
            }
        }
    }
    // Ties go to the lower index, so an encoding is the same wherever it is made.
    let spec = SparseSpec { chunk: 256, keep: 3, bits: 2 };
    let c = CodecKind::Sparse(spec).codec();
    let mut x = vec![1.0f32; 256];
    x[200] = -2.0;
    let d = decode(c, &encode_over(c, &x, 0), 256);
    let nonzero: Vec<usize> = (0..256).filter(|&i| d[i] != 0.0).collect();
    assert_eq!(nonzero, vec![0, 1, 200]);
    assert!(d[200] < 0.0);
}

/// The default sparse codec weighs at least 50 times less than `uint8` (the bytes a node
/// contributes per outer step), and the check refuses what `encode` never writes.
#[test]
fn sparse_is_fifty_times_smaller_than_uint8_and_checked() {
    let n = 1 << 24;
    let sparse = CodecKind::Sparse(SparseSpec::default()).codec().encoded_len(n) as f64;
    let uint8 = CodecKind::Uint8.codec().encoded_len(n) as f64;
    assert!(uint8 / sparse >= 50.0, "uint8 / sparse = {}", uint8 / sparse);
    let spec = SparseSpec { chunk: 256, keep: 4, bits: 2 };
    let c = CodecKind::Sparse(spec).codec();
    let x = normal(512, 3);
    let e = encode_over(c, &x, 0);
    assert_eq!(c.check(&e), Ok(()));
    // A NaN scale, a negative one, lo above hi.
    for (at, v) in [(0usize, f32::NAN), (0, -1.0), (4, f32::INFINITY)] {
        let mut bad = e.clone();
        bad[at..at + 4].copy_from_slice(&v.to_le_bytes());
        assert!(c.check(&bad).is_err(), "scale {v} at {at}");
    }
    // Indices not increasing: the second entry's index set to the first's.
    let mut bad = e.clone();
    let w = 8 + 2; // idx bits + value bits
    let first = u32::from(bad[8]) | (u32::from(bad[9]) << 8);
    let idx0 = first & 0xff;
    // Entry 1 starts at bit 10: its index bits are bits 10..18 of the stream.
    let mut word = u32::from_le_bytes([bad[8], bad[9], bad[10], bad[11]]);
    word = (word & !(0xff << w)) | (idx0 << w);
    bad[8..12].copy_from_slice(&word.to_le_bytes());
    assert_eq!(c.check(&bad).map_err(|e| e.what), Err("chunk index"));
    // Parameters out of range are refused by name.
    assert!("sparse:1:4:256".parse::<CodecKind>().is_err());
    assert!("sparse:2:4:100".parse::<CodecKind>().is_err());
    assert_eq!(
        "sparse:4:8:512".parse::<CodecKind>(),
        Ok(CodecKind::Sparse(SparseSpec { chunk: 512, keep: 8, bits: 4 }))
    );
    assert_eq!(CodecKind::Sparse(SparseSpec::default()).to_string(), "sparse");
}
