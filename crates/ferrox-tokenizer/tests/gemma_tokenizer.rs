//! Gemma-3-270M's tokenizer against ids recorded from llama.cpp's `llama-tokenize`
//! (fixtures/gemma3-tokenizer.json, made by scripts/gen-gemma-tokenizer-fixtures.py), and
//! the streaming decoder on its byte-fallback tokens. Needs the default model
//! (scripts/fetch-model.sh).

use std::sync::OnceLock;

use ferrox_gguf::Gguf;
use ferrox_tokenizer::tokenizer::{TokenId, Tokenizer};
use serde_json::Value;

/// The default model (Gemma-3-270M), where `scripts/fetch-model.sh` stores it.
fn default_model_path() -> std::path::PathBuf {
    let dir = std::env::var_os("FERROX_MODELS_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/ferrox/models")
        });
    dir.join("gemma-3-270m-q4_k_m.gguf")
}

fn tokenizer() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let path = default_model_path();
        assert!(
            path.exists(),
            "{} is missing: run scripts/fetch-model.sh",
            path.display()
        );
        let gguf = Gguf::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Tokenizer::from_gguf(&gguf).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    })
}

struct Case {
    text: String,
    add_bos: bool,
    parse_special: bool,
    ids: Vec<TokenId>,
}

fn cases() -> Vec<Case> {
    let json: Value = serde_json::from_str(include_str!("fixtures/gemma3-tokenizer.json"))
        .expect("fixture is JSON");
    json["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| Case {
            text: c["text"].as_str().expect("text").to_string(),
            add_bos: c["add_bos"].as_bool().expect("add_bos"),
            parse_special: c["parse_special"].as_bool().expect("parse_special"),
            ids: c["ids"]
                .as_array()
                .expect("ids")
                .iter()
                .map(|v| v.as_u64().expect("id") as TokenId)
                .collect(),
        })
        .collect()
}

