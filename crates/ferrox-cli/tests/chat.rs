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

/// `ferrox chat --mmproj` on the synthetic Gemma 3 pair of `fixtures/vision` (f32 cache):
/// `/image FILE` attaches an image to the next message, placed where the server places an
/// `image_url` part sent before the text. The first turn renders the prompt of the fixtures'
/// references, and its greedy answer is `ferrox run --image`'s on that prompt (whose tokens
/// are libllama's); the second turn, with a second image, answers as `ferrox run` does on the
/// whole conversation with both images (the first image stays in it, its positions reused
/// from the cache). A missing file and a marker typed in the text are refused, and the
/// conversation goes on; without --mmproj, /image says what it needs.
#[test]
fn chat_takes_images_with_the_image_command() {
    let dir = common::repo_root().join("fixtures/vision");
    let model = dir.join("gemma3.gguf");
    let mmproj = dir.join("gemma3.mmproj.gguf");
    let common_args = [
        "-n", "16", "--temp", "0", "--kv-f32", "-t", "2", "-c", "512",
    ];
    let chat = |mmproj: Option<&std::path::Path>, input: String| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_ferrox"));
        command.arg("chat").args(common_args).arg("-m").arg(&model);
        if let Some(path) = mmproj {
            command.arg("--mmproj").arg(path);
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start ferrox chat");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        (String::from_utf8(out.stdout).unwrap(), stderr)
    };
    let run = |prompt: &str, images: &[&str]| -> serde_json::Value {
        let prompt_file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(prompt_file.path(), prompt).unwrap();
        let mut args: Vec<std::ffi::OsString> =
            vec!["run".into(), "-m".into(), model.clone().into()];
        args.extend(common_args.map(Into::into));
        args.extend(["--json".into(), "--mmproj".into(), mmproj.clone().into()]);
        args.extend(["-f".into(), prompt_file.path().into()]);
        for image in images {
            args.extend(["--image".into(), dir.join(format!("{image}.png")).into()]);
        }
        let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
        let out = common::ferrox(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };

    let reference: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("ref/rgb64.greedy.json")).unwrap()).unwrap();
    let first_prompt = reference["prompt"].as_str().unwrap();
    assert_eq!(
        first_prompt,
        "<start_of_turn>user\n<__media__>Describe this image.<end_of_turn>\n<start_of_turn>model\n"
    );
    let first = run(first_prompt, &["rgb64"]);
    assert_eq!(first["tokens"], reference["generated"]);
    let first_text = first["text"].as_str().unwrap();
    // The conversation as the chat template renders it for the second turn (the reply is
    // kept trimmed).
    let second_prompt = format!(
        "{first_prompt}{}<end_of_turn>\n<start_of_turn>user\n<__media__>And this one?<end_of_turn>\n<start_of_turn>model\n",
        first_text.trim()
    );
    let second = run(&second_prompt, &["rgb64", "gray48"]);
    let second_text = second["text"].as_str().unwrap();

    let input = format!(
        "/image {missing}\n/image {rgb64}\nDescribe this image.\n\
         /image {gray48}\nno <__media__> here\nAnd this one?\n",
        missing = dir.join("missing.png").display(),
        rgb64 = dir.join("rgb64.png").display(),
        gray48 = dir.join("gray48.png").display(),
    );
    let (stdout, stderr) = chat(Some(&mmproj), input);
    assert_eq!(stdout, format!("{first_text}\n{second_text}\n"), "{stderr}");
    assert!(stderr.contains("missing.png"), "{stderr}");
    assert!(
        stderr.contains("attached") && stderr.contains("rgb64.png"),
        "{stderr}"
    );
    assert!(stderr.contains("marks an image"), "{stderr}");

    let (stdout, stderr) = chat(
        None,
        format!("/image {}\nHello\n", dir.join("rgb64.png").display()),
    );
    assert!(stderr.contains("/image needs --mmproj"), "{stderr}");
    assert!(!stdout.trim().is_empty(), "the model answered: {stdout:?}");
}
