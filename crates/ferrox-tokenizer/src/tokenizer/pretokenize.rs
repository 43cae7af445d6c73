//! BPE pre-tokenizers: split text into the words BPE merges within, exactly as llama.cpp's
//! `unicode_regex_split` does for each `tokenizer.ggml.pre`.
//!
//! A pre-tokenizer is a list of regexes applied in turn, each one splitting every piece the
//! previous ones left: its matches and the gaps between them all become pieces. llama.cpp
//! runs its hottest regexes through hand-written splitters, and those splitters (not the
//! regexes they stand for) define its behaviour, so we mirror them one for one. SuperBPE's
//! digit-grouping lookahead, which backtracks quadratically, has a splitter of ours too,
//! equivalent to the regex. Every other regex runs on fancy-regex over the text llama.cpp
//! hands to `std::regex` (whose ECMAScript matching is leftmost-first backtracking, as
//! fancy-regex's):
//! - when the regex uses `\p{..}` classes, a "collapsed" text where each non-ASCII codepoint
//!   is replaced by a stand-in for its class (non-ASCII whitespace by `\x0B`), the classes
//!   being rewritten to match their stand-in plus their ASCII members;
//! - otherwise the text itself, with non-ASCII whitespace replaced by `\x0B`.
//!
//! Positions are codepoint indices until the end, where the words become byte ranges.

use std::ops::Range;

use fancy_regex::Regex;

use super::unicode::{is_han, Category, CharFlags};
use super::TokenizerError;

/// What BPE does with the words beyond merging them; llama.cpp keys it off the pre-type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WordRule {
    /// Every word is merged as it is.
    Plain,
    /// A word made only of newlines is taken whole when the vocabulary has it (Gemma 4).
    WholeNewlineRuns,
    /// As `WholeNewlineRuns`, and every other word is cut before each `▁`, the first piece
    /// getting a `▁` if it has none (mmBERT's Metaspace pre-tokenizer).
    Metaspace,
}

/// The pre-tokenizer of one `tokenizer.ggml.pre`, built once per vocabulary.
pub(crate) struct PreTokenizer {
    steps: Vec<Step>,
    byte_encode: bool,
    word_rule: WordRule,
}

/// One regex of a pre-tokenizer.
enum Step {
    /// The GPT-2 regex `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`.
    Gpt2,
    /// The Llama 3 regex and its Qwen variants: `(?i:'s|..)|[^\r\n\p{L}\p{N}]?\p{L}+|
    /// \p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`, with digit runs cut
    /// every `max_digits` and, for Qwen 3.5, marks (`\p{M}`) counted with letters.
    Llama3Like {
        max_digits: usize,
        marks_join_letters: bool,
    },
    /// Kimi-K2's regex: Han runs, then Llama-3-like words of non-Han letters that take a
    /// trailing contraction.
    KimiK2,
    /// Digit runs cut into groups of three from the right, the leading short group joined to
    /// the text before it (AFMoE, and llama.cpp's stand-in for Tiny Aya's digit regex).
    DigitGroups,
    /// `[^\n]+|[\n]+`.
    NewlineRuns,
    /// SuperBPE's `(?=(\d{3})+(?!\d))`: empty matches before every third digit from the end
    /// of an ASCII digit run. The regex itself backtracks quadratically on long runs.
    ThousandsBoundaries,
    /// Any other regex.
    Regex {
        regex: Regex,
        haystack: HaystackKind,
    },
}

/// The text a generic regex runs over (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HaystackKind {
    Collapsed,
    Wide,
}

// The regexes of llama.cpp's pre-tokenizers, verbatim (chars that Unicode normalization
// would alter are escaped). Those that `Step::compile` recognises run through hand-written
// splitters, exactly where llama.cpp uses its own.
macro_rules! contractions {
    () => {
        "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
    };
}
const GPT2: &str = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
const LLAMA3: &str = concat!(
    contractions!(),
    "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
);
const QWEN2: &str = concat!(
    contractions!(),
    "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
);
const QWEN35: &str = concat!(
    contractions!(),
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
);
/// llama.cpp's trigger for its Kimi-K2 splitter (not a regex it runs).
const KIMI_K2: &str = "\\p{Han}+";
/// llama.cpp's trigger for its AFMoE digit splitter (not a regex it runs).
const AFMOE_DIGITS: &str = "\\p{AFMoE_digits}";
/// Tiny Aya's digit regex, which llama.cpp runs through the AFMoE digit splitter.
const TINY_AYA_DIGITS: &str = "\\d{1,3}(?=(?:\\d{3})*\\b)";
const NEWLINE_RUNS: &str = "[^\\n]+|[\\n]+";

