//! A volume's log commit (ZFS: `zil_commit`, with `zvol_get_data` and `dmu_sync` for the
//! records logged by pointer): what answers a FUA write and a flush. A commit fills the
//! volume's records logged by pointer (each block written in place once, on a single leaf
//! unflushed, the lwb carrying its record flushing it; or its bytes copied into the record),
//! has the log writer (crate::intent_log) write the chain up to its record, and falls back to
//! a txg sync where the log cannot answer: a chain not yet anchored by a sync, a failed log
//! write, a fill with no room. An early commit starts a lone writer's record before its flush
//! arrives.
//!
//! [`LogCommit`] holds what a commit works with: the pool it writes through, the namespace
//! and the open txg it reads a record's block from, the logs' settings and figures, and the
//! right to sync ([`SyncHandle`]), not the store. The logs' pool-wide object, the claim and
//! the replay at import are zil.rs's.

use std::collections::hash_map::Entry;
use std::sync::Arc;

use futures::FutureExt;
use sluice_format::{BlockPointer, LogRecord, SyncMode};

use super::dataset::{Dataset, Dsl, Orphaned};
use super::dbuf::{Block, Prewritten};
use super::dsl_pool::Txg;
use super::spa::Spa;
use super::spa_sync::SyncHandle;
use super::zil::Zil;
use super::{Store, StoreError};
use crate::device::AlignedBuf;
use crate::intent_log::{BlockWritten, DataWrite, LogError, LogWriter};
use crate::pool::PoolError;
use crate::tunables::IoClass;
use crate::vdev::RunBlock;
use crate::zio::{self, BlockProps, Issue, Writer};

impl Store {
    /// A write that is durable when this returns (NBD's FUA): commits up to its own record.
    pub async fn write_durable(
        &self,
        volume: &str,
        offset: u64,
        data: &[u8],
    ) -> Result<(), StoreError> {
        let sequence = self.write(volume, offset, data).await?;
        self.commit(volume, sequence).await
    }

    /// Makes every write and zero on `volume` that returned before this call durable (NBD's
    /// FLUSH; it covers every connection to the volume).
    pub async fn flush(&self, volume: &str) -> Result<(), StoreError> {
        let dataset = self.export_dataset(volume)?;
        self.flush_in(&dataset).await
    }

    /// [`Store::flush`] through a handle's dataset.
    pub async fn flush_in(&self, dataset: &Dataset) -> Result<(), StoreError> {
        let log = dataset.state.lock().log.clone();
        let last = log.as_ref().map_or(0, |log| log.last_record());
        self.log_commit().commit(dataset, last).await
    }

    /// Returns once record `sequence` of `volume`'s log and every earlier one are durable:
    /// through the log when its chain is anchored and healthy, else through a txg sync.
    pub async fn commit(&self, volume: &str, sequence: u64) -> Result<(), StoreError> {
        let dataset = self.export_dataset(volume)?;
        self.log_commit().commit(&dataset, sequence).await
    }

    /// [`Store::commit`] through a handle's dataset.
    pub async fn commit_in(&self, dataset: &Dataset, sequence: u64) -> Result<(), StoreError> {
        self.log_commit().commit(dataset, sequence).await
    }

