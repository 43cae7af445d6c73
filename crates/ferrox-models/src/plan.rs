//! The memory planner: at load, which weights are packed into memory, which are used in
//! place from the mapped file, and whether the routed experts are streamed from the file
//! through a cache of packed copies.
//!
//! Everything but the routed experts (attention, norms, dense and shared FFNs, embeddings,
//! the output head) is read for every token, so it is packed first. The routed experts are
//! packed too when they fit the rest of the budget; otherwise a cache of as many packed
//! experts as fit serves them ([`ferrox_moe::ExpertCache`]), filled by use. Products go
//! through packed copies either way, so the tokens are the same at any budget.
//!
//! One exception: a packed form can be much larger than the file's (TQ1_0's by 22%, see
//! [`GROWTH_LIMIT`]). Where the other weights packed would not fit the budget but fit with
//! those matrices left as the file stores them, they stay in the file's layout and its
//! row-major kernels (other integer sums in their last bits), as llama.cpp runs them.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use ferrox_core::packed::PackedMatrix;
use ferrox_gguf::{DirectBuffer, GgmlType, Gguf, TensorInfo};
use ferrox_moe::ExpertCache;

use crate::engine::EngineOptions;
use crate::names::is_routed_experts;
use crate::ModelError;

/// Share of the memory available at load that the weights may take by default: the rest
/// is for the KV cache, activations and the system.
const DEFAULT_BUDGET_SHARE: f64 = 0.85;

/// A packed form more than this share larger than the file's is left out when the packed
/// weights would not fit the budget: TQ1_0's (1.22x; its five-values-per-byte codes are
/// unpacked into TQ2_0's groups), not the K-quants' few percent of unpacked scales.
pub const GROWTH_LIMIT: f64 = 1.1;

/// Whether a packed form of `packed` bytes exceeds [`GROWTH_LIMIT`] over the file's
/// `file_bytes`.
fn grows(packed: u64, file_bytes: u64) -> bool {
    packed as f64 > GROWTH_LIMIT * file_bytes as f64
}

/// Where the routed experts go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertPlacement {
    /// Packed into memory at load, like every other matrix (they fit).
    Packed,
    /// Left in the file; `slots` packed copies of the most used are cached.
    Streamed { slots: usize, slot_bytes: u64 },
    /// Used in place from the mapped file (no packed form for their type or shape, or
    /// repacking is off).
    Mapped,
}

/// What the planner decided for a file and a budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryPlan {
    /// Bytes the weights may take in memory.
    pub budget: u64,
    /// Whether the budget was given (`--memory-budget`) rather than read from the system.
    pub budget_given: bool,
    /// Bytes of the tensors other than the routed experts (all in memory, packed or not).
    pub dense_bytes: u64,
    /// Bytes of the dense matrices whose packed form exceeds [`GROWTH_LIMIT`] when they stay
    /// in the file's layout (packed, the dense weights would not fit the budget), else 0.
    pub growing_in_place_bytes: u64,
    /// Bytes of the routed experts in the file.
    pub expert_bytes: u64,
    /// Bytes the routed experts take packed (when their type and shape allow it).
    pub expert_packed_bytes: u64,
    pub experts: ExpertPlacement,
    /// Bytes left out of the default budget for one sequence's KV cache over the whole
    /// context ([`kv_reserve`]); 0 when the budget is given.
    pub kv_reserved: u64,
}

impl MemoryPlan {
    /// The plan for `gguf` under `options` (`memory_budget`, else a share of the memory the
    /// system has available).
    pub fn new(gguf: &Gguf, options: &EngineOptions) -> Result<MemoryPlan, ModelError> {
        let (budget, budget_given, kv_reserved) = match options.memory_budget {
            Some(b) => (b, true, 0),
            None => {
                let kv = kv_reserve(gguf, options);
                (default_budget().saturating_sub(kv), false, kv)
            }
        };
        // Without packed kernels nothing is packed (see `MatrixRef::pack`): the experts are
        // read in place like every other matrix.
        let repack = options.repack && ferrox_core::packed::available();
        let plan = Self::for_budget(gguf.tensors(), budget, budget_given, repack)?;
        Ok(MemoryPlan {
            kv_reserved,
            ..plan
        })
    }

