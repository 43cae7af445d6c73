//! Each tool-call format's parser, on the text the family's own chat template writes for an
//! assistant turn with calls (the templates of `tests/fixtures/templates`, copied from
//! llama.cpp's `models/templates`): the calls come back, whole and fed in pieces split at
//! every character.

use ferrox_agent::tools::{parse_all, ParseEvent, Parsed, ToolFormat};
use ferrox_tokenizer::chat_template::{ChatTemplate, RenderOptions};
use serde_json::{json, Value};

fn template(name: &str) -> ChatTemplate {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/templates")
        .join(name);
    ChatTemplate::new(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// Calls as an OpenAI assistant message carries them (arguments as objects, as templates
/// expect).
fn calls(n: usize) -> Vec<Value> {
    let all = [
        json!({"id": "call00001", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c\u{e9}lsius \"q\" }"}}}),
        json!({"id": "call00002", "type": "function", "function": {"name": "search", "arguments": {"query": "ferrox", "filters": {"n": [1, 2]}}}}),
    ];
    all[..n].to_vec()
}

/// The assistant text `template` writes for `calls`: from `start_marker` to `end_marker`.
fn assistant_text(
    t: &ChatTemplate,
    calls: &[Value],
    start_marker: &str,
    end_marker: &str,
) -> String {
    let messages = json!([
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "What is the weather?"},
        {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "call00001", "content": "sunny"},
    ]);
    let options = RenderOptions {
        bos_token: "<s>".into(),
        eos_token: "</s>".into(),
        ..Default::default()
    };
    let text = t.render_json(&messages, &options).unwrap();
    let user = text.find("What is the weather?").unwrap();
    let start = user
        + text[user..]
            .find(start_marker)
            .unwrap_or_else(|| panic!("{start_marker} in {text}"));
    let rest = &text[start..];
    let end = rest
        .find(end_marker)
        .unwrap_or_else(|| panic!("{end_marker} in {rest}"));
    rest[..end].to_string()
}

fn check_calls(parsed: &Parsed, expected: &[Value], text: &str) {
    assert_eq!(parsed.calls.len(), expected.len(), "{text:?} -> {parsed:?}");
    for (got, want) in parsed.calls.iter().zip(expected) {
        assert_eq!(got.name, want["function"]["name"], "{text:?}");
        let args: Value = serde_json::from_str(&got.arguments)
            .unwrap_or_else(|e| panic!("arguments {:?}: {e}", got.arguments));
        assert_eq!(args, want["function"]["arguments"], "{text:?}");
    }
}

/// Feeds `text` in the given pieces; the result, and checks the events' order.
fn parse_pieces(format: ToolFormat, pieces: &[&str]) -> Parsed {
    let mut parser = format.parser();
    let mut events = Vec::new();
    for p in pieces {
        parser.push(p, &mut events);
    }
    parser.finish(&mut events);
    let mut started = 0;
    for e in &events {
        match e {
            ParseEvent::CallStart { index, .. } => {
                assert_eq!(*index, started);
                started += 1;
            }
            ParseEvent::CallArgs { index, .. } => assert!(*index < started),
            ParseEvent::Content(t) => assert!(!t.is_empty()),
        }
    }
    let mut parsed = Parsed::default();
    parsed.absorb(&events);
    parsed
}

/// The whole text parses to `expected`, and so does every split of it: in two at each
/// character boundary, and one character at a time.
fn check_format(format: ToolFormat, text: &str, expected: &[Value]) {
    let whole = parse_all(format, text);
    check_calls(&whole, expected, text);
    for (i, _) in text.char_indices().skip(1) {
        let split = parse_pieces(format, &[&text[..i], &text[i..]]);
        assert_eq!(split, whole, "split at {i} of {text:?}");
    }
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
    assert_eq!(
        parse_pieces(format, &pieces),
        whole,
        "{text:?} character by character"
    );
}

#[test]
fn formats_are_detected_from_the_templates() {
    for (file, format) in [
        ("Qwen-Qwen2.5-7B-Instruct.jinja", Some(ToolFormat::Hermes)),
        (
            "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
            Some(ToolFormat::Hermes),
        ),
        ("Qwen-Qwen3-0.6B.jinja", Some(ToolFormat::Hermes)),
        (
            "meta-llama-Llama-3.1-8B-Instruct.jinja",
            Some(ToolFormat::Llama3),
        ),
        (
            "mistralai-Mistral-Nemo-Instruct-2407.jinja",
            Some(ToolFormat::Mistral),
        ),
    ] {
        assert_eq!(
            ToolFormat::detect(template(file).source()),
            format,
            "{file}"
        );
    }
}

#[test]
fn hermes_calls_from_qwen_and_hermes_templates() {
    for file in [
        "Qwen-Qwen2.5-7B-Instruct.jinja",
        "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
        "Qwen-Qwen3-0.6B.jinja",
    ] {
        let t = template(file);
        for n in 1..=2 {
            let text = assistant_text(&t, &calls(n), "<tool_call>", "<|im_end|>");
            check_format(ToolFormat::Hermes, &text, &calls(n));
        }
    }
}

