//! KV memory for the scheduler: which sequence holds which cache, what each cache holds,
//! and prefix reuse.
//!
//! This version keeps one [`DecoderState`] per slot (`--parallel` slots of `--ctx-size`
//! positions each), as llama-server does: a new request takes the free slot whose cached
//! tokens share the longest prefix with its prompt, the cache is cut back to that prefix and
//! only the rest is prefilled. The scheduler only sees [`KvPool`]'s methods (acquire,
//! forward, logits, release), so a paged pool with shared, refcounted prefix blocks can
//! replace it without touching the scheduling.

use ferrox_models::decoder::SequenceStep;
use ferrox_models::tokenizer::TokenId;
use ferrox_models::{Decoder, DecoderState, Engine, EngineError, LogitsFor};

/// A sequence's hold on KV memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotId(usize);

impl SlotId {
    pub fn index(self) -> usize {
        self.0
    }
}

struct Slot {
    state: DecoderState,
    /// The tokens whose keys and values `state` holds, in order.
    tokens: Vec<TokenId>,
    busy: bool,
    /// When the slot was last released (for least-recently-used choice among equals).
    last_used: u64,
}

/// A slot handed out by [`KvPool::acquire`].
#[derive(Clone, Copy, Debug)]
pub struct Lease {
    pub slot: SlotId,
    /// Leading prompt tokens already in the cache (not to be prefilled again).
    pub reused: usize,
}

/// One sequence's part of a [`KvPool::forward`] step.
pub struct Work<'a> {
    pub slot: SlotId,
    pub tokens: &'a [TokenId],
    /// Whether the last token's logits are needed.
    pub logits: bool,
}

pub struct KvPool {
    slots: Vec<Slot>,
    n_ctx: usize,
    clock: u64,
    bytes_per_position: usize,
}

impl KvPool {
    pub fn new(decoder: &Decoder, n_slots: usize) -> KvPool {
        let slots: Vec<Slot> = (0..n_slots.max(1))
            .map(|_| Slot {
                state: decoder.new_state(),
                tokens: Vec::new(),
                busy: false,
                last_used: 0,
            })
            .collect();
        let bytes_per_position = slots[0].state.kv_cache().bytes_per_position();
        KvPool {
            slots,
            n_ctx: decoder.context_size(),
            clock: 0,
            bytes_per_position,
        }
    }

    /// Positions one sequence can hold.
    pub fn capacity_per_sequence(&self) -> usize {
        self.n_ctx
    }

    pub fn n_slots(&self) -> usize {
        self.slots.len()
    }

    pub fn has_free(&self) -> bool {
        self.slots.iter().any(|s| !s.busy)
    }

    /// Bytes reserved for all caches.
    pub fn reserved_bytes(&self) -> usize {
        self.bytes_per_position * self.n_ctx * self.slots.len()
    }

    /// Positions held by busy slots, and the total.
    pub fn usage(&self) -> (usize, usize) {
        let used = self
            .slots
            .iter()
            .filter(|s| s.busy)
            .map(|s| s.state.len())
            .sum();
        (used, self.n_ctx * self.slots.len())
    }

    /// Takes the free slot sharing the longest prefix with `prompt` (the least recently used
    /// among equals) and cuts its cache back to that prefix. At least one prompt token is
    /// always left to prefill, since the next-token logits come from it.
    pub fn acquire(&mut self, prompt: &[TokenId]) -> Option<Lease> {
        let mut best: Option<(usize, usize)> = None;
        for (i, slot) in self.slots.iter().enumerate() {
            if slot.busy {
                continue;
            }
            let common = common_prefix(&slot.tokens, prompt).min(prompt.len().saturating_sub(1));
            let better = match best {
                None => true,
                Some((b, bc)) => {
                    common > bc || (common == bc && slot.last_used < self.slots[b].last_used)
                }
            };
            if better {
                best = Some((i, common));
            }
        }
        let (i, reused) = best?;
        let slot = &mut self.slots[i];
        slot.busy = true;
        slot.state.truncate(reused);
        slot.tokens.truncate(reused);
        Some(Lease {
            slot: SlotId(i),
            reused,
        })
    }

    /// Gives the slot back; its cache stays for later prefix reuse.
    pub fn release(&mut self, id: SlotId) {
        self.clock += 1;
        let slot = &mut self.slots[id.0];
        slot.busy = false;
        slot.last_used = self.clock;
    }

    /// Forgets what a slot holds (after a failed step, whose effect on it is unknown).
    pub fn reset(&mut self, id: SlotId) {
        let slot = &mut self.slots[id.0];
        slot.state.truncate(0);
        slot.tokens.clear();
    }

    /// Positions the slot's cache holds.
    pub fn len(&self, id: SlotId) -> usize {
        self.slots[id.0].state.len()
    }

    /// Runs one batched step: each entry's tokens are appended to its slot's cache.
    pub fn forward(&mut self, decoder: &Decoder, work: &[Work<'_>]) -> Result<(), EngineError> {
        let mut steps: Vec<SequenceStep<'_>> = Vec::with_capacity(work.len());
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if let Some(w) = work.iter().find(|w| w.slot.0 == i) {
                steps.push(SequenceStep {
                    tokens: w.tokens,
                    state: &mut slot.state,
                    logits: if w.logits {
                        LogitsFor::Last
                    } else {
                        LogitsFor::From(w.tokens.len())
                    },
                });
            }
        }
        if steps.is_empty() {
            return Ok(());
        }
        decoder.forward_many(&mut steps)?;
        drop(steps);
        for w in work {
            self.slots[w.slot.0].tokens.extend_from_slice(w.tokens);
        }
        Ok(())
    }

    /// The next-token logits of the slot's last step (when it asked for them).
    pub fn logits(&self, id: SlotId) -> &[f32] {
        self.slots[id.0].state.logits()
    }
}

fn common_prefix(a: &[TokenId], b: &[TokenId]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::common_prefix;

    #[test]
    fn common_prefix_counts_equal_leading_tokens() {
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 4]), 2);
        assert_eq!(common_prefix(&[], &[1]), 0);
        assert_eq!(common_prefix(&[1, 2], &[1, 2, 3]), 2);
    }
}
