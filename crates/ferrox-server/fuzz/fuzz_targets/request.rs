#![no_main]
//! Any JSON body reaches every request parser (OpenAI chat and completions, Anthropic
//! messages and count_tokens, tokenize, detokenize) and comes back as a request or a typed
//! error: no panic, no unbounded allocation, no deep recursion.

use libfuzzer_sys::fuzz_target;
use ferrox_server::{anthropic, api};

/// The default model's vocabulary size: token ids past it must be refused.
const N_VOCAB: usize = 262_144;

fuzz_target!(|data: &[u8]| {
    let Ok(body) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let _ = api::parse_chat(&body, N_VOCAB);
    let _ = api::parse_completion(&body, N_VOCAB);
    let _ = api::parse_tokenize(&body);
    if let Ok(ids) = api::parse_detokenize(&body) {
        let _ = ids.len();
    }
    let _ = anthropic::parse_messages(&body, N_VOCAB, false);
    let _ = anthropic::parse_messages(&body, N_VOCAB, true);
});
