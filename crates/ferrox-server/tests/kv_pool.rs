//! The paged KV pool's bookkeeping on the default model: admission promises blocks and
//! allocates them as sequences grow, finished sequences leave their full blocks cached,
//! later prompts reuse them (with the same logits as computing everything), and requests
//! that cannot fit now wait while those that can never fit are told so.

use ferrox_models::EngineExt;
use ferrox_models::{AnyEngine, EngineOptions, LogitsFor};
use ferrox_server::kv::{KvPool, Refusal, Work, BLOCK_TOKENS};

fn decoder(n_ctx: usize) -> AnyEngine {
    let path = ferrox_models::default_model_path();
    assert!(
        path.is_file(),
        "{} is missing: run scripts/fetch-model.sh",
        path.display()
    );
    let options = EngineOptions {
        n_ctx,
        threads: 2,
        ..EngineOptions::default()
    };
    AnyEngine::open(&path, &options).expect("engine")
}

/// Token ids that are ordinary words in Gemma's vocabulary.
fn tokens(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| 1000 + (seed * 37 + i * 11) % 5000)
        .collect()
}

#[test]
fn blocks_are_promised_allocated_cached_and_reused() {
    let d = decoder(64);
    let mut pool = KvPool::new(&d, 6, 2).unwrap();
    assert_eq!(pool.n_blocks(), 6);

    // 40 prompt tokens that may grow to 48 positions: three blocks promised, none used yet.
    let a = tokens(1, 40);
    let lease = pool.acquire(&a, 48, None).unwrap();
    assert_eq!(lease.reused, 0);
    assert_eq!(pool.usage().used, 0);
    let work = [Work {
        slot: lease.slot,
        tokens: &a,
        logits: true,
        embeddings: false,
        given: None,
        position_shift: 0,
    }];
    pool.forward(&d, &work).unwrap();
    assert_eq!(pool.usage().used, 3);
    assert_eq!(pool.len(lease.slot), 40);

    // The same logits as a contiguous cache.
    let mut state = d.new_state().unwrap();
    let want = d
        .forward_batch(&a, 0, &mut state, LogitsFor::Last)
        .unwrap()
        .to_vec();
    assert_eq!(pool.logits(lease.slot), &want[..]);

    // Released: the two full blocks stay cached, the partial one is freed.
    pool.release(lease.slot);
    let usage = pool.usage();
    assert_eq!((usage.used, usage.cached, usage.free), (0, 2, 4));

    // A prompt sharing the first 35 tokens reuses the first two blocks only, and its logits
    // equal a full recomputation.
    let mut b = a[..35].to_vec();
    b.extend(tokens(2, 10));
    let lease = pool.acquire(&b, 45, None).unwrap();
    assert_eq!(lease.reused, 2 * BLOCK_TOKENS);
    let rest = &b[lease.reused..];
    pool.forward(
        &d,
        &[Work {
            slot: lease.slot,
            tokens: rest,
            logits: true,
            embeddings: false,
            given: None,
            position_shift: 0,
        }],
    )
    .unwrap();
    let mut state = d.new_state().unwrap();
    let want = d
        .forward_batch(&b, 0, &mut state, LogitsFor::Last)
        .unwrap()
        .to_vec();
    assert_eq!(pool.logits(lease.slot), &want[..]);

    // The other slot: this prompt may need four blocks but only three are left while b
    // runs; it waits (Busy) until b is released.
    let c = tokens(3, 20);
    assert_eq!(pool.check(&c, 64, None), Err(Refusal::Busy));
    pool.release(lease.slot);
    assert_eq!(pool.check(&c, 64, None), Ok(()));

    // More than the whole pool can hold is refused for good; no free slot means Busy.
    let small = KvPool::new(&d, 3, 1).unwrap();
    assert!(matches!(
        small.check(&tokens(4, 60), 64, None),
        Err(Refusal::TooLarge { .. })
    ));
    let mut one = KvPool::new(&d, 8, 1).unwrap();
    let held = one.acquire(&tokens(5, 4), 8, None).unwrap();
    assert_eq!(one.check(&tokens(6, 4), 8, None), Err(Refusal::Busy));
    one.release(held.slot);
    assert_eq!(one.check(&tokens(6, 4), 8, None), Ok(()));
}

/// vLLM's `cache_salt`: a prefix computed under one salt is reused only by requests with
/// the same salt (so cached tokens tell one tenant nothing about another's prompts).
#[test]
fn prefixes_are_shared_only_within_one_cache_salt() {
    let d = decoder(64);
    let mut pool = KvPool::new(&d, 8, 2).unwrap();
    let a = tokens(7, 40);
    let lease = pool.acquire(&a, 48, Some("alice")).unwrap();
    pool.forward(
        &d,
        &[Work {
            slot: lease.slot,
            tokens: &a,
            logits: true,
            embeddings: false,
            given: None,
            position_shift: 0,
        }],
    )
    .unwrap();
    pool.release(lease.slot);
    for (salt, reused) in [
        (Some("bob"), 0),
        (None, 0),
        (Some("alice"), 2 * BLOCK_TOKENS),
    ] {
        let lease = pool.acquire(&a, 48, salt).unwrap();
        assert_eq!(lease.reused, reused, "{salt:?}");
        pool.release(lease.slot);
    }
}