    /// The plan for these tensors under `budget` bytes.
    pub fn for_budget(
        tensors: &[TensorInfo],
        budget: u64,
        budget_given: bool,
        repack: bool,
    ) -> Result<MemoryPlan, ModelError> {
        let mut dense_bytes = 0u64;
        // The same with the growing forms left as the file stores them.
        let mut dense_lean_bytes = 0u64;
        let mut growing_bytes = 0u64;
        let mut expert_bytes = 0u64;
        let mut expert_packed_bytes = 0u64;
        let mut packable = true;
        // One expert's packed bytes per layer (gate, up and down summed).
        let mut per_layer: std::collections::HashMap<&str, u64> = Default::default();
        for t in tensors {
            let bytes = t.n_bytes.unwrap_or(0);
            // Sizes come from the file: saturate rather than wrap on absurd shapes.
            if !is_routed_experts(&t.name) {
                // A packed matrix is held in its packed form, which can be larger than the
                // file's (TQ1_0's by 22%).
                let held = if repack {
                    dense_packed(t).unwrap_or(bytes)
                } else {
                    bytes
                };
                dense_bytes = dense_bytes.saturating_add(held);
                let lean = if grows(held, bytes) {
                    growing_bytes = growing_bytes.saturating_add(bytes);
                    bytes
                } else {
                    held
                };
                dense_lean_bytes = dense_lean_bytes.saturating_add(lean);
                continue;
            }
            expert_bytes = expert_bytes.saturating_add(bytes);
            match expert_packed(t) {
                Some((per_expert, n_expert)) => {
                    expert_packed_bytes =
                        expert_packed_bytes.saturating_add(per_expert.saturating_mul(n_expert));
                    let layer = t.name.split('.').nth(1).unwrap_or_default();
                    let slot = per_layer.entry(layer).or_default();
                    *slot = slot.saturating_add(per_expert);
                }
                None => packable = false,
            }
        }
        let slot_bytes = per_layer.values().copied().max().unwrap_or(0);
        let growing_in_place_bytes = if dense_bytes > budget && dense_lean_bytes < dense_bytes {
            dense_bytes = dense_lean_bytes;
            growing_bytes
        } else {
            0
        };
        if budget < dense_bytes && budget_given {
            return Err(ModelError::BudgetTooSmall {
                budget,
                needed: dense_bytes,
            });
        }
        let experts = if expert_bytes == 0 || !repack || !packable || slot_bytes == 0 {
            ExpertPlacement::Mapped
        } else if dense_bytes.saturating_add(expert_packed_bytes) <= budget {
            ExpertPlacement::Packed
        } else {
            let slots = (budget.saturating_sub(dense_bytes) / slot_bytes) as usize;
            if slots == 0 && budget_given {
                return Err(ModelError::BudgetTooSmall {
                    budget,
                    needed: dense_bytes.saturating_add(slot_bytes),
                });
            }
            ExpertPlacement::Streamed {
                slots: slots.max(1),
                slot_bytes,
            }
        };
        Ok(MemoryPlan {
            budget,
            budget_given,
            dense_bytes,
            growing_in_place_bytes,
            expert_bytes,
            expert_packed_bytes,
            experts,
            kv_reserved: 0,
        })
    }

    /// Bytes of the file the plan leaves in the mapping, read from there as needed.
    pub fn mapped_bytes(&self) -> u64 {
        let experts = match self.experts {
            ExpertPlacement::Packed => 0,
            ExpertPlacement::Streamed { .. } | ExpertPlacement::Mapped => self.expert_bytes,
        };
        experts.saturating_add(self.growing_in_place_bytes)
    }

    /// Whether the matrices whose packed form exceeds [`GROWTH_LIMIT`] stay in the file.
    pub fn growing_in_place(&self) -> bool {
        self.growing_in_place_bytes > 0
    }
}

/// The packed bytes of a dense matrix, `None` if it has no packed form.
fn dense_packed(t: &TensorInfo) -> Option<u64> {
    let [cols, rows] = match t.shape.as_slice() {
        [a, b] => [*a, *b].map(|d| usize::try_from(d).unwrap_or(usize::MAX)),
        _ => return None,
    };
    PackedMatrix::packed_bytes(t.ty, rows, cols).map(|b| b as u64)
}

