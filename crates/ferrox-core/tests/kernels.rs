//! Dot-product kernels, in the spirit of llama.cpp's test-backend-ops:
//! - every SIMD kernel agrees with the scalar reference on random and extreme data;
//! - the scalar reference agrees with dequantize-then-dot in f64;
//! - `matmul` is bit-identical to `matvec` per token, and neither depends on the number
//!   of threads.
//!
//! Tolerances. The integer part of every kernel is exact, so SIMD and scalar differ only
//! in the order of the float operations that scale and add the per-block sums. Each of
//! those roundings is at most half an ulp of a partial sum, and a partial sum never
//! exceeds `M = Σ|x_i|·(|w_i| + |min_i|)` (the magnitudes of both the scaled codes and the
//! subtracted minimums of affine formats), so with `B` blocks (at most `B` sequential
//! additions plus a few per block and in the final reductions) the two results are within
//! `(B + 16)·ε·M` of each other, ε = 2⁻²³. For 8 blocks that is about 3e-6·M.

use ferrox_core::kernels::{self, Isa};
use ferrox_core::packed::PackedMatrix;
use ferrox_core::{
    can_quantize, dequantize_row, quantize_row, row_byte_len, GgmlType, WeightMatrix,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const ALL_TYPES: [GgmlType; 28] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Bf16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Iq4Nl,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::Iq4Xs,
    GgmlType::Mxfp4,
    GgmlType::Tq2_0,
    GgmlType::Tq1_0,
    GgmlType::Nvfp4,
    GgmlType::Q1_0,
    GgmlType::Q2_0,
    GgmlType::Iq3Xxs,
    GgmlType::Iq3S,
    GgmlType::Iq1S,
    GgmlType::Iq1M,
    GgmlType::Iq2Xxs,
    GgmlType::Iq2Xs,
    GgmlType::Iq2S,
];

fn block_size(ty: GgmlType) -> usize {
    ty.block_size().unwrap() as usize
}

fn block_bytes(ty: GgmlType) -> usize {
    ty.block_bytes().unwrap() as usize
}

/// Roughly Gaussian values at a random overall magnitude, with occasional outliers and
/// runs of exact zeros.
fn random_values(rng: &mut StdRng, n: usize) -> Vec<f32> {
    let magnitude = 10f32.powf(rng.random_range(-3.0..3.0));
    let mut values: Vec<f32> = (0..n)
        .map(|_| {
            let u: f32 = rng.random_range(f32::EPSILON..1.0);
            let v: f32 = rng.random();
            let outlier = if rng.random_range(0..50) == 0 {
                30.0
            } else {
                1.0
            };
            outlier * magnitude * (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
        })
        .collect();
    if n >= 64 && rng.random_range(0..4) == 0 {
        let start = rng.random_range(0..n - 32) / 32 * 32;
        values[start..start + 32].fill(0.0);
    }
    values
}

/// Byte offsets of the f16 scales in one block of a quantized type.
fn f16_fields(ty: GgmlType) -> &'static [usize] {
    use GgmlType as T;
    match ty {
        T::Q4_1 | T::Q5_1 | T::Q4K | T::Q5K => &[0, 2],
        T::Q2K => &[80, 82],
        T::Q3K => &[108],
        T::Q6K => &[208],
        T::Tq2_0 => &[64],
        T::Tq1_0 => &[52],
        T::Nvfp4 => &[],
        T::Iq1M => &[], // spread over its scale words: see `set_iq1_m_scale`
        _ => &[0],
    }
}

/// IQ1_M's f16 d: one nibble in the top of each of the four u16 scale words at 48..56.
fn set_iq1_m_scale(ty: GgmlType, block: &mut [u8], scale: half::f16) {
    if ty != GgmlType::Iq1M {
        return;
    }
    let bits = scale.to_bits();
    for k in 0..4 {
        let at = 48 + 2 * k + 1;
        block[at] = (block[at] & 0x0F) | ((((bits >> (4 * k)) & 0xF) as u8) << 4);
    }
}

