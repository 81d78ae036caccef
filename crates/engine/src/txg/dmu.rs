//! The read and write paths of volumes (ZFS: `dmu.c`, `dmu_tx.c`'s callers).
//!
//! A read looks at the open txg's dirty blocks, then the syncing txg's, then the trees on disk
//! (through the block cache), fetching runs of adjacent blocks in one I/O. A write puts whole
//! blocks or patches (`dbuf.rs`; `dbuf_read.rs` completes them) into the open txg after the
//! admission check and throttle (`dmu_tx.rs`), and appends its log record in the same critical
//! section (`zil.rs`), so the log's order is the order in which blocks changed.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures::StreamExt;
use sluice_format::BlockPointer;

use super::dataset::Dsl;
use super::dbuf::{Apply, Block, Patch, Prewritten, WriteData};
use super::dbuf_read::resolve_patch;
use super::dmu_rewrite;
use super::dmu_tx::Admission;
use super::dmu_zfetch::{self, BatchTree, Held};
use super::dsl_pool::Txg;
use super::spa::Spa;
use super::spa_sync::SyncHandle;
use super::zil::{append_records, Zil};
use super::{Dataset, Store, StoreError};
use crate::device::AlignedBuf;
use crate::objset::{self};
use crate::pool::Pool;

/// Largest span of adjacent blocks one read fetches in one I/O.
pub(super) const READ_SPAN_BYTES_MAX: u64 = 1 << 20;

/// How `Store::read` fetches a block or a run of them.
pub(super) enum Read {
    /// A block with a version in memory.
    Memory(u64),
    /// A block found in the pool's block cache.
    Cached(u64, Arc<AlignedBuf>),
    /// Adjacent blocks on disk from this index on, with their pointers.
    Span(u64, Vec<BlockPointer>),
    /// Blocks fetched ahead (dmu_zfetch.rs) from this index on, all in one I/O of the
    /// prefetch, each under the pointer the read found: awaited as one.
    Held(u64, Vec<Held>),
}

/// A fetched block's bytes, wherever they are.
pub(super) enum Fetched {
    /// A whole block: from memory, the block cache or a lone read.
    Whole(Arc<AlignedBuf>),
    /// Within a span's buffer, at this offset.
    Span(Arc<AlignedBuf>, usize),
}

/// A block read from disk as a whole block's bytes: the buffer itself when it is exactly one
/// block (the usual case), a copy of its first `block_bytes` otherwise.
fn whole_block(read: Arc<AlignedBuf>, block_bytes: usize) -> Arc<AlignedBuf> {
    if read.len() == block_bytes {
        read
    } else {
        Arc::new(AlignedBuf::copy_from(&read[..block_bytes]))
    }
}

/// Blocks one read fetches concurrently.
pub(super) const READ_BLOCKS_IN_FLIGHT: usize = 32;

/// Zeros that [`ReadData::slices`] lends for holes, a piece at a time.
static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

/// A read's bytes, in order, as ranges of the buffers that hold them: a dirty block, a block in
/// the cache, a span just read from disk, or zeros for a hole. Nothing is copied on the way
/// from the disk's buffer to the socket: the NBD server sends these slices with one vectored
/// write. Gathering them into one zeroed `Vec` first was 9% of the server's CPU on uncached
/// 1 MiB reads (the `memset` and the copy; perf, 2026-11-25), and the reply's copy of that
/// `Vec` 6.5%.
#[derive(Clone, Debug, Default)]
pub struct ReadData {
    pieces: Vec<ReadPiece>,
    len: usize,
}

#[derive(Clone, Debug)]
enum ReadPiece {
    Bytes(Arc<AlignedBuf>, std::ops::Range<usize>),
    Zeros(usize),
}

impl ReadPiece {
    fn len(&self) -> usize {
        match self {
            ReadPiece::Bytes(_, range) => range.len(),
            ReadPiece::Zeros(n) => *n,
        }
    }
}

impl ReadData {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes joined (a copy; the NBD server uses [`ReadData::slices`] instead).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len);
        self.slices(0, self.len, |s| out.extend_from_slice(s));
        out
    }

    /// Calls `each` with the bytes `from..from + len`, in order, a slice at a time.
    pub fn slices<'a>(&'a self, from: usize, len: usize, mut each: impl FnMut(&'a [u8])) {
        assert!(from.checked_add(len).is_some_and(|end| end <= self.len), "range in the read");
        let (mut skip, mut left) = (from, len);
        for piece in &self.pieces {
            if left == 0 {
                break;
            }
            let n = piece.len();
            if skip >= n {
                skip -= n;
                continue;
            }
            let take = (n - skip).min(left);
            match piece {
                ReadPiece::Bytes(buf, range) => {
                    let start = range.start + skip;
                    each(&buf[start..start + take]);
                }
                ReadPiece::Zeros(_) => {
                    let mut zeros = take;
                    while zeros > 0 {
                        let z = zeros.min(ZEROS.len());
                        each(&ZEROS[..z]);
                        zeros -= z;
                    }
                }
            }
            (skip, left) = (0, left - take);
        }
    }

    /// Appends `range` of `buf`, joined to the previous piece when it continues it in the
    /// same buffer (the blocks of one span become one slice).
    fn push_bytes(&mut self, buf: &Arc<AlignedBuf>, range: std::ops::Range<usize>) {
        // Checked here, inside the read, and not when the reply is sent: a bad block then
        // fails its request (the NBD server answers EIO) instead of a reply half sent.
        assert!(range.end <= buf.len(), "a block's buffer holds every byte read from it");
        self.len += range.len();
        if let Some(ReadPiece::Bytes(last, r)) = self.pieces.last_mut() {
            if Arc::ptr_eq(last, buf) && r.end == range.start {
                r.end = range.end;
                return;
            }
        }
        self.pieces.push(ReadPiece::Bytes(Arc::clone(buf), range));
    }

    fn push_zeros(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        self.len += n;
        if let Some(ReadPiece::Zeros(z)) = self.pieces.last_mut() {
            *z += n;
        } else {
            self.pieces.push(ReadPiece::Zeros(n));
        }
    }
}

