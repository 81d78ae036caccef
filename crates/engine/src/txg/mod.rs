//! The store: an open pool's volumes and transaction groups (ZFS: `dsl_pool.c`, `txg.c`).
//!
//! Writes land in the open txg as dirty blocks in memory; a sync turns the open txg into the
//! syncing one and writes it out copy-on-write, ending with a new uberblock. While a txg syncs,
//! new writes go to the next open txg and reads look at the open txg, then the syncing one, then
//! the trees on disk. Syncs run one at a time. A sync that fails, or a panic in the middle of an
//! operation, suspends the store: every later operation fails until the pool is imported again,
//! which returns it to the last synced txg and replays the intent log.
//!
//! The store's mechanisms each have a file, named as in OpenZFS:
//!
//! | file | ZFS | what it holds |
//! |---|---|---|
//! | `mod.rs` | `spa.h`'s entry points | [`Store`], the facade over the objects below; errors |
//! | `spa.rs` | `spa.c`, `spa_misc.c` | the pool, its space and dedup table, the lock of a change of leaves, suspension, test points (`Spa`) |
//! | `dataset.rs` | `dsl_dataset.c`, `dsl_dir.c`, `zvol.c` | the volume namespace ([`Datasets`], held with the scan by `Dsl`); volume create, destroy, resize, properties |
//! | `dsl_snapshot.rs` | `dsl_dataset.c`, `dsl_destroy.c` | snapshot create and destroy, rollback, snapshot exports; the snapshot lookups and figures (on `Dsl`) |
//! | `dmu_send.rs` | `dmu_send.c` | send streams of snapshots, full and incremental |
//! | `dmu_recv.rs` | `dmu_recv.c` | receive into a hidden volume, its blocks written in place raw |
//! | `dsl_deadlist.rs` | `dsl_deadlist.c`, `bpobj.c` | dead lists: appended by each sync, read back by a destroy, through the `Spa` |
//! | `dbuf.rs` | `dbuf.c` | dirty blocks and patches of the open and syncing txgs |
//! | `dbuf_read.rs` | `dbuf_read` under `dbuf_will_dirty` | patches completed from the version below them: before a waiting write returns, or on tasks beside the answers |
//! | `dmu.rs` | `dmu.c` | the read and write paths |
//! | `dsl_pool.rs` | `txg.c`, `dsl_pool.c` | the open txg (`Txg`: [`TxgState`] behind the txg lock, its limits, the throttle's figures) and what the open and syncing txgs will allocate |
//! | `dmu_tx.rs` | `dmu_tx.c` | admission: the free-space check and the write throttle |
//! | `zil.rs` | `zil.c` | the logs' settings and figures (`Zil`); claim and replay at import |
//! | `zil_commit.rs` | `zil_commit`, `dmu_sync` | commits (FUA, flush) and early commits, with the fills of records logged by pointer (`LogCommit`) |
//! | `spa_sync.rs` | `spa_sync`, `txg_sync_thread`, `txg_wait_synced` | the sync, as named steps, driven through `SyncHandle`, the right to sync; the syncer task and its state (`Syncer`) |
//! | `spa_load.rs` | `spa_load` | opening an imported pool's data, rewind |
//! | `dsl_scan.rs` | `dsl_scan.c` | scrub and resilver in the background (`Scan`: its state, its settings and the changes to it) |
//! | `spa_vdev.rs` | `spa.c`, `vdev.c` | offline, online, clear, attach, detach and replace of leaves on an open store |
//! | `space_map.rs` | `space_map.c` | space maps written in pieces and read back |
//! | `audit.rs` | `zdb -b` | walks every tree and checks the space accounting |
//! | `dsl_synctask.rs` | `dsl_synctask.c` | the changes a sync makes for its txg, queued as tasks it runs without knowing their types |
//!
//! Who owns what. [`Store`] holds five objects, named after OpenZFS's, each with its state
//! private behind its own lock and changed only through its methods:
//! - `Spa` (spa.rs), the lowest: the pool and its vdev tree, the allocator, the dedup table
//!   (crate::dedup), the lock of a change of leaves, whether and why the store is suspended,
//!   and the test points. It calls none of the others; they reach the pool through it, and
//!   what needs only the pool takes it as an argument (the dead lists and the sync's steps
//!   that only write, the `Spa`; the scan's own changes, the `Pool`);
//! - `Dsl` (dataset.rs): the volumes by name ([`Datasets`], a read-write lock; lookups share
//!   it, create, rename, clone, destroy and snapshot ids take it alone) and the scan
//!   (`dsl_scan::Scan`, its own lock and settings);
//! - `Txg` (dsl_pool.rs): the open txg with its accounting and its queued sync tasks
//!   ([`TxgState`], the txg lock: what admission, the write path and the log's glue count
//!   against), the limits that admission and the throttle hold writers to, and what the
//!   throttle did;
//! - `Zil` (zil.rs): how every log chain writes, when a write is logged by pointer, and what
//!   the logs did; each volume's chain is its [`Dataset`]'s (crate::intent_log);
//! - `spa_sync::Syncer` (spa_sync.rs): the sync's lock, the syncer's wake-up, the last sync's
//!   space maps and directory and the syncs' history, which spa_sync.rs alone changes.
//!
//! Each volume's blocks and entry are its [`Dataset`]'s own lock. What needs two objects is a
//! function of them in its mechanism's file, or a method of one taking the other: a read, a
//! block status and a send take the `Spa` and the `Dsl` (dmu.rs, dmu_send.rs); a scan's
//! chunk and its end are `Scan`'s, taking the `Spa`; the sync's tasks get the `Spa` and a
//! lookup of volume ids (dsl_synctask.rs), never the store; volume and snapshot changes but
//! volume create are the `Dsl`'s, taking the `Spa` and the `Txg` (and a clone, the `Zil`:
//! dataset.rs, dsl_snapshot.rs), and check and queue their sync tasks with the sync's lock
//! held by their caller.
//!
//! Waiting for a sync is a right of its own, `spa_sync::SyncHandle`: it borrows every object
//! the sync works on, but its holder can only sync, hold the sync's lock, count syncs and wake
//! the syncer. What must at times wait for a sync holds a handle beside the objects it works
//! on, not the store: the sync's driver is the handle's own; admission is
//! `dmu_tx::Admission` (the `Spa`, the `Dsl`, the `Txg` and a handle), the write path
//! `dmu::WritePath` (those and the `Zil`), a log commit `zil_commit::LogCommit` (the same).
//! What is left on `Store` is the public facade, which delegates, and what composes several
//! of its operations: a snapshot change (the sync's lock, the `Dsl`'s check and queue, the
//! sync), receive, import, leaf changes, the replay at import, and the syncer and scan tasks,
//! which hold the store weakly. Those methods take the objects' locks in the order below.
//!
//! Lock order (outer to inner; a thread holding one may take only those to its right, and none
//! is held across an `.await`, but for the three async ones): `Spa::vdev_lock` (async, held
//! for a whole change of leaves) or a volume's `Dataset::rollback_gate` (async: shared by its
//! writes, which may sync at the dirty maximum while they hold it; held alone by a rollback,
//! dsl_snapshot.rs, and by a receive's switch, dmu_recv.rs, across their syncs) -> the head
//! of a space line (`dmu_tx::SpaceLine`, async: held by a writer waiting for space across the
//! syncs it waits for) -> the sync's lock (`Syncer::lock`, async, held for a whole sync) -> the scan's state
//! (`Scan::state`) -> the namespace (`Dsl::datasets`) -> the txg lock (`Txg::state`) -> a
//! volume's `Dataset::state` -> its `LogWriter` state -> the DDT's locks (crate::dedup) ->
//! the allocator (`Spa::allocator`). The scan's state comes before the namespace (a sync reads
//! the scan's record before it walks the volumes to write the directory). A write takes the
//! txg lock and its volume's lock, never the namespace: its handle holds the [`Dataset`], and
//! a destroy marks it destroyed under the txg lock. The syncer's other locks (the last sync's
//! metadata, its history and wake-up), the suspension's cause and the test points are leaves:
//! nothing is taken while holding them. The whole crate's order is in `lib.rs`.

