//! Routed experts streamed from the mapped file through a cache of packed copies.
//!
//! When a model's experts do not fit the memory budget, they stay in the mapped file and a
//! fixed number of slots hold packed copies of the experts used most. A product needs its
//! expert packed: a miss packs it from the file into the least used slot (counts halved as
//! misses go by; of equals, the most recently used, see `CachedExperts::fill`). A layer's missing experts have their
//! pages asked for all at once beforehand, so the reads overlap; the pages are released
//! once packed. Products always go through packed copies, so every result is the
//! one the model gives with all of its experts packed at load, whatever was cached.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use ferrox_core::packed::PackedMatrix;
use ferrox_core::WeightMatrix;
use ferrox_gguf::DirectBuffer;
use smallvec::SmallVec;

pub use ferrox_engine::ExpertCacheStats;

use crate::experts::ExpertTensor;
use crate::MoeError;

/// What the cache asks of the memory the experts' bytes live in (a mapped file).
pub trait MappedPages: Sync {
    /// These bytes will be read soon: start reading them in.
    fn prefetch(&self, bytes: &[u8]);
    /// These bytes were copied and will not be read again soon.
    fn release(&self, bytes: &[u8]);
    /// A copy of these bytes read past the page cache into `buf`, where the pages' owner
    /// reads that way (`--direct-io`); `None`: read them in place.
    fn read_direct<'b>(
        &self,
        _bytes: &[u8],
        _buf: &'b mut DirectBuffer,
    ) -> Option<std::io::Result<&'b [u8]>> {
        None
    }
}

impl MappedPages for ferrox_gguf::Gguf {
    fn prefetch(&self, bytes: &[u8]) {
        self.prefetch_pages(bytes);
    }

    fn release(&self, bytes: &[u8]) {
        self.release_pages(bytes);
    }

    fn read_direct<'b>(
        &self,
        bytes: &[u8],
        buf: &'b mut DirectBuffer,
    ) -> Option<std::io::Result<&'b [u8]>> {
        ferrox_gguf::Gguf::read_direct(self, bytes, buf)
    }
}

/// Packed copies of the most used routed experts of a model's MoE layers.
pub struct ExpertCache {
    slots: Mutex<Slots>,
    capacity: usize,
    slot_bytes: u64,
    /// Lock each slot's memory as it is taken (`--mlock`).
    mlock: bool,
    hits: AtomicU64,
    misses: AtomicU64,
    bytes_read: AtomicU64,
    ahead_asked: AtomicU64,
    ahead_used: AtomicU64,
}

struct Slots {
    slots: Vec<Slot>,
    /// `(layer, expert)` → slot.
    index: HashMap<(usize, usize), usize>,
    clock: u64,
    /// Misses since the use counts were last halved.
    misses_since_aging: usize,
    /// Where direct reads land before they are packed.
    direct: DirectBuffer,
    /// `(layer, expert)` pairs asked for ahead and not yet looked for by their layer.
    asked_ahead: HashSet<(usize, usize)>,
    /// Whether asking ahead pays: recent asks and uses (see [`CachedExperts::prefetch_ahead`]).
    ahead_record: AheadRecord,
}

/// How well recent guesses of the next layer's experts did. A wrong guess reads an expert
/// nobody uses, so after a first [`AheadRecord::TRIAL`] of guesses, guessing stops while
/// fewer than half of the recent ones were used; one call in [`AheadRecord::PROBE`] still
/// guesses, the older record counting half from then on, so that guessing resumes soon
/// once the guesses get better (another text).
#[derive(Default)]
struct AheadRecord {
    asked: u64,
    used: u64,
    tried: bool,
    calls_skipped: u64,
}

impl AheadRecord {
    const TRIAL: u64 = 64;
    /// Counts are halved past this many asks: the record follows the recent text.
    const WINDOW: u64 = 512;
    const PROBE: u64 = 16;

    /// Whether this call guesses.
    fn guess(&mut self) -> bool {
        if !self.tried || 2 * self.used >= self.asked {
            return true;
        }
        self.calls_skipped += 1;
        if !self.calls_skipped.is_multiple_of(Self::PROBE) {
            return false;
        }
        self.asked /= 2;
        self.used /= 2;
        true
    }

