//! Grammars compiled against Qwen2.5's real vocabulary: a text the grammar accepts goes
//! through token by token with every token allowed by the mask before it, and one it does
//! not is stopped; llama.cpp's published GBNF grammars compile; bad grammars are errors
//! that name the problem.

mod common;

use common::{compiler, fixtures, qwen_tokenizer, QWEN_N_VOCAB};
use ferrox_agent::tools::{Tool, ToolFormat};
use ferrox_agent::GrammarSpec;
use serde_json::json;

/// Feeds `text`'s tokens through a fresh matcher: how many were allowed before one was
/// not, and whether the constraint was finished (or allowed an end) afterwards.
fn walk(spec: &GrammarSpec, text: &str) -> (usize, usize, bool) {
    let tokenizer = qwen_tokenizer();
    let tokens = tokenizer.encode(text, false, false);
    let constraint = compiler().compile(spec).unwrap_or_else(|e| panic!("{e}"));
    let mut c = constraint.0.start();
    let eos = tokenizer.vocab().eos().unwrap() as usize;
    let im_end = tokenizer.vocab().id("<|im_end|>").unwrap() as usize;
    let mut logits = vec![0.0f32; QWEN_N_VOCAB];
    for (i, &t) in tokens.iter().enumerate() {
        logits.fill(0.0);
        c.apply(&mut logits);
        if logits[t as usize] == f32::NEG_INFINITY {
            return (i, tokens.len(), false);
        }
        c.accept(t);
    }
    logits.fill(0.0);
    let end = c.finished() || {
        c.apply(&mut logits);
        logits[eos] == 0.0 || logits[im_end] == 0.0
    };
    (tokens.len(), tokens.len(), end)
}

fn accepts(spec: &GrammarSpec, text: &str) -> bool {
    let (ok, n, end) = walk(spec, text);
    ok == n && end
}