use std::collections::BTreeMap;
use std::sync::Arc;

use sluice_format::DdtHeader;

mod audit;
mod dataset;
mod dbuf;
mod dbuf_read;
mod dmu;
mod dmu_recv;
mod dmu_rewrite;
mod dmu_send;
mod dmu_tx;
mod dmu_zfetch;
mod dsl_crypt;
mod dsl_deadlist;
mod dsl_pool;
mod dsl_scan;
mod dsl_snapshot;
mod dsl_synctask;
mod retire;
mod schedule;
mod spa;
mod spa_load;
mod spa_sync;
mod spa_vdev;
mod space_map;
mod zil;
mod zil_commit;

pub use audit::AuditReport;
pub use dataset::RECEIVE_PREFIX;
pub use dataset::{Dataset, VolumeProperty};
use dataset::{Datasets, Dsl};
pub use dbuf::WriteData;
pub use dmu::ReadData;
pub use dmu_recv::ReceiveMode;
pub use dmu_send::StreamSummary;
pub use dsl_crypt::{EncryptionInfo, KeyStatus, NewKey};
use dsl_pool::TxgState;
pub use dsl_pool::{PatchStats, ThrottleStats};
use dsl_pool::{Txg, TxgLimits};
pub use dsl_scan::{ScanFunc, ScanPhase, ScanStatus};
pub use dsl_snapshot::{SnapshotInfo, SnapshotSpace};
pub use retire::DeviceOpener;
pub use schedule::{auto_name, ScheduleReport, AUTO_PREFIX, CHECK_INTERVAL};
use spa::Spa;
pub use spa_load::{ImportOptions, ImportReport, Rewind};
pub use spa_sync::SyncRecord;
use spa_sync::SyncedMetadata;
use zil::Zil;
pub use zil::{LogStats, LostLog};