const JAIS2: &str = concat!(
    contractions!(),
    "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+",
    "|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)",
    "|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}"
);
const NEWLINE: &str = "[\r\n]";
const DEEPSEEK_LLM_LETTERS: &str = "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\u{1F7D}ᾀ-ᾴᾶ-ᾼ\u{1FBE}ῂ-ῄῆ-ῌῐ-\u{1FD3}ῖ-\u{1FDB}ῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\u{2126}ℨ\u{212A}-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+";
const DEEPSEEK_LLM_PUNCTUATION: &str = "\\s?[!-/:-~！-／：-～‘-‟\u{3000}-。]+";
const TRAILING_WHITESPACE: &str = "\\s+$";
const DEEPSEEK_CJK: &str = "[一-龥ࠀ-一가-\u{D7FF}]+";
const DIGIT_RUNS: &str = "\\p{N}+";
const DIGIT: &str = "\\p{N}";
const DIGITS_1_TO_3: &str = "\\p{N}{1,3}";
const THREE_ASCII_DIGITS: &str = "[0-9][0-9][0-9]";
const HAN_KANA: &str = "[一-龥\u{3040}-ゟ゠-ヿ]+";
const DEEPSEEK3_WORDS: &str = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";
const SPARK2_5_WORDS: &str = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|\\s+";
const YOUTU_CJK: &str =
    "[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥\u{3040}-ゟ゠-ヿ]+";
const YOUTU_WORDS: &str = concat!(
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+",
    contractions!(),
    "?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*",
    contractions!(),
    "?|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
);
const LETTER_RUNS: &str = "\\s?\\p{L}+";
const PUNCTUATION_RUNS: &str = "\\s?\\p{P}+";
const FALCON_PUNCTUATION: &str = "[\\p{P}\\$\\+<=>\\^~\\|`]+";
const DEFAULT_PUNCTUATION: &str = "[\\p{P}\\$\\+<=>\\^~\\|]+";
const BLOOM: &str = " ?[^(\\s|.,!?…。，、।۔،)]+";
const TEKKEN: &str = "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const CHAMELEON_SENTINELS: &str = "<sentinel:[0-9]+>";
const CHAMELEON_IMAGES: &str = "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z";
const CHAMELEON_SPACES: &str = "([\\t\\n]|    |  )";
const CHAMELEON_PUNCTUATION: &str = "[\\p{P}!-/:-@\\[-`{-~]";
const GPT4O: &str = concat!(
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+",
    contractions!(),
    "?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*",
    contractions!(),
    "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
);
const GRANITE_EMB_MULTI: &str = concat!(
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))*((?=[\\p{L}\\p{M}])([^A-Z]))+",
    contractions!(),
    "?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))+((?=[\\p{L}\\p{M}])([^A-Z]))*",
    contractions!(),
    "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
);
const TINY_AYA_WORDS: &str = concat!(
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+",
    contractions!(),
    "?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*",
    contractions!(),
    "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
);
const THOUSANDS_BOUNDARIES: &str = "(?=(\\d{3})+(?!\\d))";
const BAILINGMOE: &str = "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+";
const SEED_CODER: &str = concat!(
    contractions!(),
    "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
);
const UFAKZEKA: &str = "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const AFMOE_ASIAN: &str = "[一-鿿㐀-䶿豈-\u{FAFF}\u{3040}-ゟ゠-ヿ･-ﾟ⼀-\u{2FDF}เ-\u{E7F}\u{E80}-\u{EFF}ក-\u{17FF}က-႟ꩠ-ꩿꧠ-\u{A9FF}가-\u{D7AF}ᄀ-ᇿ]+";
const AFMOE_WORDS: &str = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const EXAONE_MOE: &str = concat!(
    contractions!(),
    "|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"
);
const MINICPM5: &str = concat!(
    contractions!(),
    "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
);
const NON_WHITESPACE_RUNS: &str = "\\S+";

/// A pre-tokenizer as llama.cpp defines it: its regexes, whether words are byte-level
/// encoded (GPT-2) or kept as UTF-8, and its word rule.
struct Recipe {
    regexes: &'static [&'static str],
    byte_encode: bool,
    word_rule: WordRule,
}

const fn byte_level(regexes: &'static [&'static str]) -> Recipe {
    Recipe {
        regexes,
        byte_encode: true,
        word_rule: WordRule::Plain,
    }
}

const fn utf8(regexes: &'static [&'static str], word_rule: WordRule) -> Recipe {
    Recipe {
        regexes,
        byte_encode: false,
        word_rule,
    }
}

