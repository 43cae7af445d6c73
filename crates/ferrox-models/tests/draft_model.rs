//! Draft-model speculation changes nothing but speed: greedy output is the target's greedy
//! output token for token, and sampled tokens keep the target's distribution (a chi-square
//! test over 20,000 draws with and without speculative sampling). A draft whose vocabulary
//! differs is refused.

mod common;
mod synthetic;

use std::sync::Arc;

use ferrox_generate::draft_model::{check_vocab_compatible, DraftParams, ModelDrafter};
use ferrox_generate::generate::{
    generate, generate_speculative, Generation, GenerationParams, Outcome,
};
use ferrox_generate::sampling::SamplerParams;
use ferrox_gguf::Gguf;
use ferrox_models::{AnyEngine, Engine, EngineExt, EngineOptions, LogitsFor};
use ferrox_tokenizer::tokenizer::Tokenizer;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The MLA target and its draft: two unrelated synthetic models with the same 296-token
/// vocabulary, so that the draft is often wrong and the rejection path runs.
const TARGET: &str = "deepseek2";
const DRAFT: &str = "qwen2moe";

fn synthetic_model(name: &str) -> (AnyEngine, Tokenizer) {
    let gguf = Gguf::from_bytes(synthetic::gguf_bytes(name)).unwrap();
    let options = EngineOptions {
        n_ctx: 256,
        threads: 2,
        ..EngineOptions::default()
    };
    let tokenizer = Tokenizer::from_gguf(&gguf).unwrap();
    (
        AnyEngine::from_gguf(Arc::new(gguf), &options).unwrap(),
        tokenizer,
    )
}

fn params(temperature: f32, seed: u64, max_tokens: usize) -> GenerationParams {
    GenerationParams {
        max_tokens: Some(max_tokens),
        sampler: SamplerParams {
            temperature,
            seed,
            ..SamplerParams::default()
        },
        ignore_eog: true,
        ..GenerationParams::default()
    }
}

fn run_with_draft(
    target: &AnyEngine,
    draft: &AnyEngine,
    tok: &Tokenizer,
    prompt: &[u32],
    params: &GenerationParams,
    draft_params: DraftParams,
) -> Outcome {
    let mut drafter = ModelDrafter::new(
        draft,
        draft_params,
        target.vocab_size(),
        params.sampler.seed,
    )
    .unwrap();
    let mut state = target.new_state().unwrap();
    generate_speculative(
        target,
        &mut state,
        0,
        tok,
        prompt,
        params,
        Some(&mut drafter),
        |_| true,
    )
    .unwrap()
}

fn run_plain(
    engine: &AnyEngine,
    tok: &Tokenizer,
    prompt: &[u32],
    params: &GenerationParams,
) -> Outcome {
    let mut state = engine.new_state().unwrap();
    generate(engine, &mut state, 0, tok, prompt, params, |_| true).unwrap()
}

const EAGER: DraftParams = DraftParams {
    max: 4,
    min: 1,
    p_min: 0.0,
};

#[test]
fn greedy_output_with_a_draft_model_is_the_targets() {
    let (target, tok) = synthetic_model(TARGET);
    let (draft, draft_tok) = synthetic_model(DRAFT);
    check_vocab_compatible(&tok, &draft_tok).unwrap();
    let ids = synthetic::token_ids(TARGET);
    let mut repeated = ids[..20].to_vec();
    repeated.extend_from_slice(&ids[1..20]);
    let (mut drafted, mut accepted) = (0, 0);
    for prompt in [ids[..30].to_vec(), repeated] {
        let p = params(0.0, 1, 64);
        let plain = run_plain(&target, &tok, &prompt, &p);
        // A draft of its own kind: an unrelated model, and the target itself (always right).
        for (draft, name) in [(&draft, DRAFT), (&target, TARGET)] {
            let with = run_with_draft(&target, draft, &tok, &prompt, &p, EAGER);
            assert_eq!(plain.tokens, with.tokens, "draft {name}");
            assert_eq!(plain.text, with.text);
            drafted += with.timings.drafted_tokens;
            accepted += with.timings.accepted_tokens;
            if name == TARGET {
                assert!(
                    with.timings.accepted_tokens * 10 >= with.timings.drafted_tokens * 9,
                    "the target drafting for itself: {:?}",
                    with.timings
                );
            }
        }
    }
    eprintln!("drafted {drafted}, accepted {accepted}");
    assert!(accepted > 0 && drafted > accepted);
}