use crate::alloc::Allocator;
use crate::dedup::Ddt;
use crate::pool::{Pool, PoolError};
use crate::tunables::Tunables;

/// Volume block sizes allowed.
pub const BLOCK_BYTES_MIN: u32 = 4096;
pub const BLOCK_BYTES_MAX: u32 = 128 << 10;
// Admission counts room for blocks of up to this size (alloc::ROOM_BLOCK_BYTES).
const _: () = assert!(
    BLOCK_BYTES_MAX as u64
        == crate::alloc::ROOM_BLOCK_BYTES[crate::alloc::ROOM_BLOCK_BYTES.len() - 1]
);
pub const BLOCK_BYTES_DEFAULT: u32 = 16 << 10;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error(transparent)]
    Pool(#[from] PoolError),
    #[error("volume {pool}/{volume} does not exist")]
    NoSuchVolume { pool: String, volume: String },
    #[error("volume {pool}/{volume} already exists")]
    VolumeExists { pool: String, volume: String },
    /// A key could not be made, loaded or changed: a wrong key, a malformed one, or the
    /// CSPRNG or cipher failing. Says nothing of the key itself.
    #[error("volume {pool}/{volume}: {cause}")]
    Key { pool: String, volume: String, cause: crate::zio::crypt::CryptError },
    #[error("volume {pool}/{volume} is not encrypted")]
    NotEncrypted { pool: String, volume: String },
    #[error("volume {pool}/{volume}: its key is already loaded")]
    KeyLoaded { pool: String, volume: String },
    #[error("volume {pool}/{volume}: its key is not loaded; load it with `sluice key load {pool}/{volume}`")]
    KeyNotLoaded { pool: String, volume: String },
    /// An encrypted volume was written while its key is not loaded, or being unloaded.
    #[error("volume {pool}/{volume} is encrypted and its key is not loaded; load it with `sluice key load {pool}/{volume}`")]
    KeyUnavailable { pool: String, volume: String },
    /// An encrypted volume's intent log holds records that replay when its key is loaded.
    #[error(
        "volume {pool}/{volume}: its intent log holds writes not yet replayed, which need its \
         key; load it (`sluice key load {pool}/{volume}`) before {what}, or destroy the \
         volume with `-f` to discard them"
    )]
    LogAwaitsKey { pool: String, volume: String, what: &'static str },
    /// A sealed intent-log record failed its tag at replay: the log was changed on the disk.
    #[error(
        "volume {pool}/{volume}: intent-log record {sequence} failed authentication ({cause}); \
         the log was changed on the disk, and nothing of it from that record on was applied"
    )]
    LogAuthentication {
        pool: String,
        volume: String,
        sequence: u64,
        cause: crate::zio::crypt::CryptError,
    },
    #[error("volume {pool}/{volume} is encrypted: {what} is not built for encrypted volumes yet")]
    NotWithEncryption { pool: String, volume: String, what: &'static str },
    #[error("volume name {name:?} is invalid: use 1 to 255 letters, digits and _ - . :")]
    InvalidVolumeName { name: String },
    #[error(
        "volume {volume}: block size {block_bytes} is invalid; use a power of two from \
         {BLOCK_BYTES_MIN} to {BLOCK_BYTES_MAX}"
    )]
    InvalidBlockSize { volume: String, block_bytes: u32 },
    #[error("volume {volume}: size {size_bytes} must be a positive multiple of the block size {block_bytes}")]
    InvalidSize { volume: String, size_bytes: u64, block_bytes: u32 },
    #[error("volume {volume}: {len} bytes at offset {offset} are outside its {size_bytes} bytes or not 512-byte aligned")]
    OutOfRange { volume: String, offset: u64, len: u64, size_bytes: u64 },
    #[error(
        "pool {pool}: no space for {requested_bytes} more bytes in volume {volume}; free space \
         by {}trimming or destroying volumes, or adding a vdev",
        snapshots_hint(*snapshots_bytes)
    )]
    NoSpace { pool: String, volume: String, requested_bytes: u64, snapshots_bytes: u64 },
    #[error(
        "pool {pool}: volume {volume} needs {needed_bytes} bytes set aside, and only \
         {available_bytes} are free beyond what other volumes have reserved; make it smaller, \
         create it thin (its writes may then fail when the pool fills), or free space"
    )]
    NoSpaceToReserve { pool: String, volume: String, needed_bytes: u64, available_bytes: u64 },
    #[error("volume {volume}: {reason}")]
    InvalidProperty { volume: String, reason: String },
    #[error("snapshot {pool}/{volume}@{snapshot} does not exist")]
    NoSuchSnapshot { pool: String, volume: String, snapshot: String },
    #[error("snapshot {pool}/{volume}@{snapshot} already exists")]
    SnapshotExists { pool: String, volume: String, snapshot: String },
    #[error(
        "pool {pool}: cannot roll volume {volume} back to {snapshot}: later snapshots exist \
         ({later}); destroy them first, or roll back with -r to destroy them too"
    )]
    NotNewestSnapshot { pool: String, volume: String, snapshot: String, later: String },
    #[error(
        "pool {pool}: volume {volume} has snapshots ({snapshots}); destroy them first, or \
         destroy with -r to destroy them too"
    )]
    HasSnapshots { pool: String, volume: String, snapshots: String },
    #[error(
        "pool {pool}: snapshot {volume}@{snapshot} has clones ({clones}), which share its \
         blocks; destroy them first, or promote one to make it the parent"
    )]
    HasClones { pool: String, volume: String, snapshot: String, clones: String },
    #[error(
        "pool {pool}: {what} {volumes} needs {needed_bytes} more bytes set aside (a thick \
         volume's reservation must cover rewriting every block a snapshot holds), and only \
         {available_bytes} are free beyond what volumes have reserved; free space or destroy \
         snapshots"
    )]
    SnapshotNeedsSpace {
        pool: String,
        /// "a snapshot of", "a rollback of".
        what: &'static str,
        volumes: String,
        needed_bytes: u64,
        available_bytes: u64,
    },
    #[error(
        "pool {pool}: destroying snapshot {volume}@{snapshot} rewrites the dead list after it \
         ({needed_bytes} bytes), and only {available_bytes} are free beyond what volumes have \
         reserved and the pool keeps for its syncs; trim or destroy a volume, or add a vdev, \
         then destroy it"
    )]
    DestroyNeedsSpace {
        pool: String,
        volume: String,
        snapshot: String,
        needed_bytes: u64,
        available_bytes: u64,
    },
    #[error("volume {volume}: {cause}")]
    Stream { volume: String, cause: sluice_format::StreamError },
    #[error("pool {pool}: cannot receive into {volume}: {reason}")]
    ReceiveRefused { pool: String, volume: String, reason: String },
    #[error(
        "pool {pool}: the receive into {volume} stopped at block {next_block}: {cause}. What \
         arrived is kept: resume it with a send from its resume token, {token}, or abort it"
    )]
    ReceiveInterrupted {
        pool: String,
        volume: String,
        cause: String,
        next_block: u64,
        token: String,
    },
    #[error(
        "{pool}/{volume} is a snapshot, read-only: its blocks never change. To write, roll the \
         volume back to it or clone it"
    )]
    ReadOnly { pool: String, volume: String },
    #[error(
        "pool {pool} is suspended: {cause}; nothing more is written to it. Stop serving it and \
         import it again, which returns it to the last synced txg and replays the intent log"
    )]
    Suspended { pool: String, cause: String },
    #[error("pool {pool}: {reason}")]
    ScanRefused { pool: String, reason: String },
    #[error(
        "pool {pool}: txg {txg}, the newest, does not verify: {damage}. Import with a rewind to \
         return to the newest earlier txg whose blocks all verify (a dry run of the rewind says \
         which, and how many seconds of writes that loses, without writing anything)"
    )]
    DamagedTxg { pool: String, txg: u64, damage: String },
    #[error(
        "pool {pool}: no txg found on its leaves verifies ({tried}); it cannot be imported. \
         Check that every leaf was found, then restore from a backup"
    )]
    NoIntactTxg { pool: String, tried: String },
    #[error(
        "pool {pool}, volume {volume}: its intent log holds writes acknowledged as durable, and \
         {cause}. Nothing was changed: import again once the device answers, or import \
         discarding the unreadable part of the log, which loses its records and every later \
         one of this volume"
    )]
    UnreadableLog { pool: String, volume: String, cause: Box<crate::intent_log::UnreadableBlock> },
}

