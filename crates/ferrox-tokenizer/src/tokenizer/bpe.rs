//! Byte-level BPE, byte-exact with llama.cpp's `llm_tokenizer_bpe_session`: the `gpt2`
//! model (GPT-2-style byte-level vocabularies) and `gemma4` (merges over raw UTF-8 with
//! `<0xAB>` byte fallback).
//!
//! Text is cut into words by the pre-tokenizer, then each word is merged on its own: it
//! starts as one symbol per byte (byte-level) or per char (UTF-8), and the adjacent pair
//! with the lowest merge rank, leftmost first, is merged until no pair has a rank. Symbols
//! that end up being no token are emitted byte by byte through the fallback tokens.
//!
//! Merges work on interned symbol ids, never on strings: a pair's merge is one hash lookup.
//! Short words rescan their pairs after each merge; long ones keep a priority queue of
//! candidate pairs (stale ones skipped when popped), which stays O(n log n) in the length.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::ops::Range;

use super::pretokenize::{PreTokenizer, WordRule};
use super::unicode::{byte_to_char, char_to_byte};
use super::{Fragment, TokenId, TokenizerError, TokenizerModel, Vocab};

/// A string merging can produce or consume: the ids below the vocabulary's size are the
/// tokens of the same text, the others strings that merges mention but that are no token.
type SymbolId = u32;

/// A char that is neither a token nor part of any merge.
const NO_SYMBOL: SymbolId = SymbolId::MAX;

/// Marks "no neighbour" in the symbol list.
const NONE: usize = usize::MAX;

/// Words of up to this many symbols are merged by rescanning their pairs after each merge,
/// which beats a priority queue at that size; longer ones use the queue.
const SHORT_WORD: usize = 32;

/// SentencePiece's escaped space, which `gemma4`-style vocabularies use for ' '.
const METASPACE: &str = "\u{2581}";

#[derive(Clone, Copy, Debug)]
struct Merge {
    rank: u32,
    merged: SymbolId,
}

/// The BPE tokenizer of one vocabulary.
pub(crate) struct Bpe {
    pre: PreTokenizer,
    /// Merges by `(left << 32) | right` symbol ids.
    merges: HashMap<u64, Merge, FastHash>,
    /// The symbol of each char that is one (UTF-8 vocabularies).
    char_symbols: HashMap<char, SymbolId, FastHash>,
    n_tokens: u32,
    /// The symbol of each byte's byte-level char (byte-level vocabularies).
    byte_symbols: [SymbolId; 256],
    /// What each byte of a symbol that is no token is emitted as: the token of its one-char
    /// byte-level text (byte-level; only printable ASCII can have one, as llama.cpp looks
    /// the encoded text up byte by byte), or its `<0xAB>` token.
    byte_fallback: [Option<TokenId>; 256],
}

impl Bpe {
    pub(crate) fn new(vocab: &Vocab) -> Result<Bpe, TokenizerError> {
        match vocab.model() {
            "gpt2" | "gemma4" => {}
            other => {
                return Err(TokenizerError::Invalid(format!(
                    "BPE tokenizer model `{other}` is not supported"
                )))
            }
        }
        let n_tokens = u32::try_from(vocab.len())
            .ok()
            .filter(|&n| n < NO_SYMBOL)
            .ok_or_else(|| TokenizerError::Invalid("too many tokens for BPE".into()))?;
        let pre = PreTokenizer::new(vocab.pre())?;
        let byte_encode = pre.byte_encode();
        let mut symbols = SymbolTable::new(vocab, n_tokens);
        let merges = load_merges(vocab, &mut symbols)?;
        let mut byte_symbols = [NO_SYMBOL; 256];
        let mut byte_fallback = [None; 256];
        for byte in 0..=255u8 {
            let c = byte_to_char(byte);
            byte_symbols[usize::from(byte)] = symbols.get(c.encode_utf8(&mut [0; 4]));
            byte_fallback[usize::from(byte)] = if byte_encode {
                c.is_ascii()
                    .then(|| vocab.id(c.encode_utf8(&mut [0; 4])))
                    .flatten()
            } else {
                vocab.id(&format!("<0x{byte:02X}>"))
            };
        }
        Ok(Bpe {
            pre,
            merges,
            char_symbols: if byte_encode {
                HashMap::default()
            } else {
                symbols.single_chars()
            },
            n_tokens,
            byte_symbols,
            byte_fallback,
        })
    }

