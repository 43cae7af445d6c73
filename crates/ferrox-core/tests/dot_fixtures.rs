//! Against ggml itself: fixtures written by `scripts/gen-dot-fixtures.py` from
//! libggml-cpu's `from_float` and `vec_dot`. Our activation quantizer must reproduce
//! ggml's bytes exactly; our AVX2 kernels must reproduce ggml's results bit for bit for
//! every quantized type (ggml's reference build has the same AVX2 code paths) except the
//! i-quants of [`SCALAR_ORDER`]; those, the scalar reference, and the float types (where
//! the reference build uses AVX-512) must agree within the tolerance argued in
//! tests/kernels.rs.

use std::path::Path;

use ferrox_core::kernels::{self, Isa};
use ferrox_core::{dequantize_row, row_byte_len, GgmlType};

const TYPES: &[&str] = &[
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "Q2_K", "Q3_K", "Q4_K",
    "Q5_K", "Q6_K", "IQ4_XS", "MXFP4", "TQ2_0", "TQ1_0", "NVFP4", "Q1_0", "Q2_0", "IQ3_XXS",
    "IQ3_S", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S",
];

/// The types whose kernels give the scalar reference's bits on every instruction set (an
/// exact integer sum per super-block, then one fused multiply-add), not ggml's AVX2 ones:
/// ggml's AVX2 kernels keep eight float lanes to the end and move the weights' signs onto
/// the activation codes, which wraps at −128.
const SCALAR_ORDER: &[&str] = &[
    "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S",
];

struct Case {
    x: Vec<f32>,
    w: Vec<u8>,
    xq: Vec<u8>,
    result: f32,
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

fn load(name: &str) -> (GgmlType, GgmlType, Vec<Case>) {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/dot/dot-{name}.bin"));
    let bytes = std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (regenerate with scripts/gen-dot-fixtures.py)",
            path.display()
        )
    });
    assert_eq!(&bytes[..4], b"FXDT");
    assert_eq!(u32_at(&bytes, 4), 1, "version");
    let ty = GgmlType::from_id(u32_at(&bytes, 8));
    let dot = GgmlType::from_id(u32_at(&bytes, 12));
    let count = u32_at(&bytes, 16) as usize;
    let mut at = 20;
    let mut take = |n: usize| {
        at += n;
        &bytes[at - n..at]
    };
    let cases = (0..count)
        .map(|_| {
            let cols = u32_at(take(4), 0) as usize;
            let x = take(4 * cols)
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            let w = take(row_byte_len(ty, cols).unwrap()).to_vec();
            let xq = take(row_byte_len(dot, cols).unwrap()).to_vec();
            let result = f32::from_le_bytes(take(4).try_into().unwrap());
            Case { x, w, xq, result }
        })
        .collect();
    (ty, dot, cases)
}

#[test]
fn activation_quantization_is_bit_exact_with_ggml_cpu() {
    for name in TYPES {
        let (ty, dot, cases) = load(name);
        assert_eq!(kernels::vec_dot_type(ty), Some(dot), "{name}");
        for (i, case) in cases.iter().enumerate() {
            let mut xq = vec![0u8; case.xq.len()];
            kernels::quantize_activation(dot, &case.x, &mut xq).unwrap();
            assert!(
                xq == case.xq,
                "{name} case {i}: {dot} activation differs from ggml's"
            );
        }
    }
}

/// Bit for bit except the float types and [`SCALAR_ORDER`]'s i-quants, which are held to
/// the scalar reference's tolerance (`assert_close`): their kernels sum in the scalar
/// reference's order, so their last bits differ from ggml's AVX2 ones.
#[test]
fn avx2_kernels_reproduce_ggml_results_bit_for_bit() {
    if !Isa::Avx2.is_available() {
        eprintln!("skipped: this machine has no AVX2");
        return;
    }
    for name in TYPES {
        let (ty, _, cases) = load(name);
        let float_type = ty.block_size() == Some(1);
        let close_only = float_type || SCALAR_ORDER.contains(name);
        for (i, case) in cases.iter().enumerate() {
            let got = kernels::vec_dot_with(Isa::Avx2, ty, &case.w, &case.xq).unwrap();
            assert_matches(name, i, got, case, close_only);
        }
    }
}

/// `got` against ggml's result: within the tolerance when `close_only`, else bit for bit.
fn assert_matches(name: &str, i: usize, got: f32, case: &Case, close_only: bool) {
    if close_only {
        assert_close(name, i, got, case);
    } else {
        assert_eq!(
            got.to_bits(),
            case.result.to_bits(),
            "{name} case {i}: {got} vs ggml {}",
            case.result
        );
    }
}

/// The AVX-512 VNNI kernels (where the machine has them) give ggml's AVX2 results bit for
/// bit too; the float types' give our AVX2 kernels' bits (checked in the kernel's own
/// tests), close to the reference build's AVX-512 ones, and the i-quants' sum in the scalar
/// reference's order, as their AVX2 kernels do (held to its tolerance).
#[test]
fn avx512_kernels_reproduce_ggml_results_bit_for_bit() {
    let isa = Isa::Avx512Vnni;
    if !isa.is_available() {
        eprintln!("skipped: this machine has no AVX-512 VNNI");
        return;
    }
    let mut checked = 0;
    for name in TYPES {
        let (ty, _, cases) = load(name);
        if !kernels::has_kernel(ty, isa) {
            continue;
        }
        let float_type = ty.block_size() == Some(1);
        let close_only = float_type || SCALAR_ORDER.contains(name);
        for (i, case) in cases.iter().enumerate() {
            let got = kernels::vec_dot_with(isa, ty, &case.w, &case.xq).unwrap();
            assert_matches(name, i, got, case, close_only);
            checked += 1;
        }
    }
    assert!(checked > 0);
}

#[test]
fn scalar_reference_agrees_with_ggml() {
    for name in TYPES {
        let (ty, _, cases) = load(name);
        for (i, case) in cases.iter().enumerate() {
            let got = kernels::vec_dot_with(Isa::Scalar, ty, &case.w, &case.xq).unwrap();
            assert_close(name, i, got, case);
        }
    }
}

/// Within `(blocks + 16)·ε·M` as argued in tests/kernels.rs, with the magnitude bound
/// `M = Σ|x_i|·(|w_i| + max|w|)`, generous enough to cover the minimums that affine formats
/// subtract (their size is never more than the largest weight plus the smallest).
fn assert_close(name: &str, i: usize, got: f32, case: &Case) {
    let ty = GgmlType::from_name(name).expect("known type");
    let dot_ty = kernels::vec_dot_type(ty).expect("a vec-dot type");
    let n = case.x.len();
    let mut wd = vec![0f32; n];
    dequantize_row(ty, &case.w, &mut wd).unwrap();
    let mut xd = vec![0f32; n];
    dequantize_row(dot_ty, &case.xq, &mut xd).unwrap();
    let w_max = wd.iter().fold(0.0f64, |a, w| a.max(f64::from(w.abs())));
    let m: f64 = wd
        .iter()
        .zip(&xd)
        .map(|(w, x)| f64::from(x.abs()) * (f64::from(w.abs()) + w_max))
        .sum();
    let blocks = n.div_ceil(32) as f64;
    let bound = (blocks + 16.0) * f64::from(f32::EPSILON) * m + 1e-30;
    let err = (f64::from(got) - f64::from(case.result)).abs();
    assert!(
        err <= bound,
        "{name} case {i}: {got} vs ggml {} (|Δ| {err:e} > {bound:e})",
        case.result
    );
}
