//! Decoding a token allocates nothing: every buffer a step needs is kept from the steps
//! before. A counting global allocator watches every thread (the decoder's workers too)
//! while the default model decodes, once the first steps have sized the buffers.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use ferrox_models::sampling::argmax;
use ferrox_models::{Engine, LogitsFor};

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller's layout contract is passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn decoding_a_token_allocates_nothing() {
    let decoder = common::gemma_decoder(256, 2);
    let prompt = common::gemma_tokenizer().encode("Once upon a time", true, false);
    let mut state = decoder.new_state();
    let mut next = argmax(
        decoder
            .forward_batch(&prompt, 0, &mut state, LogitsFor::Last)
            .unwrap(),
    );
    // Warm-up: buffers grow to their decode sizes, each worker makes its own state.
    for _ in 0..8 {
        let pos = state.len();
        next = argmax(decoder.forward_token(next, pos, &mut state).unwrap());
    }
    COUNTING.store(true, Ordering::SeqCst);
    for _ in 0..32 {
        let pos = state.len();
        next = argmax(decoder.forward_token(next, pos, &mut state).unwrap());
    }
    COUNTING.store(false, Ordering::SeqCst);
    let count = ALLOCATIONS.load(Ordering::SeqCst);
    assert_eq!(count, 0, "{count} heap allocations in 32 decoded tokens");
}
