//! The vocabulary of a GGUF checkpoint: token texts, scores and attributes, special ids and
//! the tokenizer flags, with every default and per-model quirk of llama.cpp's
//! `llama_vocab::impl::load`.

use std::collections::BTreeSet;

use ferrox_gguf::{Metadata, ValueType};
use rustc_hash::FxHashMap;

use super::{libstdcxx, TokenizerError};

/// Index of a token in the vocabulary.
pub type TokenId = u32;

/// A token's type as stored in `tokenizer.ggml.token_type` (llama.cpp's `llama_token_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenType {
    Undefined,
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

/// The algorithm family a vocabulary belongs to (llama.cpp's `llama_vocab_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VocabKind {
    /// `none` / `no_vocab`: the model has no tokenizer.
    None,
    /// `llama`: SentencePiece BPE with byte fallback.
    Spm,
    /// `gpt2`, `gemma4`, `hybriddna`, `whitespace`: byte-level BPE.
    Bpe,
    /// `bert`: WordPiece.
    Wpm,
    /// `t5`: SentencePiece unigram.
    Ugm,
    /// `rwkv`.
    Rwkv,
    /// `plamo2`.
    Plamo2,
    /// `test`.
    Test,
}

/// Per-token attribute bits, the same values as llama.cpp's `llama_token_attr`. llama.cpp
/// derives them from the token type, then adjusts them by token text and model name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TokenAttr(pub u32);

impl TokenAttr {
    pub const UNDEFINED: TokenAttr = TokenAttr(0);
    pub const UNKNOWN: TokenAttr = TokenAttr(1 << 0);
    pub const UNUSED: TokenAttr = TokenAttr(1 << 1);
    pub const NORMAL: TokenAttr = TokenAttr(1 << 2);
    pub const CONTROL: TokenAttr = TokenAttr(1 << 3);
    pub const USER_DEFINED: TokenAttr = TokenAttr(1 << 4);
    pub const BYTE: TokenAttr = TokenAttr(1 << 5);
    pub const NORMALIZED: TokenAttr = TokenAttr(1 << 6);
    pub const LSTRIP: TokenAttr = TokenAttr(1 << 7);
    pub const RSTRIP: TokenAttr = TokenAttr(1 << 8);
    pub const SINGLE_WORD: TokenAttr = TokenAttr(1 << 9);

    /// Whether any of the bits of `other` is set.
    pub fn intersects(self, other: TokenAttr) -> bool {
        self.0 & other.0 != 0
    }

    fn set(&mut self, bits: TokenAttr, on: bool) {
        if on {
            self.0 |= bits.0;
        } else {
            self.0 &= !bits.0;
        }
    }
}

impl std::ops::BitOr for TokenAttr {
    type Output = TokenAttr;
    fn bitor(self, rhs: TokenAttr) -> TokenAttr {
        TokenAttr(self.0 | rhs.0)
    }
}

impl TokenType {
    /// llama.cpp's mapping from the stored type to the initial attributes (unknown type
    /// codes become `UNDEFINED`).
    fn from_code(code: i32) -> TokenType {
        match code {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Undefined,
        }
    }

    fn attr(self) -> TokenAttr {
        match self {
            TokenType::Undefined => TokenAttr::UNDEFINED,
            TokenType::Normal => TokenAttr::NORMAL,
            TokenType::Unknown => TokenAttr::UNKNOWN,
            TokenType::Control => TokenAttr::CONTROL,
            TokenType::UserDefined => TokenAttr::USER_DEFINED,
            TokenType::Unused => TokenAttr::UNUSED,
            TokenType::Byte => TokenAttr::BYTE,
        }
    }
}

/// Options of BERT's normalizer (`tokenizer.ggml.normalizer.*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NormalizerOptions {
    pub lowercase: bool,
    pub strip_accents: bool,
}

/// The special token ids a vocabulary may define.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct SpecialIds {
    bos: Option<TokenId>,
    eos: Option<TokenId>,
    eot: Option<TokenId>,
    eom: Option<TokenId>,
    unk: Option<TokenId>,
    sep: Option<TokenId>,
    pad: Option<TokenId>,
    mask: Option<TokenId>,
    fim_pre: Option<TokenId>,
    fim_suf: Option<TokenId>,
    fim_mid: Option<TokenId>,
    fim_pad: Option<TokenId>,
    fim_rep: Option<TokenId>,
    fim_sep: Option<TokenId>,
}

/// Selects one special id of [`SpecialIds`].
type SlotOf = fn(&mut SpecialIds) -> &mut Option<TokenId>;

#[derive(Clone, Copy, Debug)]
struct Flags {
    add_space_prefix: bool,
    add_bos: bool,
    add_eos: bool,
    add_sep: bool,
    ignore_merges: bool,
    clean_spaces: bool,
    remove_extra_whitespaces: bool,
    escape_whitespaces: bool,
    treat_whitespace_as_suffix: bool,
}

impl Default for Flags {
    /// The member initialisers of llama.cpp's `llama_vocab::impl`.
    fn default() -> Self {
        Flags {
            add_space_prefix: false,
            add_bos: false,
            add_eos: false,
            add_sep: false,
            ignore_merges: false,
            clean_spaces: false,
            remove_extra_whitespaces: false,
            escape_whitespaces: true,
            treat_whitespace_as_suffix: false,
        }
    }
}

