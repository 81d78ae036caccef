//! Patches completed from the version below them (ZFS: `dbuf_read`, as `dbuf_will_dirty`
//! calls it for a write that covers part of a block).
//!
//! A write into part of a block that is not in memory leaves a patch in the open txg
//! (`dbuf.rs`) and is answered without reading the block. The patch becomes the whole block
//! once the block's version below it (the syncing txg's, or the one on disk) is read and the
//! sectors the patch does not cover are copied from it ([`resolve_patch`]). ZFS reads the block
//! before every partial write goes on. Here a lone request's patches are left to the txg sync,
//! so that one client's read of its block never runs beside its own log write; with other
//! requests in flight, or once dirty data presses (`WritePath::modify`), the write asks for
//! them to be completed now: beside the answer of a client answered at once
//! ([`Store::complete_patches_beside`]), or before returning on the paths that wait
//! (`Store::modify_with`).
//!
//! The completing tasks are bounded per serving core ([`PATCHES_RESOLVING_MAX`]); further
//! patches wait in that core's line ([`PatchCompletions`]), and past [`PATCHES_WAITING_MAX`]
//! they are left to the sync. Where each patch was completed is counted (`PatchStats`).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::thread::{self, ThreadId};

use super::dbuf::Block;
use super::dsl_pool::Txg;
use super::{Dataset, Store, StoreError};
use crate::device::AlignedBuf;
use crate::objset;
use crate::pool::Pool;

/// Patches completed by tasks of their own at once on each core
/// ([`Store::complete_patches_beside`]); past this, a write's patches wait for one of those
/// tasks ([`PATCHES_WAITING_MAX`]).
const PATCHES_RESOLVING_MAX: usize = 64;
/// Patches that may wait in a core's line for a completing task; past this a write's patch is
/// left to its sync, as a lone request's is. A waiting patch holds no more than its place (the
/// patch is in the open txg, counted in its dirty data): the bound keeps the line from holding
/// on to volumes long after their txg synced.
const PATCHES_WAITING_MAX: usize = 16_384;

/// The patches being completed by tasks of their own ([`Store::modify_answering_early`]) and
/// those waiting for one, a line per serving core: a patch is completed on the core whose
/// client wrote it, through that core's ring, as every task the engine starts for a request
/// stays on its core.
#[derive(Default)]
pub(super) struct PatchCompletions {
    lines: parking_lot::Mutex<HashMap<ThreadId, PatchLine>>,
}

#[derive(Default)]
struct PatchLine {
    /// Tasks completing this core's patches, at most [`PATCHES_RESOLVING_MAX`].
    running: usize,
    /// Patches waiting for one of them, in the order they came.
    waiting: VecDeque<(Arc<Dataset>, u64)>,
}

impl PatchCompletions {
    /// Entries waiting for a task, on every core (a block written twice meanwhile may wait
    /// twice; the second finds nothing to do).
    pub(super) fn waiting(&self) -> usize {
        self.lines.lock().values().map(|l| l.waiting.len()).sum()
    }
}

impl std::fmt::Debug for PatchCompletions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let lines = self.lines.lock();
        f.debug_struct("PatchCompletions")
            .field("running", &lines.values().map(|l| l.running).sum::<usize>())
            .field("waiting", &lines.values().map(|l| l.waiting.len()).sum::<usize>())
            .finish()
    }
}

/// One of a core's [`PATCHES_RESOLVING_MAX`] patch completions, given back when its task ends
/// however it ends. Taking a place or joining the line is one locked step, and so is finding
/// the line empty and giving the place back: a patch can never be left in a line no task
/// will look at again.
struct ResolvingSlot {
    store: Arc<Store>,
    core: ThreadId,
    held: bool,
}

impl ResolvingSlot {
    /// A place for the patch of block `index` of `dataset`, or `None` with the patch put in
    /// line (left to the sync if the line is full).
    fn take_or_wait(store: &Arc<Store>, dataset: &Arc<Dataset>, index: u64) -> Option<Self> {
        let core = thread::current().id();
        let mut lines = store.patches_resolving.lines.lock();
        let line = lines.entry(core).or_default();
        if line.running < PATCHES_RESOLVING_MAX {
            line.running += 1;
            return Some(ResolvingSlot { store: Arc::clone(store), core, held: true });
        }
        if line.waiting.len() < PATCHES_WAITING_MAX {
            line.waiting.push_back((Arc::clone(dataset), index));
        } else {
            store.txg.patch_stats().left_to_sync.inc();
        }
        None
    }

