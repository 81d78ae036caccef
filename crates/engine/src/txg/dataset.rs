//! Volumes as datasets of the pool (ZFS: `dsl_dataset.c`, `zvol.c`'s administration):
//! create, destroy, resize, properties, and each volume's in-memory state.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use sluice_format::{BlockPointer, Compression, DedupMode, LogBias, SyncMode, VolumeEntry};

use super::dbuf::{Block, Prewritten};
use super::dsl_pool::{Txg, TxgLimits};
use super::dsl_scan::Scan;
use super::dsl_synctask::{SyncCx, SyncTask};
use super::spa::Spa;
use super::{Store, StoreError, BLOCK_BYTES_MAX, BLOCK_BYTES_MIN};
use crate::intent_log::{LogAddress, LogWriter};
use crate::objset::{self};
use crate::pool::PoolError;
use crate::stats::VolumeStats;
use sluice_format::VOLUME_NAME_BYTES_MAX;

/// A volume of the store: what does not change while it exists, the counters every handle
/// shares, and its changing state behind a lock of its own. The store's map and every
/// [`crate::volume::Volume`] handle hold it by `Arc`, so a request reaches its volume without
/// looking its name up or copying its entry under the namespace's lock (`Dsl::datasets`).
#[derive(Debug)]
pub struct Dataset {
    pub(super) id: u64,
    /// Changes only on a rename, under the namespace's write lock.
    pub(super) name: Mutex<String>,
    pub(super) block_bytes: u32,
    /// Bounds the requests served at once when `volume.request_threads` is set.
    pub(super) gate: Option<Arc<async_lock::Semaphore>>,
    /// Requests the volume front is serving now (crate::volume counts them).
    pub(super) requests: Arc<AtomicUsize>,
    /// What the volume front has answered since import.
    pub(super) stats: Arc<VolumeStats>,
    /// This volume's part of the open txg's `dirty_bytes`. Changed only under the store's
    /// txg lock (with the total), read without any: the throttle reads every volume's on
    /// each write.
    pub(super) dirty_bytes: AtomicU64,
    /// Set, under the txg lock, when the volume is destroyed: requests through
    /// handles still holding it then fail.
    pub(super) destroyed: AtomicBool,
    /// A snapshot's dataset (its NBD export): reads only, from a tree that never changes.
    pub(super) read_only: bool,
    /// Held shared by every change (`Store::modify`), exclusively by a rollback from before its
    /// op until its sync has ended (ZFS suspends the dataset the same way): a write during the
    /// rollback would otherwise build its block on the tree being rolled away.
    pub(super) rollback_gate: async_lock::RwLock<()>,
    /// Taken inside the txg lock, never the other way round (crate::txg's lock order).
    pub(super) state: Mutex<VolumeState>,
    /// The volume's sequential read streams and the blocks they fetched ahead.
    pub(super) zfetch: Arc<super::dmu_zfetch::Zfetch>,
    /// Where the early abort stood after the volume's last batch of blocks, committed or
    /// synced (`zio::compress::plan_run`).
    pub(super) early_abort: Arc<crate::zio::compress::RunHint>,
}

/// The datasets' side of the store (ZFS: `dsl_pool`'s namespace and its `dsl_scan`): the
/// volumes by name behind their read-write lock, and the background scrub or resilver. It
/// keeps the pool's name for its errors, not the pool: the pool is the spa's, and an export
/// checks that nothing else holds it. Its methods are kept beside their mechanisms, as
/// OpenZFS keeps the DSL's in `dsl_*.c`: the lookups here, the snapshot lookups and figures
/// in dsl_snapshot.rs, the scan's in dsl_scan.rs (on [`Scan`]). What changes the namespace
/// against the open txg (destroy, rename, resize, snapshot changes, clones) is its own too,
/// taking the `Spa` and the `Txg` (and the `Zil` for a clone's new log); the store holds the
/// sync's lock around those a sync must not run across, and syncs after the snapshot
/// changes. Volume create stays on the store, which has the `Zil` (zil.rs imports this file).
#[derive(Debug)]
pub(super) struct Dsl {
    pool_name: String,
    datasets: RwLock<Datasets>,
    scan: Scan,
}

impl Dsl {
    pub(super) fn new(pool_name: &str, datasets: Datasets, scan: Scan) -> Dsl {
        Dsl { pool_name: pool_name.to_owned(), datasets: RwLock::new(datasets), scan }
    }