    fn char_symbol(&self, c: char) -> SymbolId {
        self.char_symbols.get(&c).copied().unwrap_or(NO_SYMBOL)
    }

    /// Tokenizes one raw-text fragment (llama.cpp's `llm_tokenizer_bpe_session::tokenize`).
    fn encode_text(&self, vocab: &Vocab, text: &str, work: &mut Work, out: &mut Vec<TokenId>) {
        let escaped;
        let text = if vocab.escape_whitespaces() {
            escaped = text.replace(' ', METASPACE);
            escaped.as_str()
        } else {
            text
        };
        let mut words = std::mem::take(&mut work.words);
        words.clear();
        self.pre.split(text, &mut words);
        for range in &words {
            let word = &text[range.clone()];
            if self.pre.word_rule() == WordRule::Metaspace && !is_newline_run(word) {
                self.encode_metaspace_word(vocab, word, work, out);
            } else {
                self.encode_word(vocab, word, work, out);
            }
        }
        work.words = words;
    }

    /// mmBERT's Metaspace words: a `▁` in front if the word has none, then a new word at
    /// each further `▁`.
    fn encode_metaspace_word(
        &self,
        vocab: &Vocab,
        word: &str,
        work: &mut Work,
        out: &mut Vec<TokenId>,
    ) {
        let prefixed;
        let word = if word.starts_with(METASPACE) {
            word
        } else {
            prefixed = format!("{METASPACE}{word}");
            prefixed.as_str()
        };
        let mut start = 0;
        while start < word.len() {
            let from = start + METASPACE.len();
            let end = word
                .get(from..)
                .and_then(|rest| rest.find(METASPACE))
                .map_or(word.len(), |i| from + i);
            self.encode_word(vocab, &word[start..end], work, out);
            start = end;
        }
    }

    fn encode_word(&self, vocab: &Vocab, word: &str, work: &mut Work, out: &mut Vec<TokenId>) {
        if word.is_empty() {
            return;
        }
        if vocab.ignore_merges() {
            let whole = if self.pre.byte_encode() {
                work.encoded.clear();
                work.encoded.extend(word.bytes().map(byte_to_char));
                vocab.id(&work.encoded)
            } else {
                vocab.id(word)
            };
            if let Some(id) = whole {
                out.push(id);
                return;
            }
        }
        if self.pre.word_rule() != WordRule::Plain && is_newline_run(word) {
            if let Some(id) = vocab.id(word) {
                out.push(id);
                return;
            }
        }

        let symbols = &mut work.symbols;
        symbols.clear();
        if self.pre.byte_encode() {
            symbols.extend(word.bytes().enumerate().map(|(i, b)| Symbol {
                start: i,
                len: 1,
                id: self.byte_symbols[usize::from(b)],
                prev: i.wrapping_sub(1),
                next: i + 1,
            }));
        } else {
            for (index, (start, c)) in word.char_indices().enumerate() {
                let end = start + c.len_utf8();
                symbols.push(Symbol {
                    start,
                    len: end - start,
                    id: self.char_symbol(c),
                    prev: index.wrapping_sub(1),
                    next: index + 1,
                });
            }
        }
        if let Some(last) = symbols.last_mut() {
            last.next = NONE;
        }
        self.merge_symbols(symbols, &mut work.queue);

        let bytes = word.as_bytes();
        for symbol in symbols.iter().filter(|s| s.len > 0) {
            if symbol.id < self.n_tokens {
                out.push(symbol.id);
            } else {
                let text = &bytes[symbol.start..symbol.start + symbol.len];
                out.extend(
                    text.iter()
                        .filter_map(|&b| self.byte_fallback[usize::from(b)]),
                );
            }
        }
    }

