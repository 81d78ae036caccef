//! Writing a txg out (ZFS: `spa_sync`, `dsl_pool_sync`, `txg_sync_thread`).
//!
//! [`Store::sync`] quiesces the open txg (`quiesce`: it becomes the syncing one, new writes go
//! to the next, and what admission counted for it is recorded) and writes it out in the steps
//! `sync_locked` calls in order:
//! 1. `write_volumes`: every dirty data block, copy-on-write into new space (patches completed
//!    first, dedup volumes through the table), then the indirect blocks up to each new root;
//!    blocks written in place for the log that no tree took are freed (`release_prewritten`);
//! 2. `append_deadlists` (dsl_snapshot.rs): replaced blocks a snapshot holds appended to dead
//!    lists;
//! 3. `run_sync_tasks` (dsl_synctask.rs): the changes asked in this txg, in order, each by its
//!    own code: snapshots made, destroyed, rolled back to or promoted, destroyed volumes' trees
//!    and dead lists walked for what they free, retired log chains and orphaned blocks freed;
//! 4. `write_dedup_table`: references dropped by replaced blocks, then the table's buckets;
//! 5. `free_replaced`: what this txg replaced, and the previous directory and space maps, into
//!    the allocator's deferred frees;
//! 6. `anchor_logs`: each volume's log head as of this txg, and the log blocks it frees;
//! 7. `write_space_maps_and_directory`: space allocated before any map is encoded, so every map
//!    includes its own blocks;
//! 8. `Pool::sync_uberblock`: flush every leaf, write the uberblock to every label ring, flush;
//! 9. `finish`: the new roots become the volumes' trees, failed log chains are replaced.
//!
//! Replaced blocks are reused only after the deferral (crate::alloc), so a crash at any point
//! imports to the previous txg intact. A failed sync suspends the store.
//!
//! The steps that only write to the pool (`write_volumes`, `append_deadlists`,
//! `write_dedup_table`, `write_space_maps_and_directory`) are functions of the `Spa` they write
//! through; the sync tasks get the `Spa` and a lookup of volume ids, not the store; and
//! `free_replaced` is the [`Syncer`]'s, which holds the last sync's maps. The driver,
//! `sync_locked`, and the steps that read the namespace, the open txg or the logs are
//! [`SyncHandle`]'s: the handle that code waiting for a sync holds instead of the store.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use parking_lot::{Mutex, MutexGuard};
use sluice_format::{
    BlockPointer, Compression, DdtHeader, DedupMode, DirectoryRecords, LogHeader, PoolDirectory,
    SpaceMap, VolumeEntry, DVAS_MAX,
};

use super::dataset::Dsl;
use super::dbuf::{Block, Prewritten};
use super::dsl_pool::{PatchStats, Quiesce, Txg};
use super::dsl_snapshot::append_deadlists;
use super::dsl_synctask::{run_sync_tasks, Family, SyncTask, SyncedTree};
use super::spa::Spa;
use super::space_map::{piece_layout, split_space_map, SPACE_MAP_PIECE_BYTES};
use super::zil::Zil;
use super::{Store, StoreError};
use crate::alloc::{AllocClass, AllocError, Allocator};
use crate::device::AlignedBuf;
use crate::intent_log::{ChainOwner, DataWrite, LogWriter};
use crate::objset::{self, TreeUpdate};
use crate::pool::PoolError;
use crate::zio::compress::RunHint;
use crate::zio::{BlockProps, Writer};

/// Data blocks a sync completes (patches) or writes (dedup) concurrently.
pub(super) const SYNC_WRITES_IN_FLIGHT: usize = 64;
/// Spans of data blocks a sync writes concurrently.
pub(super) const SPANS_IN_FLIGHT: usize = 8;

/// Syncs [`Store::sync_history`] keeps.
const SYNC_HISTORY_MAX: usize = 128;

/// One txg this store synced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncRecord {
    pub txg: u64,
    /// When the txg stopped taking writes: every write that returned before this is in it.
    pub quiesced: crate::rt::Time,
    /// When its uberblock was durable.
    pub synced: crate::rt::Time,
    /// What admission counted for its sync: its data and indirect blocks, a bound of the
    /// metadata it writes (space maps, directory, dead lists, administrative changes) and its
    /// share of the dedup table's rewrite. Writes were let in only while this fit the pool.
    pub admitted_bytes: u64,
    /// What its sync allocated: never more than `admitted_bytes` (the space swarm in
    /// engine/tests/space.rs asserts it).
    pub allocated_bytes: u64,
}

/// The pool's own metadata as the last sync wrote it: its space maps and the directory that
/// points at them, freed by the next sync when it writes theirs (spa_sync.rs owns them).
#[derive(Debug)]
pub(super) struct SyncedMetadata {
    pub(super) space_maps: Vec<Vec<BlockPointer>>,
    pub(super) directory: Option<BlockPointer>,
}

/// The sync's own state, which this file alone changes.
#[derive(Debug)]
pub(super) struct Syncer {
    /// One sync at a time: held for a whole sync (crate::txg's lock order: after
    /// `Spa::vdev_lock` or a volume's `rollback_gate`, before everything else).
    lock: futures::lock::Mutex<()>,
    /// Wakes the syncer early when dirty data builds up.
    kick: Mutex<Option<futures::channel::mpsc::Sender<()>>>,
    /// The last sync's space maps and directory, freed by the next when it writes theirs.
    synced: Mutex<SyncedMetadata>,
    /// The last txgs synced, with when ([`Store::sync_history`]).
    history: Mutex<std::collections::VecDeque<SyncRecord>>,
    /// Txgs synced by this store.
    syncs: crate::stats::Counter,
}

impl Syncer {
    pub(super) fn new(synced: SyncedMetadata) -> Syncer {
        Syncer {
            lock: futures::lock::Mutex::new(()),
            kick: Mutex::new(None),
            synced: Mutex::new(synced),
            history: Mutex::new(std::collections::VecDeque::new()),
            syncs: crate::stats::Counter::default(),
        }
    }