    /// The namespace, shared: lookups (crate::txg's lock order: after the scan, before the
    /// txg).
    pub(super) fn read(&self) -> RwLockReadGuard<'_, Datasets> {
        self.datasets.read()
    }

    /// The namespace, alone: create, rename, clone, destroy, snapshot ids.
    pub(super) fn write(&self) -> RwLockWriteGuard<'_, Datasets> {
        self.datasets.write()
    }

    /// The background scrub or resilver (dsl_scan.rs), whose lock comes before the namespace.
    pub(super) fn scan(&self) -> &Scan {
        &self.scan
    }

    /// A volume by name.
    pub(super) fn dataset(&self, name: &str) -> Result<Arc<Dataset>, StoreError> {
        self.read().get(name).cloned().ok_or_else(|| self.no_such_volume(name))
    }

    /// A volume's id, if it exists (sync tasks name the volumes a scan walks again by id).
    pub(super) fn volume_id(&self, name: &str) -> Option<u64> {
        self.read().get(name).map(|d| d.id)
    }

    /// One volume's entry (name, size, block size), if it exists.
    pub(super) fn volume_info(&self, name: &str) -> Option<VolumeEntry> {
        self.dataset(name).ok().map(|d| d.state.lock().entry.clone())
    }

    /// The volumes, without the hidden ones receives are writing.
    pub(super) fn volumes(&self) -> Vec<VolumeEntry> {
        let mut all = self.all_volumes();
        all.retain(|v| !is_hidden(&v.name));
        all
    }

    /// The volumes, hidden ones too.
    pub(super) fn all_volumes(&self) -> Vec<VolumeEntry> {
        self.read().values().map(|d| d.state.lock().entry.clone()).collect()
    }

    /// Fails for a handle whose volume was destroyed.
    pub(super) fn check_exists(&self, dataset: &Dataset) -> Result<(), StoreError> {
        if dataset.destroyed.load(Ordering::Acquire) {
            Err(self.no_such_volume(&dataset.name()))
        } else {
            Ok(())
        }
    }

    pub(super) fn pool_name(&self) -> &str {
        &self.pool_name
    }

    pub(super) fn no_such_volume(&self, volume: &str) -> StoreError {
        StoreError::NoSuchVolume { pool: self.pool_name.clone(), volume: volume.to_owned() }
    }
}

/// The pool's volumes by name (ZFS: the dataset namespace `dsl_dir` keeps), and the read-only
/// datasets of snapshots being served: the one map every lookup, create, rename, clone and
/// destroy goes through, behind its own lock (`Dsl::datasets`). Writes do not take it: a handle
/// holds its [`Dataset`], and a destroy marks it under the txg lock, which every write takes.
/// Volume and snapshot ids come from here, and are never reused.
#[derive(Debug)]
pub(super) struct Datasets {
    next_volume_id: u64,
    volumes: BTreeMap<String, Arc<Dataset>>,
    /// Datasets of snapshots served read-only, by snapshot id, while a handle holds one.
    snapshot_exports: BTreeMap<u64, std::sync::Weak<Dataset>>,
}

impl Datasets {
    pub(super) fn new(next_volume_id: u64, volumes: BTreeMap<String, Arc<Dataset>>) -> Datasets {
        Datasets { next_volume_id, volumes, snapshot_exports: BTreeMap::new() }
    }

    pub(super) fn get(&self, name: &str) -> Option<&Arc<Dataset>> {
        self.volumes.get(name)
    }

    pub(super) fn contains(&self, name: &str) -> bool {
        self.volumes.contains_key(name)
    }

    /// The volumes by name, in name order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&String, &Arc<Dataset>)> {
        self.volumes.iter()
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &Arc<Dataset>> {
        self.volumes.values()
    }

    /// Adds a volume under a name the caller found free under this same lock.
    pub(super) fn insert(&mut self, name: String, dataset: Arc<Dataset>) {
        let taken = self.volumes.insert(name, dataset);
        assert!(taken.is_none(), "a volume name checked free was taken");
    }

    pub(super) fn remove(&mut self, name: &str) -> Option<Arc<Dataset>> {
        self.volumes.remove(name)
    }

    /// Volumes whose dead list the open txg's sync appends to: only a volume with a snapshot
    /// and something in the txg does (`dsl_pool::SyncShape` bounds the pieces it writes).
    pub(super) fn appending_deadlists(&self) -> u64 {
        self.values()
            .filter(|d| {
                let v = d.state.lock();
                v.entry.prev_snap_txg > 0 && !v.open.is_empty()
            })
            .count() as u64
    }

    /// The id the next volume or snapshot gets (the directory records it).
    pub(super) fn next_id(&self) -> u64 {
        self.next_volume_id
    }

    /// Takes id `id`, which [`Datasets::next_id`] gave under this same lock.
    pub(super) fn use_id(&mut self, id: u64) {
        assert_eq!(id, self.next_volume_id, "ids are taken in order, under the namespace's lock");
        self.next_volume_id += 1;
    }

    /// The served dataset of snapshot `id`, while a handle holds it.
    pub(super) fn export(&self, id: u64) -> Option<Arc<Dataset>> {
        self.snapshot_exports.get(&id).and_then(std::sync::Weak::upgrade)
    }

    /// Records the served dataset of snapshot `id` (and forgets those no handle holds).
    pub(super) fn add_export(&mut self, id: u64, dataset: &Arc<Dataset>) {
        self.snapshot_exports.retain(|_, weak| weak.strong_count() > 0);
        self.snapshot_exports.insert(id, Arc::downgrade(dataset));
    }

    /// Forgets snapshot `id`'s served dataset, returning it if a handle still holds it.
    pub(super) fn retire_export(&mut self, id: u64) -> Option<Arc<Dataset>> {
        self.snapshot_exports.remove(&id).and_then(|weak| weak.upgrade())
    }
}

