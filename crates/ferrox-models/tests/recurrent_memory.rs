//! The sequence memory's recurrent state through the engine interface, with a toy recurrent
//! engine (its state a decaying sum of token vectors, its logits that state against fixed
//! vectors; checkpoints at every block end, as a recurrent engine takes them):
//!
//! - a sequence whose prompt starts with a cached prefix starts from the checkpoint published
//!   at that prefix's last block end and gets the same logits, bit for bit, as a cold run;
//! - rolling back where no checkpoint is is an error that changes nothing; to a checkpoint it
//!   reproduces the logits.

use std::sync::OnceLock;

use ferrox_core::KvStorage;
use ferrox_gguf::{Gguf, GgufWriter};
use ferrox_memory::{MemoryShape, MemorySpec, RecurrentSpec, SequenceMemory, StepMemory};
use ferrox_models::{
    step_sequences, Engine, EngineError, LogitsFor, SeqInput, SeqWork, StepScratch,
};

const DIM: usize = 4;
const VOCAB: usize = 16;
const BLOCK: usize = 8;

struct Toy;

fn vector(seed: usize) -> [f32; DIM] {
    std::array::from_fn(|i| ((seed * 7 + i * 3) % 11) as f32 / 11.0 - 0.4)
}

fn empty_gguf() -> &'static Gguf {
    static G: OnceLock<Gguf> = OnceLock::new();
    G.get_or_init(|| {
        let mut w = GgufWriter::new();
        w.set("general.architecture", "toy");
        Gguf::from_bytes(w.to_bytes()).unwrap()
    })
}

impl Engine for Toy {
    fn architecture(&self) -> &str {
        "toy"
    }

    fn gguf(&self) -> &Gguf {
        empty_gguf()
    }

    fn memory_spec(&self) -> MemorySpec {
        MemorySpec {
            paged: Vec::new(),
            recurrent: Some(RecurrentSpec {
                values: DIM,
                ring_slack: 0,
                step_checkpoints: 0,
            }),
            storage: KvStorage::F32,
            row_lag: 0,
        }
    }

    fn vocab_size(&self) -> usize {
        VOCAB
    }

    fn embedding_size(&self) -> usize {
        DIM
    }

    fn context_size(&self) -> usize {
        128
    }

    fn threads(&self) -> usize {
        1
    }

    fn weight_bytes_per_token(&self) -> u64 {
        0
    }

    fn new_scratch(&self) -> StepScratch {
        StepScratch::new(())
    }

    fn step(
        &self,
        memory: &mut StepMemory<'_>,
        _scratch: &mut StepScratch,
        seqs: &[SeqInput<'_>],
        logits: &mut [&mut Vec<f32>],
    ) -> Result<(), EngineError> {
        for (i, input) in seqs.iter().enumerate() {
            let wanted = input.logits.range(input.tokens.len());
            logits[i].clear();
            let start = memory.len(i);
            for (k, &t) in input.tokens.iter().enumerate() {
                let e = vector(t as usize);
                let state = memory.state(i);
                for (s, x) in state.iter_mut().zip(e) {
                    *s = *s * 0.75 + x;
                }
                let pos = start + k + 1;
                memory.advance(i, pos);
                if pos.is_multiple_of(memory.block_tokens()) {
                    memory.checkpoint(i, pos);
                }
                if wanted.contains(&k) {
                    let state: [f32; DIM] = memory.state(i).try_into().unwrap();
                    logits[i].extend((0..VOCAB).map(|v| {
                        vector(v + 100)
                            .iter()
                            .zip(state)
                            .map(|(a, b)| a * b)
                            .sum::<f32>()
                    }));
                }
            }
        }
        Ok(())
    }
}

fn memory() -> SequenceMemory {
    SequenceMemory::new(
        Toy.memory_spec(),
        MemoryShape {
            n_blocks: 32,
            block_tokens: BLOCK,
            max_sequences: 4,
            n_ctx: 128,
            prefix_cache: true,
        },
    )
    .unwrap()
}

fn run(m: &mut SequenceMemory, seq: ferrox_memory::SeqId, tokens: &[u32]) -> Vec<f32> {
    let mut out = Vec::new();
    let work = [SeqWork {
        seq,
        tokens,
        logits: LogitsFor::Last,
        output: ferrox_models::Output::Logits,
        position_shift: 0,
    }];
    step_sequences(&Toy, m, &mut Toy.new_scratch(), &work, &mut [&mut out]).unwrap();
    out
}

#[test]
fn a_checkpointed_prefix_restores_bit_identical_logits() {
    let prompt: Vec<u32> = (0..21).map(|i| (i * 5 % VOCAB) as u32).collect();
    let mut m = memory();
    let cold = m.admit(&prompt, 40).unwrap();
    assert_eq!(cold.reused, 0);
    let want = run(&mut m, cold.seq, &prompt);
    m.release(cold.seq);

    // The same prompt again: the checkpoint at position 16 (two whole blocks) is reused.
    let warm = m.admit(&prompt, 40).unwrap();
    assert_eq!(warm.reused, 16);
    let got = run(&mut m, warm.seq, &prompt[warm.reused..]);
    assert!(got
        .iter()
        .zip(&want)
        .all(|(a, b)| a.to_bits() == b.to_bits()));
    assert_eq!(got.len(), VOCAB);

    // A prompt diverging inside the second block reuses only the first.
    let mut other = prompt.clone();
    other[10] = 3;
    let third = m.admit(&other, 40).unwrap();
    assert_eq!(third.reused, 8);
}

#[test]
fn a_recurrent_state_rolls_back_only_to_its_checkpoints() {
    let prompt: Vec<u32> = (0..12).map(|i| (i * 3 % VOCAB) as u32).collect();
    let mut m = memory();
    let a = m.admit(&[], 64).unwrap().seq;
    let after_prompt = run(&mut m, a, &prompt);
    let after_17 = run(&mut m, a, &[1, 2, 3, 4, 5]);
    assert_eq!(m.len(a), 17);
    // Position 12 is no block end: no checkpoint there.
    assert!(m.rollback(a, 12).is_err());
    assert_eq!(m.len(a), 17, "a refused rollback changes nothing");
    // Position 16 is: rolling back there and feeding the same token gives the same logits.
    m.rollback(a, 16).unwrap();
    assert_eq!(run(&mut m, a, &[5]), after_17);
    // So is 8: replaying the rest of the prompt gives its logits again.
    m.rollback(a, 8).unwrap();
    assert_eq!(run(&mut m, a, &prompt[8..]), after_prompt);
}