    /// The sync's lock: whoever holds it may sync, or keep a sync from starting.
    pub(super) async fn lock(&self) -> futures::lock::MutexGuard<'_, ()> {
        self.lock.lock().await
    }

    /// Txgs synced by this store so far.
    pub(super) fn syncs(&self) -> u64 {
        self.syncs.get()
    }

    /// Wakes the syncer to start a txg sync now rather than at `txg.timeout_ms`: a quarter of
    /// `txg.dirty_max` (or of the smaller maximum free space sets) is dirty, or the intent log
    /// is filling its region.
    pub(super) fn kick(&self) {
        if let Some(kick) = self.kick.lock().as_mut() {
            // A full channel means a kick is already pending; that is enough.
            let _ = kick.try_send(());
        }
    }

    /// Where [`Syncer::kick`] sends: the syncer task's channel, once it runs.
    fn set_kick(&self, sender: futures::channel::mpsc::Sender<()>) {
        *self.kick.lock() = Some(sender);
    }

    /// The last txgs synced (up to [`SYNC_HISTORY_MAX`]), oldest first.
    fn history(&self) -> Vec<SyncRecord> {
        self.history.lock().iter().copied().collect()
    }

    /// Adds a synced txg to the history, dropping the oldest past [`SYNC_HISTORY_MAX`].
    fn record(&self, record: SyncRecord) {
        let mut history = self.history.lock();
        if history.len() == SYNC_HISTORY_MAX {
            history.pop_front();
        }
        history.push_back(record);
    }

    /// Counts a synced txg (its uberblock is durable).
    fn count_sync(&self) {
        self.syncs.inc();
    }

    /// The space maps and directory the sync just wrote: the next frees them.
    fn set_synced(&self, synced: SyncedMetadata) {
        *self.synced.lock() = synced;
    }

    /// Makes room for `count` new top-level vdevs' space maps (`pool add`): none yet, all
    /// free, until the next sync writes them.
    pub(super) fn add_vdevs(&self, count: usize) {
        let mut synced = self.synced.lock();
        let total = synced.space_maps.len() + count;
        synced.space_maps.resize(total, Vec::new());
    }

    /// The last sync's space maps and directory (the audit walks them).
    pub(super) fn synced_metadata(&self) -> (Vec<Vec<BlockPointer>>, Option<BlockPointer>) {
        let synced = self.synced.lock();
        (synced.space_maps.clone(), synced.directory)
    }

    /// Frees what this txg replaced, and the previous directory and space maps, in `txg`
    /// (reusable after the deferral). Returns the number of top-level vdevs.
    fn free_replaced(&self, spa: &Spa, txg: u64, replaced: &[BlockPointer]) -> usize {
        let (old_maps, old_directory, vdevs) = {
            let synced = self.synced.lock();
            (synced.space_maps.clone(), synced.directory, synced.space_maps.len())
        };
        let freed = || replaced.iter().chain(old_maps.iter().flatten()).chain(old_directory.iter());
        // The cache forgets the blocks outside the allocator's lock: dropping their buffers is
        // most of this work (a sync after 8 clients' 4 KiB writes replaces tens of thousands of
        // blocks), and every write's admission takes that lock. Held across it, it stopped
        // the volume's serving core for up to 18 ms (docs/bench/peers-notes.md). What is freed
        // here stays allocated for the deferral, so a read that misses the cache meanwhile
        // still finds the block's bytes on disk.
        spa.pool().cache().remove_all(freed());
        let mut allocator = spa.allocator().lock();
        for bp in freed() {
            for dva in bp.copies() {
                allocator.free(txg, dva.vdev, dva.offset_bytes(), dva.asize_bytes());
            }
        }
        vdevs
    }
}

/// Blocks the sync puts in the cache between two pauses ([`crate::rt::Env::pause`]): a few
/// hundred nanoseconds each.
const CACHE_INSERTS_PER_PAUSE: usize = 1024;

/// Frees a sync makes allocatable per hold of the allocator's lock: inserts into a free tree
/// of a few hundred nanoseconds each, so a hold of about a tenth of a millisecond.
const SYNCED_FREES_PER_STEP: usize = 512;

/// What a quiesce hands to the rest of the sync.
struct Quiesced {
    txg: u64,
    /// Each volume's entry, levels on disk, syncing blocks and the blocks among them already
    /// written in place for the intent log.
    work: Vec<VolumeWork>,
    /// The changes asked in this txg (dsl_synctask.rs), in the order they were asked.
    tasks: Vec<Box<dyn SyncTask>>,
    /// What admission counted for this txg's sync, [`Allocator::allocated_total`] when it
    /// quiesced, and the blocks it writes.
    admitted: (u64, u64, u64),
}

/// What a sync writes of one volume.
struct VolumeWork {
    entry: VolumeEntry,
    /// Levels of its tree on disk.
    disk_levels: u8,
    /// The syncing txg's blocks.
    blocks: Arc<BTreeMap<u64, Block>>,
    /// The blocks among them already written in place for the intent log.
    prewritten: BTreeMap<u64, Prewritten>,
    /// Whether a raw receive writes it (`VolumeState::raw_receive`).
    raw: bool,
    /// The early abort's hint its writers share (`Dataset::early_abort`).
    early_abort: Arc<RunHint>,
}

impl Store {
    /// Starts the task that syncs every `txg.timeout_ms`, or early when dirty data builds up
    /// or the intent log fills its region (both kick it: `Syncer::kick`).
    /// It holds only a weak reference: it ends when the store is dropped, and after a failed
    /// sync (the store is then suspended).
    pub fn run_syncer(self: &Arc<Self>) {
        use futures::StreamExt;
        let (sender, mut kicks) = futures::channel::mpsc::channel::<()>(1);
        self.syncer.set_kick(sender);
        let weak = Arc::downgrade(self);
        let env = self.spa.pool().env().clone();
        let timeout = self.txg.limits().timeout;
        // A scan the store opened with goes on, and a leaf behind is resilvered.
        self.resume_scan();
        env.clone().spawn("txg_sync", async move {
            loop {
                let sleep = env.sleep(timeout);
                let kicked = kicks.next();
                futures::pin_mut!(kicked);
                if let futures::future::Either::Right((None, _)) =
                    futures::future::select(sleep, kicked).await
                {
                    return;
                }
                let Some(store) = weak.upgrade() else { return };
                if let Err(error) = store.sync().await {
                    // The server's log says why every later command is refused.
                    let error = crate::error_chain(&error);
                    eprintln!(
                        "sluice: pool {}: the txg sync failed: {error}",
                        store.spa.pool().name()
                    );
                    return;
                }
                // A leaf that missed writes in that txg is copied back in the background; a
                // spare goes in for a leaf that faulted, or back once it is not needed.
                store.resilver_if_needed();
                store.retire_if_needed();
            }
        });
    }