/// What changes in a volume as it is written and synced.
#[derive(Debug)]
pub(super) struct VolumeState {
    /// `entry.log` is the log header of the last synced txg.
    pub(super) entry: VolumeEntry,
    /// Levels of the tree on disk; below `entry.levels` after a grow until the next sync.
    pub(super) disk_levels: u8,
    pub(super) open: BTreeMap<u64, Block>,
    /// The syncing txg's blocks, shared with the sync that writes them: a quiesce hands them
    /// over without copying the map under the txg's and the volume's locks, which every write
    /// takes (a txg of many small writes holds tens of thousands).
    pub(super) syncing: Arc<BTreeMap<u64, Block>>,
    /// Blocks of `open` already written in place for indirect log records, by block index.
    pub(super) prewritten: BTreeMap<u64, Prewritten>,
    /// The volume's intent log; `None` while import replays the old chain (the directory
    /// keeps pointing at it until replay is complete).
    pub(super) log: Option<Arc<LogWriter>>,
    /// A raw receive writes it: every data block it holds dirty is ciphertext already written
    /// in place, which its sync links and never seals, and its root keeps the MAC it has
    /// (the stream's is set when the receive ends).
    pub(super) raw_receive: bool,
    /// The txg of a snapshot queued and not yet synced (0: none), which `entry.prev_snap_txg`
    /// becomes only when that sync ends: blocks born up to it are about to be shared, and
    /// the rewrite of scattered blocks (dmu_rewrite.rs) leaves them alone.
    pub(super) snapshot_queued_txg: u64,
}

impl VolumeState {
    /// The indirect blocks the sync rewrites, in `pool.metadata_copies` copies, for a group of
    /// blocks under one level-1 indirect block that had nothing dirty yet: its path to the
    /// root.
    pub(super) fn metadata_per_new_group(&self, pool: &crate::pool::Pool) -> u64 {
        u64::from(self.entry.levels)
            * crate::objset::INDIRECT_BYTES as u64
            * pool.metadata_copies() as u64
    }

    /// Whether level-1 group `group` (blocks `group * INDIRECT_BPS..`) has nothing dirty in
    /// the open txg.
    pub(super) fn group_clean(&self, group: u64) -> bool {
        let bps = crate::objset::INDIRECT_BPS;
        self.open.range(group * bps..(group + 1) * bps).next().is_none()
    }

    /// Blocks born at or before this txg are, or are about to be, shared with a snapshot or
    /// a clone's origin.
    pub(super) fn shared_up_to(&self) -> u64 {
        self.entry.prev_snap_txg.max(self.snapshot_queued_txg)
    }
}

/// A settable volume property (`sluice vol set`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VolumeProperty {
    Dedup(DedupMode),
    Sync(SyncMode),
    LogBias(LogBias),
    Compression(Compression),
}

impl Dataset {
    pub(super) fn new(
        entry: VolumeEntry,
        log: Option<Arc<LogWriter>>,
        limits: &TxgLimits,
    ) -> Arc<Dataset> {
        let stats = Arc::new(VolumeStats::default());
        Arc::new(Dataset {
            id: entry.id,
            name: Mutex::new(entry.name.clone()),
            block_bytes: entry.block_bytes,
            gate: (limits.request_threads > 0)
                .then(|| Arc::new(async_lock::Semaphore::new(limits.request_threads))),
            requests: Arc::new(AtomicUsize::new(0)),
            zfetch: Arc::new(super::dmu_zfetch::Zfetch::new(
                limits.zfetch,
                entry.block_bytes,
                Arc::clone(&stats),
            )),
            stats,
            early_abort: Arc::default(),
            dirty_bytes: AtomicU64::new(0),
            destroyed: AtomicBool::new(false),
            read_only: false,
            rollback_gate: async_lock::RwLock::new(()),
            state: Mutex::new(VolumeState {
                disk_levels: entry.levels,
                entry,
                open: BTreeMap::new(),
                syncing: Arc::default(),
                prewritten: BTreeMap::new(),
                raw_receive: false,
                snapshot_queued_txg: 0,
                log,
            }),
        })
    }

    /// The read-only dataset of a snapshot, whose entry names its tree; it has no log.
    pub(super) fn snapshot(entry: VolumeEntry, limits: &TxgLimits) -> Arc<Dataset> {
        let mut dataset = Dataset::new(entry, None, limits);
        Arc::get_mut(&mut dataset).expect("a new dataset has one owner").read_only = true;
        dataset
    }

    /// Whether this is a snapshot's dataset, which refuses writes.
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// The volume's name now (a rename changes it while handles are open).
    pub fn name(&self) -> String {
        self.name.lock().clone()
    }

    /// The volume's sync property now.
    pub fn sync_mode(&self) -> SyncMode {
        self.state.lock().entry.sync
    }

    pub fn block_bytes(&self) -> u32 {
        self.block_bytes
    }

    /// The volume's size now.
    pub fn size_bytes(&self) -> u64 {
        self.state.lock().entry.size_bytes
    }

    /// What the volume's clients have asked of it since import, shared by every handle.
    pub fn stats(&self) -> &Arc<VolumeStats> {
        &self.stats
    }

