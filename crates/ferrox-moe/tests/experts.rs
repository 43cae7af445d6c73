use ferrox_core::packed::PackedMatrix;
use ferrox_core::{quantize_row, row_byte_len, GgmlType, WeightMatrix};
use ferrox_moe::numerics::{self, swiglu};
use ferrox_moe::{
    moe_ffn, route, router_logits, shared_expert_gate, Activation, CachedExperts, ExpertCache,
    ExpertTensor, Gating, Lookahead, MappedPages, MoeExperts, MoeScratch, RouterConfig,
    SharedExpert,
};
use rand::{rngs::StdRng, Rng, SeedableRng};
use std::sync::atomic::{AtomicU64, Ordering};

const N_EMBD: usize = 256;
const N_FF: usize = 96;
const N_EXPERT: usize = 12;

/// `n` stacked random matrices of `rows × cols`, quantized row by row to `ty`.
fn stacked(rng: &mut StdRng, ty: GgmlType, cols: usize, rows: usize, n: usize) -> Vec<u8> {
    let rb = row_byte_len(ty, cols).unwrap();
    let mut bytes = vec![0u8; rb * rows * n];
    let mut row = vec![0f32; cols];
    for dst in bytes.chunks_exact_mut(rb) {
        row.iter_mut()
            .for_each(|v| *v = rng.random_range(-1.0..1.0) / (cols as f32).sqrt());
        quantize_row(ty, &row, dst).unwrap();
    }
    bytes
}

struct Model {
    gate: Vec<u8>,
    up: Vec<u8>,
    down: Vec<u8>,
    gate_inp: Vec<u8>,
    bias: Vec<f32>,
}

// Gate Q4_K and up Q8_0 quantize activations differently (Q8_K vs Q8_0); down is Q4_0.
const TY: [GgmlType; 3] = [GgmlType::Q4K, GgmlType::Q8_0, GgmlType::Q4_0];

impl Model {
    fn new(seed: u64) -> Model {
        let mut rng = StdRng::seed_from_u64(seed);
        Model {
            gate: stacked(&mut rng, TY[0], N_EMBD, N_FF, N_EXPERT),
            up: stacked(&mut rng, TY[1], N_EMBD, N_FF, N_EXPERT),
            down: stacked(&mut rng, TY[2], N_FF, N_EMBD, N_EXPERT),
            gate_inp: (0..N_EMBD * N_EXPERT)
                .flat_map(|_| (rng.random_range(-1.0f32..1.0) * 0.3).to_le_bytes())
                .collect(),
            bias: (0..N_EXPERT)
                .map(|_| rng.random_range(-0.05..0.05))
                .collect(),
        }
    }

    /// The experts, ungated for [`Activation::Gelu`].
    fn experts(&self, act: Activation) -> MoeExperts<'_> {
        let up = ExpertTensor::new(TY[1], [N_EMBD, N_FF, N_EXPERT], &self.up).unwrap();
        let down = ExpertTensor::new(TY[2], [N_FF, N_EMBD, N_EXPERT], &self.down).unwrap();
        if act == Activation::Gelu {
            return MoeExperts::ungated(up, down, act).unwrap();
        }
        let gate = ExpertTensor::new(TY[0], [N_EMBD, N_FF, N_EXPERT], &self.gate).unwrap();
        MoeExperts::new(gate, up, down, act).unwrap()
    }

    fn gate_inp(&self) -> WeightMatrix<'_> {
        WeightMatrix::new(GgmlType::F32, N_EXPERT, N_EMBD, &self.gate_inp).unwrap()
    }
}

fn inputs(seed: u64, n_tokens: usize) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n_tokens * N_EMBD)
        .map(|_| rng.random_range(-2.0..2.0))
        .collect()
}

fn configs() -> Vec<RouterConfig> {
    vec![
        RouterConfig {
            n_expert: N_EXPERT,
            n_used: 4,
            gating: Gating::Softmax,
            norm_weights: true,
            scale: 0.0,
            groups: None,
        },
        RouterConfig {
            n_expert: N_EXPERT,
            n_used: 3,
            gating: Gating::Sigmoid,
            norm_weights: true,
            scale: 2.5,
            groups: Some((4, 2)),
        },
        RouterConfig {
            n_expert: N_EXPERT,
            n_used: 1,
            gating: Gating::SoftmaxWeight,
            norm_weights: false,
            scale: 0.0,
            groups: None,
        },
    ]
}

