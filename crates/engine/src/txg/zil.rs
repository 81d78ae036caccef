//! The store's side of the intent log (ZFS: `zil.c`'s `zil_commit`, `zil_claim`,
//! `zil_replay`): commits for FUA writes and flushes, early commits, and at import the claim
//! of every chain's blocks and the replay of their records.
//!
//! The log writer itself (log blocks, the pipelined and batch policies, the chain reader) is
//! `crate::intent_log`; this file decides when to use it and when a txg sync must answer
//! instead (a chain not yet anchored by a sync, or a failed log write).

use std::sync::Arc;

use futures::FutureExt;
use sluice_format::{
    BlockKind, BlockPointer, Checksum, ChecksumAlg, DedupMode, Dva, LogBias, LogHeader, LogRecord,
    LogVerifier, PoolDirectory, SyncMode, VolumeEntry, LOG_HEADER_BYTES,
};

use super::dbuf::{Apply, Block, Prewritten, WriteData};
use super::dmu_tx::TxgLimits;
use super::dsl_synctask::{SyncCx, SyncTask};
use super::spa::Spa;
use super::{Dataset, Store, StoreError};
use crate::alloc::Allocator;
use crate::device::{AlignedBuf, SharedBuf};
use crate::intent_log::{
    self, Chain, ChainOwner, DataWrite, LogAddress, LogError, LogSettings, LogWriter,
};
use crate::pool::{Pool, PoolError};
use crate::tunables::IoClass;
use crate::vdev::VdevAddress;
use crate::zio::{self, BlockProps, Issue, Writer};

/// The store's intent-log object (ZFS: the pool-wide part of `zil.c`): how every chain of the
/// pool writes, when a write is logged by pointer, and what the logs did. Each volume's chain
/// is its own (`Dataset`'s state holds its `LogWriter`); the commits below drive them against
/// the open txg and the syncer, so they stay on the store.
#[derive(Debug)]
pub(super) struct Zil {
    settings: LogSettings,
    /// Writes at least this large are logged by pointer (0: never).
    immediate_write_bytes: u64,
    /// `intent_log.early_commit`: whether a lone sync writer's record starts before its flush.
    early_commit: bool,
    stats: LogStats,
}

impl Zil {
    /// The settings `limits` gives the logs, with what the claim at import counted (`stats`).
    pub(super) fn new(limits: &TxgLimits, stats: LogStats) -> Zil {
        Zil {
            settings: LogSettings {
                policy: limits.log_policy,
                commit_timeout_pct: limits.commit_timeout_pct,
                max_block_bytes: limits.log_block_bytes_max,
            },
            immediate_write_bytes: limits.immediate_write_bytes,
            early_commit: limits.early_commit,
            stats,
        }
    }

    /// What the intent logs did.
    pub(super) fn stats(&self) -> &LogStats {
        &self.stats
    }

    /// How this pool's log chains write.
    pub(super) fn settings(&self) -> LogSettings {
        self.settings
    }

    pub(super) fn early_commit(&self) -> bool {
        self.early_commit
    }

    /// A new chain's id: drawn from the pool's environment, so that a chain found at import
    /// is told from an older one on the same blocks.
    pub(super) fn chain_id(&self, spa: &Spa) -> u64 {
        spa.pool().env().unique_rng("intent log chain").u64().max(1)
    }

    /// A new, not yet anchored log chain for a volume.
    pub(super) fn new_log(&self, spa: &Spa, volume_id: u64) -> Result<Arc<LogWriter>, StoreError> {
        let owner = ChainOwner { chain_id: self.chain_id(spa), volume_id };
        Ok(Arc::new(LogWriter::new(spa.pool().name(), spa.allocator(), self.settings, owner)?))
    }

    /// Whether a block `log` wrote was allocated in a nearly full log region
    /// ([`LogWriter::take_space_low`]), counted as a sync the logs ask for: the committer
    /// then kicks the syncer, whose sync frees the log blocks.
    pub(super) fn log_space_low(&self, log: &LogWriter) -> bool {
        let low = log.take_space_low();
        if low {
            self.stats.syncs_for_log_space.inc();
        }
        low
    }

