//! The reference kernel over packed groups: the arithmetic every other kernel reproduces
//! bit for bit. Per row, token and block: the exact integer `Σ (c − bias)·x` of the
//! unsigned codes `c`, then `acc = fma(dw·dy, sum, acc)` in block order (NVFP4: per
//! 16 values, with that sub-block's scale).

use super::layout::id::{
    I8K, IQ4_NL, IQ4_XS, MXFP4, NVFP4, Q1_0, Q2K, Q2_0, Q3K, Q4K, Q4_0, Q4_1, Q5K, Q5_0, Q5_1, Q6K,
    Q8_0, TQ2_0,
};
use super::layout::{
    affine_k_codes_at, iq4xs_codes_at, nvfp4_scales_at, q1_0_plane_at, q2k_codes_at, q3k_high_at,
    q3k_low_at, q6k_high_at, q6k_low_at, tq2_codes_at, ACTIVATION_BLOCK_BYTES, ACT_SCALE_AT,
    ACT_SUM_AT, I8K_CODES_AT, I8K_SCALES_AT, IQ4NL_CODES, IQ4XS_SCALES_AT, MXFP4_CODES,
    Q2K_DMIN_AT, Q2K_SCALES_AT, Q3K_SCALES_AT, Q4K_DMIN_AT, Q4K_MINS_AT, Q4K_SCALES_AT,
    Q5K_PLANES_AT, Q6K_SCALES_AT, Q8K_CODES_AT, Q8K_SUMS_AT, QK_K, SCALES_BYTES,
};
use super::{GroupsFn, PackedFormat, GROUP_ROWS, QK};

pub(super) fn kernel(format: PackedFormat) -> GroupsFn {
    match format {
        PackedFormat::Q4_0 => groups::<{ Q4_0 }>,
        PackedFormat::Q5_0 => groups::<{ Q5_0 }>,
        PackedFormat::Q4_1 => groups::<{ Q4_1 }>,
        PackedFormat::Q5_1 => groups::<{ Q5_1 }>,
        PackedFormat::Q8_0 => groups::<{ Q8_0 }>,
        PackedFormat::Mxfp4 => groups::<{ MXFP4 }>,
        PackedFormat::Iq4Nl => groups::<{ IQ4_NL }>,
        PackedFormat::Q4K => groups::<{ Q4K }>,
        PackedFormat::Q5K => groups::<{ Q5K }>,
        PackedFormat::Q6K => groups::<{ Q6K }>,
        PackedFormat::Q2K => groups::<{ Q2K }>,
        PackedFormat::Q3K => groups::<{ Q3K }>,
        PackedFormat::I8K => groups::<{ I8K }>,
        PackedFormat::Iq4Xs => groups::<{ IQ4_XS }>,
        PackedFormat::Tq2_0 | PackedFormat::Tq1_0 => groups::<{ TQ2_0 }>,
        PackedFormat::Q1_0 => groups::<{ Q1_0 }>,
        PackedFormat::Q2_0 => groups::<{ Q2_0 }>,
        PackedFormat::Nvfp4 => groups::<{ NVFP4 }>,
    }
}

/// The unsigned code of value `i` of row `r` in one group block.
pub(super) fn code(format: PackedFormat, block: &[u8], r: usize, i: usize) -> u8 {
    let codes = &block[format.codes_at()..];
    match format {
        PackedFormat::Q1_0 => {
            2 * (block[q1_0_plane_at(i / 32) + 4 * r + i % 4] >> (i % 32 / 4) & 1)
        }
        PackedFormat::Q2_0 => codes[64 * (i / 16) + 4 * r + i % 4] >> (2 * (i % 16 / 4)) & 3,
        PackedFormat::Q8_0 => codes[64 * (i / 4) + 4 * r + i % 4],
        PackedFormat::Q4_0 | PackedFormat::Q4_1 => nibble(codes, r, i),
        PackedFormat::Mxfp4 => MXFP4_CODES[usize::from(nibble(codes, r, i))],
        PackedFormat::Nvfp4 => {
            MXFP4_CODES[usize::from(nibble(&codes[256 * (i / 32)..], r, i % 32))]
        }
        PackedFormat::Iq4Nl => IQ4NL_CODES[usize::from(nibble(codes, r, i))],
        PackedFormat::Q5_0 | PackedFormat::Q5_1 => {
            let fifth = codes[4 * r + i % 4] >> (i / 4) & 1;
            nibble(&codes[64..], r, i) | fifth << 4
        }
        PackedFormat::Q4K
        | PackedFormat::Q5K
        | PackedFormat::Q6K
        | PackedFormat::Q2K
        | PackedFormat::Q3K
        | PackedFormat::Iq4Xs
        | PackedFormat::Tq2_0
        | PackedFormat::Tq1_0
        | PackedFormat::I8K => unreachable!("256-value formats: see k_code"),
    }
}

