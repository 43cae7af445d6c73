//! Packed products through the default entry points when `FERROX_ISA` caps the instruction
//! set below AVX-512 (as on a CPU without it): they must run the capped set's kernels, with
//! the scalar reference's bits. (The cap is read once per process, hence a binary of its own.)

use ferrox_core::kernels::{best_isa, Isa};
use ferrox_core::packed::{self, PackedMatrix};
use ferrox_core::{quantize_row, GgmlType, WeightMatrix};

#[test]
fn packed_products_follow_an_isa_cap() {
    // The only test of this binary: set before any other thread or kernel choice.
    std::env::set_var("FERROX_ISA", "avx2");
    if !Isa::Avx2.is_available() {
        assert_eq!(best_isa(), Isa::Scalar);
        assert!(
            !packed::available(),
            "nothing is packed without a fast kernel"
        );
        return;
    }
    assert_eq!(best_isa(), Isa::Avx2);
    assert!(packed::available());
    assert_eq!(packed::kernel_isa(), Isa::Avx2);
    let (rows, cols) = (64, 512);
    for ty in [
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::Q4K,
        GgmlType::Q6K,
        GgmlType::Q2K,
        GgmlType::Q3K,
    ] {
        let mut bytes = Vec::new();
        for r in 0..rows {
            let x: Vec<f32> = (0..cols)
                .map(|c| ((r * 31 + c * 7) % 23) as f32 - 11.0)
                .collect();
            let mut row = vec![0u8; ferrox_core::row_byte_len(ty, cols).unwrap()];
            quantize_row(ty, &x, &mut row).unwrap();
            bytes.extend(row);
        }
        let packed = PackedMatrix::pack(ty, rows, cols, &bytes, |_| {}).unwrap();
        let matrix = WeightMatrix::new(ty, rows, cols, &bytes)
            .unwrap()
            .with_packed(&packed)
            .unwrap();
        let x: Vec<f32> = (0..3 * cols)
            .map(|i| (i % 17) as f32 * 0.25 - 2.0)
            .collect();
        let mut xq = Vec::new();
        matrix.quantize_activation(&x, &mut xq).unwrap();
        let mut y = vec![0f32; 3 * rows];
        matrix.matmul(&xq, 3, &mut y).unwrap();
        let mut want = vec![0f32; 3 * rows];
        packed.matmul_with(Isa::Scalar, &xq, 3, &mut want).unwrap();
        assert!(
            y.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{ty}"
        );
        let mut one = vec![0f32; rows];
        matrix.matvec(&xq[..xq.len() / 3], &mut one).unwrap();
        assert!(
            one.iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{ty}"
        );
    }
}