/// Byte ranges of the codes (not scales) of the formats that subtract a minimum. TQ1_0 and
/// TQ2_0 count among them: their kernels multiply the codes 0..2 and subtract the
/// activations' sums once (a minimum of −d), so their partial sums are as large as an
/// affine format's.
fn affine_code_bytes(ty: GgmlType) -> Option<std::ops::Range<usize>> {
    use GgmlType as T;
    match ty {
        T::Tq2_0 => Some(0..64),
        T::Tq1_0 => Some(0..52),
        T::Q4_1 => Some(4..20),
        T::Q5_1 => Some(4..24),
        T::Q2K => Some(16..80),
        T::Q4K => Some(16..144),
        T::Q5K => Some(16..176),
        _ => None,
    }
}

/// One weight row of `cols` values: either quantized from random values, or (for
/// quantized types) uniformly random bytes with sane f16 scales, which reaches every code
/// pattern, including ones the quantizers never produce.
fn weight_row(rng: &mut StdRng, ty: GgmlType, cols: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; row_byte_len(ty, cols).unwrap()];
    let float_type = block_size(ty) == 1;
    // Formats we cannot encode (the i-quants need an importance matrix) get random bytes.
    if float_type || (can_quantize(ty) && rng.random_range(0..2) == 0) {
        quantize_row(ty, &random_values(rng, cols), &mut bytes).unwrap();
        return bytes;
    }
    rng.fill(&mut bytes[..]);
    for block in bytes.chunks_exact_mut(block_bytes(ty)) {
        if ty == GgmlType::Mxfp4 {
            // A power-of-two scale between 2^-12 and 2^0 (E8M0, halved as ggml does).
            block[0] = rng.random_range(116..=128);
            continue;
        }
        if ty == GgmlType::Nvfp4 {
            // E4M3 sub-block scales from 2^-9 (subnormal) to 2^0.
            block[..4]
                .iter_mut()
                .for_each(|b| *b = rng.random_range(0..0x40));
            continue;
        }
        for &at in f16_fields(ty) {
            let scale = half::f16::from_f32(rng.random_range(-2.0f32..2.0) * 1e-2);
            block[at..at + 2].copy_from_slice(&scale.to_le_bytes());
        }
        if ty == GgmlType::Iq1M {
            set_iq1_m_scale(
                ty,
                block,
                half::f16::from_f32(rng.random_range(-2.0f32..2.0) * 1e-2),
            );
        }
    }
    bytes
}

fn dot_type(ty: GgmlType) -> GgmlType {
    kernels::vec_dot_type(ty).unwrap()
}

fn quantized_activation(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let dot_ty = dot_type(ty);
    let mut xq = vec![0u8; row_byte_len(dot_ty, x.len()).unwrap()];
    kernels::quantize_activation(dot_ty, x, &mut xq).unwrap();
    xq
}

fn dequantized(ty: GgmlType, bytes: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    dequantize_row(ty, bytes, &mut out).unwrap();
    out
}

/// The per-value minimum an affine format subtracts (decode with all codes zero).
fn minimums(ty: GgmlType, w: &[u8], n: usize) -> Vec<f32> {
    let Some(codes) = affine_code_bytes(ty) else {
        return vec![0.0; n];
    };
    let mut zeroed = w.to_vec();
    for block in zeroed.chunks_exact_mut(block_bytes(ty)) {
        block[codes.clone()].fill(0);
    }
    dequantized(ty, &zeroed, n)
}

/// `M = Σ|x_i|·(|w_i| + |min_i|)`, the magnitude bound of every partial sum.
fn magnitude(ty: GgmlType, w: &[u8], xq: &[u8], n: usize) -> f64 {
    let wd = dequantized(ty, w, n);
    let mins = minimums(ty, w, n);
    let xd = dequantized(dot_type(ty), xq, n);
    (0..n)
        .map(|i| f64::from(xd[i].abs()) * (f64::from(wd[i].abs()) + f64::from(mins[i].abs())))
        .sum()
}

fn blocks_of(ty: GgmlType, cols: usize) -> usize {
    cols.div_ceil(block_size(ty).max(32))
}

