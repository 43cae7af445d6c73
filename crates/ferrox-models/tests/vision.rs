//! Image input against llama.cpp on the synthetic Gemma 3 pair of `fixtures/vision/`: the
//! F32 projector's embeddings for each test image within 1e-4 of `mtmd`'s (flash attention
//! off: summation order, plus the rare flip of an f16 rounding: ggml's GELU table and its
//! f16 convolution columns round intermediate values to f16), the F16 projector's within
//! 2e-3 (every product rounds its activations to f16, so upstream summation-order
//! differences flip roundings throughout), and the greedy continuation of a prompt holding
//! the image (f32 cache) equal to libllama's, its top-5 log-probabilities within 5e-4 at
//! every step; with the defaults (f16 attention), the embeddings inside llama.cpp's own
//! flash-attention on/off band. References: `scripts/reference/gen-vision-refs.sh`.

mod vision_common;

use std::sync::Arc;

use ferrox_core::KvStorage;
use ferrox_generate::media::{EncodedImage, MediaPrompt};
use ferrox_gguf::Gguf;
use ferrox_models::engine::ImageGrid;
use ferrox_models::vision::{VisionEncoder, VisionOptions};
use ferrox_models::{AnyEngine, Engine, EngineExt, EngineOptions, LogitsFor};
use ferrox_tokenizer::tokenizer::Tokenizer;
use vision_common::{dir, encoder, image, max_diff, reference_embd};

const IMAGES: &[&str] = &["rgb64", "rgb100x60", "rgb37x51", "rgba80", "gray48"];
const PROMPT: &str =
    "<start_of_turn>user\n<__media__>Describe this image.<end_of_turn>\n<start_of_turn>model\n";

#[test]
fn projector_embeddings_match_llama_cpp() {
    for (mmproj, kind, bar) in [
        ("gemma3.mmproj.gguf", "f32", 1e-4),
        ("gemma3.f16.mmproj.gguf", "f16", 2e-3),
    ] {
        let enc = encoder(mmproj, true);
        assert_eq!(enc.tokens_per_image(), 16);
        for name in IMAGES {
            let ours = enc.encode(&image(name)).unwrap();
            assert_eq!((ours.n_tokens, ours.n_embd), (16, 128));
            let theirs = reference_embd(&format!("{name}.{kind}.embd"));
            let d = max_diff(&ours.data, &theirs);
            assert!(d <= bar, "{name} ({kind} projector): max difference {d}");
        }
    }
}

#[test]
fn f16_attention_stays_close_and_differs() {
    // llama.cpp's default (flash attention, f16 keys and values) is not the f32 result.
    let (exact, rounded) = (
        encoder("gemma3.mmproj.gguf", true),
        encoder("gemma3.mmproj.gguf", false),
    );
    let img = image("rgb100x60");
    let (a, b) = (exact.encode(&img).unwrap(), rounded.encode(&img).unwrap());
    let d = max_diff(&a.data, &b.data);
    assert!(
        d > 0.0 && d < 1e-2,
        "f16 attention moved the embeddings by {d}"
    );
}

fn text_model() -> (AnyEngine, Tokenizer) {
    text_model_of("gemma3.gguf")
}

fn text_model_of(file: &str) -> (AnyEngine, Tokenizer) {
    let gguf = Gguf::open(dir().join(file)).unwrap();
    let tokenizer = Tokenizer::from_gguf(&gguf).unwrap();
    let options = EngineOptions {
        n_ctx: 512,
        threads: 2,
        kv_storage: KvStorage::F32,
        ..EngineOptions::default()
    };
    (
        AnyEngine::from_gguf(Arc::new(gguf), &options).unwrap(),
        tokenizer,
    )
}

fn encoded(enc: &VisionEncoder, name: &str, bidirectional: bool) -> Arc<EncodedImage> {
    let emb = enc.encode(&image(name)).unwrap();
    Arc::new(EncodedImage::new(
        emb.data,
        emb.n_tokens,
        bidirectional,
        enc.markers(),
    ))
}

fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
    row.iter().map(|&v| v as f64 - max - sum.ln()).collect()
}

/// A greedy continuation: the ids, each step's log-probabilities, the prompt's ids and the
/// rotary positions the prompt took (its length, unless M-RoPE images shifted them).
struct Greedy {
    ids: Vec<u32>,
    lps: Vec<Vec<f64>>,
    prompt_ids: Vec<u32>,
    n_pos: usize,
}