/// One token through the selected experts with single-token products, summed in order.
fn per_token(
    m: &Model,
    c: &RouterConfig,
    act: Activation,
    x: &[f32],
    bias: Option<&[f32]>,
) -> Vec<f32> {
    let ex = m.experts(act);
    let mut logits = vec![0f32; N_EXPERT];
    m.gate_inp().apply(x, &mut logits).unwrap();
    let mut sel = Vec::new();
    route(c, &logits, bias, &mut sel);
    let mut out = vec![0f32; N_EMBD];
    for (i, &(e, w)) in sel.iter().enumerate() {
        let (mut g, mut u, mut y) = (vec![0f32; N_FF], vec![0f32; N_FF], vec![0f32; N_EMBD]);
        match ex.gate() {
            Some(gate) => {
                gate.expert(e).apply(x, &mut g).unwrap();
                ex.up().expert(e).apply(x, &mut u).unwrap();
            }
            None => ex.up().expert(e).apply(x, &mut g).unwrap(),
        }
        act.apply(&mut g, &u);
        ex.down().expert(e).apply(&g, &mut y).unwrap();
        for (o, v) in out.iter_mut().zip(&y) {
            *o = if i == 0 { v * w } else { *o + v * w };
        }
    }
    out
}

/// The same in plain f32 arithmetic on dequantized weights (no activation quantization).
fn dequantized(m: &Model, c: &RouterConfig, x: &[f32]) -> Vec<f32> {
    let ex = m.experts(Activation::SwiGlu);
    let mut logits = vec![0f32; N_EXPERT];
    m.gate_inp().apply_dequantized(x, &mut logits).unwrap();
    let mut sel = Vec::new();
    route(c, &logits, None, &mut sel);
    let mut out = vec![0f32; N_EMBD];
    for &(e, w) in &sel {
        let (mut g, mut u, mut y) = (vec![0f32; N_FF], vec![0f32; N_FF], vec![0f32; N_EMBD]);
        ex.gate()
            .unwrap()
            .expert(e)
            .apply_dequantized(x, &mut g)
            .unwrap();
        ex.up().expert(e).apply_dequantized(x, &mut u).unwrap();
        g.iter_mut()
            .zip(&u)
            .for_each(|(g, u)| *g = numerics::silu(*g) * u);
        ex.down().expert(e).apply_dequantized(&g, &mut y).unwrap();
        out.iter_mut().zip(&y).for_each(|(o, v)| *o += v * w);
    }
    out
}

fn run(
    m: &Model,
    c: &RouterConfig,
    act: Activation,
    x: &[f32],
    bias: Option<&[f32]>,
) -> (Vec<f32>, Vec<(usize, f32)>) {
    let mut logits = Vec::new();
    router_logits(&m.gate_inp(), x, &mut logits).unwrap();
    let mut out = vec![f32::NAN; x.len()];
    let mut scratch = MoeScratch::default();
    moe_ffn(c, &m.experts(act), x, &logits, bias, &mut out, &mut scratch).unwrap();
    (out, scratch.routes)
}

#[test]
fn batch_equals_per_token_bit_for_bit() {
    let m = Model::new(1);
    let n_tokens = 13;
    let x = inputs(2, n_tokens);
    for c in configs() {
        for act in [Activation::SwiGlu, Activation::GeGlu, Activation::Gelu] {
            for bias in [None, Some(m.bias.as_slice())] {
                let (batch, _) = run(&m, &c, act, &x, bias);
                for (t, xt) in x.chunks_exact(N_EMBD).enumerate() {
                    let want = per_token(&m, &c, act, xt, bias);
                    let (alone, _) = run(&m, &c, act, xt, bias);
                    let got = &batch[t * N_EMBD..(t + 1) * N_EMBD];
                    assert_eq!(
                        got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "{c:?} {act:?} token {t}: batch vs per-token reference"
                    );
                    assert_eq!(
                        alone.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "{c:?} {act:?} token {t}: decode vs per-token reference"
                    );
                }
            }
        }
    }
}

