//! llama.cpp's tokenizer conformance suite, run the way its `test-tokenizer-0` runs it.
//!
//! Every `ggml-vocab-NAME.gguf` in `$FERROX_VOCAB_SUITE_DIR` (default
//! `~/.cache/ferrox/vocab-suite`, filled by `scripts/fetch-vocab-suite.sh`) must load; the
//! ones with `.inp`/`.out` files must tokenize every input (with `add_special = false`,
//! `parse_special = false`) to exactly the expected ids. `FERROX_VOCAB=gpt-2,phi-3` limits
//! the run to those vocabularies.
//!
//! The round trip `decode(encode(s)) == s` is checked where llama.cpp checks it
//! (`test-tokenizer-1-spm`, which its CMake enables for llama-spm only): every token's
//! text, and every code point.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use ferrox_gguf::Gguf;
use ferrox_tokenizer::tokenizer::{TokenId, Tokenizer};

/// Vocabularies whose round trip llama.cpp's own tests check.
const ROUND_TRIP_VOCABS: &[&str] = &["llama-spm"];
/// How many failing inputs to describe per vocabulary.
const MAX_REPORTED: usize = 5;

fn suite_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("FERROX_VOCAB_SUITE_DIR") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").unwrap_or_default();
    Path::new(&home).join(".cache/ferrox/vocab-suite")
}

/// The suite's vocabularies as (name, path), sorted by name, after the `FERROX_VOCAB` filter.
fn vocab_files() -> Vec<(String, PathBuf)> {
    let dir = suite_dir();
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| {
        panic!(
            "the vocab suite is not at {} ({e}): run scripts/fetch-vocab-suite.sh \
             (or point FERROX_VOCAB_SUITE_DIR at it)",
            dir.display()
        )
    });
    let mut all: Vec<(String, PathBuf)> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter_map(|path| {
            let file = path.file_name()?.to_str()?;
            let name = file.strip_prefix("ggml-vocab-")?.strip_suffix(".gguf")?;
            Some((name.to_string(), path.clone()))
        })
        .collect();
    all.sort();
    assert!(
        !all.is_empty(),
        "no ggml-vocab-*.gguf in {}: run scripts/fetch-vocab-suite.sh",
        dir.display()
    );

    let Ok(filter) = std::env::var("FERROX_VOCAB") else {
        return all;
    };
    let wanted: Vec<&str> = filter
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    let names: Vec<&str> = all.iter().map(|(n, _)| n.as_str()).collect();
    for w in &wanted {
        assert!(
            names.contains(w),
            "FERROX_VOCAB names `{w}`, which is not in the suite (have: {})",
            names.join(", ")
        );
    }
    all.into_iter()
        .filter(|(n, _)| wanted.contains(&n.as_str()))
        .collect()
}

/// Reads `NAME.gguf.inp` / `.out` as test-tokenizer-0 does: inputs separated by
/// "\n__ggml_vocab_test__\n", one line of space-separated ids per input, collected in a
/// map (a repeated input keeps its last expectation).
fn read_cases(gguf: &Path) -> Option<Result<BTreeMap<String, Vec<TokenId>>, String>> {
    let inp = PathBuf::from(format!("{}.inp", gguf.display()));
    let out = PathBuf::from(format!("{}.out", gguf.display()));
    if !inp.exists() && !out.exists() {
        return None;
    }
    Some(parse_cases(&inp, &out))
}