    /// Writes the open txg out and makes it durable. Returns the synced txg.
    pub async fn sync(&self) -> Result<u64, StoreError> {
        self.sync_handle().sync().await
    }

    /// The right to sync, for code that works on some of the store's objects.
    pub(super) fn sync_handle(&self) -> SyncHandle<'_> {
        SyncHandle {
            spa: &self.spa,
            dsl: &self.dsl,
            txg: &self.txg,
            syncer: &self.syncer,
            zil: &self.zil,
        }
    }

    /// The last txgs this store synced (up to 128), oldest first.
    pub fn sync_history(&self) -> Vec<SyncRecord> {
        self.syncer.history()
    }
}

/// The right to have the open txg written out (ZFS: `txg_wait_synced`, but the waiter runs
/// the sync itself when none is running), for code that works on some of the store's objects
/// and must at times wait for a sync: admission short of space or at the dirty maximum, a log
/// commit falling back to the txg, a change of leaves or snapshots. The sync works on every
/// object, so the handle borrows them all, but only this file sees them: its holder can sync,
/// count syncs and wake the syncer, and reaches nothing else through it.
#[derive(Clone, Copy, Debug)]
pub(super) struct SyncHandle<'a> {
    spa: &'a Spa,
    dsl: &'a Dsl,
    txg: &'a Txg,
    syncer: &'a Syncer,
    zil: &'a Zil,
}