/// A tokenizer vocabulary loaded from GGUF metadata.
pub struct Vocab {
    model: String,
    pre: Option<String>,
    kind: VocabKind,
    texts: Vec<Box<str>>,
    scores: Vec<f32>,
    types: Vec<TokenType>,
    attrs: Vec<TokenAttr>,
    /// Text to id; Fx hashing because tokenizers look up every candidate piece here.
    token_to_id: FxHashMap<Box<str>, TokenId>,
    merges: Vec<Box<str>>,
    precompiled_charsmap: Option<Vec<u8>>,
    special: SpecialIds,
    eog: BTreeSet<TokenId>,
    flags: Flags,
    normalizer: NormalizerOptions,
    max_token_len: usize,
    byte_tokens: [Option<TokenId>; 256],
    linefeed: Option<TokenId>,
    /// Control, user-defined and unknown tokens, longest text first: the order llama.cpp's
    /// special-token partition tries them in.
    special_tokens: Vec<TokenId>,
}

impl std::fmt::Debug for Vocab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vocab")
            .field("model", &self.model)
            .field("pre", &self.pre)
            .field("len", &self.texts.len())
            .field("special", &self.special)
            .field("flags", &self.flags)
            .finish_non_exhaustive()
    }
}

const KEY_MODEL: &str = "tokenizer.ggml.model";
const KEY_PRE: &str = "tokenizer.ggml.pre";
const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
const KEY_SCORES: &str = "tokenizer.ggml.scores";
const KEY_TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
const KEY_MERGES: &str = "tokenizer.ggml.merges";
const KEY_CHARSMAP: &str = "tokenizer.ggml.precompiled_charsmap";

/// Token texts whose presence makes llama.cpp treat them as end of generation.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];

fn invalid(msg: impl Into<String>) -> TokenizerError {
    TokenizerError::Invalid(msg.into())
}

/// Most tokens a file without a vocabulary may declare (`{arch}.vocab_size`): eight times the
/// largest vocabularies in use (262,144 tokens).
const MAX_PLACEHOLDER_TOKENS: usize = 1 << 21;

impl Vocab {
    /// Loads the vocabulary from a file's metadata, as llama.cpp's `llama_vocab::impl::load`.
    pub fn from_gguf(meta: &Metadata<'_>) -> Result<Vocab, TokenizerError> {
        let model = meta.get_str(KEY_MODEL)?.to_string();
        let mut pre = meta.opt_str(KEY_PRE)?.map(str::to_string);
        let mut flags = Flags::default();
        let mut special = SpecialIds {
            bos: Some(1),
            eos: Some(2),
            unk: Some(0),
            ..SpecialIds::default()
        };

        let kind = match model.as_str() {
            "no_vocab" | "none" => return Self::without_vocab(meta, model, pre),
            "llama" => VocabKind::Spm,
            "bert" => {
                special = SpecialIds {
                    bos: Some(101),
                    unk: Some(100),
                    sep: Some(102),
                    pad: Some(0),
                    mask: Some(103),
                    ..SpecialIds::default()
                };
                flags.add_sep = true;
                VocabKind::Wpm
            }
            "gpt2" | "hybriddna" | "whitespace" => {
                special = SpecialIds {
                    bos: Some(11),
                    eos: Some(11),
                    ..SpecialIds::default()
                };
                VocabKind::Bpe
            }
            "t5" => {
                special = SpecialIds {
                    eos: Some(1),
                    unk: Some(2),
                    pad: Some(0),
                    ..SpecialIds::default()
                };
                VocabKind::Ugm
            }
            "rwkv" => {
                special = SpecialIds::default();
                VocabKind::Rwkv
            }
            "test" => {
                special = SpecialIds::default();
                VocabKind::Test
            }
            "plamo2" => {
                special = SpecialIds {
                    bos: Some(1),
                    eos: Some(2),
                    unk: Some(0),
                    pad: Some(3),
                    ..SpecialIds::default()
                };
                VocabKind::Plamo2
            }
            "gemma4" => {
                special = SpecialIds::default();
                pre = Some("gemma4".to_string());
                VocabKind::Bpe
            }
            other => return Err(TokenizerError::UnknownModel(other.to_string())),
        };

        let merges = if kind == VocabKind::Bpe {
            read_merges(meta, &model, pre.as_deref())?
        } else {
            Vec::new()
        };
        let precompiled_charsmap = if kind == VocabKind::Ugm {
            read_precompiled_charsmap(meta)?
        } else {
            None
        };

        let mut normalizer = NormalizerOptions {
            lowercase: true,
            strip_accents: true,
        };
        match kind {
            VocabKind::Bpe => {
                flags.add_space_prefix = false;
                flags.escape_whitespaces = false;
                flags.clean_spaces = true;
                apply_pre_tokenizer_flags(
                    pre.as_deref(),
                    &mut flags,
                    &mut special,
                    &mut normalizer,
                )?;
            }
            VocabKind::Spm => {
                flags.add_space_prefix = true;
                flags.clean_spaces = false;
                flags.add_bos = true;
                flags.add_eos = false;
            }
            VocabKind::Wpm => {
                flags.add_space_prefix = false;
                flags.clean_spaces = true;
                flags.add_bos = true;
                flags.add_eos = false;
                flags.add_sep = true;
            }
            VocabKind::Ugm => {
                flags.add_bos = false;
                flags.add_eos = true;
            }
            VocabKind::Rwkv => {
                flags.add_space_prefix = false;
                flags.clean_spaces = false;
                flags.add_bos = false;
                flags.add_eos = false;
            }
            VocabKind::None | VocabKind::Plamo2 | VocabKind::Test => {}
        }
        if let Some(v) = meta.opt_bool("tokenizer.ggml.add_space_prefix")? {
            flags.add_space_prefix = v;
        }
        if let Some(v) = meta.opt_bool("tokenizer.ggml.remove_extra_whitespaces")? {
            flags.remove_extra_whitespaces = v;
        }

        let (texts, scores, types, token_to_id) = read_tokens(meta)?;
        let mut attrs: Vec<TokenAttr> = types.iter().map(|t| t.attr()).collect();
        if types.is_empty() && !texts.is_empty() {
            attrs = vec![TokenAttr::NORMAL; texts.len()];
        }
        let max_token_len = texts.iter().map(|t| t.len()).max().unwrap_or(0);

        let mut vocab = Vocab {
            model,
            pre,
            kind,
            scores,
            types: Vec::new(),
            attrs,
            token_to_id,
            merges,
            precompiled_charsmap,
            special,
            eog: BTreeSet::new(),
            flags,
            normalizer,
            max_token_len,
            byte_tokens: [None; 256],
            linefeed: None,
            special_tokens: Vec::new(),
            texts,
        };
        vocab.types = if types.is_empty() {
            vec![TokenType::Normal; vocab.texts.len()]
        } else {
            types
        };
        vocab.byte_tokens = vocab.find_byte_tokens();
        if kind == VocabKind::Spm {
            vocab.linefeed = vocab.byte_tokens[usize::from(b'\n')].or(vocab.special.pad);
        }
        vocab.read_special_ids(meta)?;
        vocab.read_add_flags(meta)?;
        if let Some(v) = meta.opt_bool("tokenizer.ggml.normalizer.lowercase")? {
            vocab.normalizer.lowercase = v;
        }
        vocab.normalizer.strip_accents = vocab.normalizer.lowercase;
        if let Some(v) = meta.opt_bool("tokenizer.ggml.normalizer.strip_accents")? {
            vocab.normalizer.strip_accents = v;
        }
        vocab.detect_special_tokens_by_text();
        vocab.mark_unused_controls();
        vocab.build_eog_set();
        vocab.special_tokens = vocab.sorted_special_tokens();
        vocab.apply_model_specific_attrs(meta)?;
        Ok(vocab)
    }