#[test]
fn close_to_dequantized_f32_reference() {
    let m = Model::new(3);
    let x = inputs(4, 5);
    for c in configs() {
        let (got, _) = run(&m, &c, Activation::SwiGlu, &x, None);
        for (t, xt) in x.chunks_exact(N_EMBD).enumerate() {
            let want = dequantized(&m, &c, xt);
            let scale = want.iter().map(|v| v.abs()).fold(0f32, f32::max).max(1e-3);
            for (g, w) in got[t * N_EMBD..].iter().zip(&want) {
                assert!((g - w).abs() <= 0.03 * scale, "{c:?} token {t}: {g} vs {w}");
            }
        }
    }
}

#[test]
fn unselected_experts_are_never_read() {
    let clean = Model::new(5);
    for n_tokens in [1, 3] {
        let x = inputs(6 + n_tokens as u64, n_tokens);
        for c in configs() {
            let (want, routes) = run(&clean, &c, Activation::SwiGlu, &x, None);
            let mut used = [false; N_EXPERT];
            routes.iter().for_each(|&(e, _)| used[e] = true);
            assert!(used.iter().any(|u| !u), "test needs an unselected expert");
            // 0xFF bytes make every block scale an f16 NaN: any read poisons the output.
            let mut poisoned = Model::new(5);
            for bytes in [&mut poisoned.gate, &mut poisoned.up, &mut poisoned.down] {
                let per = bytes.len() / N_EXPERT;
                for (e, slab) in bytes.chunks_exact_mut(per).enumerate() {
                    if !used[e] {
                        slab.fill(0xFF);
                    }
                }
            }
            let (got, _) = run(&poisoned, &c, Activation::SwiGlu, &x, None);
            assert!(got.iter().all(|v| v.is_finite()));
            assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
        }
    }
}

#[test]
fn expert_views_address_their_slab() {
    let m = Model::new(9);
    let ex = m.experts(Activation::SwiGlu);
    let per = m.down.len() / N_EXPERT;
    for e in [0, 5, N_EXPERT - 1] {
        let w = ex.down().expert(e);
        assert_eq!((w.rows(), w.cols()), (N_EMBD, N_FF));
        assert_eq!(w.row_bytes(0).as_ptr(), m.down[e * per..].as_ptr());
    }
    assert!(ExpertTensor::new(TY[0], [N_EMBD, N_FF, N_EXPERT + 1], &m.gate).is_err());
    let gate = ExpertTensor::new(TY[0], [N_EMBD, N_FF, N_EXPERT], &m.gate).unwrap();
    let up = ExpertTensor::new(TY[1], [N_EMBD, N_FF, N_EXPERT], &m.up).unwrap();
    assert!(MoeExperts::new(gate, up, up, Activation::SwiGlu).is_err());
}

#[test]
fn row_ranges_view_part_of_each_expert() {
    // A fused gate/up tensor: each expert's N_FF gate rows, then its N_FF up rows.
    let mut rng = StdRng::seed_from_u64(11);
    let fused = stacked(&mut rng, TY[1], N_EMBD, 2 * N_FF, N_EXPERT);
    let all = ExpertTensor::new(TY[1], [N_EMBD, 2 * N_FF, N_EXPERT], &fused).unwrap();
    let (gate, up) = (
        all.row_range(0, N_FF).unwrap(),
        all.row_range(N_FF, N_FF).unwrap(),
    );
    let rb = row_byte_len(TY[1], N_EMBD).unwrap();
    for e in [0, 7, N_EXPERT - 1] {
        let (g, u) = (gate.expert(e), up.expert(e));
        assert_eq!((g.rows(), u.rows(), g.cols()), (N_FF, N_FF, N_EMBD));
        assert_eq!(g.row_bytes(0).as_ptr(), fused[e * 2 * N_FF * rb..].as_ptr());
        assert_eq!(
            u.row_bytes(3).as_ptr(),
            fused[(e * 2 * N_FF + N_FF + 3) * rb..].as_ptr()
        );
    }
    assert!(all.row_range(N_FF, N_FF + 1).is_err());
    assert!(MoeExperts::new(
        gate,
        up,
        ExpertTensor::new(
            TY[1],
            [N_FF, N_EMBD, N_EXPERT],
            &stacked(&mut rng, TY[1], N_FF, N_EMBD, N_EXPERT)
        )
        .unwrap(),
        Activation::SwiGlu
    )
    .is_ok());
}