fn nibble(nibbles: &[u8], r: usize, i: usize) -> u8 {
    let byte = nibbles[64 * (i % 16 / 4) + 4 * r + i % 4];
    if i < 16 {
        byte & 0x0F
    } else {
        byte >> 4
    }
}

/// # Safety
/// See [`GroupsFn`].
unsafe fn groups<const FORMAT: u8>(
    w: *const u8,
    groups: usize,
    blocks: usize,
    xs: &[*const u8],
    out: *mut f32,
    out_stride: usize,
) {
    let format = PackedFormat::from_id(FORMAT);
    let (gb, ab) = (format.group_block_bytes(), format.activation_block_bytes());
    // SAFETY: the caller's contract: whole groups.
    let w = unsafe { std::slice::from_raw_parts(w, groups * blocks * gb) };
    for g in 0..groups {
        for (t, &x) in xs.iter().enumerate() {
            // SAFETY: the caller's contract: whole activation rows.
            let x = unsafe { std::slice::from_raw_parts(x, blocks * ab) };
            for r in 0..GROUP_ROWS {
                let mut acc = 0f32;
                for b in 0..blocks {
                    let block = &w[(g * blocks + b) * gb..][..gb];
                    let a = &x[b * ab..][..ab];
                    acc = if format.is_k() {
                        k_block(format, block, r, a, acc)
                    } else {
                        legacy_block(format, block, r, a, acc)
                    };
                }
                // SAFETY: the caller's contract.
                unsafe { out.add(t * out_stride + g * GROUP_ROWS + r).write(acc) };
            }
        }
    }
}

/// Row `r` of a 32-value format's group block against its activation blocks `a` (one per
/// 32 values), into `acc`, one activation block after the other.
fn legacy_block(format: PackedFormat, block: &[u8], r: usize, a: &[u8], acc: f32) -> f32 {
    a.chunks_exact(ACTIVATION_BLOCK_BYTES)
        .enumerate()
        .fold(acc, |acc, (k, a)| legacy_part(format, block, r, k, a, acc))
}

/// Part `k` (values `32k..32k + 32`) of [`legacy_block`] against its activation block `a`.
fn legacy_part(format: PackedFormat, block: &[u8], r: usize, k: usize, a: &[u8], acc: f32) -> f32 {
    if format == PackedFormat::Nvfp4 {
        return nvfp4_part(block, r, k, a, acc);
    }
    let mut sum = 0i32;
    for (i, &x) in a[..QK].iter().enumerate() {
        sum += i32::from(code(format, block, r, QK * k + i)) * i32::from(x as i8);
    }
    let x_sum = i32::from_le_bytes(a[ACT_SUM_AT..].try_into().unwrap());
    sum -= format.bias() * x_sum;
    let dy = f32::from_le_bytes(a[ACT_SCALE_AT..ACT_SUM_AT].try_into().unwrap());
    let dw = if format.has_f32_scales() {
        f32::from_le_bytes(block[4 * r..4 * r + 4].try_into().unwrap())
    } else {
        f16_at(block, 2 * r)
    };
    let acc = (dw * dy).mul_add(sum as f32, acc);
    if format.has_min() {
        (f16_at(block, SCALES_BYTES + 2 * r) * dy).mul_add(x_sum as f32, acc)
    } else {
        acc
    }
}

/// [`legacy_part`] for NVFP4: each half of the part (sub-blocks `2k` and `2k + 1`) its
/// own exact sum, less the bias times its half of the activations' sum, and its own
/// fused multiply-add.
fn nvfp4_part(block: &[u8], r: usize, k: usize, a: &[u8], mut acc: f32) -> f32 {
    let format = PackedFormat::Nvfp4;
    let dy = f32::from_le_bytes(a[ACT_SCALE_AT..ACT_SUM_AT].try_into().unwrap());
    let half_sums = [i16_at(a, ACT_SUM_AT), i16_at(a, ACT_SUM_AT + 2)];
    for (half, x_sum) in half_sums.into_iter().enumerate() {
        let values = 16 * half..16 * half + 16;
        let sum: i32 = (values.clone().zip(&a[values]))
            .map(|(i, &x)| i32::from(code(format, block, r, QK * k + i)) * i32::from(x as i8))
            .sum::<i32>()
            - format.bias() * x_sum;
        let dw = f16_at(block, nvfp4_scales_at(2 * k + half) + 2 * r);
        acc = (dw * dy).mul_add(sum as f32, acc);
    }
    acc
}