/// A volume's range check and the current contents of its blocks: what the write path and
/// the log's replay (zil.rs) and fills (zil_commit.rs) read through the dataset alone.
impl Dataset {
    /// Fails unless `len` bytes at `offset` lie within `size_bytes` and are 512-byte aligned.
    pub(super) fn check_range(
        &self,
        size_bytes: u64,
        offset: u64,
        len: u64,
    ) -> Result<(), StoreError> {
        let inside = offset.checked_add(len).is_some_and(|end| end <= size_bytes);
        if inside && offset % 512 == 0 && len % 512 == 0 {
            Ok(())
        } else {
            Err(StoreError::OutOfRange { volume: self.name(), offset, len, size_bytes })
        }
    }

    /// The current contents of block `index`: open txg, then syncing txg, then disk, with
    /// patches applied over the version below them.
    pub(super) async fn block(
        &self,
        pool: &Pool,
        index: u64,
    ) -> Result<Option<Arc<AlignedBuf>>, StoreError> {
        // One snapshot: the versions in memory and the root they lie on. Freed blocks stay
        // intact through the deferral, so that root can be read even if a sync moves it.
        let (open, syncing, root, levels) = {
            let v = self.state.lock();
            (
                v.open.get(&index).cloned(),
                v.syncing.get(&index).cloned(),
                v.entry.root,
                v.disk_levels,
            )
        };
        let mut layers: Vec<Block> = open.into_iter().collect();
        if !matches!(layers.last(), Some(Block::Data(_) | Block::Zero)) {
            layers.extend(syncing);
        }
        let mut below = match layers.last() {
            Some(Block::Data(data)) => Some(Arc::clone(data)),
            Some(Block::Zero) => None,
            Some(Block::Patched(_)) | None => objset::read_data_block(pool, root, levels, index)
                .await?
                .map(|d| whole_block(d, self.block_bytes as usize)),
        };
        for layer in layers.iter().rev() {
            if let Block::Patched(patch) = layer {
                below = Some(Arc::new(patch.apply(below.as_deref().map(|b| &b[..]))));
            }
        }
        Ok(below)
    }
}

impl Store {
    /// Fails for a handle whose volume was destroyed (checked again under the txg lock
    /// where it matters: `modify`).
    pub fn check_exists(&self, dataset: &Dataset) -> Result<(), StoreError> {
        self.dsl.check_exists(dataset)
    }

    /// Reads `len` bytes at `offset`.
    pub async fn read(&self, volume: &str, offset: u64, len: u64) -> Result<Vec<u8>, StoreError> {
        Ok(self.read_with_status(volume, offset, len).await?.0.to_vec())
    }

    /// [`Store::read_with_status`] by name.
    pub async fn read_with_status(
        &self,
        volume: &str,
        offset: u64,
        len: u64,
    ) -> Result<(ReadData, Vec<(u64, bool)>), StoreError> {
        let dataset = self.export_dataset(volume)?;
        self.read_with_status_in(&dataset, offset, len).await
    }

    /// Reads `len` bytes at `offset`, and says which parts are allocated as
    /// [`Store::block_status`] would: runs of (bytes, allocated) in order. The read looks up
    /// every block's pointer anyway, so an NBD read that sends holes as hole chunks gets the
    /// map without a second walk of the tree (that walk was 6% of the server's CPU on uncached
    /// random reads).
    pub async fn read_with_status_in(
        &self,
        dataset: &Dataset,
        offset: u64,
        len: u64,
    ) -> Result<(ReadData, Vec<(u64, bool)>), StoreError> {
        let admission =
            Admission { spa: &self.spa, dsl: &self.dsl, txg: &self.txg, sync: self.sync_handle() };
        read_with_status_in(admission, dataset, offset, len).await
    }

    /// Writes `data` at `offset` into the open txg ([`WritePath::modify`]).
    pub(super) async fn modify(
        &self,
        dataset: &Dataset,
        offset: u64,
        len: u64,
        payload: Option<WriteData<'_>>,
        apply: Apply,
    ) -> Result<u64, StoreError> {
        self.modify_with(dataset, offset, len, payload, apply, Vec::new()).await
    }

    /// [`Store::modify`] with blocks already written in place: each `(index, block)` of
    /// `stored` becomes the open txg's block `index` (its `data`, not a copy) together with the
    /// record that its sync links `block.bp` rather than write it, under the one lock, so no
    /// sync finds the one without the other (a raw receive's sealed blocks).
    pub(super) async fn modify_with(
        &self,
        dataset: &Dataset,
        offset: u64,
        len: u64,
        payload: Option<WriteData<'_>>,
        apply: Apply,
        stored: Vec<(u64, Prewritten)>,
    ) -> Result<u64, StoreError> {
        let (sequence, resolve) =
            self.write_path().modify(dataset, offset, len, payload, apply, stored).await?;
        let _guard = self.spa.panic_guard("the write path");
        for index in resolve {
            resolve_patch(self.spa.pool(), &self.txg, dataset, index).await?;
        }
        Ok(sequence)
    }

