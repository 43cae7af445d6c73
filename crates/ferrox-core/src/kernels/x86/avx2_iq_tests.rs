//! The i-quant AVX2 and AVX-512 kernels against the scalar reference (`kernels/dot_iq.rs`), bit for bit,
//! on blocks and activations built to reach the edges: extreme scales, activation codes of
//! −128 and 127.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{avx2_detected, avx2_iq1, avx2_iq2, avx2_iq3, avx512_iq, avx512_iq_detected};
use crate::quant::iq1::{Iq1M, Iq1S, M_SCALES_AT};
use crate::quant::iq2::{Iq2S, Iq2Xs, Iq2Xxs};
use crate::quant::iq3::{Iq3S, Iq3Xxs};
use crate::quant::kquants::q8_k::{CODES_AT, Q8K, SUMS_AT};
use crate::quant::kquants::QK_K;
use crate::quant::BlockFormat;
use ferrox_gguf::GgmlType;

const Q8K_BYTES: usize = Q8K::BYTES;

/// The scalar reference's result.
fn scalar(ty: GgmlType, w: &[u8], x: &[u8]) -> f32 {
    crate::kernels::vec_dot_with(crate::kernels::Isa::Scalar, ty, w, x).unwrap()
}

struct Type {
    name: &'static str,
    bytes: usize,
    /// Where the block's f16 d lives (`None`: IQ1_M's, spread over its scale words).
    d_at: Option<usize>,
    reference: fn(&[u8], &[u8]) -> f32,
    one: fn(&[u8], [&[u8]; 1]) -> [f32; 1],
    three: fn(&[u8], [&[u8]; 3]) -> [f32; 3],
    four: fn(&[u8], [&[u8]; 4]) -> [f32; 4],
}

macro_rules! kernel {
    ($f:path, $n:literal) => {{
        fn run(w: &[u8], xs: [&[u8]; $n]) -> [f32; $n] {
            // SAFETY: only called after `avx2_detected()` (and, for the AVX-512 kernels,
            // `avx512_iq_detected()`).
            unsafe { $f(w, xs) }
        }
        run
    }};
}

macro_rules! iq_type {
    ($name:literal, $bytes:expr, $d_at:expr, $reference:expr, $kernel:path) => {
        Type {
            name: $name,
            bytes: $bytes,
            d_at: $d_at,
            reference: $reference,
            one: kernel!($kernel, 1),
            three: kernel!($kernel, 3),
            four: kernel!($kernel, 4),
        }
    };
}

fn types() -> [Type; 9] {
    use avx2_iq2::{iq2_dot, Iq2SAvx2, Iq2XsAvx2, Iq2XxsAvx2};
    [
        iq_type!(
            "IQ2_XXS",
            Iq2Xxs::BYTES,
            Some(0),
            |w, x| scalar(GgmlType::Iq2Xxs, w, x),
            iq2_dot::<Iq2XxsAvx2, _>
        ),
        iq_type!(
            "IQ2_XS",
            Iq2Xs::BYTES,
            Some(0),
            |w, x| scalar(GgmlType::Iq2Xs, w, x),
            iq2_dot::<Iq2XsAvx2, _>
        ),
        iq_type!(
            "IQ2_S",
            Iq2S::BYTES,
            Some(0),
            |w, x| scalar(GgmlType::Iq2S, w, x),
            iq2_dot::<Iq2SAvx2, _>
        ),
        iq_type!(
            "IQ3_XXS",
            Iq3Xxs::BYTES,
            Some(0),
            |w, x| scalar(GgmlType::Iq3Xxs, w, x),
            avx2_iq3::iq3_xxs_dot::<false, _>
        ),
        iq_type!(
            "IQ3_S",
            Iq3S::BYTES,
            Some(0),
            |w, x| scalar(GgmlType::Iq3S, w, x),
            avx2_iq3::iq3_s_dot::<false, _>
        ),
        iq_type!(
            "IQ1_S",
            Iq1S::BYTES,
            Some(0),
            |w, x| scalar(GgmlType::Iq1S, w, x),
            avx2_iq1::iq1_s_dot
        ),
        iq_type!(
            "IQ1_M",
            Iq1M::BYTES,
            None,
            |w, x| scalar(GgmlType::Iq1M, w, x),
            avx2_iq1::iq1_m_dot
        ),
        // The IQ3 kernels with their grid points gathered (`super::gather`).
        iq_type!(
            "IQ3_XXS gathered",
            Iq3Xxs::BYTES,
            Some(0),
            |w, x| scalar(GgmlType::Iq3Xxs, w, x),
            avx2_iq3::iq3_xxs_dot::<true, _>
        ),
        iq_type!(
            "IQ3_S gathered",
            Iq3S::BYTES,
            Some(0),
            |w, x| scalar(GgmlType::Iq3S, w, x),
            avx2_iq3::iq3_s_dot::<true, _>
        ),
    ]
}

