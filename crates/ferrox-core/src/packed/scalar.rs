//! The reference kernel over packed groups: the arithmetic every other kernel reproduces
//! bit for bit. Per row, token and block: the exact integer `Σ (c − bias)·x` of the
//! unsigned codes `c`, then `acc = fma(dw·dy, sum, acc)` in block order.

use super::{
    GroupsFn, PackedFormat, ACTIVATION_BLOCK_BYTES, ACT_SCALE_AT, ACT_SUM_AT, GROUP_ROWS, QK,
    SCALES_BYTES,
};

pub(super) fn kernel(format: PackedFormat) -> GroupsFn {
    match format {
        PackedFormat::Q4_0 => groups::<{ Q4_0 }>,
        PackedFormat::Q5_0 => groups::<{ Q5_0 }>,
        PackedFormat::Q8_0 => groups::<{ Q8_0 }>,
    }
}

const Q4_0: u8 = 0;
const Q5_0: u8 = 1;
const Q8_0: u8 = 2;

fn format_of(id: u8) -> PackedFormat {
    match id {
        Q4_0 => PackedFormat::Q4_0,
        Q5_0 => PackedFormat::Q5_0,
        _ => PackedFormat::Q8_0,
    }
}

/// The unsigned code of value `i` of row `r` in one group block.
pub(super) fn code(format: PackedFormat, block: &[u8], r: usize, i: usize) -> u8 {
    let codes = &block[SCALES_BYTES..];
    match format {
        PackedFormat::Q8_0 => codes[64 * (i / 4) + 4 * r + i % 4],
        PackedFormat::Q4_0 => nibble(codes, r, i),
        PackedFormat::Q5_0 => {
            let mask = u64::from_le_bytes(codes[8 * (i / 4)..8 * (i / 4) + 8].try_into().unwrap());
            let fifth = (mask >> (4 * r + i % 4) & 1) as u8;
            nibble(&codes[64..], r, i) | fifth << 4
        }
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
    let format = format_of(FORMAT);
    let gb = format.group_block_bytes();
    // SAFETY: the caller's contract: whole groups.
    let w = unsafe { std::slice::from_raw_parts(w, groups * blocks * gb) };
    for g in 0..groups {
        for (t, &x) in xs.iter().enumerate() {
            // SAFETY: the caller's contract: whole activation rows.
            let x = unsafe { std::slice::from_raw_parts(x, blocks * ACTIVATION_BLOCK_BYTES) };
            for r in 0..GROUP_ROWS {
                let mut acc = 0f32;
                for b in 0..blocks {
                    let block = &w[(g * blocks + b) * gb..][..gb];
                    let a = &x[b * ACTIVATION_BLOCK_BYTES..][..ACTIVATION_BLOCK_BYTES];
                    let mut sum = 0i32;
                    for (i, &x) in a[..QK].iter().enumerate() {
                        sum += i32::from(code(format, block, r, i)) * i32::from(x as i8);
                    }
                    let x_sum = i32::from_le_bytes(a[ACT_SUM_AT..].try_into().unwrap());
                    sum -= format.bias() * x_sum;
                    let dy = f32::from_le_bytes(a[ACT_SCALE_AT..ACT_SUM_AT].try_into().unwrap());
                    let dw = half::f16::from_le_bytes([block[2 * r], block[2 * r + 1]]).to_f32();
                    acc = (dw * dy).mul_add(sum as f32, acc);
                }
                // SAFETY: the caller's contract.
                unsafe { out.add(t * out_stride + g * GROUP_ROWS + r).write(acc) };
            }
        }
    }
}
