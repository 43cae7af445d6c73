use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::matrix::WeightMatrix;
use layout::Q8K_CODES_AT;

const TYPES: [GgmlType; 18] = [
    GgmlType::Iq4Xs,
    GgmlType::Mxfp4,
    GgmlType::Nvfp4,
    GgmlType::Iq4Nl,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Tq2_0,
    GgmlType::Tq1_0,
    GgmlType::Q1_0,
    GgmlType::Q2_0,
];

/// Shapes for `ty`: the formats of more than 32 values per block need whole blocks.
fn shapes(ty: GgmlType, shapes: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let values = PackedFormat::of(ty).unwrap().values();
    shapes
        .iter()
        .map(|&(r, c)| (r, c.next_multiple_of(values)))
        .collect()
}

fn random_rows(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(seed);
    let x: Vec<f32> = (0..cols).map(|_| 0.0).collect();
    let mut bytes = Vec::new();
    for _ in 0..rows {
        let row: Vec<f32> = x.iter().map(|_| rng.random_range(-1.0..1.0)).collect();
        let mut out = vec![0u8; quant::row_byte_len(ty, cols).unwrap()];
        quant::quantize_row(ty, &row, &mut out).unwrap();
        bytes.extend(out);
    }
    bytes
}

fn activations(m: &PackedMatrix, n: usize, seed: u64) -> (Vec<f32>, Vec<u8>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let x: Vec<f32> = (0..n * m.cols())
        .map(|_| rng.random_range(-2.0..2.0))
        .collect();
    let mut xq = vec![0u8; n * m.activation_row_bytes()];
    for (src, dst) in x
        .chunks_exact(m.cols())
        .zip(xq.chunks_exact_mut(m.activation_row_bytes()))
    {
        m.quantize_activation(src, dst).unwrap();
    }
    (x, xq)
}

/// The packed arithmetic computed straight from the file's blocks (not the packed copy):
/// per block the exact integer dot product of the signed values, then one fused
/// multiply-add of `dw·dy`.
fn from_file_blocks(ty: GgmlType, row: &[u8], x: &[f32]) -> f32 {
    if PackedFormat::of(ty).unwrap().is_k() {
        return from_file_super_blocks(ty, row, x);
    }
    let mut q8 = [0u8; 34];
    let bb = ty.block_bytes().unwrap() as usize;
    let per_block = ty.block_size().unwrap() as usize;
    let mut acc = 0f32;
    // Each block's values 32 at a time (Q1_0's and Q2_0's span several), against one
    // activation block each.
    let parts = row
        .chunks_exact(bb)
        .zip(x.chunks_exact(per_block))
        .flat_map(|(block, xb)| {
            xb.chunks_exact(32)
                .enumerate()
                .map(move |(part, xb)| (block, part, xb))
        });
    for (block, part, xb) in parts {
        crate::kernels::quantize_activation(GgmlType::Q8_0, xb, &mut q8).unwrap();
        if ty == GgmlType::Nvfp4 {
            acc = nvfp4_part_from_file(block, part, &q8, acc);
            continue;
        }
        // Signed values, or for Q4_1/Q5_1 the unsigned codes (their minimum comes after).
        let values: Vec<i32> = (0..32)
            .map(|i| (i, 32 * part + i))
            .map(|(i, e)| match ty {
                GgmlType::Q1_0 => 2 * i32::from(block[2 + e / 8] >> (e % 8) & 1) - 1,
                GgmlType::Q2_0 => i32::from(block[2 + e / 4] >> (2 * (e % 4)) & 3) - 1,
                GgmlType::Q8_0 => i32::from(block[2 + i] as i8),
                GgmlType::Mxfp4 => {
                    let nibble = block[1 + i % 16] >> (4 * (i / 16)) & 15;
                    i32::from(crate::quant::fp4::LEVELS[usize::from(nibble)])
                }
                GgmlType::Q4_0 => i32::from(block[2 + i % 16] >> (4 * (i / 16)) & 15) - 8,
                GgmlType::Iq4Nl => {
                    let nibble = block[2 + i % 16] >> (4 * (i / 16)) & 15;
                    i32::from(crate::quant::iq4::LEVELS[usize::from(nibble)])
                }
                GgmlType::Q4_1 => i32::from(block[4 + i % 16] >> (4 * (i / 16)) & 15),
                GgmlType::Q5_0 => {
                    let fifth = u32::from_le_bytes(block[2..6].try_into().unwrap()) >> i & 1;
                    let nibble = block[6 + i % 16] >> (4 * (i / 16)) & 15;
                    i32::from(nibble) + 16 * fifth as i32 - 16
                }
                _ => {
                    let fifth = u32::from_le_bytes(block[4..8].try_into().unwrap()) >> i & 1;
                    let nibble = block[8 + i % 16] >> (4 * (i / 16)) & 15;
                    i32::from(nibble) + 16 * fifth as i32
                }
            })
            .collect();
        let sum: i32 = values
            .iter()
            .zip(&q8[2..])
            .map(|(&w, &x)| w * i32::from(x as i8))
            .sum();
        let dw = if ty == GgmlType::Mxfp4 {
            crate::quant::fp4::e8m0_half(block[0])
        } else {
            half::f16::from_le_bytes([block[0], block[1]]).to_f32()
        };
        let dy = half::f16::from_le_bytes([q8[0], q8[1]]).to_f32();
        acc = (dw * dy).mul_add(sum as f32, acc);
        if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
            let m = half::f16::from_le_bytes([block[2], block[3]]).to_f32();
            let x_sum: i32 = q8[2..].iter().map(|&x| i32::from(x as i8)).sum();
            acc = (m * dy).mul_add(x_sum as f32, acc);
        }
    }
    acc
}

