//! Unicode helpers shared by the tokenizers: llama.cpp's coarse codepoint classes (the
//! `\p{L}`, `\p{N}`... its pre-tokenizers test, from the same Unicode version), the
//! White_Space set, the Han ranges of Kimi-K2's splitter and GPT-2's byte-to-unicode map.

use std::sync::OnceLock;

#[path = "unicode_data.rs"]
mod data;

/// The general category of a codepoint, grouped as llama.cpp groups it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Category {
    /// `Cn`: unassigned.
    Undefined = 1,
    /// `\p{N}`.
    Number,
    /// `\p{L}`.
    Letter,
    /// `\p{Z}`.
    Separator,
    /// `\p{M}`.
    Mark,
    /// `\p{P}`.
    Punctuation,
    /// `\p{S}`.
    Symbol,
    /// `\p{C}` other than `Cn`: controls, formats, private use, surrogates.
    Control,
}

/// A codepoint's [`Category`] and whether it is White_Space, in one byte.
/// [`CharFlags::NONE`] stands for "no codepoint" (a position past the end of the text).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct CharFlags(u8);

const WHITESPACE_BIT: u8 = 0x80;
const CATEGORY_MASK: u8 = 0x0F;

/// The Unicode White_Space property (PropList.txt), which is the set llama.cpp uses.
const WHITESPACE: [u32; 25] = [
    0x0009, 0x000A, 0x000B, 0x000C, 0x000D, 0x0020, 0x0085, 0x00A0, 0x1680, 0x2000, 0x2001, 0x2002,
    0x2003, 0x2004, 0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200A, 0x2028, 0x2029, 0x202F, 0x205F,
    0x3000,
];

const CODEPOINT_LIMIT: usize = 0x11_0000;

/// One byte of flags per codepoint (1.1 MB), built on first use.
fn flags_table() -> &'static [CharFlags] {
    static TABLE: OnceLock<Box<[CharFlags]>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = vec![CharFlags::NONE; CODEPOINT_LIMIT].into_boxed_slice();
        let ranges = &data::CATEGORY_RANGES;
        for (i, &(start, category)) in ranges.iter().enumerate() {
            let end = ranges.get(i + 1).map_or(CODEPOINT_LIMIT, |r| r.0 as usize);
            table[start as usize..end].fill(CharFlags(category as u8));
        }
        for cp in WHITESPACE {
            table[cp as usize].0 |= WHITESPACE_BIT;
        }
        table
    })
}

impl CharFlags {
    /// No codepoint at all: every predicate is false and [`CharFlags::exists`] too.
    pub(crate) const NONE: CharFlags = CharFlags(0);

    pub(crate) fn of(c: char) -> CharFlags {
        flags_table()[c as usize]
    }

    /// False only for [`CharFlags::NONE`]; every codepoint, even an unassigned one, exists.
    pub(crate) fn exists(self) -> bool {
        self.0 != 0
    }

    pub(crate) fn category(self) -> Option<Category> {
        Some(match self.0 & CATEGORY_MASK {
            1 => Category::Undefined,
            2 => Category::Number,
            3 => Category::Letter,
            4 => Category::Separator,
            5 => Category::Mark,
            6 => Category::Punctuation,
            7 => Category::Symbol,
            8 => Category::Control,
            _ => return None,
        })
    }

    fn is(self, category: Category) -> bool {
        self.0 & CATEGORY_MASK == category as u8
    }

    pub(crate) fn is_letter(self) -> bool {
        self.is(Category::Letter)
    }

    pub(crate) fn is_number(self) -> bool {
        self.is(Category::Number)
    }

    pub(crate) fn is_mark(self) -> bool {
        self.is(Category::Mark)
    }

    pub(crate) fn is_punctuation(self) -> bool {
        self.is(Category::Punctuation)
    }

    pub(crate) fn is_symbol(self) -> bool {
        self.is(Category::Symbol)
    }

    pub(crate) fn is_whitespace(self) -> bool {
        self.0 & WHITESPACE_BIT != 0
    }
}