    /// A `none`/`no_vocab` model: `{arch}.vocab_size` empty placeholder tokens, no specials.
    fn without_vocab(
        meta: &Metadata<'_>,
        model: String,
        pre: Option<String>,
    ) -> Result<Vocab, TokenizerError> {
        let n_tokens = match meta.opt_str("general.architecture")? {
            Some(arch) => {
                let key = format!("{arch}.vocab_size");
                let n = meta.opt_u32(&key)?.unwrap_or(0) as usize;
                // Nothing in the metadata backs this count, and each placeholder costs memory.
                if n > MAX_PLACEHOLDER_TOKENS {
                    return Err(invalid(format!(
                        "`{key}` = {n}: more than the {MAX_PLACEHOLDER_TOKENS} placeholder \
                         tokens allowed without a vocabulary"
                    )));
                }
                n
            }
            None => 0,
        };
        Ok(Vocab {
            model,
            pre,
            kind: VocabKind::None,
            texts: vec![Box::from(""); n_tokens],
            scores: vec![0.0; n_tokens],
            types: vec![TokenType::Undefined; n_tokens],
            attrs: vec![TokenAttr::UNDEFINED; n_tokens],
            token_to_id: FxHashMap::default(),
            merges: Vec::new(),
            precompiled_charsmap: None,
            special: SpecialIds::default(),
            eog: BTreeSet::new(),
            flags: Flags::default(),
            normalizer: NormalizerOptions {
                lowercase: true,
                strip_accents: true,
            },
            max_token_len: 0,
            byte_tokens: [None; 256],
            linefeed: None,
            special_tokens: Vec::new(),
        })
    }

    /// Special ids from the metadata: an id past the vocabulary keeps the default, and a
    /// default past the vocabulary is dropped (llama.cpp only warns in both cases).
    fn read_special_ids(&mut self, meta: &Metadata<'_>) -> Result<(), TokenizerError> {
        let n = self.texts.len() as u64;
        let slots: [(&str, SlotOf); 17] = [
            ("tokenizer.ggml.bos_token_id", |s| &mut s.bos),
            ("tokenizer.ggml.eos_token_id", |s| &mut s.eos),
            ("tokenizer.ggml.eot_token_id", |s| &mut s.eot),
            ("tokenizer.ggml.eom_token_id", |s| &mut s.eom),
            ("tokenizer.ggml.unknown_token_id", |s| &mut s.unk),
            ("tokenizer.ggml.seperator_token_id", |s| &mut s.sep),
            ("tokenizer.ggml.padding_token_id", |s| &mut s.pad),
            ("tokenizer.ggml.mask_token_id", |s| &mut s.mask),
            ("tokenizer.ggml.fim_pre_token_id", |s| &mut s.fim_pre),
            ("tokenizer.ggml.fim_suf_token_id", |s| &mut s.fim_suf),
            ("tokenizer.ggml.fim_mid_token_id", |s| &mut s.fim_mid),
            ("tokenizer.ggml.fim_pad_token_id", |s| &mut s.fim_pad),
            ("tokenizer.ggml.fim_rep_token_id", |s| &mut s.fim_rep),
            ("tokenizer.ggml.fim_sep_token_id", |s| &mut s.fim_sep),
            // Deprecated spellings, applied after the current ones as llama.cpp does.
            ("tokenizer.ggml.prefix_token_id", |s| &mut s.fim_pre),
            ("tokenizer.ggml.suffix_token_id", |s| &mut s.fim_suf),
            ("tokenizer.ggml.middle_token_id", |s| &mut s.fim_mid),
        ];
        for (key, slot) in slots {
            let slot = slot(&mut self.special);
            if slot.is_some_and(|id| u64::from(id) >= n) {
                *slot = None;
            }
            // Stored widths vary between converters; a negative id counts as out of range.
            if let Some(new_id) = meta.opt_int::<i64>(key)? {
                if (0..n as i64).contains(&new_id) {
                    *slot = Some(new_id as TokenId);
                }
            }
        }
        Ok(())
    }