#[test]
fn shared_expert_with_sigmoid_gate() {
    let mut rng = StdRng::seed_from_u64(11);
    let n_ff = 64;
    let gate = stacked(&mut rng, GgmlType::Q8_0, N_EMBD, n_ff, 1);
    let up = stacked(&mut rng, GgmlType::Q8_0, N_EMBD, n_ff, 1);
    let down = stacked(&mut rng, GgmlType::Q8_0, n_ff, N_EMBD, 1);
    let gi = stacked(&mut rng, GgmlType::F32, N_EMBD, 1, 1);
    let mat = |b: &'static [u8], r, c| WeightMatrix::new(GgmlType::Q8_0, r, c, b).unwrap();
    let (gate, up, down, gi): (&'static [u8], &'static [u8], &'static [u8], &'static [u8]) = (
        Box::leak(gate.into_boxed_slice()),
        Box::leak(up.into_boxed_slice()),
        Box::leak(down.into_boxed_slice()),
        Box::leak(gi.into_boxed_slice()),
    );
    let sh = SharedExpert {
        gate: mat(gate, n_ff, N_EMBD),
        up: mat(up, n_ff, N_EMBD),
        down: mat(down, N_EMBD, n_ff),
        activation: Activation::SwiGlu,
        gate_inp: Some(WeightMatrix::new(GgmlType::F32, 1, N_EMBD, gi).unwrap()),
    };
    let x = inputs(12, 4);
    let base: Vec<f32> = (0..x.len()).map(|i| i as f32 * 1e-3).collect();
    let mut out = base.clone();
    sh.forward_add(&x, &mut out, &mut MoeScratch::default())
        .unwrap();
    for (t, xt) in x.chunks_exact(N_EMBD).enumerate() {
        let (mut g, mut u, mut y, mut l) = (
            vec![0f32; n_ff],
            vec![0f32; n_ff],
            vec![0f32; N_EMBD],
            [0f32],
        );
        sh.gate.apply(xt, &mut g).unwrap();
        sh.up.apply(xt, &mut u).unwrap();
        swiglu(&mut g, &u);
        sh.down.apply(&g, &mut y).unwrap();
        sh.gate_inp.unwrap().apply(xt, &mut l).unwrap();
        let s = shared_expert_gate(l[0]);
        assert!((s - numerics::sigmoid(l[0])).abs() < 1e-6);
        for i in 0..N_EMBD {
            let want = base[t * N_EMBD + i] + y[i] * s;
            assert_eq!(out[t * N_EMBD + i].to_bits(), want.to_bits());
        }
    }
    assert!(shared_expert_gate(0.0).is_nan());
}

/// Each expert of `bytes` (`n` stacked `rows × cols` matrices of `ty`) packed.
fn packed_experts(
    ty: GgmlType,
    bytes: &[u8],
    rows: usize,
    cols: usize,
    n: usize,
) -> Vec<PackedMatrix> {
    let per = bytes.len() / n;
    bytes
        .chunks_exact(per)
        .map(|e| PackedMatrix::pack(ty, rows, cols, e, |_| {}).unwrap())
        .collect()
}