/// The AVX-512 kernels, as [`types`] lists the AVX2 ones.
fn zmm_types() -> [Type; 6] {
    use avx2_iq2::{Iq2SAvx2, Iq2XsAvx2};
    use avx512_iq::iq_dot_zmm;
    let avx2 = types();
    [
        iq_type!(
            "IQ2_XS",
            avx2[1].bytes,
            avx2[1].d_at,
            avx2[1].reference,
            iq_dot_zmm::<Iq2XsAvx2, _>
        ),
        iq_type!(
            "IQ2_S",
            avx2[2].bytes,
            avx2[2].d_at,
            avx2[2].reference,
            iq_dot_zmm::<Iq2SAvx2, _>
        ),
        iq_type!(
            "IQ3_XXS",
            avx2[3].bytes,
            avx2[3].d_at,
            avx2[3].reference,
            iq_dot_zmm::<avx2_iq3::Xxs, _>
        ),
        iq_type!(
            "IQ3_S",
            avx2[4].bytes,
            avx2[4].d_at,
            avx2[4].reference,
            iq_dot_zmm::<avx2_iq3::S, _>
        ),
        iq_type!(
            "IQ1_S",
            avx2[5].bytes,
            avx2[5].d_at,
            avx2[5].reference,
            iq_dot_zmm::<avx2_iq1::S, _>
        ),
        iq_type!(
            "IQ1_M",
            avx2[6].bytes,
            avx2[6].d_at,
            avx2[6].reference,
            iq_dot_zmm::<avx2_iq1::M, _>
        ),
    ]
}

/// The AVX-512 kernels that decode grid points from codes ([`super::avx512_iq_codes`]).
fn codes_types() -> [Type; 3] {
    use super::avx512_iq_codes::iq_dot_codes;
    let avx2 = types();
    [
        iq_type!(
            "IQ2_XS (codes)",
            avx2[1].bytes,
            avx2[1].d_at,
            avx2[1].reference,
            iq_dot_codes::<avx2_iq2::Iq2XsAvx2, _>
        ),
        iq_type!(
            "IQ3_XXS (codes)",
            avx2[3].bytes,
            avx2[3].d_at,
            avx2[3].reference,
            iq_dot_codes::<avx2_iq3::Xxs, _>
        ),
        iq_type!(
            "IQ3_S (codes)",
            avx2[4].bytes,
            avx2[4].d_at,
            avx2[4].reference,
            iq_dot_codes::<avx2_iq3::S, _>
        ),
    ]
}

/// The AVX-512 IQ2_XXS kernel that reads each sub-block's signs and scale from one stored
/// word ([`super::avx512_iq2_xxs`]).
fn words_types() -> [Type; 1] {
    use super::avx512_iq2_xxs::iq2_xxs_dot_zmm;
    let avx2 = types();
    [iq_type!(
        "IQ2_XXS (words)",
        avx2[0].bytes,
        avx2[0].d_at,
        avx2[0].reference,
        iq2_xxs_dot_zmm::<avx2_iq2::Iq2XxsAvx2, _>
    )]
}

/// Every kernel this machine can run: the AVX2 ones, and the AVX-512 ones where it has
/// their features (the test says which it checked).
fn kernels_here() -> Vec<Type> {
    let mut all: Vec<Type> = types().into();
    if avx512_iq_detected() {
        all.extend(zmm_types());
        all.extend(codes_types());
        all.extend(words_types());
    } else {
        eprintln!("this machine has no AVX-512 VBMI/BITALG: the AVX2 kernels only");
    }
    all
}

