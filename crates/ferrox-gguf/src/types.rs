//! The ggml tensor types a GGUF file can name, with their block geometry.
//!
//! The table follows ggml's `ggml_type` numbering (including the ids that were retired,
//! so a file carrying one is reported by name rather than as garbage). Block sizes are
//! ggml's own (`ggml-common.h`), which is the source of truth for on-disk layout.

use std::fmt;

/// A ggml tensor element type as stored in a GGUF tensor info.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    Iq2Xxs,
    Iq2Xs,
    Iq3Xxs,
    Iq1S,
    Iq4Nl,
    Iq3S,
    Iq2S,
    Iq4Xs,
    I8,
    I16,
    I32,
    I64,
    F64,
    Iq1M,
    Bf16,
    Tq1_0,
    Tq2_0,
    Mxfp4,
    Nvfp4,
    Q1_0,
    Q2_0,
    /// A type id ggml no longer supports (Q4_2, Q4_3, the interleaved Q4_0_x_y / IQ4_NL_x_y
    /// repacks) or one newer than this table. Its byte size is unknown.
    Other(u32),
}

/// (type, ggml id, name, elements per block, bytes per block)
const TABLE: &[(GgmlType, u32, &str, u32, u32)] = &[
    (GgmlType::F32, 0, "F32", 1, 4),
    (GgmlType::F16, 1, "F16", 1, 2),
    (GgmlType::Q4_0, 2, "Q4_0", 32, 18),
    (GgmlType::Q4_1, 3, "Q4_1", 32, 20),
    (GgmlType::Q5_0, 6, "Q5_0", 32, 22),
    (GgmlType::Q5_1, 7, "Q5_1", 32, 24),
    (GgmlType::Q8_0, 8, "Q8_0", 32, 34),
    (GgmlType::Q8_1, 9, "Q8_1", 32, 36),
    (GgmlType::Q2K, 10, "Q2_K", 256, 84),
    (GgmlType::Q3K, 11, "Q3_K", 256, 110),
    (GgmlType::Q4K, 12, "Q4_K", 256, 144),
    (GgmlType::Q5K, 13, "Q5_K", 256, 176),
    (GgmlType::Q6K, 14, "Q6_K", 256, 210),
    (GgmlType::Q8K, 15, "Q8_K", 256, 292),
    (GgmlType::Iq2Xxs, 16, "IQ2_XXS", 256, 66),
    (GgmlType::Iq2Xs, 17, "IQ2_XS", 256, 74),
    (GgmlType::Iq3Xxs, 18, "IQ3_XXS", 256, 98),
    (GgmlType::Iq1S, 19, "IQ1_S", 256, 50),
    (GgmlType::Iq4Nl, 20, "IQ4_NL", 32, 18),
    (GgmlType::Iq3S, 21, "IQ3_S", 256, 110),
    (GgmlType::Iq2S, 22, "IQ2_S", 256, 82),
    (GgmlType::Iq4Xs, 23, "IQ4_XS", 256, 136),
    (GgmlType::I8, 24, "I8", 1, 1),
    (GgmlType::I16, 25, "I16", 1, 2),
    (GgmlType::I32, 26, "I32", 1, 4),
    (GgmlType::I64, 27, "I64", 1, 8),
    (GgmlType::F64, 28, "F64", 1, 8),
    (GgmlType::Iq1M, 29, "IQ1_M", 256, 56),
    (GgmlType::Bf16, 30, "BF16", 1, 2),
    (GgmlType::Tq1_0, 34, "TQ1_0", 256, 54),
    (GgmlType::Tq2_0, 35, "TQ2_0", 256, 66),
    (GgmlType::Mxfp4, 39, "MXFP4", 32, 17),
    (GgmlType::Nvfp4, 40, "NVFP4", 64, 36),
    (GgmlType::Q1_0, 41, "Q1_0", 128, 18),
    (GgmlType::Q2_0, 42, "Q2_0", 64, 18),
];