    /// The volume's key family (0: not encrypted).
    pub fn key_family(&self) -> u64 {
        self.state.lock().entry.key_family
    }

    /// Requests in flight on the volume, shared by every handle.
    pub fn requests(&self) -> &Arc<AtomicUsize> {
        &self.requests
    }

    /// The volume's request limit (`volume.request_threads`), shared by every handle.
    pub fn gate(&self) -> Option<&Arc<async_lock::Semaphore>> {
        self.gate.as_ref()
    }
}

impl VolumeState {
    /// The newest in-memory version of block `index`, if any.
    pub(super) fn cached(&self, index: u64) -> Option<&Block> {
        self.open.get(&index).or_else(|| self.syncing.get(&index))
    }

    /// The blocks in `blocks` with a version in memory (open or syncing txg), in order.
    pub(super) fn in_memory(&self, blocks: &std::ops::Range<u64>) -> Vec<u64> {
        let mut found: Vec<u64> = self.open.range(blocks.clone()).map(|(i, _)| *i).collect();
        found.extend(self.syncing.range(blocks.clone()).map(|(i, _)| *i));
        found.sort_unstable();
        found.dedup();
        found
    }
}

/// The prefix of a hidden receive volume's name.
pub const RECEIVE_PREFIX: &str = "%recv-";

/// Bytes a volume references that its newest snapshot does not (ZFS: the head's
/// `ds_unique_bytes`, as `dsl_dataset_recalc_head_uniq` works it out): all it references
/// when it has none.
pub(super) fn unique_bytes(entry: &VolumeEntry) -> u64 {
    let referenced = entry.space.map_or(0, |s| s.referenced_bytes);
    let newest = match entry.snapshots.last() {
        Some(newest) => newest.space.referenced_bytes,
        // A clone starts out sharing everything its origin references.
        None => match entry.origin {
            Some(origin) => origin.referenced_bytes,
            None => return referenced,
        },
    };
    (referenced + entry.deadlist.bytes()).saturating_sub(newest)
}

/// A receive's hidden volume (`dmu_recv.rs`): its name is the one `%` a name may hold.
pub(super) fn is_hidden(name: &str) -> bool {
    name.strip_prefix(RECEIVE_PREFIX).is_some_and(|t| check_volume_name(t).is_ok())
}

pub(super) fn check_volume_name(name: &str) -> Result<(), StoreError> {
    let ok = !name.is_empty()
        && name.len() <= VOLUME_NAME_BYTES_MAX
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "_-.:".contains(c));
    if ok {
        Ok(())
    } else {
        Err(StoreError::InvalidVolumeName { name: name.to_owned() })
    }
}

impl Dataset {
    /// Reserved bytes the volume has not used yet (ZFS: `usedbyrefreservation`): its
    /// reservation less what its tree takes and what it has dirty.
    /// Blocks shared with its newest snapshot do not count: overwriting them takes new space
    /// (ZFS: the head's unique bytes against `refreservation`).
    pub(super) fn unused_reservation(&self) -> u64 {
        let volume = self.state.lock();
        let used = unique_bytes(&volume.entry);
        let dirty = self.dirty_bytes.load(Ordering::Relaxed);
        volume.entry.reservation_bytes.saturating_sub(used.saturating_add(dirty))
    }
}

impl Store {
    /// Creates a thin volume (blocks take space as they are written); it is durable once the
    /// next sync completes.
    pub fn create_volume(
        &self,
        name: &str,
        size_bytes: u64,
        block_bytes: u32,
    ) -> Result<(), StoreError> {
        self.create_volume_with(name, size_bytes, block_bytes, false)
    }

    /// What a thick volume of `size_bytes` in blocks of `block_bytes` sets aside (ZFS:
    /// `zvol_volsize_to_reservation`).
    pub fn thick_reservation(&self, size_bytes: u64, block_bytes: u32) -> u64 {
        self.spa.thick_reservation(size_bytes, block_bytes)
    }

    /// Bytes a volume could still be given (ZFS: `avail`): what the pool can still set aside,
    /// plus the volume's own unused reservation. `None` for the pool as a whole.
    pub fn available_bytes(&self, volume: Option<&str>) -> Result<u64, StoreError> {
        self.dsl.available_bytes(&self.spa, &self.txg, volume)
    }

    /// Creates a volume, thick (its whole size set aside at once, as `zfs create -V` does,
    /// so its writes never fail for space however full the pool gets) or thin. A thick volume
    /// larger than the space that can still be set aside is refused.
    pub fn create_volume_with(
        &self,
        name: &str,
        size_bytes: u64,
        block_bytes: u32,
        thick: bool,
    ) -> Result<(), StoreError> {
        self.create_volume_in(name, size_bytes, block_bytes, thick, 0)
    }

