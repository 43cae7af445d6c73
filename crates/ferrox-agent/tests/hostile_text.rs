//! Random grammars and schemas, built from the pieces that broke things before (nesting,
//! repetition stacks, rule references, `$ref` chains): each is translated, checked and
//! compiled against Qwen2.5's vocabulary to a constraint or an error, never a panic or a
//! stack overflow. The same properties run unbounded under `crates/ferrox-agent/fuzz`.

mod common;

use common::compiler;
use ferrox_agent::{gbnf, schema_depth, GrammarSpec};
use proptest::prelude::*;
use serde_json::{json, Value};

/// GBNF tokens, valid and not, joined with spaces into rule bodies.
fn gbnf_piece() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "(",
        ")",
        "(",
        ")",
        "|",
        "*",
        "+",
        "?",
        "{2,5}",
        "{0,}",
        "{3}",
        "\"a\"",
        "\"\\n\"",
        "\"\\x41\"",
        "[a-z]",
        "[^\"\\\\]",
        ".",
        "root",
        "item",
        "r-1",
        "::=",
        "#",
        "\n",
        "\"",
        "[",
        "{",
        "}",
        "\\",
        "é",
        "\"\\u00e9\"",
    ])
}

fn gbnf_text() -> impl Strategy<Value = String> {
    let rule = prop::collection::vec(gbnf_piece(), 0..40).prop_map(|p| p.join(" "));
    let name = prop::sample::select(vec!["root", "item", "r-1", "x"]);
    prop::collection::vec((name, rule), 1..6).prop_map(|rules| {
        rules
            .into_iter()
            .map(|(n, body)| format!("{n} ::= {body}\n"))
            .collect()
    })
}

/// JSON schemas mixing keywords, `$ref`s into `$defs` and nesting.
fn schema() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(json!({"type": "string"})),
        Just(json!({"type": "integer", "minimum": 0})),
        Just(json!({"$ref": "#/$defs/a"})),
        Just(json!({"$ref": "#/$defs/b"})),
        Just(json!({"$ref": "#"})),
        Just(json!({"$ref": "#/nowhere"})),
        Just(json!({"enum": [1, "x", null]})),
        Just(json!(true)),
        Just(json!({"type": 7})),
    ];
    let node = leaf.prop_recursive(12, 96, 4, |inner| {
        prop_oneof![
            inner
                .clone()
                .prop_map(|s| json!({"type": "array", "items": s})),
            prop::collection::vec(inner.clone(), 1..4).prop_map(|v| json!({"anyOf": v})),
            prop::collection::vec(inner.clone(), 1..3).prop_map(|v| json!({"allOf": v})),
            prop::collection::vec(inner.clone(), 1..4).prop_map(|v| {
                let props: serde_json::Map<String, Value> = v
                    .into_iter()
                    .enumerate()
                    .map(|(i, s)| (format!("p{i}"), s))
                    .collect();
                json!({"type": "object", "properties": props, "required": ["p0"]})
            }),
        ]
    });
    (node.clone(), node.clone(), node).prop_map(|(root, a, b)| {
        let mut root = match root {
            Value::Object(m) => m,
            other => json!({"anyOf": [other]}).as_object().unwrap().clone(),
        };
        root.insert("$defs".into(), json!({"a": a, "b": b}));
        Value::Object(root)
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn any_gbnf_translates_or_is_refused(text in gbnf_text()) {
        if let Ok(lark) = gbnf::gbnf_to_lark(&text) {
            prop_assert!(lark.contains("start"), "no start rule in {lark:?}");
        }
    }

    #[test]
    fn any_schema_is_checked(schema in schema()) {
        let _ = schema_depth::check(&schema);
    }
}

proptest! {
    // Each case compiles against a 151,936-token vocabulary: fewer of them.
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn any_gbnf_compiles_or_is_refused(text in gbnf_text()) {
        if let Err(e) = compiler().compile(&GrammarSpec::Gbnf(text)) {
            prop_assert!(!e.to_string().is_empty());
        }
    }

    #[test]
    fn any_schema_compiles_or_is_refused(schema in schema()) {
        if let Err(e) = compiler().compile(&GrammarSpec::JsonSchema(schema)) {
            prop_assert!(!e.to_string().is_empty());
        }
    }
}
