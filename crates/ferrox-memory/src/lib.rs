//! Sequence memory that knows no model: paged stores of cached rows in shared,
//! reference-counted blocks ([`paged_kv`], [`block_manager`], with a prefix cache) and
//! recurrent states, behind one interface ([`memory`]) every engine uses.

pub mod block_manager;
pub mod memory;
pub mod paged_kv;
mod rows;

pub use block_manager::{BlockManager, BlockUsage, CachedPrefix};
pub use memory::{
    Admission, MemoryError, MemoryShape, MemorySpec, PagedStoreSpec, RecurrentSpec, Refusal, SeqId,
    SequenceMemory, StepMemory,
};
pub use paged_kv::{BlockId, BlockTable, PagedKv};