    /// Refuses a volume that could not be created: a bad name, block size or size, or a name
    /// taken.
    pub(super) fn check_new_volume(
        &self,
        name: &str,
        size_bytes: u64,
        block_bytes: u32,
    ) -> Result<(), StoreError> {
        if !is_hidden(name) {
            check_volume_name(name)?;
        }
        if !block_bytes.is_power_of_two()
            || !(BLOCK_BYTES_MIN..=BLOCK_BYTES_MAX).contains(&block_bytes)
        {
            return Err(StoreError::InvalidBlockSize { volume: name.to_owned(), block_bytes });
        }
        if size_bytes == 0 || size_bytes % u64::from(block_bytes) != 0 {
            return Err(StoreError::InvalidSize {
                volume: name.to_owned(),
                size_bytes,
                block_bytes,
            });
        }
        if self.dsl.read().contains(name) {
            return Err(StoreError::VolumeExists {
                pool: self.spa.pool().name().to_owned(),
                volume: name.to_owned(),
            });
        }
        Ok(())
    }

    /// [`Store::create_volume_with`], of key family `key_family` (0: not encrypted).
    pub(super) fn create_volume_in(
        &self,
        name: &str,
        size_bytes: u64,
        block_bytes: u32,
        thick: bool,
        key_family: u64,
    ) -> Result<(), StoreError> {
        self.spa.check_live()?;
        let _guard = self.spa.panic_guard("a volume create");
        self.check_new_volume(name, size_bytes, block_bytes)?;
        let mut dsl = self.dsl.write();
        let txg = self.txg.lock();
        if dsl.contains(name) {
            return Err(StoreError::VolumeExists {
                pool: self.spa.pool().name().to_owned(),
                volume: name.to_owned(),
            });
        }
        let reservation_bytes =
            if thick { self.spa.thick_reservation(size_bytes, block_bytes) } else { 0 };
        let available = reservable_bytes(&self.spa, &dsl, &txg);
        if reservation_bytes > available {
            return Err(StoreError::NoSpaceToReserve {
                pool: self.spa.pool().name().to_owned(),
                volume: name.to_owned(),
                needed_bytes: reservation_bytes,
                available_bytes: available,
            });
        }
        let id = dsl.next_id();
        let log = Some(self.zil.new_log(&self.spa, id, key_family, block_bytes)?);
        dsl.use_id(id);
        let levels = objset::levels_for(size_bytes / u64::from(block_bytes));
        let mut entry = VolumeEntry::new(id, name, size_bytes, block_bytes, levels);
        entry.reservation_bytes = reservation_bytes;
        entry.key_family = key_family;
        // A raw receive's volume may lack the key; the stream gives its root's MAC at the end.
        if let Some(key) = self.spa.pool().zio().keys().get(key_family) {
            entry.root_mac = key.root_mac(key_family, None);
        }
        dsl.insert(name.to_owned(), Dataset::new(entry, log, self.txg.limits()));
        Ok(())
    }

    /// Sets a volume's dedup property; blocks written from the next sync on follow it (blocks
    /// already stored stay as they are). Durable with the next sync.
    pub fn set_dedup(&self, name: &str, mode: DedupMode) -> Result<(), StoreError> {
        self.set_property(name, VolumeProperty::Dedup(mode))
    }

    /// Sets a volume property. `dedup` and `compression` apply to blocks synced from now on;
    /// `sync` and `logbias` to requests from now on. Durable with the next sync.
    pub fn set_property(&self, name: &str, property: VolumeProperty) -> Result<(), StoreError> {
        self.dsl.set_property(&self.spa, name, property)
    }

    /// Destroys a volume that has no snapshots; its blocks are freed by the next sync.
    pub async fn destroy_volume(&self, name: &str) -> Result<(), StoreError> {
        self.destroy_volume_with(name, false).await
    }

    /// Destroys a volume, and with `snapshots` its snapshots too (`-r`; without, a volume
    /// with snapshots is refused, naming them). Its blocks are freed by the next sync: its
    /// tree's, and those on its and its snapshots' dead lists, which between them are every
    /// block a snapshot holds (crate::txg::dsl_snapshot).
    ///
    /// Waits for a sync in flight: the sync writes the volume's new tree and records it by
    /// the volume's name, so a destroy (or a destroy and a create under the same name) inside
    /// it would free the old tree twice and leak the new one.
    pub async fn destroy_volume_with(&self, name: &str, snapshots: bool) -> Result<(), StoreError> {
        self.spa.check_live()?;
        self.check_log_replayed(name, "destroying it")?;
        let _guard = self.spa.panic_guard("a volume destroy");
        let _no_sync = self.syncer.lock().await;
        self.dsl.destroy_volume(&self.spa, &self.txg, name, snapshots)
    }

    /// [`Store::destroy_volume_with`], discarding what the volume's intent log still holds for
    /// its key to replay (`vol destroy -f`): writes that were acknowledged, which nothing else
    /// would ever destroy without being told.
    pub async fn destroy_volume_discarding_log(
        &self,
        name: &str,
        snapshots: bool,
    ) -> Result<(), StoreError> {
        self.spa.check_live()?;
        let _guard = self.spa.panic_guard("a volume destroy");
        let _no_sync = self.syncer.lock().await;
        self.dsl.destroy_volume(&self.spa, &self.txg, name, snapshots)?;
        self.discard_deferred_log(name);
        Ok(())
    }