/// llama.cpp's pre-tokenizer for a `tokenizer.ggml.pre` value (a missing one is "default").
fn recipe(pre: &str) -> Option<Recipe> {
    Some(match pre {
        "" | "default" => byte_level(&[DEFAULT_PUNCTUATION, GPT2, DIGIT_RUNS, THREE_ASCII_DIGITS]),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" | "dbrx" | "smaug-bpe" | "chatglm-bpe" | "glm4" | "glm5" => {
            byte_level(&[LLAMA3])
        }
        "jais-2" => byte_level(&[JAIS2]),
        "deepseek-llm" => byte_level(&[
            NEWLINE,
            DEEPSEEK_LLM_LETTERS,
            DEEPSEEK_LLM_PUNCTUATION,
            TRAILING_WHITESPACE,
            DEEPSEEK_CJK,
            DIGIT_RUNS,
        ]),
        "deepseek-v3" | "hunyuan-dense" | "joyai-llm" | "hy_v4" => {
            byte_level(&[DIGITS_1_TO_3, HAN_KANA, DEEPSEEK3_WORDS])
        }
        "spark2_5" => byte_level(&[DIGITS_1_TO_3, HAN_KANA, SPARK2_5_WORDS, DIGIT]),
        "youtu" => byte_level(&[YOUTU_CJK, YOUTU_WORDS]),
        "deepseek-coder" => {
            byte_level(&[NEWLINE, LETTER_RUNS, PUNCTUATION_RUNS, DEEPSEEK_CJK, DIGIT])
        }
        "falcon" => byte_level(&[FALCON_PUNCTUATION, GPT2, THREE_ASCII_DIGITS]),
        "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva-7b"
        | "mellum2" => byte_level(&[DIGIT, GPT2]),
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de"
        | "a.x-4.0" | "mellum" | "modern-bert" | "jina-v1-en" | "jina-v2-code" | "roberta-bpe"
        | "exaone4" | "mpt" | "olmo" | "jais" | "trillion" | "granite-docling" => {
            byte_level(&[GPT2])
        }
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" | "stablelm2" | "hunyuan"
        | "solar-open" | "grok-2" => byte_level(&[QWEN2]),
        "qwen35" => byte_level(&[QWEN35]),
        "poro-chat" | "bloom" | "gpt3-finnish" => byte_level(&[BLOOM]),
        "viking" => byte_level(&[BLOOM, DIGIT]),
        "tekken" => byte_level(&[TEKKEN]),
        "chameleon" => byte_level(&[
            CHAMELEON_SENTINELS,
            CHAMELEON_IMAGES,
            CHAMELEON_SPACES,
            DIGIT,
            CHAMELEON_PUNCTUATION,
            GPT2,
        ]),
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => byte_level(&[GPT4O]),
        "granite-embed-multi-97m" => byte_level(&[GRANITE_EMB_MULTI]),
        "tiny_aya" | "cohere2moe" => byte_level(&[TINY_AYA_DIGITS, TINY_AYA_WORDS]),
        "kimi-k2" => byte_level(&[KIMI_K2]),
        "superbpe" => byte_level(&[DIGIT_RUNS, THOUSANDS_BOUNDARIES]),
        "bailingmoe" | "bailingmoe2" | "llada-moe" => byte_level(&[BAILINGMOE]),
        "seed-coder" => byte_level(&[SEED_CODER]),
        "ufakzeka" => byte_level(&[UFAKZEKA]),
        "afmoe" => byte_level(&[AFMOE_DIGITS, AFMOE_ASIAN, AFMOE_WORDS]),
        "laguna" => byte_level(&[NEWLINE_RUNS, QWEN2]),
        "exaone-moe" => byte_level(&[EXAONE_MOE]),
        "minicpm5" => byte_level(&[DIGITS_1_TO_3, MINICPM5]),
        "gemma4" | "granite-embed-multi-311m" => utf8(&[NEWLINE_RUNS], WordRule::WholeNewlineRuns),
        "mmbert" => utf8(&[NEWLINE_RUNS], WordRule::Metaspace),
        "sarvam-moe" => utf8(&[NEWLINE_RUNS], WordRule::Plain),
        "whitespace" => utf8(&[NON_WHITESPACE_RUNS], WordRule::Plain),
        _ => return None,
    })
}

impl PreTokenizer {
    /// The pre-tokenizer llama.cpp uses for `pre` (`tokenizer.ggml.pre`; none means
    /// "default"). An unknown name is an error, never a fallback.
    pub(crate) fn new(pre: Option<&str>) -> Result<PreTokenizer, TokenizerError> {
        let name = pre.unwrap_or("");
        let recipe =
            recipe(name).ok_or_else(|| TokenizerError::UnknownPreTokenizer(name.to_string()))?;
        let steps = recipe
            .regexes
            .iter()
            .map(|expr| Step::compile(expr))
            .collect::<Result<_, _>>()?;
        Ok(PreTokenizer {
            steps,
            byte_encode: recipe.byte_encode,
            word_rule: recipe.word_rule,
        })
    }

    /// Whether BPE sees each byte of a word as its GPT-2 byte-level char (else the
    /// word's UTF-8 chars, with `<0xAB>` byte tokens as the fallback).
    pub(crate) fn byte_encode(&self) -> bool {
        self.byte_encode
    }

    pub(crate) fn word_rule(&self) -> WordRule {
        self.word_rule
    }

    /// Splits `text` into words, appended to `words` as byte ranges of `text`, in order and
    /// covering all of it. No word is empty.
    pub(crate) fn split(&self, text: &str, words: &mut Vec<Range<usize>>) {
        if text.is_empty() {
            return;
        }
        let text = Codepoints::decode(text);
        let mut haystacks = Haystacks::default();
        // One piece, the whole text, for the first regex to split.
        let mut pieces = Vec::with_capacity(text.chars.len() / 4 + 1);
        pieces.push(0..text.chars.len());
        let mut next = Vec::with_capacity(pieces.len());
        for step in &self.steps {
            next.clear();
            for piece in &pieces {
                step.split(&text, piece.clone(), &mut haystacks, &mut next);
            }
            std::mem::swap(&mut pieces, &mut next);
        }
        words.extend(
            pieces
                .iter()
                .map(|p| text.byte_starts[p.start]..text.byte_starts[p.end]),
        );
    }
}