fn column_choices(ty: GgmlType) -> Vec<usize> {
    match block_size(ty) {
        1 => vec![1, 7, 31, 32, 33, 64, 100, 255, 256, 257],
        b => (1..=8).map(|k| k * b).collect(),
    }
}

/// Random weights and activations for each type and width, `rows` rows at a time.
fn for_each_case(seed: u64, rows: usize, mut check: impl FnMut(GgmlType, usize, &[u8], &[f32])) {
    let mut rng = StdRng::seed_from_u64(seed);
    for ty in ALL_TYPES {
        for cols in column_choices(ty) {
            for _ in 0..rows {
                let w = weight_row(&mut rng, ty, cols);
                let x = random_values(&mut rng, cols);
                check(ty, cols, &w, &x);
            }
        }
    }
}

#[test]
fn every_type_has_a_scalar_kernel() {
    for ty in ALL_TYPES {
        assert!(kernels::has_kernel(ty, Isa::Scalar), "{ty}");
    }
}

/// The types whose SIMD kernels give the scalar reference's bits.
const IQ_TYPES: [GgmlType; 7] = [
    GgmlType::Iq1S,
    GgmlType::Iq1M,
    GgmlType::Iq2Xxs,
    GgmlType::Iq2Xs,
    GgmlType::Iq2S,
    GgmlType::Iq3Xxs,
    GgmlType::Iq3S,
];

/// The SIMD instruction sets, each tested where the machine has it.
const SIMD_ISAS: [Isa; 2] = [Isa::Avx2, Isa::Avx512Vnni];

#[test]
fn simd_kernels_match_the_scalar_reference() {
    for isa in SIMD_ISAS {
        if !isa.is_available() {
            eprintln!("skipped {isa:?}: this machine lacks it");
            continue;
        }
        let mut worst = 0.0f64;
        let mut compared = 0;
        for_each_case(0xD07, 7, |ty, cols, w, x| {
            if !kernels::has_kernel(ty, isa) {
                return;
            }
            let xq = quantized_activation(ty, x);
            let simd = kernels::vec_dot_with(isa, ty, w, &xq).unwrap();
            let scalar = kernels::vec_dot_with(Isa::Scalar, ty, w, &xq).unwrap();
            let m = magnitude(ty, w, &xq, cols);
            let bound = (blocks_of(ty, cols) + 16) as f64 * f64::from(f32::EPSILON) * m + 1e-30;
            let err = (f64::from(simd) - f64::from(scalar)).abs();
            assert!(
                err <= bound,
                "{isa:?} {ty} {cols} cols: simd {simd} vs scalar {scalar} (|Δ| {err:e} > {bound:e})"
            );
            // The i-quants' kernels all compute their integer form's one arithmetic.
            if IQ_TYPES.contains(&ty) {
                assert_eq!(simd.to_bits(), scalar.to_bits(), "{isa:?} {ty} {cols} cols");
            }
            if m > 0.0 {
                worst = worst.max(err / m);
            }
            compared += 1;
        });
        eprintln!("{isa:?}: {compared} rows compared; worst |simd − scalar| / M = {worst:e}");
    }
    if Isa::Avx2.is_available() {
        for ty in ALL_TYPES {
            assert!(
                kernels::has_kernel(ty, Isa::Avx2),
                "{ty} has no AVX2 kernel"
            );
        }
    }
}