/// Greedy ids and each step's log-probabilities after the prompt with the image.
fn greedy(engine: &AnyEngine, tok: &Tokenizer, img: Arc<EncodedImage>, n: usize) -> Greedy {
    greedy_with(engine, tok, PROMPT, vec![img], n)
}

/// `n` greedy tokens after `text` with `images` at its media markers: the ids, each step's
/// log-probabilities and the prompt's ids.
fn greedy_with(
    engine: &AnyEngine,
    tok: &Tokenizer,
    text: &str,
    images: Vec<Arc<EncodedImage>>,
    n: usize,
) -> Greedy {
    let prompt = MediaPrompt::build(tok, text, images, true).unwrap();
    let mut state = engine.new_state().unwrap();
    let rest = prompt.feed_prefix(engine, &mut state).unwrap();
    let pos = state.len();
    let mut logits = engine
        .forward_batch(&rest, pos, &mut state, LogitsFor::Last)
        .unwrap()
        .to_vec();
    let (mut ids, mut lps) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let lp = log_softmax(&logits);
        let next = (0..lp.len()).fold(0, |b, i| if lp[i] > lp[b] { i } else { b }) as u32;
        ids.push(next);
        lps.push(lp);
        let pos = state.len();
        logits = engine
            .forward_token(next, pos, &mut state)
            .unwrap()
            .to_vec();
    }
    let n_pos = prompt
        .len()
        .checked_add_signed(prompt.position_shift_at(prompt.len()))
        .unwrap();
    Greedy {
        ids,
        lps,
        prompt_ids: prompt.ids(),
        n_pos,
    }
}

/// Checks the greedy continuation after each image against libllama's: ids equal, top-5
/// log-probabilities within `bar`. `embeddings` gives each image's rows.
fn check_greedy(embeddings: impl Fn(&str) -> Arc<EncodedImage>, bar: f64) {
    let (engine, tok) = text_model();
    assert!(engine.accepts_embeddings());
    for name in IMAGES {
        let path = dir().join("ref").join(format!("{name}.greedy.json"));
        let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let want: Vec<u32> = serde_json::from_value(r["generated"].clone()).unwrap();
        let g = greedy(&engine, &tok, embeddings(name), want.len());
        check_against(name, &r, &g, bar);
    }
}

/// A greedy continuation against an `mtmd-ref greedy` reference `r`.
fn check_against(name: &str, r: &serde_json::Value, g: &Greedy, bar: f64) {
    let Greedy {
        ids,
        lps,
        prompt_ids,
        n_pos,
    } = g;
    let want: Vec<u32> = serde_json::from_value(r["generated"].clone()).unwrap();
    {
        // The text chunks tokenize as mtmd's do.
        let chunks = r["chunks"].as_array().unwrap();
        let text: Vec<u32> = chunks
            .iter()
            .filter(|c| c["type"] == "text")
            .flat_map(|c| serde_json::from_value::<Vec<u32>>(c["ids"].clone()).unwrap())
            .collect();
        let ours_text: Vec<u32> = prompt_ids
            .iter()
            .copied()
            .filter(|&t| t < 0x8000_0000)
            .collect();
        assert_eq!(ours_text, text, "{name}: prompt text ids");
        assert_eq!(*n_pos, r["n_past"].as_u64().unwrap() as usize);
        assert_eq!(*ids, want, "{name}: greedy ids");
        let top5 = r["top5"].as_array().unwrap();
        for (step, (lp, refs)) in lps.iter().zip(top5).enumerate() {
            for pair in refs.as_array().unwrap() {
                let (id, want) = (
                    pair[0].as_u64().unwrap() as usize,
                    pair[1].as_f64().unwrap(),
                );
                let d = (lp[id] - want).abs();
                assert!(
                    d <= bar,
                    "{name} step {step} id {id}: log-probability off by {d}"
                );
            }
        }
    }
}

#[test]
fn image_prompts_of_every_shape_match_llama_cpp() {
    // Images at the very start, after a long prefix, before a long suffix, two and three in
    // a prompt, two back to back: positions far past the sliding window (8) on both sides
    // of each image's bidirectional span (ref/sweep-*.greedy.json, gen-vision-refs.sh).
    let (engine, tok) = text_model();
    let enc = encoder("gemma3.mmproj.gguf", true);
    let mut checked = 0;
    for entry in std::fs::read_dir(dir().join("ref")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.starts_with("sweep-") {
            continue;
        }
        let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let images: Vec<Arc<EncodedImage>> = r["settings"]["image"]
            .as_str()
            .unwrap()
            .split(',')
            .map(|p| {
                let stem = std::path::Path::new(p)
                    .file_stem()
                    .unwrap()
                    .to_str()
                    .unwrap();
                encoded(&enc, stem, true)
            })
            .collect();
        let want = r["generated"].as_array().unwrap().len();
        let prompt = r["prompt"].as_str().unwrap();
        let g = greedy_with(&engine, &tok, prompt, images, want);
        check_against(&name, &r, &g, 5e-4);
        checked += 1;
    }
    assert_eq!(checked, 6, "sweep references");
}

