//! The store's side of the intent log (ZFS: `zil.c`'s pool-wide part, `zil_claim`,
//! `zil_replay`): the logs' settings and figures ([`Zil`]), when a write is logged by pointer,
//! the appending of a write's records, and at import the claim of every chain's blocks and
//! the replay of their records.
//!
//! The log writer itself (log blocks, the pipelined and batch policies, the chain reader) is
//! `crate::intent_log`; the commits that drive it for FUA writes and flushes, and fall back
//! to a txg sync where it cannot answer, are zil_commit.rs's.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;
use sluice_format::{
    BlockKind, BlockPointer, Checksum, ChecksumAlg, DedupMode, Dva, LogBias, LogBlock, LogHeader,
    LogRecord, LogVerifier, PoolDirectory, VolumeEntry, LOG_HEADER_BYTES, RECORD_SEAL_BYTES,
};

use super::dataset::{Dataset, RetiredLog};
use super::dbuf::{Apply, WriteData};
use super::dsl_pool::TxgLimits;
use super::spa::Spa;
use super::{Store, StoreError};
use crate::alloc::Allocator;
use crate::intent_log::{self, Chain, ChainOwner, LogAddress, LogSettings, LogWriter};
use crate::pool::{Pool, PoolError};
use crate::tunables::IoClass;
use crate::zio::crypt::{CryptError, FamilyKey, Sealing};