/// Part `part` (sub-blocks `2·part` and `2·part + 1`) of an NVFP4 file block against its
/// Q8_0 activation block `q8`: per sub-block the exact integer sum of levels times codes,
/// then a fused multiply-add of its scale times the activation's.
fn nvfp4_part_from_file(block: &[u8], part: usize, q8: &[u8], mut acc: f32) -> f32 {
    let dy = half::f16::from_le_bytes([q8[0], q8[1]]).to_f32();
    for half in 0..2 {
        let s = 2 * part + half;
        // Sub-block s: bytes 4 + 8s.., value v in byte v % 8, the high nibble from v = 8.
        let sum: i32 = (0..16)
            .map(|v| {
                let nibble = block[4 + 8 * s + v % 8] >> (4 * (v / 8)) & 15;
                let level = crate::quant::fp4::LEVELS[usize::from(nibble)];
                i32::from(level) * i32::from(q8[2 + 16 * half + v] as i8)
            })
            .sum();
        let dw = crate::quant::fp4::ue4m3_half(block[s]);
        acc = (dw * dy).mul_add(sum as f32, acc);
    }
    acc
}

/// Every NVFP4 scale byte, halved as ggml reads it, is an f16 value exactly: the packed
/// groups keep them as f16.
#[test]
fn nvfp4_scales_are_f16_values() {
    for byte in 0..=255u8 {
        let d = crate::quant::fp4::ue4m3_half(byte);
        assert_eq!(
            half::f16::from_f32(d).to_f32().to_bits(),
            d.to_bits(),
            "{byte:#x}"
        );
    }
}