#[test]
fn the_text_model_takes_llama_cpps_image_embeddings_as_libllama_does() {
    // llama.cpp's own embeddings in: the language model's side alone. ggml's GELU looks its
    // input up at f16 precision, so a summation-order difference that moves a gate value
    // across an f16 rounding boundary changes that activation by an f16 step; on this file
    // a text-only prompt already differs from libllama (f32 cache, flash attention off) by
    // 2e-6 to 2.3e-4 in the gaps between log-probabilities, growing with the steps, with an
    // image up to 4.2e-4.
    check_greedy(
        |name| {
            let rows = reference_embd(&format!("{name}.f32.embd"));
            let markers = ("<start_of_image>", "<end_of_image>");
            Arc::new(EncodedImage::new(rows, 16, true, markers))
        },
        5e-4,
    );
}

#[test]
fn greedy_continuations_after_an_image_match_llama_cpp() {
    // Our embeddings in: the same tokens, and log-probabilities as close as with llama.cpp's
    // own embeddings.
    let enc = encoder("gemma3.mmproj.gguf", true);
    check_greedy(|name| encoded(&enc, name, true), 5e-4);
}

#[test]
fn image_tokens_attend_both_ways_as_gemma3_does() {
    // The same image fed causally changes the continuation's distribution: the
    // bidirectional span is what makes the match above.
    let (engine, tok) = text_model();
    let enc = encoder("gemma3.mmproj.gguf", true);
    let both = greedy(&engine, &tok, encoded(&enc, "rgb64", true), 1).lps;
    let causal = greedy(&engine, &tok, encoded(&enc, "rgb64", false), 1).lps;
    let d = both[0]
        .iter()
        .zip(&causal[0])
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    assert!(
        d > 1e-3,
        "causal and bidirectional image tokens gave the same logits ({d})"
    );
}

#[test]
fn an_image_step_equals_itself_batched_with_other_work() {
    // A second image's prompt fed in one step with the first's prefix in the same state is
    // not possible, but the same image fed twice in two states gives the same bits.
    let (engine, tok) = text_model();
    let enc = encoder("gemma3.mmproj.gguf", true);
    let a = greedy(&engine, &tok, encoded(&enc, "gray48", true), 4);
    let b = greedy(&engine, &tok, encoded(&enc, "gray48", true), 4);
    assert_eq!(a.ids, b.ids);
    assert_eq!(a.lps, b.lps);
}

#[test]
fn bad_image_inputs_are_refused_clearly() {
    let (engine, _) = text_model();
    // Rows of the wrong width.
    let err = refused_rows(&engine, (3, 100), true, None);
    assert!(err.contains("embedding values"), "{err}");
    // More images than markers.
    let tok = Tokenizer::from_gguf(&Gguf::open(dir().join("gemma3.gguf")).unwrap()).unwrap();
    let enc = encoder("gemma3.mmproj.gguf", true);
    let img = encoded(&enc, "rgb64", true);
    let err =
        MediaPrompt::build(&tok, "<__media__> only one", vec![img.clone(), img], true).unwrap_err();
    assert!(err.to_string().contains("1 image markers"), "{err}");
    // A text file as the projector.
    let err = VisionEncoder::open(dir().join("gemma3.gguf"), &VisionOptions::default())
        .err()
        .unwrap();
    assert!(err.to_string().contains("clip"), "{err}");
}

const QWEN_PROMPT: &str =
    "<|im_start|>user\n<__media__>Describe this image.<|im_end|>\n<|im_start|>assistant\n";
const QWEN_IMAGES: &[&str] = &[
    "rgb64",
    "rgb100x60",
    "rgb37x51",
    "rgba80",
    "gray48",
    "rgb200x150",
    "rgb160x130",
    "rgb90x240",
];