/// The start of a no-space error's remedies: destroying snapshots, when they hold anything.
fn snapshots_hint(snapshots_bytes: u64) -> String {
    if snapshots_bytes == 0 {
        return String::new();
    }
    format!("destroying snapshots ({snapshots_bytes} bytes are held by snapshots only), ")
}

impl StoreError {
    /// What kind of failure this is (see [`crate::ErrorKind`]).
    pub fn kind(&self) -> crate::ErrorKind {
        use crate::ErrorKind;
        match self {
            StoreError::Pool(error) => error.kind(),
            StoreError::NoSuchVolume { .. } => ErrorKind::NotFound,
            StoreError::VolumeExists { .. } => ErrorKind::Exists,
            StoreError::Key { .. }
            | StoreError::NotEncrypted { .. }
            | StoreError::KeyLoaded { .. }
            | StoreError::NotWithEncryption { .. } => ErrorKind::Invalid,
            StoreError::KeyNotLoaded { .. }
            | StoreError::KeyUnavailable { .. }
            | StoreError::LogAwaitsKey { .. } => ErrorKind::KeyUnavailable,
            StoreError::LogAuthentication { .. } => ErrorKind::Checksum,
            StoreError::InvalidVolumeName { .. }
            | StoreError::InvalidBlockSize { .. }
            | StoreError::InvalidSize { .. }
            | StoreError::OutOfRange { .. }
            | StoreError::ScanRefused { .. }
            | StoreError::InvalidProperty { .. }
            | StoreError::NotNewestSnapshot { .. }
            | StoreError::HasSnapshots { .. }
            | StoreError::HasClones { .. } => ErrorKind::Invalid,
            StoreError::NoSuchSnapshot { .. } => ErrorKind::NotFound,
            StoreError::SnapshotExists { .. } => ErrorKind::Exists,
            StoreError::SnapshotNeedsSpace { .. } | StoreError::DestroyNeedsSpace { .. } => {
                ErrorKind::NoSpace
            }
            StoreError::ReadOnly { .. } => ErrorKind::ReadOnly,
            StoreError::Stream { .. }
            | StoreError::ReceiveRefused { .. }
            | StoreError::ReceiveInterrupted { .. } => ErrorKind::Invalid,
            StoreError::NoSpace { .. } | StoreError::NoSpaceToReserve { .. } => ErrorKind::NoSpace,
            StoreError::Suspended { .. } => ErrorKind::Suspended,
            StoreError::DamagedTxg { .. } | StoreError::NoIntactTxg { .. } => ErrorKind::Checksum,
            StoreError::UnreadableLog { .. } => ErrorKind::Io,
        }
    }
}

