//! Writes a `qwen3moe` file of real widths (4096 wide, 128 experts of 1536, Q4_0) with
//! `LAYERS` layers, tensor by tensor, for the memory planner's runs on files larger than
//! memory (`scripts/bench-large.sh`); see `synthetic::large`. 22 layers make about 30 GB.
//!
//! ```sh
//! cargo run --release -p ferrox-models --example write_large_moe -- OUT.gguf LAYERS
//! ```

#[path = "../tests/synthetic/mod.rs"]
mod synthetic;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [out, layers] = args.as_slice() else {
        eprintln!("usage: write_large_moe OUT.gguf LAYERS");
        std::process::exit(2);
    };
    let Ok(layers) = layers.parse::<usize>() else {
        eprintln!("LAYERS must be a number, not `{layers}`");
        std::process::exit(2);
    };
    let shape = synthetic::large::LargeMoe::qwen3moe(layers);
    if let Err(e) = synthetic::large::write(std::path::Path::new(out), shape) {
        eprintln!("{out}: {e}");
        std::process::exit(1);
    }
    let bytes = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0);
    println!("{out} {bytes}");
}