    /// Merges the lowest-ranked adjacent pair, the leftmost among equals, until none is left.
    /// A merged symbol keeps the left one's slot; the right one's length becomes 0.
    fn merge_symbols(&self, symbols: &mut [Symbol], queue: &mut BinaryHeap<Reverse<Candidate>>) {
        if symbols.len() <= SHORT_WORD {
            self.merge_by_scanning(symbols);
        } else {
            self.merge_by_queue(symbols, queue);
        }
    }

    /// For short words (most of them): rescan the few remaining pairs for the best one.
    fn merge_by_scanning(&self, symbols: &mut [Symbol]) {
        let mut pairs = [None::<Merge>; SHORT_WORD];
        for left in 0..symbols.len() {
            pairs[left] = self.pair_merge(symbols, left, symbols[left].next);
        }
        loop {
            let mut best: Option<(usize, Merge)> = None;
            let mut i = 0;
            while i != NONE {
                if let Some(merge) = pairs[i] {
                    if best.is_none_or(|(_, b)| merge.rank < b.rank) {
                        best = Some((i, merge));
                    }
                }
                i = symbols[i].next;
            }
            let Some((left, merge)) = best else { break };
            let right = symbols[left].next;
            merge_pair(symbols, left, right, merge.merged);
            pairs[left] = self.pair_merge(symbols, left, symbols[left].next);
            let prev = symbols[left].prev;
            if prev != NONE {
                pairs[prev] = self.pair_merge(symbols, prev, left);
            }
        }
    }

    /// For long words: a priority queue of candidate pairs, stale ones skipped when popped.
    fn merge_by_queue(&self, symbols: &mut [Symbol], queue: &mut BinaryHeap<Reverse<Candidate>>) {
        queue.clear();
        for right in 1..symbols.len() {
            self.push_candidate(symbols, right - 1, right, queue);
        }
        while let Some(Reverse(candidate)) = queue.pop() {
            let (left, right) = (symbols[candidate.left], symbols[candidate.right]);
            // Stale: one side was merged away, or grew, since the pair was queued.
            if left.len == 0 || right.len == 0 || left.len + right.len != candidate.len {
                continue;
            }
            merge_pair(symbols, candidate.left, candidate.right, candidate.merged);
            self.push_candidate(symbols, left.prev, candidate.left, queue);
            self.push_candidate(symbols, candidate.left, right.next, queue);
        }
    }

    /// The merge that applies to symbols `left` and `right`, if any.
    fn pair_merge(&self, symbols: &[Symbol], left: usize, right: usize) -> Option<Merge> {
        let (l, r) = (symbols.get(left)?, symbols.get(right)?);
        if l.id == NO_SYMBOL || r.id == NO_SYMBOL {
            return None;
        }
        self.merges.get(&pair_key(l.id, r.id)).copied()
    }

    fn push_candidate(
        &self,
        symbols: &[Symbol],
        left: usize,
        right: usize,
        queue: &mut BinaryHeap<Reverse<Candidate>>,
    ) {
        if let Some(merge) = self.pair_merge(symbols, left, right) {
            queue.push(Reverse(Candidate {
                rank: merge.rank,
                left,
                right,
                len: symbols[left].len + symbols[right].len,
                merged: merge.merged,
            }));
        }
    }

    /// GPT-2 byte-level decoding of a normal token (llama.cpp's `llama_decode_text`): a char
    /// no byte maps to comes out as `[UNK_BYTE_0x..<token text>]`.
    fn decode_byte_level(text: &str, out: &mut Vec<u8>) {
        for c in text.chars() {
            match char_to_byte(c) {
                Some(b) => out.push(b),
                None => {
                    out.extend_from_slice(b"[UNK_BYTE_0x");
                    for b in c.encode_utf8(&mut [0; 4]).bytes() {
                        out.extend_from_slice(format!("{b:02x}").as_bytes());
                    }
                    out.extend_from_slice(text.as_bytes());
                    out.push(b']');
                }
            }
        }
    }
}