    fn write_path(&self) -> WritePath<'_> {
        WritePath {
            spa: &self.spa,
            dsl: &self.dsl,
            txg: &self.txg,
            zil: &self.zil,
            sync: self.sync_handle(),
        }
    }

    /// [`Store::write_data_in`] (`data`) or [`Store::zero_in`] (`None`) of `len` bytes for a
    /// client that is answered as soon as this returns: the patches the change leaves to
    /// complete now (other requests in flight, or write pressure; `WritePath::modify`) are
    /// completed by tasks of their own ([`Store::complete_patches_beside`]), a bounded number
    /// at once on each core (the others wait in that core's line for one of them), rather than
    /// before the answer.
    /// Completing one may read the block's version on disk; with no data cached, 4 and 8 KiB
    /// writes into 16 KiB blocks from eight clients waited that read out before each answer
    /// (write p50 251 us against 113 with the cache: docs/bench/peers-notes.md). The change is
    /// whole without them: its log record holds its bytes (or its range, for a zero), reads
    /// apply the patch over the version below, and the sync completes whatever is left.
    pub async fn modify_answering_early(
        self: &Arc<Self>,
        dataset: &Arc<Dataset>,
        offset: u64,
        len: u64,
        data: Option<WriteData<'_>>,
    ) -> Result<u64, StoreError> {
        debug_assert!(data.as_ref().is_none_or(|d| d.len() as u64 == len));
        let (sequence, resolve) =
            self.write_path().modify(dataset, offset, len, data, Apply::Live, Vec::new()).await?;
        self.complete_patches_beside(dataset, resolve);
        Ok(sequence)
    }

    /// Which parts of `[offset, offset+len)` hold data and which are holes (never written,
    /// trimmed or zeroed), as runs of (length, allocated), at block granularity. Holes read
    /// as zeros; a block written with zeros counts as allocated.
    pub async fn block_status(
        &self,
        volume: &str,
        offset: u64,
        len: u64,
    ) -> Result<Vec<(u64, bool)>, StoreError> {
        let dataset = self.export_dataset(volume)?;
        self.block_status_in(&dataset, offset, len).await
    }

    /// [`Store::block_status`] through a handle's dataset.
    pub async fn block_status_in(
        &self,
        dataset: &Dataset,
        offset: u64,
        len: u64,
    ) -> Result<Vec<(u64, bool)>, StoreError> {
        block_status_in(&self.spa, &self.dsl, dataset, offset, len).await
    }

    /// Writes `data` at `offset`. The write is visible at once and durable after the next
    /// txg sync or a [`Store::commit`] of the returned record sequence (FUA, flush).
    pub async fn write(&self, volume: &str, offset: u64, data: &[u8]) -> Result<u64, StoreError> {
        let dataset = self.export_dataset(volume)?;
        self.write_in(&dataset, offset, data).await
    }

    /// [`Store::write`] through a handle's dataset.
    pub async fn write_in(
        &self,
        dataset: &Dataset,
        offset: u64,
        data: &[u8],
    ) -> Result<u64, StoreError> {
        self.write_data_in(dataset, offset, WriteData::Borrowed(data)).await
    }

    /// [`Store::write_in`] of bytes given as a slice or handed over; a small write handed over
    /// is logged in its own buffer rather than in a copy of it.
    pub async fn write_data_in(
        &self,
        dataset: &Dataset,
        offset: u64,
        data: WriteData<'_>,
    ) -> Result<u64, StoreError> {
        let len = data.len() as u64;
        self.modify(dataset, offset, len, Some(data), Apply::Live).await
    }

    /// Zeroes a range; whole blocks become holes and their space is freed at the next sync.
    /// Logged like a write; returns the record sequence.
    pub async fn zero(&self, volume: &str, offset: u64, len: u64) -> Result<u64, StoreError> {
        let dataset = self.export_dataset(volume)?;
        self.zero_in(&dataset, offset, len).await
    }

    /// [`Store::zero`] through a handle's dataset.
    pub async fn zero_in(
        &self,
        dataset: &Dataset,
        offset: u64,
        len: u64,
    ) -> Result<u64, StoreError> {
        self.modify(dataset, offset, len, None, Apply::Live).await
    }
}

/// What a write works with (ZFS: `dmu_write` with its `dmu_tx` and the log's `itx`): the pool
/// (its liveness, test points and clock), the namespace's check that the volume still exists,
/// the open txg, the logs' choice of logging by pointer, and admission, which may wait for
/// syncs through the handle.
#[derive(Clone, Copy)]
pub(super) struct WritePath<'a> {
    spa: &'a Spa,
    dsl: &'a Dsl,
    txg: &'a Txg,
    zil: &'a Zil,
    sync: SyncHandle<'a>,
}