/// A finite f16: mostly ordinary scales, sometimes the extremes (largest, smallest
/// normal and subnormal, zero), either sign.
fn random_half(rng: &mut StdRng) -> half::f16 {
    let magnitude = match rng.random_range(0..10) {
        0 => half::f16::MAX,
        1 => half::f16::MIN_POSITIVE,
        2 => half::f16::from_bits(1),
        3 => half::f16::ZERO,
        _ => half::f16::from_f32(rng.random_range(1e-4f32..1.0)),
    };
    if rng.random() {
        -magnitude
    } else {
        magnitude
    }
}

/// Random bytes (every pattern is a valid block) with a finite `d`.
fn random_weights(rng: &mut StdRng, ty: &Type, blocks: usize) -> Vec<u8> {
    let mut w = vec![0u8; blocks * ty.bytes];
    rng.fill(&mut w[..]);
    for block in w.chunks_exact_mut(ty.bytes) {
        let d = random_half(rng).to_bits();
        match ty.d_at {
            Some(at) => block[at..at + 2].copy_from_slice(&d.to_le_bytes()),
            // One nibble of d in the top of each of the four scale words.
            None => {
                for k in 0..4 {
                    let at = M_SCALES_AT + 2 * k + 1;
                    let nibble = ((d >> (4 * k)) & 0xF) as u8;
                    block[at] = (block[at] & 0x0F) | (nibble << 4);
                }
            }
        }
    }
    w
}

/// Q8_K blocks with random codes, runs of the extremes −128 and 127, and group sums that
/// match the codes (as every Q8_K writer stores them: the kernels use them).
fn random_activation(rng: &mut StdRng, blocks: usize) -> Vec<u8> {
    let mut x = vec![0u8; blocks * Q8K_BYTES];
    for xb in x.chunks_exact_mut(Q8K_BYTES) {
        let d: f32 = match rng.random_range(0..8) {
            0 => 1e20,
            1 => 1e-30,
            _ => rng.random_range(1e-6f32..1.0),
        };
        let d = if rng.random() { -d } else { d };
        xb[..4].copy_from_slice(&d.to_le_bytes());
        let pattern = rng.random_range(0..5);
        let codes: [i8; QK_K] = std::array::from_fn(|e| match pattern {
            0 => i8::MIN,
            1 => i8::MAX,
            2 => [i8::MIN, i8::MAX][e % 2],
            3 => {
                if rng.random_range(0..4) == 0 {
                    i8::MIN
                } else {
                    rng.random()
                }
            }
            _ => rng.random(),
        });
        for (b, c) in xb[CODES_AT..CODES_AT + QK_K].iter_mut().zip(codes) {
            *b = c as u8;
        }
        for (g, sum) in xb[SUMS_AT..].chunks_exact_mut(2).enumerate() {
            let s: i16 = codes[16 * g..16 * g + 16]
                .iter()
                .map(|&c| i16::from(c))
                .sum();
            sum.copy_from_slice(&s.to_le_bytes());
        }
    }
    x
}

fn same(got: f32, want: f32) -> bool {
    got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan())
}

#[test]
fn iq_kernels_give_the_scalar_arithmetic_bit_for_bit() {
    if !avx2_detected() {
        eprintln!("skipped: this machine has no AVX2");
        return;
    }
    let mut rng = StdRng::seed_from_u64(0x1A_E4AC7);
    for ty in kernels_here() {
        for case in 0..300 {
            let blocks = rng.random_range(1..5);
            let w = random_weights(&mut rng, &ty, blocks);
            let xs: Vec<Vec<u8>> = (0..4)
                .map(|_| random_activation(&mut rng, blocks))
                .collect();
            let want: Vec<f32> = xs.iter().map(|x| (ty.reference)(&w, x)).collect();
            let got1 = xs.iter().map(|x| (ty.one)(&w, [x])[0]);
            let got3 = (ty.three)(&w, [&xs[0], &xs[1], &xs[2]]);
            let got4 = (ty.four)(&w, [&xs[0], &xs[1], &xs[2], &xs[3]]);
            for (t, got) in got1.enumerate() {
                assert!(
                    same(got, want[t])
                        && same(got4[t], want[t])
                        && (t == 3 || same(got3[t], want[t])),
                    "{} case {case}, row {t}: {got} / {} / {} vs {}",
                    ty.name,
                    got4[t],
                    got3[t.min(2)],
                    want[t]
                );
            }
        }
    }
}