/// The AVX-512 VNNI kernels compute the AVX2 kernels' integer lane sums with other
/// instructions and then the very same float operations, so their results are the AVX2
/// results (ggml's, see tests/dot_fixtures.rs) bit for bit, on random and extreme blocks.
#[test]
fn avx512_kernels_are_bit_identical_to_avx2() {
    let isa = Isa::Avx512Vnni;
    if !isa.is_available() {
        eprintln!("skipped: this machine has no AVX-512 VNNI");
        return;
    }
    let mut compared = 0;
    let mut check = |ty: GgmlType, w: &[u8], xq: &[u8]| {
        let wide = kernels::vec_dot_with(isa, ty, w, xq).unwrap();
        let avx2 = kernels::vec_dot_with(Isa::Avx2, ty, w, xq).unwrap();
        assert_eq!(
            wide.to_bits(),
            avx2.to_bits(),
            "{ty}: {wide} vs AVX2 {avx2}"
        );
        compared += 1;
    };
    for_each_case(0xA512, 9, |ty, _, w, x| {
        if kernels::has_kernel(ty, isa) {
            check(ty, w, &quantized_activation(ty, x));
        }
    });
    for ty in ALL_TYPES
        .into_iter()
        .filter(|&ty| kernels::has_kernel(ty, isa))
    {
        let cols = 4 * block_size(ty).max(32);
        for fill in [0x00u8, 0xFF, 0x80, 0x7F, 0x88, 0x11] {
            let mut w = vec![fill; row_byte_len(ty, cols).unwrap()];
            for block in w.chunks_exact_mut(block_bytes(ty)) {
                for &at in f16_fields(ty) {
                    block[at..at + 2].copy_from_slice(&half::f16::MAX.to_le_bytes());
                }
                set_iq1_m_scale(ty, block, half::f16::MAX);
            }
            for sign in [1e3f32, -1e3] {
                let x: Vec<f32> = (0..cols)
                    .map(|i| if i % 3 == 0 { -sign } else { sign })
                    .collect();
                check(ty, &w, &quantized_activation(ty, &x));
            }
        }
    }
    assert!(compared > 0);
    eprintln!("{compared} rows bit-identical");
}

/// Every kernel's panels (tiles of rows against eight, four or one token) give exactly
/// the bits of that kernel's single dot product, for every row of the panel, including
/// the rows of a partly filled last tile.
#[test]
fn panels_are_bit_identical_to_single_dots() {
    let mut rng = StdRng::seed_from_u64(0x9A4E);
    for isa in Isa::ALL {
        if !isa.is_available() {
            continue;
        }
        for ty in ALL_TYPES
            .into_iter()
            .filter(|&ty| kernels::has_kernel(ty, isa))
        {
            let narrow = 2 * block_size(ty).max(32) + if block_size(ty) == 1 { 3 } else { 0 };
            // Over 128 blocks per row: the AVX-512 panels then skip preparing activations.
            let wide = 130 * block_size(ty).max(32);
            let shapes = [
                (1, 1, narrow),
                (2, 3, narrow),
                (3, 9, narrow),
                (5, 8, narrow),
                (6, 12, narrow),
                (7, 13, narrow),
                (9, 4, narrow),
                (9, 9, wide),
            ];
            for (rows, tokens, cols) in shapes {
                let m = TestMatrix::random(&mut rng, ty, rows, cols);
                let xqs: Vec<Vec<u8>> = (0..tokens)
                    .map(|_| quantized_activation(ty, &random_values(&mut rng, cols)))
                    .collect();
                let xs: Vec<&[u8]> = xqs.iter().map(Vec::as_slice).collect();
                let row_bytes = m.bytes.len() / rows;
                let mut out = vec![f32::NAN; rows * tokens];
                kernels::panel_dot_with(isa, ty, &m.bytes, row_bytes, &xs, &mut out).unwrap();
                for r in 0..rows {
                    let row = &m.bytes[r * row_bytes..(r + 1) * row_bytes];
                    for (t, x) in xs.iter().enumerate() {
                        let want = kernels::vec_dot_with(isa, ty, row, x).unwrap();
                        assert_eq!(
                            out[r * tokens + t].to_bits(),
                            want.to_bits(),
                            "{isa:?} {ty} {rows}x{cols}: row {r}, token {t} of {tokens}"
                        );
                    }
                }
            }
        }
    }
}