/// An open pool with its volumes: a facade over the objects that own its state (see the module
/// doc), delegating to them what one of them does alone.
#[derive(Debug)]
pub struct Store {
    /// The pool (spa.rs): its vdev tree, its space, its dedup table, the lock of a change of
    /// leaves, the suspension and the test points.
    spa: Spa,
    /// The datasets (dataset.rs): the volumes by name, and the background scrub or resilver.
    dsl: Dsl,
    /// The open txg (dsl_pool.rs): its accounting and sync tasks, and what admission and the
    /// write throttle work with and did.
    txg: Txg,
    /// The sync (spa_sync.rs): its lock, the syncer's wake-up, the last sync's metadata and
    /// the syncs' history.
    syncer: spa_sync::Syncer,
    /// The intent logs' settings and what they did (zil.rs).
    zil: Zil,
    /// Whether the hot-spare task runs (retire.rs): one at a time.
    retire_running: retire::RetireRunning,
    /// Patches being completed by tasks of their own, and those waiting for one
    /// (dbuf_read.rs, `Store::complete_patches_beside`).
    patches_resolving: dbuf_read::PatchCompletions,
    /// How `autoreplace` opens a device at a leaf's path (retire.rs), once the server says.
    device_opener: retire::OpenerSlot,
}

impl Store {
    /// A store on a freshly created pool.
    pub fn create(pool: Pool, tunables: &Tunables) -> Store {
        let allocator =
            Allocator::new(pool.ashift(), &pool.data_areas()).with_geometries(&pool.geometries());
        let vdevs = pool.root().top_level().len();
        let datasets = Datasets::new(1, BTreeMap::new());
        let synced = SyncedMetadata { space_maps: vec![Vec::new(); vdevs], directory: None };
        // The dedup salt: drawn once per pool, so keys cannot be predicted from outside.
        let mut salt_rng = pool.env().unique_rng("dedup salt");
        let mut salt = [0u8; 32];
        for chunk in salt.chunks_exact_mut(8) {
            chunk.copy_from_slice(&salt_rng.u64().to_le_bytes());
        }
        let ddt = DdtHeader { salt, ..DdtHeader::default() };
        let crypt = dsl_crypt::DslCrypt::default();
        Store::assemble(
            pool,
            allocator,
            (datasets, synced),
            (ddt, LogStats::default(), crypt),
            tunables,
        )
    }

