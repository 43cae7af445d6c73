//! Writes the synthetic test models of `tests/synthetic/mod.rs` (one tiny GGUF per
//! family) and their reference token sequences, for `scripts/reference/gen-synthetic-logits.sh`.
//!
//! ```sh
//! cargo run --release -p ferrox-models --example write_synthetic -- OUT_DIR
//! ```
//!
//! writes `OUT_DIR/<arch>.gguf` and `OUT_DIR/<arch>.tokens` (the ids, one line, space
//! separated) for every family, and prints one `arch path bytes` line per model (`arch path
//! bytes mla` for the Multi-head Latent Attention models).
//! `--all TYPE` (e.g. `--all F32`) stores every matrix as TYPE instead: not the reference
//! models, a variant for investigating differences.
//! `--kimi` writes the `kimi-linear` model (`synthetic::kimi`) with a
//! `synthetic::SWEEP_TOKENS`-token sequence; `--kimi-k3` the `kimi-k3` models
//! (`synthetic::kimi::K3_MODELS`) likewise; `--kimi-blocks` the Kimi models with whole-block
//! latent rows (`synthetic::kimi::BLOCK_MODELS`) likewise; `--dsa-bench TOP_K` a `deepseek32` file of
//! DeepSeek-V3.2's attention shapes for speed at depth (`synthetic::dsa::bench_gguf`);
//! `--kimi-bench` a `kimi-linear` file of Kimi-Linear-48B-A3B's attention shapes likewise
//! (`synthetic::kimi::bench_gguf`);
//! `--mtp` the `deepseek2-mtp` model (deepseek2-v3 with a multi-token-prediction block);
//! `--dsa` the DeepSeek Sparse Attention models
//! (`synthetic::dsa`) likewise; `--deepseek4` the DeepSeek-V4 model (`synthetic::deepseek4`)
//! likewise.
//! `--encoders` writes the encoder models (`synthetic::bert::ENCODER_MODELS`) with F32
//! matrices (`<name>`) and Q8_0 matrices (`<name>.q8_0`), each with a
//! `synthetic::SWEEP_TOKENS`-token sequence, and `qwen3-reranker`
//! (`synthetic::qwen3_reranker_bytes`); one `name path bytes` line each.
//! `--vision` writes the Gemma 3 image-input files of `synthetic::vision` into OUT_DIR:
//! `gemma3.gguf` (text model), `gemma3.mmproj.gguf` (F32 projector), `gemma3.f16.mmproj.gguf`
//! (F16 projector), the Qwen-VL pairs (`qwen2vl.gguf`, `qwen25vl.mmproj.gguf`,
//! `qwen2vl.mmproj.gguf`; `qwen3vl.gguf`, `qwen3vl.mmproj.gguf`), the Kimi pairs (`kimi.gguf`,
//! `kimivl.mmproj.gguf`, `kimik25.mmproj.gguf`), the GLM-5.2-V text model (`glm5v.gguf`) and
//! the test images `<name>.png`; one `name path bytes` line each (`fixtures/vision/` holds
//! them).
//! `--vision-bench-qwen OUT_DIR [LAYERS [SIZE...]]` writes the Qwen2.5-VL benchmark files:
//! `qwen25vl-bench.gguf` (a 2048-wide `qwen2vl` text model of one layer, for the width),
//! `qwen25vl-bench-l<LAYERS>.mmproj.gguf` (`synthetic::vision::qwen25vl_bench_shape`, default
//! 8 layers), the images `bench<SIZE>.png` and 896-pixel `ttft<I>.png`.
//! `--vision-bench OUT_DIR [LAYERS [SIZE...]]` writes the Gemma 3 benchmark files of
//! `synthetic::vision` for `scripts/bench-vision.sh`: `gemma3-bench.gguf` (text model),
//! `gemma3-bench-<SIZE>-l<LAYERS>.mmproj.gguf` (F16 projectors, LAYERS default 4, SIZE each of
//! `synthetic::vision::BENCH_IMAGE_SIZES` by default) and the images `bench<SIZE>.png`, plus
//! `ttft<N>.png` (896 pixels, N = 0..8, all different); one `name path bytes` line each.
//! `--sweep` writes the context-length sweep models instead: every family with F32 matrices
//! and the all-F32 MLA sweep models (`synthetic::SWEEP_MODELS`), the low-bit models
//! (`synthetic::LOW_BIT_SWEEPS`: MXFP4 experts, TQ2_0 matrices), each with a
//! `synthetic::SWEEP_TOKENS`-token sequence; one `name path bytes` line each.