impl TokenizerModel for Bpe {
    fn encode(
        &self,
        vocab: &Vocab,
        fragments: &[Fragment<'_>],
        add_special: bool,
        out: &mut Vec<TokenId>,
    ) {
        if add_special && vocab.add_bos() {
            out.extend(vocab.bos());
        }
        let mut work = Work::default();
        for fragment in fragments {
            match *fragment {
                Fragment::Text(text) => self.encode_text(vocab, text, &mut work, out),
                Fragment::Token(id) => out.push(id),
            }
        }
        if add_special && vocab.add_eos() {
            out.extend(vocab.eos());
        }
    }

    fn token_to_piece(&self, vocab: &Vocab, id: TokenId, special: bool, out: &mut Vec<u8>) {
        if !vocab.contains(id) {
            return;
        }
        let is_special = vocab.is_unknown(id) || vocab.is_control(id);
        if is_special && !special {
            return;
        }
        let text = vocab.text(id);
        if is_special || vocab.is_user_defined(id) {
            out.extend_from_slice(text.as_bytes());
        } else if vocab.is_normal(id) {
            if vocab.escape_whitespaces() {
                out.extend_from_slice(text.replace(METASPACE, " ").as_bytes());
            } else {
                Self::decode_byte_level(text, out);
            }
        } else if vocab.is_byte(id) {
            out.push(parse_byte_token(text));
        }
        // Unused and undefined tokens have no piece.
    }
}

/// The byte of a `<0xAB>` token as llama.cpp reads it: `strtol` over its 4th and 5th bytes,
/// so leading hex digits count and anything else is 0.
fn parse_byte_token(text: &str) -> u8 {
    let digits = text.as_bytes().get(3..text.len().min(5)).unwrap_or(&[]);
    digits
        .iter()
        .map_while(|&b| char::from(b).to_digit(16))
        .fold(0u8, |acc, d| (acc << 4) | d as u8)
}

/// Reads `tokenizer.ggml.merges`: "left right", split at the first space after the first
/// byte (so a left side may be a space); a later duplicate pair keeps the first rank.
fn load_merges(
    vocab: &Vocab,
    symbols: &mut SymbolTable<'_>,
) -> Result<HashMap<u64, Merge, FastHash>, TokenizerError> {
    let mut merges = HashMap::with_capacity_and_hasher(vocab.merges_len(), FastHash::default());
    let mut merged_text = String::new();
    for (rank, line) in vocab.merges().enumerate() {
        let rank = u32::try_from(rank)
            .map_err(|_| TokenizerError::Invalid("too many BPE merges".into()))?;
        let Some(space) = line.as_bytes().iter().skip(1).position(|&b| b == b' ') else {
            continue; // llama.cpp ranks the pair ("", ""), which never matches
        };
        let (left, right) = (&line[..space + 1], &line[space + 2..]);
        merged_text.clear();
        merged_text.push_str(left);
        merged_text.push_str(right);
        let left = symbols.intern(left)?;
        let right = symbols.intern(right)?;
        let merged = symbols.intern(&merged_text)?;
        merges
            .entry(pair_key(left, right))
            .or_insert(Merge { rank, merged });
    }
    Ok(merges)
}

/// Symbol ids by text while loading: the tokens' own ids, then new ids for the strings
/// merges mention that are no token.
struct SymbolTable<'v> {
    vocab: &'v Vocab,
    others: HashMap<Box<str>, SymbolId>,
    n_tokens: u32,
}