    fn assemble(
        pool: Pool,
        mut allocator: Allocator,
        (datasets, synced): (Datasets, SyncedMetadata),
        (ddt, log_stats, crypt): (DdtHeader, LogStats, dsl_crypt::DslCrypt),
        tunables: &Tunables,
    ) -> Store {
        allocator.set_log_vdevs(&pool.log_vdevs());
        pool.note_txg_open(pool.uberblock().txg + 1);
        let limits = TxgLimits::from_tunables(tunables, pool.env().memory_bytes());
        let txg = TxgState::new(
            pool.uberblock().txg,
            synced.directory.map_or(0, |bp| bp.psize_bytes()),
            pool.asize_max(crate::objset::INDIRECT_BYTES as u64),
        );
        let ddt = Ddt::new(pool.name(), ddt, tunables);
        Store {
            dsl: Dsl::new(pool.name(), datasets, dsl_scan::Scan::new(tunables)),
            spa: Spa::new(Arc::new(pool), allocator, ddt, crypt),
            txg: Txg::new(txg, limits),
            syncer: spa_sync::Syncer::new(synced),
            zil: Zil::new(&limits, log_stats),
            retire_running: Default::default(),
            patches_resolving: Default::default(),
            device_opener: Default::default(),
        }
    }

    /// What the intent logs did.
    pub fn log_stats(&self) -> &LogStats {
        self.zil.stats()
    }