    /// Renames a volume (ZFS: `zfs rename`). Clients connected to it keep it; new ones find it
    /// by the new name. Durable with the next sync.
    ///
    /// Waits for a sync in flight, which records each volume's new tree by its name.
    pub async fn rename_volume(&self, from: &str, to: &str) -> Result<(), StoreError> {
        self.spa.check_live()?;
        let _guard = self.spa.panic_guard("a volume rename");
        check_volume_name(to)?;
        self.check_log_replayed(from, "a rename")?;
        let _no_sync = self.syncer.lock().await;
        self.dsl.rename_volume(&self.spa, from, to)
    }

    /// Changes a volume's size. Growing keeps every block; shrinking discards the blocks past
    /// the new end (their space is freed by the next sync).
    pub async fn resize_volume(&self, name: &str, size_bytes: u64) -> Result<(), StoreError> {
        self.spa.check_live()?;
        let _guard = self.spa.panic_guard("a volume resize");
        self.check_log_replayed(name, "a resize")?;
        // No sync may be in flight: it writes the tree at the levels of its quiesce but
        // records the entry as it is when it ends, so a grow across a level boundary (or a
        // shrink) inside it would leave a root read with the wrong number of levels.
        let _no_sync = self.syncer.lock().await;
        self.dsl.resize_volume(&self.spa, &self.txg, name, size_bytes).await
    }

    /// What a handle serves ([`crate::volume::Volume`]): a volume, or for `VOL@SNAP` a
    /// snapshot, read-only.
    pub fn export_dataset(&self, name: &str) -> Result<Arc<Dataset>, StoreError> {
        // A receive's hidden volume is nobody's to read or write until it is whole.
        if is_hidden(name.split('@').next().unwrap_or(name)) {
            return Err(self.dsl.no_such_volume(name));
        }
        match name.split_once('@') {
            Some((volume, snapshot)) => {
                self.dsl.snapshot_dataset(volume, snapshot, self.txg.limits())
            }
            None => self.dataset(name),
        }
    }

    /// A volume by name.
    pub fn dataset(&self, name: &str) -> Result<Arc<Dataset>, StoreError> {
        self.dsl.dataset(name)
    }

    /// One volume's entry (name, size, block size), if it exists.
    pub fn volume_info(&self, name: &str) -> Option<VolumeEntry> {
        self.dsl.volume_info(name)
    }

    /// The volumes, without the hidden ones receives are writing.
    pub fn volumes(&self) -> Vec<VolumeEntry> {
        self.dsl.volumes()
    }

    /// What `volume`'s clients have asked of it since import, shared by every handle on it.
    pub fn volume_stats(&self, volume: &str) -> Result<Arc<VolumeStats>, StoreError> {
        Ok(Arc::clone(&self.dataset(volume)?.stats))
    }
}

/// The namespace's administration: what changes a volume's entry or its place in the
/// namespace (volume create aside, above). The ones a sync must not run across are called
/// with the sync's lock held (`Store`, above).
impl Dsl {
    /// Bytes a volume could still be given (ZFS: `avail`): what the pool can still set aside,
    /// plus the volume's own unused reservation. `None` for the pool as a whole.
    pub(super) fn available_bytes(
        &self,
        spa: &Spa,
        txg: &Txg,
        volume: Option<&str>,
    ) -> Result<u64, StoreError> {
        let dsl = self.read();
        let txg = txg.lock();
        let own = match volume {
            Some(name) => {
                dsl.get(name).ok_or_else(|| self.no_such_volume(name))?.unused_reservation()
            }
            None => 0,
        };
        Ok(reservable_bytes(spa, &dsl, &txg) + own)
    }

    /// Sets a volume property. `dedup` and `compression` apply to blocks synced from now on;
    /// `sync` and `logbias` to requests from now on. Durable with the next sync.
    pub(super) fn set_property(
        &self,
        spa: &Spa,
        name: &str,
        property: VolumeProperty,
    ) -> Result<(), StoreError> {
        spa.check_live()?;
        let _guard = spa.panic_guard("a property change");
        if let VolumeProperty::Compression(compression) = property {
            if !compression.is_valid() {
                return Err(StoreError::InvalidProperty {
                    volume: name.to_owned(),
                    reason: format!(
                        "compression {compression:?}: zstd levels go from 1 to {}",
                        Compression::ZSTD_LEVEL_MAX
                    ),
                });
            }
        }
        let dsl = self.read();
        let dataset = dsl.get(name).ok_or_else(|| self.no_such_volume(name))?;
        let entry = &mut dataset.state.lock().entry;
        match property {
            VolumeProperty::Dedup(mode) => entry.dedup = mode,
            VolumeProperty::Sync(mode) => entry.sync = mode,
            VolumeProperty::LogBias(bias) => entry.logbias = bias,
            VolumeProperty::Compression(compression) => entry.compression = compression,
        }
        Ok(())
    }