/// The CJK ideograph blocks Kimi-K2's splitter calls Han (llama.cpp's `unicode_cpt_is_han`).
pub(crate) fn is_han(c: char) -> bool {
    matches!(c as u32,
        0x4E00..=0x9FFF        // CJK Unified Ideographs
        | 0x3400..=0x4DBF      // Extension A
        | 0x20000..=0x2A6DF    // Extension B
        | 0x2A700..=0x2B73F    // Extension C
        | 0x2B740..=0x2B81F    // Extension D
        | 0x2B820..=0x2CEAF    // Extension E
        | 0x2CEB0..=0x2EBEF    // Extension F
        | 0xF900..=0xFAFF      // Compatibility Ideographs
        | 0x2F800..=0x2FA1F) // Compatibility Ideographs Supplement
}

/// Bytes GPT-2's byte-level encoding maps to the codepoint of the same value.
const fn is_printable_byte(b: u8) -> bool {
    matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// The other 68 bytes map to U+0100, U+0101... in byte order.
const NON_PRINTABLE_BYTES: [u8; 68] = {
    let mut bytes = [0u8; 68];
    let (mut b, mut n) = (0usize, 0usize);
    while b < 256 {
        if !is_printable_byte(b as u8) {
            bytes[n] = b as u8;
            n += 1;
        }
        b += 1;
    }
    bytes
};

const BYTE_TO_CHAR: [char; 256] = {
    let mut chars = ['\0'; 256];
    let mut b = 0usize;
    while b < 256 {
        if is_printable_byte(b as u8) {
            chars[b] = b as u8 as char;
        }
        b += 1;
    }
    let mut n = 0usize;
    while n < NON_PRINTABLE_BYTES.len() {
        chars[NON_PRINTABLE_BYTES[n] as usize] = match char::from_u32(0x100 + n as u32) {
            Some(c) => c,
            None => panic!("U+0100..U+0143 are valid chars"),
        };
        n += 1;
    }
    chars
};

/// GPT-2's byte-level encoding of one byte (llama.cpp's `unicode_byte_to_utf8`).
pub(crate) fn byte_to_char(b: u8) -> char {
    BYTE_TO_CHAR[usize::from(b)]
}

/// The inverse of [`byte_to_char`]; `None` for a char no byte maps to.
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    let cp = c as u32;
    if cp < 0x100 {
        let b = cp as u8;
        return is_printable_byte(b).then_some(b);
    }
    let n = usize::try_from(cp - 0x100).ok()?;
    NON_PRINTABLE_BYTES.get(n).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories_match_llama_cpp_classes() {
        assert!(CharFlags::of('a').is_letter());
        assert!(CharFlags::of('é').is_letter());
        assert!(CharFlags::of('中').is_letter());
        assert!(CharFlags::of('7').is_number());
        assert!(CharFlags::of('½').is_number());
        assert!(CharFlags::of('\u{0301}').is_mark());
        assert!(CharFlags::of('!').is_punctuation());
        assert!(CharFlags::of('$').is_symbol());
        assert!(CharFlags::of('🦙').is_symbol());
        assert_eq!(CharFlags::of(' ').category(), Some(Category::Separator));
        assert_eq!(CharFlags::of('\n').category(), Some(Category::Control));
        // Unicode 15.1: U+2EBF0 (CJK Extension I) is assigned, U+1C89 (16.0) is not.
        assert!(CharFlags::of('\u{2EBF0}').is_letter());
        assert_eq!(
            CharFlags::of('\u{1C89}').category(),
            Some(Category::Undefined)
        );
        assert!(CharFlags::of('\u{10FFFF}').exists());
        assert!(!CharFlags::NONE.exists());
    }

    #[test]
    fn whitespace_is_unicode_white_space() {
        for c in [
            '\t', '\n', '\x0B', '\x0C', '\r', ' ', '\u{85}', '\u{A0}', '\u{3000}',
        ] {
            assert!(CharFlags::of(c).is_whitespace(), "{c:?}");
        }
        for c in ['\x1C', '\u{200B}', 'a', '\0'] {
            assert!(!CharFlags::of(c).is_whitespace(), "{c:?}");
        }
    }

    #[test]
    fn byte_map_round_trips() {
        assert_eq!(byte_to_char(b'A'), 'A');
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(0xAD), '\u{143}');
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(byte_to_char(b)), Some(b));
        }
        assert_eq!(char_to_byte('\u{144}'), None);
        assert_eq!(char_to_byte(' '), None);
    }
}