fn f16_at(block: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([block[at], block[at + 1]]).to_f32()
}

fn i16_at(bytes: &[u8], at: usize) -> i32 {
    i32::from(i16::from_le_bytes([bytes[at], bytes[at + 1]]))
}

/// The unsigned code of value `e` of row `r` in one group block of a 256-value format.
pub(super) fn k_code(format: PackedFormat, block: &[u8], r: usize, e: usize) -> u8 {
    // Q2_K and Q3_K: two low bits by sub-block and quad (see `layout.rs`).
    let two_bits = |at: usize| block[at + 4 * r + e % 4] >> (2 * (e % 16 / 4)) & 3;
    if format == PackedFormat::I8K {
        block[I8K_CODES_AT + 64 * (e / 4) + 4 * r + e % 4]
    } else if format == PackedFormat::Iq4Xs {
        IQ4NL_CODES[usize::from(nibble(&block[iq4xs_codes_at(e / 32)..], r, e % 32))]
    } else if format == PackedFormat::Q2K {
        two_bits(q2k_codes_at(e / 16))
    } else if format == PackedFormat::Tq2_0 {
        two_bits(tq2_codes_at(e / 16))
    } else if format == PackedFormat::Q3K {
        let third = block[q3k_high_at(e / 32) + 4 * r + e % 4] >> (e % 32 / 4) & 1;
        two_bits(q3k_low_at(e / 16)) | third << 2
    } else if format.is_affine_k() {
        let (j, i) = (e / 64, e % 64);
        let fifth = format == PackedFormat::Q5K;
        let codes_at = affine_k_codes_at(fifth);
        let byte = block[codes_at + 64 * (8 * j + i % 32 / 4) + 4 * r + i % 4];
        let nibble = byte >> (4 * (i / 32)) & 15;
        if !fifth {
            return nibble;
        }
        let (s, k, j) = (e / 32, e % 32 / 4, e % 4);
        let plane = block[Q5K_PLANES_AT + 64 * k + 4 * r + j];
        nibble | (plane >> s & 1) << 4
    } else {
        let (q, j) = (e / 4, e % 4);
        let low = block[q6k_low_at(q / 2) + 4 * r + j] >> (4 * (q % 2)) & 15;
        let high = block[q6k_high_at(q / 4) + 4 * r + j] >> (2 * (q % 4)) & 3;
        low | high << 4
    }
}

/// Row `r` of a K-quant group block against Q8_K block `a`, into `acc`:
/// `Σ scale·Σ code·x` (and for Q4_K/Q5_K/Q2_K `Σ min·Σ x`, for Q6_K `32·Σ scale·Σ x`, for
/// Q3_K `4·Σ scale·Σ x`, for I8K `64·Σ scale·Σ x` subtracted), then one fused multiply-add
/// per sum.
fn k_block(format: PackedFormat, block: &[u8], r: usize, a: &[u8], acc: f32) -> f32 {
    if matches!(format, PackedFormat::Q2K | PackedFormat::Q3K) {
        return low_bit_k_block(format, block, r, a, acc);
    }
    if format == PackedFormat::Tq2_0 {
        return ternary_block(block, r, a, acc);
    }
    // IQ4_XS: scales per 32 values like Q4_K's, signed and without minimums.
    let iq4xs = format == PackedFormat::Iq4Xs;
    let q4k = format.is_affine_k() || iq4xs;
    let dy = f32::from_le_bytes(a[..4].try_into().unwrap());
    let codes = &a[Q8K_CODES_AT..Q8K_CODES_AT + QK_K];
    let sub = if q4k { 32 } else { 16 };
    let mut scaled = 0i32;
    let mut other = 0i32;
    for s in 0..QK_K / sub {
        let sum: i32 = (s * sub..(s + 1) * sub)
            .zip(&codes[s * sub..])
            .map(|(e, &x)| i32::from(k_code(format, block, r, e)) * i32::from(x as i8))
            .sum();
        if iq4xs {
            let scale = i32::from(block[IQ4XS_SCALES_AT + GROUP_ROWS * s + r] as i8);
            let x_sum = i16_at(a, Q8K_SUMS_AT + 4 * s) + i16_at(a, Q8K_SUMS_AT + 4 * s + 2);
            scaled += scale * sum;
            other += scale * x_sum;
        } else if q4k {
            let scale = i32::from(block[Q4K_SCALES_AT + GROUP_ROWS * s + r]);
            let min = i32::from(block[Q4K_MINS_AT + GROUP_ROWS * s + r]);
            let x_sum = i16_at(a, Q8K_SUMS_AT + 4 * s) + i16_at(a, Q8K_SUMS_AT + 4 * s + 2);
            scaled += scale * sum;
            other += min * x_sum;
        } else {
            // Q6_K and I8K keep their scales alike.
            const _: () = assert!(Q6K_SCALES_AT == I8K_SCALES_AT);
            let at = Q6K_SCALES_AT + 32 * (s / 2) + 2 * r + s % 2;
            let scale = i32::from(block[at] as i8);
            scaled += scale * sum;
            other += scale * i16_at(a, Q8K_SUMS_AT + 2 * s);
        }
    }
    let dw = f16_at(block, 2 * r);
    if iq4xs {
        (dw * dy).mul_add((scaled - format.bias() * other) as f32, acc)
    } else if q4k {
        let dmin = f16_at(block, Q4K_DMIN_AT + 2 * r);
        let acc = (dw * dy).mul_add(scaled as f32, acc);
        (-(dmin * dy)).mul_add(other as f32, acc)
    } else {
        (dw * dy).mul_add((scaled - format.bias() * other) as f32, acc)
    }
}

