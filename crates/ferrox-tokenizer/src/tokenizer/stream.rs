//! Incremental detokenization of generated tokens.
//!
//! A token may carry part of a character (byte-fallback tokens, byte-level BPE pieces), so
//! text is released only once it is complete UTF-8. Bytes that can never become a
//! character are replaced as soon as that is certain; an incomplete character at the end
//! waits for the next token, or for [`StreamDecoder::flush`]. What comes out, all pieces
//! together, is [`lossy_utf8`] of all the bytes, never one U+FFFD per byte of a character
//! cut across tokens.
//!
//! Invalid bytes are replaced as llama-server's text shows them, which is not Rust's
//! `from_utf8_lossy`: a lead byte announces its length by its bits alone (`F5`-`F7` are
//! four-byte leads there, `C0`/`C1` two-byte ones), and the bytes up to the first that is
//! not a continuation are one U+FFFD (`F5 8E |` is one replacement, then `|`); a sequence of
//! the announced length that is still not a character (overlong, a surrogate, past
//! U+10FFFF) is one U+FFFD per byte.
//!
//! Each token is rendered as llama.cpp renders a generated token (`common_token_to_piece`):
//! no leading-space strip and no `clean_spaces` fix-ups, which only make sense for a whole
//! text ([`Tokenizer::decode`]).

use super::{TokenId, Tokenizer};

/// Turns a stream of token ids into a stream of complete UTF-8 text.
pub struct StreamDecoder<'t> {
    tokenizer: &'t Tokenizer,
    special: bool,
    utf8: Utf8Stream,
}

impl<'t> StreamDecoder<'t> {
    /// A decoder that renders control tokens as their text when `special` is set.
    pub fn new(tokenizer: &'t Tokenizer, special: bool) -> StreamDecoder<'t> {
        StreamDecoder {
            tokenizer,
            special,
            utf8: Utf8Stream::default(),
        }
    }

    /// Adds one token; returns the text it completes (possibly empty).
    pub fn push(&mut self, id: TokenId) -> &str {
        let piece = self.tokenizer.piece(id, self.special);
        self.utf8.push(piece)
    }

    /// Adds raw bytes; returns the text they complete (possibly empty).
    pub fn push_bytes(&mut self, bytes: &[u8]) -> &str {
        self.utf8.push(bytes)
    }

    /// Whether bytes of an incomplete character are waiting.
    pub fn has_pending(&self) -> bool {
        !self.utf8.pending.is_empty()
    }

    /// Ends the stream: an incomplete character left over becomes one U+FFFD.
    pub fn flush(&mut self) -> &str {
        self.utf8.flush()
    }

    /// Ends the stream dropping an incomplete character left over (a generation cut off
    /// in the middle of a character, as llama-server leaves it out); returns whether there
    /// was one.
    pub fn discard_incomplete(&mut self) -> bool {
        let had = !self.utf8.pending.is_empty();
        self.utf8.pending.clear();
        had
    }
}

/// The byte-level half of [`StreamDecoder`].
#[derive(Default)]
struct Utf8Stream {
    /// Bytes received but not yet released: at most an incomplete character.
    pending: Vec<u8>,
    /// The text released by the last call.
    out: String,
}

/// What starts at the front of some bytes, by llama.cpp's reading of UTF-8.
#[derive(Debug, PartialEq, Eq)]
enum Front {
    /// A character of this many bytes.
    Char(usize),
    /// More bytes are needed to tell.
    Incomplete,
    /// An invalid run of this many bytes: one U+FFFD.
    Invalid(usize),
    /// A sequence of the announced length that is no character: one U+FFFD per byte.
    Rejected(usize),
}

fn front(bytes: &[u8]) -> Front {
    let Some(&lead) = bytes.first() else {
        return Front::Incomplete;
    };
    let len = match lead {
        0x00..=0x7f => return Front::Char(1),
        0x80..=0xbf => return Front::Invalid(1),
        0xc0..=0xdf => 2,
        0xe0..=0xef => 3,
        0xf0..=0xf7 => 4,
        0xf8..=0xff => return Front::Invalid(1),
    };
    for i in 1..len {
        match bytes.get(i) {
            None => return Front::Incomplete,
            Some(b) if b & 0xc0 != 0x80 => return Front::Invalid(i),
            Some(_) => {}
        }
    }
    match std::str::from_utf8(&bytes[..len]) {
        Ok(_) => Front::Char(len),
        Err(_) => Front::Rejected(len),
    }
}

/// The text llama-server shows for `bytes` (see the module notes); an incomplete character
/// at the end is one U+FFFD.
pub fn lossy_utf8(bytes: &[u8]) -> String {
    let mut utf8 = Utf8Stream::default();
    let mut out = utf8.push(bytes).to_string();
    out.push_str(utf8.flush());
    out
}

impl Utf8Stream {
    fn push(&mut self, bytes: &[u8]) -> &str {
        self.out.clear();
        self.pending.extend_from_slice(bytes);
        let mut at = 0;
        while at < self.pending.len() {
            // Runs of valid text go in whole.
            let valid = match std::str::from_utf8(&self.pending[at..]) {
                Ok(s) => s.len(),
                Err(e) => e.valid_up_to(),
            };
            let text = std::str::from_utf8(&self.pending[at..at + valid]).unwrap_or_default();
            self.out.push_str(text);
            at += valid;
            match front(&self.pending[at..]) {
                Front::Char(n) => {
                    // Not reached after an invalid run (which is no character), kept for
                    // completeness.
                    let text = std::str::from_utf8(&self.pending[at..at + n]).unwrap_or_default();
                    self.out.push_str(text);
                    at += n;
                }
                Front::Incomplete => break,
                Front::Invalid(n) => {
                    self.out.push(char::REPLACEMENT_CHARACTER);
                    at += n;
                }
                Front::Rejected(n) => {
                    (0..n).for_each(|_| self.out.push(char::REPLACEMENT_CHARACTER));
                    at += n;
                }
            }
        }
        self.pending.drain(..at);
        &self.out
    }