    /// Whether a write of `len` bytes to the volume `entry` logs its whole blocks by pointer:
    /// with logbias=throughput, or from `intent_log.immediate_write_bytes` on. Not on dedup
    /// volumes (their blocks are placed through the dedup table at sync), nor where a block
    /// would not fit one copied record (the fill copies a block it cannot place).
    pub(super) fn indirect(&self, entry: &VolumeEntry, len: u64) -> bool {
        let limit = self.immediate_write_bytes;
        let large = entry.logbias == LogBias::Throughput || (limit > 0 && len >= limit);
        large
            && entry.dedup == DedupMode::Off
            && entry.block_bytes as usize <= copied_piece_bytes(self.settings.max_block_bytes)
    }
}

/// What the intent logs did: commits, fallbacks to txg syncs, and what import found.
#[derive(Debug, Default)]
pub struct LogStats {
    /// Commits (FUA writes and flushes) that had records to make durable.
    pub commits: crate::stats::Counter,
    /// Commits answered by a txg sync: the chain was not yet anchored, or a log write failed.
    pub commits_via_txg: crate::stats::Counter,
    /// Early commits: a lone sync writer's record sent to the log before its flush arrived.
    pub early_commits: crate::stats::Counter,
    /// Txg syncs asked for because log blocks held most of a vdev's log region.
    pub syncs_for_log_space: crate::stats::Counter,
    /// Chains walked at import, and the blocks found in them.
    pub chains_claimed: crate::stats::Counter,
    pub blocks_claimed: crate::stats::Counter,
    /// Records applied by replay.
    pub records_replayed: crate::stats::Counter,
    /// Records an interrupted replay had already applied in an earlier import, skipped now.
    pub records_already_replayed: crate::stats::Counter,
    /// Records of txgs that had synced before the crash, skipped.
    pub records_already_synced: crate::stats::Counter,
    /// Chains that ended at a block written only in part.
    pub torn_tails: crate::stats::Counter,
    /// Records that no longer fit the volume (it shrank after they were logged), skipped.
    pub records_out_of_range: crate::stats::Counter,
    /// Commits answered at once because the volume has sync=disabled.
    pub commits_ignored: crate::stats::Counter,
    /// Blocks written in place for indirect records (each written once: the sync links it).
    pub indirect_blocks_written: crate::stats::Counter,
    /// Indirect records filled with a copy of their block instead (its txg was syncing, or a
    /// later write had replaced it).
    pub indirect_records_copied: crate::stats::Counter,
    /// Indirect records of the txg being synced whose commit waited for that sync instead of
    /// copying them: they were a large part of what it writes.
    pub indirect_records_left_to_sync: crate::stats::Counter,
    /// Indirect records applied by replay (their blocks read from where the record points).
    pub indirect_records_replayed: crate::stats::Counter,
    /// Chains that ended at an indirect record whose block is not intact or not free: written
    /// after its log block, never acknowledged (ZFS: zil_claim_write).
    pub indirect_chain_ends: crate::stats::Counter,
}

impl Store {
    /// Applies each claimed chain's records that are newer than its claim txg (the last txg
    /// synced before the crash) and than what an interrupted replay already applied, then retires the chains and starts new ones. Syncs
    /// that happen during replay (dirty data) record the progress in the old header, so an
    /// import interrupted here replays every record exactly once in the end.
    pub(super) async fn replay(
        &self,
        chains: Vec<(String, LogHeader, intent_log::Chain)>,
    ) -> Result<(), StoreError> {
        let stats = self.zil.stats();
        for (name, header, chain) in &chains {
            let dataset = self.dataset(name)?;
            for record in chain.blocks.iter().flat_map(|b| b.records.iter()) {
                if record.txg() <= header.claim_txg {
                    stats.records_already_synced.inc();
                    continue;
                }
                if record.sequence() <= header.replayed_record {
                    stats.records_already_replayed.inc();
                    continue;
                }
                // The block of an indirect record was verified when import claimed it.
                let block;
                let (offset, len, data) = match record {
                    LogRecord::Write { offset, data, .. } => {
                        (*offset, data.len() as u64, Some(&data[..]))
                    }
                    LogRecord::Zero { offset, len, .. } => (*offset, *len, None),
                    LogRecord::WriteIndirect { offset, len, block: bp, .. } => {
                        block = self.spa.pool().read_block_logical(bp, IoClass::SyncRead).await?;
                        stats.indirect_records_replayed.inc();
                        let len = u64::from(*len).min(block.len() as u64);
                        (*offset, len, Some(&block[..len as usize]))
                    }
                };
                if dataset.check_range(dataset.size_bytes(), offset, len).is_err() {
                    stats.records_out_of_range.inc();
                    continue;
                }
                let data = data.map(WriteData::Borrowed);
                self.modify(&dataset, offset, len, data, Apply::Replay(record.sequence())).await?;
                stats.records_replayed.inc();
            }
        }
        // Retire the old chains and start new ones; one sync makes it all durable.
        {
            let retired = chains
                .iter()
                .flat_map(|(_, _, chain)| chain.addresses.iter().chain(&chain.indirect).copied())
                .collect();
            self.txg.lock().queue(RetiredLog(retired));
        }
        let datasets: Vec<Arc<Dataset>> = self.dsl.read().values().cloned().collect();
        for dataset in datasets {
            let log = self.zil.new_log(&self.spa, dataset.id)?;
            dataset.state.lock().log = Some(log);
        }
        self.sync().await?;
        Ok(())
    }