    /// Destroys a volume, and with `snapshots` its snapshots (`Store::destroy_volume_with`),
    /// the sync's lock held by the caller.
    pub(super) fn destroy_volume(
        &self,
        spa: &Spa,
        txg: &Txg,
        name: &str,
        snapshots: bool,
    ) -> Result<(), StoreError> {
        let mut dsl = self.write();
        let mut txg = txg.lock();
        let dataset = Arc::clone(dsl.get(name).ok_or_else(|| self.no_such_volume(name))?);
        let (names, ids): (Vec<String>, Vec<u64>) = {
            let v = dataset.state.lock();
            v.entry.snapshots.iter().map(|s| (s.name.clone(), s.id)).unzip()
        };
        if !names.is_empty() && !snapshots {
            return Err(StoreError::HasSnapshots {
                pool: spa.pool().name().to_owned(),
                volume: name.to_owned(),
                snapshots: names.join(", "),
            });
        }
        for (id, snapshot) in ids.iter().zip(&names) {
            self.refuse_if_cloned(&dsl, name, snapshot, *id)?;
        }
        dsl.remove(name);
        dataset.destroyed.store(true, Ordering::Release);
        for id in ids {
            if let Some(open) = dsl.retire_export(id) {
                open.destroyed.store(true, Ordering::Release);
            }
        }
        let volume = dataset.state.lock();
        txg.count_pending(0, spa.frees_bound(&volume.entry));
        let origin_txg = volume.entry.origin.map_or(0, |o| o.txg);
        let lists = std::iter::once(&volume.entry.deadlist)
            .chain(volume.entry.snapshots.iter().map(|s| &s.deadlist));
        let deadlists = lists.filter(|l| !l.pieces.is_empty()).cloned().collect();
        let tree = volume.entry.root.map(|root| (root, volume.disk_levels));
        txg.queue(DestroyedVolume { tree, origin_txg, deadlists });
        if let Some(log) = &volume.log {
            txg.queue(RetiredLog(log.retire()));
        }
        if !volume.prewritten.is_empty() {
            let orphaned = volume.prewritten.values().cloned().collect();
            txg.queue(Orphaned(orphaned));
        }
        Ok(())
    }

    /// Renames a volume (`Store::rename_volume`), the sync's lock held by the caller.
    pub(super) fn rename_volume(&self, spa: &Spa, from: &str, to: &str) -> Result<(), StoreError> {
        let mut dsl = self.write();
        if dsl.contains(to) {
            return Err(StoreError::VolumeExists {
                pool: spa.pool().name().to_owned(),
                volume: to.to_owned(),
            });
        }
        let dataset = dsl.remove(from).ok_or_else(|| self.no_such_volume(from))?;
        dataset.state.lock().entry.name = to.to_owned();
        *dataset.name.lock() = to.to_owned();
        dsl.insert(to.to_owned(), dataset);
        Ok(())
    }

    /// Changes a volume's size (`Store::resize_volume`), the sync's lock held by the caller.
    pub(super) async fn resize_volume(
        &self,
        spa: &Spa,
        txg: &Txg,
        name: &str,
        size_bytes: u64,
    ) -> Result<(), StoreError> {
        let dataset = self.dataset(name)?;
        let bs = u64::from(dataset.block_bytes);
        if size_bytes == 0 || size_bytes % bs != 0 {
            return Err(StoreError::InvalidSize {
                volume: name.to_owned(),
                size_bytes,
                block_bytes: dataset.block_bytes,
            });
        }
        let new_blocks = size_bytes / bs;
        // Find the stored blocks past a new end, then drop them (and any dirty ones). A sync
        // that ends during the walk moves the tree: walk the new one.
        loop {
            let (root, disk_levels, shrinks) = {
                let volume = dataset.state.lock();
                (volume.entry.root, volume.disk_levels, size_bytes < volume.entry.size_bytes)
            };
            let stored = if shrinks {
                objset::walk(spa.pool(), root, disk_levels).await?
            } else {
                Vec::new()
            };
            // The txg lock keeps writes out while the size changes (they check it there); the
            // namespace is read for the reservations of every volume.
            let dsl = self.read();
            let mut state = txg.lock();
            if dataset.destroyed.load(Ordering::Acquire) {
                return Err(self.no_such_volume(name));
            }
            let mut volume = dataset.state.lock();
            // A resize changes the tree, whose new root an encrypted volume's sync can MAC only
            // with the family's key: without it, as a write, it is refused.
            let family = volume.entry.key_family;
            if !spa.crypt().writable(spa.pool().zio().keys(), family) {
                return Err(StoreError::KeyUnavailable {
                    pool: spa.pool().name().to_owned(),
                    volume: name.to_owned(),
                });
            }
            if (volume.entry.root, volume.disk_levels) != (root, disk_levels)
                || shrinks != (size_bytes < volume.entry.size_bytes)
            {
                continue;
            }
            // A thick volume's reservation follows its size (ZFS does so while refreservation
            // is the volume's own); a grow must find the space first.
            let reservation = if volume.entry.reservation_bytes == 0 {
                0
            } else {
                spa.thick_reservation(size_bytes, dataset.block_bytes)
            };
            if reservation > volume.entry.reservation_bytes {
                drop(volume);
                let available = reservable_bytes(spa, &dsl, &state);
                volume = dataset.state.lock();
                let more = reservation - volume.entry.reservation_bytes;
                if more > available {
                    return Err(StoreError::NoSpaceToReserve {
                        pool: spa.pool().name().to_owned(),
                        volume: name.to_owned(),
                        needed_bytes: more,
                        available_bytes: available,
                    });
                }
            }
            volume.entry.reservation_bytes = reservation;
            if shrinks {
                volume.open.retain(|&index, _| index < new_blocks);
                // The syncing txg stores its blocks past the end; the next sync frees them.
                let syncing: Vec<u64> =
                    volume.syncing.range(new_blocks..).map(|(&i, _)| i).collect();
                let stored = stored
                    .into_iter()
                    .filter(|&(level, index, _)| level == 0 && index >= new_blocks)
                    .map(|(_, index, _)| index);
                let mut zeroed = 0u64;
                for index in stored.chain(syncing) {
                    volume.open.insert(index, Block::Zero);
                    zeroed += 1;
                }
                // Each is a free in the next sync's space map, with the indirect blocks above.
                let copies = spa.pool().metadata_copies() as u64;
                let indirect = zeroed.div_ceil(objset::INDIRECT_BPS) * copies;
                state.count_pending(0, zeroed + indirect);
            } else {
                let levels = volume.entry.levels.max(objset::levels_for(new_blocks));
                // Each new level is one more indirect block above the old root.
                let grown = u64::from(levels - volume.entry.levels);
                volume.entry.levels = levels;
                let copies = spa.pool().metadata_copies() as u64;
                state.count_pending(grown * objset::INDIRECT_BYTES as u64 * copies, 0);
            }
            volume.entry.size_bytes = size_bytes;
            return Ok(());
        }
    }
}

