//! Greedy continuations of the default model against llama.cpp's, token for token. The
//! reference is fixtures/reference/gemma3-270m-greedy.json
//! (scripts/reference/gen-gemma-greedy.sh).
//!
//! A divergence is accepted only at a step where llama.cpp's two best logits are close.
//! How close is measured, not guessed: this model amplifies rounding differences, and
//! llama.cpp itself, run with its weight repacking off instead of on (both legitimate
//! configurations of the same build; the fixture's `repack_off` records), moves the top-5
//! logits of the very same contexts by up to about 2 (median 0.18, 99th percentile about
//! 0.95), and diverges from its own default output in most prompts (as it does with flash
//! attention off, `fa_off`). So:
//! - our logits must be as close to llama.cpp's as its own repacking-off run is: the largest
//!   top-5 difference may not exceed that run's largest;
//! - a divergence fails the test where llama.cpp's top-2 gap exceeds the 99th percentile of
//!   its own logit differences (or the largest gap at which its own variants diverged).

mod common;

use ferrox_generate::sampling::argmax;
use ferrox_models::EngineExt;
use ferrox_models::LogitsFor;
use ferrox_tokenizer::tokenizer::TokenId;

/// llama.cpp's own spread, from the fixture: the largest and the 99th-percentile absolute
/// difference between its default and its repacking-off top-5 logits over the steps where
/// both saw the same context, and the largest top-2 gap at which either variant run first
/// diverged from the default.
struct SelfNoise {
    max_logit_diff: f64,
    p99_logit_diff: f64,
    max_divergence_gap: f64,
}

fn self_noise(reference: &serde_json::Value) -> SelfNoise {
    let mut diffs = Vec::new();
    let mut max_divergence_gap = 0.0f64;
    for case in reference["cases"].as_array().unwrap() {
        let gaps = case["top2_gap"].as_array().unwrap();
        for variant in ["fa_off", "repack_off"] {
            if let Some(step) = case[variant]["first_divergence"].as_u64() {
                max_divergence_gap = max_divergence_gap.max(gaps[step as usize].as_f64().unwrap());
            }
        }
        let ours = case["top5"].as_array().unwrap();
        let theirs = case["repack_off"]["top5"].as_array().unwrap();
        for (a, b) in ours.iter().zip(theirs) {
            for pa in a.as_array().unwrap() {
                for pb in b.as_array().unwrap() {
                    if pa[0] == pb[0] {
                        diffs.push((pa[1].as_f64().unwrap() - pb[1].as_f64().unwrap()).abs());
                    }
                }
            }
        }
    }
    assert!(
        diffs.len() > 1000,
        "the fixture has too few repack_off logits"
    );
    diffs.sort_by(f64::total_cmp);
    SelfNoise {
        max_logit_diff: diffs[diffs.len() - 1],
        p99_logit_diff: diffs[diffs.len() * 99 / 100],
        max_divergence_gap,
    }
}

fn ids(v: &serde_json::Value) -> Vec<TokenId> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as TokenId)
        .collect()
}

#[test]
fn greedy_continuations_match_llama_cpp() {
    let reference = common::fixture("reference/gemma3-270m-greedy.json");
    let noise = self_noise(&reference);
    let noise_gap = noise.p99_logit_diff.max(noise.max_divergence_gap);
    let decoder = common::gemma_decoder(512, 0);
    let tokenizer = common::gemma_tokenizer();
    let mut report = Vec::new();
    let (mut matched_cases, mut matched_tokens, mut total_tokens) = (0, 0, 0);
    let mut worst_logit_diff = 0.0f64;
    let mut failures = Vec::new();
    for case in reference["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let prompt = ids(&case["prompt_ids"]);
        let expected = ids(&case["generated"]);
        let gaps: Vec<f64> = case["top2_gap"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g.as_f64().unwrap())
            .collect();
        let top5 = case["top5"].as_array().unwrap();
        // Our tokenizer must agree on the prompt too.
        let text = case["prompt"].as_str().unwrap();
        assert_eq!(
            tokenizer.encode(text, true, true),
            prompt,
            "{name}: prompt tokenization"
        );

        let mut state = decoder.new_state().unwrap();
        let mut logits = decoder
            .forward_batch(&prompt, 0, &mut state, LogitsFor::Last)
            .unwrap()
            .to_vec();
        let mut diverged_at = None;
        for (step, &want) in expected.iter().enumerate() {
            for pair in top5[step].as_array().unwrap() {
                let id = pair[0].as_u64().unwrap() as usize;
                let theirs = pair[1].as_f64().unwrap();
                worst_logit_diff = worst_logit_diff.max((f64::from(logits[id]) - theirs).abs());
            }
            let got = argmax(&logits);
            if got != want {
                diverged_at = Some(step);
                break;
            }
            logits.copy_from_slice(
                decoder
                    .forward_token(got, prompt.len() + step, &mut state)
                    .unwrap(),
            );
        }
        total_tokens += expected.len();
        match diverged_at {
            None => {
                matched_cases += 1;
                matched_tokens += expected.len();
                report.push(format!("{name}: all {} tokens match", expected.len()));
            }
            Some(step) => {
                matched_tokens += step;
                let gap = gaps[step];
                report.push(format!(
                    "{name}: diverges at step {step}, llama.cpp's top-2 gap there {gap:.4}"
                ));
                if gap > noise_gap {
                    failures.push(format!("{name}: diverged at step {step} where llama.cpp's top-2 gap is {gap:.4} (> {noise_gap:.4})"));
                }
            }
        }
    }
    eprintln!("{}", report.join("\n"));
    eprintln!(
        "greedy parity: {matched_cases}/{} cases identical, {matched_tokens}/{total_tokens} tokens before any divergence; largest |logit - llama.cpp| over the reference top-5: {worst_logit_diff:.4}",
        reference["cases"].as_array().unwrap().len()
    );
    eprintln!(
        "llama.cpp repacking on/off: largest top-5 logit difference {:.4}, 99th percentile {:.4}; its variants diverge at gaps up to {:.4}",
        noise.max_logit_diff, noise.p99_logit_diff, noise.max_divergence_gap
    );
    if worst_logit_diff > noise.max_logit_diff {
        failures.push(format!(
            "largest top-5 logit difference {worst_logit_diff:.4} exceeds llama.cpp's own (repacking on/off) {:.4}",
            noise.max_logit_diff
        ));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