/// The SIMD activation quantizers write exactly the scalar ones' bytes (which are
/// ggml-cpu's, see tests/dot_fixtures.rs), for random rows and for rows with zeros, ties,
/// repeated maxima of both signs, huge values, infinities and NaNs.
#[test]
fn simd_activation_quantizers_match_the_scalar_ones() {
    let mut rng = StdRng::seed_from_u64(0xAC7);
    let specials = [
        0.0,
        -0.0,
        0.5,
        -0.5,
        2.5,
        -127.0,
        127.0,
        1e30,
        -1e30,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MIN_POSITIVE,
    ];
    for isa in SIMD_ISAS.into_iter().filter(|isa| isa.is_available()) {
        for dot_ty in [GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8K] {
            let n = 4 * block_size(dot_ty);
            for case in 0..400 {
                let mut x = random_values(&mut rng, n);
                match case % 4 {
                    0 => {}
                    1 => {
                        for _ in 0..rng.random_range(1..8) {
                            let at = rng.random_range(0..n);
                            x[at] = specials[rng.random_range(0..specials.len())];
                        }
                    }
                    2 => {
                        // The largest magnitude several times, with both signs.
                        let m = x.iter().fold(0.0f32, |m, v| m.max(v.abs())) * 2.0;
                        for _ in 0..3 {
                            let at = rng.random_range(0..n);
                            x[at] = if rng.random() { m } else { -m };
                        }
                    }
                    _ => {
                        // Small integers: products land on exact halves.
                        for v in &mut x {
                            *v = f32::from(rng.random_range(-8i8..=8)) * 0.5;
                        }
                    }
                }
                let len = row_byte_len(dot_ty, n).unwrap();
                let (mut simd, mut scalar) = (vec![0u8; len], vec![0u8; len]);
                kernels::quantize_activation_with(isa, dot_ty, &x, &mut simd).unwrap();
                kernels::quantize_activation_with(Isa::Scalar, dot_ty, &x, &mut scalar).unwrap();
                assert!(simd == scalar, "{isa:?} {dot_ty} case {case}: bytes differ");
            }
        }
    }
}

/// Saturated codes and scales at both ends: the integer paths must not overflow.
#[test]
fn extreme_blocks_agree() {
    let mut rng = StdRng::seed_from_u64(0xE7);
    for ty in ALL_TYPES {
        let cols = 4 * block_size(ty).max(32);
        for fill in [0x00u8, 0xFF, 0x80, 0x7F, 0x88] {
            let mut w = vec![fill; row_byte_len(ty, cols).unwrap()];
            if block_size(ty) == 1 {
                // Float types: the largest finite values instead of NaN patterns.
                w = weight_row(&mut rng, ty, cols);
            } else {
                for block in w.chunks_exact_mut(block_bytes(ty)) {
                    if ty == GgmlType::Mxfp4 {
                        // As large as f16::MAX (2^16), as a power of two.
                        block[0] = 128 + 16;
                        continue;
                    }
                    if ty == GgmlType::Nvfp4 {
                        // The largest E4M3 scale ggml writes (448).
                        block[..4].fill(0x7E);
                        continue;
                    }
                    for &at in f16_fields(ty) {
                        block[at..at + 2].copy_from_slice(&half::f16::MAX.to_le_bytes());
                    }
                    set_iq1_m_scale(ty, block, half::f16::MAX);
                }
            }
            // Activations at full scale, every code ±127.
            let x: Vec<f32> = (0..cols)
                .map(|i| if i % 3 == 0 { -1e3 } else { 1e3 })
                .collect();
            let xq = quantized_activation(ty, &x);
            let scalar = kernels::vec_dot_with(Isa::Scalar, ty, &w, &xq).unwrap();
            for isa in SIMD_ISAS {
                if !isa.is_available() || !kernels::has_kernel(ty, isa) {
                    continue;
                }
                let simd = kernels::vec_dot_with(isa, ty, &w, &xq).unwrap();
                let m = magnitude(ty, &w, &xq, cols);
                let bound = 32.0 * f64::from(f32::EPSILON) * m;
                let err = (f64::from(simd) - f64::from(scalar)).abs();
                assert!(
                    err <= bound || (simd.is_infinite() && simd == scalar),
                    "{ty} fill {fill:#x}: {simd} vs {scalar}"
                );
            }
        }
    }
}

