//! Chat-template rendering against outputs recorded with Python jinja2 configured as
//! transformers' `apply_chat_template` (scripts/gen-chat-template-fixtures.py), plus error
//! cases and limits.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ferrox_tokenizer::chat_template::{
    prompt_for_tokenizer, starts_with_bos, strip_leading_bos, ChatMessage, ChatTemplate,
    ChatTemplateError, NaiveDateTime, RenderOptions, CHATML_SOURCE,
};
use serde_json::Value as Json;

/// The recorded fixtures; `FERROX_CHAT_TEMPLATE_FIXTURES` points the comparison at another
/// folder written by `gen-chat-template-fixtures.py --out DIR`.
fn fixtures_dir() -> PathBuf {
    match std::env::var_os("FERROX_CHAT_TEMPLATE_FIXTURES") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat_templates"),
    }
}

struct Fixture {
    name: String,
    source: String,
    json: Json,
}

fn fixtures() -> Vec<Fixture> {
    let dir = fixtures_dir();
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    paths.sort();
    assert!(
        paths.len() >= 20,
        "expected the recorded fixtures in {}",
        dir.display()
    );
    paths
        .into_iter()
        .map(|path| {
            let json: Json =
                serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            let source = match json["template_file"].as_str() {
                Some(file) => std::fs::read_to_string(dir.join(file)).unwrap(),
                None => json["template"].as_str().unwrap().to_string(),
            };
            Fixture {
                name: json["name"].as_str().unwrap().to_string(),
                source,
                json,
            }
        })
        .collect()
}

fn options_for(fixture: &Json, case: &Json) -> RenderOptions {
    RenderOptions {
        add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
        bos_token: fixture["bos_token"].as_str().unwrap().into(),
        eos_token: fixture["eos_token"].as_str().unwrap().into(),
        tools: case.get("tools").cloned(),
        extra: fixture["extra"].as_object().unwrap().clone(),
        now: Some(
            NaiveDateTime::parse_from_str(fixture["now"].as_str().unwrap(), "%Y-%m-%dT%H:%M:%S")
                .unwrap(),
        ),
    }
}

fn first_difference(a: &str, b: &str) -> String {
    let at = a
        .char_indices()
        .zip(b.chars())
        .find(|((_, x), y)| x != y)
        .map(|((i, _), _)| i);
    let at = at.unwrap_or(a.len().min(b.len()));
    let from = a[..at].char_indices().rev().nth(40).map_or(0, |(i, _)| i);
    format!(
        "at byte {at}: ours {:?} vs jinja2 {:?}",
        &a[from..],
        &b[from.min(b.len())..]
    )
}