impl SyncHandle<'_> {
    /// Writes the open txg out and makes it durable. Returns the synced txg.
    pub(super) async fn sync(&self) -> Result<u64, StoreError> {
        let one_at_a_time = self.syncer.lock().await;
        self.sync_holding_lock(one_at_a_time).await
    }

    /// Syncs, unless `done` says, once this has its turn, that a sync run meanwhile did what
    /// the caller needed. Many callers wanting a sync for one reason (writers at the dirty
    /// maximum or short of space, commits falling back together) each syncing in turn made
    /// the last wait behind all the others' syncs, most of them of nearly nothing.
    pub(super) async fn sync_unless(&self, done: impl FnOnce() -> bool) -> Result<(), StoreError> {
        let one_at_a_time = self.syncer.lock().await;
        if done() {
            return Ok(());
        }
        self.sync_holding_lock(one_at_a_time).await.map(drop)
    }

    /// The sync's lock: whoever holds it may sync ([`SyncHandle::sync_holding_lock`]), or keep
    /// a sync from starting.
    pub(super) async fn lock(&self) -> futures::lock::MutexGuard<'_, ()> {
        self.syncer.lock().await
    }

    /// Syncs with the sync's lock, taken by the caller, which changed something under it that
    /// this sync must carry.
    pub(super) async fn sync_holding_lock(
        &self,
        _one_at_a_time: futures::lock::MutexGuard<'_, ()>,
    ) -> Result<u64, StoreError> {
        self.spa.check_live()?;
        let _guard = self.spa.panic_guard("a txg sync");
        let result = self.sync_locked().await;
        // Synced, the txg's blocks are allocated (and counted as such); failed, the store is
        // suspended.
        self.txg.lock().sync_ended();
        if let Err(error) = &result {
            self.spa.suspend(format!("the sync failed: {}", crate::error_chain(error)));
        }
        result
    }

    /// Txgs synced by this store so far.
    pub(super) fn syncs(&self) -> u64 {
        self.syncer.syncs()
    }

    /// Wakes the syncer to sync now ([`Syncer::kick`]).
    pub(super) fn kick(&self) {
        self.syncer.kick()
    }

    /// One sync, in its named steps (the module doc lists them).
    pub(super) async fn sync_locked(&self) -> Result<u64, StoreError> {
        let Quiesced { txg, work, tasks, admitted: (admitted_bytes, allocated_base, blocks) } =
            self.quiesce();
        // Writers the throttle held for a sync go on into the new txg while this one writes.
        self.txg.notify_opened();
        // The dedup table's rewrite is kept apart by admission (`Ddt::rewrite_reserve_bytes`,
        // for the deferral's txgs together); one txg's share of it.
        let admitted_bytes = admitted_bytes
            + if work.iter().any(|w| w.entry.dedup != DedupMode::Off) {
                let unit = 1u64 << self.spa.pool().ashift();
                // Its blocks at what they allocate (parity and padding on RAID-Z).
                let reserve = self.spa.ddt().rewrite_reserve_bytes(unit, blocks);
                self.spa.pool().inflate(reserve, unit) / (crate::alloc::FREE_DEFER_TXGS + 1)
            } else {
                0
            };
        let quiesced = self.spa.pool().env().now();
        // A volume still replaying records its progress as of this quiesce: records applied
        // after it belong to the next txg.
        let replay_progress: BTreeMap<String, Option<LogHeader>> =
            work.iter().map(|w| (w.entry.name.clone(), w.entry.log)).collect();
        let mut ctx = TreeUpdate::new(self.spa.pool(), self.spa.allocator(), txg);
        self.spa.fail_point("spa_sync.write_volumes");
        let patches = self.txg.patch_stats();
        let mut roots = write_volumes(self.spa, patches, &mut ctx, work).await?;
        append_deadlists(self.spa, &mut ctx, &mut roots).await?;
        let volume_id = |name: &str| self.dsl.volume_id(name);
        let rewind = run_sync_tasks(self.spa, &volume_id, &mut ctx, &mut roots, tasks).await?;
        let (ddt_header, replaced) = write_dedup_table(self.spa, &mut ctx).await?;
        let vdevs = self.syncer.free_replaced(self.spa, txg, &replaced);
        let (anchored, headers, directory) =
            self.anchor_logs(txg, vdevs, &roots, &replay_progress, ddt_header);
        let directory_bp = write_space_maps_and_directory(self.spa, txg, vdevs, directory).await?;
        let allocated_bytes =
            self.spa.allocator().lock().allocated_total().saturating_sub(allocated_base);
        let synced = self.spa.pool().sync_uberblock(Some(directory_bp.0)).await?;
        for volume in rewind {
            self.dsl.scan().rewind(volume);
        }
        debug_assert_eq!(synced, txg, "the uberblock txg follows the store's txgs");
        self.syncer.record(SyncRecord {
            txg,
            quiesced,
            synced: self.spa.pool().env().now(),
            admitted_bytes,
            allocated_bytes,
        });
        self.finish(txg, &roots, &headers, directory_bp, &anchored)?;
        Ok(txg)
    }

    /// The open txg becomes the syncing one: its dirty blocks move to each volume's `syncing`
    /// layer, where reads still find them, and new writes go to the next txg.
    fn quiesce(&self) -> Quiesced {
        let dsl = self.dsl.read();
        let mut state = self.txg.lock();
        // What this txg's sync may allocate, its own metadata bounded from the blocks it
        // writes: admission counts it until the sync has allocated it, and the sync's record
        // holds it beside what was allocated.
        let shape =
            super::dsl_pool::SyncShape::of_open(dsl.appending_deadlists(), &state, self.spa.pool());
        let (closed, allocated_base) = {
            // Lock order: dsl -> txg -> allocator.
            let mut allocator = self.spa.allocator().lock();
            let allocated_base = allocator.allocated_total();
            let closed = state.quiesce(shape.metadata_bytes(&allocator), allocated_base);
            allocator.promise(closed.syncing_bytes);
            (closed, allocated_base)
        };
        let Quiesce { txg, syncing_bytes, tasks } = closed;
        // What each leaf had missed when the next txg opened: a resilver or a sync compares it
        // to tell whether the leaf missed a block born since. (Writes reach the next txg only
        // once the txg lock held here is let go.)
        self.spa.pool().note_txg_open(txg + 1);
        let admitted = (syncing_bytes, allocated_base, shape.blocks);
        let mut work = Vec::new();
        for dataset in dsl.values() {
            let mut volume = dataset.state.lock();
            let volume = &mut *volume;
            dataset.dirty_bytes.store(0, Ordering::Relaxed);
            volume.syncing = Arc::new(std::mem::take(&mut volume.open));
            work.push(VolumeWork {
                entry: volume.entry.clone(),
                disk_levels: volume.disk_levels,
                blocks: Arc::clone(&volume.syncing),
                prewritten: std::mem::take(&mut volume.prewritten),
                raw: volume.raw_receive,
                early_abort: Arc::clone(&dataset.early_abort),
            });
        }
        Quiesced { txg, work, tasks, admitted }
    }

    /// Each volume's log head as of this txg (log blocks holding only records of this txg or
    /// earlier are freed in it, as are retired chains), and the new pool directory without
    /// its space maps. Returns the logs anchored, the headers and the directory.
    fn anchor_logs(
        &self,
        txg: u64,
        vdevs: usize,
        roots: &BTreeMap<String, SyncedTree>,
        replay_progress: &BTreeMap<String, Option<LogHeader>>,
        ddt_header: DdtHeader,
    ) -> (Vec<Arc<LogWriter>>, BTreeMap<String, Option<LogHeader>>, PoolDirectory) {
        let mut anchored = Vec::new();
        let mut headers = BTreeMap::new();
        // Taken before the namespace: the scan's lock comes before the pool's.
        let scan = self.dsl.scan().record(self.spa.pool());
        // One config for the records and the properties: both or neither name the feature.
        let config = self.spa.pool().config().clone();
        let directory = {
            let dsl = self.dsl.read();
            let mut freed_log = Vec::new();
            for dataset in dsl.values() {
                let v = dataset.state.lock();
                let header = match &v.log {
                    Some(log) => {
                        let anchor = log.anchor(txg);
                        freed_log.extend(anchor.freed);
                        anchored.push(Arc::clone(log));
                        Some(LogHeader {
                            chain_id: log.chain_id(),
                            head_sequence: anchor.head_verifier.sequence,
                            replayed_record: 0,
                            claim_txg: 0,
                            head: anchor.head.pointer(txg),
                        })
                    }
                    None => replay_progress.get(&v.entry.name).copied().unwrap_or(v.entry.log),
                };
                headers.insert(v.entry.name.clone(), header);
            }
            let mut allocator = self.spa.allocator().lock();
            for at in freed_log {
                allocator.free_log(txg, at.vdev, at.offset_bytes, at.alloc_bytes);
            }
            drop(allocator);
            PoolDirectory {
                txg,
                next_volume_id: dsl.next_id(),
                space_maps: vec![Vec::new(); vdevs],
                volumes: dsl
                    .values()
                    .map(|dataset| {
                        let v = dataset.state.lock();
                        let synced = roots.get(&v.entry.name);
                        let mut entry = VolumeEntry {
                            // A volume created since the quiesce has no tree yet.
                            root: synced.and_then(|s| s.root),
                            root_mac: synced.map_or(v.entry.root_mac, |s| s.root_mac),
                            space: synced.map_or(v.entry.space, |s| Some(s.space)),
                            log: headers.get(&v.entry.name).copied().flatten(),
                            ..v.entry.clone()
                        };
                        if let Some(synced) = synced {
                            synced.family.apply(&mut entry);
                            if synced.family.rolled_back && entry.reservation_bytes != 0 {
                                entry.reservation_bytes =
                                    self.spa.thick_reservation(entry.size_bytes, entry.block_bytes);
                            }
                        }
                        entry
                    })
                    .collect(),
                ddt: ddt_header,
                records: Some(DirectoryRecords {
                    config: config.clone(),
                    leaves: self.spa.pool().leaf_records(),
                    scan,
                }),
                properties: self.spa.pool().properties_for_directory(&config),
                // A family no volume names any more goes (its key too, if loaded).
                key_families: {
                    let in_use: std::collections::BTreeSet<u64> =
                        dsl.values().map(|d| d.state.lock().entry.key_family).collect();
                    self.spa.crypt().keep_in_use(&in_use, self.spa.pool().zio().keys())
                },
            }
        };
        (anchored, headers, directory)
    }

    /// After the uberblock: the new roots become the volumes' trees on disk, and failed log
    /// chains are replaced.
    fn finish(
        &self,
        txg: u64,
        roots: &BTreeMap<String, SyncedTree>,
        headers: &BTreeMap<String, Option<LogHeader>>,
        (directory_bp, space_maps): (BlockPointer, Vec<Vec<BlockPointer>>),
        anchored: &[Arc<LogWriter>],
    ) -> Result<(), StoreError> {
        // A step at a time, letting writers' admissions and log blocks take the allocator's
        // lock between steps (`Allocator::synced_some`). The lock is handed over fairly: let
        // go plainly, this loop took it straight back before a woken writer ran.
        loop {
            let mut allocator = self.spa.allocator().lock();
            let more = allocator.synced_some(txg, SYNCED_FREES_PER_STEP);
            MutexGuard::unlock_fair(allocator);
            if !more {
                break;
            }
        }
        // Counted once the frees it ended are allocatable: a writer short of space is refused
        // after a count of syncs, and must not count one whose space it could not yet see.
        self.syncer.count_sync();
        let dsl = self.dsl.read();
        let mut synced_blocks = Vec::new();
        for dataset in dsl.values() {
            let mut volume = dataset.state.lock();
            if let Some(synced) = roots.get(&volume.entry.name) {
                volume.entry.root = synced.root;
                volume.entry.root_mac = synced.root_mac;
                volume.entry.space = Some(synced.space);
                synced.family.apply(&mut volume.entry);
                if synced.family.rolled_back {
                    // Writes that came in during the sync lie past a smaller size, perhaps.
                    let blocks = volume.entry.size_bytes / u64::from(volume.entry.block_bytes);
                    volume.open.retain(|&index, _| index < blocks);
                    if volume.entry.reservation_bytes != 0 {
                        volume.entry.reservation_bytes = self
                            .spa
                            .thick_reservation(volume.entry.size_bytes, volume.entry.block_bytes);
                    }
                }
                volume.disk_levels = volume.entry.levels;
            }
            if let Some(header) = headers.get(&volume.entry.name) {
                volume.entry.log = *header;
            }
            // A snapshot queued for this txg or before is in `prev_snap_txg` now.
            if volume.snapshot_queued_txg <= txg {
                volume.snapshot_queued_txg = 0;
            }
            // Dropped once the volume's lock is let go: freeing tens of thousands of block
            // buffers under it held that volume's writers for milliseconds.
            synced_blocks.push(std::mem::take(&mut volume.syncing));
        }
        self.syncer.set_synced(SyncedMetadata { space_maps, directory: Some(directory_bp) });
        self.txg.lock().synced_directory(directory_bp.psize_bytes());
        // Records of this txg need no log any more. A chain with a failed write is replaced
        // (every chain, when asked: `Zil::restart_chains`): records not yet issued move to a
        // new chain, which the next sync anchors.
        let mut replaced = Vec::new();
        let restart = self.zil.take_restart();
        for dataset in dsl.values() {
            let mut volume = dataset.state.lock();
            let Some(log) = volume.log.clone() else { continue };
            log.synced(txg, anchored.iter().any(|a| Arc::ptr_eq(a, &log)));
            if log.failed() || restart {
                let owner = ChainOwner {
                    chain_id: self.zil.chain_id(self.spa),
                    volume_id: volume.entry.id,
                    key_family: volume.entry.key_family,
                };
                let fresh = LogWriter::continuing(
                    self.spa.pool().name(),
                    self.spa.allocator(),
                    self.zil.settings_for(volume.entry.block_bytes),
                    owner,
                    log.hand_over(txg),
                )?;
                replaced.extend(log.retire());
                volume.log = Some(Arc::new(fresh));
            }
        }
        if !replaced.is_empty() {
            self.txg.lock().queue(super::dataset::RetiredLog(replaced));
        }
        // The synced layers go once the namespace is let go too: a create or destroy queued
        // for it would otherwise hold every write's admission, which reads it, meanwhile.
        drop(dsl);
        drop(synced_blocks);
        Ok(())
    }
}