/// [`from_file_blocks`] for the K-quants, with ggml's Q8_K activations.
fn from_file_super_blocks(ty: GgmlType, row: &[u8], x: &[f32]) -> f32 {
    let mut q8 = [0u8; 292];
    let bb = ty.block_bytes().unwrap() as usize;
    let i16_at = |b: &[u8], at: usize| i32::from(i16::from_le_bytes([b[at], b[at + 1]]));
    let mut acc = 0f32;
    for (block, xb) in row.chunks_exact(bb).zip(x.chunks_exact(256)) {
        crate::kernels::quantize_activation(GgmlType::Q8K, xb, &mut q8).unwrap();
        let dy = f32::from_le_bytes(q8[..4].try_into().unwrap());
        let xq = |e: usize| i32::from(q8[4 + e] as i8);
        let (mut scaled, mut other) = (0i32, 0i32);
        if matches!(ty, GgmlType::Tq2_0 | GgmlType::Tq1_0) {
            // TQ2_0: byte 32j + m holds value 128j + 32l + m in bits 2l..2l+2; TQ1_0: base-3
            // digits (the quantizer's own decoding). A code c is c − 1.
            let tq1 = ty == GgmlType::Tq1_0;
            let tq1_codes = crate::quant::ternary::tq1_codes(block);
            let sum: i32 = (0..256)
                .map(|e| {
                    let code = if tq1 {
                        tq1_codes[e]
                    } else {
                        block[32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32)) & 3
                    };
                    (i32::from(code) - 1) * xq(e)
                })
                .sum();
            let d_at = if tq1 { 52 } else { 64 };
            let dw = half::f16::from_le_bytes([block[d_at], block[d_at + 1]]).to_f32();
            acc = (dw * dy).mul_add(sum as f32, acc);
        } else if ty == GgmlType::Iq4Xs {
            // Sub-block s: 16 bytes at 8 + 16s, low nibbles values 0..16, high 16..32.
            for s in 0..8 {
                let sum: i32 = (0..32)
                    .map(|i| {
                        let nibble = block[8 + 16 * s + i % 16] >> (4 * (i / 16)) & 15;
                        let level = crate::quant::iq4::LEVELS[usize::from(nibble)];
                        i32::from(level) * xq(32 * s + i)
                    })
                    .sum();
                scaled += crate::quant::iq4::Iq4Xs::scale(block, s) * sum;
            }
            let dw = half::f16::from_le_bytes([block[0], block[1]]).to_f32();
            acc = (dw * dy).mul_add(scaled as f32, acc);
        } else if matches!(ty, GgmlType::Q2K | GgmlType::Q3K) {
            // Two-bit codes: byte e % 32 of each 128-value half, bits 2·(e % 128 / 32).
            let codes_at = if ty == GgmlType::Q2K { 16 } else { 32 };
            let two_bits = |e: usize| {
                i32::from(block[codes_at + 32 * (e / 128) + e % 32] >> (e % 128 / 32 * 2) & 3)
            };
            for s in 0..16 {
                let x_sum = i16_at(&q8, 260 + 2 * s);
                if ty == GgmlType::Q2K {
                    let sum: i32 = (16 * s..16 * s + 16).map(|e| two_bits(e) * xq(e)).sum();
                    scaled += i32::from(block[s] & 15) * sum;
                    other += i32::from(block[s] >> 4) * x_sum;
                } else {
                    // The value is the code minus 4 unless its high bit (bit e / 32 of
                    // byte e % 32) is set.
                    let scale = crate::quant::kquants::q3_k::sub_block_scale(&block[96..108], s);
                    let sum: i32 = (16 * s..16 * s + 16)
                        .map(|e| {
                            (two_bits(e) + 4 * i32::from(block[e % 32] >> (e / 32) & 1)) * xq(e)
                        })
                        .sum();
                    scaled += scale * sum;
                    other += scale * x_sum;
                }
            }
            let f16_at = |at: usize| half::f16::from_le_bytes([block[at], block[at + 1]]).to_f32();
            if ty == GgmlType::Q2K {
                acc = (f16_at(80) * dy).mul_add(scaled as f32, acc);
                acc = (-(f16_at(82) * dy)).mul_add(other as f32, acc);
            } else {
                acc = (f16_at(108) * dy).mul_add((scaled - 4 * other) as f32, acc);
            }
        } else if ty != GgmlType::Q6K {
            // Q4_K, or Q5_K: its nibbles after 32 bytes of fifth bits (bit e / 32 of byte e % 32).
            let q5k = ty == GgmlType::Q5K;
            let codes_at = if q5k { 48 } else { 16 };
            for s in 0..8 {
                let (scale, min) = crate::quant::kquants::scale_min_k4(s, &block[4..16]);
                let sum: i32 = (32 * s..32 * s + 32)
                    .map(|e| {
                        let byte = block[codes_at + 32 * (e / 64) + e % 32];
                        let nibble = i32::from(byte >> (4 * (e % 64 / 32)) & 15);
                        let fifth = if q5k {
                            i32::from(block[16 + e % 32] >> (e / 32) & 1)
                        } else {
                            0
                        };
                        (nibble + 16 * fifth) * xq(e)
                    })
                    .sum();
                scaled += i32::from(scale) * sum;
                other += i32::from(min) * (i16_at(&q8, 260 + 4 * s) + i16_at(&q8, 262 + 4 * s));
            }
            let dw = half::f16::from_le_bytes([block[0], block[1]]).to_f32();
            let dmin = half::f16::from_le_bytes([block[2], block[3]]).to_f32();
            acc = (dw * dy).mul_add(scaled as f32, acc);
            acc = (-(dmin * dy)).mul_add(other as f32, acc);
        } else {
            for s in 0..16 {
                let scale = i32::from(block[192 + s] as i8);
                let sum: i32 = (16 * s..16 * s + 16)
                    .map(|e| i32::from(layout::q6k_code(block, e)) * xq(e))
                    .sum();
                scaled += scale * sum;
                other += scale * i16_at(&q8, 260 + 2 * s);
            }
            let dw = half::f16::from_le_bytes([block[208], block[209]]).to_f32();
            acc = (dw * dy).mul_add((scaled - 32 * other) as f32, acc);
        }
    }
    acc
}

fn isas() -> Vec<Isa> {
    [Isa::Scalar, Isa::Avx2, Isa::Avx512Vnni]
        .into_iter()
        .filter(|isa| isa.is_available())
        .collect()
}

#[test]
fn packed_products_follow_the_file_blocks_exactly() {
    for ty in TYPES {
        for (rows, cols) in shapes(ty, &[(16, 32), (32, 96), (48, 640)]) {
            let bytes = random_rows(ty, rows, cols, 1);
            let m = PackedMatrix::pack(ty, rows, cols, &bytes, |_| {}).unwrap();
            assert_products_follow_the_file_blocks(ty, &m, &bytes, 3, 2);
        }
    }
}

/// `m` (packed from the file rows `bytes` of type `ty`) against `n` activation rows made
/// from `seed`: every instruction set's outputs have the bits of [`from_file_blocks`].
fn assert_products_follow_the_file_blocks(
    ty: GgmlType,
    m: &PackedMatrix,
    bytes: &[u8],
    n: usize,
    seed: u64,
) {
    let (rows, cols) = (m.rows(), m.cols());
    let (x, xq) = activations(m, n, seed);
    let row_bytes = bytes.len() / rows;
    for isa in isas() {
        let mut y = vec![0f32; n * rows];
        m.matmul_with(isa, &xq, n, &mut y).unwrap();
        for t in 0..n {
            for r in 0..rows {
                let want = from_file_blocks(
                    ty,
                    &bytes[r * row_bytes..(r + 1) * row_bytes],
                    &x[t * cols..(t + 1) * cols],
                );
                assert_eq!(
                    y[t * rows + r].to_bits(),
                    want.to_bits(),
                    "{ty} {rows}x{cols} {isa:?} {n} tokens: token {t} row {r}"
                );
            }
        }
    }
}