    fn read_add_flags(&mut self, meta: &Metadata<'_>) -> Result<(), TokenizerError> {
        if let Some(v) = meta.opt_bool("tokenizer.ggml.add_bos_token")? {
            self.flags.add_bos = v;
        }
        if let Some(v) = meta.opt_bool("tokenizer.ggml.add_eos_token")? {
            self.flags.add_eos = v;
        }
        if let Some(v) = meta.opt_bool("tokenizer.ggml.add_sep_token")? {
            self.flags.add_sep = v;
        }
        // llama.cpp forces BOS on for Gemma 4 (ggml-org/llama.cpp#21500).
        if is_gemma4_pre(self.pre.as_deref()) && self.kind == VocabKind::Bpe {
            self.flags.add_bos = true;
        }
        Ok(())
    }

    fn mark_control(&mut self, id: TokenId) {
        self.attrs[id as usize].set(TokenAttr::CONTROL, true);
    }

    /// Fills special ids the metadata left unset from well-known token texts and marks the
    /// tokens found as control tokens. llama.cpp takes the first candidate its `token_to_id`
    /// hash map yields, so when several candidates are present we replay that map's order.
    fn detect_special_tokens_by_text(&mut self) {
        let groups: [(&[&str], SlotOf); 8] = [
            (EOT_TEXTS, |s| &mut s.eot),
            (EOM_TEXTS, |s| &mut s.eom),
            (FIM_PRE_TEXTS, |s| &mut s.fim_pre),
            (FIM_SUF_TEXTS, |s| &mut s.fim_suf),
            (FIM_MID_TEXTS, |s| &mut s.fim_mid),
            (FIM_PAD_TEXTS, |s| &mut s.fim_pad),
            (FIM_REP_TEXTS, |s| &mut s.fim_rep),
            (FIM_SEP_TEXTS, |s| &mut s.fim_sep),
        ];
        let mut map_rank: Option<Vec<u32>> = None;
        for (texts, slot) in groups {
            if slot(&mut self.special).is_some() {
                continue;
            }
            let candidates: Vec<TokenId> = texts.iter().filter_map(|t| self.id(t)).collect();
            let found = if candidates.len() > 1 {
                let rank = map_rank.get_or_insert_with(|| {
                    let mut rank = vec![0u32; self.texts.len()];
                    for (pos, id) in libstdcxx::unordered_map_order(&self.texts)
                        .into_iter()
                        .enumerate()
                    {
                        rank[id as usize] = pos as u32;
                    }
                    rank
                });
                candidates
                    .iter()
                    .copied()
                    .min_by_key(|&id| rank[id as usize])
            } else {
                candidates.first().copied()
            };
            if let Some(id) = found {
                *slot(&mut self.special) = Some(id);
                self.mark_control(id);
            }
        }
    }

    /// Control tokens whose text contains "unused" are unused.
    fn mark_unused_controls(&mut self) {
        for (text, attr) in self.texts.iter().zip(self.attrs.iter_mut()) {
            if attr.intersects(TokenAttr::CONTROL) && text.contains("unused") {
                attr.set(TokenAttr::UNUSED, true);
            }
        }
    }

    fn build_eog_set(&mut self) {
        let mut eog = BTreeSet::new();
        eog.extend(self.special.fim_pad);
        eog.extend(self.special.fim_rep);
        eog.extend(self.special.fim_sep);
        for text in EOG_TEXTS {
            if let Some(id) = self.id(text) {
                eog.insert(id);
                self.mark_control(id);
            }
        }
        // gpt-oss: always render these.
        for text in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
            if let Some(id) = self.id(text) {
                self.attrs[id as usize] = TokenAttr::USER_DEFINED;
            }
        }
        eog.extend(self.special.eos);
        eog.extend(self.special.eot);
        eog.extend(self.special.eom);

        let text_of = |id: TokenId| self.texts.get(id as usize).map(|t| &**t);
        let has = |eog: &BTreeSet<TokenId>, wanted: &[&str]| {
            eog.iter()
                .any(|&id| text_of(id).is_some_and(|t| wanted.contains(&t)))
        };
        let find = |eog: &BTreeSet<TokenId>, wanted: &str| {
            eog.iter().copied().find(|&id| text_of(id) == Some(wanted))
        };