/// [`k_block`] for Q2_K and Q3_K (sub-blocks of 16 values): per sub-block the exact
/// `Σ code·x`, times the sub-block's scale; Q2_K's minimums against the activation's sums
/// of 16 go to a second sum with `dmin`, Q3_K's offset of 4 comes off the first.
fn low_bit_k_block(format: PackedFormat, block: &[u8], r: usize, a: &[u8], acc: f32) -> f32 {
    let dy = f32::from_le_bytes(a[..4].try_into().unwrap());
    let codes = &a[Q8K_CODES_AT..Q8K_CODES_AT + QK_K];
    let mut scaled = 0i32;
    let mut other = 0i32;
    for s in 0..16 {
        let sum: i32 = (16 * s..16 * s + 16)
            .zip(&codes[16 * s..])
            .map(|(e, &x)| i32::from(k_code(format, block, r, e)) * i32::from(x as i8))
            .sum();
        let x_sum = i16_at(a, Q8K_SUMS_AT + 2 * s);
        let pair_at = 32 * (s / 2) + 2 * r + s % 2;
        if format == PackedFormat::Q2K {
            let byte = block[Q2K_SCALES_AT + pair_at];
            scaled += i32::from(byte & 15) * sum;
            other += i32::from(byte >> 4) * x_sum;
        } else {
            let scale = i32::from(block[Q3K_SCALES_AT + pair_at] as i8);
            scaled += scale * sum;
            other += scale * x_sum;
        }
    }
    let dw = f16_at(block, 2 * r);
    if format == PackedFormat::Q2K {
        let dmin = f16_at(block, Q2K_DMIN_AT + 2 * r);
        let acc = (dw * dy).mul_add(scaled as f32, acc);
        (-(dmin * dy)).mul_add(other as f32, acc)
    } else {
        (dw * dy).mul_add((scaled - 4 * other) as f32, acc)
    }
}

/// [`k_block`] for TQ2_0: the exact `Σ (code − 1)·x` over the super-block (the codes
/// against the activations, less the activations' sum), then one fused multiply-add.
fn ternary_block(block: &[u8], r: usize, a: &[u8], acc: f32) -> f32 {
    let format = PackedFormat::Tq2_0;
    let dy = f32::from_le_bytes(a[..4].try_into().unwrap());
    let codes = &a[Q8K_CODES_AT..Q8K_CODES_AT + QK_K];
    let sum: i32 = codes
        .iter()
        .enumerate()
        .map(|(e, &x)| i32::from(k_code(format, block, r, e)) * i32::from(x as i8))
        .sum();
    let x_sum: i32 = (0..16).map(|s| i16_at(a, Q8K_SUMS_AT + 2 * s)).sum();
    (f16_at(block, 2 * r) * dy).mul_add((sum - format.bias() * x_sum) as f32, acc)
}