#[test]
fn json_schemas_accept_valid_documents_and_refuse_others() {
    let schema = GrammarSpec::JsonSchema(json!({
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer", "minimum": 0},
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}}
        },
        "required": ["name", "age"],
        "additionalProperties": false
    }));
    assert!(accepts(
        &schema,
        r#"{"name": "Ann", "age": 31, "tags": ["a", "b"]}"#
    ));
    assert!(accepts(&schema, r#"{"name": "Ann", "age": 31}"#));
    assert!(!accepts(&schema, r#"{"name": "Ann"}"#));
    assert!(!accepts(&schema, r#"{"name": "Ann", "age": -1}"#));
    assert!(!accepts(
        &schema,
        r#"{"name": "Ann", "age": 3, "tags": ["c"]}"#
    ));
    assert!(!accepts(&schema, r#"{"name": "Ann", "age": 3, "x": 1}"#));
    assert!(accepts(
        &GrammarSpec::JsonObject,
        r#"{"anything": [1, 2, {"b": null}]}"#
    ));
    assert!(!accepts(&GrammarSpec::JsonObject, "[1]"));
    let with_ref = GrammarSpec::JsonSchema(json!({
        "$defs": {"point": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}},
        "type": "object",
        "properties": {"p": {"$ref": "#/$defs/point"}, "code": {"type": "string", "pattern": "^[A-Z]{3}$"}},
        "required": ["p", "code"]
    }));
    assert!(accepts(&with_ref, r#"{"p": {"x": 1.5}, "code": "ABC"}"#));
    assert!(!accepts(&with_ref, r#"{"p": {"x": 1.5}, "code": "ABCD"}"#));
}

#[test]
fn llama_cpp_grammars_compile_and_constrain() {
    let dir = fixtures().join("grammars");
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "gbnf"))
        .collect();
    names.sort();
    assert!(names.len() >= 8, "{names:?}");
    for path in &names {
        let source = std::fs::read_to_string(path).unwrap();
        let spec = GrammarSpec::Gbnf(source);
        compiler()
            .compile(&spec)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
    let read = |name: &str| GrammarSpec::Gbnf(std::fs::read_to_string(dir.join(name)).unwrap());
    assert!(accepts(&read("json.gbnf"), r#"{"a": [1, true, "x\n"]}"#));
    assert!(!accepts(&read("json.gbnf"), r#"{"a": tru}"#));
    assert!(accepts(&read("arithmetic.gbnf"), "x = (1+y*3)\n"));
    assert!(!accepts(&read("arithmetic.gbnf"), "x = = 1\n"));
    assert!(accepts(&read("list.gbnf"), "- milk\n- eggs\n"));
    assert!(!accepts(&read("list.gbnf"), "* milk\n"));
    assert!(accepts(&read("chess.gbnf"), "1. e4 e5\n2. Nf3 Nc6\n"));
}

#[test]
fn bad_grammars_are_errors_naming_the_problem() {
    let e = compiler()
        .compile(&GrammarSpec::Gbnf("root ::= item\n".into()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("undefined rule `item`"), "{e}");
    let e = compiler()
        .compile(&GrammarSpec::JsonSchema(json!({"type": "nonsense"})))
        .unwrap_err()
        .to_string();
    assert!(e.contains("JSON schema") && e.contains("nonsense"), "{e}");
    let e = compiler()
        .compile(&GrammarSpec::JsonSchema(json!([1, 2])))
        .unwrap_err()
        .to_string();
    assert!(e.contains("must be an object"), "{e}");
    let e = compiler()
        .compile(&GrammarSpec::Lark("start: missing_rule".into()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("Lark grammar"), "{e}");
    let huge = format!("root ::= \"{}\"\n", "a".repeat(2 << 20));
    let e = compiler()
        .compile(&GrammarSpec::Gbnf(huge))
        .unwrap_err()
        .to_string();
    assert!(e.contains("limit"), "{e}");
    // A grammar whose lexer explodes is refused (by llguidance's limits or the timeout),
    // never a hang.
    let deep = format!(
        "root ::= {}\n",
        (0..40)
            .map(|i| format!("[a-z]{{0,{}}}", 50 + i))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let started = std::time::Instant::now();
    let _ = compiler().compile(&GrammarSpec::Gbnf(deep));
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
}

/// The cost of computing one mask, in microseconds (printed, not asserted).
#[test]
fn mask_cost() {
    let spec = GrammarSpec::JsonSchema(json!({
        "type": "object",
        "properties": {"name": {"type": "string"}, "items": {"type": "array", "items": {"type": "integer"}}},
        "required": ["name", "items"]
    }));
    let tokenizer = qwen_tokenizer();
    let tokens = tokenizer.encode(
        r#"{"name": "a longer name here", "items": [1, 2, 3, 4, 5, 6]}"#,
        false,
        false,
    );
    let constraint = compiler().compile(&spec).unwrap();
    let mut c = constraint.0.start();
    let mut logits = vec![0.0f32; QWEN_N_VOCAB];
    let started = std::time::Instant::now();
    for &t in &tokens {
        c.apply(&mut logits);
        c.accept(t);
    }
    let per = started.elapsed() / tokens.len() as u32;
    eprintln!(
        "mask + apply: {:.0} us per token over {} tokens",
        per.as_secs_f64() * 1e6,
        tokens.len()
    );
}

/// A forced call's grammar, for every format: it compiles, and for Hermes it accepts the
/// text Qwen2.5's template writes for the call (and refuses an unknown function).
#[test]
fn tool_call_grammars_compile_and_accept_template_text() {
    let tools = [
        Tool {
            name: "get_weather".into(),
            description: None,
            parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
        },
        Tool {
            name: "search".into(),
            description: None,
            parameters: json!({"type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "integer"}}, "required": ["q"]}),
        },
    ];
    let refs: Vec<&Tool> = tools.iter().collect();
    for format in [
        ToolFormat::Hermes,
        ToolFormat::Qwen3Coder,
        ToolFormat::Llama3,
        ToolFormat::Mistral,
        ToolFormat::DeepSeek { fenced: true },
        ToolFormat::DeepSeek { fenced: false },
        ToolFormat::Kimi,
        ToolFormat::Glm,
    ] {
        for parallel in [false, true] {
            let spec = format.call_grammar(&refs, parallel, &|_| false);
            compiler()
                .compile(&spec)
                .unwrap_or_else(|e| panic!("{format:?}: {e}\n{spec:?}"));
        }
    }
    let one = ToolFormat::Hermes.call_grammar(&refs, false, &|_| false);
    let many = ToolFormat::Hermes.call_grammar(&refs, true, &|_| false);
    let call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    assert!(accepts(&one, call));
    assert!(accepts(&many, &format!("{call}\n{call}")));
    assert!(!accepts(&one, &format!("{call}\n{call}")));
    assert!(!accepts(&one, &call.replace("get_weather", "launch")));
    assert!(!accepts(&one, &call.replace("city", "town")));
    let xml = ToolFormat::Qwen3Coder.call_grammar(&refs, false, &|_| false);
    assert!(accepts(&xml, "<tool_call>\n<function=search>\n<parameter=q>\nrust\n</parameter>\n</function>\n</tool_call>"));
    let kimi = ToolFormat::Kimi.call_grammar(&refs, false, &|_| false);
    assert!(accepts(&kimi, "<|tool_calls_section_begin|><|tool_call_begin|>functions.search:0<|tool_call_argument_begin|>{\"q\": \"rust\"}<|tool_call_end|><|tool_calls_section_end|>"));
}

/// Grammars built to exhaust the compiler: each is answered, quickly, with an error that
/// names the problem; none overflows a stack (which would abort the whole process).
#[test]
fn hostile_grammars_are_refused_quickly() {
    // The bound the design gives (a slot within the timeout, then the compile within it),
    // with slack for a loaded machine: a guard against hangs and stack walks, not a speed
    // target (every request here fails in milliseconds on an idle machine).
    let bound = compiler().timeout * 2 + std::time::Duration::from_secs(3);
    let time = |spec: &GrammarSpec| {
        let started = std::time::Instant::now();
        let result = compiler()
            .compile(spec)
            .map(|_| ())
            .map_err(|e| e.to_string());
        (result, started.elapsed())
    };
    let nested = format!(
        "root ::= {}\"a\"{}",
        "(".repeat(200_000),
        ")".repeat(200_000)
    );
    let (result, took) = time(&GrammarSpec::Gbnf(nested));
    let e = result.unwrap_err();
    assert!(e.contains("nested more than"), "{e}");
    assert!(took < bound, "{took:?}");

    let stacked = format!("root ::= \"a\"{}", "*".repeat(200_000));
    let e = time(&GrammarSpec::Gbnf(stacked)).0.unwrap_err();
    assert!(e.contains("nested more than"), "{e}");

    // A `$ref` chain: 250 long compiles (within the depth limit, on the compiling thread's
    // stack), 20,000 long is refused.
    let ref_chain = |n: usize| {
        let mut defs = serde_json::Map::new();
        for i in 0..n {
            let next = json!({"$ref": format!("#/$defs/d{}", i + 1)});
            let def = if n < 1000 {
                json!({"type": "object", "properties": {"x": next}})
            } else {
                next
            };
            defs.insert(format!("d{i}"), def);
        }
        defs.insert(format!("d{n}"), json!({"type": "string"}));
        GrammarSpec::JsonSchema(json!({"$defs": defs, "$ref": "#/$defs/d0"}))
    };
    let (result, _) = time(&ref_chain(120));
    result.unwrap();
    let (result, took) = time(&ref_chain(20_000));
    let e = result.unwrap_err();
    assert!(e.contains("levels deep"), "{e}");
    assert!(took < bound, "{took:?}");

    // 65,000 rules: a chain, and names that all share one Lark base name.
    let chain: String = (0..65_000)
        .map(|i| format!("r{i} ::= \"x\" r{}\n", i + 1))
        .collect::<String>()
        + "r65000 ::= \"y\"\nroot ::= r0\n";
    let (_, took) = time(&GrammarSpec::Gbnf(chain));
    assert!(took < bound, "{took:?}");
    let variants: String = (0u32..65_000)
        .map(|i| {
            let name: String = (0..17)
                .map(|b| if i >> b & 1 == 1 { 'A' } else { 'a' })
                .collect();
            format!("{name} ::= \"x\"\n")
        })
        .collect::<String>()
        + "root ::= aaaaaaaaaaaaaaaaa\n";
    let (_, took) = time(&GrammarSpec::Gbnf(variants));
    assert!(took < bound, "{took:?}");
}
