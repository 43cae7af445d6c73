//! `ferrox chat` driven through stdin: two turns, then end of input.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

#[test]
fn chat_answers_each_turn_and_leaves_on_end_of_input() {
    let model = common::default_model();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ferrox"))
        .args(["chat", "-n", "8", "--temp", "0", "-c", "512", "-m"])
        .arg(&model)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ferrox chat");
    {
        let stdin = child.stdin.as_mut().unwrap();
        stdin
            .write_all(b"Hello, who are you?\nWhat is two plus two?\n")
            .unwrap();
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // The base model has no chat template: the format its vocabulary's turn markers call
    // for (Gemma's) is announced.
    assert!(stderr.contains("using the gemma format"), "{stderr}");
    // A prompt for each turn and one more before the end of input.
    assert_eq!(stderr.matches("\n> ").count(), 3, "{stderr}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(!stdout.trim().is_empty(), "the model answered: {stdout:?}");
}