/// Prompts of the 32-value formats (more tokens than one sweep serves, in panels) give the
/// file blocks' exact products on every instruction set.
#[test]
fn prompt_products_follow_the_file_blocks_exactly() {
    for ty in TYPES {
        if PackedFormat::of(ty).unwrap().is_k() {
            continue;
        }
        for (rows, cols) in shapes(ty, &[(32, 256)]) {
            let bytes = random_rows(ty, rows, cols, 3);
            let m = PackedMatrix::pack(ty, rows, cols, &bytes, |_| {}).unwrap();
            for n in [9, 16, 21] {
                assert_products_follow_the_file_blocks(ty, &m, &bytes, n, 60 + n as u64);
            }
        }
    }
}

/// Q8_0 codes anywhere in the byte range (a writer other than `llama-quantize` may store
/// −128, which ggml's quantizer never does) give the file blocks' exact products on every
/// instruction set and for any number of tokens per pass.
#[test]
fn q8_0_products_take_every_code_exactly() {
    let (rows, cols) = (32, 256);
    let mut rng = StdRng::seed_from_u64(11);
    let mut bytes = vec![0u8; rows * quant::row_byte_len(GgmlType::Q8_0, cols).unwrap()];
    rng.fill(&mut bytes[..]);
    let scale = half::f16::from_f32(0.01).to_le_bytes();
    for (b, block) in bytes.chunks_exact_mut(34).enumerate() {
        block[..2].copy_from_slice(&scale);
        // Every block holds −128 and 127 codes.
        block[2 + b % 32] = 0x80;
        block[2 + (b + 7) % 32] = 0x7F;
    }
    let m = PackedMatrix::pack(GgmlType::Q8_0, rows, cols, &bytes, |_| {}).unwrap();
    for n in [1, 2, 3, 4, 8] {
        assert_products_follow_the_file_blocks(GgmlType::Q8_0, &m, &bytes, n, 12 + n as u64);
    }
}

/// The two-bit formats' every code (TQ2_0's 3, which `llama-quantize` never writes and
/// ggml reads as +2; Q2_0's +2), TQ1_0's every byte and Q1_0's every sign pattern, from
/// random bytes, give the
/// file blocks' exact products on every instruction set, for the decode kernels' token
/// counts (TQ2_0's AVX-512 codes left in place up to four) and more.
#[test]
fn low_bit_products_take_every_code_exactly() {
    let scale = half::f16::from_f32(0.01).to_le_bytes();
    for (ty, scale_at) in [
        (GgmlType::Tq2_0, 64),
        (GgmlType::Tq1_0, 52),
        (GgmlType::Q2_0, 0),
        (GgmlType::Q1_0, 0),
    ] {
        let (rows, cols) = (32, 512);
        let mut rng = StdRng::seed_from_u64(21);
        let mut bytes = vec![0u8; rows * quant::row_byte_len(ty, cols).unwrap()];
        rng.fill(&mut bytes[..]);
        let bb = ty.block_bytes().unwrap() as usize;
        for (b, block) in bytes.chunks_exact_mut(bb).enumerate() {
            block[scale_at..scale_at + 2].copy_from_slice(&scale);
            // Every block holds a byte of four 3s (Q1_0: eight plus signs).
            let codes = if scale_at == 0 { 2..bb } else { 0..scale_at };
            block[codes.start + b % codes.len()] = 0xFF;
        }
        let m = PackedMatrix::pack(ty, rows, cols, &bytes, |_| {}).unwrap();
        for n in [1, 2, 4, 5, 8] {
            assert_products_follow_the_file_blocks(ty, &m, &bytes, n, 30 + n as u64);
        }
    }
}

/// NVFP4 blocks of random bytes (every nibble, every scale byte ggml can read, bit 7 set
/// or not) give the file blocks' exact products on every instruction set and for the
/// decode and prompt token counts.
#[test]
fn nvfp4_products_take_every_byte_exactly() {
    let ty = GgmlType::Nvfp4;
    let (rows, cols) = (32, 1024);
    let mut rng = StdRng::seed_from_u64(41);
    let mut bytes = vec![0u8; rows * quant::row_byte_len(ty, cols).unwrap()];
    rng.fill(&mut bytes[..]);
    let m = PackedMatrix::pack(ty, rows, cols, &bytes, |_| {}).unwrap();
    for n in [1, 2, 3, 4, 8] {
        assert_products_follow_the_file_blocks(ty, &m, &bytes, n, 50 + n as u64);
    }
}