impl WritePath<'_> {
    /// Whether a change of a volume of key family `family` may go into the open txg: a
    /// client's write only while the family is writable (loaded, and neither being unloaded
    /// nor replaying its log); a replayed record whenever the key is loaded.
    fn key_allows(&self, apply: Apply, family: u64) -> bool {
        let keys = self.spa.pool().zio().keys();
        match apply {
            Apply::Live => self.spa.crypt().writable(keys, family),
            Apply::Replay(_) => family == 0 || keys.is_loaded(family),
            Apply::Receive => true,
        }
    }

    /// Writes `data` at `offset` into the open txg. `None` writes zeros (trim, write-zeroes):
    /// whole blocks become holes. Live writes are appended to the volume's intent log in the
    /// same critical section that puts their blocks in the open txg, so the log's order is
    /// the order in which the blocks changed. Replayed writes are not logged again; they
    /// advance the volume's replayed sequence instead, which the sync that writes their blocks
    /// records. Returns the record's sequence, and the blocks left as patches that the caller
    /// should complete now ([`resolve_patch`]; see `pressure` below).
    pub(super) async fn modify(
        &self,
        dataset: &Dataset,
        offset: u64,
        len: u64,
        mut payload: Option<WriteData<'_>>,
        apply: Apply,
        mut stored: Vec<(u64, Prewritten)>,
    ) -> Result<(u64, Vec<u64>), StoreError> {
        self.spa.check_live()?;
        let _guard = self.spa.panic_guard("the write path");
        self.dsl.check_exists(dataset)?;
        if dataset.read_only {
            return Err(StoreError::ReadOnly {
                pool: self.spa.pool().name().to_owned(),
                volume: dataset.name(),
            });
        }
        // An encrypted volume takes no write its sync could not encrypt.
        let family = dataset.state.lock().entry.key_family;
        if !self.key_allows(apply, family) {
            return Err(StoreError::KeyUnavailable {
                pool: self.spa.pool().name().to_owned(),
                volume: dataset.name(),
            });
        }
        // Waits out a rollback of the volume (its sync); the size may change with it. A
        // receive that replaces the volume holds the gate too, and destroys it meanwhile.
        let _not_rolling_back = dataset.rollback_gate.read().await;
        self.dsl.check_exists(dataset)?;
        dataset.check_range(dataset.size_bytes(), offset, len)?;
        if len == 0 {
            // Nothing changes, so nothing is logged; the last record still covers the caller.
            let log = dataset.state.lock().log.clone();
            return Ok((log.map_or(0, |log| log.last_record()), Vec::new()));
        }
        let bs = u64::from(dataset.block_bytes);
        let end = offset + len;
        let (first, last) = (offset / bs, (end - 1) / bs);
        let admission = Admission { spa: self.spa, dsl: self.dsl, txg: self.txg, sync: self.sync };
        let whole_blocks = (last - first + 1) * bs;
        let admitted = admission
            .assign(dataset, whole_blocks, apply == Apply::Live && payload.is_some())
            .await?;
        self.spa.pause_point("dmu.assigned").await;
        // Whole blocks are built outside the lock.
        let mut whole: Vec<(u64, Block)> = Vec::new();
        for index in first..=last {
            let (from, to) = ((index * bs).max(offset), ((index + 1) * bs).min(end));
            if to - from == bs {
                let given = stored.iter().find(|(i, _)| *i == index);
                let block = match (given, &payload) {
                    (Some((_, p)), _) => Block::Data(Arc::clone(&p.data)),
                    // A received block is the block itself; other bytes are copied.
                    (None, Some(d)) => {
                        Block::Data(d.block((from - offset) as usize..(to - offset) as usize))
                    }
                    (None, None) => Block::Zero,
                };
                whole.push((index, block));
            }
        }
        // The blocks the write covers in part: at most its first and its last (no allocation
        // on the small-write path).
        let ends = [first, last];
        let ends = if first == last { &ends[..1] } else { &ends[..] };
        let partial = ends.iter().copied().filter(|&i| {
            let (from, to) = ((i * bs).max(offset), ((i + 1) * bs).min(end));
            to - from != bs
        });
        let (sequence, resolve_now) = {
            let mut txg_guard = self.txg.lock();
            let txg = &mut *txg_guard;
            let open_txg = txg.open_txg();
            // Checked again where neither a destroy nor a resize can run: one may have run
            // since the checks above (this write waited for space or the throttle, or another
            // thread got the lock first), and blocks past a shrunken end would be stored by
            // the next sync.
            self.dsl.check_exists(dataset)?;
            let mut v = dataset.state.lock();
            dataset.check_range(v.entry.size_bytes, offset, len)?;
            // And the key: an unload may have begun while this write waited. One that closes
            // the family after this point finds the write in the txg its sync writes.
            if !self.key_allows(apply, v.entry.key_family) {
                return Err(StoreError::KeyUnavailable {
                    pool: self.spa.pool().name().to_owned(),
                    volume: dataset.name(),
                });
            }
            let mut added = 0u64;
            // Groups of blocks under one level-1 indirect block that had nothing dirty yet:
            // each will rewrite its path to the root.
            let metadata_per_group = v.metadata_per_new_group(self.spa.pool());
            let group = objset::INDIRECT_BPS;
            let new_groups =
                (first / group..=last / group).filter(|&g| v.group_clean(g)).count() as u64;
            // A lone request keeps its patches for later: it is answered without a read, and
            // the sync reads the blocks. With other requests in flight, or under write
            // pressure, the writer completes its own patches now (below), as before patches
            // existed: measured with 8 and 32 sync writers, a sync that must read a txg's worth
            // of blocks at once delays the log flushes every writer waits for
            // (docs/bench/peers-notes.md).
            let pressure = dataset.requests.load(Ordering::Relaxed) > 1
                || txg.dirty_bytes() >= self.txg.limits().delay_min / 2;
            let mut resolve_now = Vec::new();
            for index in partial {
                let (from, to) = ((index * bs).max(offset), ((index + 1) * bs).min(end));
                let (at, n) = ((from - index * bs) as usize, (to - from) as usize);
                let bytes = payload
                    .as_ref()
                    .map(|d| d.slice((from - offset) as usize..(to - offset) as usize));
                // The open txg's own whole block that nothing else holds (no reader, no sync,
                // no block written in place for the log, no cache entry) is changed where it
                // lies; any other holder sees its version unchanged because it forces a copy.
                if let Some(Block::Data(current)) = v.open.get_mut(&index) {
                    if let Some(whole) = Arc::get_mut(current) {
                        match bytes {
                            Some(b) => whole[at..at + n].copy_from_slice(b),
                            None => whole[at..at + n].fill(0),
                        }
                        added += bs;
                        continue;
                    }
                }
                // So is the open txg's own patch that nothing else holds (a reader takes a
                // clone of the `Arc`): no copy of the block and its sector map per write.
                if let Some(Block::Patched(current)) = v.open.get_mut(&index) {
                    if let Some(patch) = Arc::get_mut(current) {
                        patch.write(at, n, bytes);
                        if patch.complete() {
                            let whole = patch.take_applied(None);
                            v.open.insert(index, Block::Data(Arc::new(whole)));
                        } else if pressure {
                            resolve_now.push(index);
                        }
                        added += bs;
                        continue;
                    }
                }
                // A version in memory is patched in place; none means the version below is on
                // disk, and this write becomes a patch over it, read only when needed.
                let base = match v.open.get(&index).or_else(|| v.syncing.get(&index)) {
                    Some(Block::Data(current)) => Ok(current.as_ref().clone()),
                    Some(Block::Zero) => Ok(AlignedBuf::zeroed(bs as usize)),
                    Some(Block::Patched(patch)) if v.open.contains_key(&index) => {
                        Err(patch.as_ref().clone())
                    }
                    Some(Block::Patched(_)) | None => Err(Patch::new(bs)),
                };
                let block = match base {
                    Ok(mut whole) => {
                        match bytes {
                            Some(b) => whole[at..at + n].copy_from_slice(b),
                            None => whole[at..at + n].fill(0),
                        }
                        Block::Data(Arc::new(whole))
                    }
                    Err(mut patch) => {
                        patch.write(at, n, bytes);
                        if patch.complete() {
                            Block::Data(Arc::new(patch.take_applied(None)))
                        } else {
                            if pressure {
                                resolve_now.push(index);
                            }
                            Block::Patched(Arc::new(patch))
                        }
                    }
                };
                v.open.insert(index, block);
                added += bs;
            }
            // A block zeroed is a free for its sync's space map, as a replaced one is.
            let mut zeroed = 0;
            for (index, block) in whole.drain(..) {
                match &block {
                    Block::Data(_) => added += bs,
                    _ => zeroed += 1,
                }
                v.open.insert(index, block);
            }
            if !stored.is_empty() {
                let mut orphaned = Vec::new();
                for (index, mut block) in stored.drain(..) {
                    // Born in the txg that links it, whichever it was sealed for.
                    block.bp.birth_txg = open_txg;
                    if let Some(replaced) = v.prewritten.insert(index, block) {
                        orphaned.push(replaced);
                    }
                    txg.count_prewritten(bs, self.spa.pool().inflate(bs, bs));
                }
                if !orphaned.is_empty() {
                    txg.queue(super::dataset::Orphaned(orphaned));
                }
            }
            self.spa.fail_point("dmu.modify");
            let sequence = match apply {
                Apply::Live => match &v.log {
                    Some(log) => append_records(
                        log,
                        self.spa.pool().env().now(),
                        open_txg,
                        offset,
                        len,
                        &mut payload,
                        self.zil.by_pointer(&v.entry, log.max_block_bytes(), len),
                    ),
                    None => 0,
                },
                Apply::Replay(sequence) => {
                    if let Some(header) = v.entry.log.as_mut() {
                        header.replayed_record = sequence;
                    }
                    0
                }
                Apply::Receive => 0,
            };
            let alloc = self.spa.pool().inflate(added, bs);
            txg.count_dirty(added, alloc, new_groups * metadata_per_group, added / bs + zeroed);
            admitted.landed();
            dataset.dirty_bytes.fetch_add(added, Ordering::Relaxed);
            (sequence, resolve_now)
        };
        Ok((sequence, resolve_now))
    }
}