/// The scalar reference computes exactly Σ dequant(w)·dequant(xq), up to float rounding
/// (and, for Q8_1, the f16 rounding of its stored code sum).
#[test]
fn scalar_reference_matches_dequantized_f64_dot() {
    for_each_case(0xF64, 5, |ty, cols, w, x| {
        let xq = quantized_activation(ty, x);
        let got = kernels::vec_dot_with(Isa::Scalar, ty, w, &xq).unwrap();
        let wd = dequantized(ty, w, cols);
        let xd = dequantized(dot_type(ty), &xq, cols);
        let want: f64 = wd
            .iter()
            .zip(&xd)
            .map(|(a, b)| f64::from(*a) * f64::from(*b))
            .sum();
        let m = magnitude(ty, w, &xq, cols);
        // Q8_1 carries s = d·Σq rounded to f16: error up to 2⁻¹¹ of the minimum term.
        let f16_sum_error = if dot_type(ty) == GgmlType::Q8_1 {
            let mins = minimums(ty, w, cols);
            mins.iter()
                .zip(&xd)
                .map(|(m, x)| f64::from((m * x).abs()))
                .sum::<f64>()
                * 2f64.powi(-10)
        } else {
            0.0
        };
        // Dequantizing rounds each weight to f32 once more than the kernel does.
        let bound =
            (blocks_of(ty, cols) + 16) as f64 * f64::from(f32::EPSILON) * m + f16_sum_error + 1e-30;
        let err = (f64::from(got) - want).abs();
        assert!(
            err <= bound,
            "{ty} {cols} cols: {got} vs {want} (|Δ| {err:e} > {bound:e})"
        );
    });
}

/// Against the unquantized input the error is the activation's quantization error:
/// each value is off by at most half a step d = amax/127 plus the f16 rounding of d
/// (127·2⁻¹¹·d), so |Δ| <= Σ|w_i|·0.57·d_block(i) (Q8_K: d = amax/127 too).
#[test]
fn scalar_reference_is_within_activation_quantization_error() {
    for_each_case(0xACC, 3, |ty, cols, w, x| {
        let xq = quantized_activation(ty, x);
        let got = kernels::vec_dot_with(Isa::Scalar, ty, w, &xq).unwrap();
        let wd = dequantized(ty, w, cols);
        let exact: f64 = wd
            .iter()
            .zip(x)
            .map(|(a, b)| f64::from(*a) * f64::from(*b))
            .sum();
        let dot_block = block_size(dot_type(ty));
        let mut bound = 0.0f64;
        for (wb, xb) in wd.chunks(dot_block).zip(x.chunks(dot_block)) {
            let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let step = if dot_block == 1 {
                // f16/bf16 activations: relative rounding of each value.
                0.0
            } else {
                f64::from(amax) / 127.0
            };
            let rel = match dot_type(ty) {
                GgmlType::F16 => 2f64.powi(-11),
                GgmlType::Bf16 => 2f64.powi(-8),
                _ => 0.0,
            };
            bound += wb
                .iter()
                .zip(xb)
                .map(|(w, x)| f64::from(w.abs()) * (0.57 * step + rel * f64::from(x.abs())))
                .sum::<f64>();
        }
        let m = magnitude(ty, w, &xq, cols);
        bound += (blocks_of(ty, cols) + 16) as f64 * f64::from(f32::EPSILON) * m + 1e-30;
        let err = (f64::from(got) - exact).abs();
        assert!(
            err <= bound,
            "{ty} {cols} cols: {got} vs exact {exact} (|Δ| {err:e} > {bound:e})"
        );
    });
}

struct TestMatrix {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    bytes: Vec<u8>,
}

impl TestMatrix {
    fn random(rng: &mut StdRng, ty: GgmlType, rows: usize, cols: usize) -> Self {
        let bytes = (0..rows).flat_map(|_| weight_row(rng, ty, cols)).collect();
        Self {
            ty,
            rows,
            cols,
            bytes,
        }
    }

    fn view(&self) -> WeightMatrix<'_> {
        WeightMatrix::new(self.ty, self.rows, self.cols, &self.bytes).unwrap()
    }
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

