//! `WeightMatrix`: the matrix-vector products (scalar and fast) agree with a dense f64 reference, rows decode
//! the same as the whole tensor does, and malformed shapes are refused.

use ferrox_core::{dequantize_row, quantize_row, row_byte_len, GgmlType, QuantError, WeightMatrix};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn random_values(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

/// `rows × cols` random weights encoded as `ty`, placed at an odd address inside the
/// returned buffer (tensor data in an mmap has no alignment guarantee). Returns the buffer
/// and the offset of the tensor bytes in it.
fn encoded_matrix(rng: &mut StdRng, ty: GgmlType, rows: usize, cols: usize) -> (Vec<u8>, usize) {
    let dense = random_values(rng, rows * cols);
    let len = row_byte_len(ty, rows * cols).unwrap();
    let mut buffer = vec![0u8; len + 1];
    quantize_row(ty, &dense, &mut buffer[1..]).unwrap();
    (buffer, 1)
}

#[test]
fn apply_matches_a_dense_reference() {
    let mut rng = StdRng::seed_from_u64(0x5EED);
    let types = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Bf16,
        GgmlType::Q4_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2K,
        GgmlType::Q4K,
        GgmlType::Q6K,
        GgmlType::Iq4Xs,
    ];
    for ty in types {
        let block = ty.block_size().unwrap() as usize;
        let col_choices = [block.max(32), 2 * block.max(32), 768.max(block)];
        for (rows, cols) in [
            (1, col_choices[0]),
            (7, col_choices[1]),
            (3, col_choices[2]),
            (0, col_choices[0]),
        ] {
            let (buffer, at) = encoded_matrix(&mut rng, ty, rows, cols);
            let bytes = &buffer[at..];
            let matrix = WeightMatrix::new(ty, rows, cols, bytes).unwrap();
            assert_eq!(
                (matrix.ty(), matrix.rows(), matrix.cols()),
                (ty, rows, cols)
            );

            let mut dense = vec![0f32; rows * cols];
            dequantize_row(ty, bytes, &mut dense).unwrap();
            let x = random_values(&mut rng, cols);
            let mut y = vec![f32::NAN; rows];
            matrix.apply_dequantized(&x, &mut y).unwrap();
            let mut fast = vec![f32::NAN; rows];
            matrix.apply(&x, &mut fast).unwrap();

            let mut row = vec![0f32; cols];
            for i in 0..rows {
                matrix.dequant_row(i, &mut row).unwrap();
                assert_eq!(row, dense[i * cols..(i + 1) * cols], "{ty} row {i}");
                assert_eq!(matrix.row_bytes(i).len(), bytes.len() / rows);

                let w = &dense[i * cols..(i + 1) * cols];
                let want: f64 = w
                    .iter()
                    .zip(&x)
                    .map(|(a, b)| f64::from(*a) * f64::from(*b))
                    .sum();
                let scale: f64 = w
                    .iter()
                    .zip(&x)
                    .map(|(a, b)| f64::from((a * b).abs()))
                    .sum();
                let err = (f64::from(y[i]) - want).abs();
                assert!(
                    err <= 1e-5 * scale + 1e-30,
                    "{ty} {rows}x{cols} row {i}: {} vs {want}",
                    y[i]
                );
                // The fast path quantizes x first (Q8: half a step of amax/127 plus the f16
                // rounding of the step; F16/BF16: the rounding of each value).
                let bound = activation_error_bound(ty, w, &x) + 1e-5 * scale + 1e-30;
                let err = (f64::from(fast[i]) - want).abs();
                assert!(
                    err <= bound,
                    "{ty} {rows}x{cols} row {i}: apply {} vs {want} (bound {bound:e})",
                    fast[i]
                );
            }
        }
    }
}

fn activation_error_bound(ty: GgmlType, w: &[f32], x: &[f32]) -> f64 {
    let per_value = |w: &f32, x: &f32, step: f64| {
        let relative = match ty {
            GgmlType::F16 => 2f64.powi(-11),
            GgmlType::Bf16 => 2f64.powi(-8),
            _ => 0.0,
        };
        f64::from(w.abs()) * (0.57 * step + relative * f64::from(x.abs()))
    };
    if matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16) {
        return w.iter().zip(x).map(|(w, x)| per_value(w, x, 0.0)).sum();
    }
    let block = if ty.block_size() == Some(256) {
        256
    } else {
        32
    };
    w.chunks(block)
        .zip(x.chunks(block))
        .map(|(wb, xb)| {
            let step = f64::from(xb.iter().fold(0.0f32, |m, v| m.max(v.abs()))) / 127.0;
            wb.iter()
                .zip(xb)
                .map(|(w, x)| per_value(w, x, step))
                .sum::<f64>()
        })
        .sum()
}

#[test]
fn constructor_checks_shape_and_type() {
    let bytes = vec![0u8; 2 * 144];
    assert!(WeightMatrix::new(GgmlType::Q4K, 2, 256, &bytes).is_ok());
    assert!(matches!(
        WeightMatrix::new(GgmlType::Q4K, 2, 255, &bytes),
        Err(QuantError::PartialBlock {
            block_elems: 256,
            ..
        })
    ));
    assert!(matches!(
        WeightMatrix::new(GgmlType::Q4K, 3, 256, &bytes),
        Err(QuantError::ByteLength {
            expected: 432,
            actual: 288,
            ..
        })
    ));
    assert!(matches!(
        WeightMatrix::new(GgmlType::Q4K, 2, 256, &bytes[..287]),
        Err(QuantError::ByteLength { .. })
    ));
    assert!(matches!(
        WeightMatrix::new(GgmlType::Q4K, usize::MAX, 256, &bytes),
        Err(QuantError::MatrixTooLarge { .. })
    ));
    let err = WeightMatrix::new(GgmlType::I8, 1, 256, &bytes[..256]).unwrap_err();
    assert_eq!(err, QuantError::UnsupportedDequantize(GgmlType::I8));
    assert!(err.to_string().contains("I8"), "{err}");
    let err = WeightMatrix::new(GgmlType::Other(31), 1, 32, &bytes).unwrap_err();
    assert!(err.to_string().contains("Q4_0_4_4"), "{err}");
}

#[test]
fn apply_and_rows_reject_bad_lengths() {
    let bytes = vec![0u8; 3 * 34];
    let matrix = WeightMatrix::new(GgmlType::Q8_0, 3, 32, &bytes).unwrap();
    let x = vec![1f32; 32];
    let mut y = vec![0f32; 3];
    matrix.apply(&x, &mut y).unwrap();
    assert_eq!(y, [0.0; 3]);
    assert!(matches!(
        matrix.apply(&x[..31], &mut y),
        Err(QuantError::VectorLength {
            expected: 32,
            actual: 31,
            ..
        })
    ));
    assert!(matches!(
        matrix.apply(&x, &mut y[..2]),
        Err(QuantError::VectorLength {
            expected: 3,
            actual: 2,
            ..
        })
    ));
    let mut row = vec![0f32; 32];
    assert_eq!(
        matrix.dequant_row(3, &mut row),
        Err(QuantError::RowOutOfRange { row: 3, rows: 3 })
    );
    assert!(matches!(
        matrix.dequant_row(0, &mut row[..16]),
        Err(QuantError::VectorLength { .. })
    ));
}

#[test]
#[should_panic(expected = "out of range")]
fn row_bytes_panics_past_the_last_row() {
    let bytes = vec![0u8; 34];
    let matrix = WeightMatrix::new(GgmlType::Q8_0, 1, 32, &bytes).unwrap();
    let _ = matrix.row_bytes(1);
}
