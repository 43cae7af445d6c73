use ferrox_gguf::{Gguf, GgufWriter};
use ferrox_moe::{
    route, weigh_chosen_into, Gating, MoeError, MoeHparams, RouteScratch, RouterConfig,
};
use proptest::prelude::*;
use rand::{rngs::StdRng, Rng, SeedableRng};

/// Straightforward f64 reference of llama.cpp's routing. Returns the selection and the
/// smallest score gap around the top-k boundary (and the group boundary), so callers can
/// skip cases where f32 rounding may legitimately reorder.
fn reference(c: &RouterConfig, logits: &[f32], bias: Option<&[f32]>) -> (Vec<(usize, f64)>, f64) {
    let x: Vec<f64> = logits.iter().map(|&v| v as f64).collect();
    let p: Vec<f64> = match c.gating {
        Gating::Softmax => {
            let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = x.iter().map(|v| (v - m).exp()).collect();
            let s: f64 = e.iter().sum();
            e.iter().map(|v| v / s).collect()
        }
        Gating::Sigmoid => x.iter().map(|v| 1.0 / (1.0 + (-v).exp())).collect(),
        Gating::SoftmaxWeight => x.clone(),
        Gating::SqrtSoftplus => x
            .iter()
            .map(|&v| if v > 20.0 { v } else { (1.0 + v.exp()).ln() }.sqrt())
            .collect(),
    };
    let mut s: Vec<f64> = match bias {
        Some(b) => p.iter().zip(b).map(|(p, &b)| p + b as f64).collect(),
        None => p.clone(),
    };
    let mut gap = f64::INFINITY;
    let rank = |v: &[f64]| {
        let mut i: Vec<usize> = (0..v.len()).collect();
        i.sort_by(|&a, &b| v[b].partial_cmp(&v[a]).unwrap().then(a.cmp(&b)));
        i
    };
    if let Some((g, gu)) = c.groups {
        let per = c.n_expert / g;
        let scores: Vec<f64> = s
            .chunks(per)
            .map(|ch| {
                let r = rank(ch);
                ch[r[0]] + ch[r[1]]
            })
            .collect();
        let r = rank(&scores);
        gap = gap.min(scores[r[gu - 1]] - scores[r[gu]]);
        for (gi, ch) in s.chunks_mut(per).enumerate() {
            if !r[..gu].contains(&gi) {
                ch.fill(f64::NEG_INFINITY);
            }
        }
    }
    let r = rank(&s);
    if c.n_used < c.n_expert && s[r[c.n_used]].is_finite() {
        gap = gap.min(s[r[c.n_used - 1]] - s[r[c.n_used]]);
    }
    for w in r[..c.n_used].windows(2) {
        gap = gap.min(s[w[0]] - s[w[1]]);
    }
    let sel = &r[..c.n_used];
    let mut w: Vec<f64> = sel.iter().map(|&e| p[e]).collect();
    if c.gating == Gating::SoftmaxWeight {
        let m = w.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = w.iter().map(|v| (v - m).exp()).collect();
        let t: f64 = e.iter().sum();
        w = e.iter().map(|v| v / t).collect();
    }
    if c.norm_weights {
        let t: f64 = w.iter().sum::<f64>().max(6.103515625e-5);
        w.iter_mut().for_each(|v| *v /= t);
    }
    if c.scale != 0.0 && c.scale != 1.0 {
        w.iter_mut().for_each(|v| *v *= c.scale as f64);
    }
    (sel.iter().copied().zip(w).collect(), gap)
}

