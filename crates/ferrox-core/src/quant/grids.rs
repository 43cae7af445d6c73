//! The i-quant formats' codebooks: grid points that a block's indices select, eight (or
//! four) values each. They are part of the file format and cannot be derived, so
//! `scripts/gen-iq-grids.py` measures them from ggml's own dequantizers into `grids/*.bin`
//! (little endian, one point per u64 or u32, byte `j` the point's coordinate `j`).

/// IQ2_XXS: 256 points of 8 coordinates from {8, 25, 43}.
pub(crate) static IQ2XXS_GRID: [u64; 256] = IQ2XXS_POINTS;
/// IQ2_XS: 512 points of 8 coordinates.
pub(crate) static IQ2XS_GRID: [u64; 512] = IQ2XS_POINTS;
/// IQ2_S: 1024 points of 8 coordinates.
pub(crate) static IQ2S_GRID: [u64; 1024] = IQ2S_POINTS;
/// IQ3_XXS: 256 points of 4 coordinates.
pub(crate) static IQ3XXS_GRID: [u32; 256] = IQ3XXS_POINTS;
/// IQ3_S: 512 points of 4 coordinates.
pub(crate) static IQ3S_GRID: [u32; 512] = IQ3S_POINTS;
/// IQ1_S and IQ1_M: 2048 points of 8 signed coordinates (−1, 0, 1 as i8 bytes).
pub(crate) static IQ1S_GRID: [u64; 2048] = IQ1S_POINTS;

const IQ2XXS_POINTS: [u64; 256] = words64(include_bytes!("grids/iq2xxs.bin"));
const IQ2XS_POINTS: [u64; 512] = words64(include_bytes!("grids/iq2xs.bin"));
const IQ2S_POINTS: [u64; 1024] = words64(include_bytes!("grids/iq2s.bin"));
const IQ3XXS_POINTS: [u32; 256] = words32(include_bytes!("grids/iq3xxs.bin"));
const IQ3S_POINTS: [u32; 512] = words32(include_bytes!("grids/iq3s.bin"));
const IQ1S_POINTS: [u64; 2048] = words64(include_bytes!("grids/iq1s.bin"));

/// The largest coordinate of the IQ2 grids (checked by the tests below).
pub(crate) const IQ2_LARGEST: u8 = 43;
/// The largest coordinate of the IQ3_XXS grid.
pub(crate) const IQ3XXS_LARGEST: u8 = 62;
/// The largest coordinate of the IQ3_S grid.
pub(crate) const IQ3S_LARGEST: u8 = 15;

/// The grids with their format's largest coordinate `B` added to every coordinate, for
/// kernels that turn `±w` into the unsigned `B ± w` as `B + w` or `2B − (B + w)`.
pub(crate) static IQ2XXS_GRID_BIASED: [u64; 256] = plus64(IQ2XXS_POINTS, IQ2_LARGEST);
pub(crate) static IQ2XS_GRID_BIASED: [u64; 512] = plus64(IQ2XS_POINTS, IQ2_LARGEST);
pub(crate) static IQ2S_GRID_BIASED: [u64; 1024] = plus64(IQ2S_POINTS, IQ2_LARGEST);
pub(crate) static IQ3XXS_GRID_BIASED: [u32; 256] = plus32(IQ3XXS_POINTS, IQ3XXS_LARGEST);
pub(crate) static IQ3S_GRID_BIASED: [u32; 512] = plus32(IQ3S_POINTS, IQ3S_LARGEST);

/// IQ1_S and IQ1_M with 1 added to every coordinate: 0, 1, 2.
pub(crate) static IQ1S_GRID_PLUS_1: [u64; 2048] = plus64(IQ1S_POINTS, 1);
/// `8·(c + 1)`: 0, 8, 16 (a shift of the whole word: no byte exceeds 2 before it).
pub(crate) static IQ1S_GRID_PLUS_1_TIMES_8: [u64; 2048] = times8(plus64(IQ1S_POINTS, 1));

/// Every byte of every point plus `bias`, each byte on its own (wrapping, no carries).
const fn plus64<const N: usize>(mut grid: [u64; N], bias: u8) -> [u64; N] {
    let mut i = 0;
    while i < N {
        let mut bytes = grid[i].to_le_bytes();
        let mut j = 0;
        while j < 8 {
            bytes[j] = bytes[j].wrapping_add(bias);
            j += 1;
        }
        grid[i] = u64::from_le_bytes(bytes);
        i += 1;
    }
    grid
}