/// `matmul` output for token t, row r, must be the very bits `matvec` gives for token t.
/// (From `INT8_MIN_TOKENS` tokens on, the i-quants go through their int8 form: 37 rows
/// are two whole groups of sixteen and a rest, 64 rows four groups. Below it, the
/// i-quants' leftover tokens take a panel of two or three (2, 3) or a padded panel of eight
/// (5, 6, 7 and 13); on AVX2, from 5 tokens, the int8 form.)
#[test]
fn matmul_is_bit_identical_to_matvec() {
    let mut rng = StdRng::seed_from_u64(0xBA7C);
    const { assert!(ferrox_core::packed::INT8_MIN_TOKENS <= 21) };
    for ty in ALL_TYPES {
        let cols = 3 * block_size(ty).max(32) + if block_size(ty) == 1 { 5 } else { 0 };
        let shapes = [
            (1, 1),
            (5, 3),
            (37, 4),
            (67, 9),
            (130, 13),
            (2100, 6),
            (37, 24),
            (64, 21),
            (19, 5),
            (11, 2),
            (23, 7),
        ];
        for (rows, tokens) in shapes {
            let m = TestMatrix::random(&mut rng, ty, rows, cols);
            let matrix = m.view();
            let x = random_values(&mut rng, tokens * cols);
            let mut xq = Vec::new();
            assert_eq!(matrix.quantize_activation(&x, &mut xq).unwrap(), tokens);
            let mut batched = vec![f32::NAN; tokens * rows];
            matrix.matmul(&xq, tokens, &mut batched).unwrap();
            let act = matrix.activation_row_bytes();
            for t in 0..tokens {
                let mut single = vec![f32::NAN; rows];
                matrix
                    .matvec(&xq[t * act..(t + 1) * act], &mut single)
                    .unwrap();
                assert_eq!(
                    bits(&batched[t * rows..(t + 1) * rows]),
                    bits(&single),
                    "{ty} {rows}x{cols}, token {t} of {tokens}"
                );
                // And matvec is the dispatched kernel, row by row.
                for (r, y) in single.iter().enumerate() {
                    let row = &m.bytes[r * m.bytes.len() / rows..(r + 1) * m.bytes.len() / rows];
                    let want = kernels::vec_dot(ty, row, &xq[t * act..(t + 1) * act]).unwrap();
                    assert_eq!(y.to_bits(), want.to_bits(), "{ty} row {r}");
                }
            }
        }
    }
}

#[test]
fn results_do_not_depend_on_thread_count() {
    let mut rng = StdRng::seed_from_u64(0x7EAD);
    let pools: Vec<_> = [1, 2, 3]
        .iter()
        .map(|&n| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .unwrap()
        })
        .collect();
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::Q4_0,
        GgmlType::Q4K,
        GgmlType::Q6K,
        GgmlType::F32,
        GgmlType::Q5_1,
        GgmlType::Iq2Xxs,
        GgmlType::Iq3S,
        GgmlType::Iq1M,
    ] {
        let cols = 2 * block_size(ty).max(64);
        let (rows, tokens) = (3001, 7);
        let m = TestMatrix::random(&mut rng, ty, rows, cols);
        let matrix = m.view();
        let x = random_values(&mut rng, tokens * cols);
        let mut xq = Vec::new();
        matrix.quantize_activation(&x, &mut xq).unwrap();
        let act = matrix.activation_row_bytes();
        let results: Vec<(Vec<u32>, Vec<u32>)> = pools
            .iter()
            .map(|pool| {
                pool.install(|| {
                    let mut single = vec![0f32; rows];
                    matrix.matvec(&xq[..act], &mut single).unwrap();
                    let mut batched = vec![0f32; rows * tokens];
                    matrix.matmul(&xq, tokens, &mut batched).unwrap();
                    (bits(&single), bits(&batched))
                })
            })
            .collect();
        for (threads, r) in [1, 2, 3].iter().zip(&results) {
            assert_eq!(r, &results[0], "{ty} with {threads} threads");
        }
    }
}