/// A pool of each of these thread counts.
fn pools(threads: &[usize]) -> Vec<rayon::ThreadPool> {
    threads
        .iter()
        .map(|&n| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .unwrap()
        })
        .collect()
}

/// Every instruction set, every batch size and any thread count give the same bits as
/// the scalar reference for one token alone.
#[test]
fn packed_products_are_batch_and_isa_invariant() {
    let pools = pools(&[1, 3]);
    for ty in TYPES {
        for (rows, cols) in shapes(ty, &[(16, 64), (208, 2048), (1024, 640)]) {
            let bytes = random_rows(ty, rows, cols, 3);
            let m = PackedMatrix::pack(ty, rows, cols, &bytes, |_| {}).unwrap();
            let n = 19;
            let (_, xq) = activations(&m, n, 4);
            let act = m.activation_row_bytes();
            let mut alone = vec![0f32; n * rows];
            for t in 0..n {
                m.matmul_with(
                    Isa::Scalar,
                    &xq[t * act..(t + 1) * act],
                    1,
                    &mut alone[t * rows..(t + 1) * rows],
                )
                .unwrap();
            }
            for isa in isas() {
                for pool in &pools {
                    for batch in [1, 2, 3, 5, 6, 7, 8, 19] {
                        let mut y = vec![0f32; n * rows];
                        for t0 in (0..n).step_by(batch) {
                            let k = batch.min(n - t0);
                            pool.install(|| {
                                m.matmul_with(
                                    isa,
                                    &xq[t0 * act..(t0 + k) * act],
                                    k,
                                    &mut y[t0 * rows..(t0 + k) * rows],
                                )
                            })
                            .unwrap();
                        }
                        let same = y
                            .iter()
                            .zip(&alone)
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(same, "{ty} {rows}x{cols} {isa:?} batch {batch}");
                    }
                }
            }
        }
    }
}

/// Prompts long enough for a panel's prompt form give the bits of one token at a time, on
/// one thread and several, codes of −128 included (ggml's quantizer never writes them; a
/// file may hold them).
#[cfg(target_arch = "x86_64")]
#[test]
fn prompt_forms_give_the_bits_of_single_tokens() {
    let pools = pools(&[1, 3]);
    let mut covered = 0;
    for ty in TYPES {
        let format = PackedFormat::of(ty).unwrap();
        let forms: Vec<(Isa, PromptForm)> = isas()
            .into_iter()
            .filter_map(|isa| Some((isa, prompt_form_for(isa, format)?)))
            .collect();
        let Some(n) = forms
            .iter()
            .map(|(_, form)| form.min_tokens.max(MAX_TOKENS_PER_SWEEP + 1) + 5)
            .max()
        else {
            continue;
        };
        for (rows, cols) in shapes(ty, &[(16, 32), (208, 2048)]) {
            let mut bytes = random_rows(ty, rows, cols, 5);
            if ty == GgmlType::Q8_0 {
                for block in bytes.chunks_exact_mut(34) {
                    block[2 + 3] = 0x80;
                }
            }
            let m = PackedMatrix::pack(ty, rows, cols, &bytes, |_| {}).unwrap();
            let (_, xq) = activations(&m, n, 6);
            let act = m.activation_row_bytes();
            let mut alone = vec![0f32; n * rows];
            for t in 0..n {
                let y = &mut alone[t * rows..(t + 1) * rows];
                m.matmul_with(Isa::Scalar, &xq[t * act..(t + 1) * act], 1, y)
                    .unwrap();
            }
            for &(isa, _) in &forms {
                for pool in &pools {
                    let mut y = vec![0f32; n * rows];
                    pool.install(|| m.matmul_with(isa, &xq, n, &mut y)).unwrap();
                    let same = y
                        .iter()
                        .zip(&alone)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{ty} {rows}x{cols} {isa:?}");
                    covered += 1;
                }
            }
        }
    }
    assert!(
        covered > 0 || !Isa::Avx2.is_available(),
        "no prompt form reached"
    );
}

/// The packed and row-major products differ only by rounding.
#[test]
fn packed_products_agree_with_the_row_major_kernels() {
    for ty in TYPES {
        let (rows, cols) = (64, 1024);
        // Q4_1/Q5_1: the row-major kernels use ggml's Q8_1 activations, which carry d·Σx
        // rounded to f16, an error each block's minimum multiplies (ours is exact, checked
        // bit for bit above): about 1e-2 at these magnitudes.
        // Q2_K: each block's minimums nearly cancel its scaled codes, so the two sums'
        // rounding (ordered differently in the row-major kernel) weighs more on the result.
        // TQ2_0 likewise: weights of ±d and 0 against random activations leave rows whose
        // products cancel to a small fraction of their partial sums.
        let tolerance = if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
            2e-2
        } else if matches!(ty, GgmlType::Q2K | GgmlType::Tq2_0 | GgmlType::Tq1_0) {
            1e-4
        } else {
            1e-5
        };
        let bytes = random_rows(ty, rows, cols, 5);
        let packed = PackedMatrix::pack(ty, rows, cols, &bytes, |_| {}).unwrap();
        let plain = WeightMatrix::new(ty, rows, cols, &bytes).unwrap();
        let (x, xq) = activations(&packed, 1, 6);
        let mut y = vec![0f32; rows];
        packed.matmul(&xq, 1, &mut y).unwrap();
        let mut want = vec![0f32; rows];
        plain.apply(&x, &mut want).unwrap();
        for (a, b) in y.iter().zip(&want) {
            assert!(
                (a - b).abs() <= tolerance * b.abs().max(1.0),
                "{ty}: {a} vs {b}"
            );
        }
    }
}