    /// Txgs synced by this store so far.
    pub fn syncs(&self) -> u64 {
        self.syncer.syncs()
    }

    /// What the write throttle did.
    pub fn throttle_stats(&self) -> &ThrottleStats {
        self.txg.throttle_stats()
    }

    /// What became of writes into part of a block not in memory.
    pub fn patch_stats(&self) -> &PatchStats {
        self.txg.patch_stats()
    }

    /// Patches waiting now for a task to complete them, on every core (a block written twice
    /// meanwhile may count twice).
    pub fn patches_waiting(&self) -> u64 {
        self.patches_resolving.waiting() as u64
    }

    /// When the store was created or imported (the counters start there).
    pub fn opened(&self) -> crate::rt::Time {
        self.spa.opened()
    }

    /// Dirty bytes in the open txg.
    pub fn dirty_bytes(&self) -> u64 {
        self.txg.dirty_bytes()
    }

    /// The dirty data the open txg may hold (`txg.dirty_max`, `auto` resolved); a sync starts
    /// at a quarter of it.
    pub fn dirty_max_bytes(&self) -> u64 {
        self.txg.limits().dirty_max
    }

    pub fn pool(&self) -> &Pool {
        self.spa.pool()
    }

    /// The txg that writes go into now.
    pub fn open_txg(&self) -> u64 {
        self.txg.open_txg()
    }

    pub fn free_bytes(&self) -> u64 {
        self.spa.free_bytes()
    }

    /// Whether the store is suspended (a failed sync or a panic); see [`StoreError::Suspended`].
    pub fn is_suspended(&self) -> bool {
        self.spa.is_suspended()
    }

    /// Why the store is suspended, if it is.
    pub fn suspended_cause(&self) -> Option<String> {
        self.spa.suspended_cause()
    }

    /// Arms a fail point: the next time the store passes `point` it panics (tests use this to
    /// show that a panic suspends the store). Points: `dmu.modify` (a write, inside the
    /// txg lock after its blocks went into the open txg and before its log record) and
    /// `spa_sync.write_volumes` (a sync, after the quiesce).
    #[doc(hidden)]
    pub fn arm_fail_point(&self, point: &'static str) {
        self.spa.arm_fail_point(point);
    }

    /// Arms a pause point: the next task to pass `point` stops there, the first receiver
    /// returned completes, and the task goes on once the sender is used or dropped. Tests use
    /// this to make a race happen every time (a shrink between a write's range check and its
    /// insert). Points: `dmu.assigned` (a write, after its range check and its admission,
    /// before it takes the txg lock).
    #[doc(hidden)]
    pub fn arm_pause(
        &self,
        point: &'static str,
    ) -> (futures::channel::oneshot::Receiver<()>, futures::channel::oneshot::Sender<()>) {
        self.spa.arm_pause(point)
    }

    /// The dedup table: its totals as of the last sync and what it did since the pool opened.
    pub fn dedup_table(&self) -> &Ddt {
        self.spa.ddt()
    }

    /// Syncs and closes.
    pub async fn export(self) -> Result<(), StoreError> {
        // Owning the store, no scan chunk is in work: a task between chunks finds it gone.
        self.dsl.scan().forget();
        self.sync().await?;
        self.spa.export().await
    }
}