    fn flush(&mut self) -> &str {
        self.out.clear();
        if !self.pending.is_empty() {
            self.out.push(char::REPLACEMENT_CHARACTER);
            self.pending.clear();
        }
        &self.out
    }
}

#[cfg(test)]
mod tests {
    use super::{lossy_utf8, Utf8Stream};

    /// Feeds `chunks` one by one; returns what each released, then what the flush did.
    fn stream(chunks: &[&[u8]]) -> (Vec<String>, String) {
        let mut utf8 = Utf8Stream::default();
        let outs = chunks.iter().map(|c| utf8.push(c).to_string()).collect();
        (outs, utf8.flush().to_string())
    }

    #[test]
    fn split_characters_wait_for_their_last_byte() {
        let emoji = "🦙".as_bytes();
        let (outs, flushed) = stream(&[&emoji[..1], &emoji[1..3], &emoji[3..], b"!"]);
        assert_eq!(outs, ["", "", "🦙", "!"]);
        assert_eq!(flushed, "");
    }

    #[test]
    fn invalid_bytes_are_replaced_as_llama_server_shows_them() {
        // A four-byte lead by its bits (F5) with one continuation, then ASCII: one run.
        assert_eq!(
            lossy_utf8(&[0x81, b'b', 0x90, 0xee, b'1', 0xf5, 0x8e, b'|']),
            "\u{FFFD}b\u{FFFD}\u{FFFD}1\u{FFFD}|"
        );
        // Lone continuations and bytes that lead nothing: one each.
        assert_eq!(
            lossy_utf8(&[0x80, 0xbf, 0xf8, b'x']),
            "\u{FFFD}\u{FFFD}\u{FFFD}x"
        );
        // A three-byte lead with one continuation before ASCII: one.
        assert_eq!(lossy_utf8(&[0xe4, 0xb8, b'a']), "\u{FFFD}a");
        // Whole sequences that are no character: a surrogate, an overlong form, past U+10FFFF.
        assert_eq!(lossy_utf8(&[0xed, 0xa0, 0x80]), "\u{FFFD}".repeat(3));
        assert_eq!(lossy_utf8(&[0xc0, 0x80]), "\u{FFFD}".repeat(2));
        assert_eq!(lossy_utf8(&[0xf4, 0x90, 0x80, 0x80]), "\u{FFFD}".repeat(4));
        // Valid text is left alone.
        assert_eq!(lossy_utf8("ж中🦙".as_bytes()), "ж中🦙");
    }

    #[test]
    fn output_is_lossy_decoding_of_all_bytes_for_any_split() {
        let all: Vec<u8> = [
            b"a".as_slice(),
            &[0xff],
            "ж".as_bytes(),
            &[0xe4, 0xb8],
            "中".as_bytes(),
            &[0xf0, 0x9f, 0x98],
            b"z",
            &[0xed, 0xa0, 0x80],
            &[0xf0, 0x9f],
        ]
        .concat();
        let expected = lossy_utf8(&all);
        // Every way of cutting the bytes into three chunks.
        for i in 0..=all.len() {
            for j in i..=all.len() {
                let (outs, flushed) = stream(&[&all[..i], &all[i..j], &all[j..]]);
                assert_eq!(outs.concat() + &flushed, expected, "cut at {i}, {j}");
            }
        }
        // One byte at a time.
        let bytes: Vec<&[u8]> = all.chunks(1).collect();
        let (outs, flushed) = stream(&bytes);
        assert_eq!(outs.concat() + &flushed, expected);
    }

    #[test]
    fn an_unfinished_character_is_one_replacement_at_flush() {
        let (outs, flushed) = stream(&[b"ok", &[0xf0, 0x9f, 0xa6]]);
        assert_eq!(outs, ["ok", ""]);
        assert_eq!(flushed, "\u{FFFD}");
    }
}
