//! Writes a DeepSeek-V2-Lite-shaped MoE model with random weights for speed measurements
//! (`scripts/bench-moe.sh`); see `moe_bench_gguf` in `tests/synthetic/mod.rs`.
//!
//! ```sh
//! cargo run --release -p ferrox-models --example write_moe_bench -- OUT.gguf LAYERS EXPERTS USED TYPE
//! ```

#[path = "../tests/synthetic/mod.rs"]
mod synthetic;

use ferrox_gguf::GgmlType;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [out, layers, experts, used, ty] = args.as_slice() else {
        eprintln!("usage: write_moe_bench OUT.gguf LAYERS EXPERTS USED TYPE");
        std::process::exit(2);
    };
    let number = |s: &str| -> usize {
        s.parse().unwrap_or_else(|_| {
            eprintln!("not a number: {s}");
            std::process::exit(2)
        })
    };
    let Some(ty) = GgmlType::from_name(ty) else {
        eprintln!("unknown type {ty}");
        std::process::exit(2);
    };
    let bytes = synthetic::moe_bench_gguf(number(layers), number(experts), number(used), ty);
    std::fs::write(out, &bytes).unwrap_or_else(|e| panic!("{out}: {e}"));
    println!("{out} {}", bytes.len());
}