/// The packed products equal the dequantized weights times the dequantized activations,
/// summed in f64, up to float rounding.
#[test]
fn packed_products_match_a_dequantized_product() {
    for ty in TYPES {
        let (rows, cols) = (32, 512);
        let bytes = random_rows(ty, rows, cols, 13);
        let m = PackedMatrix::pack(ty, rows, cols, &bytes, |_| {}).unwrap();
        let (_, xq) = activations(&m, 2, 14);
        // The activation rows' values: per block a scale and signed codes.
        let act = m.activation_row_bytes();
        let x: Vec<f64> = xq
            .chunks_exact(act)
            .flat_map(|row| {
                let k = m.format.is_k();
                // One activation block per 32 values of the 32-value formats.
                let ab = m.format.activation_block_bytes() / m.format.parts();
                row.chunks_exact(ab).flat_map(move |a| {
                    let (scale_at, codes_at, n) = if k {
                        (0, Q8K_CODES_AT, 256)
                    } else {
                        (ACT_SCALE_AT, 0, QK)
                    };
                    let d = f32::from_le_bytes(a[scale_at..scale_at + 4].try_into().unwrap());
                    a[codes_at..codes_at + n]
                        .iter()
                        .map(move |&c| f64::from(d) * f64::from(c as i8))
                })
            })
            .collect();
        let mut w = vec![0f32; cols];
        let row_bytes = bytes.len() / rows;
        for isa in isas() {
            let mut y = vec![0f32; 2 * rows];
            m.matmul_with(isa, &xq, 2, &mut y).unwrap();
            for r in 0..rows {
                quant::dequantize_row(ty, &bytes[r * row_bytes..(r + 1) * row_bytes], &mut w)
                    .unwrap();
                for t in 0..2 {
                    let x = &x[t * cols..(t + 1) * cols];
                    let want: f64 = w.iter().zip(x).map(|(&w, &x)| f64::from(w) * x).sum();
                    let size: f64 = w
                        .iter()
                        .zip(x)
                        .map(|(&w, &x)| (f64::from(w) * x).abs())
                        .sum();
                    let got = f64::from(y[t * rows + r]);
                    assert!(
                        (got - want).abs() <= 1e-5 * size.max(1e-3),
                        "{ty} {isa:?} token {t} row {r}: {got} vs {want}"
                    );
                }
            }
        }
    }
}

/// Shapes that are not whole groups of rows or whole blocks are left row-major.
#[test]
fn odd_shapes_are_not_packed() {
    for ty in TYPES {
        let k = PackedFormat::of(ty).unwrap().values();
        assert!(PackedMatrix::can_pack(ty, 16, k));
        assert!(PackedMatrix::can_pack(ty, 48, 3 * k));
        assert!(!PackedMatrix::can_pack(ty, 24, k), "{ty}");
        assert!(!PackedMatrix::can_pack(ty, 16, k + k / 2), "{ty}");
        assert!(!PackedMatrix::can_pack(ty, 16, 0), "{ty}");
        assert!(PackedMatrix::pack(ty, 16, k + k / 2, &[], |_| {}).is_err());
        if k == 256 {
            assert!(!PackedMatrix::can_pack(ty, 16, 128), "{ty}");
            assert!(!PackedMatrix::can_pack(ty, 16, 640), "{ty}");
        }
    }
}

#[test]
fn packing_checks_its_input() {
    let bytes = random_rows(GgmlType::Q8_0, 16, 64, 7);
    assert!(PackedMatrix::pack(GgmlType::Q8_0, 16, 64, &bytes[1..], |_| {}).is_err());
    assert!(PackedMatrix::pack(GgmlType::Q4K, 16, 256, &bytes, |_| {}).is_err());
    assert!(!PackedMatrix::can_pack(GgmlType::Q8_0, 24, 64));
    let m = PackedMatrix::pack(GgmlType::Q8_0, 16, 64, &bytes, |_| {}).unwrap();
    let mut y = vec![0f32; 16];
    assert!(m.matmul(&[0u8; 10], 1, &mut y).is_err());
    assert!(m.matmul(&[0u8; 80], 1, &mut y[..8]).is_err());
}

