//! Writes a `qwen3moe` file of real widths with `LAYERS` layers, tensor by tensor (see
//! `synthetic::large`): by default 4096 wide with 128 experts of 1536 in Q4_0, for the
//! memory planner's runs on files larger than memory (`scripts/bench-large.py`; 22 layers
//! make about 30 GB); `dsv3` and `kimi` give DeepSeek-V3's and Kimi-K2's routed experts
//! (7168 wide, 256 or 384 experts of 2048, 8 used) in TYPE (`q4_0`, `q4_k`, `iq2_xxs`), for
//! MoE speed at frontier shapes (`scripts/bench-moe-frontier.sh`).
//!
//! ```sh
//! cargo run --release -p ferrox-models --example write_large_moe -- OUT.gguf LAYERS [SHAPE TYPE]
//! ```

#[path = "../tests/synthetic/mod.rs"]
mod synthetic;

use ferrox_gguf::GgmlType;
use synthetic::large::LargeMoe;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = || -> ! {
        eprintln!("usage: write_large_moe OUT.gguf LAYERS [qwen3moe|dsv3|kimi q4_0|q4_k|iq2_xxs]");
        std::process::exit(2);
    };
    let (out, layers, shape, ty) = match args.as_slice() {
        [out, layers] => (out, layers, "qwen3moe", "q4_0"),
        [out, layers, shape, ty] => (out, layers, shape.as_str(), ty.as_str()),
        _ => usage(),
    };
    let Ok(layers) = layers.parse::<usize>() else {
        eprintln!("LAYERS must be a number, not `{layers}`");
        std::process::exit(2);
    };
    let ty = match ty {
        "q4_0" => GgmlType::Q4_0,
        "q4_k" => GgmlType::Q4K,
        "iq2_xxs" => GgmlType::Iq2Xxs,
        other => {
            eprintln!("unknown expert type `{other}`");
            usage()
        }
    };
    let shape = match shape {
        "qwen3moe" => LargeMoe {
            expert_type: ty,
            ..LargeMoe::qwen3moe(layers)
        },
        "dsv3" => LargeMoe::deepseek_v3_experts(layers, ty),
        "kimi" => LargeMoe::kimi_k2_experts(layers, ty),
        other => {
            eprintln!("unknown shape `{other}`");
            usage()
        }
    };
    if let Err(e) = synthetic::large::write(std::path::Path::new(out), shape) {
        eprintln!("{out}: {e}");
        std::process::exit(1);
    }
    let bytes = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0);
    println!("{out} {bytes}");
}