    fn record(&mut self, asked: u64, used: u64) {
        self.asked += asked;
        self.used += used;
        self.tried |= self.asked >= Self::TRIAL;
        if self.asked > Self::WINDOW {
            self.asked /= 2;
            self.used /= 2;
        }
    }
}

struct Slot {
    key: Option<(usize, usize)>,
    last_use: u64,
    /// Uses since the slot was filled, halved every `capacity` misses (so that experts
    /// once hot give way).
    uses: u32,
    /// Gate (absent for ungated experts), up, down.
    matrices: [Option<PackedMatrix>; 3],
}

impl std::fmt::Debug for ExpertCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExpertCache")
            .field("capacity", &self.capacity)
            .field("slot_bytes", &self.slot_bytes)
            .finish()
    }
}

impl ExpertCache {
    /// A cache of `capacity` slots (at least one) of `slot_bytes` each (one expert's packed
    /// matrices, the largest of the model's layers); memory is taken as slots fill.
    pub fn new(capacity: usize, slot_bytes: u64) -> ExpertCache {
        let capacity = capacity.max(1);
        ExpertCache {
            slots: Mutex::new(Slots {
                slots: (0..capacity)
                    .map(|_| Slot {
                        key: None,
                        last_use: 0,
                        uses: 0,
                        matrices: [None, None, None],
                    })
                    .collect(),
                index: HashMap::new(),
                clock: 0,
                misses_since_aging: 0,
                direct: DirectBuffer::default(),
                asked_ahead: HashSet::new(),
                ahead_record: AheadRecord::default(),
            }),
            capacity,
            slot_bytes,
            mlock: false,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
            ahead_asked: AtomicU64::new(0),
            ahead_used: AtomicU64::new(0),
        }
    }

    /// This cache with each slot's memory locked (`mlock`) when it is first taken, so that
    /// the cached experts are never paged out.
    pub fn locked(self) -> ExpertCache {
        ExpertCache {
            mlock: true,
            ..self
        }
    }

    /// Most experts one product pass may hold at once.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn stats(&self) -> ExpertCacheStats {
        // A slot's key is cleared only while it is refilled, under the lock.
        let filled = self.lock().index.len();
        ExpertCacheStats {
            slots: self.capacity,
            filled,
            slot_bytes: self.slot_bytes,
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            ahead_asked: self.ahead_asked.load(Ordering::Relaxed),
            ahead_used: self.ahead_used.load(Ordering::Relaxed),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slots> {
        // A panic while packing leaves at worst a slot with a stale key's matrices half
        // written; the key is cleared before packing, so the state stays consistent.
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One layer's experts as the cache serves them: the file's tensors to pack from, the
/// layer's key in the cache, and the pages they live in.
#[derive(Clone, Copy)]
pub struct CachedExperts<'a> {
    pub cache: &'a ExpertCache,
    pub layer: usize,
    pub pages: &'a dyn MappedPages,
}

impl std::fmt::Debug for CachedExperts<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedExperts")
            .field("layer", &self.layer)
            .finish()
    }
}

/// One expert's matrices for a pass.
pub(crate) struct ExpertViews<'b> {
    pub gate: Option<WeightMatrix<'b>>,
    pub up: WeightMatrix<'b>,
    pub down: WeightMatrix<'b>,
}

/// The layer's tensors, gate (if any), up, down.
pub(crate) type LayerTensors<'t, 'a> = [Option<&'t ExpertTensor<'a>>; 3];