/// The case ggml's AVX2 sign trick gets wrong: every activation code −128 against
/// negative weights. The exact sum is far from the wrapped one.
#[test]
fn codes_of_minus_128_are_exact() {
    if !avx2_detected() {
        return;
    }
    let mut rng = StdRng::seed_from_u64(0x80);
    for ty in kernels_here() {
        let w = random_weights(&mut rng, &ty, 2);
        let mut x = random_activation(&mut rng, 2);
        for xb in x.chunks_exact_mut(Q8K_BYTES) {
            xb[..4].copy_from_slice(&0.5f32.to_le_bytes());
            xb[CODES_AT..CODES_AT + QK_K].fill(0x80);
            for sum in xb[SUMS_AT..].chunks_exact_mut(2) {
                sum.copy_from_slice(&(-2048i16).to_le_bytes());
            }
        }
        let want = (ty.reference)(&w, &x);
        let got = (ty.one)(&w, [&x])[0];
        assert!(same(got, want), "{}: {got} vs {want}", ty.name);
    }
}

/// The kernels that take four weight rows against one activation row (a decode step's
/// panels), AVX2 and, where the machine has it, AVX-512: each row's result is the scalar
/// reference's bits, including rows with extreme scales and activations of −128.
#[test]
fn four_row_kernels_give_the_scalar_arithmetic_bit_for_bit() {
    use super::avx2_iq::iq_rows4_avx2;
    use super::avx512_iq::iq_rows4_zmm;
    use super::avx512_iq2_xxs::iq2_xxs_rows4_zmm;
    use super::avx512_iq_codes::iq_rows4_codes;
    type Rows4 = fn([&[u8]; 4], &[u8]) -> [f32; 4];
    macro_rules! rows4 {
        ($f:path) => {{
            fn run(rows: [&[u8]; 4], x: &[u8]) -> [f32; 4] {
                // SAFETY: only called after `avx2_detected()` (and, for the AVX-512
                // kernels, `avx512_iq_detected()`).
                unsafe { $f(rows, x) }
            }
            run as Rows4
        }};
    }
    if !avx2_detected() {
        eprintln!("skipped: this machine has no AVX2");
        return;
    }
    let avx2 = types();
    let mut kernels: Vec<(&Type, Rows4)> = vec![
        (&avx2[0], rows4!(iq_rows4_avx2::<avx2_iq2::Iq2XxsAvx2>)),
        (&avx2[1], rows4!(iq_rows4_avx2::<avx2_iq2::Iq2XsAvx2>)),
        (&avx2[2], rows4!(iq_rows4_avx2::<avx2_iq2::Iq2SAvx2>)),
        (&avx2[3], rows4!(iq_rows4_avx2::<avx2_iq3::Xxs>)),
        (&avx2[5], rows4!(iq_rows4_avx2::<avx2_iq1::S>)),
        (&avx2[7], rows4!(iq_rows4_avx2::<avx2_iq3::Xxs<true>>)),
        (&avx2[8], rows4!(iq_rows4_avx2::<avx2_iq3::S<true>>)),
    ];
    if avx512_iq_detected() {
        kernels.extend([
            (&avx2[0], rows4!(iq2_xxs_rows4_zmm::<avx2_iq2::Iq2XxsAvx2>)),
            (&avx2[1], rows4!(iq_rows4_codes::<avx2_iq2::Iq2XsAvx2>)),
            (&avx2[1], rows4!(iq_rows4_zmm::<avx2_iq2::Iq2XsAvx2>)),
            (&avx2[3], rows4!(iq_rows4_codes::<avx2_iq3::Xxs>)),
            (&avx2[3], rows4!(iq_rows4_zmm::<avx2_iq3::Xxs>)),
            (&avx2[4], rows4!(iq_rows4_codes::<avx2_iq3::S>)),
            (&avx2[2], rows4!(iq_rows4_zmm::<avx2_iq2::Iq2SAvx2>)),
            (&avx2[5], rows4!(iq_rows4_zmm::<avx2_iq1::S>)),
            (&avx2[6], rows4!(iq_rows4_zmm::<avx2_iq1::M>)),
        ]);
    } else {
        eprintln!("this machine has no AVX-512 VBMI/BITALG: the AVX2 kernels only");
    }
    let mut rng = StdRng::seed_from_u64(0x4_A0F5);
    for (ty, rows4) in kernels {
        for case in 0..200 {
            let blocks = rng.random_range(1..5);
            let rows: Vec<Vec<u8>> = (0..4)
                .map(|_| random_weights(&mut rng, ty, blocks))
                .collect();
            let mut x = random_activation(&mut rng, blocks);
            if case % 10 == 0 {
                for xb in x.chunks_exact_mut(Q8K_BYTES) {
                    xb[CODES_AT..CODES_AT + QK_K].fill(0x80);
                    for sum in xb[SUMS_AT..].chunks_exact_mut(2) {
                        sum.copy_from_slice(&(-2048i16).to_le_bytes());
                    }
                }
            }
            let got = rows4(std::array::from_fn(|r| rows[r].as_slice()), &x);
            for (r, row) in rows.iter().enumerate() {
                let want = (ty.reference)(row, &x);
                assert!(
                    same(got[r], want),
                    "{} case {case}, row {r}: {} vs {want}",
                    ty.name,
                    got[r]
                );
            }
        }
    }
}