/// Writes every volume's dirty blocks and the indirect blocks above them; returns each
/// volume's new root and space figures.
async fn write_volumes(
    spa: &Spa,
    patches: &PatchStats,
    ctx: &mut TreeUpdate<'_>,
    work: Vec<VolumeWork>,
) -> Result<BTreeMap<String, SyncedTree>, PoolError> {
    let txg = ctx.txg;
    let mut roots = BTreeMap::new();
    for VolumeWork { entry, disk_levels, blocks, prewritten, raw, early_abort } in work {
        let (replaced_before, born_before) = (ctx.replaced.len(), ctx.born.len());
        // Patched blocks are completed first, up to SYNC_WRITES_IN_FLIGHT at once, in
        // block order. Blocks of ordinary volumes are then allocated in that order and
        // written in spans (crate::zio). Blocks of dedup volumes are hashed and
        // looked up in tasks of their own, so that work spreads over the runtime's
        // threads, as ZFS's write-issue taskq spreads it over CPUs.
        let dedup = entry.dedup;
        let compression = spa.stored_compression(&entry);
        let key_family = entry.key_family;
        let (root, block_bytes) = (entry.root, entry.block_bytes as usize);
        // Owned, outside every lock: the map stays shared with the volume's readers.
        let blocks: Vec<(u64, Block)> = blocks.iter().map(|(&i, b)| (i, b.clone())).collect();
        // Only patches have work to complete; a txg of whole blocks (a stream's) skips the
        // buffered stream, whose bookkeeping per block was a cost per block of every large
        // write.
        let completed = if blocks.iter().any(|(_, b)| matches!(b, Block::Patched(_))) {
            futures::future::Either::Left(
                futures::stream::iter(blocks.into_iter().map(|(index, block)| {
                    complete_block(spa, patches, root, disk_levels, block_bytes, index, block)
                }))
                .buffered(SYNC_WRITES_IN_FLIGHT),
            )
        } else {
            futures::future::Either::Right(futures::stream::iter(blocks.into_iter().map(Ok)))
        };
        // The blocks' new pointers, in block order (objset::Updates).
        let updates: Vec<(u64, Option<BlockPointer>)> = if dedup == DedupMode::Off {
            let span_bytes = spa.pool().root().write_span_bytes() as usize;
            let per_span = (span_bytes / block_bytes).max(1);
            let (ctx, prewritten, name) = (&*ctx, &prewritten, entry.name.as_str());
            let early_abort = &early_abort;
            let mut written: Vec<Vec<(u64, Option<BlockPointer>)>> = completed
                .try_chunks(per_span)
                .map_err(|futures::stream::TryChunksError(_, e)| e)
                .map_ok(|chunk| async move {
                    // Each span's bookkeeping is CPU alone when its blocks were written
                    // already (linked): other tasks of the core get their turns between spans.
                    spa.pool().env().pause().await;
                    let mut plain = Vec::with_capacity(chunk.len());
                    // Blocks an indirect log record already wrote where they belong are
                    // linked, not written again (ZFS: dbuf_sync_leaf's override).
                    let mut linked: Vec<(u64, BlockPointer)> = Vec::new();
                    // The blocks of one run share its write: awaited once.
                    let mut last_write: Option<(&DataWrite, bool)> = None;
                    for (index, block) in &chunk {
                        match block {
                            Block::Data(bytes) => {
                                let same =
                                    prewritten.get(index).filter(|p| Arc::ptr_eq(&p.data, bytes));
                                if let Some(p) = same {
                                    let ok = match last_write {
                                        Some((write, ok)) if write.ptr_eq(&p.write) => ok,
                                        _ => {
                                            let ok = p.write.clone().await.ok();
                                            last_write = Some((&p.write, ok));
                                            ok
                                        }
                                    };
                                    if ok {
                                        linked.push((*index, p.bp));
                                        continue;
                                    }
                                }
                                if raw {
                                    // Its bytes are ciphertext, sealed by the sender: sealed
                                    // again they would be garbage. Its write failed.
                                    return Err(PoolError::RawBlockUnwritten {
                                        pool: spa.pool().name().to_owned(),
                                        volume: name.to_owned(),
                                        block: *index,
                                    });
                                }
                                plain.push(Arc::clone(bytes));
                            }
                            Block::Zero => {}
                            Block::Patched(_) => unreachable!("patches are completed above"),
                        }
                    }
                    // Through every zio stage: sealed in this core's taskq (zio::taskq),
                    // allocated in block order, written in spans.
                    let mut props = BlockProps::data(Writer::VolumeData, txg, compression);
                    if key_family != 0 {
                        props.crypt = crate::zio::PropsCrypt::Encrypt {
                            family: key_family,
                            convergent: false,
                        };
                    }
                    let data = plain.into_iter().map(|bytes| (props, bytes)).collect();
                    let mut bps = spa
                        .pool()
                        .write_blocks(
                            ctx.allocator,
                            AllocClass::Reserved,
                            data,
                            Some(Arc::clone(early_abort)),
                        )
                        .await?
                        .into_iter();
                    // Linked blocks are in the chunk's order.
                    let mut linked = linked.into_iter().peekable();
                    Ok::<_, PoolError>(
                        chunk
                            .into_iter()
                            .map(|(index, block)| match block {
                                Block::Data(_) => match linked.next_if(|l| l.0 == index) {
                                    Some((_, bp)) => (index, Some(bp)),
                                    None => (index, bps.next()),
                                },
                                _ => (index, None),
                            })
                            .collect(),
                    )
                })
                .try_buffer_unordered(SPANS_IN_FLIGHT)
                .try_collect()
                .await?;
            // Each span holds a run of the blocks in order, and the runs do not overlap:
            // ordered by their first blocks they join into one ordered list, each entry
            // copied once.
            written.sort_unstable_by_key(|span| span.first().map(|&(index, _)| index));
            let mut updates = Vec::with_capacity(written.iter().map(Vec::len).sum());
            for span in written {
                updates.extend(span);
            }
            updates
        } else {
            let verify = dedup == DedupMode::Verify;
            let mut updates: Vec<(u64, Option<BlockPointer>)> = completed
                .map_ok(|(index, block)| async move {
                    let bp = match block {
                        Block::Data(data) => {
                            let written =
                                spawn_dedup_write(spa, txg, data, verify, compression, key_family);
                            Some(written.await?)
                        }
                        Block::Zero => None,
                        Block::Patched(_) => unreachable!("patches are completed above"),
                    };
                    Ok::<_, PoolError>((index, bp))
                })
                .try_buffer_unordered(SYNC_WRITES_IN_FLIGHT)
                .try_collect()
                .await?;
            updates.sort_unstable_by_key(|&(index, _)| index);
            updates
        };
        // Linked blocks become allocated in this txg's maps; the others are freed once
        // their writes have ended. A linked block is cached from the buffer it was written
        // from, as the blocks this sync writes are (objset's write_placed): the next
        // partial write of it needs its bytes at that sync. Left out, the first 4 KiB
        // write into each block a large sync write had placed read it back from the disk
        // (one client after a 1 GiB write + flush, `txg.dirty_max` 2.4 GiB: 4,836 cache
        // misses, 0.1 disk reads per write).
        // The cache inserts run after the allocator's lock is released: the clients' own
        // writes take that lock several times each, and a sync linking a 1 GiB write holds
        // thousands of blocks (with the inserts under the lock, a lone client's 1 MiB
        // write + flush p99 was 2.1-2.5 ms against 1.4-1.5 ms with no data cached).
        let mut unused = Vec::new();
        // Most are linked: a large write + flush logs every block by pointer, and this list,
        // regrown as it filled, copied its entries (a block pointer each) again and again.
        let mut linked = Vec::with_capacity(prewritten.len());
        {
            let mut allocator = spa.allocator().lock();
            // Adopted a run at a time: a large write's blocks lie back to back.
            let mut run: Option<(u32, u64, u64)> = None;
            // Both in block order: each lookup starts where the last one ended.
            let mut at = 0;
            for (index, p) in prewritten {
                at += updates[at..].partition_point(|&(i, _)| i < index);
                if updates.get(at) == Some(&(index, Some(p.bp))) {
                    let dva = p.bp.dvas[0];
                    let (vdev, start, len) = (dva.vdev, dva.offset_bytes(), dva.asize_bytes());
                    match &mut run {
                        Some((v, s, l)) if *v == vdev && *s + *l == start => *l += len,
                        _ => {
                            if let Some((v, s, l)) = run.replace((vdev, start, len)) {
                                allocator.adopt_log(v, s, l);
                            }
                        }
                    }
                    linked.push(p);
                } else {
                    unused.push(p);
                }
            }
            if let Some((v, s, l)) = run {
                allocator.adopt_log(v, s, l);
            }
        }
        // Not a raw receive's: its buffer holds ciphertext, not the block's logical bytes
        // (a read decrypts it from the disk, with the key).
        if !raw {
            for part in linked.chunks(CACHE_INSERTS_PER_PAUSE) {
                spa.pool().cache().insert_all(part.iter().map(|p| (&p.bp, Arc::clone(&p.data))));
                spa.pool().env().pause().await;
            }
        }
        // Not held across the tree update: the cache has the buffers it keeps.
        drop(linked);
        spa.release_prewritten(txg, unused).await;
        let grown = objset::grow_levels(ctx, entry.root, disk_levels, entry.levels).await?;
        let root = if updates.is_empty() {
            grown
        } else {
            objset::update_tree(ctx, grown, entry.levels, &updates).await?
        };
        // Only the sync changes the figures, and it holds the sync lock: the quiesced
        // entry's are current.
        let mut space = entry.space.expect("import counts every volume's space");
        let born = updates.iter().filter_map(|(_, bp)| bp.as_ref()).chain(&ctx.born[born_before..]);
        for bp in born {
            objset::add_space(&mut space, bp, true);
        }
        for bp in &ctx.replaced[replaced_before..] {
            objset::add_space(&mut space, bp, false);
        }
        // What the newest snapshot holds stays allocated, on the dead list.
        let mut dead = Vec::new();
        if entry.prev_snap_txg > 0 {
            let prev = entry.prev_snap_txg;
            // This volume's part of the list is compacted in place, in order: no new list
            // for the blocks that stay.
            let mut kept = replaced_before;
            for at in replaced_before..ctx.replaced.len() {
                let bp = ctx.replaced[at];
                if bp.birth_txg > prev {
                    ctx.replaced[kept] = bp;
                    kept += 1;
                } else {
                    dead.push(bp);
                }
            }
            ctx.replaced.truncate(kept);
        }
        let family = Family::of(&entry);
        // An encrypted volume's new root gets its MAC from the family's key, which a root
        // that changed needs: only writes change it, and they are refused without the key.
        let root_mac = if entry.key_family == 0 || raw {
            // A raw receive's root gets the stream's MAC when the receive ends.
            entry.root_mac
        } else if let Some(key) = spa.pool().zio().keys().get(entry.key_family) {
            key.root_mac(entry.key_family, root.as_ref())
        } else if root == entry.root {
            entry.root_mac
        } else {
            return Err(PoolError::KeyUnavailable {
                pool: spa.pool().name().to_owned(),
                block: format!("the root of volume {}", entry.name),
                family: entry.key_family,
            });
        };
        roots.insert(entry.name.clone(), SyncedTree { root, root_mac, space, dead, family });
    }
    Ok(roots)
}