#[test]
fn attached_shared_expert_equals_adding_it_after() {
    let m = Model::new(21);
    let mut rng = StdRng::seed_from_u64(22);
    let n_ff = 96;
    // The shared expert quantizes its activations differently from the routed gate (Q8_0
    // vs Q8_K), so both sets of buffers are exercised.
    let sh_gate = stacked(&mut rng, GgmlType::Q8_0, N_EMBD, n_ff, 1);
    let sh_up = stacked(&mut rng, GgmlType::Q4_0, N_EMBD, n_ff, 1);
    let sh_down = stacked(&mut rng, GgmlType::Q8_0, n_ff, N_EMBD, 1);
    let sh_gi = stacked(&mut rng, GgmlType::F32, N_EMBD, 1, 1);
    let packs: &'static [Vec<PackedMatrix>; 6] = Box::leak(Box::new([
        packed_experts(TY[0], &m.gate, N_FF, N_EMBD, N_EXPERT),
        packed_experts(TY[1], &m.up, N_FF, N_EMBD, N_EXPERT),
        packed_experts(TY[2], &m.down, N_EMBD, N_FF, N_EXPERT),
        packed_experts(GgmlType::Q8_0, &sh_gate, n_ff, N_EMBD, 1),
        packed_experts(GgmlType::Q4_0, &sh_up, n_ff, N_EMBD, 1),
        packed_experts(GgmlType::Q8_0, &sh_down, N_EMBD, n_ff, 1),
    ]));
    let c = &configs()[0];
    for packed in [false, true] {
        for gated in [false, true] {
            let mat = |ty, b: &'static [u8], r, c, p: &'static PackedMatrix| {
                let w = WeightMatrix::new(ty, r, c, b).unwrap();
                if packed {
                    w.with_packed(p).unwrap()
                } else {
                    w
                }
            };
            let leak = |v: &Vec<u8>| -> &'static [u8] { Box::leak(v.clone().into_boxed_slice()) };
            let sh = SharedExpert {
                gate: mat(GgmlType::Q8_0, leak(&sh_gate), n_ff, N_EMBD, &packs[3][0]),
                up: mat(GgmlType::Q4_0, leak(&sh_up), n_ff, N_EMBD, &packs[4][0]),
                down: mat(GgmlType::Q8_0, leak(&sh_down), N_EMBD, n_ff, &packs[5][0]),
                activation: Activation::SwiGlu,
                gate_inp: gated
                    .then(|| WeightMatrix::new(GgmlType::F32, 1, N_EMBD, leak(&sh_gi)).unwrap()),
            };
            let experts = if packed {
                MoeExperts::new(
                    ExpertTensor::new(TY[0], [N_EMBD, N_FF, N_EXPERT], &m.gate)
                        .unwrap()
                        .with_packed(&packs[0])
                        .unwrap(),
                    ExpertTensor::new(TY[1], [N_EMBD, N_FF, N_EXPERT], &m.up)
                        .unwrap()
                        .with_packed(&packs[1])
                        .unwrap(),
                    ExpertTensor::new(TY[2], [N_FF, N_EMBD, N_EXPERT], &m.down)
                        .unwrap()
                        .with_packed(&packs[2])
                        .unwrap(),
                    Activation::SwiGlu,
                )
                .unwrap()
            } else {
                m.experts(Activation::SwiGlu)
            };
            // One token (every expert in one chunk, the shared expert joining its passes),
            // a few, and enough that the experts run in several chunks (the shared expert
            // alone).
            for n_tokens in [1, 3, 40] {
                let x = inputs(23 + n_tokens as u64, n_tokens);
                let mut logits = Vec::new();
                router_logits(&m.gate_inp(), &x, &mut logits).unwrap();
                let mut want = vec![0f32; x.len()];
                let mut s = MoeScratch::default();
                moe_ffn(c, &experts, &x, &logits, Some(&m.bias), &mut want, &mut s).unwrap();
                sh.forward_add(&x, &mut want, &mut s).unwrap();
                let mut got = vec![f32::NAN; x.len()];
                let attached = experts.with_shared(Some(sh));
                moe_ffn(
                    c,
                    &attached,
                    &x,
                    &logits,
                    Some(&m.bias),
                    &mut got,
                    &mut MoeScratch::default(),
                )
                .unwrap();
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "packed {packed} gated {gated} n {n_tokens}"
                );
                // The shared expert did contribute.
                let mut routed = vec![0f32; x.len()];
                moe_ffn(c, &experts, &x, &logits, Some(&m.bias), &mut routed, &mut s).unwrap();
                assert_ne!(bits(&routed), bits(&got));
            }
        }
    }
}

/// Counts what an [`ExpertCache`] asks of the pages its experts live in.
#[derive(Default)]
struct PageLog {
    prefetched: AtomicU64,
    released: AtomicU64,
}

impl MappedPages for PageLog {
    fn prefetch(&self, bytes: &[u8]) {
        self.prefetched
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
    }

