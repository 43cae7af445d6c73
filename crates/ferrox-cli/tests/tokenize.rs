mod common;

use std::ffi::OsStr;
use std::path::Path;

use common::{default_model, ferrox};
use ferrox_gguf::{Gguf, GgufWriter};

fn run(args: &[&OsStr]) -> (i32, String, String) {
    let out = ferrox(args);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn tokenize(model: &Path, extra: &[&str]) -> (i32, String, String) {
    let mut args = vec![OsStr::new("tokenize"), OsStr::new("-m"), model.as_os_str()];
    args.extend(extra.iter().map(OsStr::new));
    run(&args)
}

fn detokenize(model: &Path, extra: &[&str]) -> (i32, String, String) {
    let mut args = vec![
        OsStr::new("detokenize"),
        OsStr::new("-m"),
        model.as_os_str(),
    ];
    args.extend(extra.iter().map(OsStr::new));
    run(&args)
}

#[test]
fn ids_print_as_one_json_array_like_llama_tokenize() {
    let model = default_model();
    let (code, stdout, stderr) = tokenize(&model, &["-p", "Hello world", "--ids"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout, "[2, 9259, 1902]\n");

    let (_, stdout, _) = tokenize(&model, &["-p", "Hello world", "--ids", "--no-bos"]);
    assert_eq!(stdout, "[9259, 1902]\n");
}

#[test]
fn special_tokens_are_parsed_unless_turned_off_as_llama_tokenize() {
    let model = default_model();
    let text = "<start_of_turn>user\n";
    let (_, parsed, _) = tokenize(&model, &["-p", text, "--ids", "--no-bos"]);
    assert_eq!(parsed, "[105, 2364, 107]\n");
    let (_, explicit, _) = tokenize(
        &model,
        &["-p", text, "--ids", "--no-bos", "--parse-special"],
    );
    assert_eq!(explicit, parsed);
    let (_, literal, _) = tokenize(
        &model,
        &["-p", text, "--ids", "--no-bos", "--no-parse-special"],
    );
    assert_ne!(literal, parsed);
    assert!(!literal.contains("105,"), "{literal}");
}

#[test]
fn pieces_print_one_escaped_token_per_line() {
    let model = default_model();
    let (code, stdout, stderr) = tokenize(&model, &["-p", "Hi\n🦙"]);
    assert_eq!(code, 0, "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "2\t<bos>");
    assert!(lines.contains(&"107\t\\n"), "{stdout}");
    // The llama emoji is spelled with byte tokens, shown as \xNN.
    assert!(lines.iter().any(|l| l.ends_with("\t\\xf0")), "{stdout}");
    for line in &lines {
        let (id, _) = line.split_once('\t').expect("id<TAB>piece");
        id.parse::<u32>().expect("numeric id");
    }
}

#[test]
fn file_input_is_tokenized_byte_for_byte() {
    let model = default_model();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in.txt");
    std::fs::write(&path, "Hello world\n").unwrap();
    let (code, stdout, stderr) =
        tokenize(&model, &["-f", path.to_str().unwrap(), "--ids", "--no-bos"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout, "[9259, 1902, 107]\n");
}

#[test]
fn invalid_utf8_input_is_an_input_error() {
    let model = default_model();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.txt");
    std::fs::write(&path, b"ab\xffcd").unwrap();
    let (code, stdout, stderr) = tokenize(&model, &["-f", path.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(stdout.is_empty());
    assert!(stderr.contains("not UTF-8"), "{stderr}");
    assert!(stderr.contains("offset 2"), "{stderr}");

    let (code, _, stderr) = tokenize(&model, &["-f", "/nonexistent/ferrox-input.txt"]);
    assert_eq!(code, 2, "{stderr}");
}

#[test]
fn detokenize_prints_the_text() {
    let model = default_model();
    let (code, stdout, stderr) = detokenize(&model, &["2", "9259", "1902"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout, "<bos>Hello world\n");

    // The output of `tokenize --ids` is accepted as is, and specials can be hidden.
    let (_, stdout, _) = detokenize(&model, &["[2, 9259, 1902]", "--no-special"]);
    assert_eq!(stdout, "Hello world\n");

    let (code, _, stderr) = detokenize(&model, &["2", "999999"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("out of range"), "{stderr}");
    let (code, _, _) = detokenize(&model, &["abc"]);
    assert_eq!(code, 2);
}

#[test]
fn a_vocab_only_file_is_enough() {
    let model = default_model();
    let gguf = Gguf::open(&model).unwrap();
    let mut writer = GgufWriter::new();
    for (key, value) in gguf.metadata().iter() {
        writer.set(key, value.to_owned_value());
    }
    let dir = tempfile::tempdir().unwrap();
    let vocab = dir.path().join("vocab.gguf");
    writer.write_file(&vocab).unwrap();
    assert!(Gguf::open(&vocab).unwrap().tensors().is_empty());

    let text = "<start_of_turn>user\nHi 🦙<end_of_turn>";
    let full = tokenize(&model, &["-p", text, "--ids", "--parse-special"]);
    let only = tokenize(&vocab, &["-p", text, "--ids", "--parse-special"]);
    assert_eq!(only.0, 0, "{}", only.2);
    assert_eq!(only.1, full.1);

    let (code, stdout, stderr) = detokenize(&vocab, &[only.1.trim()]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout, format!("<bos>{text}\n"));
}

#[test]
fn a_file_without_a_tokenizer_is_an_input_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.gguf");
    let mut writer = GgufWriter::new();
    writer.set("general.architecture", "llama");
    writer.write_file(&path).unwrap();
    let (code, _, stderr) = tokenize(&path, &["-p", "x"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("tokenizer"), "{stderr}");
}
