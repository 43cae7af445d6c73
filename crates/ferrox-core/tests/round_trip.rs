//! Quantize → dequantize on random data stays within each format's expected error, and
//! re-encoding is stable.

use ferrox_core::{can_quantize, dequantize_row, quantize_row, row_byte_len, GgmlType};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Roughly Gaussian values (Box–Muller) at a random overall magnitude per row.
fn random_row(rng: &mut StdRng, n: usize) -> Vec<f32> {
    let magnitude = 10f32.powf(rng.random_range(-3.0..3.0));
    (0..n)
        .map(|_| {
            let u: f32 = rng.random_range(f32::EPSILON..1.0);
            let v: f32 = rng.random();
            magnitude * (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
        })
        .collect()
}

fn round_trip(ty: GgmlType, src: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let mut bytes = vec![0u8; row_byte_len(ty, src.len()).unwrap()];
    quantize_row(ty, src, &mut bytes).unwrap();
    let mut out = vec![0f32; src.len()];
    dequantize_row(ty, &bytes, &mut out).unwrap();
    (bytes, out)
}

fn rms(values: impl Iterator<Item = f32>) -> f32 {
    let (sum, n) = values.fold((0f64, 0usize), |(s, n), v| {
        (s + f64::from(v) * f64::from(v), n + 1)
    });
    (sum / n as f64).sqrt() as f32
}

/// Relative RMS error ceilings for Gaussian data, with margin: on these seeds the worst
/// row reaches 45-75% of each limit.
const RELATIVE_RMS_LIMITS: &[(GgmlType, f32)] = &[
    (GgmlType::F32, 0.0),
    (GgmlType::F16, 0.0005),
    (GgmlType::Bf16, 0.004),
    (GgmlType::Q8_0, 0.01),
    (GgmlType::Q8_1, 0.01),
    (GgmlType::Q8K, 0.01),
    (GgmlType::Q6K, 0.03),
    (GgmlType::Q5_0, 0.08),
    (GgmlType::Q5_1, 0.08),
    (GgmlType::Q5K, 0.05),
    (GgmlType::Q4_0, 0.15),
    (GgmlType::Q4_1, 0.15),
    (GgmlType::Q4K, 0.1),
    (GgmlType::Iq4Nl, 0.12),
    (GgmlType::Iq4Xs, 0.12),
    (GgmlType::Mxfp4, 0.16),
    // Ternary: made for weights trained ternary; Gaussian data keeps only signs and zeros.
    (GgmlType::Tq2_0, 0.9),
    (GgmlType::Tq1_0, 0.95),
    (GgmlType::Nvfp4, 0.16),
    // Signs times the mean magnitude: the Gaussian's best 1-bit fit, about 60% off.
    (GgmlType::Q1_0, 0.8),
    (GgmlType::Q2_0, 0.95),
    (GgmlType::Q3K, 0.25),
    (GgmlType::Q2K, 0.5),
];

#[test]
fn round_trip_error_is_within_format_limits() {
    let mut rng = StdRng::seed_from_u64(7);
    for &(ty, limit) in RELATIVE_RMS_LIMITS {
        assert!(can_quantize(ty), "{ty}");
        for _ in 0..20 {
            let mut src = random_row(&mut rng, 1024);
            if ty == GgmlType::Nvfp4 {
                // Its E4M3 scales span only 2^-10..224 (models pair them with a per-tensor
                // scale): bring the row into that range.
                let r = rms(src.iter().copied());
                src.iter_mut().for_each(|x| *x *= 10.0 / r);
            }
            let (_, out) = round_trip(ty, &src);
            let err = rms(src.iter().zip(&out).map(|(a, b)| a - b));
            let relative = err / rms(src.iter().copied());
            assert!(
                relative <= limit,
                "{ty}: relative RMS error {relative} > {limit}"
            );
        }
    }
}

/// Symmetric 8-bit formats are within half a step of every value, step = block amax / 127.
#[test]
fn eight_bit_formats_are_within_half_a_step() {
    let mut rng = StdRng::seed_from_u64(8);
    for ty in [GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8K] {
        let block = ty.block_size().unwrap() as usize;
        for _ in 0..20 {
            let src = random_row(&mut rng, 1024);
            let (_, out) = round_trip(ty, &src);
            for (xs, ys) in src.chunks(block).zip(out.chunks(block)) {
                let amax = xs.iter().fold(0f32, |m, x| m.max(x.abs()));
                // Q8_0/Q8_1 also round the step to f16: off by up to 2^-11 relative, or 2^-25
                // absolute once it is subnormal, for each of up to 127 steps.
                let step = amax / 127.0;
                let f16_error = (step * 2f32.powi(-11)).max(2f32.powi(-25));
                let bound = (step * 0.5 + 127.0 * f16_error) * 1.001;
                for (x, y) in xs.iter().zip(ys) {
                    assert!((x - y).abs() <= bound, "{ty}: {x} -> {y} (bound {bound})");
                }
            }
        }
    }
}

/// Encoding what a format decoded to changes at most a few codes: the decoded values sit on
/// the format's grid already (exactly so for the float types).
#[test]
fn requantizing_decoded_values_is_stable() {
    let mut rng = StdRng::seed_from_u64(9);
    for ty in [
        GgmlType::F16,
        GgmlType::Bf16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
    ] {
        let src = random_row(&mut rng, 512);
        let (bytes, out) = round_trip(ty, &src);
        let (again, _) = round_trip(ty, &out);
        assert_eq!(bytes, again, "{ty}");
    }
}

/// Non-finite and extreme inputs give garbage codes (as in ggml) but never a panic, even
/// with overflow checks on.
#[test]
fn hostile_floats_do_not_panic() {
    let specials = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        -f32::MAX,
        1e-45,
        0.0,
    ];
    for &(ty, _) in RELATIVE_RMS_LIMITS {
        for (i, &special) in specials.iter().enumerate() {
            let mut src: Vec<f32> = (0..512).map(|j| (j as f32 * 0.37).sin()).collect();
            src.iter_mut().skip(i).step_by(3).for_each(|x| *x = special);
            round_trip(ty, &src);
            round_trip(ty, &vec![special; 512]);
        }
    }
}
