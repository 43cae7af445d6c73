//! `ferrox tokenize` and `ferrox detokenize`: a checkpoint's tokenizer on the command line,
//! with the ids llama.cpp's `llama-tokenize` prints for the same text.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use ferrox_tokenizer::tokenizer::{DetokenizeOptions, TokenId, Tokenizer};

use super::InputError;

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["prompt", "file"])))]
pub struct TokenizeArgs {
    /// The GGUF file (a vocabulary-only file is enough).
    #[arg(short = 'm', long = "model")]
    model: PathBuf,
    /// The text to tokenize.
    #[arg(short = 'p', long = "prompt")]
    prompt: Option<String>,
    /// A UTF-8 file whose exact bytes are tokenized.
    #[arg(short = 'f', long = "file")]
    file: Option<PathBuf>,
    /// Add no BOS token. As llama-tokenize does, special tokens (BOS, EOS, CLS/SEP) are
    /// added only when the vocabulary adds BOS.
    #[arg(long)]
    no_bos: bool,
    /// Turn control-token text in the input (`<start_of_turn>`...) into those tokens: the
    /// default, as llama-tokenize (the flag is accepted for scripts that pass it).
    #[arg(long, overrides_with = "no_parse_special")]
    parse_special: bool,
    /// Tokenize control-token text as plain text.
    #[arg(long, overrides_with = "parse_special")]
    no_parse_special: bool,
    /// Print only the ids, as one JSON array on one line.
    #[arg(long)]
    ids: bool,
}

#[derive(clap::Args)]
pub struct DetokenizeArgs {
    /// The GGUF file (a vocabulary-only file is enough).
    #[arg(short = 'm', long = "model")]
    model: PathBuf,
    /// Token ids, as separate arguments or as a JSON array (`[2, 9259, 1902]`).
    #[arg(required = true, num_args = 1..)]
    ids: Vec<String>,
    /// Render control tokens (`<bos>`, `<end_of_turn>`...) as nothing instead of their text.
    #[arg(long)]
    no_special: bool,
}

fn load_tokenizer(path: &Path) -> anyhow::Result<Tokenizer> {
    let gguf = super::open_gguf(path)?;
    Tokenizer::from_gguf(&gguf)
        .map_err(|e| InputError(format!("{}: no usable tokenizer: {e}", path.display())).into())
}

fn read_text(args: &TokenizeArgs) -> anyhow::Result<String> {
    if let Some(prompt) = &args.prompt {
        return Ok(prompt.clone());
    }
    let Some(path) = &args.file else {
        return Err(InputError("give the text with -p TEXT or -f FILE".into()).into());
    };
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    String::from_utf8(bytes).map_err(|e| {
        InputError(format!(
            "{} is not UTF-8 text (invalid byte at offset {})",
            path.display(),
            e.utf8_error().valid_up_to()
        ))
        .into()
    })
}

pub fn run_tokenize(args: TokenizeArgs) -> anyhow::Result<()> {
    let tokenizer = load_tokenizer(&args.model)?;
    let text = read_text(&args)?;
    let add_special = tokenizer.vocab().add_bos() && !args.no_bos;
    let ids = tokenizer.encode(&text, add_special, !args.no_parse_special);

    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if args.ids {
        let list: Vec<String> = ids.iter().map(u32::to_string).collect();
        writeln!(out, "[{}]", list.join(", "))?;
    } else {
        for &id in &ids {
            writeln!(out, "{id}\t{}", escape_piece(tokenizer.token_to_piece(id)))?;
        }
    }
    out.flush()?;
    Ok(())
}

/// A piece on one line: its text escaped as Rust's `escape_debug` does, and bytes that are
/// not UTF-8 (part of a character) as `\xNN`.
fn escape_piece(bytes: &[u8]) -> String {
    let mut out = String::new();
    for chunk in bytes.utf8_chunks() {
        out.extend(chunk.valid().escape_debug());
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// Reads ids given as separate arguments, a JSON array, or a mix ("[2," "9259]").
fn parse_ids(args: &[String], vocab_len: usize) -> anyhow::Result<Vec<TokenId>> {
    let mut ids = Vec::new();
    for arg in args {
        let items = arg
            .split(|c: char| c == ',' || c == '[' || c == ']' || c.is_whitespace())
            .filter(|s| !s.is_empty());
        for item in items {
            let id: TokenId = item
                .parse()
                .map_err(|_| InputError(format!("`{item}` is not a token id")))?;
            if id as usize >= vocab_len {
                return Err(InputError(format!(
                    "token id {id} is out of range (the vocabulary has {vocab_len} tokens)"
                ))
                .into());
            }
            ids.push(id);
        }
    }
    Ok(ids)
}

pub fn run_detokenize(args: DetokenizeArgs) -> anyhow::Result<()> {
    let tokenizer = load_tokenizer(&args.model)?;
    let ids = parse_ids(&args.ids, tokenizer.vocab().len())?;
    let options = DetokenizeOptions {
        remove_special: false,
        unparse_special: !args.no_special,
    };
    let bytes = tokenizer.detokenize(&ids, options);
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", String::from_utf8_lossy(&bytes))?;
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_escape_controls_and_stray_bytes() {
        assert_eq!(escape_piece(b"a\nb\t\"c\""), "a\\nb\\t\\\"c\\\"");
        assert_eq!(escape_piece(&[0xf0, 0x9f]), "\\xf0\\x9f");
        assert_eq!(escape_piece(" é".as_bytes()), " é");
    }

    #[test]
    fn ids_parse_from_arguments_and_json() {
        let args: Vec<String> = ["[2,", "9259,", "1902]", "7"].map(String::from).to_vec();
        assert_eq!(parse_ids(&args, 10_000).unwrap(), [2, 9259, 1902, 7]);
        assert!(parse_ids(&["x".to_string()], 10).is_err());
        assert!(parse_ids(&["10".to_string()], 10).is_err());
    }
}