/// Matrices sharing activations, row-major and packed, one token, in one pass over the
/// pool: each output has the bits of that matrix's own product, whatever the thread count
/// (the rows of all parts are claimed in runs that cross from one part to the next).
#[test]
fn matrices_in_one_pass_equal_their_own_products() {
    let mut rng = StdRng::seed_from_u64(0x9A55);
    let cols = 512;
    let shapes = [
        (GgmlType::Iq2Xxs, 2003),
        (GgmlType::Iq3S, 37),
        (GgmlType::Q4K, 1504),
    ];
    let matrices: Vec<TestMatrix> = shapes
        .iter()
        .map(|&(ty, rows)| TestMatrix::random(&mut rng, ty, rows, cols))
        .collect();
    // The Q4_K matrix also packed: K-quant packs take the same Q8_K rows.
    let q4k = &matrices[2];
    let packed = PackedMatrix::pack(q4k.ty, q4k.rows, q4k.cols, &q4k.bytes, |_| {}).unwrap();
    let mut views: Vec<WeightMatrix<'_>> = matrices.iter().map(TestMatrix::view).collect();
    views.push(q4k.view().with_packed(&packed).unwrap());
    let parts: Vec<&WeightMatrix<'_>> = views.iter().collect();
    assert!(parts.iter().all(|p| parts[0].shares_activations(p)));
    let x = random_values(&mut rng, cols);
    let mut xq = Vec::new();
    parts[0].quantize_activation(&x, &mut xq).unwrap();
    let alone: Vec<Vec<u32>> = parts
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let mut y = vec![f32::NAN; m.rows()];
            if i == 3 {
                // The packed layout's own bits (the scalar reference's, as every ISA's).
                packed.matmul_with(Isa::Scalar, &xq, 1, &mut y).unwrap();
            } else {
                for (r, y) in y.iter_mut().enumerate() {
                    *y = kernels::vec_dot(m.ty(), m.row_bytes(r), &xq).unwrap();
                }
            }
            bits(&y)
        })
        .collect();
    for threads in [1, 2, 3] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let mut together: Vec<Vec<f32>> = parts.iter().map(|m| vec![f32::NAN; m.rows()]).collect();
        let mut outs: Vec<&mut [f32]> = together.iter_mut().map(|v| &mut v[..]).collect();
        pool.install(|| WeightMatrix::matmul_many(&parts, &xq, 1, &mut outs))
            .unwrap();
        for (i, (got, want)) in together.iter().zip(&alone).enumerate() {
            assert_eq!(&bits(got), want, "part {i} with {threads} threads");
        }
    }
    // An output of the wrong length is an error, not a write past it.
    let mut short: Vec<Vec<f32>> = parts.iter().map(|m| vec![0.0; m.rows()]).collect();
    short[3].pop();
    let mut outs: Vec<&mut [f32]> = short.iter_mut().map(|v| &mut v[..]).collect();
    assert!(WeightMatrix::matmul_many(&parts, &xq, 1, &mut outs).is_err());
}

#[test]
fn products_reject_bad_lengths() {
    let bytes = vec![0u8; 3 * 34];
    let matrix = WeightMatrix::new(GgmlType::Q8_0, 3, 32, &bytes).unwrap();
    assert_eq!(matrix.vec_dot_type(), GgmlType::Q8_0);
    assert_eq!(matrix.activation_row_bytes(), 34);
    let mut xq = Vec::new();
    assert_eq!(matrix.quantize_activation(&[1.0; 64], &mut xq).unwrap(), 2);
    assert_eq!(xq.len(), 68);
    assert!(matrix.quantize_activation(&[1.0; 40], &mut xq).is_err());
    let mut y = vec![0f32; 6];
    assert!(matrix.matvec(&xq, &mut y[..3]).is_err());
    assert!(matrix.matvec(&xq[..34], &mut y[..2]).is_err());
    assert!(matrix.matmul(&xq, 3, &mut y).is_err());
    assert!(matrix.matmul(&xq, 2, &mut y[..5]).is_err());
    matrix.matmul(&xq, 2, &mut y).unwrap();
    matrix.matmul(&[], 0, &mut []).unwrap();
}