        // o200k_harmony and solar-open: "<|end|>" ends a message, not the generation.
        let has_return = has(&eog, &["<|return|>"]);
        let has_call = has(&eog, &["<|call|>", "<|calls|>"]);
        let has_flush = has(&eog, &["<|flush|>"]);
        if let Some(end_id) = find(&eog, "<|end|>") {
            if has_call && (has_return || has_flush) {
                eog.remove(&end_id);
                self.attrs[end_id as usize] = TokenAttr::USER_DEFINED;
            }
        }
        // gemma4 and plamo2 have an ordinary "</s>" token.
        if has(&eog, &["<|tool_response>", "<|plamo:eos|>"]) {
            if let Some(s_id) = find(&eog, "</s>") {
                eog.remove(&s_id);
                self.attrs[s_id as usize] = TokenAttr::NORMAL;
            }
        }
        self.eog = eog;
    }

    /// Control, user-defined and unknown tokens ordered by decreasing text length, with
    /// ties in the order libstdc++'s `std::sort` leaves them (llama.cpp sorts ids with an
    /// unstable sort, and the order of equal-length tokens decides which of two overlapping
    /// special tokens wins).
    fn sorted_special_tokens(&self) -> Vec<TokenId> {
        let wanted = TokenAttr::CONTROL | TokenAttr::USER_DEFINED | TokenAttr::UNKNOWN;
        let mut ids: Vec<TokenId> = (0..self.texts.len() as TokenId)
            .filter(|&id| self.attrs[id as usize].intersects(wanted))
            .collect();
        let len = |id: &TokenId| self.texts[*id as usize].len();
        libstdcxx::sort(&mut ids, |a, b| len(a) > len(b));
        ids
    }

    /// Attributes llama.cpp sets by model/tokenizer/architecture name.
    fn apply_model_specific_attrs(&mut self, meta: &Metadata<'_>) -> Result<(), TokenizerError> {
        let model_name = meta
            .opt_str("general.name")?
            .unwrap_or("")
            .to_ascii_lowercase();
        let pre = meta.opt_str(KEY_PRE)?.unwrap_or("");
        let arch = meta.opt_str("general.architecture")?.unwrap_or("");
        let contains_any = |s: &str, subs: &[&str]| subs.iter().any(|sub| s.contains(sub));

        if contains_any(pre, &["jina-v2-de", "jina-v2-es", "jina-v2-code", "mmbert"])
            || contains_any(arch, &["nomic-bert-moe", "jina-bert-v3"])
        {
            self.set_attr_by_text("<mask>", TokenAttr::LSTRIP, true);
        } else if contains_any(&model_name, &["phi-3", "phi3"]) {
            for i in 0..self.special_tokens.len() {
                let id = self.special_tokens[i];
                self.attrs[id as usize].set(TokenAttr::RSTRIP, true);
            }
            self.set_attr_by_text("</s>", TokenAttr::RSTRIP, true);
            for text in ["<unk>", "<s>", "<|endoftext|>"] {
                self.set_attr_by_text(text, TokenAttr::RSTRIP, false);
            }
        } else if contains_any(&model_name, &["modern-bert"]) {
            self.set_attr_by_text("[MASK]", TokenAttr::LSTRIP, true);
        }
        Ok(())
    }

    fn set_attr_by_text(&mut self, text: &str, bits: TokenAttr, on: bool) {
        if let Some(id) = self.id(text) {
            self.attrs[id as usize].set(bits, on);
        }
    }

    /// The `<0xAB>` byte tokens (falling back to the one-byte token, as llama.cpp does).
    fn find_byte_tokens(&self) -> [Option<TokenId>; 256] {
        let mut table = [None; 256];
        if !matches!(
            self.kind,
            VocabKind::Spm | VocabKind::Ugm | VocabKind::Plamo2
        ) {
            return table;
        }
        for (byte, slot) in table.iter_mut().enumerate() {
            let hex = format!("<0x{byte:02X}>");
            *slot = self.id(&hex).or_else(|| {
                if self.kind == VocabKind::Plamo2 || byte >= 0x80 {
                    return None;
                }
                let single = [byte as u8];
                std::str::from_utf8(&single).ok().and_then(|s| self.id(s))
            });
        }
        table
    }

    /// `tokenizer.ggml.model` ("llama", "gpt2", "t5", "bert", "gemma4", "none"...).
    pub fn model(&self) -> &str {
        &self.model
    }

    /// `tokenizer.ggml.pre` (forced to "gemma4" for the `gemma4` model, as llama.cpp does).
    pub fn pre(&self) -> Option<&str> {
        self.pre.as_deref()
    }

    /// The algorithm family.
    pub fn kind(&self) -> VocabKind {
        self.kind
    }

    pub fn len(&self) -> usize {
        self.texts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.texts.is_empty()
    }

    /// Whether `id` is a token of this vocabulary.
    pub fn contains(&self, id: TokenId) -> bool {
        (id as usize) < self.texts.len()
    }

    /// The token's string as stored ("" for an id past the vocabulary).
    pub fn text(&self, id: TokenId) -> &str {
        self.texts.get(id as usize).map_or("", |t| t)
    }

    /// The token's score (0 where the file has none or the id is out of range).
    pub fn score(&self, id: TokenId) -> f32 {
        self.scores.get(id as usize).copied().unwrap_or(0.0)
    }

    /// The token's type as stored in the file (`Normal` when the file has no types).
    /// llama.cpp's later adjustments are in [`Vocab::attr`].
    pub fn token_type(&self, id: TokenId) -> TokenType {
        self.types
            .get(id as usize)
            .copied()
            .unwrap_or(TokenType::Undefined)
    }

    /// The token's attributes after llama.cpp's adjustments (what its tokenizers test).
    pub fn attr(&self, id: TokenId) -> TokenAttr {
        self.attrs
            .get(id as usize)
            .copied()
            .unwrap_or(TokenAttr::UNDEFINED)
    }

    pub fn is_normal(&self, id: TokenId) -> bool {
        self.attr(id).intersects(TokenAttr::NORMAL)
    }

    pub fn is_unknown(&self, id: TokenId) -> bool {
        self.attr(id).intersects(TokenAttr::UNKNOWN)
    }

    pub fn is_control(&self, id: TokenId) -> bool {
        self.attr(id).intersects(TokenAttr::CONTROL)
    }

    pub fn is_byte(&self, id: TokenId) -> bool {
        self.attr(id).intersects(TokenAttr::BYTE)
    }

    pub fn is_user_defined(&self, id: TokenId) -> bool {
        self.attr(id).intersects(TokenAttr::USER_DEFINED)
    }

    pub fn is_unused(&self, id: TokenId) -> bool {
        self.attr(id).intersects(TokenAttr::UNUSED)
    }

    /// The id of the token whose text is exactly `text`.
    pub fn id(&self, text: &str) -> Option<TokenId> {
        self.token_to_id.get(text).copied()
    }

    /// Raw "left right" strings of `tokenizer.ggml.merges`, in rank order (BPE kinds only).
    pub fn merges(&self) -> impl Iterator<Item = &str> {
        self.merges.iter().map(|m| &**m)
    }

    /// Number of merges (BPE kinds only).
    pub fn merges_len(&self) -> usize {
        self.merges.len()
    }

    /// `tokenizer.ggml.precompiled_charsmap` (t5 only), validated as llama.cpp does.
    pub fn precompiled_charsmap(&self) -> Option<&[u8]> {
        self.precompiled_charsmap.as_deref()
    }

    /// The `<0xAB>` byte token for SPM/UGM byte fallback.
    pub fn byte_token(&self, byte: u8) -> Option<TokenId> {
        self.byte_tokens[usize::from(byte)]
    }

    /// The byte an SPM/UGM/BPE `<0xAB>` byte token stands for (llama.cpp's `token_to_byte`).
    pub fn token_to_byte(&self, id: TokenId) -> Option<u8> {
        let text = self.text(id);
        let hex = text.get(3..5)?;
        u8::from_str_radix(hex, 16).ok()
    }

    pub fn bos(&self) -> Option<TokenId> {
        self.special.bos
    }
    pub fn eos(&self) -> Option<TokenId> {
        self.special.eos
    }
    pub fn eot(&self) -> Option<TokenId> {
        self.special.eot
    }
    pub fn eom(&self) -> Option<TokenId> {
        self.special.eom
    }
    pub fn unk(&self) -> Option<TokenId> {
        self.special.unk
    }
    pub fn pad(&self) -> Option<TokenId> {
        self.special.pad
    }
    pub fn sep(&self) -> Option<TokenId> {
        self.special.sep
    }
    pub fn mask(&self) -> Option<TokenId> {
        self.special.mask
    }
    pub fn fim_pre(&self) -> Option<TokenId> {
        self.special.fim_pre
    }
    pub fn fim_suf(&self) -> Option<TokenId> {
        self.special.fim_suf
    }
    pub fn fim_mid(&self) -> Option<TokenId> {
        self.special.fim_mid
    }
    pub fn fim_pad(&self) -> Option<TokenId> {
        self.special.fim_pad
    }
    pub fn fim_rep(&self) -> Option<TokenId> {
        self.special.fim_rep
    }
    pub fn fim_sep(&self) -> Option<TokenId> {
        self.special.fim_sep
    }
    /// The newline token of SPM vocabularies (`<0x0A>`, else the pad token).
    pub fn linefeed(&self) -> Option<TokenId> {
        self.linefeed
    }

    /// Whether generating `id` ends the generation.
    pub fn is_eog(&self, id: TokenId) -> bool {
        self.eog.contains(&id)
    }

    /// All end-of-generation ids, ascending.
    pub fn eog_ids(&self) -> impl Iterator<Item = TokenId> + '_ {
        self.eog.iter().copied()
    }

    pub fn add_bos(&self) -> bool {
        self.flags.add_bos
    }
    pub fn add_eos(&self) -> bool {
        self.flags.add_eos
    }
    pub fn add_sep(&self) -> bool {
        self.flags.add_sep
    }
    pub fn add_space_prefix(&self) -> bool {
        self.flags.add_space_prefix
    }
    pub fn remove_extra_whitespaces(&self) -> bool {
        self.flags.remove_extra_whitespaces
    }
    pub fn escape_whitespaces(&self) -> bool {
        self.flags.escape_whitespaces
    }
    pub fn treat_whitespace_as_suffix(&self) -> bool {
        self.flags.treat_whitespace_as_suffix
    }
    pub fn clean_spaces(&self) -> bool {
        self.flags.clean_spaces
    }
    pub fn ignore_merges(&self) -> bool {
        self.flags.ignore_merges
    }

    /// BERT normalizer options.
    pub fn normalizer(&self) -> NormalizerOptions {
        self.normalizer
    }

    /// Length in bytes of the longest token text.
    pub fn max_token_len(&self) -> usize {
        self.max_token_len
    }

    /// Control, user-defined and unknown tokens in the order the special-token partition
    /// tries them.
    pub fn special_tokens(&self) -> &[TokenId] {
        &self.special_tokens
    }
}

