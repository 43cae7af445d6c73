//! SentencePiece's precompiled character map (`tokenizer.ggml.precompiled_charsmap`): a
//! table of input byte strings and their normalized replacements (NFKC folding, full-width
//! to ASCII, control character removal...), as llama.cpp's UGM normalizer reads it.
//!
//! Layout: a little-endian u32 `n`, then `n` bytes of XOR-compressed compact double array
//! (XCDA; Kanda, 2018) units, each a bit-packed u32, then NUL-terminated replacement
//! strings that the leaves of the XCDA index into.

use super::TokenizerError;

#[derive(Debug)]
pub(crate) struct PrecompiledCharsmap {
    units: Vec<u32>,
    replacements: Vec<u8>,
}

/// One unit of the double array.
#[derive(Clone, Copy)]
struct Unit(u32);

impl Unit {
    /// BASE: where the children's indices start (XORed with their byte); bit 9 says the
    /// stored value is shifted by 8.
    fn base(self) -> u32 {
        (self.0 >> 10) << ((self.0 & (1 << 9)) >> 6)
    }

    /// LCHECK: the byte on the edge into this unit. Value units keep bit 31, so they never
    /// match a byte.
    fn label(self) -> u32 {
        self.0 & ((1 << 31) | 0xff)
    }

    /// Whether a key ends here (then `base` leads to the unit holding the value).
    fn has_leaf(self) -> bool {
        (self.0 >> 8) & 1 == 1
    }

    /// The value: an offset into the replacement strings.
    fn value(self) -> u32 {
        self.0 & ((1 << 31) - 1)
    }
}

impl PrecompiledCharsmap {
    pub(crate) fn new(blob: &[u8]) -> Result<Self, TokenizerError> {
        let invalid = |what: &str| TokenizerError::Invalid(format!("precompiled_charsmap: {what}"));
        let header: [u8; 4] = blob
            .get(..4)
            .and_then(|h| h.try_into().ok())
            .ok_or_else(|| invalid("shorter than its header"))?;
        let units_len = u32::from_le_bytes(header) as usize;
        let units_bytes = blob
            .get(4..)
            .and_then(|rest| rest.get(..units_len))
            .ok_or_else(|| invalid("the double array runs past the end"))?;
        let units = units_bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let replacements = blob[4 + units_len..].to_vec();
        Ok(PrecompiledCharsmap {
            units,
            replacements,
        })
    }

    fn unit(&self, index: u32) -> Option<Unit> {
        self.units.get(index as usize).copied().map(Unit)
    }

    /// The longest key that is a prefix of `input`: its length and its replacement.
    ///
    /// Keys never contain NUL. llama.cpp throws where the map is malformed (an index past
    /// the array, a replacement offset past the strings or an unterminated string); here
    /// the walk stops at such a unit or the match is dropped, so the input passes through
    /// unchanged.
    pub(crate) fn longest_match(&self, input: &[u8]) -> Option<(usize, &[u8])> {
        let mut node = self.unit(0)?.base();
        let mut best = None;
        for (depth, &byte) in input.iter().enumerate() {
            if byte == 0 {
                break;
            }
            node ^= u32::from(byte);
            let Some(unit) = self.unit(node) else { break };
            if unit.label() != u32::from(byte) {
                break;
            }
            node ^= unit.base();
            if unit.has_leaf() {
                let Some(value_unit) = self.unit(node) else {
                    break;
                };
                best = Some((depth + 1, value_unit.value()));
            }
        }
        let (len, offset) = best?;
        let tail = self.replacements.get(offset as usize..)?;
        let end = tail.iter().position(|&b| b == 0)?;
        Some((len, &tail[..end]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds a tiny map by hand: "a" -> "x", "ab" -> "yz".
    ///
    /// Root at unit 0 with BASE 1: child 'a' (0x61) at 1 ^ 0x61 = 0x60. Unit 0x60 has
    /// LCHECK 'a', a leaf, and BASE 0x100: its value unit is at 0x60 ^ 0x100 = 0x160, and
    /// its child 'b' at 0x160 ^ 0x62 = 0x102, with LCHECK 'b', a leaf and BASE 0x300, so
    /// its value is at 0x102 ^ 0x300 = 0x202.
    fn tiny() -> Vec<u8> {
        let mut units = vec![0u32; 0x203];
        let pack =
            |base: u32, leaf: bool, label: u32| (base << 10) | (u32::from(leaf) << 8) | label;
        units[0] = pack(1, false, 0);
        units[0x60] = pack(0x100, true, u32::from(b'a'));
        units[0x160] = 1 << 31; // value: offset 0
        units[0x102] = pack(0x300, true, u32::from(b'b'));
        units[0x202] = (1 << 31) | 2; // value: offset 2
        let mut blob = ((units.len() * 4) as u32).to_le_bytes().to_vec();
        for u in units {
            blob.extend_from_slice(&u.to_le_bytes());
        }
        blob.extend_from_slice(b"x\0yz\0");
        blob
    }

    #[test]
    fn finds_longest_replacement() {
        let map = PrecompiledCharsmap::new(&tiny()).unwrap();
        assert_eq!(map.longest_match(b"a"), Some((1, &b"x"[..])));
        assert_eq!(map.longest_match(b"abc"), Some((2, &b"yz"[..])));
        assert_eq!(map.longest_match(b"ac"), Some((1, &b"x"[..])));
        assert_eq!(map.longest_match(b"b"), None);
        assert_eq!(map.longest_match(b""), None);
    }

    #[test]
    fn malformed_maps_do_not_panic() {
        assert!(PrecompiledCharsmap::new(b"").is_err());
        assert!(PrecompiledCharsmap::new(&[8, 0, 0, 0, 1]).is_err());
        let mut blob = tiny();
        // Drop the replacement strings' terminator: the match is dropped.
        blob.pop();
        let map = PrecompiledCharsmap::new(&blob).unwrap();
        assert_eq!(map.longest_match(b"ab"), None);
        // Random units never panic.
        let mut state = 1u32;
        let mut blob = 4096u32.to_le_bytes().to_vec();
        for _ in 0..4096 + 64 {
            state = state.wrapping_mul(1_103_515_245).wrapping_add(12345);
            blob.push((state >> 16) as u8);
        }
        let map = PrecompiledCharsmap::new(&blob).unwrap();
        for b in 0..=255u8 {
            let _ = map.longest_match(&[b, b.wrapping_add(1), 0x80, 0xff]);
        }
    }
}
