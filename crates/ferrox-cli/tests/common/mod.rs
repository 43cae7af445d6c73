#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

/// The default model, fetched by `scripts/fetch-model.sh` (which `scripts/test.sh` runs).
pub fn default_model() -> PathBuf {
    let path = ferrox_models::default_model_path();
    assert!(
        path.is_file(),
        "the default model is not at {}: run scripts/fetch-model.sh",
        path.display()
    );
    path
}

pub fn ferrox(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferrox"))
        .args(args)
        .output()
        .expect("run ferrox")
}

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}