    /// What a commit works with.
    fn log_commit(&self) -> LogCommit<'_> {
        LogCommit {
            spa: &self.spa,
            dsl: &self.dsl,
            txg: &self.txg,
            zil: &self.zil,
            sync: self.sync_handle(),
        }
    }

    /// Starts writing record `sequence` to `volume`'s log now, without waiting, when the log
    /// asks for it (`intent_log.early_commit`, [`LogWriter::wants_early`]); the caller is a
    /// write that was the only request in flight on the volume. A failure is left to the
    /// client's own commit, which falls back to a txg sync.
    pub fn commit_early(self: &Arc<Self>, dataset: &Arc<Dataset>, sequence: u64) {
        self.start_early(dataset, sequence, true);
    }

    /// [`Store::commit_early`] without the log block: fills the records logged by pointer up
    /// to `sequence` (their blocks written in place), for a part of a write whose payload is
    /// still arriving ([`crate::volume::Volume::write_blocks_ahead`]); the commit of its last
    /// part writes the log block that carries them all.
    pub fn fill_early(self: &Arc<Self>, dataset: &Arc<Dataset>, sequence: u64) {
        self.start_early(dataset, sequence, false);
    }

    /// Whether a write of `len` bytes to `dataset` logs its whole blocks by pointer (ZFS's
    /// `WR_INDIRECT`: `intent_log.immediate_write_bytes`, `logbias`, no dedup); with
    /// logbias=throughput its partial blocks go by pointer too (`Zil::by_pointer`).
    pub fn logs_by_pointer(&self, dataset: &Dataset, len: u64) -> bool {
        let v = dataset.state.lock();
        // A volume without a chain now (a snapshot, an encrypted one awaiting its key) is
        // asked as its chain would be: its writes are refused or wait all the same.
        let log_block_bytes_max = v.log.as_ref().map_or_else(
            || self.zil.settings_for(v.entry.block_bytes).max_block_bytes,
            |log| log.max_block_bytes(),
        );
        self.zil.indirect(&v.entry, log_block_bytes_max, len)
    }

    /// Takes back the change that a part of a larger write counted for the early commit's
    /// pattern ([`LogWriter::note_part`]): the write counts once, with its last part.
    pub(crate) fn note_part(&self, dataset: &Dataset) {
        if let Some(log) = dataset.state.lock().log.as_ref() {
            log.note_part();
        }
    }

    fn start_early(self: &Arc<Self>, dataset: &Arc<Dataset>, sequence: u64, write_log: bool) {
        if !self.zil.early_commit() {
            return;
        }
        let Some(log) = dataset.state.lock().log.clone() else { return };
        if !log.wants_early() {
            return;
        }
        let stats = self.zil.stats();
        if write_log {
            stats.early_commits.inc()
        } else {
            stats.early_fills.inc()
        }
        let store = Arc::clone(self);
        let dataset = Arc::clone(dataset);
        let env = self.spa.pool().env().clone();
        let task = async move {
            let _guard = store.spa.panic_guard("an early log commit");
            let commit = store.log_commit();
            if commit.fill_indirect(&dataset, &log, sequence).await.is_ok() {
                if write_log {
                    let _ = commit.write_log(&log, sequence).await;
                }
            } else {
                // The records it claimed are back, unfilled, at the front of the chain, and a
                // client's commit that found them claimed is waiting behind them without
                // claiming them again: a sync makes them durable and wakes it (the client's
                // own commit would have fallen back to one too). A failed sync suspended the
                // store, and `fill_indirect` or this wakes it to report that.
                if store.sync().await.is_err() {
                    log.fail();
                }
            }
        };
        if write_log {
            env.spawn("early log commit", task);
        } else {
            env.spawn_elsewhere("early log fill", task);
        }
    }
}

/// What a log commit works with (see the module doc).
#[derive(Clone, Copy)]
pub(super) struct LogCommit<'a> {
    spa: &'a Spa,
    dsl: &'a Dsl,
    txg: &'a Txg,
    zil: &'a Zil,
    sync: SyncHandle<'a>,
}