/// The store's intent-log object (ZFS: the pool-wide part of `zil.c`): how the pool's chains
/// write (each as its volume's block size needs, [`Zil::settings_for`]), when a write is
/// logged by pointer, and what the logs did. Each volume's chain
/// is its own (`Dataset`'s state holds its `LogWriter`); the commits (zil_commit.rs) drive
/// them against the open txg and the syncer.
#[derive(Debug)]
pub(super) struct Zil {
    settings: LogSettings,
    /// Writes at least this large are logged by pointer (0: never).
    immediate_write_bytes: u64,
    /// `intent_log.early_commit`: whether a lone sync writer's record starts before its flush.
    early_commit: bool,
    stats: LogStats,
    /// Chains of encrypted volumes claimed at import whose key was not loaded, by volume:
    /// their blocks stay claimed and their headers recorded until `key load` replays them.
    deferred: Mutex<BTreeMap<String, (LogHeader, Chain)>>,
    /// The next sync moves every chain to a new one ([`Zil::restart_chains`]).
    restart: std::sync::atomic::AtomicBool,
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
            deferred: Mutex::new(BTreeMap::new()),
            restart: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Has the next sync start every volume's chain anew, as it does a failed one's: records
    /// not yet in a block move to the new chain, whose blocks are placed as the allocator now
    /// allows, and the old chain's blocks are freed by the sync after. A log device being
    /// removed is emptied so; and each new chain measures the pool's log devices afresh.
    pub(super) fn restart_chains(&self) {
        self.restart.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Whether this sync restarts every chain (and from now on, not the next one).
    pub(super) fn take_restart(&self) -> bool {
        self.restart.swap(false, std::sync::atomic::Ordering::AcqRel)
    }

    /// The volumes whose records wait for their key in a chain with a block on top-level
    /// vdev `vdev`: their blocks must stay where they are until `key load` replays them.
    pub(super) fn deferred_on(&self, vdev: u32) -> Vec<String> {
        (self.deferred.lock().iter())
            .filter(|(_, (_, chain))| chain.addresses.iter().any(|a| a.vdev == vdev))
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// What the intent logs did.
    pub(super) fn stats(&self) -> &LogStats {
        &self.stats
    }

    /// How the chain of a volume of `block_bytes` blocks writes: the pool's settings, with log
    /// blocks large enough to hold one of its blocks copied whole. A record logged by pointer
    /// whose block changed before its write is copied instead, as one record, so a volume
    /// whose block would not fit one could log no write by pointer: with 128 KiB log blocks,
    /// a 128 KiB volume's large writes were all copied into the log, every byte written
    /// twice (`bench/per-op.sh sluice syncwrite-1m 1 --block-size 128K`, 2026-12-02: 159-172
    /// MiB/s and 2,044-2,099 KiB written a MiB, against 277-308 and 1,038 with this).
    pub(super) fn settings_for(&self, block_bytes: u32) -> LogSettings {
        let mut settings = self.settings;
        while copied_piece_bytes(settings.max_block_bytes) < block_bytes as usize
            && settings.max_block_bytes < LOG_BLOCK_BYTES_CAP
        {
            settings.max_block_bytes *= 2;
        }
        settings
    }

    pub(super) fn early_commit(&self) -> bool {
        self.early_commit
    }

    /// A new chain's id: drawn from the pool's environment, so that a chain found at import
    /// is told from an older one on the same blocks.
    pub(super) fn chain_id(&self, spa: &Spa) -> u64 {
        spa.pool().env().unique_rng("intent log chain").u64().max(1)
    }

    /// A new, not yet anchored log chain for a volume of `block_bytes` blocks.
    pub(super) fn new_log(
        &self,
        spa: &Spa,
        volume_id: u64,
        key_family: u64,
        block_bytes: u32,
    ) -> Result<Arc<LogWriter>, StoreError> {
        let owner = ChainOwner { chain_id: self.chain_id(spa), volume_id, key_family };
        let settings = self.settings_for(block_bytes);
        Ok(Arc::new(LogWriter::new(spa.pool().name(), spa.allocator(), settings, owner)?))
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
    /// would not fit one copied record of its chain, whose blocks are at most
    /// `log_block_bytes_max` (the fill copies a block it cannot place; [`Zil::settings_for`]
    /// gives every volume block size such a chain). Which of its partial blocks go by pointer
    /// too is [`Zil::by_pointer`]'s.
    pub(super) fn indirect(&self, entry: &VolumeEntry, log_block_bytes_max: u32, len: u64) -> bool {
        let limit = self.immediate_write_bytes;
        let large = entry.logbias == LogBias::Throughput || (limit > 0 && len >= limit);
        large
            && entry.dedup == DedupMode::Off
            && entry.block_bytes as usize <= copied_piece_bytes(log_block_bytes_max)
    }

    /// How a write of `len` bytes to the volume `entry` is logged by pointer, if it is
    /// ([`Zil::indirect`]): with logbias=throughput every block it touches, the partial ones
    /// at its ends too (their whole new version written in place, as ZFS's `dmu_sync` writes
    /// the whole dbuf of a partial `WR_INDIRECT` write); a large write under logbias=latency
    /// copies its partial ends, which are small beside it.
    pub(super) fn by_pointer(
        &self,
        entry: &VolumeEntry,
        log_block_bytes_max: u32,
        len: u64,
    ) -> Option<ByPointer> {
        self.indirect(entry, log_block_bytes_max, len).then_some(ByPointer {
            block_bytes: u64::from(entry.block_bytes),
            partial: entry.logbias == LogBias::Throughput,
        })
    }
}

/// Which of a write's blocks are logged by pointer ([`Zil::by_pointer`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct ByPointer {
    /// The volume's block size.
    pub block_bytes: u64,
    /// The blocks a write covers in part as well as its whole ones.
    pub partial: bool,
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
    /// Early fills: blocks of a lone writer's large write written in place while the rest of
    /// its payload was still arriving ([`crate::volume::Volume::write_blocks_ahead`]).
    pub early_fills: crate::stats::Counter,
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
    /// Indirect records that point at the block placed for a later record of the same commit:
    /// the block was written again in its txg, and only its current version is placed (ZFS:
    /// `TX_WRITE2`).
    pub indirect_records_shared: crate::stats::Counter,
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
    /// Indirect records found at import pointing at the very block an earlier record of their
    /// chain claimed (records sharing a block: `indirect_records_shared`).
    pub indirect_claims_shared: crate::stats::Counter,
}

impl Store {
    /// Replays at import what each claimed chain holds, then starts every volume's new chain
    /// ([`Store::replay_chains`]). The chain of an encrypted volume whose key is not loaded
    /// (import never has one) waits, claimed, until `key load` replays it
    /// ([`Store::replay_deferred`]); its volume has no new chain meanwhile and refuses what
    /// would change or copy it without those records (`Store::check_log_replayed`).
    pub(super) async fn replay(
        &self,
        chains: Vec<(String, LogHeader, intent_log::Chain)>,
    ) -> Result<(), StoreError> {
        let keys = self.spa.pool().zio().keys();
        let mut now = Vec::new();
        for (name, header, chain) in chains {
            let family = self.dataset(&name)?.state.lock().entry.key_family;
            if family == 0 || keys.is_loaded(family) {
                now.push((name, header, chain));
            } else {
                self.spa.crypt().set_awaiting_log(family, true);
                self.zil.deferred.lock().insert(name, (header, chain));
            }
        }
        self.replay_chains(now).await
    }

    /// Replays the chains deferred for key family `family` now that its key is loaded.
    pub(super) async fn replay_deferred(&self, family: u64) -> Result<(), StoreError> {
        let names: Vec<String> = self.zil.deferred.lock().keys().cloned().collect();
        let mut chains = Vec::new();
        for name in names {
            if self.dataset(&name)?.state.lock().entry.key_family != family {
                continue;
            }
            if let Some((header, chain)) = self.zil.deferred.lock().remove(&name) {
                chains.push((name, header, chain));
            }
        }
        if chains.is_empty() {
            return Ok(());
        }
        // A chain that fails to replay waits again, as it was: applying a record twice is
        // harmless (each carries the whole of its range), and its header keeps the progress.
        let kept: Vec<(String, LogHeader, intent_log::Chain)> = chains.clone();
        let replayed = self.replay_chains(chains).await;
        if replayed.is_err() {
            let mut deferred = self.zil.deferred.lock();
            for (name, header, chain) in kept {
                let progress = self.dataset(&name).ok().and_then(|d| d.state.lock().entry.log);
                deferred.insert(name, (progress.unwrap_or(header), chain));
            }
        }
        replayed
    }

    /// Whether `volume` has intent-log records that wait for its key to be replayed.
    pub fn log_awaits_key(&self, volume: &str) -> bool {
        self.zil.deferred.lock().contains_key(volume)
    }

    /// Refuses `what` on a volume whose log waits for its key: a snapshot, rollback, resize,
    /// rename or destroy without those records would lose writes that were acknowledged.
    pub(super) fn check_log_replayed(
        &self,
        volume: &str,
        what: &'static str,
    ) -> Result<(), StoreError> {
        if self.log_awaits_key(volume) {
            return Err(StoreError::LogAwaitsKey {
                pool: self.spa.pool().name().to_owned(),
                volume: volume.to_owned(),
                what,
            });
        }
        Ok(())
    }

    /// Discards the records a destroyed volume's log still held for its key (`vol destroy
    /// -f`): the chain's blocks are freed by the next sync.
    pub(super) fn discard_deferred_log(&self, volume: &str) {
        if let Some((_, chain)) = self.zil.deferred.lock().remove(volume) {
            let blocks = chain.addresses.iter().chain(&chain.indirect).copied().collect();
            self.txg.lock().queue(RetiredLog(blocks));
        }
    }

    /// Applies each chain's records that are newer than its claim txg (the last txg synced
    /// before the crash) and than what an interrupted replay already applied, then retires
    /// the chains and starts new ones for every volume without a chain (and no chain still
    /// waiting for its key). Syncs that happen during replay (dirty data) record the progress
    /// in the old header, so an import interrupted here replays every record exactly once
    /// in the end. An encrypted volume's records are opened with its key first: a record
    /// that fails its tag fails the replay, which applies nothing of that volume after it.
    async fn replay_chains(
        &self,
        chains: Vec<(String, LogHeader, intent_log::Chain)>,
    ) -> Result<(), StoreError> {
        let stats = self.zil.stats();
        // Every record to apply is opened (its tag checked, a write's data decrypted) before
        // any is applied, so a forged record changes nothing.
        let mut opened_chains = Vec::with_capacity(chains.len());
        for (name, header, chain) in &chains {
            let family = self.dataset(name)?.state.lock().entry.key_family;
            let key = match family {
                0 => None,
                family => Some(self.spa.pool().zio().keys().get(family).ok_or_else(|| {
                    StoreError::KeyUnavailable {
                        pool: self.spa.pool().name().to_owned(),
                        volume: name.clone(),
                    }
                })?),
            };
            let mut opened = Vec::new();
            for block in &chain.blocks {
                for (index, record) in block.records.iter().enumerate() {
                    let applies = record.txg() > header.claim_txg
                        && record.sequence() > header.replayed_record;
                    if !applies {
                        opened.push(None);
                        continue;
                    }
                    let clear = open_record(key.as_deref(), block, index).map_err(|cause| {
                        StoreError::LogAuthentication {
                            pool: self.spa.pool().name().to_owned(),
                            volume: name.clone(),
                            sequence: record.sequence(),
                            cause,
                        }
                    })?;
                    opened.push(clear);
                }
            }
            opened_chains.push(opened);
        }
        for ((name, header, chain), opened) in chains.iter().zip(opened_chains) {
            let dataset = self.dataset(name)?;
            let records = chain.blocks.iter().flat_map(|b| b.records.iter());
            for (record, opened) in records.zip(opened) {
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
                        (*offset, data.len() as u64, Some(opened.as_deref().unwrap_or(data)))
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
            let (has_log, family, block_bytes) = {
                let v = dataset.state.lock();
                (v.log.is_some(), v.entry.key_family, v.entry.block_bytes)
            };
            if has_log || self.log_awaits_key(&dataset.name()) {
                continue;
            }
            let log = self.zil.new_log(&self.spa, dataset.id, family, block_bytes)?;
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
}

/// Opens record `index` of `block` for replay: with `key` (an encrypted volume's), checks its
/// tag and returns a write's data decrypted (`None` for other kinds, whose tag covers their
/// fields alone); without, the block must not be sealed, and returns `None`.
fn open_record(
    key: Option<&FamilyKey>,
    block: &LogBlock,
    index: usize,
) -> Result<Option<Vec<u8>>, CryptError> {
    let Some(key) = key else {
        // A sealed record on a volume that is not encrypted is none this pool wrote.
        return if block.sealed() { Err(CryptError::Authentication) } else { Ok(None) };
    };
    // An encrypted volume's chain is sealed throughout: an unsealed block in it is a forgery.
    let seal = block.seals.get(index).ok_or(CryptError::Authentication)?;
    let sealing = Sealing { salt: seal.salt, iv: seal.iv, mac: seal.mac };
    let aad = block.record_aad(index);
    match &block.records[index] {
        LogRecord::Write { data, .. } => {
            let mut clear = data.clone();
            key.open(&mut clear, &aad, &sealing)?;
            Ok(Some(clear))
        }
        LogRecord::WriteIndirect { .. } | LogRecord::Zero { .. } => {
            key.open(&mut [], &aad, &sealing)?;
            Ok(None)
        }
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
            let crosses = chain
                .addresses
                .iter()
                .position(|at| !allocator.is_free(at.vdev, at.offset_bytes, at.alloc_bytes));
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
            allocator.claim_log(at.vdev, at.offset_bytes, at.alloc_bytes).map_err(no_space)?;
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
    // Records of one commit that wrote a block more than once in a txg all point at its
    // current version (zil_commit.rs): that block is claimed and verified once, and taken for every
    // record naming exactly it (ZFS: `zil_bp_tree_add`). A pointer that differs but lands on
    // claimed space fails `is_free` below and ends the chain.
    let mut claimed: HashMap<(u32, u64), BlockPointer> = HashMap::new();
    for (b, r, lwb_sequence, bp) in to_claim {
        let dva = bp.dvas[0];
        let (vdev, offset, len) = (dva.vdev, dva.offset_bytes(), dva.asize_bytes());
        if claimed.get(&(vdev, offset)) == Some(&bp) {
            log_stats.indirect_claims_shared.inc();
            continue;
        }
        let overlaps_chain = chain.addresses.iter().any(|at| {
            at.vdev == vdev
                && at.offset_bytes < offset + len
                && offset < at.offset_bytes + at.alloc_bytes
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
        claimed.insert((vdev, offset), bp);
        chain.indirect.push(LogAddress {
            vdev,
            offset_bytes: offset,
            len_bytes: u32::try_from(bp.psize_bytes()).unwrap_or(u32::MAX),
            alloc_bytes: len,
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
/// the largest log block. With `by_pointer`, the write's blocks are appended as unfilled
/// indirect records, one per block: its whole blocks, and its partial ones at either end when
/// it says so, else those are copied. A write handed over ([`WriteData::Owned`]) that is one
/// record takes no copy: the record keeps its buffer. Returns the last sequence.
pub(super) fn append_records(
    log: &LogWriter,
    now: crate::rt::Time,
    txg: u64,
    offset: u64,
    len: u64,
    payload: &mut Option<WriteData<'_>>,
    by_pointer: Option<ByPointer>,
) -> u64 {
    log.note_change();
    let block_bytes_max = log.max_block_bytes();
    let end = offset + len;
    // The blocks logged by pointer, if any: (block size, first byte, end). A zero is never
    // logged by pointer (its record is small whatever its length).
    let whole = by_pointer
        .filter(|_| payload.is_some())
        .map(|ByPointer { block_bytes: bs, partial }| {
            if partial {
                (bs, offset / bs * bs, end.div_ceil(bs) * bs)
            } else {
                (bs, offset.div_ceil(bs) * bs, end / bs * bs)
            }
        })
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
    // The payload's bytes from `from` to `to` (volume offsets), copied into records of at
    // most a log block's piece each.
    let copy = |from: u64, to: u64| {
        let piece = copied_piece_bytes(block_bytes_max) as u64;
        let mut sequence = 0;
        for at in (from..to).step_by(piece as usize) {
            let data =
                payload.to_vec((at - offset) as usize..((at + piece).min(to) - offset) as usize);
            sequence =
                log.append(now, |sequence| LogRecord::Write { txg, sequence, offset: at, data });
        }
        sequence
    };
    let Some((bs, first_whole, end_whole)) = whole else { return copy(offset, end) };
    let mut sequence = 0;
    if offset < first_whole {
        copy(offset, first_whole);
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
        sequence = copy(end_whole, end);
    }
    sequence
}

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
    crypt: sluice_format::BlockCrypt::None,
};

/// The largest log block a volume's chain is given (`intent_log.block_bytes_max`'s own
/// bound): one of the largest volume blocks, copied, fits well inside it.
const LOG_BLOCK_BYTES_CAP: u32 = 1 << 20;

/// The largest piece of a write one copied record holds: the largest log block less its
/// header and the record's, in whole 4 KiB.
pub(super) fn copied_piece_bytes(block_bytes_max: u32) -> usize {
    // Room for a sealed record's seal too (an encrypted volume's chain): the same pieces in
    // every chain, the header's 40 bytes being far inside the rounding.
    ((block_bytes_max as usize - LOG_HEADER_BYTES - 40 - RECORD_SEAL_BYTES) / 4096 * 4096).max(512)
}