#[test]
fn fixtures_match_jinja2() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for fixture in fixtures() {
        let template = match ChatTemplate::new(&fixture.source) {
            Ok(t) => t,
            Err(e) => {
                failures.push(format!("{}: does not compile: {e}", fixture.name));
                continue;
            }
        };
        for case in fixture.json["cases"].as_array().unwrap() {
            let label = format!(
                "{} / {} / add_generation_prompt={}",
                fixture.name, case["conversation"], case["add_generation_prompt"]
            );
            let messages: Vec<ChatMessage> =
                serde_json::from_value(case["messages"].clone()).unwrap();
            let options = options_for(&fixture.json, case);
            let ours = template.render(&messages, &options);
            checked += 1;
            match (case.get("expected").and_then(Json::as_str), ours) {
                (Some(want), Ok(got)) if got == want => {}
                (Some(want), Ok(got)) => {
                    failures.push(format!("{label}: {}", first_difference(&got, want)))
                }
                (Some(_), Err(e)) => failures.push(format!("{label}: unexpected error {e}")),
                (None, Ok(got)) => failures.push(format!(
                    "{label}: rendered {got:?} but jinja2 failed with {}",
                    case["error"]
                )),
                (None, Err(e)) => {
                    // jinja2's TemplateError from raise_exception must come through with its text.
                    let want = case["error"].as_str().unwrap();
                    if let Some(msg) = want.strip_prefix("TemplateError: ") {
                        match &e {
                            ChatTemplateError::Raised { message, .. } if message == msg => {}
                            other => failures.push(format!(
                                "{label}: expected raise_exception({msg:?}), got {other}"
                            )),
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 250, "only {checked} cases");
    assert!(
        failures.is_empty(),
        "{} of {checked} cases differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn every_model_template_in_the_fixtures_is_tested() {
    let names: Vec<String> = fixtures().into_iter().map(|f| f.name).collect();
    for model in [
        "meta-llama-Llama-3.1-8B-Instruct",
        "meta-llama-Llama-3.2-3B-Instruct",
        "meta-llama-Llama-3.3-70B-Instruct",
        "Qwen-Qwen2.5-7B-Instruct",
        "Qwen-Qwen3-0.6B",
        "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
        "deepseek-ai-DeepSeek-V3.1",
        "mistralai-Mistral-Nemo-Instruct-2407",
        "Mistral-Small-3.2-24B-Instruct-2506",
        "google-gemma-2-2b-it",
        "google-gemma-3-it",
        "microsoft-Phi-3.5-mini-instruct",
        "moonshotai-Kimi-K2",
        "Kimi-K2-Instruct",
        "chatml",
    ] {
        assert!(names.iter().any(|n| n == model), "no fixture for {model}");
    }
}

#[test]
fn chatml_is_llama_cpp_fallback() {
    let fixture: Json =
        serde_json::from_str(&std::fs::read_to_string(fixtures_dir().join("chatml.json")).unwrap())
            .unwrap();
    assert_eq!(fixture["template"].as_str().unwrap(), CHATML_SOURCE);
    let out = ChatTemplate::chatml()
        .render(
            &[
                ChatMessage::new("system", "S"),
                ChatMessage::new("user", "U"),
            ],
            &RenderOptions {
                add_generation_prompt: true,
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    );
}

fn render(source: &str, messages: &[ChatMessage]) -> Result<String, ChatTemplateError> {
    ChatTemplate::new(source)?.render(messages, &RenderOptions::default())
}

#[test]
fn error_messages_read_well() {
    let cases = [
        ("{% for m in messages %}\n{{ m.content }\n{% endfor %}", "chat template syntax error: syntax error: unexpected `}`, expected end of variable block (line 2)"),
        ("a\n{% endfor %}", "chat template syntax error: syntax error: unknown statement endfor (line 2)"),
        ("\n\n{{ raise_exception('Conversation roles must alternate') }}", "chat template raised an exception: Conversation roles must alternate (line 3)"),
        ("{{ messages[0].content.nope.deeper }}", "chat template render error: undefined value (line 1)"),
        ("{{ 1 + 'a' }}", "chat template render error: invalid operation: tried to use + operator on unsupported types number and string (line 1)"),
        ("{{ undefined_fn() }}", "chat template render error: unknown function: undefined_fn is unknown (line 1)"),
        ("{{ messages | nofilter }}", "chat template render error: unknown filter: filter nofilter is unknown (line 1)"),
    ];
    let mut wrong = Vec::new();
    for (src, want) in cases {
        let got = ChatTemplate::new(src)
            .and_then(|t| t.render(&[ChatMessage::new("user", "x")], &RenderOptions::default()))
            .unwrap_err()
            .to_string();
        if got != want {
            wrong.push(format!("{src:?}: got {got:?}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn syntax_error_names_reason_and_line() {
    let err = ChatTemplate::new("line one\n{% for m in messages %}\n{{ m.content }\n{% endfor %}")
        .unwrap_err();
    match &err {
        ChatTemplateError::Syntax { message, line } => {
            assert_eq!(*line, Some(3), "{err}");
            assert!(message.contains("syntax error"), "{message}");
        }
        other => panic!("expected a syntax error, got {other:?}"),
    }
    assert!(err.to_string().contains("line 3"), "{err}");

    let err = ChatTemplate::new("{% if x %}never closed").unwrap_err();
    assert!(matches!(err, ChatTemplateError::Syntax { .. }), "{err}");
    let err = ChatTemplate::new("{% generation_bad %}").unwrap_err();
    assert!(matches!(err, ChatTemplateError::Syntax { .. }), "{err}");
}

#[test]
fn raise_exception_is_an_error_with_its_message() {
    let src = "ok\n{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}";
    let err = render(src, &[ChatMessage::new("system", "x")]).unwrap_err();
    match &err {
        ChatTemplateError::Raised { message, line } => {
            assert_eq!(message, "System role not supported");
            assert_eq!(*line, Some(2));
        }
        other => panic!("expected Raised, got {other:?}"),
    }
    assert_eq!(
        render(src, &[ChatMessage::new("user", "x")]).unwrap(),
        "ok\n"
    );

    // raised inside a macro
    let src = "{% macro check(m) %}{{ raise_exception('bad ' ~ m.role) }}{% endmacro %}{{ check(messages[0]) }}";
    let err = render(src, &[ChatMessage::new("tool", "x")]).unwrap_err();
    assert!(
        matches!(&err, ChatTemplateError::Raised { message, .. } if message == "bad tool"),
        "{err:?}"
    );
}

#[test]
fn undefined_is_lenient_like_jinja2() {
    let msgs = [ChatMessage::new("user", "hi")];
    // printing, testing and iterating an undefined value are fine
    assert_eq!(render("[{{ nothing }}]", &msgs).unwrap(), "[]");
    assert_eq!(
        render("{% if nothing %}a{% else %}b{% endif %}", &msgs).unwrap(),
        "b"
    );
    assert_eq!(
        render("{% for x in nothing %}x{% endfor %}.", &msgs).unwrap(),
        "."
    );
    assert_eq!(
        render(
            "{{ messages[0].missing }}|{{ messages[5] }}|{{ messages[0]['x'] }}",
            &msgs
        )
        .unwrap(),
        "||"
    );
    assert_eq!(
        render(
            "{{ nothing is defined }} {{ messages[0].name is defined }}",
            &msgs
        )
        .unwrap(),
        "False False"
    );
    // ...but an attribute of an undefined value is an error, as in jinja2
    let err = render("{{ nothing.attr }}", &msgs).unwrap_err();
    assert!(matches!(err, ChatTemplateError::Render { .. }), "{err:?}");
    assert!(err.to_string().contains("undefined"), "{err}");
    // an unknown function is an error
    let err = render("{{ no_such_function() }}", &msgs).unwrap_err();
    assert!(matches!(err, ChatTemplateError::Render { .. }), "{err:?}");
}

#[test]
fn runaway_loop_runs_out_of_fuel() {
    let src =
        "{% for i in range(100000) %}{% for j in range(100000) %}{{ '' }}{% endfor %}{% endfor %}";
    let t = ChatTemplate::new(src).unwrap().with_fuel(Some(200_000));
    let err = t.render(&[], &RenderOptions::default()).unwrap_err();
    assert!(
        matches!(err, ChatTemplateError::OutOfFuel { fuel: 200_000, .. }),
        "{err:?}"
    );

    // the default budget also ends it, in bounded time
    let started = Instant::now();
    let err = ChatTemplate::new(src)
        .unwrap()
        .render(&[], &RenderOptions::default())
        .unwrap_err();
    assert!(
        matches!(err, ChatTemplateError::OutOfFuel { .. }),
        "{err:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(120),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn runaway_recursion_and_memory_are_errors() {
    // infinite recursion through a macro
    let src = "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}";
    let err = std::thread::Builder::new()
        .stack_size(16 << 20)
        .spawn(move || render(src, &[]).unwrap_err())
        .unwrap()
        .join()
        .unwrap();
    assert!(matches!(err, ChatTemplateError::Render { .. }), "{err:?}");

    // string doubling is charged fuel per byte
    let src = "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}";
    let t = ChatTemplate::new(src).unwrap().with_fuel(Some(1_000_000));
    let err = t.render(&[], &RenderOptions::default()).unwrap_err();
    assert!(
        matches!(err, ChatTemplateError::OutOfFuel { .. }),
        "{err:?}"
    );

    // printing and tojson of a value that shares itself are charged per element
    for out in ["{{ ns.s }}", "{{ ns.s | tojson }}", "{{ ns.s | string }}"] {
        let src = format!(
            "{{% set ns = namespace(s='x') %}}{{% for i in range(60) %}}{{% set ns.s = [ns.s, ns.s] %}}{{% endfor %}}{out}"
        );
        let t = ChatTemplate::new(&src).unwrap().with_fuel(Some(1_000_000));
        let err = t.render(&[], &RenderOptions::default()).unwrap_err();
        assert!(
            matches!(err, ChatTemplateError::OutOfFuel { .. }),
            "{out}: {err:?}"
        );
    }

    // output limit
    let t = ChatTemplate::new("{% for m in messages %}{{ m.content }}{% endfor %}")
        .unwrap()
        .with_max_output_bytes(1000);
    let big = vec![ChatMessage::new("user", "y".repeat(300)); 5];
    let err = t.render(&big, &RenderOptions::default()).unwrap_err();
    assert!(
        matches!(err, ChatTemplateError::OutputTooLarge { limit: 1000 }),
        "{err:?}"
    );
    assert_eq!(
        t.render(&big[..3], &RenderOptions::default())
            .unwrap()
            .len(),
        900
    );
}

#[test]
fn large_conversations_fit_the_default_fuel() {
    let dir = fixtures_dir().join("templates");
    let options = RenderOptions {
        add_generation_prompt: true,
        bos_token: "<s>".into(),
        ..Default::default()
    };
    let many: Vec<ChatMessage> = (0..5000)
        .map(|i| {
            ChatMessage::new(
                if i % 2 == 0 { "user" } else { "assistant" },
                format!("message {i}"),
            )
        })
        .collect();
    let long: Vec<ChatMessage> = vec![ChatMessage::new("user", "lorem ipsum ".repeat(200_000))];
    for name in [
        "meta-llama-Llama-3.1-8B-Instruct.jinja",
        "Qwen-Qwen3-0.6B.jinja",
        "mistralai-Mistral-Nemo-Instruct-2407.jinja",
    ] {
        let t = ChatTemplate::new(&std::fs::read_to_string(dir.join(name)).unwrap()).unwrap();
        let out = t
            .render(&many, &options)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(out.contains("message 4999"), "{name}");
        let out = t
            .render(&long, &options)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(out.len() > 2_400_000, "{name}");
    }
}

#[test]
fn hostile_content_is_data() {
    let t = ChatTemplate::chatml();
    let evil = "{{ raise_exception('x') }}{% for i in range(99999999) %}{% endfor %}";
    let out = t
        .render(&[ChatMessage::new("user", evil)], &RenderOptions::default())
        .unwrap();
    assert_eq!(out, format!("<|im_start|>user\n{evil}<|im_end|>\n"));
}

#[test]
fn bos_helpers() {
    let t = ChatTemplate::new(
        "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{{ eos_token }}",
    )
    .unwrap();
    let options = RenderOptions {
        bos_token: "<s>".into(),
        eos_token: "</s>".into(),
        ..Default::default()
    };
    let text = t
        .render(&[ChatMessage::new("user", "hi")], &options)
        .unwrap();
    assert_eq!(text, "<s>hi</s>");
    assert!(starts_with_bos(&text, "<s>"));
    assert!(!starts_with_bos(&text, ""));
    assert!(!starts_with_bos("hi", "<s>"));
    assert_eq!(strip_leading_bos(&text, "<s>"), "hi</s>");
    assert_eq!(strip_leading_bos("hi", "<s>"), "hi");
    assert_eq!(strip_leading_bos(&text, ""), text);
    assert_eq!(prompt_for_tokenizer(&text, &options, true, false), "hi</s>");
    assert_eq!(
        prompt_for_tokenizer(&text, &options, false, false),
        "<s>hi</s>"
    );
    assert_eq!(prompt_for_tokenizer(&text, &options, true, true), "hi");
}

#[test]
fn message_serde_and_optional_fields() {
    let json = serde_json::json!([
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]},
        {"role": "tool", "content": "42", "tool_call_id": "abc", "name": "f"},
        {"role": "assistant", "content": "done", "reasoning_content": "thought"}
    ]);
    let msgs: Vec<ChatMessage> = serde_json::from_value(json.clone()).unwrap();
    assert_eq!(msgs[3].extra["reasoning_content"], "thought");
    assert_eq!(serde_json::to_value(&msgs).unwrap(), json);
    let src = "{% for m in messages %}{{ m.role }}:{{ m.name is defined }}:{{ m.tool_calls is defined }}:{{ m.reasoning_content | default('-') }}\n{% endfor %}";
    let out = render(src, &msgs).unwrap();
    assert_eq!(out, "user:False:False:-\nassistant:False:True:-\ntool:True:False:-\nassistant:False:False:thought\n");

    // raw JSON messages: null content and content parts reach the template as given
    let t = ChatTemplate::new(
        "{% for m in messages %}{{ m.content is none }}|{{ m.content }}\n{% endfor %}",
    )
    .unwrap();
    let raw = serde_json::json!([{"role": "assistant", "content": null}, {"role": "user", "content": [{"type": "text", "text": "a"}]}]);
    assert_eq!(
        t.render_json(&raw, &RenderOptions::default()).unwrap(),
        "True|None\nFalse|[{'type': 'text', 'text': 'a'}]\n"
    );
    assert!(matches!(
        t.render_json(&serde_json::json!({}), &RenderOptions::default()),
        Err(ChatTemplateError::Context(_))
    ));
}

#[test]
fn strftime_now_uses_the_clock_or_the_override() {
    let t = ChatTemplate::new("{{ strftime_now('%Y') }}").unwrap();
    let year: i32 = t
        .render(&[], &RenderOptions::default())
        .unwrap()
        .parse()
        .unwrap();
    assert!(year >= 2025);
    let err = ChatTemplate::new("{{ strftime_now('%Q %') }}")
        .unwrap()
        .render(&[], &RenderOptions::default());
    assert!(err.is_err());
}

#[test]
fn from_metadata_reads_default_and_named_templates() {
    use ferrox_gguf::{Gguf, GgufWriter};

    fn gguf(kvs: &[(&str, &str)], names: Option<Vec<&str>>) -> Gguf {
        let mut w = GgufWriter::new();
        w.set("general.architecture", "llama");
        for (k, v) in kvs {
            w.set(*k, *v);
        }
        if let Some(names) = names {
            w.set(
                "tokenizer.chat_templates",
                names.into_iter().map(String::from).collect::<Vec<_>>(),
            );
        }
        Gguf::from_bytes(w.to_bytes()).unwrap()
    }

    let g = gguf(
        &[
            ("tokenizer.chat_template", "D{{ messages | length }}"),
            ("tokenizer.chat_template.tool_use", "T"),
        ],
        Some(vec!["tool_use", "rag"]),
    );
    let meta = g.metadata();
    let opts = RenderOptions::default();
    let msgs = [ChatMessage::new("user", "x")];
    assert_eq!(
        ChatTemplate::from_metadata(&meta)
            .unwrap()
            .unwrap()
            .render(&msgs, &opts)
            .unwrap(),
        "D1"
    );
    assert_eq!(
        ChatTemplate::from_metadata_named(&meta, "tool_use")
            .unwrap()
            .unwrap()
            .render(&msgs, &opts)
            .unwrap(),
        "T"
    );
    assert!(ChatTemplate::from_metadata_named(&meta, "rag")
        .unwrap()
        .is_none());
    assert_eq!(ChatTemplate::metadata_names(&meta), ["tool_use", "rag"]);

    // no default: llama.cpp uses the tool_use variant
    let g = gguf(&[("tokenizer.chat_template.tool_use", "T")], None);
    assert_eq!(
        ChatTemplate::from_metadata(&g.metadata())
            .unwrap()
            .unwrap()
            .source(),
        "T"
    );
    assert_eq!(ChatTemplate::metadata_names(&g.metadata()), ["tool_use"]);

    // nothing, or empty
    assert!(ChatTemplate::from_metadata(&gguf(&[], None).metadata())
        .unwrap()
        .is_none());
    assert!(ChatTemplate::from_metadata(
        &gguf(&[("tokenizer.chat_template", "")], None).metadata()
    )
    .unwrap()
    .is_none());

    // a broken template is an error, not a panic
    let g = gguf(&[("tokenizer.chat_template", "{% for %}")], None);
    assert!(matches!(
        ChatTemplate::from_metadata(&g.metadata()),
        Err(ChatTemplateError::Syntax { .. })
    ));

    // a value of the wrong type
    let mut w = GgufWriter::new();
    w.set("tokenizer.chat_template", 7u32);
    let g = Gguf::from_bytes(w.to_bytes()).unwrap();
    assert!(matches!(
        ChatTemplate::from_metadata(&g.metadata()),
        Err(ChatTemplateError::Metadata(_))
    ));
}

#[test]
fn extra_context_overrides_and_tools() {
    let t = ChatTemplate::new(
        "{{ tools is none }}|{{ add_generation_prompt }}|{{ bos_token }}|{{ enable_thinking }}",
    )
    .unwrap();
    let mut options = RenderOptions {
        bos_token: "<s>".into(),
        ..Default::default()
    };
    assert_eq!(t.render(&[], &options).unwrap(), "True|False|<s>|");
    options.extra.insert("bos_token".into(), "[B]".into());
    options.extra.insert("enable_thinking".into(), false.into());
    options.tools = Some(serde_json::json!([]));
    assert_eq!(t.render(&[], &options).unwrap(), "False|False|[B]|False");
}

#[test]
fn templates_are_shareable_across_threads() {
    let t = std::sync::Arc::new(ChatTemplate::chatml());
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let t = t.clone();
            std::thread::spawn(move || {
                t.render(
                    &[ChatMessage::new("user", format!("{i}"))],
                    &RenderOptions::default(),
                )
                .unwrap()
            })
        })
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        assert_eq!(
            h.join().unwrap(),
            format!("<|im_start|>user\n{i}<|im_end|>\n")
        );
    }
}

/// A model without a template is chatted with in the format its vocabulary's turn markers
/// call for; ChatML only when none match.
#[test]
fn a_model_without_a_template_gets_its_family_format() {
    let messages = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Count to five."),
        ChatMessage::new("assistant", "1 2 3 4 5"),
        ChatMessage::new("user", "Again."),
    ];
    let options = RenderOptions {
        add_generation_prompt: true,
        bos_token: "<bos>".into(),
        ..RenderOptions::default()
    };
    let with = |tokens: &'static [&'static str]| {
        let (t, name) = ChatTemplate::for_vocabulary(|m| tokens.contains(&m));
        (name, t.render(&messages, &options).unwrap())
    };
    let (name, gemma) = with(&["<bos>", "<start_of_turn>", "<end_of_turn>"]);
    assert_eq!(name, "gemma");
    assert_eq!(
        gemma,
        "<bos><start_of_turn>user\nBe brief.\n\nCount to five.<end_of_turn>\n\
         <start_of_turn>model\n1 2 3 4 5<end_of_turn>\n\
         <start_of_turn>user\nAgain.<end_of_turn>\n<start_of_turn>model\n"
    );
    let (name, llama3) = with(&["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]);
    assert_eq!(name, "llama3");
    assert!(llama3
        .starts_with("<bos><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"));
    assert!(llama3.ends_with("<|start_header_id|>assistant<|end_header_id|>\n\n"));
    let (name, _) = with(&[
        "<|im_start|>",
        "<|im_end|>",
        "<start_of_turn>",
        "<end_of_turn>",
    ]);
    assert_eq!(
        name, "chatml",
        "ChatML's markers are tried first, as llama.cpp does"
    );
    let (name, fallback) = with(&["<s>"]);
    assert_eq!(name, "chatml");
    assert!(fallback.ends_with("<|im_start|>assistant\n"));
}