/// Drops the references of replaced dedup blocks, then writes the table; returns its new
/// header and every block this txg replaced that is now free (the table hands back the
/// blocks left without references, with its own replaced blocks).
async fn write_dedup_table(
    spa: &Spa,
    ctx: &mut TreeUpdate<'_>,
) -> Result<(DdtHeader, Vec<BlockPointer>), PoolError> {
    // The dedup blocks copied out, the rest kept in place and in order: few or none are
    // dedup blocks, and a partition into two new lists regrew a list of every block the txg
    // replaced (tens of thousands after a large write) on each sync.
    let mut replaced = std::mem::take(&mut ctx.replaced);
    let shared: Vec<BlockPointer> =
        replaced.iter().filter(|bp| bp.dedup.is_some()).copied().collect();
    if !shared.is_empty() {
        replaced.retain(|bp| bp.dedup.is_none());
    }
    let (ddt, pool) = (&**spa.ddt(), &**spa.pool());
    futures::stream::iter(shared.into_iter().map(|bp| async move { ddt.free(pool, &bp).await }))
        .buffer_unordered(SYNC_WRITES_IN_FLIGHT)
        .try_collect::<Vec<()>>()
        .await?;
    let ddt_header = spa.ddt().flush(ctx).await?;
    replaced.append(&mut ctx.replaced);
    Ok((ddt_header, replaced))
}

