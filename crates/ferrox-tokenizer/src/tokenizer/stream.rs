//! Incremental detokenization of generated tokens.
//!
//! A token may carry part of a character (byte-fallback tokens, byte-level BPE pieces), so
//! text is released only once it is complete UTF-8. Bytes that can never become a
//! character are replaced as soon as that is certain; an incomplete character at the end
//! waits for the next token, or for [`StreamDecoder::flush`]. What comes out, all pieces
//! together, is exactly `String::from_utf8_lossy` of all the bytes: one U+FFFD per invalid
//! sequence, never one per byte of a character cut across tokens.
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

impl Utf8Stream {
    fn push(&mut self, bytes: &[u8]) -> &str {
        self.out.clear();
        self.pending.extend_from_slice(bytes);
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(valid) => {
                    self.out.push_str(valid);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    // `valid` is UTF-8 by the error's own account.
                    self.out
                        .push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        // A sequence that no later byte can complete.
                        Some(bad) => {
                            self.out.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[bad..];
                        }
                        // An incomplete character at the end: keep it for later.
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        let consumed = self.pending.len() - rest.len();
        self.pending.drain(..consumed);
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
    use super::Utf8Stream;

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
        let expected = String::from_utf8_lossy(&all).into_owned();
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