#[path = "../tests/synthetic/mod.rs"]
mod synthetic;

use std::path::PathBuf;

use ferrox_gguf::GgmlType;

fn usage() -> ! {
    eprintln!("usage: write_synthetic OUT_DIR [--all TYPE | --vision | --vision-bench [LAYERS [SIZE...]] | --vision-bench-qwen [LAYERS [SIZE...]] | ...]");
    std::process::exit(2);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (dir, all) = match args.as_slice() {
        [dir, flag] if flag == "--sweep" => {
            write_sweep(&PathBuf::from(dir));
            return;
        }
        [dir, flag] if flag == "--vision" => {
            write_vision(&PathBuf::from(dir));
            return;
        }
        [dir, flag, rest @ ..] if flag == "--vision-bench" => {
            let number = |s: &String| s.parse::<usize>().unwrap_or_else(|_| usage());
            let layers = rest.first().map_or(4, number);
            let sizes: Vec<usize> = match rest.get(1..) {
                Some(sizes) if !sizes.is_empty() => sizes.iter().map(number).collect(),
                _ => synthetic::vision::BENCH_IMAGE_SIZES.to_vec(),
            };
            write_vision_bench(&PathBuf::from(dir), layers, &sizes);
            return;
        }
        [dir, flag, rest @ ..] if flag == "--vision-bench-qwen" => {
            let number = |s: &String| s.parse::<usize>().unwrap_or_else(|_| usage());
            let layers = rest.first().map_or(8, number);
            let sizes: Vec<usize> = match rest.get(1..) {
                Some(sizes) if !sizes.is_empty() => sizes.iter().map(number).collect(),
                _ => synthetic::vision::BENCH_IMAGE_SIZES.to_vec(),
            };
            write_vision_bench_qwen(&PathBuf::from(dir), layers, &sizes);
            return;
        }
        [dir, flag] if flag == "--encoders" => {
            let dir = PathBuf::from(dir);
            std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
            for &name in synthetic::bert::ENCODER_MODELS {
                let ids = synthetic::bert::token_ids(name, synthetic::SWEEP_TOKENS);
                for (file, ty) in [
                    (name.to_string(), GgmlType::F32),
                    (format!("{name}.q8_0"), GgmlType::Q8_0),
                ] {
                    let bytes = synthetic::bert::gguf_bytes_with(name, ty);
                    let path = write_model(&dir, &file, &bytes, &ids);
                    println!("{file} {} {}", path.display(), bytes.len());
                }
            }
            let bytes = synthetic::qwen3_reranker_bytes();
            let ids = synthetic::token_ids_n("qwen3", synthetic::SWEEP_TOKENS);
            let path = write_model(&dir, "qwen3-reranker", &bytes, &ids);
            println!("qwen3-reranker {} {}", path.display(), bytes.len());
            return;
        }
        [dir, flag] if flag == "--kimi" => {
            let dir = PathBuf::from(dir);
            std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
            let bytes = synthetic::kimi::kimi_linear_gguf_bytes();
            let ids = synthetic::kimi::token_ids(synthetic::SWEEP_TOKENS);
            let path = write_model(&dir, "kimi-linear", &bytes, &ids);
            println!("kimi-linear {} {}", path.display(), bytes.len());
            return;
        }
        [dir, flag] if flag == "--kimi-k3" || flag == "--kimi-blocks" => {
            let dir = PathBuf::from(dir);
            std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
            let names = match flag.as_str() {
                "--kimi-k3" => synthetic::kimi::K3_MODELS,
                _ => synthetic::kimi::BLOCK_MODELS,
            };
            for &name in names {
                let bytes = synthetic::kimi::gguf_bytes(name);
                let ids = synthetic::kimi::token_ids_of(name, synthetic::SWEEP_TOKENS);
                let path = write_model(&dir, name, &bytes, &ids);
                println!("{name} {} {}", path.display(), bytes.len());
            }
            return;
        }
        [dir, flag] if flag == "--dsa" => {
            let dir = PathBuf::from(dir);
            std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
            for &name in synthetic::dsa::DSA_MODELS {
                let bytes = synthetic::dsa::gguf_bytes(name);
                let ids = synthetic::dsa::token_ids(name, synthetic::SWEEP_TOKENS);
                let path = write_model(&dir, name, &bytes, &ids);
                println!("{name} {} {}", path.display(), bytes.len());
            }
            return;
        }
        [dir, flag, top_k] if flag == "--dsa-bench" => {
            let dir = PathBuf::from(dir);
            std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
            let top_k: usize = top_k.parse().unwrap_or_else(|_| usage());
            let bytes = synthetic::dsa::bench_gguf(top_k);
            let path = dir.join(format!("deepseek32-bench-topk{top_k}.gguf"));
            std::fs::write(&path, &bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            println!("deepseek32-bench {} {}", path.display(), bytes.len());
            return;
        }
        [dir, flag] if flag == "--kimi-bench" => {
            let dir = PathBuf::from(dir);
            std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
            let bytes = synthetic::kimi::bench_gguf();
            let path = dir.join("kimi-linear-bench.gguf");
            std::fs::write(&path, &bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            println!("kimi-linear-bench {} {}", path.display(), bytes.len());
            return;
        }
        [dir, flag] if flag == "--deepseek4" => {
            let dir = PathBuf::from(dir);
            std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
            let name = synthetic::deepseek4::NAME;
            let bytes = synthetic::deepseek4::gguf_bytes();
            let ids = synthetic::deepseek4::token_ids(synthetic::SWEEP_TOKENS);
            let path = write_model(&dir, name, &bytes, &ids);
            println!("{name} {} {}", path.display(), bytes.len());
            return;
        }
        [dir, flag] if flag == "--mtp" => {
            let dir = PathBuf::from(dir);
            std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
            let name = "deepseek2-mtp";
            let bytes = synthetic::gguf_bytes(name);
            let path = write_model(&dir, name, &bytes, &synthetic::token_ids(name));
            println!("{name} {} {} mla", path.display(), bytes.len());
            return;
        }
        [dir] => (PathBuf::from(dir), None),
        [dir, flag, ty] if flag == "--all" => match GgmlType::from_name(ty) {
            Some(ty) => (PathBuf::from(dir), Some(ty)),
            None => usage(),
        },
        _ => usage(),
    };
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for &arch in synthetic::FAMILIES {
        let bytes = synthetic::gguf_bytes_with(arch, all);
        let path = write_model(&dir, arch, &bytes, &synthetic::token_ids(arch));
        let kind = if synthetic::MLA_MODELS.contains(&arch) {
            " mla"
        } else {
            ""
        };
        println!("{arch} {} {}{kind}", path.display(), bytes.len());
    }
}

/// Writes `DIR/NAME.gguf` and `DIR/NAME.tokens`; returns the model's path.
fn write_model(dir: &std::path::Path, name: &str, bytes: &[u8], ids: &[u32]) -> PathBuf {
    let path = dir.join(format!("{name}.gguf"));
    std::fs::write(&path, bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
    let tokens = dir.join(format!("{name}.tokens"));
    std::fs::write(&tokens, ids.join(" ") + "\n")
        .unwrap_or_else(|e| panic!("{}: {e}", tokens.display()));
    path
}

fn write_sweep(dir: &std::path::Path) {
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for name in synthetic::sweep_models() {
        let bytes = synthetic::sweep_gguf_bytes(&name);
        let ids = synthetic::token_ids_n(synthetic::sweep_arch(&name), synthetic::SWEEP_TOKENS);
        let path = write_model(dir, &name, &bytes, &ids);
        println!("{name} {} {}", path.display(), bytes.len());
    }
}

fn write_vision(dir: &std::path::Path) {
    use synthetic::vision;
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut files = vec![
        ("gemma3.gguf".to_string(), vision::gemma3_text_bytes()),
        (
            "gemma3.mmproj.gguf".to_string(),
            vision::gemma3_mmproj_bytes(GgmlType::F32),
        ),
        (
            "gemma3.f16.mmproj.gguf".to_string(),
            vision::gemma3_mmproj_bytes(GgmlType::F16),
        ),
    ];
    files.push(("qwen2vl.gguf".to_string(), vision::qwen2vl_text_bytes()));
    files.push((
        "qwen25vl.mmproj.gguf".to_string(),
        vision::qwen_mmproj_bytes(vision::QwenVision::Qwen25Vl),
    ));
    files.push((
        "qwen2vl.mmproj.gguf".to_string(),
        vision::qwen_mmproj_bytes(vision::QwenVision::Qwen2Vl),
    ));
    files.push(("qwen3vl.gguf".to_string(), vision::qwen3vl_text_bytes()));
    files.push((
        "qwen3vl.mmproj.gguf".to_string(),
        vision::qwen3vl_mmproj_bytes(),
    ));
    files.push(("kimi.gguf".to_string(), vision::kimi_text_bytes()));
    files.push(("glm5v.gguf".to_string(), vision::glm5v_text_bytes()));
    for (name, kind) in [
        ("kimivl", vision::KimiVision::KimiVl),
        ("kimik25", vision::KimiVision::KimiK25),
    ] {
        files.push((
            format!("{name}.mmproj.gguf"),
            vision::kimi_mmproj_bytes(kind),
        ));
    }
    for image in vision::test_images()
        .into_iter()
        .chain(vision::qwen_extra_images())
    {
        files.push((format!("{}.png", image.name), image.png));
    }
    write_files(dir, files);
}

/// Number of distinct images `--vision-bench` writes for time-to-first-token requests.
const TTFT_IMAGES: usize = 8;

fn write_vision_bench(dir: &std::path::Path, layers: usize, sizes: &[usize]) {
    use synthetic::vision;
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut files = vec![(
        "gemma3-bench.gguf".to_string(),
        vision::gemma3_bench_text_bytes(),
    )];
    for &size in sizes {
        files.push((format!("bench{size}.png"), vision::bench_image_png(size, 0)));
    }
    for i in 0..TTFT_IMAGES {
        files.push((format!("ttft{i}.png"), vision::bench_image_png(896, i + 1)));
    }
    write_files(dir, files);
    // One projector at a time: the 896-pixel ones of 27 layers are ~0.8 GB each.
    for &size in sizes {
        let name = format!("gemma3-bench-{size}-l{layers}.mmproj.gguf");
        write_files(
            dir,
            vec![(name, vision::gemma3_bench_mmproj_bytes(size, layers))],
        );
    }
}

fn write_vision_bench_qwen(dir: &std::path::Path, layers: usize, sizes: &[usize]) {
    use synthetic::vision;
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let shape = vision::qwen25vl_bench_shape(layers);
    let mut files = vec![
        (
            "qwen25vl-bench.gguf".to_string(),
            vision::qwen2vl_text_bytes_with(vision::QWEN_BENCH_TEXT_N_EMBD, 1),
        ),
        (
            format!("qwen25vl-bench-l{layers}.mmproj.gguf"),
            vision::qwen_mmproj_bytes_with(vision::QwenVision::Qwen25Vl, &shape, GgmlType::F16),
        ),
    ];
    for &size in sizes {
        files.push((format!("bench{size}.png"), vision::bench_image_png(size, 0)));
    }
    for i in 0..TTFT_IMAGES {
        files.push((format!("ttft{i}.png"), vision::bench_image_png(896, i + 1)));
    }
    write_files(dir, files);
}

/// Writes `DIR/NAME` for each file, with one `name path bytes` line.
fn write_files(dir: &std::path::Path, files: Vec<(String, Vec<u8>)>) {
    for (name, bytes) in files {
        let path = dir.join(&name);
        std::fs::write(&path, &bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        println!("{name} {} {}", path.display(), bytes.len());
    }
}