fn is_gemma4_pre(pre: Option<&str>) -> bool {
    matches!(pre, Some("gemma4" | "granite-embed-multi-311m"))
}

type Tokens = (
    Vec<Box<str>>,
    Vec<f32>,
    Vec<TokenType>,
    FxHashMap<Box<str>, TokenId>,
);

fn read_tokens(meta: &Metadata<'_>) -> Result<Tokens, TokenizerError> {
    let tokens = meta
        .opt_array(KEY_TOKENS)?
        .ok_or_else(|| invalid(format!("cannot find tokenizer vocab ({KEY_TOKENS})")))?;
    let strings = tokens
        .strings()
        .ok_or_else(|| invalid(format!("{KEY_TOKENS} is not an array of strings")))?;
    let n_tokens = strings.len();
    if n_tokens > TokenId::MAX as usize {
        return Err(invalid(format!("{n_tokens} tokens is too many")));
    }

    let scores: Vec<f32> = match meta.opt_array(KEY_SCORES)? {
        None => vec![0.0; n_tokens],
        Some(arr) => {
            if arr.len() < n_tokens {
                return Err(invalid(format!(
                    "{KEY_SCORES} has {} entries for {n_tokens} tokens",
                    arr.len()
                )));
            }
            if let Some(f) = arr.as_slice::<f32>() {
                f[..n_tokens].to_vec()
            } else if let Some(i) = arr.as_slice::<i32>() {
                i[..n_tokens].iter().map(|&v| v as f32).collect()
            } else {
                return Err(invalid(format!(
                    "{KEY_SCORES} holds {}, expected f32 or i32",
                    arr.elem_type()
                )));
            }
        }
    };

    let types: Vec<TokenType> = match meta.opt_array(KEY_TOKEN_TYPE)? {
        None => Vec::new(),
        Some(arr) => {
            let codes = arr.as_slice::<i32>().ok_or_else(|| {
                invalid(format!(
                    "{KEY_TOKEN_TYPE} holds {}, expected i32",
                    arr.elem_type()
                ))
            })?;
            if codes.len() < n_tokens {
                return Err(invalid(format!(
                    "{KEY_TOKEN_TYPE} has {} entries for {n_tokens} tokens",
                    codes.len()
                )));
            }
            codes[..n_tokens]
                .iter()
                .map(|&c| TokenType::from_code(c))
                .collect()
        }
    };

    let mut texts = Vec::with_capacity(n_tokens);
    let mut token_to_id = FxHashMap::with_capacity_and_hasher(n_tokens, rustc_hash::FxBuildHasher);
    for (i, text) in strings.enumerate() {
        let text: Box<str> = if text.is_empty() {
            format!("[EMPTY_{i}]").into()
        } else {
            text.into()
        };
        // llama.cpp asserts that every text is unique.
        if token_to_id.insert(text.clone(), i as TokenId).is_some() {
            return Err(invalid(format!(
                "token text {text:?} appears twice (id {i})"
            )));
        }
        texts.push(text);
    }
    Ok((texts, scores, types, token_to_id))
}