/// Writes the space maps and the directory that points at them: the pieces are allocated
/// before any map is encoded, so every map includes its own blocks and the directory's.
async fn write_space_maps_and_directory(
    spa: &Spa,
    txg: u64,
    vdevs: usize,
    mut directory: PoolDirectory,
) -> Result<(BlockPointer, Vec<Vec<BlockPointer>>), PoolError> {
    let name = spa.pool().name().to_owned();
    let no_space = |source: AllocError| PoolError::NoSpace { pool: name.clone(), cause: source };
    // Allocate the space-map pieces before encoding any map, so every map includes them.
    // One piece more than the map needs now leaves room for the entries that these
    // allocations and the directory's add.
    let directory_len = directory
        .encoded_len()
        .map_err(|source| PoolError::Format { pool: name.clone(), cause: source })?;
    let (map_blocks, directory_block, maps) = {
        let mut allocator = spa.allocator().lock();
        // Each piece in `copies` copies, the directory in one more (ditto blocks).
        let copies = spa.pool().metadata_copies();
        let place = |allocator: &mut Allocator, bytes: u64, copies: usize| {
            allocator.allocate_metadata(bytes, copies).map_err(no_space)
        };
        let mut blocks = Vec::new();
        for vdev in 0..vdevs as u32 {
            let (free, deferred) = allocator.space_map_entries(vdev);
            // A hole has no space, so no map: its list of pieces stays empty.
            let need =
                if allocator.is_hole(vdev) { 0 } else { piece_layout(free, deferred).len() + 1 };
            let mut pieces = Vec::with_capacity(need);
            for _ in 0..need {
                pieces.push(place(&mut allocator, SPACE_MAP_PIECE_BYTES, copies)?);
            }
            blocks.push(pieces);
        }
        let pieces: usize = blocks.iter().map(Vec::len).sum();
        // The directory block's size, in whole sectors (what it allocates is the vdev's
        // business).
        let directory_bytes = ((directory_len + pieces * sluice_format::BLKPTR_BYTES) as u64)
            .next_multiple_of(allocator.unit_bytes());
        let directory_block = place(&mut allocator, directory_bytes, (copies + 1).min(DVAS_MAX))?;
        let maps: Vec<SpaceMap> = (0..vdevs as u32).map(|v| allocator.space_map(v)).collect();
        (blocks, directory_block, maps)
    };
    for (vdev, (map, blocks)) in maps.iter().zip(&map_blocks).enumerate() {
        let mut pieces = if blocks.is_empty() {
            // A hole: nothing to map.
            Vec::new()
        } else {
            split_space_map(map)
        };
        assert!(
            pieces.len() <= blocks.len(),
            "space map of vdev {vdev} outgrew its pieces ({} > {})",
            pieces.len(),
            blocks.len()
        );
        // Unused pieces are written empty: every allocated block is part of the map.
        while pieces.len() < blocks.len() {
            pieces.push(SpaceMap {
                ashift: map.ashift,
                synced_txg: map.synced_txg,
                free: Vec::new(),
                deferred: Vec::new(),
            });
        }
        let writes = pieces.iter().zip(blocks).map(|(piece, places)| {
            let name = name.clone();
            async move {
                let bytes = piece
                    .encode()
                    .map_err(|source| PoolError::Format { pool: name.clone(), cause: source })?;
                debug_assert!(
                    bytes.len() as u64 <= spa.pool().max_psize(places[0].0, places[0].2),
                    "a piece fits its block"
                );
                let logical = Arc::new(AlignedBuf::copy_from(&bytes));
                spa.write_metadata(Writer::SpaceMap, places, logical, txg).await
            }
        });
        directory.space_maps[vdev] = futures::future::try_join_all(writes).await?;
    }
    // What the directory's places hold (less parity and padding on RAID-Z).
    let room = directory_block
        .iter()
        .map(|&(vdev, _, asize)| spa.pool().max_psize(vdev, asize))
        .min()
        .unwrap_or(0);
    let bytes = directory
        .encode(room as usize)
        .map_err(|source| PoolError::Format { pool: name.clone(), cause: source })?;
    let logical = Arc::new(AlignedBuf::copy_from(&bytes));
    let directory_bp =
        spa.write_metadata(Writer::Directory, &directory_block, logical, txg).await?;
    Ok((directory_bp, directory.space_maps))
}