/// The text as codepoints with their flags.
struct Codepoints {
    chars: Vec<char>,
    flags: Vec<CharFlags>,
    /// The byte offset of each codepoint in the text, then the text's length.
    byte_starts: Vec<usize>,
}

impl Codepoints {
    fn decode(text: &str) -> Codepoints {
        let mut chars = Vec::with_capacity(text.len());
        let mut byte_starts = Vec::with_capacity(text.len() + 1);
        for (i, c) in text.char_indices() {
            chars.push(c);
            byte_starts.push(i);
        }
        byte_starts.push(text.len());
        let flags = chars.iter().map(|&c| CharFlags::of(c)).collect();
        Codepoints {
            chars,
            flags,
            byte_starts,
        }
    }
}

/// One piece as the hand-written splitters see it: positions are relative to its start,
/// and past its end there is no character, so no lookahead crosses into the next piece.
struct Window<'a> {
    chars: &'a [char],
    flags: &'a [CharFlags],
}

impl Window<'_> {
    fn len(&self) -> usize {
        self.chars.len()
    }

    fn char_at(&self, pos: usize) -> Option<char> {
        self.chars.get(pos).copied()
    }

    fn flags_at(&self, pos: usize) -> CharFlags {
        self.flags.get(pos).copied().unwrap_or(CharFlags::NONE)
    }

    fn is_newline_at(&self, pos: usize) -> bool {
        matches!(self.char_at(pos), Some('\r' | '\n'))
    }

    /// The length of the contraction (`'s`, `'t`, `'re`, `'ve`, `'m`, `'ll`, `'d`) at
    /// `pos`, if there is one.
    fn contraction_at(&self, pos: usize, ignore_case: bool) -> Option<usize> {
        if self.char_at(pos) != Some('\'') {
            return None;
        }
        let letter = |i| {
            self.char_at(i).map(|c: char| {
                if ignore_case {
                    c.to_ascii_lowercase()
                } else {
                    c
                }
            })
        };
        match (letter(pos + 1)?, letter(pos + 2)) {
            ('s' | 't' | 'm' | 'd', _) => Some(2),
            ('r', Some('e')) | ('v', Some('e')) | ('l', Some('l')) => Some(3),
            _ => None,
        }
    }

    /// The number of whitespace codepoints from `pos` on, and the end of the last `\r` or
    /// `\n` among them.
    fn whitespace_run(&self, pos: usize) -> (usize, Option<usize>) {
        let mut count = 0;
        let mut newline_end = None;
        while self.flags_at(pos + count).is_whitespace() {
            if self.is_newline_at(pos + count) {
                newline_end = Some(pos + count + 1);
            }
            count += 1;
        }
        (count, newline_end)
    }

    /// Where `\s+(?!\S)|\s+` ends for a whitespace run of `count` at `pos` (a run followed
    /// by a character leaves its last space to that character's word); one codepoint on
    /// when nothing matched.
    fn end_of_spaces(&self, pos: usize, count: usize) -> usize {
        if count > 1 && pos + count < self.len() {
            pos + count - 1
        } else {
            pos + count.max(1)
        }
    }
}

/// Collects the words of a piece: each cut ends the word that the previous cut started.
struct Cutter<'o> {
    out: &'o mut Vec<Range<usize>>,
    base: usize,
    last: usize,
}