#[test]
fn matches_f64_reference_for_every_combination() {
    let mut rng = StdRng::seed_from_u64(7);
    let mut checked = 0;
    for gating in [Gating::Softmax, Gating::Sigmoid, Gating::SoftmaxWeight] {
        for norm_weights in [false, true] {
            for scale in [0.0f32, 1.0, 2.5] {
                for groups in [None, Some((8, 3)), Some((4, 1))] {
                    for use_bias in [false, true] {
                        for &(n_expert, n_used) in &[(64usize, 8usize), (32, 4), (16, 6)] {
                            let config = RouterConfig {
                                n_expert,
                                n_used,
                                gating,
                                norm_weights,
                                scale,
                                groups,
                            };
                            if config.validate().is_err() {
                                continue;
                            }
                            for _ in 0..20 {
                                let logits: Vec<f32> =
                                    (0..n_expert).map(|_| rng.random_range(-4.0..4.0)).collect();
                                let bias: Vec<f32> =
                                    (0..n_expert).map(|_| rng.random_range(-0.5..0.5)).collect();
                                let bias = use_bias.then_some(bias.as_slice());
                                let (want, gap) = reference(&config, &logits, bias);
                                if gap < 1e-5 {
                                    continue;
                                }
                                let mut got = Vec::new();
                                route(&config, &logits, bias, &mut got);
                                assert_eq!(got.len(), n_used);
                                for (&(ge, gw), &(we, ww)) in got.iter().zip(&want) {
                                    assert_eq!(ge, we, "{config:?} {logits:?}");
                                    let tol = 1e-6 * ww.abs().max(1.0);
                                    assert!(
                                        (gw as f64 - ww).abs() <= tol,
                                        "{config:?}: weight {gw} vs {ww}"
                                    );
                                }
                                checked += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 3000, "only {checked} cases checked");
}

#[test]
fn group_limited_selection_picks_the_best_groups() {
    // Groups of two; scores are the logits themselves (softmax-weight gating).
    // Group sums of the top two: g0 = 0, g1 = 2, g2 = 4, g3 = 0 -> keep g2 and g1,
    // so expert 0 (the best single score) is excluded.
    let logits = [5.0f32, -5.0, 1.0, 1.0, 2.0, 2.0, 0.0, 0.0];
    let config = RouterConfig {
        n_expert: 8,
        n_used: 3,
        gating: Gating::SoftmaxWeight,
        norm_weights: false,
        scale: 0.0,
        groups: Some((4, 2)),
    };
    let mut out = Vec::new();
    route(&config, &logits, None, &mut out);
    let experts: Vec<usize> = out.iter().map(|p| p.0).collect();
    assert_eq!(experts, [4, 5, 2]); // the tie 4/5 resolves to the lower index first
    let e1 = (-1.0f64).exp();
    let z = 2.0 + e1;
    for (&(_, w), want) in out.iter().zip([1.0 / z, 1.0 / z, e1 / z]) {
        assert!((w as f64 - want).abs() < 1e-7);
    }

    let ungrouped = RouterConfig {
        groups: None,
        ..config
    };
    route(&ungrouped, &logits, None, &mut out);
    assert_eq!(out.iter().map(|p| p.0).collect::<Vec<_>>(), [0, 4, 5]);
}

#[test]
fn bias_changes_selection_but_not_weights() {
    let logits = [0.0f32, 1.0, 2.0, 3.0];
    let bias = [10.0f32, 0.0, 0.0, 0.0];
    let sig = |x: f32| 1.0 / (1.0 + (-x).exp());
    let mut config = RouterConfig {
        n_expert: 4,
        n_used: 2,
        gating: Gating::Sigmoid,
        norm_weights: false,
        scale: 0.0,
        groups: None,
    };
    let mut out = Vec::new();
    route(&config, &logits, None, &mut out);
    assert_eq!(out, [(3, sig(3.0)), (2, sig(2.0))]);
    route(&config, &logits, Some(&bias), &mut out);
    assert_eq!(out, [(0, sig(0.0)), (3, sig(3.0))]);
    config.norm_weights = true;
    config.scale = 2.0;
    route(&config, &logits, Some(&bias), &mut out);
    let sum = ((sig(0.0) as f64 + sig(3.0) as f64) as f32).max(6.1e-5);
    assert_eq!(out, [(0, sig(0.0) / sum * 2.0), (3, sig(3.0) / sum * 2.0)]);
}

#[test]
fn non_finite_logits() {
    let mut out = Vec::new();
    let mut config = RouterConfig {
        n_expert: 6,
        n_used: 2,
        gating: Gating::Sigmoid,
        norm_weights: true,
        scale: 0.0,
        groups: None,
    };
    // NaN ranks below everything: never chosen while numeric scores remain.
    let logits = [
        f32::NAN,
        1.0,
        f32::NEG_INFINITY,
        0.5,
        f32::NAN,
        f32::INFINITY,
    ];
    route(&config, &logits, None, &mut out);
    assert_eq!(out.iter().map(|p| p.0).collect::<Vec<_>>(), [5, 1]);
    assert!(out.iter().all(|p| p.1.is_finite()));
    // With softmax one NaN poisons every probability, as in ggml.
    config.gating = Gating::Softmax;
    route(&config, &logits, None, &mut out);
    assert_eq!(out.len(), 2);
    assert!(out.iter().all(|p| p.1.is_nan() || p.1 == 0.0));
    // All NaN: still n_used distinct experts, lowest indices first.
    route(&config, &[f32::NAN; 6], None, &mut out);
    assert_eq!(out.iter().map(|p| p.0).collect::<Vec<_>>(), [0, 1]);
}

fn any_config() -> impl Strategy<Value = RouterConfig> {
    (
        2usize..=64,
        prop_oneof![
            Just(Gating::Softmax),
            Just(Gating::Sigmoid),
            Just(Gating::SoftmaxWeight)
        ],
        any::<bool>(),
        prop_oneof![Just(0.0f32), Just(1.0), Just(2.5)],
        1usize..=8,
        any::<u8>(),
        any::<u8>(),
    )
        .prop_map(|(n_expert, gating, norm_weights, scale, g, used, gused)| {
            let n_group = (2..=g.max(2))
                .rev()
                .find(|&g| n_expert % g == 0 && n_expert / g >= 2 && g < n_expert);
            let groups = n_group.map(|g| (g, 1 + gused as usize % (g - 1)));
            RouterConfig {
                n_expert,
                n_used: 1 + used as usize % n_expert,
                gating,
                norm_weights,
                scale,
                groups: if g > 1 { groups } else { None },
            }
        })
}

proptest! {
    #[test]
    fn invariants_hold_for_any_logits(
        config in any_config(),
        raw in prop::collection::vec(prop::num::f32::ANY, 64),
        bias in prop::collection::vec(-1.0f32..1.0, 64),
        use_bias in any::<bool>(),
    ) {
        prop_assume!(config.validate().is_ok());
        let logits = &raw[..config.n_expert];
        let bias = use_bias.then_some(&bias[..config.n_expert]);
        let mut out = Vec::new();
        route(&config, logits, bias, &mut out);
        prop_assert_eq!(out.len(), config.n_used);
        let mut seen = vec![false; config.n_expert];
        for &(e, _) in &out {
            prop_assert!(e < config.n_expert);
            prop_assert!(!seen[e]);
            seen[e] = true;
        }
    }

    #[test]
    fn normalised_weights_sum_to_one(
        config in any_config(),
        logits in prop::collection::vec(-30.0f32..30.0, 64),
    ) {
        prop_assume!(config.validate().is_ok());
        let config = RouterConfig { norm_weights: true, scale: 0.0, ..config };
        // Sigmoid of very negative logits can make the sum hit ggml's clamp; keep away.
        prop_assume!(config.gating != Gating::Sigmoid || logits.iter().all(|&l| l > -8.0));
        let mut out = Vec::new();
        route(&config, &logits[..config.n_expert], None, &mut out);
        let sum: f64 = out.iter().map(|p| p.1 as f64).sum();
        prop_assert!((sum - 1.0).abs() < 1e-5, "sum {}", sum);
        // Ranked best first, and every gating is monotone, so the weights descend (with
        // groups, experts from masked groups can follow when the kept ones run out).
        prop_assert!(config.groups.is_some() || out.windows(2).all(|w| w[0].1 >= w[1].1));
    }
}

fn gguf(kvs: &[(&str, ferrox_gguf::OwnedValue)]) -> Gguf {
    let mut w = GgufWriter::new();
    w.set("general.architecture", "x");
    for (k, v) in kvs {
        w.set(*k, v.clone());
    }
    Gguf::from_bytes(w.to_bytes()).unwrap()
}

#[test]
fn from_metadata_reads_keys_and_defaults() {
    let g = gguf(&[
        ("deepseek2.expert_count", 256u32.into()),
        ("deepseek2.expert_used_count", 8u32.into()),
        ("deepseek2.expert_gating_func", 2u32.into()),
        ("deepseek2.expert_weights_norm", true.into()),
        ("deepseek2.expert_weights_scale", 2.5f32.into()),
        ("deepseek2.expert_group_count", 8u32.into()),
        ("deepseek2.expert_group_used_count", 4u32.into()),
        ("deepseek2.leading_dense_block_count", 3u32.into()),
        ("deepseek2.expert_feed_forward_length", 2048u32.into()),
        ("deepseek2.expert_shared_count", 1u32.into()),
    ]);
    let h = MoeHparams::from_metadata(&g.metadata(), "deepseek2").unwrap();
    assert_eq!(
        h.router,
        RouterConfig {
            n_expert: 256,
            n_used: 8,
            gating: Gating::Sigmoid,
            norm_weights: true,
            scale: 2.5,
            groups: Some((8, 4)),
        }
    );
    assert_eq!(h.n_leading_dense, 3);
    assert_eq!(h.n_ff_exp, Some(2048));
    assert_eq!(h.n_ff_shexp, None);
    assert_eq!(h.n_expert_shared, 1);

    // qwen3moe: softmax and normalisation are fixed by the architecture.
    let g = gguf(&[
        ("qwen3moe.expert_count", 128u32.into()),
        ("qwen3moe.expert_used_count", 8u32.into()),
        ("qwen3moe.expert_gating_func", 2u32.into()),
    ]);
    let r = RouterConfig::from_metadata(&g.metadata(), "qwen3moe").unwrap();
    assert_eq!(
        (r.gating, r.norm_weights, r.scale, r.groups),
        (Gating::Softmax, true, 0.0, None)
    );
    let r = RouterConfig::from_metadata(
        &gguf(&[
            ("qwen2moe.expert_count", 60u32.into()),
            ("qwen2moe.expert_used_count", 4u32.into()),
            ("qwen2moe.expert_weights_norm", true.into()),
        ])
        .metadata(),
        "qwen2moe",
    )
    .unwrap();
    assert!(!r.norm_weights);
}

#[test]
fn from_metadata_errors_name_the_key() {
    let g = gguf(&[("olmoe.expert_used_count", 8u32.into())]);
    let e = RouterConfig::from_metadata(&g.metadata(), "olmoe").unwrap_err();
    assert!(e.to_string().contains("olmoe.expert_count"), "{e}");
    let g = gguf(&[
        ("deepseek2.expert_count", 64u32.into()),
        ("deepseek2.expert_used_count", 6u32.into()),
        ("deepseek2.expert_gating_func", 9u32.into()),
    ]);
    let e = RouterConfig::from_metadata(&g.metadata(), "deepseek2").unwrap_err();
    assert!(
        e.to_string().contains("deepseek2.expert_gating_func"),
        "{e}"
    );
    let g = gguf(&[
        ("deepseek2.expert_count", 64u32.into()),
        ("deepseek2.expert_used_count", 6u32.into()),
        ("deepseek2.expert_group_count", 5u32.into()),
        ("deepseek2.expert_group_used_count", 2u32.into()),
    ]);
    assert!(matches!(
        RouterConfig::from_metadata(&g.metadata(), "deepseek2"),
        Err(MoeError::Config(_))
    ));
}

#[test]
fn sqrt_softplus_gating_and_chosen_experts() {
    let g = gguf(&[
        ("deepseek4.expert_count", 4u32.into()),
        ("deepseek4.expert_used_count", 2u32.into()),
        ("deepseek4.expert_gating_func", 4u32.into()),
        ("deepseek4.expert_weights_norm", true.into()),
        ("deepseek4.expert_weights_scale", 1.5f32.into()),
    ]);
    let config = RouterConfig::from_metadata(&g.metadata(), "deepseek4").unwrap();
    assert_eq!(config.gating, Gating::SqrtSoftplus);
    let logits = [0.5f32, -1.0, 2.0, 30.0];
    let p: Vec<f32> = logits
        .iter()
        .map(|&x| if x > 20.0 { x } else { (1.0 + x.exp()).ln() }.sqrt())
        .collect();
    // Routed: the two highest probabilities, normalised and scaled.
    let mut out = Vec::new();
    route(&config, &logits, None, &mut out);
    assert_eq!(out.iter().map(|r| r.0).collect::<Vec<_>>(), [3, 2]);
    // Chosen elsewhere: the same weighting of whichever experts were given, in their order.
    let mut chosen = Vec::new();
    weigh_chosen_into(
        &config,
        &logits,
        &[1, 0],
        &mut chosen,
        &mut RouteScratch::default(),
    )
    .unwrap();
    let sum = p[1] + p[0];
    assert_eq!(chosen[0].0, 1);
    assert!((chosen[0].1 - p[1] / sum * 1.5).abs() < 1e-6);
    assert!((chosen[1].1 - p[0] / sum * 1.5).abs() < 1e-6);
    let mut scratch = RouteScratch::default();
    assert!(weigh_chosen_into(&config, &logits, &[1, 4], &mut chosen, &mut scratch).is_err());
    assert!(weigh_chosen_into(&config, &logits, &[1], &mut chosen, &mut scratch).is_err());
}