impl LogCommit<'_> {
    /// Returns once record `sequence` of `dataset`'s log and every earlier one are durable.
    pub(super) async fn commit(&self, dataset: &Dataset, sequence: u64) -> Result<(), StoreError> {
        self.spa.check_live()?;
        let _guard = self.spa.panic_guard("a log commit");
        self.dsl.check_exists(dataset)?;
        if dataset.read_only {
            // A snapshot has nothing to make durable.
            return Ok(());
        }
        let (log, sync) = {
            let v = dataset.state.lock();
            (v.log.clone(), v.entry.sync)
        };
        if sync == SyncMode::Disabled {
            // The volume's writes become durable with the txg sync; commits are not waited for.
            self.zil.stats().commits_ignored.inc();
            return Ok(());
        }
        let Some(log) = log else {
            // Replay is still running: only a sync makes anything durable.
            self.sync.sync().await?;
            return Ok(());
        };
        log.note_commit();
        if log.durable_record() >= sequence {
            return Ok(());
        }
        self.zil.stats().commits.inc();
        if log.anchored() && self.fill_indirect(dataset, &log, sequence).await.is_ok() {
            match self.write_log(&log, sequence).await {
                Ok(()) => return Ok(()),
                // The sync below covers the record, and replaces the failed chain.
                Err(LogError::Failed { .. } | LogError::Pool(_)) => {}
            }
        }
        self.zil.stats().commits_via_txg.inc();
        // The record's txg is at most the open one, which this sync makes durable. Commits
        // falling back together (every writer of a failed chain) share one sync: the
        // uberblock names the last durable txg.
        let open = self.txg.lock().open_txg();
        self.sync.sync_unless(|| self.spa.pool().uberblock().txg >= open).await
    }

    /// Writes `log` up to record `sequence` (the log writer's commit), and once it is written
    /// wakes the syncer if a block went into a nearly full log region: the sync frees log
    /// blocks. A failed write leaves that to the sync the caller falls back to.
    async fn write_log(&self, log: &LogWriter, sequence: u64) -> Result<(), LogError> {
        log.commit(self.spa.pool(), self.spa.allocator(), sequence).await?;
        if self.zil.log_space_low(log) {
            self.sync.kick();
        }
        Ok(())
    }

    /// Fills `log`'s unfilled indirect records up to `sequence` that no other committer is
    /// filling (ZFS: `zil_get_data`, `dmu_sync`). A record whose block is still the open txg's
    /// version gets that block written in place (started now; durably unless on a single
    /// leaf) and its pointer; the sync links the same block instead of writing it again. Any
    /// other (its txg is syncing, or a later write replaced or zeroed the block) gets the
    /// block's current bytes copied:
    /// replay applies later records after it, so newer bytes are as good; except that records
    /// of the syncing txg that are a large part of what it writes are left to it (the commit
    /// waits for it). An error leaves the records to the next committer; the caller falls back
    /// to a txg sync.
    pub(super) async fn fill_indirect(
        &self,
        dataset: &Dataset,
        log: &LogWriter,
        sequence: u64,
    ) -> Result<(), StoreError> {
        let claimed = log.claim_unfilled(sequence);
        if claimed.is_empty() {
            return Ok(());
        }
        let result = self.fill_claimed(dataset, log, &claimed).await;
        if result.is_err() {
            log.unclaim(&claimed);
            if self.spa.is_suspended() {
                // Committers waiting behind these records (they found them claimed) would
                // wait for ever: no sync will come.
                log.fail();
            }
        }
        result
    }

    async fn fill_claimed(
        &self,
        dataset: &Dataset,
        log: &LogWriter,
        claimed: &[LogRecord],
    ) -> Result<(), StoreError> {
        let bs = u64::from(dataset.block_bytes);
        let index_of = |record: &LogRecord| match record {
            LogRecord::WriteIndirect { offset, .. } => offset / bs,
            other => unreachable!("only indirect records are unfilled: {other:?}"),
        };
        let pointing_at = |record: &LogRecord, block: BlockPointer| match *record {
            LogRecord::WriteIndirect { txg, sequence, offset, len, .. } => {
                LogRecord::WriteIndirect { txg, sequence, offset, len, block }
            }
            ref other => unreachable!("only indirect records are placed: {other:?}"),
        };
        // Records whose block is the open txg's current version are placed; the rest copied,
        // or, where they are a large part of the txg being synced, left to that sync. A block
        // written again within the txg has a record per write, and all of them point at the
        // one block of its current version, placed once (ZFS gives the later ones no block:
        // `TX_WRITE2`), so that a flush after a stream that went over its range more than once
        // writes the range once. Replay applies the later records after an earlier one, so
        // the newer bytes it gets are as good as a copy of the current block (below); import's
        // claim takes a block pointed at twice once (`zil::claim_indirect`).
        // A block a write covered in part (logged by pointer under logbias=throughput) may
        // still be that write's patch over the version on disk: completed first, its other
        // bytes read, so that its whole new version is written in place (ZFS's `dmu_sync`
        // writes the whole dbuf, which the write had read in). Only the open txg's records
        // are placed (an older one's block is copied or left to its sync, below), and the
        // reads go to the device together, as the sync's do.
        let patched: Vec<u64> = {
            let txg = self.txg.lock();
            let v = dataset.state.lock();
            let mut patched: Vec<u64> = claimed
                .iter()
                .filter(|record| record.txg() == txg.open_txg())
                .map(index_of)
                .filter(|index| matches!(v.open.get(index), Some(Block::Patched(_))))
                .collect();
            patched.sort_unstable();
            patched.dedup();
            patched
        };
        let resolved = futures::future::join_all(patched.into_iter().map(|index| {
            super::dbuf_read::resolve_patch(self.spa.pool(), self.txg, dataset, index)
        }));
        resolved.await.into_iter().collect::<Result<Vec<()>, StoreError>>()?;
        let mut place: Vec<(Arc<AlignedBuf>, Vec<&LogRecord>)> = Vec::new();
        let mut placed_at: foldhash::HashMap<u64, usize> =
            foldhash::HashMap::with_capacity_and_hasher(claimed.len(), Default::default());
        let mut copy: Vec<&LogRecord> = Vec::new();
        let mut syncing: Vec<&LogRecord> = Vec::new();
        {
            let txg = self.txg.lock();
            let v = dataset.state.lock();
            for record in claimed {
                let index = index_of(record);
                match v.open.get(&index) {
                    Some(Block::Data(data)) if record.txg() == txg.open_txg() => {
                        match placed_at.entry(index) {
                            Entry::Occupied(at) => place[*at.get()].1.push(record),
                            Entry::Vacant(at) => {
                                at.insert(place.len());
                                place.push((Arc::clone(data), vec![record]));
                            }
                        }
                    }
                    // Of the txg being synced (only one syncs at a time; an older one has
                    // synced, and dropped its records from the log).
                    _ if record.txg() + 1 == txg.open_txg() && txg.syncing_bytes() > 0 => {
                        syncing.push(record)
                    }
                    _ => copy.push(record),
                }
            }
            // A record of the txg being synced has its block written by that sync. A copy in
            // the log writes the block a second time; it pays where it is small, or a small
            // part of what the sync writes (one large write caught as its txg closed: a few
            // log blocks, where waiting would cost the rest of the sync and its fixed flushes).
            // Where the records are large and most of what the sync writes (a flush after a
            // stream of writes that never flushed), the sync writes them in about the time the
            // copies would take, and once: the commit waits for it. (ZFS writes such a block
            // again, to a new place: dmu_sync's late arrival.)
            let bytes = syncing.len() as u64 * bs;
            if bytes < COPY_ALWAYS_BYTES
                || bytes.saturating_mul(COPY_SHARE_OF_SYNC) < txg.syncing_bytes()
            {
                // Older than the rest: copied (and so filled) first.
                copy.splice(0..0, syncing.drain(..));
            }
        }
        let blocks = place
            .iter()
            .map(|(data, records)| (index_of(records[0]), Arc::clone(data), records[0].txg()));
        let placed = self.write_in_place(dataset, blocks.collect()).await?;
        let mut filled: Vec<(LogRecord, Option<DataWrite>)> = Vec::new();
        for ((_, records), placed) in place.iter().zip(placed) {
            match placed {
                Some((bp, write)) => {
                    for record in records {
                        filled.push((pointing_at(record, bp), Some(write.clone())));
                    }
                    self.zil.stats().indirect_records_shared.add(records.len() as u64 - 1);
                }
                None => copy.extend(records),
            }
        }
        log.fill_all(filled);
        for record in copy {
            let (txg, sequence, offset) = (record.txg(), record.sequence(), index_of(record) * bs);
            let filled = match dataset.block(self.spa.pool(), offset / bs).await? {
                Some(data) => LogRecord::Write { txg, sequence, offset, data: data.to_vec() },
                None => LogRecord::Zero { txg, sequence, offset, len: bs },
            };
            self.zil.stats().indirect_records_copied.inc();
            log.fill(filled, None);
        }
        if !syncing.is_empty() {
            // The sync of their txg holds the sync lock from before it closed the txg until
            // the log dropped its records (`LogWriter::synced`): once the lock is had, they
            // are durable and gone.
            drop(self.sync.lock().await);
            // Still there only if that sync failed: the store is suspended, and the caller
            // gives the records back and falls back to a sync, which reports it.
            self.spa.check_live()?;
            self.zil.stats().indirect_records_left_to_sync.add(syncing.len() as u64);
        }
        Ok(())
    }

    /// Writes `blocks` (index, the open txg's version of the block, that txg) of `dataset` in
    /// place now (ZFS: `dmu_sync`) and records each as the volume's prewritten block, which
    /// the sync links instead of writing it again. Returns each block's pointer and write
    /// where it was recorded; `None` where the block changed meanwhile (a later write
    /// replaced it, its txg closed, the volume was destroyed): its write is orphaned, and the
    /// next sync frees its place once the write has ended.
    async fn write_in_place(
        &self,
        dataset: &Dataset,
        blocks: Vec<(u64, Arc<AlignedBuf>, u64)>,
    ) -> Result<Vec<Option<(BlockPointer, DataWrite)>>, StoreError> {
        let bs = u64::from(dataset.block_bytes);
        // Compressed as the sync would (ZFS's dmu_sync does the same), so that a volume written
        // through indirect records is stored as compactly as one written by syncs, and
        // checksummed, on every core: with a volume's connections on one core, compressing
        // and checksumming a 1 MiB write's blocks there alone held 1 MiB write + flush at 0.84x
        // of connections spread over both cores (docs/bench/peers-placement.md).
        // And an encrypted volume's sealed as the sync would seal them: the sync links these
        // very blocks into the tree.
        let (compression, key_family) = {
            let v = dataset.state.lock();
            (self.spa.stored_compression(&v.entry), v.entry.key_family)
        };
        let sealing: Vec<(BlockProps, Arc<AlignedBuf>)> = blocks
            .iter()
            .map(|(_, data, txg)| {
                let mut props = BlockProps::data(Writer::LogIndirect, *txg, compression);
                if key_family != 0 {
                    props.crypt =
                        zio::PropsCrypt::Encrypt { family: key_family, convergent: false };
                }
                (props, Arc::clone(data))
            })
            .collect();
        // A batch stored as it is (nothing compresses, nothing is encrypted) has its places
        // from its logical sizes, and its writes start before its checksums, which are
        // computed while the device writes (`zio::stage_as_is`); any other is sealed first.
        let pool = self.spa.pool();
        let batch = match pool.stage_as_is(&sealing, Some(&dataset.early_abort))? {
            zio::Staging::AsIs(staged) => Batch::Staged(staged),
            zio::Staging::Seal(plan) => {
                Batch::Sealed(pool.seal_blocks_planned(sealing, plan).await?)
            }
        };
        let psizes: Vec<u64> = match &batch {
            Batch::Staged(staged) => staged.psizes(),
            Batch::Sealed(sealed) => sealed.iter().map(zio::Sealed::psize).collect(),
        };
        // Space for each placed block, as data is placed (near the data cursor, so a large
        // write's blocks land back to back), but held like a log block until a sync links it.
        // No room for the blocks in place beside what the syncs were promised: the commit
        // falls back to a txg sync, which writes them once, rather than copying them into log
        // blocks, which would take the room the sync needs (log blocks holding copies of 1 MiB
        // writes filled a nearly full pool until the sync could not place its own blocks).
        let placed = self
            .spa
            .allocator()
            .lock()
            .allocate_indirect_promised(&psizes, pool.root().write_span_bytes(), bs)
            .map_err(|source| PoolError::NoSpace { pool: pool.name().to_owned(), cause: source })?;
        // Counted as their writes are about to start, whatever comes of them.
        self.zil.stats().indirect_blocks_written.add(blocks.len() as u64);
        // Runs of blocks back to back on one vdev, each written as one I/O, from the blocks'
        // own buffers, as a sync writes.
        let stored = |i: usize| match &batch {
            Batch::Staged(staged) => staged.stored(i),
            Batch::Sealed(sealed) => &sealed[i].stored,
        };
        let mut writes = Vec::new();
        let mut block_writes: Vec<DataWrite> = Vec::with_capacity(blocks.len());
        for run in zio::span_runs(&placed, pool.root().write_span_bytes()) {
            let (vdev, _, _) = placed[run.start];
            let pieces = zio::run_blocks(&placed, run.clone(), stored);
            let (done, written) = futures::channel::oneshot::channel::<BlockWritten>();
            let write: DataWrite =
                written.map(|r| r.unwrap_or(BlockWritten::Failed)).boxed().shared();
            block_writes.extend(run.map(|_| write.clone()));
            writes.push(IndirectWrite { vdev, pieces, done });
        }
        let sealed = match batch {
            Batch::Staged(staged) => {
                self.issue_indirect(std::mem::take(&mut writes), true);
                match pool.sum_staged(&staged) {
                    Ok(sealed) => sealed,
                    Err(e) => {
                        // The writes are under way: their places are freed by the next sync
                        // once they end, as for a block that changed meanwhile.
                        let orphaned = (0..blocks.len())
                            .map(|i| Prewritten {
                                data: Arc::clone(&blocks[i].1),
                                bp: zio::describe_place(&staged, i, placed[i]),
                                write: block_writes[i].clone(),
                            })
                            .collect();
                        self.txg.lock().queue(Orphaned(orphaned));
                        return Err(e.into());
                    }
                }
            }
            Batch::Sealed(sealed) => sealed,
        };
        let prewritten: Vec<Prewritten> = (0..blocks.len())
            .map(|i| Prewritten {
                data: Arc::clone(&blocks[i].1),
                bp: zio::describe(&sealed[i], &placed[i..=i]),
                write: block_writes[i].clone(),
            })
            .collect();
        // Recorded for the sync, so that a sync beginning now waits for the writes (which
        // start after this, or for a batch stored as it is have started: a sync that began
        // since closed the blocks' txg, and orphans them here); a block that changed since it
        // was looked at is orphaned (the next sync frees it once its write ends).
        let mut linked = Vec::with_capacity(blocks.len());
        // Asked once, outside the locks: `inflate` looks at the vdev tree.
        let alloc_per_block = self.spa.pool().inflate(bs, bs);
        {
            let mut txg = self.txg.lock();
            let mut v = dataset.state.lock();
            let mut orphaned = Vec::new();
            for ((index, _, block_txg), block) in blocks.iter().zip(prewritten) {
                let current = match v.open.get(index) {
                    Some(Block::Data(data)) => Arc::ptr_eq(data, &block.data),
                    _ => false,
                };
                // A destroy (under the txg lock, as here) orphans the prewritten blocks
                // it finds; one linked after it would be freed by no sync.
                let live = !dataset.destroyed.load(std::sync::atomic::Ordering::Acquire);
                if current && live && *block_txg == txg.open_txg() {
                    linked.push(Some((block.bp, block.write.clone())));
                    if let Some(replaced) = v.prewritten.insert(*index, block) {
                        orphaned.push(replaced);
                    }
                    // The block is on its way to the disk and the sync will not write it, but
                    // it stays dirty: the throttle and the start of the next sync count it,
                    // since until that sync the block and any version it replaced hold
                    // space. Only the space check leaves it out, its space being allocated
                    // already. (Leaving it out of the dirty data too let 1 MiB write + flush
                    // clients fill a pool with blocks written in place and their replaced
                    // versions within one txg timeout: the sync after found no room.)
                    txg.count_prewritten(bs, alloc_per_block);
                } else {
                    orphaned.push(block);
                    linked.push(None);
                }
            }
            if !orphaned.is_empty() {
                txg.queue(Orphaned(orphaned));
            }
        }
        self.issue_indirect(writes, false);
        Ok(linked)
    }

    /// Starts the writes of blocks logged by pointer. `now` submits them to the device before
    /// returning (each write polled once, then the thread's queued submissions sent), for a
    /// caller with CPU work left before its task ends its turn; otherwise they go with the
    /// turn's other I/O.
    ///
    /// On a single leaf, written without a flush of their own: the lwb that carries their
    /// records flushes every vdev they landed on once they and it have completed (ZFS: the
    /// lwb's flush of the vdevs `zil_lwb_add_block` noted), and a sync that links them
    /// flushes before its uberblock. A flush per run cost a device flush each, about five
    /// per MiB on an aged pool (bench/per-op.sh syncwrite-1m). On a mirror or RAID-Z each
    /// run is still written durably, on every present child (`Root::plain_leaf` says why).
    fn issue_indirect(&self, writes: Vec<IndirectWrite>, now: bool) {
        for IndirectWrite { vdev, pieces, done } in writes {
            let pool = Arc::clone(self.spa.pool());
            let leaf = pool.root().plain_leaf(vdev);
            let env = pool.env().clone();
            let mut write = async move {
                let how = Issue { class: IoClass::SyncWrite, durable: leaf.is_none() };
                let ok = pool.issue_run(Writer::LogIndirect, vdev, pieces, how).await.is_ok();
                let _ = done.send(BlockWritten::after(&pool, vdev, leaf, ok));
            }
            .boxed();
            // Polled here once, it queues its I/O; the spawned task polls it on.
            if now && (&mut write).now_or_never().is_some() {
                continue;
            }
            env.spawn("indirect block write", write);
        }
        if now {
            crate::device::core_ring::submit_queued();
        }
    }
}

/// A commit's blocks logged by pointer past their CPU stages: stored as they are and not yet
/// checksummed (their writes go first), or sealed whole.
enum Batch {
    Staged(zio::Staged),
    Sealed(Vec<zio::Sealed>),
}

/// One run's write of blocks logged by pointer, not yet started, and where it reports.
struct IndirectWrite {
    vdev: u32,
    pieces: Vec<RunBlock>,
    done: futures::channel::oneshot::Sender<BlockWritten>,
}

/// Records of the txg being synced are copied into the log while their blocks are less than
/// this fraction (1/N) of what that sync writes, or less than [`COPY_ALWAYS_BYTES`]; past
/// both, their commit waits for the sync.
const COPY_SHARE_OF_SYNC: u64 = 4;

/// Below this, copies of a syncing txg's blocks are always made: a sync costs two rounds of
/// flushes and its metadata besides its data, about what the copies of a few MiB cost in log
/// writes (an estimate, not measured per device).
const COPY_ALWAYS_BYTES: u64 = 4 << 20;