    fn release(&self, bytes: &[u8]) {
        self.released
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
    }
}

/// Each model's gate, up and down experts, packed.
fn layer_packs(models: &[Model]) -> Vec<[Vec<PackedMatrix>; 3]> {
    models
        .iter()
        .map(|m| {
            [
                packed_experts(TY[0], &m.gate, N_FF, N_EMBD, N_EXPERT),
                packed_experts(TY[1], &m.up, N_FF, N_EMBD, N_EXPERT),
                packed_experts(TY[2], &m.down, N_EMBD, N_FF, N_EXPERT),
            ]
        })
        .collect()
}

/// The experts of `m`, each packed (as a model whose experts all fit in memory has them).
fn packed_model_experts<'a>(
    m: &'a Model,
    packs: &'a [Vec<PackedMatrix>; 3],
    act: Activation,
) -> MoeExperts<'a> {
    let up = ExpertTensor::new(TY[1], [N_EMBD, N_FF, N_EXPERT], &m.up)
        .unwrap()
        .with_packed(&packs[1])
        .unwrap();
    let down = ExpertTensor::new(TY[2], [N_FF, N_EMBD, N_EXPERT], &m.down)
        .unwrap()
        .with_packed(&packs[2])
        .unwrap();
    if act == Activation::Gelu {
        return MoeExperts::ungated(up, down, act).unwrap();
    }
    let gate = ExpertTensor::new(TY[0], [N_EMBD, N_FF, N_EXPERT], &m.gate)
        .unwrap()
        .with_packed(&packs[0])
        .unwrap();
    MoeExperts::new(gate, up, down, act).unwrap()
}

#[test]
fn streamed_experts_equal_packed_ones_bit_for_bit_at_any_cache_size() {
    // Two layers (two models) share one cache, each under its own key.
    let models = [Model::new(31), Model::new(32)];
    let packs = layer_packs(&models);
    let c = &configs()[0];
    let slot_bytes = packs[0].iter().map(|p| p[0].n_bytes() as u64).sum();
    for act in [Activation::SwiGlu, Activation::Gelu] {
        for capacity in [1, 2, 3, 5, 2 * N_EXPERT] {
            let cache = ExpertCache::new(capacity, slot_bytes);
            let pages = PageLog::default();
            let mut uses = 0u64;
            for round in 0..2 {
                for n_tokens in [1, 3, 40] {
                    for (layer, m) in models.iter().enumerate() {
                        let x = inputs(40 + n_tokens as u64 + layer as u64, n_tokens);
                        let mut logits = Vec::new();
                        router_logits(&m.gate_inp(), &x, &mut logits).unwrap();
                        let mut want = vec![0f32; x.len()];
                        let mut s = MoeScratch::default();
                        let packed = packed_model_experts(m, &packs[layer], act);
                        moe_ffn(c, &packed, &x, &logits, None, &mut want, &mut s).unwrap();
                        let mut assigned: Vec<usize> = s.routes.iter().map(|r| r.0).collect();
                        assigned.sort_unstable();
                        assigned.dedup();
                        // Each expert used is asked for once (in the one chunk it is in).
                        let streamed = m.experts(act).with_cache(CachedExperts {
                            cache: &cache,
                            layer,
                            pages: &pages,
                        });
                        let before = cache.stats();
                        let mut got = vec![f32::NAN; x.len()];
                        moe_ffn(c, &streamed, &x, &logits, None, &mut got, &mut s).unwrap();
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!(
                            bits(&got),
                            bits(&want),
                            "{act:?} capacity {capacity} round {round} n {n_tokens} layer {layer}"
                        );
                        let after = cache.stats();
                        let asked = (after.hits + after.misses) - (before.hits + before.misses);
                        assert_eq!(asked, assigned.len() as u64, "uses of {assigned:?}");
                        uses += asked;
                        assert!(after.filled <= capacity);
                    }
                }
            }
            let stats = cache.stats();
            assert_eq!(stats.hits + stats.misses, uses);
            assert!(stats.misses > 0);
            if capacity == 2 * N_EXPERT {
                // Everything fits: each expert of each layer was packed once at most.
                assert!(stats.misses <= 2 * N_EXPERT as u64, "{stats:?}");
            }
            // Each miss read its expert's matrices from the pages and let them go.
            let per_expert = |m: &Model| {
                let gated = act != Activation::Gelu;
                ((m.up.len() + m.down.len() + if gated { m.gate.len() } else { 0 }) / N_EXPERT)
                    as u64
            };
            assert_eq!(stats.bytes_read, stats.misses * per_expert(&models[0]));
            assert_eq!(pages.released.load(Ordering::Relaxed), stats.bytes_read);
            assert!(pages.prefetched.load(Ordering::Relaxed) > 0);
        }
    }
}