/// One expert's packed bytes and the number of experts of a stacked expert tensor, `None`
/// if it has no packed form.
fn expert_packed(t: &TensorInfo) -> Option<(u64, u64)> {
    let [cols, rows, n] = match t.shape.as_slice() {
        [a, b, c] => [*a, *b, *c].map(|d| usize::try_from(d).unwrap_or(usize::MAX)),
        _ => return None,
    };
    // A fused gate-and-up tensor is packed as its two halves.
    let halves = if t.name.contains("gate_up") { 2 } else { 1 };
    let per = PackedMatrix::packed_bytes(t.ty, rows / halves, cols)?;
    Some(((per as u64).checked_mul(halves as u64)?, n as u64))
}

/// Bytes the KV cache of one sequence over the whole context takes (`options.n_ctx`, else
/// the file's training context) at `options.kv_storage`, from the file's attention shapes:
/// a latent row per layer (`kv_lora_rank` plus the RoPE dims) or the grouped-query keys and
/// values (the widest layer's, for every layer). The engines hold that memory once a
/// sequence fills its context, so the default budget leaves it free for them. 0 when the
/// file does not say; everything when its counts are absurd (the load then refuses them).
pub fn kv_reserve(gguf: &Gguf, options: &EngineOptions) -> u64 {
    let meta = gguf.metadata();
    let Ok(arch) = meta.architecture() else {
        return 0;
    };
    let keys = crate::hparams::Keys { meta: &meta, arch };
    let count = |name: &str| keys.opt_usize(name).ok().flatten();
    let (Some(n_layer), Some(n_ctx_train)) = (count("block_count"), count("context_length")) else {
        return 0;
    };
    let n_ctx = if options.n_ctx > 0 {
        options.n_ctx
    } else {
        n_ctx_train
    };
    let widest = |name: &str| -> Option<usize> {
        let n = n_layer.min(crate::hparams::Keys::MAX_LAYERS);
        keys.per_layer(name, n).ok().flatten()?.into_iter().max()
    };
    let (key_width, value_width) = match count("attention.kv_lora_rank") {
        Some(rank) => (
            Some(rank + count("rope.dimension_count").unwrap_or(0)),
            Some(0),
        ),
        None => {
            let heads = widest("attention.head_count").unwrap_or(0).max(1);
            let kv_heads = widest("attention.head_count_kv").unwrap_or(heads);
            let per_head = count("embedding_length").unwrap_or(0) / heads;
            let width = |name: &str| kv_heads.checked_mul(count(name).unwrap_or(per_head));
            (
                width("attention.key_length"),
                width("attention.value_length"),
            )
        }
    };
    // Widths beyond any real model's would overflow the row sizes: reserve everything.
    const MAX_WIDTH: usize = 1 << 32;
    match (key_width, value_width) {
        (Some(k), Some(v)) if k <= MAX_WIDTH && v <= MAX_WIDTH => {
            let row = options.kv_storage.row_bytes(k, v) as u64;
            row.saturating_mul(n_layer as u64)
                .saturating_mul(n_ctx as u64)
        }
        _ => u64::MAX,
    }
}

/// A share of the memory available now, within the cgroup's limit if there is one.
fn default_budget() -> u64 {
    let available = ferrox_core::available_memory().map_or(u64::MAX, |b| b as u64);
    let limit = cgroup_memory_left().unwrap_or(u64::MAX);
    match available.min(limit) {
        u64::MAX => u64::MAX,
        m => (m as f64 * DEFAULT_BUDGET_SHARE) as u64,
    }
}

/// What the cgroup (v2) this process runs in may still take: `memory.max - memory.current`.
fn cgroup_memory_left() -> Option<u64> {
    let read = |f: &str| std::fs::read_to_string(format!("/sys/fs/cgroup/{f}")).ok();
    let max: u64 = read("memory.max")?.trim().parse().ok()?;
    let current: u64 = read("memory.current")?.trim().parse().ok()?;
    Some(max.saturating_sub(current))
}

/// A lock that a panic elsewhere does not poison (the buffers hold no invariant).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the engines' `pack` methods see: the file, and where the plan puts the experts.
pub struct Packing<'g> {
    gguf: &'g Gguf,
    plan: &'g MemoryPlan,
    expert_cache: Option<&'g Arc<ExpertCache>>,
    mlock: bool,
    packed_bytes: AtomicU64,
    next_layer: AtomicUsize,
    /// Buffers for direct reads, one per matrix packed at once (dropped after the load).
    buffers: Mutex<Vec<DirectBuffer>>,
}

impl std::ops::Deref for Packing<'_> {
    type Target = Gguf;

    fn deref(&self) -> &Gguf {
        self.gguf
    }
}