/// An image through the Qwen2.5-VL projector, as the Qwen-VL text model takes it: causal
/// rows, placed as a grid by M-RoPE (or, `grid` false, one position per row).
fn qwen_encoded(enc: &VisionEncoder, name: &str, grid: bool) -> Arc<EncodedImage> {
    let emb = enc.encode(&image(name)).unwrap();
    let placed = enc.image_grid(&emb).filter(|_| grid);
    Arc::new(EncodedImage::new(emb.data, emb.n_tokens, false, enc.markers()).with_grid(placed))
}

/// The Qwen-VL pairs: text model, projector, and the bar on the top-5 log-probabilities
/// with our embeddings (Qwen3-VL's differ from llama.cpp's by up to 5e-4, its GELU table's
/// flips, and the text model carries that along).
const QWEN_PAIRS: [(&str, &str, f64); 2] = [
    ("qwen2vl.gguf", "qwen25vl", 5e-4),
    ("qwen3vl.gguf", "qwen3vl", 2e-3),
];

/// Each image's greedy continuation against libllama's; `rows` gives an image's
/// embeddings and grid from the projector (ours, or llama.cpp's own).
fn check_qwen_greedy(
    model: &str,
    projector: &str,
    rows: impl Fn(&VisionEncoder, &str) -> Arc<EncodedImage>,
    bar: f64,
) {
    assert!(text_model_of(model).0.accepts_image_grids());
    check_pair_greedy((model, projector), QWEN_PROMPT, rows, bar);
}

/// Each image of [`QWEN_IMAGES`] through the `(text model, projector)` pair after `prompt`:
/// the greedy continuation against libllama's (`<image>.<projector>.greedy.json`; the
/// GLM-5.2-V pair's, named by its text model, `<image>.glm5v.greedy.json`).
fn check_pair_greedy(
    (model, projector): (&str, &str),
    prompt: &str,
    rows: impl Fn(&VisionEncoder, &str) -> Arc<EncodedImage>,
    bar: f64,
) {
    let (engine, tok) = text_model_of(model);
    let mut enc = encoder(&format!("{projector}.mmproj.gguf"), true);
    enc.fit_markers_to(engine.gguf());
    assert_eq!(engine.input_embedding_size(), enc.output_width());
    // The GLM-5.2-V pair's references are named by its text model (its projector is
    // Kimi-K2.5's), every other pair's by its projector.
    let reference = match model {
        "glm5v.gguf" => "glm5v",
        _ => projector,
    };
    for name in QWEN_IMAGES {
        let file = format!("{name}.{reference}.greedy.json");
        let path = dir().join("ref").join(file);
        let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let want = r["generated"].as_array().unwrap().len();
        let g = greedy_with(&engine, &tok, prompt, vec![rows(&enc, name)], want);
        check_against(&format!("{name} ({projector})"), &r, &g, bar);
    }
}

#[test]
fn qwen_vl_greedy_continuations_match_llama_cpp() {
    // The image's tokens at M-RoPE grid positions (time fixed at the image's first
    // position, rows and columns from it), the text after the image max(nx, ny) positions
    // on (`n_past` of the reference counts rotary positions), causal attention: ids equal
    // to libllama's after every image (f32 cache, flash attention off), for Qwen2.5-VL and
    // for Qwen3-VL (interleaved M-RoPE; the rows' deepstack slices added after the first
    // two layers).
    for (model, projector, bar) in QWEN_PAIRS {
        check_qwen_greedy(
            model,
            projector,
            |enc, name| qwen_encoded(enc, name, true),
            bar,
        );
    }
}

#[test]
fn qwen_vl_text_models_take_llama_cpps_image_embeddings_as_libllama_does() {
    // llama.cpp's own embeddings in (the grid from ours): the language model's side alone.
    for (model, projector, _) in QWEN_PAIRS {
        let own = |enc: &VisionEncoder, name: &str| {
            let ours = qwen_encoded(enc, name, true);
            let rows = reference_embd(&format!("{name}.{projector}.f32.embd"));
            let img = EncodedImage::new(rows, ours.n_tokens, false, enc.markers());
            Arc::new(img.with_grid(ours.grid))
        };
        check_qwen_greedy(model, projector, own, 2e-5);
    }
}