/// The AVX2 and AVX-512 int8 expansions (the prompt path's) give the scalar expansion's
/// integers on random blocks, whose every byte pattern is valid (every sign pattern
/// included), with every scale field at its largest in some.
#[test]
fn int8_expansions_give_the_scalar_integers() {
    use crate::kernels::Isa;
    use crate::quant::int8::{Int8Block, Int8Expand};
    fn check<F: Int8Expand>(isa: Isa, ty: GgmlType, largest_scales: fn(&mut [u8])) {
        for gather in [false, true] {
            check_gathering::<F>(isa, ty, largest_scales, gather);
        }
    }
    fn check_gathering<F: Int8Expand>(
        isa: Isa,
        ty: GgmlType,
        largest_scales: fn(&mut [u8]),
        gather: bool,
    ) {
        let Some(expand) = super::iq_int8_expansion_gathering(isa, ty, gather) else {
            // The one the AVX2 set leaves to the scalar expansion (measured no faster).
            assert_eq!((isa, ty), (Isa::Avx2, GgmlType::Iq1S));
            return;
        };
        let mut rng = StdRng::seed_from_u64(0x1A_8E8B);
        for case in 0..2000 {
            let mut block: Vec<u8> = (0..F::BYTES).map(|_| rng.random()).collect();
            if case % 7 == 0 {
                largest_scales(&mut block);
            }
            let (mut want, mut got) = (Int8Block::default(), Int8Block::default());
            F::expand(&block, &mut want);
            expand(&block, &mut got);
            assert_eq!(got, want, "{isa:?} {ty:?} (gather: {gather}) case {case}");
        }
    }
    if !avx2_detected() {
        eprintln!("skipped: this machine has no AVX2");
        return;
    }
    let mut isas = vec![Isa::Avx2];
    if avx512_iq_detected() {
        isas.push(Isa::Avx512Vnni);
    } else {
        eprintln!("this machine has no AVX-512 VBMI/BITALG: the AVX2 expansions only");
    }
    for isa in isas {
        // IQ2_XXS and IQ3_XXS: a sub-block's scale is the top nibble of its sign-and-scale
        // word; elsewhere the scale bytes or words are all ones.
        check::<Iq2Xxs>(isa, GgmlType::Iq2Xxs, |b| {
            (0..QK_K / 32).for_each(|ib| b[2 + 8 * ib + 7] |= 0xF0)
        });
        check::<Iq2Xs>(isa, GgmlType::Iq2Xs, |b| b[2 + 64..].fill(0xFF));
        check::<Iq2S>(isa, GgmlType::Iq2S, |b| b[Iq2S::BYTES - 8..].fill(0xFF));
        check::<Iq3Xxs>(isa, GgmlType::Iq3Xxs, |b| {
            (0..QK_K / 32).for_each(|ib| b[2 + 64 + 4 * ib + 3] |= 0xF0)
        });
        check::<Iq3S>(isa, GgmlType::Iq3S, |b| b[Iq3S::BYTES - 4..].fill(0xFF));
        check::<Iq1S>(isa, GgmlType::Iq1S, |b| {
            (0..QK_K / 32).for_each(|ib| b[Iq1S::BYTES - 16 + 2 * ib + 1] |= 0x70)
        });
        check::<Iq1M>(isa, GgmlType::Iq1M, |b| {
            b[M_SCALES_AT..M_SCALES_AT + 8].fill(0xFF)
        });
    }
}