impl<'v> SymbolTable<'v> {
    fn new(vocab: &'v Vocab, n_tokens: u32) -> SymbolTable<'v> {
        SymbolTable {
            vocab,
            others: HashMap::new(),
            n_tokens,
        }
    }

    fn get(&self, text: &str) -> SymbolId {
        self.vocab
            .id(text)
            .or_else(|| self.others.get(text).copied())
            .unwrap_or(NO_SYMBOL)
    }

    /// The id of `text`, allocating one if it is new.
    fn intern(&mut self, text: &str) -> Result<SymbolId, TokenizerError> {
        let id = self.get(text);
        if id != NO_SYMBOL {
            return Ok(id);
        }
        let id = u32::try_from(self.others.len())
            .ok()
            .and_then(|n| self.n_tokens.checked_add(n))
            .filter(|&id| id < NO_SYMBOL)
            .ok_or_else(|| TokenizerError::Invalid("too many BPE merge symbols".into()))?;
        self.others.insert(text.into(), id);
        Ok(id)
    }

    /// The symbols that are a single char.
    fn single_chars(&self) -> HashMap<char, SymbolId, FastHash> {
        let tokens = (0..self.n_tokens).map(|id| (self.vocab.text(id), id));
        let others = self.others.iter().map(|(text, &id)| (&**text, id));
        tokens
            .chain(others)
            .filter_map(|(text, id)| {
                let mut chars = text.chars();
                match (chars.next(), chars.next()) {
                    (Some(c), None) => Some((c, id)),
                    _ => None,
                }
            })
            .collect()
    }
}

/// Merges symbol `right` into its left neighbour `left`.
fn merge_pair(symbols: &mut [Symbol], left: usize, right: usize, merged: SymbolId) {
    let removed = symbols[right];
    let kept = &mut symbols[left];
    kept.len += removed.len;
    kept.id = merged;
    kept.next = removed.next;
    symbols[right].len = 0;
    if removed.next != NONE {
        symbols[removed.next].prev = left;
    }
}

fn is_newline_run(word: &str) -> bool {
    word.bytes().all(|b| b == b'\n')
}

fn pair_key(left: SymbolId, right: SymbolId) -> u64 {
    (u64::from(left) << 32) | u64::from(right)
}

/// A symbol of the word being merged: `len` bytes of it from `start`, linked to its
/// neighbours; `len == 0` once merged into its left neighbour.
#[derive(Clone, Copy, Debug)]
struct Symbol {
    start: usize,
    len: usize,
    id: SymbolId,
    prev: usize,
    next: usize,
}

/// A pair of adjacent symbols that a merge applies to, ordered by rank, then leftmost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Candidate {
    rank: u32,
    left: usize,
    right: usize,
    /// The merged length, to recognise a stale candidate.
    len: usize,
    merged: SymbolId,
}

/// Buffers reused across the words of one `encode` call.
#[derive(Default)]
struct Work {
    words: Vec<Range<usize>>,
    symbols: Vec<Symbol>,
    queue: BinaryHeap<Reverse<Candidate>>,
    /// A word in byte-level chars, for the whole-word lookup of `ignore_merges`.
    encoded: String,
}

/// A fast hash for the integer keys of the merge and char maps (SipHash would dominate
/// the merge loop). The keys are symbol ids and chars, which an input cannot choose to
/// collide beyond the vocabulary's own.
type FastHash = BuildHasherDefault<FastHasher>;

#[derive(Default)]
struct FastHasher(u64);

