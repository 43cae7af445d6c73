//! The tokenizer of a checkpoint directory as `tokenizer.ggml.*` metadata: Moonshot's
//! `tiktoken.model` (mergeable ranks) with the special tokens, BOS/EOS and chat template of
//! `tokenizer_config.json`, laid out as llama.cpp's converter writes them, so that the
//! GGUF tokenizer loads it unchanged.

use std::collections::BTreeMap;
use std::path::Path;

use ferrox_gguf::OwnedValue;
use ferrox_tokenizer::tokenizer::{tiktoken_metadata, TiktokenRanks, TokenId, MAX_TIKTOKEN_TOKENS};
use serde_json::{Map, Value};

use crate::arch::Architecture;
use crate::config::{read_bounded, read_json_object, Config};
use crate::error::{HfError, Result};

const TIKTOKEN: &str = "tiktoken.model";
const TOKENIZER_CONFIG: &str = "tokenizer_config.json";
const CHAT_TEMPLATE: &str = "chat_template.jinja";
/// Real tiktoken files are a few MiB.
const MAX_TIKTOKEN_BYTES: u64 = 256 << 20;

/// The tokenizer metadata for a model of architecture `arch`.
pub(crate) fn metadata(
    dir: &Path,
    config: &Config,
    arch: &Architecture,
) -> Result<Vec<(String, OwnedValue)>> {
    let pre = arch.pre_tokenizer;
    let tiktoken = dir.join(TIKTOKEN);
    if !tiktoken.is_file() {
        return Err(HfError::File {
            path: dir.to_path_buf(),
            reason: format!("no {TIKTOKEN} (the only tokenizer file read so far)"),
        });
    }
    let ranks =
        TiktokenRanks::parse(&read_bounded(&tiktoken, MAX_TIKTOKEN_BYTES)?).map_err(|e| {
            HfError::File {
                path: tiktoken.clone(),
                reason: e.to_string(),
            }
        })?;
    let n_vocab = config.usize("vocab_size")?;
    if n_vocab > MAX_TIKTOKEN_TOKENS {
        return Err(config.error(
            "vocab_size",
            format!("is {n_vocab}, more than {MAX_TIKTOKEN_TOKENS}"),
        ));
    }
    let tc_path = dir.join(TOKENIZER_CONFIG);
    let tc = if tc_path.is_file() {
        read_json_object(&tc_path)?
    } else {
        Map::new()
    };
    let bad = |reason: String| HfError::File {
        path: tc_path.clone(),
        reason,
    };

    // Every added token is special (as Moonshot's tokenizer treats them); ids past the
    // mergeable ranks that it leaves unnamed are its reserved tokens.
    let mut specials: BTreeMap<TokenId, String> = BTreeMap::new();
    if let Some(added) = tc.get("added_tokens_decoder") {
        let added = added
            .as_object()
            .ok_or_else(|| bad("`added_tokens_decoder` is not an object".into()))?;
        for (id, token) in added {
            let id: TokenId = id
                .parse()
                .map_err(|_| bad(format!("`added_tokens_decoder` key {id:?} is not an id")))?;
            let text = token_text(token).ok_or_else(|| {
                bad(format!(
                    "`added_tokens_decoder.{id}` has no `content` string"
                ))
            })?;
            specials.insert(id, text.to_string());
        }
    }
    for id in ranks.len()..n_vocab {
        specials
            .entry(id as TokenId)
            .or_insert_with(|| format!("<|reserved_token_{id}|>"));
    }
    let special_list: Vec<(TokenId, String)> = specials.clone().into_iter().collect();
    let mut out = tiktoken_metadata(&ranks, &special_list, n_vocab, pre)?;

    let id_of = |text: &str| specials.iter().find(|(_, t)| *t == text).map(|(&id, _)| id);
    let key = |k: &str| format!("tokenizer.ggml.{k}");
    for (name, config_key, gguf_key) in [
        ("bos_token", "bos_token_id", "bos_token_id"),
        ("eos_token", "eos_token_id", "eos_token_id"),
        ("unk_token", "unk_token_id", "unknown_token_id"),
        ("pad_token", "pad_token_id", "padding_token_id"),
    ] {
        let named = match tc.get(name).filter(|v| !v.is_null()) {
            Some(v) => {
                let text = token_text(v).ok_or_else(|| bad(format!("`{name}` is not a token")))?;
                Some(id_of(text).ok_or_else(|| {
                    bad(format!(
                        "`{name}` {text:?} is not one of the special tokens"
                    ))
                })?)
            }
            None => None,
        };
        let configured = config.opt_u32(config_key)?;
        let id = match arch.eos_from_config && name == "eos_token" {
            true => configured.or(named),
            false => named.or(configured),
        };
        if let Some(id) = id {
            out.push((key(gguf_key), id.into()));
        }
    }
    for flag in ["add_bos_token", "add_eos_token"] {
        if let Some(v) = tc.get(flag).filter(|v| !v.is_null()) {
            let on = v
                .as_bool()
                .ok_or_else(|| bad(format!("`{flag}` is not true or false")))?;
            out.push((key(flag), on.into()));
        }
    }
    if let Some(template) = chat_template(dir, &tc).map_err(bad)? {
        out.push(("tokenizer.chat_template".to_string(), template.into()));
    }
    Ok(out)
}

/// A token as `tokenizer_config.json` writes it: a string or an `AddedToken` object.
fn token_text(v: &Value) -> Option<&str> {
    match v {
        Value::String(s) => Some(s),
        Value::Object(o) => o.get("content")?.as_str(),
        _ => None,
    }
}

/// The chat template: `tokenizer_config.json`'s `chat_template` (a string, or a list of
/// named templates of which `default` is used), else `chat_template.jinja`.
fn chat_template(dir: &Path, tc: &Map<String, Value>) -> Result<Option<String>, String> {
    match tc.get("chat_template") {
        Some(Value::String(s)) => return Ok(Some(s.clone())),
        Some(Value::Array(list)) => {
            let default = list
                .iter()
                .find(|t| t.get("name") == Some(&"default".into()));
            return Ok(default
                .and_then(|t| t.get("template")?.as_str())
                .map(str::to_string));
        }
        Some(Value::Null) | None => {}
        Some(_) => return Err("`chat_template` is neither a string nor a list".into()),
    }
    let path = dir.join(CHAT_TEMPLATE);
    if !path.is_file() {
        return Ok(None);
    }
    let bytes = read_bounded(&path, 16 << 20).map_err(|e| e.to_string())?;
    String::from_utf8(bytes)
        .map(Some)
        .map_err(|_| format!("{CHAT_TEMPLATE} is not UTF-8"))
}