const fn times8<const N: usize>(mut grid: [u64; N]) -> [u64; N] {
    let mut i = 0;
    while i < N {
        assert!(grid[i] & 0xFCFC_FCFC_FCFC_FCFC == 0);
        grid[i] <<= 3;
        i += 1;
    }
    grid
}

/// As [`plus64`], for four-coordinate points.
const fn plus32<const N: usize>(mut grid: [u32; N], bias: u8) -> [u32; N] {
    let mut i = 0;
    while i < N {
        assert!(grid[i] & 0x8080_8080 == 0 && bias < 0x80);
        grid[i] += u32::from_le_bytes([bias; 4]);
        i += 1;
    }
    grid
}

/// The sign patterns of the IQ2/IQ3 formats: 7 stored bits, the eighth sign making the
/// number of negative values even.
pub(crate) static KSIGNS_IQ2XS: [u8; 128] = even_signs();

/// Byte `j` of point `i` (the point's coordinate `j`).
#[inline(always)]
pub(crate) fn coordinate(point: u64, j: usize) -> u8 {
    (point >> (8 * j)) as u8
}

const fn words64<const N: usize>(bytes: &[u8]) -> [u64; N] {
    assert!(bytes.len() == 8 * N, "grid file of the wrong size");
    let mut out = [0u64; N];
    let mut i = 0;
    while i < N {
        let mut w = [0u8; 8];
        let mut j = 0;
        while j < 8 {
            w[j] = bytes[8 * i + j];
            j += 1;
        }
        out[i] = u64::from_le_bytes(w);
        i += 1;
    }
    out
}

const fn words32<const N: usize>(bytes: &[u8]) -> [u32; N] {
    assert!(bytes.len() == 4 * N, "grid file of the wrong size");
    let mut out = [0u32; N];
    let mut i = 0;
    while i < N {
        out[i] = u32::from_le_bytes([
            bytes[4 * i],
            bytes[4 * i + 1],
            bytes[4 * i + 2],
            bytes[4 * i + 3],
        ]);
        i += 1;
    }
    out
}

const fn even_signs() -> [u8; 128] {
    let mut out = [0u8; 128];
    let mut i = 0;
    while i < 128 {
        let odd = (i as u32).count_ones() % 2 == 1;
        out[i] = i as u8 | if odd { 0x80 } else { 0 };
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn coordinates(grid: &[u64]) -> std::collections::BTreeSet<u8> {
        grid.iter()
            .flat_map(|&p| (0..8).map(move |j| coordinate(p, j)))
            .collect()
    }

    #[test]
    fn grids_hold_the_formats_levels_and_distinct_points() {
        assert_eq!(coordinates(&IQ2XXS_GRID), [8, 25, 43].into());
        assert_eq!(coordinates(&IQ2XS_GRID), [8, 25, 43].into());
        assert_eq!(coordinates(&IQ2S_GRID), [8, 25, 43].into());
        assert_eq!(coordinates(&IQ1S_GRID), [0x00, 0x01, 0xff].into());
        for grid in [&IQ2XXS_GRID[..], &IQ2XS_GRID, &IQ2S_GRID, &IQ1S_GRID] {
            let distinct: std::collections::BTreeSet<u64> = grid.iter().copied().collect();
            assert_eq!(distinct.len(), grid.len());
        }
        for grid in [&IQ3XXS_GRID[..], &IQ3S_GRID] {
            let distinct: std::collections::BTreeSet<u32> = grid.iter().copied().collect();
            assert_eq!(distinct.len(), grid.len());
        }
        let levels = |grid: &[u32]| -> std::collections::BTreeSet<u8> {
            grid.iter().flat_map(|p| p.to_le_bytes()).collect()
        };
        assert_eq!(levels(&IQ3XXS_GRID), [4, 12, 20, 28, 36, 44, 52, 62].into());
        assert_eq!(levels(&IQ3S_GRID), [1, 3, 5, 7, 9, 11, 13, 15].into());
        assert_eq!(coordinates(&IQ2XXS_GRID).last(), Some(&IQ2_LARGEST));
        assert_eq!(levels(&IQ3XXS_GRID).last(), Some(&IQ3XXS_LARGEST));
        assert_eq!(levels(&IQ3S_GRID).last(), Some(&IQ3S_LARGEST));
    }

    #[test]
    fn sign_patterns_have_an_even_number_of_minus_signs() {
        assert_eq!(&KSIGNS_IQ2XS[..8], &[0, 129, 130, 3, 132, 5, 6, 135]);
        assert!(KSIGNS_IQ2XS.iter().all(|s| s.count_ones() % 2 == 0));
    }
}