impl Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u32(&mut self, value: u32) {
        self.write_u64(u64::from(value));
    }

    fn write_u64(&mut self, value: u64) {
        let mixed = (self.0.rotate_left(5) ^ value).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = mixed ^ (mixed >> 29);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrox_gguf::{Gguf, GgufWriter};

    /// A vocabulary whose tokens are normal but for the `<0xAB>` ones, which are bytes.
    fn vocab(model: &str, pre: &str, tokens: &[&str], merges: &[&str]) -> Vocab {
        let is_byte = |t: &&str| t.len() == 6 && t.starts_with("<0x");
        let types: Vec<i32> = tokens
            .iter()
            .map(|t| if is_byte(t) { 6 } else { 1 })
            .collect();
        let mut w = GgufWriter::new();
        w.set("tokenizer.ggml.token_type", types);
        w.set("tokenizer.ggml.model", model);
        w.set("tokenizer.ggml.pre", pre);
        w.set("tokenizer.ggml.tokens", tokens.to_vec());
        w.set("tokenizer.ggml.merges", merges.to_vec());
        let gguf = Gguf::from_bytes(w.to_bytes()).expect("valid gguf");
        Vocab::from_gguf(&gguf.metadata()).expect("valid vocab")
    }

    fn encode(bpe: &Bpe, vocab: &Vocab, text: &str) -> Vec<TokenId> {
        let mut out = Vec::new();
        bpe.encode(vocab, &[Fragment::Text(text)], false, &mut out);
        out
    }

    /// Textbook BPE on strings: merge the lowest-ranked adjacent pair, leftmost first.
    fn reference_bpe(word: &str, merges: &[&str], vocab: &Vocab) -> Vec<TokenId> {
        let rank = |l: &str, r: &str| merges.iter().position(|m| *m == format!("{l} {r}"));
        let mut parts: Vec<String> = word.chars().map(String::from).collect();
        loop {
            let best = (1..parts.len())
                .filter_map(|i| rank(&parts[i - 1], &parts[i]).map(|r| (r, i)))
                .min();
            let Some((_, i)) = best else { break };
            let right = parts.remove(i);
            parts[i - 1].push_str(&right);
        }
        let ids = parts.iter().flat_map(|p| match vocab.id(p) {
            Some(id) => vec![id],
            None => p.chars().filter_map(|c| vocab.id(&c.to_string())).collect(),
        });
        ids.collect()
    }

    #[test]
    fn short_and_long_words_merge_like_textbook_bpe() {
        let tokens = [
            "a", "b", "c", "ab", "bc", "abc", "ca", "aa", "aaaa", "bb", "cab",
        ];
        // "c c" merges into "cc", which is no token: it comes out as its bytes.
        let merges = [
            "a b", "b c", "ab c", "c a", "a a", "aa aa", "b b", "c c", "c ab", "cc cc",
        ];
        let vocab = vocab("gpt2", "gpt-2", &tokens, &merges);
        let bpe = Bpe::new(&vocab).unwrap();
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        for len in (1..=70).chain([150]) {
            for _ in 0..10 {
                let word: String = (0..len)
                    .map(|_| {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        ['a', 'b', 'c'][(seed % 3) as usize]
                    })
                    .collect();
                let want = reference_bpe(&word, &merges, &vocab);
                assert_eq!(encode(&bpe, &vocab, &word), want, "{word}");
            }
        }
    }

    #[test]
    fn utf8_vocabularies_merge_chars_and_fall_back_to_byte_tokens() {
        let tokens = [
            "<0xC3>",
            "<0xA9>",
            "\u{2581}",
            "a",
            "\u{2581}a",
            "\u{2581}a\u{2581}",
            "\n\n",
        ];
        let merges = ["\u{2581} a", "\u{2581}a \u{2581}"];
        let vocab = vocab("gemma4", "gemma4", &tokens, &merges);
        let bpe = Bpe::new(&vocab).unwrap();
        // Spaces become ▁ and merge; 'é' is no token, so its UTF-8 bytes come out.
        assert_eq!(encode(&bpe, &vocab, " a a"), [4, 4]);
        assert_eq!(encode(&bpe, &vocab, " a "), [5]);
        assert_eq!(encode(&bpe, &vocab, "é"), [0, 1]);
        // A run of newlines is looked up whole.
        assert_eq!(encode(&bpe, &vocab, "\n\n"), [6]);
        let mut piece = Vec::new();
        bpe.token_to_piece(&vocab, 5, false, &mut piece);
        assert_eq!(piece, b" a ");
        piece.clear();
        bpe.token_to_piece(&vocab, 1, false, &mut piece);
        assert_eq!(piece, [0xA9]);
    }

    #[test]
    fn byte_token_parsing_follows_strtol() {
        assert_eq!(parse_byte_token("<0x0A>"), 0x0A);
        assert_eq!(parse_byte_token("<0xff>"), 0xFF);
        assert_eq!(parse_byte_token("<0xA>"), 0x0A);
        assert_eq!(parse_byte_token("<0xZZ>"), 0);
        assert_eq!(parse_byte_token("<0"), 0);
    }

    #[test]
    fn byte_level_decoding() {
        let mut out = Vec::new();
        Bpe::decode_byte_level("ĠhelloĊ", &mut out);
        assert_eq!(out, b" hello\n");
        out.clear();
        Bpe::decode_byte_level("a€", &mut out);
        assert_eq!(out, b"a[UNK_BYTE_0xe282aca\xe2\x82\xac]");
    }
}