/// A span's encrypted bytes from which its blocks are decrypted on every core rather than on
/// the reading connection's alone.
const SPREAD_OPEN_BYTES_MIN: u64 = 256 << 10;

/// Whether the blocks of a span, by their pointers, are opened on every core
/// ([`open_spread`]): several encrypted blocks of at least [`SPREAD_OPEN_BYTES_MIN`] in all.
fn worth_spreading<'a>(pool: &Pool, blocks: impl IntoIterator<Item = &'a BlockPointer>) -> bool {
    let (mut encrypted, mut bytes) = (0, 0);
    for bp in blocks {
        encrypted += usize::from(matches!(bp.crypt, sluice_format::BlockCrypt::Encrypted { .. }));
        bytes += bp.psize_bytes();
    }
    encrypted > 1 && bytes >= SPREAD_OPEN_BYTES_MIN && pool.env().parallelism() > 1
}

/// The blocks of a span read of several encrypted blocks (`index`, pointer, offset in the
/// span), each decrypted (and decompressed) from the span into a buffer of its own
/// ([`crate::zio::unseal_from`]) on whichever core takes it. On the connection's core alone
/// the decryption of every request in flight queued behind one another: uncached 1 MiB reads
/// of an encrypted volume of 128 KiB blocks ran at 0.73x of one that is not, on a core 64%
/// busy (bench/encryption.py, 2026-11-29); and again once the prefetcher's spans were opened
/// on the reading core (0.73x-0.78x, 2026-12-01).
async fn open_spread(
    pool: &Pool,
    blocks: &[(u64, BlockPointer, usize)],
    span: Arc<AlignedBuf>,
) -> Result<Vec<(u64, Option<Fetched>)>, StoreError> {
    let items = blocks
        .iter()
        .map(|&(_, bp, at)| (bp, Arc::clone(&span), at, Arc::clone(pool.zio())))
        .collect();
    let opened = pool
        .env()
        .map_spread("zio_read_intr", items, |(bp, span, at, pipeline)| {
            let stored = &span[*at..*at + bp.psize_bytes() as usize];
            crate::zio::unseal_from(pipeline.keys(), bp, stored)
        })
        .await;
    let mut out = Vec::with_capacity(blocks.len());
    for (&(index, bp, _), opened) in blocks.iter().zip(opened) {
        let logical = opened.map_err(|source| pool.undecodable(&bp, source))?;
        out.push((index, Some(Fetched::Whole(Arc::new(logical)))));
    }
    Ok(out)
}