/// A layer linked to the next one asks for the pages of the experts the next layer's router
/// picks for its input (decode-sized steps only), the next layer counts those it then uses,
/// and neither layer's results change.
#[test]
fn layers_ask_ahead_for_the_next_layers_experts() {
    let models = [Model::new(41), Model::new(42)];
    let packs = layer_packs(&models);
    let c = &configs()[0];
    let act = Activation::SwiGlu;
    let slot_bytes = packs[0].iter().map(|p| p[0].n_bytes() as u64).sum();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let per_expert =
        ((models[1].gate.len() + models[1].up.len() + models[1].down.len()) / N_EXPERT) as u64;
    for n_tokens in [1, 3, 40] {
        let cache = ExpertCache::new(2, slot_bytes);
        let pages = PageLog::default();
        let streamed = |layer: usize| {
            models[layer].experts(act).with_cache(CachedExperts {
                cache: &cache,
                layer,
                pages: &pages,
            })
        };
        let next_router = models[1].gate_inp();
        let next = streamed(1);
        let first = streamed(0).with_lookahead(Lookahead {
            gate_inp: &next_router,
            selection_bias: None,
            experts: &next,
        });
        let x = inputs(70 + n_tokens as u64, n_tokens);
        let mut s = MoeScratch::default();
        // What the next layer's router picks for x: the experts it will use on x.
        let mut next_logits = Vec::new();
        router_logits(&next_router, &x, &mut next_logits).unwrap();
        let mut want_next = vec![0f32; x.len()];
        let packed_next = packed_model_experts(&models[1], &packs[1], act);
        moe_ffn(
            c,
            &packed_next,
            &x,
            &next_logits,
            None,
            &mut want_next,
            &mut s,
        )
        .unwrap();
        let mut picked: Vec<usize> = s.routes.iter().map(|r| r.0).collect();
        picked.sort_unstable();
        picked.dedup();

        let mut logits = Vec::new();
        router_logits(&models[0].gate_inp(), &x, &mut logits).unwrap();
        let mut want = vec![0f32; x.len()];
        let packed_first = packed_model_experts(&models[0], &packs[0], act);
        moe_ffn(c, &packed_first, &x, &logits, None, &mut want, &mut s).unwrap();
        let mut own: Vec<usize> = s.routes.iter().map(|r| r.0).collect();
        own.sort_unstable();
        own.dedup();

        let mut got = vec![f32::NAN; x.len()];
        moe_ffn(c, &first, &x, &logits, None, &mut got, &mut s).unwrap();
        assert_eq!(bits(&got), bits(&want), "n {n_tokens}");
        let stats = cache.stats();
        let own_bytes = own.len() as u64 * per_expert;
        let prefetched = pages.prefetched.load(Ordering::Relaxed);
        if n_tokens <= 16 {
            // Nothing of layer 1 was cached: every pick was asked for.
            assert_eq!(stats.ahead_asked, picked.len() as u64, "n {n_tokens}");
            assert_eq!(prefetched, own_bytes + picked.len() as u64 * per_expert);
        } else {
            assert_eq!(stats.ahead_asked, 0, "n {n_tokens}");
            assert_eq!(prefetched, own_bytes);
        }
        assert_eq!(stats.ahead_used, 0);

        // The next layer on the same input uses exactly what was asked for.
        let mut got_next = vec![f32::NAN; x.len()];
        moe_ffn(c, &next, &x, &next_logits, None, &mut got_next, &mut s).unwrap();
        assert_eq!(bits(&got_next), bits(&want_next), "n {n_tokens}");
        assert_eq!(cache.stats().ahead_used, cache.stats().ahead_asked);
    }
}