impl<'o> Cutter<'o> {
    fn new(out: &'o mut Vec<Range<usize>>, base: usize) -> Cutter<'o> {
        Cutter { out, base, last: 0 }
    }

    fn cut(&mut self, end: usize) {
        if end > self.last {
            self.out.push(self.base + self.last..self.base + end);
        }
        self.last = end;
    }
}

fn split_gpt2(w: &Window<'_>, cut: &mut Cutter<'_>) {
    let n = w.len();
    let mut pos = 0;
    while pos < n {
        if let Some(len) = w.contraction_at(pos, false) {
            pos += len;
            cut.cut(pos);
            continue;
        }
        let space = usize::from(w.chars[pos] == ' ');
        // ` ?X+` for X in letters, numbers, and neither-nor-whitespace.
        let next = if space == 1 {
            w.flags_at(pos + 1)
        } else {
            w.flags[pos]
        };
        let is_other =
            |f: CharFlags| !(f.is_whitespace() || f.is_letter() || f.is_number()) && f.exists();
        let class: Option<fn(CharFlags) -> bool> = if next.is_letter() {
            Some(CharFlags::is_letter)
        } else if next.is_number() {
            Some(CharFlags::is_number)
        } else if is_other(next) {
            Some(is_other)
        } else {
            None
        };
        if let Some(class) = class {
            pos += space;
            while class(w.flags_at(pos)) {
                pos += 1;
            }
            cut.cut(pos);
            continue;
        }
        let (count, _) = w.whitespace_run(pos);
        pos = w.end_of_spaces(pos, count);
        cut.cut(pos);
    }
}

fn split_llama3_like(
    w: &Window<'_>,
    cut: &mut Cutter<'_>,
    max_digits: usize,
    marks_join_letters: bool,
) {
    let is_word = |f: CharFlags| f.is_letter() || (marks_join_letters && f.is_mark());
    let n = w.len();
    let mut pos = 0;
    while pos < n {
        if let Some(len) = w.contraction_at(pos, true) {
            pos += len;
            cut.cut(pos);
            continue;
        }
        let c = w.chars[pos];
        let flags = w.flags[pos];
        // `[^\r\n\p{L}\p{N}]?\p{L}+`
        if !(c == '\r' || c == '\n' || flags.is_number())
            && (is_word(flags) || is_word(w.flags_at(pos + 1)))
        {
            pos += 1;
            while is_word(w.flags_at(pos)) {
                pos += 1;
            }
            cut.cut(pos);
            continue;
        }
        // `\p{N}{1,max_digits}`, repeatedly
        if flags.is_number() {
            pos = cut_digit_run(w, cut, pos, max_digits);
            continue;
        }
        // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
        let is_other = |f: CharFlags| !(f.is_whitespace() || is_word(f) || f.is_number());
        let space = usize::from(c == ' ');
        let next = if space == 1 {
            w.flags_at(pos + 1)
        } else {
            flags
        };
        if is_other(next) {
            pos += space;
            while is_other(w.flags_at(pos)) && w.flags_at(pos).exists() {
                pos += 1;
            }
            while w.is_newline_at(pos) {
                pos += 1;
            }
            cut.cut(pos);
            continue;
        }
        pos = end_of_whitespace_with_newlines(w, pos);
        cut.cut(pos);
    }
}

/// Cuts the digit run at `pos` every `max_digits`; returns its end.
fn cut_digit_run(w: &Window<'_>, cut: &mut Cutter<'_>, mut pos: usize, max_digits: usize) -> usize {
    let mut group = 0;
    while w.flags_at(pos).is_number() {
        pos += 1;
        group += 1;
        if group == max_digits {
            cut.cut(pos);
            group = 0;
        }
    }
    cut.cut(pos);
    pos
}

/// `\s*[\r\n]+|\s+(?!\S)|\s+` at `pos`, or one codepoint when none matches.
fn end_of_whitespace_with_newlines(w: &Window<'_>, pos: usize) -> usize {
    match w.whitespace_run(pos) {
        (_, Some(newline_end)) => newline_end,
        (count, None) => w.end_of_spaces(pos, count),
    }
}

fn split_kimi_k2(w: &Window<'_>, cut: &mut Cutter<'_>) {
    let is_han_at = |i: usize| w.char_at(i).is_some_and(is_han);
    let is_plain_letter_at = |i: usize| w.flags_at(i).is_letter() && !is_han_at(i);
    let n = w.len();
    let mut pos = 0;
    while pos < n {
        let c = w.chars[pos];
        let flags = w.flags[pos];
        // `[\p{Han}]+`
        if is_han(c) {
            while is_han_at(pos) {
                pos += 1;
            }
            cut.cut(pos);
            continue;
        }
        // `[^\r\n\p{L}\p{N}]?` then non-Han letters (llama.cpp does not tell case apart),
        // then an optional contraction.
        let can_lead = !(c == '\r' || c == '\n' || flags.is_letter() || flags.is_number());
        if is_plain_letter_at(pos) || (can_lead && is_plain_letter_at(pos + 1)) {
            pos += usize::from(can_lead);
            while is_plain_letter_at(pos) {
                pos += 1;
            }
            pos += w.contraction_at(pos, true).unwrap_or(0);
            cut.cut(pos);
            continue;
        }
        // `\p{N}{1,3}`
        if flags.is_number() {
            pos = cut_digit_run(w, cut, pos, 3);
            continue;
        }
        // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
        let is_other =
            |f: CharFlags| !(f.is_whitespace() || f.is_letter() || f.is_number()) && f.exists();
        let space = usize::from(c == ' ');
        let next = if space == 1 {
            w.flags_at(pos + 1)
        } else {
            flags
        };
        if is_other(next) {
            pos += space;
            while is_other(w.flags_at(pos)) {
                pos += 1;
            }
            while w.is_newline_at(pos) {
                pos += 1;
            }
            cut.cut(pos);
            continue;
        }
        pos = end_of_whitespace_with_newlines(w, pos);
        cut.cut(pos);
    }
}

/// Digit runs in groups of three from the right; the text before a run ends with its
/// leading short group (or its first full group), as in llama.cpp.
fn split_digit_groups(w: &Window<'_>, cut: &mut Cutter<'_>) {
    let n = w.len();
    let mut pos = 0;
    while pos < n {
        if !w.flags[pos].is_number() {
            pos += 1;
            continue;
        }
        let start = pos;
        while w.flags_at(pos).is_number() {
            pos += 1;
        }
        let mut group_end = start + (pos - start) % 3;
        if group_end > start {
            cut.cut(group_end);
        }
        while group_end < pos {
            group_end += 3;
            cut.cut(group_end);
        }
    }
    cut.cut(n);
}

fn split_newline_runs(w: &Window<'_>, cut: &mut Cutter<'_>) {
    let n = w.len();
    let mut pos = 0;
    while pos < n {
        let newline = w.chars[pos] == '\n';
        while pos < n && (w.chars[pos] == '\n') == newline {
            pos += 1;
        }
        cut.cut(pos);
    }
}

fn split_thousands(w: &Window<'_>, cut: &mut Cutter<'_>) {
    let n = w.len();
    let mut pos = 0;
    while pos < n {
        if !w.chars[pos].is_ascii_digit() {
            pos += 1;
            continue;
        }
        let start = pos;
        while w.char_at(pos).is_some_and(|c| c.is_ascii_digit()) {
            pos += 1;
        }
        let mut boundary = start + (pos - start) % 3;
        while boundary < pos {
            cut.cut(boundary);
            boundary += 3;
        }
    }
    cut.cut(n);
}

impl Step {
    fn compile(expr: &str) -> Result<Step, TokenizerError> {
        Ok(match expr {
            GPT2 => Step::Gpt2,
            LLAMA3 => Step::Llama3Like {
                max_digits: 3,
                marks_join_letters: false,
            },
            QWEN2 => Step::Llama3Like {
                max_digits: 1,
                marks_join_letters: false,
            },
            QWEN35 => Step::Llama3Like {
                max_digits: 1,
                marks_join_letters: true,
            },
            KIMI_K2 => Step::KimiK2,
            AFMOE_DIGITS | TINY_AYA_DIGITS => Step::DigitGroups,
            NEWLINE_RUNS => Step::NewlineRuns,
            THOUSANDS_BOUNDARIES => Step::ThousandsBoundaries,
            _ => {
                let haystack = if uses_categories(expr) {
                    HaystackKind::Collapsed
                } else {
                    HaystackKind::Wide
                };
                let translated = translate_regex(expr, haystack);
                let regex = Regex::new(&translated).map_err(|e| {
                    TokenizerError::Invalid(format!("pre-tokenizer regex {expr:?}: {e}"))
                })?;
                Step::Regex { regex, haystack }
            }
        })
    }