/// Names of retired ids, so `inspect` can still say what a file holds.
const RETIRED: &[(u32, &str)] = &[
    (4, "Q4_2"),
    (5, "Q4_3"),
    (31, "Q4_0_4_4"),
    (32, "Q4_0_4_8"),
    (33, "Q4_0_8_8"),
    (36, "IQ4_NL_4_4"),
    (37, "IQ4_NL_4_8"),
    (38, "IQ4_NL_8_8"),
];

impl GgmlType {
    /// Every type with a known layout, in ggml id order.
    pub fn all_known() -> impl Iterator<Item = GgmlType> {
        TABLE.iter().map(|e| e.0)
    }

    fn entry(self) -> Option<&'static (GgmlType, u32, &'static str, u32, u32)> {
        TABLE.iter().find(|e| e.0 == self)
    }

    /// The type for a ggml id; ids outside the table become [`GgmlType::Other`].
    pub fn from_id(id: u32) -> GgmlType {
        TABLE
            .iter()
            .find(|e| e.1 == id)
            .map(|e| e.0)
            .unwrap_or(GgmlType::Other(id))
    }

    /// The type named as ggml names it (`"Q4_K"`, `"F16"`, case-insensitive).
    pub fn from_name(name: &str) -> Option<GgmlType> {
        TABLE
            .iter()
            .find(|e| e.2.eq_ignore_ascii_case(name))
            .map(|e| e.0)
    }

    pub fn id(self) -> u32 {
        match self {
            GgmlType::Other(id) => id,
            t => t.entry().map(|e| e.1).unwrap_or(u32::MAX),
        }
    }

    /// ggml's name (`"Q4_K"`), or `"type 4 (Q4_2, retired)"`-style text for other ids.
    pub fn name(self) -> std::borrow::Cow<'static, str> {
        match self {
            GgmlType::Other(id) => match RETIRED.iter().find(|r| r.0 == id) {
                Some((_, n)) => format!("{n} (retired type {id})").into(),
                None => format!("unknown type {id}").into(),
            },
            t => t.entry().map(|e| e.2).unwrap_or("?").into(),
        }
    }

    /// Elements per block (1 for plain scalar types); `None` for an unknown type.
    pub fn block_size(self) -> Option<u64> {
        self.entry().map(|e| u64::from(e.3))
    }

    /// Bytes per block; `None` for an unknown type.
    pub fn block_bytes(self) -> Option<u64> {
        self.entry().map(|e| u64::from(e.4))
    }

    /// Bytes taken by `n` elements, if `n` is a whole number of blocks and nothing overflows.
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        let bs = self.block_size()?;
        if !n.is_multiple_of(bs) {
            return None;
        }
        (n / bs).checked_mul(self.block_bytes()?)
    }

    pub fn is_quantized(self) -> bool {
        self.block_size().is_some_and(|b| b > 1)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_are_unique() {
        for t in GgmlType::all_known() {
            assert_eq!(GgmlType::from_id(t.id()), t);
            assert_eq!(GgmlType::from_name(&t.name()), Some(t));
        }
        let mut ids: Vec<u32> = GgmlType::all_known().map(|t| t.id()).collect();
        ids.dedup();
        assert_eq!(ids.len(), TABLE.len());
    }

    #[test]
    fn retired_and_unknown_ids_are_named() {
        assert_eq!(GgmlType::from_id(4), GgmlType::Other(4));
        assert!(GgmlType::from_id(4).name().contains("Q4_2"));
        assert!(GgmlType::from_id(999).name().contains("999"));
        assert_eq!(GgmlType::Other(999).block_bytes(), None);
    }

    #[test]
    fn byte_sizes_need_whole_blocks() {
        assert_eq!(GgmlType::Q4K.bytes_for(512), Some(288));
        assert_eq!(GgmlType::Q4K.bytes_for(100), None);
        assert_eq!(GgmlType::F32.bytes_for(3), Some(12));
        assert_eq!(GgmlType::F32.bytes_for(u64::MAX), None);
    }
}