/// A block fetched ahead, from its stored bytes at `at` in `span`: served where it lies when it
/// is stored plain, else opened (decrypted, decompressed) into a buffer of its own.
fn open_held(
    pool: &Pool,
    bp: &BlockPointer,
    span: Arc<AlignedBuf>,
    at: usize,
) -> Result<Fetched, StoreError> {
    let plain = bp.compression == sluice_format::BlockCompression::None
        && !matches!(bp.crypt, sluice_format::BlockCrypt::Encrypted { .. });
    if plain {
        return Ok(Fetched::Span(span, at));
    }
    let stored = &span[at..at + bp.psize_bytes() as usize];
    Ok(Fetched::Whole(Arc::new(pool.unseal(bp, stored)?)))
}

/// Data blocks `start..` with pointers `bps`: in one I/O when there are several, else (or
/// when the span fails) one by one through the cache, which heals bad copies.
async fn read_blocks(
    pool: &Pool,
    start: u64,
    bps: &[BlockPointer],
) -> Result<Vec<(u64, Option<Fetched>)>, StoreError> {
    if bps.len() > 1 {
        if let Ok(mut span) = pool.read_span(bps).await {
            if worth_spreading(pool, bps) {
                let mut at = 0usize;
                let mut blocks = Vec::with_capacity(bps.len());
                for (index, bp) in (start..).zip(bps) {
                    blocks.push((index, *bp, at));
                    at += bp.psize_bytes() as usize;
                }
                return open_spread(pool, &blocks, Arc::new(span)).await;
            }
            // Encrypted blocks are decrypted where they lie in the span: an uncompressed one is
            // then served from it as a plain one is, with no copy.
            let mut at = 0usize;
            for bp in bps {
                let len = bp.psize_bytes() as usize;
                pool.open_in_place(bp, &mut span[at..at + len])?;
                at += len;
            }
            let span = Arc::new(span);
            let mut at = 0usize;
            let mut out = Vec::with_capacity(bps.len());
            for (i, bp) in bps.iter().enumerate() {
                let len = bp.psize_bytes() as usize;
                // As they lie in the span once opened: not compressed.
                let plain = bp.compression == sluice_format::BlockCompression::None;
                let fetched = if plain {
                    Fetched::Span(Arc::clone(&span), at)
                } else {
                    Fetched::Whole(Arc::new(pool.decompressed(bp, &span[at..at + len])?))
                };
                out.push((start + i as u64, Some(fetched)));
                at += len;
            }
            return Ok(out);
        }
    }
    let mut out = Vec::with_capacity(bps.len());
    for (i, bp) in bps.iter().enumerate() {
        let block = pool.read_block_cached(bp, crate::tunables::IoClass::SyncRead).await?;
        out.push((start + i as u64, Some(Fetched::Whole(block))));
    }
    Ok(out)
}