    fn split(
        &self,
        text: &Codepoints,
        piece: Range<usize>,
        haystacks: &mut Haystacks,
        out: &mut Vec<Range<usize>>,
    ) {
        let window = Window {
            chars: &text.chars[piece.clone()],
            flags: &text.flags[piece.clone()],
        };
        let mut cut = Cutter::new(out, piece.start);
        match self {
            Step::Gpt2 => split_gpt2(&window, &mut cut),
            &Step::Llama3Like {
                max_digits,
                marks_join_letters,
            } => split_llama3_like(&window, &mut cut, max_digits, marks_join_letters),
            Step::KimiK2 => split_kimi_k2(&window, &mut cut),
            Step::DigitGroups => split_digit_groups(&window, &mut cut),
            Step::NewlineRuns => split_newline_runs(&window, &mut cut),
            Step::ThousandsBoundaries => split_thousands(&window, &mut cut),
            Step::Regex { regex, haystack } => {
                let haystack = haystacks.get(*haystack, text);
                split_by_regex(regex, haystack, piece, &mut cut);
            }
        }
    }
}

/// Matches and the gaps between them, as llama.cpp's `unicode_regex_split_stl`.
fn split_by_regex(regex: &Regex, haystack: &Haystack, piece: Range<usize>, cut: &mut Cutter<'_>) {
    let base = haystack.starts[piece.start];
    let text = &haystack.text[base..haystack.starts[piece.end]];
    let to_position = |byte: usize| haystack.position(piece.clone(), base + byte) - piece.start;
    for found in regex.find_iter(text) {
        // Past fancy-regex's backtracking limit the rest of the piece stays whole.
        let Ok(found) = found else { break };
        cut.cut(to_position(found.start()));
        cut.cut(to_position(found.end()));
    }
    cut.cut(piece.len());
}

/// The text a generic regex runs over, one char per codepoint of the original text.
struct Haystack {
    text: String,
    /// The byte offset of each char, then the text's length.
    starts: Vec<usize>,
}

impl Haystack {
    fn build(text: &Codepoints, kind: HaystackKind) -> Haystack {
        let mut haystack = String::with_capacity(text.chars.len());
        let mut starts = Vec::with_capacity(text.chars.len() + 1);
        for (&c, &flags) in text.chars.iter().zip(&text.flags) {
            starts.push(haystack.len());
            haystack.push(match kind {
                _ if c.is_ascii() => c,
                // std::regex's `\s` knows only ASCII whitespace, hence llama.cpp's stand-in.
                _ if flags.is_whitespace() => '\x0B',
                HaystackKind::Wide => c,
                HaystackKind::Collapsed => stand_in(flags.category()),
            });
        }
        starts.push(haystack.len());
        Haystack {
            text: haystack,
            starts,
        }
    }