fn parse_cases(inp: &Path, out: &Path) -> Result<BTreeMap<String, Vec<TokenId>>, String> {
    let raw = std::fs::read(inp).map_err(|e| format!("{}: {e}", inp.display()))?;
    let raw = String::from_utf8(raw).map_err(|e| format!("{}: {e}", inp.display()))?;
    let expected = std::fs::read_to_string(out).map_err(|e| format!("{}: {e}", out.display()))?;

    const SEP: &str = "\n__ggml_vocab_test__\n";
    let mut inputs = Vec::new();
    let mut pos = 0;
    while pos < raw.len() {
        match raw[pos..].find(SEP) {
            Some(at) => {
                inputs.push(&raw[pos..pos + at]);
                pos += at + SEP.len();
            }
            None => {
                inputs.push(&raw[pos..]);
                break;
            }
        }
    }
    let lines: Vec<&str> = expected.lines().collect();
    if inputs.len() != lines.len() {
        return Err(format!(
            "{} has {} inputs but {} has {} lines",
            inp.display(),
            inputs.len(),
            out.display(),
            lines.len()
        ));
    }
    let mut cases = BTreeMap::new();
    for (input, line) in inputs.into_iter().zip(lines) {
        let ids = line
            .split_whitespace()
            .map(|t| {
                t.parse::<TokenId>()
                    .map_err(|e| format!("bad id `{t}`: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        cases.insert(input.to_string(), ids);
    }
    Ok(cases)
}

/// One vocabulary's outcome.
struct Outcome {
    name: String,
    loaded: bool,
    passed: usize,
    total: usize,
    notes: Vec<String>,
    problems: Vec<String>,
}

fn describe_ids(tok: &Tokenizer, ids: &[TokenId]) -> String {
    ids.iter()
        .map(|&id| format!("{id} {:?}", String::from_utf8_lossy(tok.token_to_piece(id))))
        .collect::<Vec<_>>()
        .join(", ")
}

fn run_vocab(name: &str, path: &Path) -> Outcome {
    let mut outcome = Outcome {
        name: name.to_string(),
        loaded: false,
        passed: 0,
        total: 0,
        notes: Vec::new(),
        problems: Vec::new(),
    };
    let tok = match Gguf::open(path)
        .map_err(|e| e.to_string())
        .and_then(|g| Tokenizer::from_gguf(&g).map_err(|e| e.to_string()))
    {
        Ok(tok) => tok,
        Err(e) => {
            outcome.problems.push(format!("does not load: {e}"));
            return outcome;
        }
    };
    outcome.loaded = true;
    let cases = match read_cases(path) {
        None => return outcome, // a vocabulary that only has to load
        Some(Err(e)) => {
            outcome.problems.push(e);
            return outcome;
        }
        Some(Ok(cases)) => cases,
    };

    outcome.total = cases.len();
    let mut failures = 0;
    for (input, expected) in &cases {
        let got = tok.encode(input, false, false);
        if &got == expected {
            outcome.passed += 1;
            continue;
        }
        failures += 1;
        if failures <= MAX_REPORTED {
            outcome.problems.push(format!(
                "input {input:?}\n      expected: [{}]\n      got:      [{}]",
                describe_ids(&tok, expected),
                describe_ids(&tok, &got)
            ));
        }
    }
    if failures > MAX_REPORTED {
        outcome.problems.push(format!(
            "... and {} more failing inputs",
            failures - MAX_REPORTED
        ));
    }

    if ROUND_TRIP_VOCABS.contains(&name) {
        let problems = round_trip_problems(&tok);
        if problems.is_empty() {
            outcome
                .notes
                .push("round trip: every token and code point".to_string());
        }
        outcome.problems.extend(problems);
    }
    outcome
}

/// llama.cpp's `test-tokenizer-1-spm`: every token's text (special tokens rendered) and
/// every code point outside the surrogates and the unassigned planes must survive
/// `decode(encode(..))` with `parse_special` on; U+2581 is exempt (SPM's space marker).
fn round_trip_problems(tok: &Tokenizer) -> Vec<String> {
    let mut problems = Vec::new();
    for id in 0..tok.vocab().len() as TokenId {
        let text = tok.decode_bytes(&[id]);
        let Ok(text_str) = std::str::from_utf8(&text) else {
            continue; // a lone byte token: llama.cpp feeds it raw, we cannot
        };
        let back = tok.decode_bytes(&tok.encode(text_str, false, true));
        if back != text {
            problems.push(format!(
                "round trip: token {id} decodes to {:?} but that re-encodes and decodes to {:?}",
                text_str,
                String::from_utf8_lossy(&back)
            ));
            break;
        }
    }
    let mut buf = [0u8; 4];
    for cp in (0u32..0x110000)
        .filter(|cp| !(0xD800..=0xDFFF).contains(cp) && !(0x40000..=0xE0000).contains(cp))
    {
        let Some(c) = char::from_u32(cp) else {
            continue;
        };
        let text = c.encode_utf8(&mut buf);
        let back = tok.decode_bytes(&tok.encode(text, false, true));
        if cp != 0x2581 && back != text.as_bytes() {
            problems.push(format!(
                "round trip: code point U+{cp:04X} decodes back to {:?}",
                String::from_utf8_lossy(&back)
            ));
            break;
        }
    }
    problems
}

#[test]
fn llama_cpp_vocab_suite() {
    let outcomes: Vec<Outcome> = vocab_files()
        .iter()
        .map(|(name, path)| run_vocab(name, path))
        .collect();

    let mut report = String::from("\nvocab suite (llama.cpp test-tokenizer-0):\n");
    for o in &outcomes {
        let status = if o.problems.is_empty() {
            "ok  "
        } else {
            "FAIL"
        };
        let counts = if o.total > 0 {
            format!("{}/{} inputs", o.passed, o.total)
        } else if o.loaded {
            "loads (no .inp/.out)".to_string()
        } else {
            String::new()
        };
        let _ = writeln!(report, "  {status} {:<16} {counts}", o.name);
        for p in o.notes.iter().chain(&o.problems) {
            let _ = writeln!(report, "       {p}");
        }
    }
    println!("{report}");
    let failed: Vec<&str> = outcomes
        .iter()
        .filter(|o| !o.problems.is_empty())
        .map(|o| o.name.as_str())
        .collect();
    assert!(
        failed.is_empty(),
        "{report}\nfailing vocabularies: {}",
        failed.join(", ")
    );
}

/// Special ids as llama.cpp's loader reports them for the suite's vocabularies (its
/// `print_info`): BOS, EOS, EOT, FIM prefix/suffix/middle/pad/repo, and the EOG set. Where a
/// file leaves EOT or FIM unset, llama.cpp guesses them from token texts in the order of a
/// hash map, which this pins down (qwen2 has both `<|endoftext|>` and `<|im_end|>`).
type Ids = Option<TokenId>;
/// (name, [bos, eos, eot], [fim pre, suf, mid, pad, rep], eog)
type SpecialIdsRow = (&'static str, [Ids; 3], [Ids; 5], &'static [TokenId]);
const SPECIAL_IDS: &[SpecialIdsRow] = &[
    (
        "aquila",
        [Some(0), Some(0), Some(0)],
        [None; 5],
        &[0, 100007],
    ),
    ("baichuan", [Some(1), Some(2), None], [None; 5], &[2]),
    (
        "bert-bge",
        [Some(101), None, None],
        [None, None, None, Some(0), None],
        &[0],
    ),
    (
        "command-r",
        [Some(5), Some(255001), None],
        [None, None, None, Some(0), None],
        &[0, 255001],
    ),
    (
        "deepseek-coder",
        [Some(32013), Some(32014), Some(32014)],
        [Some(32016), Some(32015), Some(32017), None, None],
        &[32014],
    ),
    (
        "deepseek-llm",
        [Some(100000), Some(100001), Some(100001)],
        [None; 5],
        &[100001],
    ),
    ("falcon", [Some(11), Some(11), Some(11)], [None; 5], &[11]),
    (
        "gemma-4",
        [Some(2), Some(1), None],
        [None; 5],
        &[1, 50, 106],
    ),
    (
        "gpt-2",
        [Some(50256), Some(50256), Some(50256)],
        [None; 5],
        &[50256],
    ),
    ("gpt-neox", [Some(0), Some(0), Some(0)], [None; 5], &[0]),
    (
        "llama-bpe",
        [Some(128000), Some(128001), Some(128009)],
        [None; 5],
        &[128001, 128009],
    ),
    ("llama-spm", [Some(1), Some(2), None], [None; 5], &[2]),
    ("mpt", [Some(0), Some(0), Some(0)], [None; 5], &[0]),
    ("nomic-bert-moe", [Some(0), Some(2), None], [None; 5], &[2]),
    (
        "phi-3",
        [Some(1), Some(32000), Some(32007)],
        [None; 5],
        &[2, 32000, 32007],
    ),
    (
        "qwen2",
        [Some(151643), Some(151643), Some(151645)],
        [None; 5],
        &[128247, 151643, 151645],
    ),
    (
        "qwen35",
        [Some(151643), Some(151643), Some(151645)],
        [None; 5],
        &[128247, 151643, 151645],
    ),
    (
        "refact",
        [Some(0), Some(0), Some(0)],
        [Some(1), Some(3), Some(2), Some(4), Some(18)],
        &[0, 4, 18],
    ),
    (
        "starcoder",
        [Some(0), Some(0), Some(0)],
        [Some(1), Some(3), Some(2), Some(4), None],
        &[0, 4],
    ),
];

#[test]
fn special_ids_match_llama_cpp() {
    let mut problems = Vec::new();
    for (name, path) in vocab_files() {
        let Some((_, [bos, eos, eot], fim, eog)) = SPECIAL_IDS.iter().find(|s| s.0 == name) else {
            continue;
        };
        let gguf = Gguf::open(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        let vocab = match ferrox_tokenizer::tokenizer::Vocab::from_gguf(&gguf.metadata()) {
            Ok(v) => v,
            Err(e) => {
                problems.push(format!("{name}: does not load: {e}"));
                continue;
            }
        };
        let got = (
            [vocab.bos(), vocab.eos(), vocab.eot()],
            [
                vocab.fim_pre(),
                vocab.fim_suf(),
                vocab.fim_mid(),
                vocab.fim_pad(),
                vocab.fim_rep(),
            ],
            vocab.eog_ids().collect::<Vec<_>>(),
        );
        if got != ([*bos, *eos, *eot], *fim, eog.to_vec()) {
            problems.push(format!(
                "{name}: got bos/eos/eot {:?}, fim {:?}, eog {:?}; llama.cpp has {:?}, {:?}, {:?}",
                got.0,
                got.1,
                got.2,
                [bos, eos, eot],
                fim,
                eog
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