fn read_merges(
    meta: &Metadata<'_>,
    model: &str,
    pre: Option<&str>,
) -> Result<Vec<Box<str>>, TokenizerError> {
    match meta.opt_array(KEY_MERGES)? {
        None if model != "gemma4" && pre == Some("kimi-k2") => Ok(Vec::new()),
        None => Err(invalid(format!(
            "cannot find tokenizer merges ({KEY_MERGES})"
        ))),
        Some(arr) => match arr.strings() {
            Some(s) => Ok(s.map(Box::from).collect()),
            None => Err(invalid(format!("{KEY_MERGES} is not an array of strings"))),
        },
    }
}

fn read_precompiled_charsmap(meta: &Metadata<'_>) -> Result<Option<Vec<u8>>, TokenizerError> {
    let Some(arr) = meta.opt_array(KEY_CHARSMAP)? else {
        return Ok(None);
    };
    let bytes: Vec<u8> = match arr.elem_type() {
        ValueType::U8 => arr.as_slice::<u8>().map(|b| b.into_owned()),
        ValueType::I8 => arr
            .as_slice::<i8>()
            .map(|b| b.iter().map(|&v| v as u8).collect()),
        _ => None,
    }
    .ok_or_else(|| {
        invalid(format!(
            "{KEY_CHARSMAP} holds {}, expected u8",
            arr.elem_type()
        ))
    })?;
    let header: [u8; 4] = bytes
        .get(..4)
        .and_then(|h| h.try_into().ok())
        .ok_or_else(|| invalid("precompiled_charsmap too small for its xcda_blob_size header"))?;
    let blob_size = u32::from_le_bytes(header) as usize;
    if blob_size + 4 >= bytes.len() {
        return Err(invalid(
            "precompiled_charsmap's xcda_blob_size is past its end",
        ));
    }
    Ok(Some(bytes))
}