    /// The codepoint index (in the original text) of byte `byte` of the haystack, which lies
    /// within `piece`.
    fn position(&self, piece: Range<usize>, byte: usize) -> usize {
        piece.start + self.starts[piece.start..=piece.end].partition_point(|&start| start < byte)
    }
}

/// The two haystacks, each built on first use.
#[derive(Default)]
struct Haystacks {
    collapsed: Option<Haystack>,
    wide: Option<Haystack>,
}

impl Haystacks {
    fn get(&mut self, kind: HaystackKind, text: &Codepoints) -> &Haystack {
        let slot = match kind {
            HaystackKind::Collapsed => &mut self.collapsed,
            HaystackKind::Wide => &mut self.wide,
        };
        slot.get_or_insert_with(|| Haystack::build(text, kind))
    }
}

/// The `\p{..}` classes llama.cpp collapses; `\p{Lu}`... all stand for every letter.
const COLLAPSED_CLASSES: [(&str, Category); 10] = [
    ("\\p{N}", Category::Number),
    ("\\p{L}", Category::Letter),
    ("\\p{P}", Category::Punctuation),
    ("\\p{M}", Category::Mark),
    ("\\p{S}", Category::Symbol),
    ("\\p{Lu}", Category::Letter),
    ("\\p{Ll}", Category::Letter),
    ("\\p{Lt}", Category::Letter),
    ("\\p{Lm}", Category::Letter),
    ("\\p{Lo}", Category::Letter),
];

fn uses_categories(expr: &str) -> bool {
    COLLAPSED_CLASSES
        .iter()
        .any(|(class, _)| expr.contains(class))
}

/// The char a non-ASCII, non-whitespace codepoint becomes in the collapsed text: one
/// private-use char per class llama.cpp collapses, another for all the rest.
fn stand_in(category: Option<Category>) -> char {
    match category {
        Some(Category::Number) => '\u{E0D1}',
        Some(Category::Letter) => '\u{E0D2}',
        Some(Category::Punctuation) => '\u{E0D3}',
        Some(Category::Mark) => '\u{E0D4}',
        Some(Category::Symbol) => '\u{E0D5}',
        _ => '\u{E0D0}',
    }
}

/// The ASCII members of a collapsed class, as regex class items.
fn ascii_members(category: Category) -> &'static str {
    match category {
        Category::Number => "0-9",
        Category::Letter => "A-Za-z",
        Category::Punctuation => "!-#%-*,-/:-;?-@\\[-\\]_\\{\\}",
        Category::Symbol => "\\$\\+<->\\^`\\|\\~",
        _ => "",
    }
}