#[test]
fn sampled_generation_with_a_draft_model_runs_and_repeats() {
    let (target, tok) = synthetic_model(TARGET);
    let (draft, _) = synthetic_model(DRAFT);
    let prompt = synthetic::token_ids(TARGET)[..24].to_vec();
    let p = params(0.8, 11, 48);
    let a = run_with_draft(&target, &draft, &tok, &prompt, &p, EAGER);
    let b = run_with_draft(&target, &draft, &tok, &prompt, &p, EAGER);
    assert_eq!(a.tokens, b.tokens, "the same seeds give the same tokens");
    assert_eq!(a.tokens.len(), 48);
    assert!(a.timings.drafted_tokens > 0);
}

/// Pearson's two-sample chi-square statistic over the cells of two count tables of equal
/// totals (cells with fewer than 10 draws together pooled into one), and its degrees of
/// freedom.
fn chi_square(a: &[u64], b: &[u64]) -> (f64, usize) {
    let (mut stat, mut cells) = (0.0, 0);
    let (mut pool_a, mut pool_b) = (0u64, 0u64);
    let mut add = |x: u64, y: u64| {
        let (x, y) = (x as f64, y as f64);
        stat += (x - y) * (x - y) / (x + y);
        cells += 1;
    };
    for (&x, &y) in a.iter().zip(b) {
        if x + y >= 10 {
            add(x, y);
        } else {
            pool_a += x;
            pool_b += y;
        }
    }
    if pool_a + pool_b > 0 {
        add(pool_a, pool_b);
    }
    (stat, cells - 1)
}

