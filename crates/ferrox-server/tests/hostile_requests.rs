//! Random JSON bodies, built from the fields the endpoints read (with values of every kind,
//! nested), through every request parser: each is a request or a typed error, never a
//! panic. The same property runs unbounded under `crates/ferrox-server/fuzz`.

use ferrox_server::{anthropic, api};
use proptest::prelude::*;
use serde_json::{Map, Value};

const N_VOCAB: usize = 262_144;

/// Field names the OpenAI and Anthropic parsers look at, and a few they do not.
const KEYS: &[&str] = &[
    "model",
    "prompt",
    "messages",
    "role",
    "content",
    "type",
    "text",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "n",
    "stop",
    "seed",
    "stream",
    "stream_options",
    "include_usage",
    "logprobs",
    "top_logprobs",
    "logit_bias",
    "presence_penalty",
    "frequency_penalty",
    "repeat_penalty",
    "response_format",
    "json_schema",
    "schema",
    "grammar",
    "tools",
    "tool_choice",
    "function",
    "name",
    "parameters",
    "arguments",
    "tool_calls",
    "tool_call_id",
    "system",
    "stop_sequences",
    "thinking",
    "tokens",
    "add_special",
    "with_pieces",
    "cache_salt",
    "speculative",
    "image_url",
    "url",
    "input",
    "id",
    "extra",
];

fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        prop::sample::select(vec![0i64, 1, -1, 2, 16, 4096, 262_143, 262_144, i64::MAX])
            .prop_map(Value::from),
        ".{0,12}".prop_map(Value::String),
        prop::sample::select(vec![
            "user",
            "assistant",
            "system",
            "tool",
            "developer",
            "text",
            "json_schema",
            "json_object",
            "function",
            "auto",
            "none",
            "required",
            "root ::= \"a\"",
        ])
        .prop_map(|s| Value::String(s.into())),
    ];
    leaf.prop_recursive(6, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((prop::sample::select(KEYS), inner), 0..8).prop_map(|kv| {
                Value::Object(
                    kv.into_iter()
                        .map(|(k, v)| (k.to_string(), v))
                        .collect::<Map<_, _>>(),
                )
            }),
        ]
    })
}

/// A body: an object whose top-level fields are the parsers' own.
fn body() -> impl Strategy<Value = Value> {
    prop::collection::vec((prop::sample::select(KEYS), json()), 0..10)
        .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect()))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    #[test]
    fn any_body_parses_or_is_refused(body in body()) {
        let _ = api::parse_chat(&body, N_VOCAB);
        let _ = api::parse_completion(&body, N_VOCAB);
        let _ = api::parse_tokenize(&body);
        let _ = api::parse_detokenize(&body);
        let _ = anthropic::parse_messages(&body, N_VOCAB, false);
        let _ = anthropic::parse_messages(&body, N_VOCAB, true);
    }
}