/// Every byte of the source is handed to `release` exactly once.
#[test]
fn packing_releases_all_of_its_source() {
    let (rows, cols) = (16 * 300, 64);
    let bytes = random_rows(GgmlType::Q4_0, rows, cols, 8);
    let released = std::sync::atomic::AtomicUsize::new(0);
    PackedMatrix::pack(GgmlType::Q4_0, rows, cols, &bytes, |part| {
        released.fetch_add(part.len(), std::sync::atomic::Ordering::Relaxed);
    })
    .unwrap();
    assert_eq!(released.into_inner(), bytes.len());
}

/// Several matrices in one pass give each the bits of its own product.
#[test]
fn products_of_several_matrices_equal_their_own() {
    let cols = 512;
    let shapes = [
        (GgmlType::Q5_0, 64),
        (GgmlType::Q8_0, 32),
        (GgmlType::Q4_0, 1024),
    ];
    let bytes: Vec<Vec<u8>> = shapes
        .iter()
        .map(|&(ty, rows)| random_rows(ty, rows, cols, 9))
        .collect();
    let packed: Vec<PackedMatrix> = shapes
        .iter()
        .zip(&bytes)
        .map(|(&(ty, rows), b)| PackedMatrix::pack(ty, rows, cols, b, |_| {}).unwrap())
        .collect();
    let parts: Vec<&PackedMatrix> = packed.iter().collect();
    // One token's products split their groups by claiming, across any number of threads.
    let pools = pools(&[1, 2, 3]);
    for n in [1, 3, 8] {
        let (_, xq) = activations(&packed[0], n, 10);
        for pool in &pools {
            let mut together: Vec<Vec<f32>> =
                shapes.iter().map(|&(_, r)| vec![f32::NAN; n * r]).collect();
            let mut outs: Vec<&mut [f32]> = together.iter_mut().map(|v| &mut v[..]).collect();
            pool.install(|| PackedMatrix::matmul_many(&parts, &xq, n, &mut outs))
                .unwrap();
            for (m, got) in packed.iter().zip(&together) {
                let mut alone = vec![0.0; n * m.rows()];
                m.matmul_with(Isa::Scalar, &xq, n, &mut alone).unwrap();
                assert!(
                    alone
                        .iter()
                        .zip(got)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{n} tokens, {} threads",
                    pool.current_num_threads()
                );
            }
        }
    }
    // Different activation layouts cannot share one pass.
    let k = random_rows(GgmlType::Q4K, 16, cols, 11);
    let k = PackedMatrix::pack(GgmlType::Q4K, 16, cols, &k, |_| {}).unwrap();
    let (_, xq) = activations(&packed[0], 1, 12);
    let (mut a, mut b) = (vec![0.0; 64], vec![0.0; 16]);
    assert!(PackedMatrix::matmul_many(&[&packed[0], &k], &xq, 1, &mut [&mut a, &mut b]).is_err());
}