/// [`Store::read_with_status_in`]: the pool's and the namespace's parts of a read (the store
/// suspended, the volume destroyed), then the read of the dataset's layers and tree. A read
/// that finds a stream's blocks scattered hands them to the open txg through `admission`
/// (dmu_rewrite.rs).
async fn read_with_status_in(
    admission: Admission<'_>,
    dataset: &Dataset,
    offset: u64,
    len: u64,
) -> Result<(ReadData, Vec<(u64, bool)>), StoreError> {
    let (spa, dsl) = (admission.spa, admission.dsl);
    spa.check_live()?;
    dsl.check_exists(dataset)?;
    dataset.check_range(dataset.size_bytes(), offset, len)?;
    // Nothing of an encrypted volume is read without its key, its holes included: what
    // answers reads is the volume with its key, whatever the range holds.
    let family = dataset.key_family();
    if family != 0 && !spa.pool().zio().keys().is_loaded(family) {
        return Err(StoreError::KeyUnavailable {
            pool: spa.pool().name().to_owned(),
            volume: dataset.name(),
        });
    }
    if len == 0 {
        return Ok((ReadData::default(), Vec::new()));
    }
    let bs = u64::from(dataset.block_bytes);
    let mut out = ReadData::default();
    let first = offset / bs;
    let last = (offset + len - 1) / bs;
    // The prefetch sees each read before it waits for anything, so that a client's queued
    // reads reach it in the order they came.
    let hit = dataset.zfetch.access(spa.pool().env().now(), first..last + 1);
    // Whether each block `first..=last` holds data; holes and zeroed blocks do not.
    let mut allocated = vec![true; (last - first + 1) as usize];
    // Blocks with a version in memory go through `block`; the others are read from the
    // root of the same snapshot, adjacent ones in spans of one I/O each.
    let (in_memory, root, levels, shared_up_to) = {
        let v = dataset.state.lock();
        let in_memory: Vec<u64> = (first..=last).filter(|i| v.cached(*i).is_some()).collect();
        (in_memory, v.entry.root, v.disk_levels, dmu_rewrite::shared_up_to(dataset, &v))
    };
    let mut reads: Vec<Read> = Vec::new();
    // A stream's blocks read from the disk, in block order: if they lie scattered, the read
    // rewrites them (dmu_rewrite.rs). Blocks the cache holds cost the stream nothing now.
    let run_bytes_min = dataset.zfetch.rewrite_run_bytes();
    let mut on_disk: Option<Vec<(u64, BlockPointer)>> =
        (hit.is_some() && run_bytes_min > 0 && shared_up_to.is_some()).then(Vec::new);
    // The pointers of the blocks not in memory, a level-1 indirect block at a time.
    let pointers = if in_memory.len() as u64 == last - first + 1 {
        Vec::new()
    } else {
        objset::data_block_pointers(spa.pool(), root, levels, first..last + 1).await?
    };
    let mut pointers = pointers.into_iter().peekable();
    for index in first..=last {
        // In block order, holes left out: those before this block are passed by.
        while pointers.next_if(|(i, _)| *i < index).is_some() {}
        let pointer = pointers.next_if(|(i, _)| *i == index).map(|(_, bp)| bp);
        if in_memory.binary_search(&index).is_ok() {
            reads.push(Read::Memory(index));
            continue;
        }
        let Some(bp) = pointer else {
            allocated[(index - first) as usize] = false;
            continue;
        };
        spa.pool().check_key(&bp)?;
        if let Some(hit) = spa.pool().cache().get(&bp) {
            reads.push(Read::Cached(index, hit));
            continue;
        }
        if let Some(found) = on_disk.as_mut() {
            found.push((index, bp));
        }
        if let Some(held) = dataset.zfetch.take(index, &bp) {
            if let Some(Read::Held(start, run)) = reads.last_mut() {
                if *start + run.len() as u64 == index && run[0].span.ptr_eq(&held.span) {
                    run.push(held);
                    continue;
                }
            }
            reads.push(Read::Held(index, vec![held]));
            continue;
        }
        if let Some(Read::Span(start, bps)) = reads.last_mut() {
            let joins = *start + bps.len() as u64 == index
                && crate::pool::follows(&bps[bps.len() - 1], &bp)
                && (bps.len() as u64 + 1) * bs <= READ_SPAN_BYTES_MAX;
            if joins {
                bps.push(bp);
                continue;
            }
        }
        reads.push(Read::Span(index, vec![bp]));
    }
    // A read that went to the disk fetches ahead (dmu_zfetch.rs).
    let to_disk = reads.iter().any(|r| matches!(r, Read::Span(..) | Read::Held(..)));
    let (mut rewrite, rewrite_run_bytes) = match (on_disk, shared_up_to) {
        (Some(found), Some(up_to)) => dmu_rewrite::plan(dataset, found, run_bytes_min, up_to),
        _ => (Vec::new(), 0),
    };
    rewrite.reverse();
    let mut rewritten: Vec<dmu_rewrite::Found> = Vec::with_capacity(rewrite.len());

    let fetch_ahead = hit.filter(|_| to_disk).and_then(|hit| dataset.zfetch.batch(hit));
    // Nothing past the volume's end is fetched.
    let blocks = dataset.size_bytes().div_ceil(bs);
    let fetch_ahead = fetch_ahead
        .map(|mut batch| {
            batch.blocks.end = batch.blocks.end.min(blocks);
            batch
        })
        .filter(|batch| !batch.blocks.is_empty());
    if let Some(batch) = fetch_ahead {
        let tree = {
            let v = dataset.state.lock();
            BatchTree {
                root: v.entry.root,
                levels: v.disk_levels,
                in_memory: v.in_memory(&batch.blocks),
            }
        };
        let fetch = dmu_zfetch::fetch(spa.fetch_access(), Arc::clone(&dataset.zfetch), batch, tree);
        // On the reading core, though it is the busy one: a batch on another core, which
        // sleeps between completions, woke it for each of its I/Os, and that cost what the
        // reading core saved (docs/bench/peers-notes.md, 2026-12-07).
        spa.pool().env().spawn("dmu_zfetch", fetch);
    }
    // Fetched concurrently (in order), then copied into place.
    let mut fetched = futures::stream::iter(reads)
        .map(|read| async move {
            match read {
                Read::Memory(index) => {
                    let block = dataset.block(spa.pool(), index).await?;
                    Ok::<_, StoreError>(vec![(index, block.map(Fetched::Whole))])
                }
                Read::Cached(index, hit) => Ok(vec![(index, Some(Fetched::Whole(hit)))]),
                Read::Span(start, bps) => read_blocks(spa.pool(), start, &bps).await,
                Read::Held(start, run) => {
                    let mut out = Vec::with_capacity(run.len());
                    match run[0].span.clone().await {
                        Some(span) if worth_spreading(spa.pool(), run.iter().map(|h| &h.bp)) => {
                            let blocks: Vec<_> =
                                (start..).zip(&run).map(|(i, h)| (i, h.bp, h.at)).collect();
                            out = open_spread(spa.pool(), &blocks, span).await?;
                        }
                        Some(span) => {
                            for (i, held) in (start..).zip(&run) {
                                let block =
                                    open_held(spa.pool(), &held.bp, Arc::clone(&span), held.at)?;
                                out.push((i, Some(block)));
                            }
                        }
                        // The fetch found no good copy: the reads' own, block by block, find
                        // and heal what they can (blocks one I/O fetched with gaps between
                        // them are no span of the read path's).
                        None => {
                            for (i, held) in (start..).zip(&run) {
                                out.extend(read_blocks(spa.pool(), i, &[held.bp]).await?);
                            }
                        }
                    }
                    Ok(out)
                }
            }
        })
        .buffered(READ_BLOCKS_IN_FLIGHT);
    // The bytes of blocks `first..index` (holes read as zeros), within the request.
    let upto = |index: u64| ((index * bs).max(offset).min(offset + len) - offset) as usize;
    let mut next = first;
    while let Some(result) = fetched.next().await {
        for (index, block) in result? {
            // Blocks with no pointer were never fetched: zeros up to this one.
            out.push_zeros(upto(index) - upto(next));
            next = index + 1;
            let block_start = index * bs;
            let from = (offset.max(block_start) - block_start) as usize;
            let to = ((offset + len).min(block_start + bs) - block_start) as usize;
            // The blocks to rewrite come in the same order, each at most once; their bytes
            // are copied only if the rewrite takes them.
            while rewrite.last().is_some_and(|&(i, _)| i < index) {
                rewrite.pop();
            }
            if let Some(&(_, bp)) = rewrite.last().filter(|&&(i, _)| i == index) {
                rewrite.pop();
                let bytes = match &block {
                    Some(Fetched::Whole(buf)) => Some((Arc::clone(buf), None)),
                    Some(Fetched::Span(buf, at)) => Some((Arc::clone(buf), Some(*at))),
                    None => None,
                };
                if let Some((buf, at)) = bytes {
                    rewritten.push(dmu_rewrite::Found { index, bp, buf, at });
                }
            }
            match block {
                Some(Fetched::Whole(buf)) => out.push_bytes(&buf, from..to),
                Some(Fetched::Span(buf, at)) => out.push_bytes(&buf, at + from..at + to),
                None => {
                    allocated[(index - first) as usize] = false;
                    out.push_zeros(to - from);
                }
            }
        }
    }
    out.push_zeros(upto(last + 1) - upto(next));
    assert_eq!(out.len() as u64, len, "a read returns every byte asked for");
    if !rewritten.is_empty() {
        spa.pause_point("dmu_rewrite.found").await;
        dmu_rewrite::rewrite(admission, dataset, root, rewritten, rewrite_run_bytes);
    }
    let mut runs: Vec<(u64, bool)> = Vec::new();
    for (i, &data) in allocated.iter().enumerate() {
        let block_start = (first + i as u64) * bs;
        let n = (offset + len).min(block_start + bs) - offset.max(block_start);
        match runs.last_mut() {
            Some((run, kind)) if *kind == data => *run += n,
            _ => runs.push((n, data)),
        }
    }
    debug_assert_eq!(runs.iter().map(|&(n, _)| n).sum::<u64>(), len);
    Ok((out, runs))
}

/// [`Store::block_status_in`], through the pool and the namespace alone.
async fn block_status_in(
    spa: &Spa,
    dsl: &Dsl,
    dataset: &Dataset,
    offset: u64,
    len: u64,
) -> Result<Vec<(u64, bool)>, StoreError> {
    spa.check_live()?;
    dsl.check_exists(dataset)?;
    dataset.check_range(dataset.size_bytes(), offset, len)?;
    let bs = u64::from(dataset.block_bytes);
    let mut runs: Vec<(u64, bool)> = Vec::new();
    let mut at = offset;
    while at < offset + len {
        let index = at / bs;
        let n = (bs - at % bs).min(offset + len - at);
        let cached = dataset.state.lock().cached(index).cloned();
        let allocated = match cached {
            Some(Block::Data(_) | Block::Patched(_)) => true,
            Some(Block::Zero) => false,
            None => {
                let (root, levels) = {
                    let v = dataset.state.lock();
                    (v.entry.root, v.disk_levels)
                };
                objset::is_allocated(spa.pool(), root, levels, index).await?
            }
        };
        match runs.last_mut() {
            Some((run, kind)) if *kind == allocated => *run += n,
            _ => runs.push((n, allocated)),
        }
        at += n;
    }
    Ok(runs)
}