#[test]
fn qwen_vl_image_positions_are_what_makes_the_match() {
    // The same rows at one position each (no grid) give other logits, and models without
    // M-RoPE refuse a grid.
    let (engine, tok) = text_model_of("qwen2vl.gguf");
    let enc = encoder("qwen25vl.mmproj.gguf", true);
    let run = |grid| {
        greedy_with(
            &engine,
            &tok,
            QWEN_PROMPT,
            vec![qwen_encoded(&enc, "rgb200x150", grid)],
            1,
        )
        .lps
    };
    let (placed, flat) = (run(true), run(false));
    let d = placed[0]
        .iter()
        .zip(&flat[0])
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    assert!(
        d > 1e-3,
        "grid and flat positions gave the same logits ({d})"
    );

    let (gemma, _) = text_model();
    assert!(!gemma.accepts_image_grids());
    let err = refused_rows(&gemma, (4, 128), false, Some(ImageGrid { nx: 2, ny: 2 }));
    assert!(err.contains("M-RoPE"), "{err}");
}

/// The error `engine` gives for `n` zero rows of `width` values in place of tokens, laid out
/// as `bidirectional` and `grid` say.
fn refused_rows(
    engine: &AnyEngine,
    (n, width): (usize, usize),
    bidirectional: bool,
    grid: Option<ImageGrid>,
) -> String {
    let mut state = engine.new_state().unwrap();
    let rows = vec![0.0f32; n * width];
    let e = ferrox_models::engine::InputEmbeddings {
        rows: &rows,
        bidirectional,
        grid,
        grid_first: 0,
    };
    let tokens = vec![0x8000_0000; n];
    engine
        .forward_embeddings(&tokens, e, 0, &mut state, LogitsFor::Last)
        .unwrap_err()
        .to_string()
}

const KIMI_PROMPT: &str = "<|im_user|>user<|im_middle|><__media__>Describe this image.\
<|im_end|><|im_assistant|>assistant<|im_middle|>";

#[test]
fn kimi_greedy_continuations_match_llama_cpp() {
    // The deepseek2 (MLA) text model takes the image rows at plain positions, causally:
    // ids equal to libllama's after every image (f32 cache, flash attention off) through
    // both Kimi projectors; the top-5 log-probabilities carry our embeddings' differences
    // (up to 7e-4, ggml's f16 GELU table flipping).
    let (engine, _) = text_model_of("kimi.gguf");
    assert!(engine.accepts_embeddings() && !engine.accepts_image_grids());
    for projector in ["kimivl", "kimik25"] {
        let ours = |enc: &VisionEncoder, name: &str| encoded(enc, name, false);
        check_pair_greedy(("kimi.gguf", projector), KIMI_PROMPT, ours, 2e-3);
    }
}

#[test]
fn the_mla_model_takes_llama_cpps_image_embeddings_as_libllama_does() {
    // llama.cpp's own embeddings in: the language model's side alone.
    for projector in ["kimivl", "kimik25"] {
        let own = |enc: &VisionEncoder, name: &str| {
            let rows = reference_embd(&format!("{name}.{projector}.f32.embd"));
            let n = rows.len() / enc.output_width();
            Arc::new(EncodedImage::new(rows, n, false, enc.markers()))
        };
        check_pair_greedy(("kimi.gguf", projector), KIMI_PROMPT, own, 2e-5);
    }
}

#[test]
fn causal_engines_refuse_rows_that_attend_both_ways() {
    // The MLA engine's attention is causal only: Gemma 3's bidirectional image rows are
    // refused by name rather than attended causally.
    let (engine, _) = text_model_of("kimi.gguf");
    assert!(!engine.accepts_bidirectional());
    let err = refused_rows(&engine, (4, 128), true, None);
    assert!(err.contains("both ways"), "{err}");
    let (gemma, _) = text_model();
    assert!(gemma.accepts_bidirectional());
}

const GLM_PROMPT: &str = "<|user|><__media__>Describe this image.<|assistant|>";

#[test]
fn glm5v_greedy_continuations_match_llama_cpp() {
    // GLM-5.2-V: Kimi-K2.5's projector with a glm-dsa (sparse attention over MLA) text
    // model, the images between GLM's markers (its vocabulary has them): ids equal to
    // libllama's after every image, with our embeddings and with llama.cpp's own.
    let (engine, _) = text_model_of("glm5v.gguf");
    assert!(engine.accepts_embeddings());
    let pair = ("glm5v.gguf", "kimik25");
    check_pair_greedy(
        pair,
        GLM_PROMPT,
        |enc, name| encoded(enc, name, false),
        2e-3,
    );
    let own = |enc: &VisionEncoder, name: &str| {
        let rows = reference_embd(&format!("{name}.kimik25.f32.embd"));
        let n = rows.len() / enc.output_width();
        Arc::new(EncodedImage::new(rows, n, false, enc.markers()))
    };
    check_pair_greedy(pair, GLM_PROMPT, own, 2e-5);
}