/// Rewrites a llama.cpp regex (ECMAScript) for fancy-regex over the given haystack:
/// collapsed `\p{..}` classes become their stand-in plus ASCII members, and `\d` (ASCII
/// only in `std::regex`) becomes `0-9`.
fn translate_regex(expr: &str, haystack: HaystackKind) -> String {
    let mut out = String::with_capacity(expr.len() * 2);
    let mut in_class = false;
    let mut rest = expr;
    while let Some(c) = rest.chars().next() {
        if c == '\\' {
            let class = COLLAPSED_CLASSES
                .iter()
                .find(|(name, _)| rest.starts_with(name))
                .filter(|_| haystack == HaystackKind::Collapsed);
            let (members, consumed) = if let Some(&(name, category)) = class {
                let stand_in = stand_in(Some(category)) as u32;
                let members = format!("\\x{{{stand_in:X}}}{}", ascii_members(category));
                (Some(members), name.len())
            } else if rest.starts_with("\\d") {
                (Some("0-9".to_string()), 2)
            } else {
                // Any other escape is copied with the char it escapes.
                let escaped = rest[1..].chars().next().map_or(0, char::len_utf8);
                (None, 1 + escaped)
            };
            match members {
                Some(members) if in_class => out.push_str(&members),
                Some(members) => {
                    out.push('[');
                    out.push_str(&members);
                    out.push(']');
                }
                None => out.push_str(&rest[..consumed]),
            }
            rest = &rest[consumed..];
            continue;
        }
        if c == '[' {
            in_class = true;
        } else if c == ']' {
            in_class = false;
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every pre-tokenizer name llama.cpp knows.
    const ALL_PRE_NAMES: &[&str] = &[
        "default",
        "llama3",
        "llama-v3",
        "llama-bpe",
        "falcon3",
        "falcon-h1",
        "pixtral",
        "midm-2.0",
        "lfm2",
        "jina-v5-nano",
        "deepseek-llm",
        "deepseek-coder",
        "deepseek-v3",
        "spark2_5",
        "youtu",
        "falcon",
        "mpt",
        "starcoder",
        "gpt-2",
        "phi-2",
        "jina-es",
        "jina-de",
        "gigachat",
        "jina-v2-es",
        "jina-v2-de",
        "a.x-4.0",
        "mellum",
        "modern-bert",
        "jais-2",
        "gemma4",
        "granite-embed-multi-311m",
        "mmbert",
        "sarvam-moe",
        "jina-v1-en",
        "jina-v2-code",
        "roberta-bpe",
        "whitespace",
        "refact",
        "command-r",
        "qwen2",
        "deepseek-r1-qwen",
        "kormo",
        "f2llmv2",
        "qwen35",
        "stablelm2",
        "olmo",
        "dbrx",
        "smaug-bpe",
        "poro-chat",
        "chatglm-bpe",
        "glm4",
        "glm5",
        "viking",
        "jais",
        "tekken",
        "smollm",
        "codeshell",
        "bloom",
        "gpt3-finnish",
        "exaone",
        "exaone4",
        "exaone-moe",
        "chameleon",
        "minerva-7b",
        "megrez",
        "gpt-4o",
        "llama4",
        "kanana2",
        "talkie",
        "granite-embed-multi-97m",
        "tiny_aya",
        "cohere2moe",
        "superbpe",
        "trillion",
        "granite-docling",
        "bailingmoe",
        "bailingmoe2",
        "llada-moe",
        "seed-coder",
        "hunyuan",
        "hunyuan-dense",
        "hy_v4",
        "joyai-llm",
        "kimi-k2",
        "ufakzeka",
        "grok-2",
        "afmoe",
        "laguna",
        "minimax-m2",
        "solar-open",
        "mellum2",
        "minicpm5",
    ];

    fn words(pre: &str, text: &str) -> Vec<String> {
        let pre = PreTokenizer::new(Some(pre)).unwrap();
        let mut ranges = Vec::new();
        pre.split(text, &mut ranges);
        let mut end = 0;
        for r in &ranges {
            assert_eq!(r.start, end, "words must tile the text");
            assert!(r.end > r.start, "no empty word");
            end = r.end;
        }
        assert_eq!(end, text.len());
        ranges.into_iter().map(|r| text[r].to_string()).collect()
    }

    /// llama.cpp's own splits of tricky inputs (digit runs, contractions, whitespace runs,
    /// CJK, emoji, newlines, marks...) for one pre-tokenizer of each type, made by
    /// `scripts/gen-pretokenize-fixtures.py`.
    #[test]
    fn splits_match_llama_cpp() {
        let fixtures = include_str!("../../tests/fixtures/pretokenize-words.jsonl");
        let mut failures = Vec::new();
        let mut cases = 0;
        for line in fixtures.lines() {
            let case: serde_json::Value = serde_json::from_str(line).unwrap();
            let pre = case["pre"].as_str().unwrap();
            let text = case["text"].as_str().unwrap();
            let expected: Vec<&str> = case["words"]
                .as_array()
                .unwrap()
                .iter()
                .map(|w| w.as_str().unwrap())
                .collect();
            let got = words(pre, text);
            if got != expected {
                failures.push(format!(
                    "{pre} {text:?}\n  want {expected:?}\n  got  {got:?}"
                ));
            }
            cases += 1;
        }
        assert!(cases > 700, "fixture has only {cases} cases");
        assert!(
            failures.is_empty(),
            "{} of {cases} differ:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }

    #[test]
    fn every_known_pre_tokenizer_compiles() {
        for name in ALL_PRE_NAMES {
            let pre = PreTokenizer::new(Some(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
            let mut out = Vec::new();
            pre.split("Hello, World! 123 4567 ça  va?\n\n 中文 🦙 'll", &mut out);
            assert!(!out.is_empty(), "{name}");
        }
        assert!(PreTokenizer::new(None).is_ok());
    }

    /// Long runs of one class are where a backtracking regex or a careless splitter turns
    /// quadratic; every pre-tokenizer must split them in one pass and tile them exactly.
    #[test]
    fn long_runs_split_in_linear_time() {
        let n = std::env::var("FERROX_PRETOKENIZE_RUN")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(10_000);
        let runs = [
            " ".repeat(n),
            "a".repeat(n),
            "A".repeat(n),
            "aA".repeat(n / 2),
            "7".repeat(n),
            "!".repeat(n),
            "\n".repeat(n),
            " \n".repeat(n / 2),
            "\u{3000}".repeat(n),
            "中".repeat(n),
            "\u{0301}".repeat(n),
            "🦙".repeat(n),
            "'s".repeat(n / 2),
        ];
        for name in ALL_PRE_NAMES {
            let pre = PreTokenizer::new(Some(name)).unwrap();
            for run in &runs {
                let start = std::time::Instant::now();
                let mut ranges = Vec::new();
                pre.split(run, &mut ranges);
                let mut end = 0;
                for r in &ranges {
                    assert!(r.start == end && r.end > r.start, "{name}: words must tile");
                    end = r.end;
                }
                assert_eq!(end, run.len(), "{name}");
                let elapsed = start.elapsed();
                assert!(
                    elapsed.as_secs() < 5,
                    "{name} took {elapsed:?} on {:?}",
                    &run[..8]
                );
            }
        }
    }

    #[test]
    fn unknown_pre_tokenizer_is_an_error_naming_it() {
        match PreTokenizer::new(Some("no-such-pre")) {
            Err(TokenizerError::UnknownPreTokenizer(name)) => assert_eq!(name, "no-such-pre"),
            Err(e) => panic!("wrong error {e}"),
            Ok(_) => panic!("unknown pre accepted"),
        }
    }

    #[test]
    fn collapsed_regex_translation() {
        assert_eq!(
            translate_regex("[^\\r\\n\\p{L}\\p{N}]?\\p{L}+", HaystackKind::Collapsed),
            "[^\\r\\n\\x{E0D2}A-Za-z\\x{E0D1}0-9]?[\\x{E0D2}A-Za-z]+"
        );
        assert_eq!(
            translate_regex("(?=(\\d{3})+(?!\\d))", HaystackKind::Wide),
            "(?=([0-9]{3})+(?![0-9]))"
        );
        assert_eq!(
            translate_regex("[\\[\\]]\\p{M}", HaystackKind::Collapsed),
            "[\\[\\]][\\x{E0D4}]"
        );
    }
}