/// The flags llama.cpp sets per BPE pre-tokenizer name; an unknown name is an error.
fn apply_pre_tokenizer_flags(
    pre: Option<&str>,
    flags: &mut Flags,
    special: &mut SpecialIds,
    normalizer: &mut NormalizerOptions,
) -> Result<(), TokenizerError> {
    let Some(pre) = pre.filter(|p| !p.is_empty()) else {
        return Ok(()); // llama.cpp warns and uses the default pre-tokenizer
    };
    match pre {
        "default" | "falcon" | "mpt" | "starcoder" | "gpt-2" | "phi-2" | "jina-es" | "jina-de"
        | "gigachat" | "jina-v2-es" | "jina-v2-de" | "a.x-4.0" | "mellum" | "modern-bert"
        | "jais-2" | "refact" | "stablelm2" | "olmo" | "dbrx" | "smaug-bpe" | "jais"
        | "codeshell" | "bloom" | "gpt3-finnish" | "exaone" | "exaone4" | "exaone-moe"
        | "minerva-7b" | "megrez" | "mellum2" => {}
        "minicpm5" => flags.ignore_merges = true,
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" => {
            flags.ignore_merges = true;
            flags.add_bos = true;
        }
        "deepseek-llm" | "deepseek-coder" | "deepseek-v3" | "spark2_5" | "command-r" | "qwen2"
        | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "qwen35" | "poro-chat" | "viking"
        | "smollm" | "gpt-4o" | "llama4" | "kanana2" | "talkie" | "tiny_aya" | "cohere2moe"
        | "superbpe" | "trillion" | "granite-docling" | "bailingmoe" | "bailingmoe2"
        | "llada-moe" | "seed-coder" | "hunyuan" | "hunyuan-dense" | "hy_v4" | "joyai-llm"
        | "kimi-k2" | "ufakzeka" | "grok-2" | "afmoe" | "laguna" | "minimax-m2" | "solar-open" => {
            flags.clean_spaces = false
        }
        "youtu" | "granite-embed-multi-97m" => {
            flags.clean_spaces = false;
            flags.ignore_merges = true;
        }
        "gemma4" | "granite-embed-multi-311m" | "mmbert" => flags.escape_whitespaces = true,
        "sarvam-moe" => {
            flags.escape_whitespaces = true;
            flags.clean_spaces = false;
        }
        "jina-v1-en" | "jina-v2-code" | "roberta-bpe" => flags.add_sep = true,
        "whitespace" => normalizer.lowercase = false,
        "chatglm-bpe" => special.bos = None,
        "glm4" | "glm5" => {
            special.bos = None;
            flags.ignore_merges = true;
        }
        "tekken" => {
            flags.clean_spaces = false;
            flags.ignore_merges = true;
            flags.add_bos = true;
        }
        "chameleon" => {
            flags.add_bos = true;
            flags.clean_spaces = false;
        }
        other => return Err(TokenizerError::UnknownPreTokenizer(other.to_string())),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrox_gguf::{Gguf, GgufWriter, OwnedValue};

    fn load(extra: &[(&str, OwnedValue)]) -> Result<Vocab, TokenizerError> {
        let mut w = GgufWriter::new();
        w.set("general.architecture", "llama");
        w.set("tokenizer.ggml.model", "llama");
        w.set(
            "tokenizer.ggml.tokens",
            vec![
                "<unk>",
                "<s>",
                "</s>",
                "<0x0A>",
                "▁a",
                "<|im_end|>",
                "<unused3>",
            ],
        );
        w.set("tokenizer.ggml.token_type", vec![2i32, 3, 3, 6, 1, 4, 3]);
        for (k, v) in extra {
            w.set(*k, v.clone());
        }
        let gguf = Gguf::from_bytes(w.to_bytes()).expect("valid gguf");
        Vocab::from_gguf(&gguf.metadata())
    }

    #[test]
    fn spm_defaults_and_text_heuristics() {
        let v = load(&[]).unwrap();
        assert_eq!(v.kind(), VocabKind::Spm);
        assert_eq!((v.bos(), v.eos(), v.unk()), (Some(1), Some(2), Some(0)));
        assert!(v.add_bos() && !v.add_eos() && v.add_space_prefix() && v.escape_whitespaces());
        assert_eq!(v.byte_token(b'\n'), Some(3));
        assert_eq!(v.linefeed(), Some(3));
        // "<|im_end|>" becomes the EOT token, an end-of-generation token and a control token.
        assert_eq!(v.eot(), Some(5));
        assert!(v.is_eog(5) && v.is_eog(2) && v.is_control(5) && v.is_user_defined(5));
        assert!(v.is_unused(6));
        assert_eq!(v.special_tokens()[0], 5, "longest special text first");
    }

    #[test]
    fn metadata_overrides_and_out_of_range_ids() {
        let v = load(&[
            ("tokenizer.ggml.bos_token_id", OwnedValue::from(4u32)),
            ("tokenizer.ggml.eos_token_id", OwnedValue::from(99u32)),
            ("tokenizer.ggml.add_bos_token", OwnedValue::from(false)),
            ("tokenizer.ggml.add_space_prefix", OwnedValue::from(false)),
        ])
        .unwrap();
        assert_eq!(v.bos(), Some(4));
        assert_eq!(
            v.eos(),
            Some(2),
            "an id past the vocabulary keeps the default"
        );
        assert!(!v.add_bos() && !v.add_space_prefix());
    }

    #[test]
    fn bad_metadata_is_an_error() {
        let dup = load(&[("tokenizer.ggml.tokens", OwnedValue::from(vec!["a", "a"]))]);
        assert!(matches!(dup, Err(TokenizerError::Invalid(_))), "{dup:?}");
        let short_types = load(&[("tokenizer.ggml.token_type", OwnedValue::from(vec![1i32]))]);
        assert!(matches!(short_types, Err(TokenizerError::Invalid(_))));
        let model = load(&[("tokenizer.ggml.model", OwnedValue::from("klingon"))]);
        assert!(matches!(model, Err(TokenizerError::UnknownModel(m)) if m == "klingon"));
        let pre = load(&[
            ("tokenizer.ggml.model", OwnedValue::from("gpt2")),
            ("tokenizer.ggml.merges", OwnedValue::from(vec!["a b"])),
            ("tokenizer.ggml.pre", OwnedValue::from("klingon")),
        ]);
        assert!(matches!(pre, Err(TokenizerError::UnknownPreTokenizer(p)) if p == "klingon"));
        let no_merges = load(&[("tokenizer.ggml.model", OwnedValue::from("gpt2"))]);
        assert!(matches!(no_merges, Err(TokenizerError::Invalid(_))));
    }

    #[test]
    fn empty_token_texts_get_placeholders() {
        let v = load(&[(
            "tokenizer.ggml.tokens",
            OwnedValue::from(vec!["", "x", "", "y", "z", "w", "v"]),
        )])
        .unwrap();
        assert_eq!(v.text(0), "[EMPTY_0]");
        assert_eq!(v.id("[EMPTY_2]"), Some(2));
        assert_eq!(v.text(1000), "");
    }
}