impl<'g> Packing<'g> {
    pub(crate) fn new(
        gguf: &'g Gguf,
        plan: &'g MemoryPlan,
        expert_cache: Option<&'g Arc<ExpertCache>>,
        mlock: bool,
    ) -> Packing<'g> {
        Packing {
            gguf,
            plan,
            expert_cache,
            mlock,
            packed_bytes: AtomicU64::new(0),
            next_layer: AtomicUsize::new(0),
            buffers: Mutex::new(Vec::new()),
        }
    }

    pub fn gguf(&self) -> &'g Gguf {
        self.gguf
    }

    /// Whether routed experts are packed at load.
    pub fn packs_experts(&self) -> bool {
        self.plan.experts == ExpertPlacement::Packed
    }

    /// Whether the plan packs a dense `rows × cols` matrix of `ty` (`file_bytes` in the
    /// file) that has a packed form: all but the growing ones where the plan leaves those
    /// in place.
    pub fn packs_dense(&self, ty: GgmlType, (rows, cols): (usize, usize), file_bytes: u64) -> bool {
        !(self.plan.growing_in_place()
            && PackedMatrix::packed_bytes(ty, rows, cols)
                .is_some_and(|packed| grows(packed as u64, file_bytes)))
    }

    /// The cache streamed experts go through, with a key of their own for one layer.
    pub fn expert_cache(&self) -> Option<(Arc<ExpertCache>, usize)> {
        let cache = self.expert_cache?;
        Some((
            Arc::clone(cache),
            self.next_layer.fetch_add(1, Ordering::Relaxed),
        ))
    }

    /// Counts (and with `--mlock` locks) a packed copy just made.
    fn packed(&self, m: &PackedMatrix) {
        self.packed_bytes
            .fetch_add(m.n_bytes() as u64, Ordering::Relaxed);
        if self.mlock {
            if let Err(e) = m.lock() {
                tracing::warn!("--mlock: cannot lock {} bytes of weights: {e}", m.n_bytes());
            }
        }
    }

    /// `bytes` (a `rows × cols` matrix of `ty` in the mapping) packed: read past the page
    /// cache first when direct reads are on, the mapped pages released as they are
    /// copied; counted, and locked with `--mlock`.
    pub fn pack_matrix(
        &self,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<PackedMatrix, ModelError> {
        // Buffers are reused across matrices: fresh ones would be zeroed each time.
        let mut buf = lock(&self.buffers).pop().unwrap_or_default();
        let read = self.gguf.read_direct_span(bytes, &mut buf);
        let packed = self.pack_read(ty, (rows, cols), bytes, (&buf, read));
        lock(&self.buffers).push(buf);
        packed
    }

    /// Packs matrices of one type and shape one after another (a tensor's experts), each as
    /// [`Packing::pack_matrix`] would. With direct reads on, the next matrix's bytes are read
    /// on a thread of their own while the pool packs the current one: reading waits on the
    /// disk, packing on the cores, so the two overlap instead of taking turns.
    pub fn pack_in_turn<'p>(
        &self,
        ty: GgmlType,
        (rows, cols): (usize, usize),
        parts: &[&'p [u8]],
    ) -> Result<Vec<PackedMatrix>, ModelError> {
        if !self.gguf.direct_io() || parts.len() < 2 {
            return parts
                .iter()
                .map(|bytes| self.pack_matrix(ty, rows, cols, bytes))
                .collect();
        }
        let gguf = self.gguf;
        std::thread::scope(|scope| {
            let read_ahead = |bytes: &'p [u8]| {
                let mut buf = lock(&self.buffers).pop().unwrap_or_default();
                scope.spawn(move || {
                    let read = gguf.read_direct_span(bytes, &mut buf);
                    (buf, read)
                })
            };
            let mut packed = Vec::with_capacity(parts.len());
            let mut reading = Some(read_ahead(parts[0]));
            for (i, bytes) in parts.iter().enumerate() {
                let (buf, read) = reading
                    .take()
                    .expect("a read is under way for every part")
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                reading = parts.get(i + 1).map(|&next| read_ahead(next));
                let matrix = self.pack_read(ty, (rows, cols), bytes, (&buf, read));
                lock(&self.buffers).push(buf);
                packed.push(matrix?);
            }
            Ok(packed)
        })
    }

    /// `bytes` packed from where a direct read put them in `buf` (`read`), or from the
    /// mapping where there was none; the mapped pages released, counted, and locked with
    /// `--mlock`.
    fn pack_read(
        &self,
        ty: GgmlType,
        (rows, cols): (usize, usize),
        bytes: &[u8],
        (buf, read): (
            &DirectBuffer,
            Option<std::io::Result<std::ops::Range<usize>>>,
        ),
    ) -> Result<PackedMatrix, ModelError> {
        let release = |part: &[u8]| self.gguf.release_pages(part);
        let packed = match read {
            Some(span) => {
                let span = span.map_err(|e| ModelError::Config(format!("direct read: {e}")))?;
                PackedMatrix::pack(ty, rows, cols, buf.bytes(span), release)?
            }
            None => PackedMatrix::pack(ty, rows, cols, bytes, release)?,
        };
        self.packed(&packed);
        Ok(packed)
    }

    /// Bytes of packed copies made so far.
    pub fn packed_bytes(&self) -> u64 {
        self.packed_bytes.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrox_gguf::GgmlType;

    fn tensor(name: &str, ty: GgmlType, shape: &[u64]) -> TensorInfo {
        let n: u64 = shape.iter().product();
        TensorInfo {
            name: name.into(),
            ty,
            shape: shape.to_vec(),
            offset: 0,
            file_offset: 0,
            n_elements: n,
            n_bytes: ty.bytes_for(n),
            shard: 0,
        }
    }

    /// Two layers of 8 Q4_0 experts of 64 × 256, one dense matrix.
    fn model() -> Vec<TensorInfo> {
        let mut t = vec![tensor("output.weight", GgmlType::Q8_0, &[256, 64])];
        for il in 0..2 {
            for (name, shape) in [
                ("ffn_gate_exps", [256, 64, 8]),
                ("ffn_up_exps", [256, 64, 8]),
                ("ffn_down_exps", [64, 256, 8]),
            ] {
                t.push(tensor(
                    &format!("blk.{il}.{name}.weight"),
                    GgmlType::Q4_0,
                    &shape,
                ));
            }
        }
        t
    }

    /// Dense matrices count at the size they are held in: packed (TQ1_0 grows from 54 to 66
    /// bytes per block), or the file's when nothing is repacked.
    #[test]
    fn dense_matrices_count_their_packed_size() {
        let t = vec![tensor("blk.0.attn_q.weight", GgmlType::Tq1_0, &[256, 64])];
        let packed = MemoryPlan::for_budget(&t, u64::MAX, false, true).unwrap();
        assert_eq!(packed.dense_bytes, 64 * 66);
        let mapped = MemoryPlan::for_budget(&t, u64::MAX, false, false).unwrap();
        assert_eq!(mapped.dense_bytes, 64 * 54);
    }

    #[test]
    fn experts_are_packed_when_they_fit_and_streamed_when_not() {
        let t = model();
        let all = MemoryPlan::for_budget(&t, u64::MAX, false, true).unwrap();
        assert_eq!(all.experts, ExpertPlacement::Packed);
        assert_eq!(all.dense_bytes, 256 * 64 / 32 * 34);
        // Q4_0 packs into exactly its file bytes.
        assert_eq!(all.expert_packed_bytes, all.expert_bytes);
        let one_expert = 3 * 64 * 256 / 32 * 18;
        let budget = all.dense_bytes + 5 * one_expert + 7;
        let some = MemoryPlan::for_budget(&t, budget, true, true).unwrap();
        assert_eq!(
            some.experts,
            ExpertPlacement::Streamed {
                slots: 5,
                slot_bytes: one_expert
            }
        );
        assert_eq!(some.mapped_bytes(), some.expert_bytes);
        let off = MemoryPlan::for_budget(&t, budget, true, false).unwrap();
        assert_eq!(off.experts, ExpertPlacement::Mapped);
    }

    #[test]
    fn a_budget_below_the_dense_weights_is_refused_naming_both() {
        let t = model();
        let err = MemoryPlan::for_budget(&t, 1000, true, true).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("1000") && text.contains(&(256 * 64 / 32 * 34).to_string()));
        // With no room for a single expert either.
        let dense = 256 * 64 / 32 * 34;
        let err = MemoryPlan::for_budget(&t, dense + 10, true, true).unwrap_err();
        assert!(matches!(err, ModelError::BudgetTooSmall { .. }), "{err}");
    }
}