impl CachedExperts<'_> {
    /// Asks for the file pages of those of `ids` not cached, so that their reads start
    /// before they are packed.
    pub(crate) fn prefetch(&self, tensors: LayerTensors<'_, '_>, ids: &[usize]) {
        let mut state = self.cache.lock();
        if !state.asked_ahead.is_empty() {
            let used = ids
                .iter()
                .filter(|&&e| state.asked_ahead.contains(&(self.layer, e)))
                .count();
            self.cache
                .ahead_used
                .fetch_add(used as u64, Ordering::Relaxed);
            state.ahead_record.record(0, used as u64);
            state.asked_ahead.retain(|&(layer, _)| layer != self.layer);
        }
        for &e in ids {
            if !state.index.contains_key(&(self.layer, e)) {
                for t in tensors.iter().flatten() {
                    self.pages.prefetch(t.expert_bytes(e));
                }
            }
        }
    }

    /// Asks for the file pages of those of `ids` not cached on behalf of this layer's next
    /// use (the layer before it guessed them), and notes them to count how many it then
    /// uses; while too few guesses are used, asks only now and then (see [`AheadRecord`]).
    pub(crate) fn prefetch_ahead(&self, tensors: LayerTensors<'_, '_>, ids: &[usize]) {
        let mut state = self.cache.lock();
        if !state.ahead_record.guess() {
            return;
        }
        let mut asked = 0;
        for &e in ids {
            let key = (self.layer, e);
            if !state.index.contains_key(&key) && state.asked_ahead.insert(key) {
                asked += 1;
                for t in tensors.iter().flatten() {
                    self.pages.prefetch(t.expert_bytes(e));
                }
            }
        }
        self.cache.ahead_asked.fetch_add(asked, Ordering::Relaxed);
        state.ahead_record.record(asked, 0);
    }

    /// Calls `f` with the packed views of experts `ids` (distinct, at most
    /// [`ExpertCache::capacity`]), packing the missing ones into the least used slots
    /// first. The slots stay theirs until `f` returns.
    pub(crate) fn with_views<R>(
        &self,
        tensors: LayerTensors<'_, '_>,
        ids: &[usize],
        f: impl for<'b> FnOnce(&[ExpertViews<'b>]) -> Result<R, MoeError>,
    ) -> Result<R, MoeError> {
        if ids.len() > self.cache.capacity {
            return Err(MoeError::Shape(format!(
                "{} experts in one pass, the cache holds {}",
                ids.len(),
                self.cache.capacity
            )));
        }
        let mut guard = self.cache.lock();
        let state = &mut *guard;
        state.clock += 1;
        let now = state.clock;
        let mut at: SmallVec<[usize; 32]> = SmallVec::new();
        // Hits first, so that a miss never takes the slot of an expert of this pass.
        for &e in ids {
            if let Some(&slot) = state.index.get(&(self.layer, e)) {
                let s = &mut state.slots[slot];
                s.last_use = now;
                s.uses = s.uses.saturating_add(1);
                self.cache.hits.fetch_add(1, Ordering::Relaxed);
            }
        }
        for &e in ids {
            let slot = match state.index.get(&(self.layer, e)) {
                Some(&slot) => slot,
                None => self.fill(state, tensors, e, now)?,
            };
            at.push(slot);
        }
        let views: SmallVec<[ExpertViews<'_>; 32]> = ids
            .iter()
            .zip(&at)
            .map(|(&e, &slot)| {
                let m = &state.slots[slot].matrices;
                let view = |i: usize| -> Result<Option<WeightMatrix<'_>>, MoeError> {
                    match (tensors[i], &m[i]) {
                        (Some(t), Some(p)) => Ok(Some(t.expert(e).with_packed(p)?)),
                        (None, _) => Ok(None),
                        (Some(_), None) => Err(MoeError::Shape("expert slot not filled".into())),
                    }
                };
                Ok(ExpertViews {
                    gate: view(0)?,
                    up: view(1)?.expect("up experts are always present"),
                    down: view(2)?.expect("down experts are always present"),
                })
            })
            .collect::<Result<_, MoeError>>()?;
        f(&views)
    }

    /// Packs expert `e` into a slot not used at `now`: an empty one, else the least used one,
    /// of those the most recently used. A step's experts often cycle through more than the
    /// cache holds (every layer's, token after token), where evicting the least recently
    /// used would miss every time; this way the experts that were used again stay, and of
    /// those used once the newest goes first, so that the older ones get their chance.
    fn fill(
        &self,
        state: &mut Slots,
        tensors: LayerTensors<'_, '_>,
        e: usize,
        now: u64,
    ) -> Result<usize, MoeError> {
        let slot = state
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.last_use != now || s.key.is_none())
            .min_by_key(|(_, s)| (s.key.is_some(), s.uses, std::cmp::Reverse(s.last_use)))
            .map(|(i, _)| i)
            .ok_or_else(|| MoeError::Shape("no free expert slot".into()))?;
        let Slots {
            slots,
            index,
            direct,
            ..
        } = state;
        let s = &mut slots[slot];
        if let Some(old) = s.key.take() {
            index.remove(&old);
        }
        let mut read = 0u64;
        for (t, m) in tensors.iter().zip(s.matrices.iter_mut()) {
            let Some(t) = t else {
                *m = None;
                continue;
            };
            let mapped = t.expert_bytes(e);
            let bytes = match self.pages.read_direct(mapped, direct) {
                Some(copy) => copy.map_err(|err| {
                    MoeError::Shape(format!("reading expert {e} of layer {}: {err}", self.layer))
                })?,
                None => mapped,
            };
            let release = |part: &[u8]| self.pages.release(part);
            match m {
                Some(p) if (p.ty(), p.rows(), p.cols()) == (t.ty(), t.rows(), t.cols()) => {
                    p.repack_from(t.ty(), bytes, release)?
                }
                _ => {
                    // Free the old shape's memory before taking the new one's.
                    *m = None;
                    let p = PackedMatrix::pack(t.ty(), t.rows(), t.cols(), bytes, release)?;
                    if self.cache.mlock {
                        // As llama.cpp's --mlock: a refusal (RLIMIT_MEMLOCK) leaves the
                        // memory pageable, it does not fail the product.
                        let _ = p.lock();
                    }
                    *m = Some(p);
                }
            }
            read += bytes.len() as u64;
        }
        s.key = Some((self.layer, e));
        s.last_use = now;
        s.uses = 1;
        index.insert((self.layer, e), slot);
        state.misses_since_aging += 1;
        if state.misses_since_aging >= state.slots.len() {
            state.misses_since_aging = 0;
            state.slots.iter_mut().for_each(|s| s.uses /= 2);
        }
        self.cache.misses.fetch_add(1, Ordering::Relaxed);
        self.cache.bytes_read.fetch_add(read, Ordering::Relaxed);
        Ok(slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrox_core::GgmlType;

    /// Counts the bytes asked for.
    #[derive(Default)]
    struct Asked(AtomicU64);

    impl MappedPages for Asked {
        fn prefetch(&self, bytes: &[u8]) {
            self.0.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        }
        fn release(&self, _bytes: &[u8]) {}
    }

    #[test]
    fn guessing_ahead_stops_while_guesses_go_unused_and_resumes_when_they_are_used() {
        const EXPERTS: usize = 64;
        let bytes = vec![0u8; EXPERTS * 4 * 32 * 4];
        let tensor = ExpertTensor::new(GgmlType::F32, [32, 4, EXPERTS], &bytes).unwrap();
        let tensors: LayerTensors<'_, '_> = [None, Some(&tensor), None];
        let cache = ExpertCache::new(2, 1);
        let pages = Asked::default();
        let layer = CachedExperts {
            cache: &cache,
            layer: 1,
            pages: &pages,
        };
        let guess = |step: usize| [step % EXPERTS, (step + 1) % EXPERTS];
        // Wrong guesses: the layer then needs other experts.
        for step in 0..400 {
            layer.prefetch_ahead(tensors, &guess(step));
            layer.prefetch(tensors, &[(step + 7) % EXPERTS]);
        }
        let wrong = cache.stats();
        assert_eq!(wrong.ahead_used, 0);
        // A trial, then one call in PROBE.
        let trial = AheadRecord::TRIAL;
        assert!(wrong.ahead_asked >= trial, "{wrong:?}");
        assert!(
            wrong.ahead_asked <= trial + 2 + 2 * (400 / AheadRecord::PROBE),
            "{wrong:?}"
        );
        assert!(pages.0.load(Ordering::Relaxed) > 0);
        // Right guesses: the probes find them used, and guessing resumes.
        for step in 0..400 {
            layer.prefetch_ahead(tensors, &guess(step));
            layer.prefetch(tensors, &guess(step));
        }
        let right = cache.stats();
        let (asked, used) = (
            right.ahead_asked - wrong.ahead_asked,
            right.ahead_used - wrong.ahead_used,
        );
        assert_eq!(asked, used);
        assert!(asked > 400, "{right:?}");
    }
}