#[test]
fn ids_match_llama_cpp() {
    let tok = tokenizer();
    let mut failures = Vec::new();
    let all = cases();
    for case in &all {
        // llama-tokenize passes "add BOS" as llama_tokenize's add_special.
        let add_special = case.add_bos && tok.vocab().add_bos();
        let got = tok.encode(&case.text, add_special, case.parse_special);
        if got != case.ids {
            failures.push(format!(
                "{:?} (bos {}, parse_special {}):\n  expected {:?}\n  got      {:?}",
                case.text, case.add_bos, case.parse_special, case.ids, got
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ from llama.cpp:\n{}",
        failures.len(),
        all.len(),
        failures.join("\n")
    );
}

#[test]
fn decode_round_trips() {
    let tok = tokenizer();
    assert_eq!(
        tok.vocab().bos().map(|id| tok.token_to_piece(id)),
        Some(&b"<bos>"[..])
    );
    // U+2581 is SentencePiece's space marker: it decodes to a space, as in llama.cpp (whose
    // round-trip test exempts it too).
    for case in cases().into_iter().filter(|c| !c.text.contains('\u{2581}')) {
        // Gemma adds no space prefix and cleans no spaces, so decoding gives the text back,
        // special tokens rendered as written.
        let expected = if case.add_bos {
            format!("<bos>{}", case.text)
        } else {
            case.text.clone()
        };
        assert_eq!(tok.decode(&case.ids), expected, "ids {:?}", case.ids);
        assert_eq!(tok.decode_bytes(&case.ids), expected.as_bytes());
    }
}

#[test]
fn stream_decoder_never_splits_a_character() {
    let tok = tokenizer();
    // Emoji and rare CJK that Gemma spells with byte-fallback tokens.
    let text = "🦙 x 😶‍🌫️ 𓀀 龘 𝔘 done";
    let ids = tok.encode(text, false, false);
    let byte_tokens = ids.iter().filter(|&&id| tok.vocab().is_byte(id)).count();
    assert!(
        byte_tokens >= 8,
        "expected byte-fallback tokens, got {ids:?}"
    );

    let mut stream = tok.stream_decoder(true);
    let mut out = String::new();
    for &id in &ids {
        let piece = stream.push(id);
        assert!(
            !piece.contains('\u{FFFD}'),
            "partial character released: {piece:?}"
        );
        out.push_str(piece);
    }
    assert!(!stream.has_pending());
    out.push_str(stream.flush());
    assert_eq!(out, text);
}

#[test]
fn stream_decoder_flushes_a_cut_character_as_one_replacement() {
    let tok = tokenizer();
    let ids = tok.encode("ok 🦙", false, false);
    let (last, head) = ids.split_last().expect("tokens");
    assert!(
        tok.vocab().is_byte(*last),
        "the llama emoji ends in byte tokens: {ids:?}"
    );
    let mut stream = tok.stream_decoder(true);
    let mut out = String::new();
    for &id in head {
        out.push_str(stream.push(id));
    }
    assert!(stream.has_pending());
    out.push_str(stream.flush());
    assert_eq!(out, "ok \u{FFFD}");
    let _ = last;
}

#[test]
fn special_tokens_render_only_when_asked() {
    let tok = tokenizer();
    let ids = tok.encode("<start_of_turn>user\nHi<end_of_turn>", false, true);
    assert_eq!(tok.decode(&ids), "<start_of_turn>user\nHi<end_of_turn>");
    let mut plain = tok.stream_decoder(false);
    let text: String = ids.iter().map(|&id| plain.push(id).to_string()).collect();
    assert_eq!(text, "user\nHi");
}

/// A small deterministic generator (no dependency needed for this).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[test]
fn hostile_input_never_panics() {
    let tok = tokenizer();
    const PIECES: &[&str] = &[
        " ",
        "  ",
        "\t",
        "\n",
        "\r\n",
        "▁",
        "a",
        "é",
        "中",
        "🦙",
        "\u{200d}",
        "\u{0}",
        "<",
        ">",
        "<start_of_turn>",
        "<end_of_turn",
        "<bos>",
        "<unused7>",
        "<div>",
        "</",
        ">▁</",
        "\u{10ffff}",
        "\u{fffd}",
        "'s",
        " ,",
        " ' ",
    ];
    let mut rng = Lcg(7);
    for _ in 0..300 {
        let len = rng.below(60);
        let text: String = (0..len).map(|_| PIECES[rng.below(PIECES.len())]).collect();
        for (add_special, parse_special) in
            [(true, true), (true, false), (false, true), (false, false)]
        {
            let ids = tok.encode(&text, add_special, parse_special);
            if !add_special && !text.contains('\u{2581}') {
                let expected = tok.decode(&ids);
                assert_eq!(expected, text, "ids {ids:?}");
            }
        }
        // Arbitrary ids, including ones past the vocabulary, decode without panicking.
        let ids: Vec<TokenId> = (0..len).map(|_| rng.next() as TokenId % 300_000).collect();
        let text = tok.decode(&ids);
        let mut stream = tok.stream_decoder(rng.below(2) == 0);
        let mut streamed = String::new();
        for &id in &ids {
            streamed.push_str(stream.push(id));
        }
        streamed.push_str(stream.flush());
        let _ = text;
    }
}

#[test]
fn long_degenerate_inputs_stay_fast() {
    let tok = tokenizer();
    let started = std::time::Instant::now();
    let inputs = [
        " ".repeat(1 << 20),
        "a".repeat(1 << 20),
        "\n".repeat(1 << 18),
        "<start_of_turn>".repeat(1 << 15),
        "🦙".repeat(1 << 17),
        "ab ".repeat(1 << 18),
    ];
    for text in &inputs {
        let ids = tok.encode(text, true, true);
        assert!(!ids.is_empty());
        assert_eq!(tok.decode(&ids[1..]), *text);
    }
    // Generous: the whole set takes well under a second in release builds.
    assert!(
        started.elapsed().as_secs() < 60,
        "took {:?}",
        started.elapsed()
    );
}