/// Independent products (each its own activations, token count and format) in one pass
/// give each the bits of its own product; more than the limit is refused.
#[test]
fn independent_products_in_one_pass_equal_their_own() {
    let shapes = [
        (GgmlType::Q4K, 48, 512, 1),
        (GgmlType::Q6K, 32, 256, 3),
        (GgmlType::Q8_0, 1024, 128, 1),
        (GgmlType::Q4_0, 16, 64, 8),
        (GgmlType::Q5K, 64, 256, 2),
        (GgmlType::Q2K, 32, 512, 5),
        (GgmlType::Q3K, 48, 256, 1),
    ];
    let packed: Vec<PackedMatrix> = shapes
        .iter()
        .enumerate()
        .map(|(i, &(ty, rows, cols, _))| {
            let b = random_rows(ty, rows, cols, 20 + i as u64);
            PackedMatrix::pack(ty, rows, cols, &b, |_| {}).unwrap()
        })
        .collect();
    let xqs: Vec<Vec<u8>> = packed
        .iter()
        .zip(&shapes)
        .enumerate()
        .map(|(i, (m, &(.., n)))| activations(m, n, 30 + i as u64).1)
        .collect();
    let mut outs: Vec<Vec<f32>> = shapes
        .iter()
        .map(|&(_, r, _, n)| vec![0.0; r * n])
        .collect();
    let mut products: Vec<Product<'_>> = packed
        .iter()
        .zip(&xqs)
        .zip(outs.iter_mut())
        .zip(&shapes)
        .map(|(((m, xq), out), &(.., n))| Product {
            matrix: m,
            xq,
            n_tokens: n,
            out,
        })
        .collect();
    PackedMatrix::matmul_products(&mut products).unwrap();
    for ((m, xq), (got, &(.., n))) in packed.iter().zip(&xqs).zip(outs.iter().zip(&shapes)) {
        let mut alone = vec![0.0; n * m.rows()];
        m.matmul(xq, n, &mut alone).unwrap();
        assert!(alone
            .iter()
            .zip(got)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
    }
    // Activations of the wrong length are an error, not a read past them.
    let mut short = vec![0.0; 48];
    let bad = &mut [Product {
        matrix: &packed[0],
        xq: &xqs[0][..xqs[0].len() - 1],
        n_tokens: 1,
        out: &mut short,
    }];
    assert!(PackedMatrix::matmul_products(bad).is_err());
    // More than MAX_PRODUCTS in one pass is refused.
    let mut many: Vec<Vec<f32>> = (0..=MAX_PRODUCTS).map(|_| vec![0.0; 48]).collect();
    let mut too_many: Vec<Product<'_>> = many
        .iter_mut()
        .map(|out| Product {
            matrix: &packed[0],
            xq: &xqs[0],
            n_tokens: 1,
            out,
        })
        .collect();
    assert!(PackedMatrix::matmul_products(&mut too_many).is_err());
}

/// Random i-quant rows: random bytes are valid blocks (indices are masked); each block's
/// f16 scale is set to a small finite value (IQ1_M keeps it in the top nibbles of its
/// four scale words).
fn random_iq_rows(ty: GgmlType, rows: usize, cols: usize, rng: &mut StdRng) -> Vec<u8> {
    let mut bytes: Vec<u8> = (0..quant::row_byte_len(ty, cols).unwrap() * rows)
        .map(|_| rng.random())
        .collect();
    let bb = ty.block_bytes().unwrap() as usize;
    for block in bytes.chunks_exact_mut(bb) {
        let d = half::f16::from_f32(rng.random_range(1e-4..1e-1)).to_bits();
        if ty == GgmlType::Iq1M {
            let at = crate::quant::iq1::M_SCALES_AT;
            for k in 0..4 {
                let word = u16::from_le_bytes([block[at + 2 * k], block[at + 2 * k + 1]]);
                let word = word & 0x0FFF | ((d >> (4 * k)) & 0xF) << 12;
                block[at + 2 * k..at + 2 * k + 2].copy_from_slice(&word.to_le_bytes());
            }
        } else {
            block[..2].copy_from_slice(&d.to_le_bytes());
        }
    }
    bytes
}

const IQ_TYPES: [GgmlType; 7] = [
    GgmlType::Iq1S,
    GgmlType::Iq1M,
    GgmlType::Iq2Xxs,
    GgmlType::Iq2Xs,
    GgmlType::Iq2S,
    GgmlType::Iq3Xxs,
    GgmlType::Iq3S,
];

/// The i-quants' int8 prompt path, on every instruction set, gives the scalar reference's
/// bits for each row and token.
#[test]
fn int8_prompt_path_gives_the_scalar_reference_bits() {
    let mut rng = StdRng::seed_from_u64(0x18C);
    for ty in IQ_TYPES {
        for (rows, cols, tokens) in [(16, 256, 1), (48, 512, 9), (32, 1024, 20)] {
            let bytes = random_iq_rows(ty, rows, cols, &mut rng);
            let row_bytes = bytes.len() / rows;
            let x: Vec<f32> = (0..tokens * cols)
                .map(|_| rng.random_range(-2.0..2.0))
                .collect();
            let act = quant::row_byte_len(GgmlType::Q8K, cols).unwrap();
            let mut xq = vec![0u8; tokens * act];
            for (src, dst) in x.chunks_exact(cols).zip(xq.chunks_exact_mut(act)) {
                crate::kernels::quantize_activation(GgmlType::Q8K, src, &mut dst[..]).unwrap();
            }
            for isa in isas() {
                let path = Int8Path::for_type_with(isa, ty, cols).unwrap();
                let mut y = vec![f32::NAN; tokens * rows];
                path.matmul(
                    rows / 16,
                    rows,
                    cols,
                    row_bytes,
                    &bytes,
                    &xq,
                    tokens,
                    &mut y,
                )
                .unwrap();
                for t in 0..tokens {
                    for r in 0..rows {
                        let row = &bytes[r * row_bytes..(r + 1) * row_bytes];
                        let want = crate::kernels::vec_dot_with(
                            Isa::Scalar,
                            ty,
                            row,
                            &xq[t * act..(t + 1) * act],
                        )
                        .unwrap();
                        assert_eq!(
                            y[t * rows + r].to_bits(),
                            want.to_bits(),
                            "{ty} {rows}x{cols} {isa:?} token {t} row {r}: {} vs {want}",
                            y[t * rows + r]
                        );
                    }
                }
            }
        }
    }
}

/// A matrix repacked in place from other bytes (a streamed expert's cache slot taking the
/// next expert) holds exactly what packing those bytes afresh gives, whatever it held.
#[test]
fn repacking_in_place_equals_packing_afresh() {
    for ty in TYPES {
        for (rows, cols) in shapes(ty, &[(32, 512)]) {
            let first = random_rows(ty, rows, cols, 41);
            let second = random_rows(ty, rows, cols, 42);
            let fresh = PackedMatrix::pack(ty, rows, cols, &second, |_| {}).unwrap();
            let mut reused = PackedMatrix::pack(ty, rows, cols, &first, |_| {}).unwrap();
            reused.repack_from(ty, &second, |_| {}).unwrap();
            assert!(reused.data[..] == fresh.data[..], "{ty}");
        }
    }
}