    /// Where `volume`'s log chain starts now (its oldest block still needed), if it has one.
    pub fn log_head(&self, volume: &str) -> Option<(LogAddress, LogVerifier)> {
        self.dsl.log_head(volume)
    }

    /// Log blocks written by the volumes' current chains.
    pub fn log_blocks_written(&self) -> u64 {
        self.dsl.log_blocks_written()
    }

    /// What `volume`'s current log chain has written and chosen, if it has a chain.
    pub fn log_figures(&self, volume: &str) -> Option<crate::intent_log::LogFigures> {
        self.dsl.log_figures(volume)
    }

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
        self.commit_in(dataset, last).await
    }

    /// Returns once record `sequence` of `volume`'s log and every earlier one are durable:
    /// through the log when its chain is anchored and healthy, else through a txg sync.
    pub async fn commit(&self, volume: &str, sequence: u64) -> Result<(), StoreError> {
        let dataset = self.export_dataset(volume)?;
        self.commit_in(&dataset, sequence).await
    }

    /// [`Store::commit`] through a handle's dataset.
    pub async fn commit_in(&self, dataset: &Dataset, sequence: u64) -> Result<(), StoreError> {
        self.spa.check_live()?;
        let _guard = self.spa.panic_guard("a log commit");
        self.check_exists(dataset)?;
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
            self.sync().await?;
            return Ok(());
        };
        log.note_commit();
        if log.durable_record() >= sequence {
            return Ok(());
        }
        self.zil.stats().commits.inc();
        if log.anchored() && self.fill_indirect(dataset, &log, sequence).await.is_ok() {
            match log.commit(self.spa.pool(), self.spa.allocator(), sequence).await {
                Ok(()) => {
                    if self.zil.log_space_low(&log) {
                        self.syncer.kick();
                    }
                    return Ok(());
                }
                // The sync below covers the record, and replaces the failed chain.
                Err(LogError::Failed { .. } | LogError::Pool(_)) => {}
            }
        }
        self.zil.stats().commits_via_txg.inc();
        // The record's txg is at most the open one, which this sync makes durable. Commits
        // falling back together (every writer of a failed chain) share one sync: the
        // uberblock names the last durable txg.
        let open = self.txg.lock().open_txg();
        self.sync_unless(|| self.spa.pool().uberblock().txg >= open).await
    }

    /// Starts writing record `sequence` to `volume`'s log now, without waiting, when the log
    /// asks for it (`intent_log.early_commit`, [`LogWriter::wants_early`]); the caller is a
    /// write that was the only request in flight on the volume. A failure is left to the
    /// client's own commit, which falls back to a txg sync.
    pub fn commit_early(self: &Arc<Self>, dataset: &Arc<Dataset>, sequence: u64) {
        if !self.zil.early_commit() {
            return;
        }
        let Some(log) = dataset.state.lock().log.clone() else { return };
        if !log.wants_early() {
            return;
        }
        self.zil.stats().early_commits.inc();
        let store = Arc::clone(self);
        let dataset = Arc::clone(dataset);
        self.spa.pool().env().spawn("early log commit", async move {
            let _guard = store.spa.panic_guard("an early log commit");
            if store.fill_indirect(&dataset, &log, sequence).await.is_ok() {
                let _ = log.commit(store.spa.pool(), store.spa.allocator(), sequence).await;
                if store.zil.log_space_low(&log) {
                    store.syncer.kick();
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
        });
    }

    /// Fills `log`'s unfilled indirect records up to `sequence` that no other committer is
    /// filling (ZFS: `zil_get_data`, `dmu_sync`). A record whose block is still the open txg's
    /// version gets that block written in place (durably, started now) and its pointer; the
    /// sync links the same block instead of writing it again. Any other (its txg is syncing,
    /// or a later write replaced or zeroed the block) gets the block's current bytes copied:
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
        // Records whose block is the open txg's current version are placed; the rest copied,
        // or, where they are a large part of the txg being synced, left to that sync.
        let mut place: Vec<(&LogRecord, Arc<AlignedBuf>)> = Vec::new();
        let mut copy: Vec<&LogRecord> = Vec::new();
        let mut syncing: Vec<&LogRecord> = Vec::new();
        {
            let txg = self.txg.lock();
            let v = dataset.state.lock();
            for record in claimed {
                match v.open.get(&index_of(record)) {
                    Some(Block::Data(data)) if record.txg() == txg.open_txg() => {
                        place.push((record, Arc::clone(data)));
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
        // Compressed as the sync would (ZFS's dmu_sync does the same), so that a volume written
        // through indirect records is stored as compactly as one written by syncs, and
        // checksummed, on every core: with a volume's connections on one core, compressing
        // and checksumming a 1 MiB write's blocks there alone held 1 MiB write + flush at 0.84x
        // of connections spread over both cores (docs/bench/peers-placement.md).
        let compression = dataset.state.lock().entry.compression;
        let blocks: Vec<(BlockProps, Arc<AlignedBuf>)> = place
            .iter()
            .map(|(record, data)| {
                (BlockProps::data(Writer::LogIndirect, record.txg(), compression), Arc::clone(data))
            })
            .collect();
        let sealed = self.spa.pool().seal_blocks(blocks).await?;
        // Space for each placed block, as data is placed (near the data cursor, so a large
        // write's blocks land back to back), but held like a log block until a sync links it.
        let mut placed: Vec<(u32, u64, u64)> = Vec::with_capacity(place.len());
        {
            let mut allocator = self.spa.allocator().lock();
            for block in &sealed {
                match allocator.allocate_indirect(block.psize()) {
                    Ok(at) => placed.push(at),
                    Err(source) => {
                        // No room for the blocks in place: the commit falls back to a txg
                        // sync, which writes them once, rather than copying them into log
                        // blocks, which would take the room the sync needs (log blocks
                        // holding copies of 1 MiB writes filled a nearly full pool until the
                        // sync could not place its own blocks).
                        for &(vdev, start, len) in &placed {
                            allocator.release_indirect(vdev, start, len);
                        }
                        return Err(StoreError::Pool(PoolError::NoSpace {
                            pool: self.spa.pool().name().to_owned(),
                            cause: source,
                        }));
                    }
                }
            }
        }
        self.zil.stats().indirect_blocks_written.add(place.len() as u64);
        // Runs of blocks back to back on one vdev, each written as one I/O.
        let runs = zio::span_runs(&placed);
        let mut blocks: Vec<Prewritten> = Vec::with_capacity(place.len());
        let mut writes = Vec::with_capacity(runs.len());
        for run in runs {
            let (vdev, start, _) = placed[run.start];
            // Written from the blocks' own buffers as one vectored write, as a sync writes.
            let pieces = zio::run_pieces(&placed, run.clone(), |i| &sealed[i].stored);
            let (done, written) = futures::channel::oneshot::channel::<bool>();
            let write: DataWrite = written.map(|r| r.unwrap_or(false)).boxed().shared();
            for i in run {
                let bp = zio::describe(&sealed[i], &placed[i..=i]);
                let data = Arc::clone(&place[i].1);
                blocks.push(Prewritten { data, bp, write: write.clone() });
            }
            writes.push((
                VdevAddress { vdev, offset_bytes: start },
                SharedBuf::gather(pieces),
                done,
            ));
        }
        // Recorded for the sync before the writes start, so that a sync beginning now waits
        // for them; a block that changed since it was looked at is orphaned (the next sync
        // frees it once its write ends) and its record copied instead.
        let mut filled: Vec<(LogRecord, Option<DataWrite>)> = Vec::new();
        {
            let mut txg = self.txg.lock();
            let mut v = dataset.state.lock();
            let mut orphaned = Vec::new();
            for ((record, _), block) in place.iter().zip(blocks) {
                let index = index_of(record);
                let current = match v.open.get(&index) {
                    Some(Block::Data(data)) => Arc::ptr_eq(data, &block.data),
                    _ => false,
                };
                // A destroy (under the txg lock, as here) orphans the prewritten blocks
                // it finds; one linked after it would be freed by no sync.
                let live = !dataset.destroyed.load(std::sync::atomic::Ordering::Acquire);
                if current && live && record.txg() == txg.open_txg() {
                    let indirect = match record {
                        LogRecord::WriteIndirect { txg, sequence, offset, len, .. } => {
                            LogRecord::WriteIndirect {
                                txg: *txg,
                                sequence: *sequence,
                                offset: *offset,
                                len: *len,
                                block: block.bp,
                            }
                        }
                        _ => unreachable!("only indirect records are placed"),
                    };
                    filled.push((indirect, Some(block.write.clone())));
                    if let Some(replaced) = v.prewritten.insert(index, block) {
                        orphaned.push(replaced);
                    }
                    // The block is on its way to the disk and the sync will not write it, but
                    // it stays dirty: the throttle and the start of the next sync count it,
                    // since until that sync the block and any version it replaced hold
                    // space. Only the space check leaves it out, its space being allocated
                    // already. (Leaving it out of the dirty data too let 1 MiB write + flush
                    // clients fill a pool with blocks written in place and their replaced
                    // versions within one txg timeout: the sync after found no room.)
                    txg.count_prewritten(bs);
                } else {
                    orphaned.push(block);
                    copy.push(record);
                }
            }
            if !orphaned.is_empty() {
                txg.queue(Orphaned(orphaned));
            }
        }
        for (at, data, done) in writes {
            let pool = Arc::clone(self.spa.pool());
            self.spa.pool().env().spawn("indirect block write", async move {
                let how = Issue { class: IoClass::SyncWrite, durable: true };
                let ok = pool.issue(Writer::LogIndirect, at, data, how).await.is_ok();
                let _ = done.send(ok);
            });
        }
        for (record, write) in filled {
            log.fill(record, write);
        }
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
            drop(self.syncer.lock().await);
            // Still there only if that sync failed: the store is suspended, and the caller
            // gives the records back and falls back to a sync, which reports it.
            self.spa.check_live()?;
            self.zil.stats().indirect_records_left_to_sync.add(syncing.len() as u64);
        }
        Ok(())
    }
}

/// A volume's log cut short at a block no copy of which could be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LostLog {
    pub volume: String,
    /// The unreadable block, in words (position in the chain, address, the read's error).
    pub block: String,
    /// Records before it that replay applies.
    pub records_replayed: u64,
    /// Every record from this sequence on is lost. How many there were cannot be known: the
    /// count was written in the blocks that cannot be read.
    pub first_lost_sequence: u64,
}

/// How an import claims the logs (its `ImportOptions`, as far as they concern the log).
#[derive(Clone, Copy, Debug)]
pub(super) struct ClaimRules {
    /// The import may have gone back past damaged txgs: a chain ends at the first block on
    /// space the loaded maps give to data.
    pub(super) rewind: bool,
    /// A chain that cannot be read is cut at the unreadable block instead of failing the import.
    pub(super) discard_unreadable_log: bool,
}

/// What [`claim`] found: each volume's chain to replay, with its header's claim txg set.
pub(super) struct Claimed {
    pub(super) chains: Vec<(String, LogHeader, Chain)>,
    pub(super) log_stats: LogStats,
    /// Chains cut short at an unreadable block ([`ClaimRules::discard_unreadable_log`]).
    pub(super) lost_logs: Vec<LostLog>,
    /// Records newer than the loaded txg: what replay will apply.
    pub(super) records_to_replay: u64,
}

/// Walks every volume's log chain and claims its blocks in the allocator, so that none is
/// handed out again before replay retires the chain (ZFS: `zil_claim`). `loaded_txg` is the
/// txg import loaded: a chain claimed for the first time since the crash replays what is newer.
pub(super) async fn claim(
    pool: &Pool,
    loaded_txg: u64,
    directory: &PoolDirectory,
    allocator: &mut Allocator,
    rules: ClaimRules,
) -> Result<Claimed, StoreError> {
    let no_space = |e| PoolError::NoSpace { pool: pool.name().to_owned(), cause: e };
    let mut chains = Vec::new();
    let log_stats = LogStats::default();
    let (mut lost_logs, mut records_to_replay) = (Vec::new(), 0);
    for entry in &directory.volumes {
        let Some(mut header) = entry.log else { continue };
        if header.claim_txg == 0 {
            // First import since the crash: what synced before it is the line.
            header.claim_txg = loaded_txg;
        }
        let head = LogAddress::from_pointer(&header.head);
        let verifier = LogVerifier {
            chain_id: header.chain_id,
            volume_id: entry.id,
            sequence: header.head_sequence,
        };
        let replays = |chain: &Chain| {
            chain
                .blocks
                .iter()
                .flat_map(|b| b.records.iter())
                .filter(|r| r.txg() > header.claim_txg && r.sequence() > header.replayed_record)
                .count() as u64
        };
        let chain = match intent_log::read_chain(pool, head, verifier).await {
            Ok(chain) => chain,
            Err(unreadable) if rules.discard_unreadable_log => {
                let block = unreadable.to_string();
                let chain = unreadable.before;
                let last = chain.blocks.iter().flat_map(|b| b.records.iter()).map(|r| r.sequence());
                lost_logs.push(LostLog {
                    volume: entry.name.clone(),
                    block,
                    records_replayed: replays(&chain),
                    first_lost_sequence: last.max().unwrap_or(header.replayed_record) + 1,
                });
                chain
            }
            Err(unreadable) => {
                return Err(StoreError::UnreadableLog {
                    pool: pool.name().to_owned(),
                    volume: entry.name.clone(),
                    cause: unreadable,
                });
            }
        };
        let mut chain = chain;
        if rules.rewind {
            // A rewound txg's chain can lead on into blocks written after that txg, on space its
            // maps still give to data (freed and reused later): the log ends at the first such
            // block, as a chain ends at any block that is not what it expects.
            let crosses = chain.addresses.iter().position(|at| {
                !allocator.is_free(at.vdev, at.offset_bytes, u64::from(at.len_bytes))
            });
            if let Some(cut) = crosses {
                chain.blocks.truncate(cut);
                chain.addresses.truncate(cut);
            }
        }
        claim_indirect(pool, &mut chain, &header, allocator, &log_stats, rules).await.map_err(
            |source| StoreError::UnreadableLog {
                pool: pool.name().to_owned(),
                volume: entry.name.clone(),
                cause: source,
            },
        )?;
        for at in &chain.addresses {
            allocator
                .claim_log(at.vdev, at.offset_bytes, u64::from(at.len_bytes))
                .map_err(no_space)?;
        }
        log_stats.chains_claimed.inc();
        log_stats.blocks_claimed.add(chain.addresses.len() as u64);
        if chain.torn_tail {
            log_stats.torn_tails.inc();
        }
        records_to_replay += replays(&chain);
        chains.push((entry.name.clone(), header, chain));
    }
    Ok(Claimed { chains, log_stats, lost_logs, records_to_replay })
}

/// Claims the blocks that the chain's indirect records still to replay point at (ZFS:
/// `zil_claim_write`). Each must be intact and on space the maps give as free. One that is
/// not was written after the log block that points at it and before a crash that came before
/// the flush both waited for, so its write was never acknowledged: the log ends at that
/// record, as it ends at a log block that is not the expected one. A block that could not be
/// read at all (an I/O error, not a mismatch) is an error unless `discard_unreadable_log`.
async fn claim_indirect(
    pool: &Pool,
    chain: &mut Chain,
    header: &LogHeader,
    allocator: &mut Allocator,
    log_stats: &LogStats,
    rules: ClaimRules,
) -> Result<(), Box<intent_log::UnreadableBlock>> {
    let mut end: Option<(usize, usize)> = None;
    let to_claim: Vec<(usize, usize, u64, BlockPointer)> = chain
        .blocks
        .iter()
        .enumerate()
        .flat_map(|(b, block)| {
            block.records.iter().enumerate().filter_map(move |(r, record)| match record {
                LogRecord::WriteIndirect { block: bp, .. }
                    if record.txg() > header.claim_txg
                        && record.sequence() > header.replayed_record =>
                {
                    Some((b, r, block.verifier.sequence, *bp))
                }
                _ => None,
            })
        })
        .collect();
    for (b, r, lwb_sequence, bp) in to_claim {
        let dva = bp.dvas[0];
        let (vdev, offset, len) = (dva.vdev, dva.offset_bytes(), dva.asize_bytes());
        let overlaps_chain = chain.addresses.iter().any(|at| {
            at.vdev == vdev
                && at.offset_bytes < offset + len
                && offset < at.offset_bytes + u64::from(at.len_bytes)
        });
        if len == 0 || overlaps_chain || !allocator.is_free(vdev, offset, len) {
            end = Some((b, r));
            break;
        }
        match pool.read_block(&bp, IoClass::SyncRead).await {
            Ok(_) => {}
            Err(PoolError::Vdev { cause: source, .. })
                if !source.is_definite_mismatch() && !rules.discard_unreadable_log =>
            {
                let mut before = std::mem::take(chain);
                before.blocks.truncate(b);
                before.addresses.truncate(b);
                return Err(Box::new(intent_log::UnreadableBlock {
                    position: b,
                    sequence: lwb_sequence,
                    vdev,
                    offset_bytes: offset,
                    len_bytes: u32::try_from(len).unwrap_or(u32::MAX),
                    cause: source,
                    before,
                }));
            }
            Err(_) => {
                end = Some((b, r));
                break;
            }
        }
        if allocator.claim_log(vdev, offset, len).is_err() {
            end = Some((b, r));
            break;
        }
        chain.indirect.push(LogAddress {
            vdev,
            offset_bytes: offset,
            len_bytes: u32::try_from(len).unwrap_or(u32::MAX),
        });
    }
    if let Some((b, r)) = end {
        log_stats.indirect_chain_ends.inc();
        chain.blocks[b].records.truncate(r);
        chain.blocks.truncate(b + 1);
        chain.addresses.truncate(b + 1);
    }
    Ok(())
}

/// Appends the records of one change: a zero as one record, a write in pieces that each fit
/// the largest log block. With `indirect_block` (the volume's block size), the write's whole
/// blocks are appended as unfilled indirect records, one per block, and only its partial
/// blocks at either end are copied. A write handed over ([`WriteData::Owned`]) that is one
/// record takes no copy: the record keeps its buffer. Returns the last sequence.
pub(super) fn append_records(
    log: &LogWriter,
    now: crate::rt::Time,
    txg: u64,
    offset: u64,
    len: u64,
    payload: &mut Option<WriteData<'_>>,
    indirect_block: Option<u64>,
) -> u64 {
    log.note_change();
    let block_bytes_max = log.max_block_bytes();
    let end = offset + len;
    // The whole blocks logged by pointer, if any: (block size, first, end).
    let whole = indirect_block
        .map(|bs| (bs, offset.div_ceil(bs) * bs, end / bs * bs))
        .filter(|&(_, first, end_whole)| first < end_whole);
    // A write handed over that is one record keeps its own buffer: no copy. Any other stays
    // with the caller, which frees it outside the store's locks.
    if let Some(WriteData::Owned(data)) = payload {
        if whole.is_none() && data.len() <= copied_piece_bytes(block_bytes_max) {
            let data = std::mem::take(data);
            debug_assert_eq!(data.len() as u64, len, "a write's length is its bytes'");
            return log.append(now, |sequence| LogRecord::Write { txg, sequence, offset, data });
        }
    }
    let Some(payload) = payload.as_ref() else {
        return log.append(now, |sequence| LogRecord::Zero { txg, sequence, offset, len });
    };
    let data = payload.bytes();
    let copy = |at: u64, bytes: &[u8]| {
        let mut sequence = 0;
        for (i, chunk) in bytes.chunks(copied_piece_bytes(block_bytes_max)).enumerate() {
            let at = at + (i * copied_piece_bytes(block_bytes_max)) as u64;
            sequence = log.append(now, |sequence| LogRecord::Write {
                txg,
                sequence,
                offset: at,
                data: chunk.to_vec(),
            });
        }
        sequence
    };
    let Some((bs, first_whole, end_whole)) = whole else { return copy(offset, data) };
    let slice = |from: u64, to: u64| &data[(from - offset) as usize..(to - offset) as usize];
    let mut sequence = 0;
    if offset < first_whole {
        copy(offset, slice(offset, first_whole));
    }
    for at in (first_whole..end_whole).step_by(bs as usize) {
        sequence = log.append_unfilled(now, |sequence| LogRecord::WriteIndirect {
            txg,
            sequence,
            offset: at,
            len: bs as u32,
            block: UNFILLED,
        });
    }
    if end_whole < end {
        sequence = copy(end_whole, slice(end_whole, end));
    }
    sequence
}

/// Records of the txg being synced are copied into the log while their blocks are less than
/// this fraction (1/N) of what that sync writes, or less than [`COPY_ALWAYS_BYTES`]; past
/// both, their commit waits for the sync.
const COPY_SHARE_OF_SYNC: u64 = 4;

/// Below this, copies of a syncing txg's blocks are always made: a sync costs two rounds of
/// flushes and its metadata besides its data, about what the copies of a few MiB cost in log
/// writes (an estimate, not measured per device).
const COPY_ALWAYS_BYTES: u64 = 4 << 20;

/// The pointer an indirect record carries until it is filled (never encoded: no lwb takes an
/// unfilled record).
const UNFILLED: BlockPointer = BlockPointer {
    dvas: [Dva { vdev: 0, asize_sectors: 0, offset_sectors: 0 }; sluice_format::DVAS_MAX],
    lsize_sectors: 0,
    psize_sectors: 0,
    birth_txg: 0,
    checksum_alg: ChecksumAlg::Xxh3_128,
    compression: sluice_format::BlockCompression::None,
    kind: BlockKind::Data,
    level: 0,
    fill: 0,
    checksum: Checksum([0; 16]),
    dedup: None,
};

/// The largest piece of a write one copied record holds: the largest log block less its
/// header and the record's, in whole 4 KiB.
pub(super) fn copied_piece_bytes(block_bytes_max: u32) -> usize {
    ((block_bytes_max as usize - LOG_HEADER_BYTES - 40) / 4096 * 4096).max(512)
}

/// Log blocks of retired chains (a destroyed volume's, a replayed or failed log's), freed by
/// the sync of the txg they were retired in: that sync's uberblock no longer points at them.
#[derive(Debug)]
pub(super) struct RetiredLog(pub(super) Vec<LogAddress>);

impl SyncTask for RetiredLog {
    fn sync<'c, 's: 'c>(
        self: Box<Self>,
        cx: SyncCx<'c, 's>,
    ) -> futures::future::BoxFuture<'c, Result<(), PoolError>> {
        let mut allocator = cx.spa.allocator().lock();
        for at in self.0 {
            allocator.free_log(cx.update.txg, at.vdev, at.offset_bytes, u64::from(at.len_bytes));
        }
        Box::pin(std::future::ready(Ok(())))
    }
}

/// Blocks written in place for indirect log records that no volume will link (their volume
/// was destroyed, or their block changed before the fill could record them): the sync waits
/// for their writes, since a write in flight must not land on space handed out again, then
/// frees them.
#[derive(Debug)]
pub(super) struct Orphaned(pub(super) Vec<Prewritten>);

impl SyncTask for Orphaned {
    fn sync<'c, 's: 'c>(
        self: Box<Self>,
        cx: SyncCx<'c, 's>,
    ) -> futures::future::BoxFuture<'c, Result<(), PoolError>> {
        Box::pin(async move {
            cx.spa.release_prewritten(cx.update.txg, self.0).await;
            Ok(())
        })
    }
}