/// A syncing block ready to write: a patch is completed from the version on disk, which
/// is the one it was written over (syncs run one at a time). Read at async priority and
/// not cached: the sync must not crowd out the log writes and reads clients wait for, and
/// the old block is going away.
async fn complete_block(
    spa: &Spa,
    patches: &PatchStats,
    root: Option<BlockPointer>,
    disk_levels: u8,
    block_bytes: usize,
    index: u64,
    block: Block,
) -> Result<(u64, Block), PoolError> {
    let Block::Patched(patch) = block else { return Ok((index, block)) };
    // The version below is about to be replaced: taken from the cache when there, but a
    // miss is read past it (caching a block this sync frees would only evict live ones).
    let whole = match objset::data_block_pointer(spa.pool(), root, disk_levels, index).await? {
        Some(bp) => match spa.pool().cache().get(&bp) {
            Some(hit) => patch.apply(Some(&hit[..block_bytes])),
            None => {
                let class = crate::tunables::IoClass::AsyncRead;
                let read = spa.pool().read_block_logical(&bp, class).await?;
                // The block read is ours: the covered sectors go into it, with no copy of
                // the rest (the syncing map still holds the patch for readers).
                if read.len() == block_bytes {
                    patch.apply_owned(Some(read))
                } else {
                    patch.apply(Some(&read[..block_bytes]))
                }
            }
        },
        None => patch.apply(None),
    };
    patches.completed_by_sync.inc();
    Ok((index, Block::Data(Arc::new(whole))))
}

/// Writes one block of a dedup volume through the table, in a task of its own.
async fn spawn_dedup_write(
    spa: &Spa,
    txg: u64,
    data: Arc<AlignedBuf>,
    verify: bool,
    compression: Compression,
    family: u64,
) -> Result<BlockPointer, PoolError> {
    let (tx, rx) = futures::channel::oneshot::channel();
    let (ddt, pool, allocator) =
        (Arc::clone(spa.ddt()), Arc::clone(spa.pool()), Arc::clone(spa.allocator()));
    spa.pool().env().spawn("dedup write", async move {
        let written = ddt.write(&pool, &allocator, txg, data, verify, compression, family).await;
        // Dropped before answering, so that no task still holds the pool when the sync
        // that waits for this answer returns (export unwraps it).
        drop((ddt, pool, allocator));
        let _ = tx.send(written);
    });
    rx.await.unwrap_or_else(|_| {
        Err(PoolError::Format {
            pool: spa.pool().name().to_owned(),
            cause: sluice_format::FormatError::Invalid {
                what: "dedup write task",
                field: "ended without an answer in txg",
                value: txg,
            },
        })
    })
}