#[test]
fn hermes_content_around_calls_and_malformed_calls() {
    let text =
        "Let me look.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>";
    let p = parse_all(ToolFormat::Hermes, text);
    assert_eq!(p.content, "Let me look.\n");
    assert_eq!(p.calls[0].arguments, "{\"a\": 1}");
    // Keys in the other order: still a call, read whole.
    let text = "<tool_call>\n{\"arguments\": {\"a\": 1}, \"name\": \"f\"}\n</tool_call>";
    let p = parse_all(ToolFormat::Hermes, text);
    assert_eq!((p.calls[0].name.as_str(), p.content.as_str()), ("f", ""));
    for i in 1..text.len() {
        assert_eq!(
            parse_pieces(ToolFormat::Hermes, &[&text[..i], &text[i..]]),
            p
        );
    }
    // A bare call (no tags), as small Qwen models write them; and bare JSON that is not
    // a call stays content.
    let text = " {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n";
    let p = parse_all(ToolFormat::Hermes, text);
    assert_eq!((p.calls.len(), p.content.as_str()), (1, ""), "{p:?}");
    assert_eq!(p.calls[0].arguments, "{\"city\": \"Paris\"}");
    for i in 1..text.len() {
        assert_eq!(
            parse_pieces(ToolFormat::Hermes, &[&text[..i], &text[i..]]),
            p
        );
    }
    let p = parse_all(ToolFormat::Hermes, "{\"a\": 1}");
    assert_eq!((p.calls.len(), p.content.as_str()), (0, "{\"a\": 1}"));
    let p = parse_all(
        ToolFormat::Hermes,
        "Sure: {\"name\": \"f\", \"arguments\": {}}",
    );
    assert_eq!(p.calls.len(), 0);
    // Not JSON: content, tags included.
    let p = parse_all(ToolFormat::Hermes, "<tool_call>oops</tool_call>");
    assert!(p.calls.is_empty());
    assert_eq!(p.content, "<tool_call>oops</tool_call>");
    // Plain text, and text that only looks like the start of a tag.
    let p = parse_all(ToolFormat::Hermes, "a < b and <tool");
    assert_eq!((p.content.as_str(), p.calls.len()), ("a < b and <tool", 0));
    // Cut off inside the arguments (a token limit): the call stands as far as it got.
    let p = parse_all(
        ToolFormat::Hermes,
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": ",
    );
    assert_eq!(p.calls[0].arguments, "{\"a\": ");
}

#[test]
fn llama3_calls_from_the_llama_template() {
    let t = template("meta-llama-Llama-3.1-8B-Instruct.jinja");
    let text = assistant_text(&t, &calls(1), "{\"name\"", "<|eot_id|>");
    check_format(ToolFormat::Llama3, &text, &calls(1));
    let p = parse_all(ToolFormat::Llama3, "Hello {\"name\": 1}");
    assert_eq!(
        (p.content.as_str(), p.calls.len()),
        ("Hello {\"name\": 1}", 0)
    );
}

#[test]
fn mistral_calls_from_the_nemo_template() {
    let t = template("mistralai-Mistral-Nemo-Instruct-2407.jinja");
    for n in 1..=2 {
        let text = assistant_text(&t, &calls(n), "[TOOL_CALLS]", "</s>");
        check_format(ToolFormat::Mistral, &text, &calls(n));
    }
    let p = parse_all(ToolFormat::Mistral, "[1, 2] are numbers");
    assert_eq!(
        (p.content.as_str(), p.calls.len()),
        ("[1, 2] are numbers", 0)
    );
}

#[test]
fn qwen3_coder_xml_calls() {
    let t = template("Qwen3-Coder.jinja");
    for n in 1..=2 {
        let text = assistant_text(&t, &calls(n), "<tool_call>", "<|im_end|>");
        check_format(ToolFormat::Qwen3Coder, &text, &calls(n));
    }
}

#[test]
fn glm_calls() {
    let t = template("GLM-4.6.jinja");
    for n in 1..=2 {
        let text = assistant_text(&t, &calls(n), "<tool_call>", "<|observation|>");
        check_format(ToolFormat::Glm, &text, &calls(n));
    }
}

#[test]
fn kimi_calls() {
    let t = template("moonshotai-Kimi-K2.jinja");
    for n in 1..=2 {
        let text = assistant_text(&t, &calls(n), "<|tool_calls_section_begin|>", "<|im_end|>");
        check_format(ToolFormat::Kimi, &text, &calls(n));
    }
}

#[test]
fn deepseek_calls() {
    for (file, fenced) in [
        ("deepseek-ai-DeepSeek-V3.1.jinja", false),
        ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", true),
    ] {
        let t = template(file);
        for n in 1..=2 {
            let text = assistant_text(
                &t,
                &calls(n),
                "<｜tool▁calls▁begin｜>",
                "<｜end▁of▁sentence｜>",
            );
            check_format(ToolFormat::DeepSeek { fenced }, &text, &calls(n));
        }
    }
}