/// ln Γ(x) (Lanczos, g = 7).
fn ln_gamma(x: f64) -> f64 {
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    let x = x - 1.0;
    let mut a = C[0];
    let t = x + 7.5;
    for (i, &c) in C.iter().enumerate().skip(1) {
        a += c / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// The upper regularized incomplete gamma Q(s, x): the chi-square p-value is Q(df/2, χ²/2).
fn gamma_q(s: f64, x: f64) -> f64 {
    if x < s + 1.0 {
        // The series for P, then Q = 1 - P.
        let (mut sum, mut term, mut n) = (1.0 / s, 1.0 / s, s);
        for _ in 0..1000 {
            n += 1.0;
            term *= x / n;
            sum += term;
            if term < sum * 1e-15 {
                break;
            }
        }
        1.0 - sum * (-x + s * x.ln() - ln_gamma(s)).exp()
    } else {
        // Lentz's continued fraction for Q.
        let tiny = 1e-300;
        let mut b = x + 1.0 - s;
        let mut c = 1.0 / tiny;
        let mut d = 1.0 / b;
        let mut h = d;
        for i in 1..1000 {
            let an = -(i as f64) * (i as f64 - s);
            b += 2.0;
            d = an * d + b;
            if d.abs() < tiny {
                d = tiny;
            }
            c = b + an / c;
            if c.abs() < tiny {
                c = tiny;
            }
            d = 1.0 / d;
            let delta = d * c;
            h *= delta;
            if (delta - 1.0).abs() < 1e-15 {
                break;
            }
        }
        (-x + s * x.ln() - ln_gamma(s)).exp() * h
    }
}

#[test]
fn the_chi_square_helpers_are_right() {
    // Known values: Q(1, x) = e^-x; chi-square with 2 dof at 5.991 has p = 0.05; with 10 dof
    // at 23.209 p = 0.01.
    assert!((gamma_q(1.0, 2.0) - (-2.0f64).exp()).abs() < 1e-9);
    assert!((gamma_q(1.0, 5.991 / 2.0) - 0.05).abs() < 1e-4);
    assert!((gamma_q(5.0, 23.209 / 2.0) - 0.01).abs() < 1e-4);
    assert!((ln_gamma(5.0) - 24f64.ln()).abs() < 1e-10);
}

/// On a fixed context, 20,000 next tokens drawn by the sampler from the target's logits and
/// 20,000 drawn by speculative sampling (a token drawn from the draft model's distribution
/// there, then kept or replaced) follow the same distribution, with an unrelated draft (mostly
/// replaced) and with the target drafting for itself (mostly kept). Seeds are fixed, so the
/// test always sees the same draws.
#[test]
fn speculative_sampling_keeps_the_targets_distribution() {
    const DRAWS: u64 = 20_000;
    let (target, tok) = synthetic_model(TARGET);
    let context = synthetic::token_ids(TARGET)[..16].to_vec();
    let mut state = target.new_state().unwrap();
    let logits = target
        .forward_batch(&context, 0, &mut state, LogitsFor::Last)
        .unwrap()
        .to_vec();
    let temperature = 1.0;
    let n_vocab = target.vocab_size();
    let mut plain = vec![0u64; n_vocab];
    for seed in 0..DRAWS {
        let mut g = Generation::new(&tok, params(temperature, seed, 1), &context);
        plain[g.sample(&logits).token as usize] += 1;
    }
    for draft_name in [DRAFT, TARGET] {
        let (draft, _) = synthetic_model(draft_name);
        let mut drafter = ModelDrafter::new(&draft, EAGER, n_vocab, 3).unwrap();
        let (mut proposed, mut dists) = (Vec::new(), Vec::new());
        drafter
            .propose(&context, 1, temperature, &mut proposed, &mut dists)
            .unwrap();
        let q = dists.pop().expect("the draft proposes a token");
        assert!(q.len() > 1, "a sampling draft has a spread distribution");

        let mut speculative = vec![0u64; n_vocab];
        let mut draft_rng = StdRng::seed_from_u64(99);
        let mut kept = 0;
        for seed in 0..DRAWS {
            let r: f32 = draft_rng.random();
            let mut acc = 0.0;
            let x = q
                .iter()
                .find(|&&(_, pr)| {
                    acc += pr;
                    r < acc
                })
                .unwrap_or(&q[q.len() - 1])
                .0;
            let p = params(temperature, seed + DRAWS, 1);
            let mut g = Generation::new(&tok, p, &context);
            let token = g.sample_speculative(&logits, x, &q).token;
            kept += usize::from(token == x);
            speculative[token as usize] += 1;
        }
        let (stat, dof) = chi_square(&plain, &speculative);
        let p_value = gamma_q(dof as f64 / 2.0, stat / 2.0);
        eprintln!(
            "draft {draft_name}: chi-square {stat:.1} over {dof} degrees of freedom: \
             p = {p_value:.3}; draft token kept {kept} times"
        );
        assert!(
            dof >= 3,
            "too few tokens to compare: {dof} degrees of freedom"
        );
        assert!(
            kept > 0 && kept < DRAWS as usize,
            "both the kept and the replaced path must run"
        );
        assert!(p_value > 0.01, "draft {draft_name}: p = {p_value}");
    }
}

#[test]
fn a_draft_with_another_vocabulary_is_refused() {
    let (_, target_tok) = synthetic_model(TARGET);
    // The synthetic vocabularies are prefixes of one another: within llama.cpp's size
    // difference, they are compatible.
    let (_, longer) = synthetic_model("llama");
    check_vocab_compatible(&target_tok, &longer).unwrap();
    let err = check_vocab_compatible(&target_tok, common::gemma_tokenizer()).unwrap_err();
    eprintln!("{err}");
    assert!(err.to_string().starts_with("the "), "{err}");
}

#[test]
fn bad_draft_settings_are_refused() {
    let (draft, _) = synthetic_model(DRAFT);
    for bad in [
        DraftParams { max: 0, ..EAGER },
        DraftParams { min: 9, ..EAGER },
        DraftParams {
            p_min: -0.5,
            ..EAGER
        },
    ] {
        assert!(ModelDrafter::new(&draft, bad, 296, 0).is_err(), "{bad:?}");
    }
}

/// The CI's Qwen2.5-Coder-0.5B drafting for itself: greedy output unchanged.
#[test]
fn greedy_output_with_a_real_draft_model_is_the_targets() {
    let dir = ferrox_models::default_model_path()
        .parent()
        .unwrap()
        .to_path_buf();
    let path = dir.join("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    assert!(
        path.is_file(),
        "{} is missing: run scripts/fetch-model.sh qwen-0.5b",
        path.display()
    );
    let gguf = Arc::new(Gguf::open(&path).unwrap());
    let tok = Tokenizer::from_gguf(&gguf).unwrap();
    let options = EngineOptions {
        n_ctx: 512,
        threads: 2,
        ..EngineOptions::default()
    };
    let target = AnyEngine::from_gguf(gguf.clone(), &options).unwrap();
    let draft = AnyEngine::from_gguf(gguf, &options).unwrap();
    let code = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n\
                # The same functions again, with type hints:\n";
    let (mut drafted, mut accepted) = (0, 0);
    for text in [code, "Write a haiku about the sea."] {
        let prompt = tok.encode(text, true, false);
        let p = params(0.0, 1, 40);
        let plain = run_plain(&target, &tok, &prompt, &p);
        let with = run_with_draft(
            &target,
            &draft,
            &tok,
            &prompt,
            &p,
            DraftParams {
                max: 6,
                min: 1,
                p_min: 0.5,
            },
        );
        assert_eq!(plain.tokens, with.tokens);
        drafted += with.timings.drafted_tokens;
        accepted += with.timings.accepted_tokens;
    }
    eprintln!("drafted {drafted}, accepted {accepted}");
    assert!(accepted > 0);
    // Gemma's vocabulary is not Qwen's.
    let gemma = Tokenizer::from_gguf(&common::gemma()).unwrap();
    assert!(check_vocab_compatible(&tok, &gemma).is_err());
}