    /// The next patch in line, or `None` with the place given back.
    fn next_waiting(&mut self) -> Option<(Arc<Dataset>, u64)> {
        if !self.held {
            return None;
        }
        let mut lines = self.store.patches_resolving.lines.lock();
        let line = lines.get_mut(&self.core).expect("a held place's line outlives it");
        let next = line.waiting.pop_front();
        if next.is_none() {
            line.running -= 1;
            self.held = false;
        }
        next
    }
}

impl Drop for ResolvingSlot {
    fn drop(&mut self) {
        if self.held {
            let mut lines = self.store.patches_resolving.lines.lock();
            let line = lines.get_mut(&self.core).expect("a held place's line outlives it");
            line.running -= 1;
        }
    }
}

impl Store {
    /// Starts the completion of the patches a write left (`resolve`: their block indexes) on
    /// tasks beside its answer: a place among this core's [`PATCHES_RESOLVING_MAX`], or the
    /// core's line while every place is taken, or, with the line full too, nothing: the patch
    /// is left to the sync (counted as `left_to_sync`).
    pub(super) fn complete_patches_beside(
        self: &Arc<Self>,
        dataset: &Arc<Dataset>,
        resolve: Vec<u64>,
    ) {
        for index in resolve {
            // The write is in the open txg and logged whatever happens here: a completion that
            // fails to read leaves the patch to the sync, which reports what it finds.
            let Some(slot) = ResolvingSlot::take_or_wait(self, dataset, index) else {
                // Every task of this core busy: the patch waits in line for one, and the write
                // is answered. A write that completed its own patch here instead waited on the
                // disk: where the disk stalls behind the sync's flush (0.2-0.45 s here), every
                // write of 32 in flight waited that long for its read
                // (docs/bench/peers-notes.md, 2026-12-03).
                continue;
            };
            let (store, dataset) = (Arc::clone(self), Arc::clone(dataset));
            self.spa.pool().env().spawn("patch completion", async move {
                store.complete_patches(slot, dataset, index).await;
            });
        }
    }

    /// A completing task's work: the patch it was started for, then those waiting in its
    /// core's line, until none waits.
    async fn complete_patches(
        self: &Arc<Self>,
        mut slot: ResolvingSlot,
        dataset: Arc<Dataset>,
        index: u64,
    ) {
        let mut next = Some((dataset, index));
        while let Some((dataset, index)) = next {
            // Nothing to do for a volume destroyed or a store stopped meanwhile.
            if self.spa.check_live().is_err() {
                return;
            }
            if self.dsl.check_exists(&dataset).is_ok() {
                let _guard = self.spa.panic_guard("a patch completion");
                let _ = resolve_patch(self.spa.pool(), &self.txg, &dataset, index).await;
            }
            next = slot.next_waiting();
        }
    }
}

/// Completes block `index`'s patch in the open txg from the version below it, unless a
/// quiesce moved the layers meanwhile (then the sync completes it).
pub(super) async fn resolve_patch(
    pool: &Pool,
    txg: &Txg,
    dataset: &Dataset,
    index: u64,
) -> Result<(), StoreError> {
    let stats = txg.patch_stats();
    let (open_txg, syncing, root, levels) = {
        let txg = txg.lock();
        let v = dataset.state.lock();
        if !matches!(v.open.get(&index), Some(Block::Patched(_))) {
            return Ok(());
        }
        (txg.open_txg(), v.syncing.get(&index).cloned(), v.entry.root, v.disk_levels)
    };
    let disk =
        || async { Ok::<_, StoreError>(objset::read_data_block(pool, root, levels, index).await?) };
    // The version below, borrowed where it lies (the syncing txg's block or the cache's).
    let base: Option<Arc<AlignedBuf>> = match syncing {
        Some(Block::Data(data)) => Some(data),
        Some(Block::Zero) => None,
        Some(Block::Patched(patch)) => {
            let below = disk().await?;
            Some(Arc::new(patch.apply(below.as_deref().map(|b| &b[..]))))
        }
        None => disk().await?,
    };
    let base = base.as_deref().map(|b| &b[..]);
    let txg = txg.lock();
    if txg.open_txg() != open_txg {
        return Ok(());
    }
    let mut v = dataset.state.lock();
    // A quiesce takes the txg lock and then this volume's: holding the volume's is enough
    // to keep the layers where they are, so the txg lock is not held for the copy.
    drop(txg);
    if let Some(Block::Patched(current)) = v.open.get_mut(&index) {
        // Held alone, the patch becomes the block in its own buffer (only the sectors it
        // does not cover are copied); a reader's clone leaves it to be copied.
        let whole = match Arc::get_mut(current) {
            Some(patch) => patch.take_applied(base),
            None => current.apply(base),
        };
        v.open.insert(index, Block::Data(Arc::new(whole)));
        stats.completed_beside.inc();
    }
    Ok(())
}