/// Bytes that could still be set aside: free space in whole ranges (what admission counts,
/// `Allocator::room_bytes`) beyond the slop, what the open and syncing txgs will write, and
/// every volume's unused reservation.
pub(super) fn reservable_bytes(spa: &Spa, dsl: &Datasets, txg: &super::TxgState) -> u64 {
    room_beyond(spa, dsl, txg, crate::alloc::SlopTier::Normal)
}

/// [`reservable_bytes`] for work of `tier`, which may leave less of the slop.
pub(super) fn room_beyond(
    spa: &Spa,
    dsl: &Datasets,
    txg: &super::TxgState,
    tier: crate::alloc::SlopTier,
) -> u64 {
    let reserved: u64 = dsl.values().map(|d| d.unused_reservation()).sum();
    // Gathered before the allocator is taken: it reads each volume's state, which comes
    // before the allocator in the lock order (a sync replacing a failed log chain holds a
    // volume's state and takes the allocator).
    let in_flight = super::dsl_pool::InFlight::of(dsl.appending_deadlists(), txg, spa.pool());
    let allocator = spa.allocator().lock();
    let dirty = in_flight.to_allocate(&allocator);
    allocator
        .room_bytes()
        .saturating_sub(tier.kept(allocator.slop_bytes()))
        .saturating_sub(dirty)
        .saturating_sub(reserved)
}

/// A destroyed volume's blocks, freed by the sync of the txg it was destroyed in: its tree and
/// the entries of its and its snapshots' dead lists, but for a clone's blocks born by its
/// origin's txg (`origin_txg`), which are the origin's, and the lists' own pieces.
#[derive(Debug)]
struct DestroyedVolume {
    tree: Option<(BlockPointer, u8)>,
    origin_txg: u64,
    deadlists: Vec<sluice_format::Deadlist>,
}

impl SyncTask for DestroyedVolume {
    fn sync<'c, 's: 'c>(
        self: Box<Self>,
        cx: SyncCx<'c, 's>,
    ) -> futures::future::BoxFuture<'c, Result<(), PoolError>> {
        Box::pin(async move {
            let (spa, replaced) = (cx.spa, &mut cx.update.replaced);
            if let Some((root, levels)) = self.tree {
                let born = objset::walk_born_after(spa.pool(), Some(root), levels, self.origin_txg);
                replaced.extend(born.await?);
            }
            for list in self.deadlists {
                let entries = super::dsl_deadlist::entries(spa, &list).await?;
                replaced.extend(entries.into_iter().filter(|bp| bp.birth_txg > self.origin_txg));
                replaced.extend(list.pieces);
            }
            Ok(())
        })
    }
}

/// The namespace's side of the logs (crate::txg::zil): each volume's chain, read under its own
/// lock.
impl Dsl {
    /// Where `volume`'s log chain starts now (its oldest block still needed), if it has one.
    pub(super) fn log_head(
        &self,
        volume: &str,
    ) -> Option<(crate::intent_log::LogAddress, sluice_format::LogVerifier)> {
        let log = self.dataset(volume).ok()?.state.lock().log.clone()?;
        Some(log.head())
    }

    /// Log blocks written by the volumes' current chains.
    pub(super) fn log_blocks_written(&self) -> u64 {
        self.read()
            .values()
            .filter_map(|d| d.state.lock().log.as_ref().map(|l| l.lwbs_written()))
            .sum()
    }

    /// What `volume`'s current log chain has written and chosen, if it has a chain.
    pub(super) fn log_figures(&self, volume: &str) -> Option<crate::intent_log::LogFigures> {
        let log = self.dataset(volume).ok()?.state.lock().log.clone()?;
        Some(log.figures())
    }
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
            allocator.free_log(cx.update.txg, at.vdev, at.offset_bytes, at.alloc_bytes);
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
