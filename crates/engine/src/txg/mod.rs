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
//! | `mod.rs` | `dsl_pool.c` | [`Store`] and which owner holds what, errors, suspension |
//! | `dataset.rs` | `dsl_dataset.c`, `dsl_dir.c`, `zvol.c` | the volume namespace ([`Datasets`]); volume create, destroy, resize, properties |
//! | `dsl_snapshot.rs` | `dsl_dataset.c`, `dsl_destroy.c` | snapshot create and destroy, rollback, snapshot exports |
//! | `dmu_send.rs` | `dmu_send.c` | send streams of snapshots, full and incremental |
//! | `dmu_recv.rs` | `dmu_recv.c` | receive into a hidden volume, its blocks written in place raw |
//! | `dsl_deadlist.rs` | `dsl_deadlist.c`, `bpobj.c` | dead lists: appended by each sync, read back by a destroy |
//! | `dbuf.rs` | `dbuf.c` | dirty blocks and patches of the open and syncing txgs |
//! | `dmu.rs` | `dmu.c` | the read and write paths |
//! | `dmu_tx.rs` | `dmu_tx.c`, `txg.c` | the open txg's accounting ([`TxgState`]); admission: the free-space check and the write throttle |
//! | `zil.rs` | `zil.c` | commits (FUA, flush), early commits, claim and replay at import |
//! | `spa_sync.rs` | `spa_sync`, `txg_sync_thread` | the sync, as named steps; the syncer task |
//! | `spa_load.rs` | `spa_load` | opening an imported pool's data, rewind |
//! | `dsl_scan.rs` | `dsl_scan.c` | scrub and resilver in the background |
//! | `spa_vdev.rs` | `spa.c`, `vdev.c` | offline, online, clear, attach, detach and replace of leaves on an open store |
//! | `space_map.rs` | `space_map.c` | space maps written in pieces and read back |
//! | `audit.rs` | `zdb -b` | walks every tree and checks the space accounting |
//! | `dsl_synctask.rs` | `dsl_synctask.c` | the changes a sync makes for its txg, queued as tasks it runs without knowing their types |
//!
//! Who owns what. The store's state is split by owner, each behind its own lock:
//! - the volumes by name ([`Datasets`] in dataset.rs, `dsl`: a read-write lock; lookups share
//!   it, create, rename, clone, destroy and snapshot ids take it alone);
//! - the open txg with its accounting and its queued sync tasks ([`TxgState`] in dmu_tx.rs,
//!   `txg`: what admission, the write path and the log's glue count against, through its
//!   methods);
//! - the sync's lock, the last sync's space maps and directory and the syncs' history
//!   (`spa_sync::Syncer`, which spa_sync.rs alone changes);
//! - each volume's blocks and entry ([`Dataset`]'s own lock), its log (crate::intent_log),
//!   the dedup table (crate::dedup), the allocator (crate::alloc) and the scan
//!   (`dsl_scan::Scan`, with its settings).
//!
//! Lock order (outer to inner; a thread holding one may take only those to its right, and none
//! is held across an `.await`, but for the three async ones): `Store::vdev_lock` (async, held
//! for a whole change of leaves) or a volume's `Dataset::rollback_gate` (async: shared by its
//! writes, which may sync at the dirty maximum while they hold it; held alone by a rollback,
//! dsl_snapshot.rs, and by a receive's switch, dmu_recv.rs, across their syncs) -> the
//! sync's lock (`Syncer::lock`, async, held for a whole sync) -> `scan` -> `dsl` -> `txg` -> a
//! volume's `Dataset::state` -> its `LogWriter` state -> the DDT's locks (crate::dedup) ->
//! `allocator`. The scan's state comes before the namespace (a sync reads the scan's record
//! before it walks the volumes to write the directory). A write takes `txg` and its volume's
//! lock, never `dsl`: its handle holds the [`Dataset`], and a destroy marks it destroyed under
//! `txg`. The syncer's other locks (the last sync's metadata, its history and wake-up), the
//! suspension's cause and the test points are leaves: nothing is taken while holding them.
//! The whole crate's order is in `lib.rs`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use sluice_format::{BlockPointer, DdtHeader};

mod audit;
mod dataset;
mod dbuf;
mod dmu;
mod dmu_recv;
mod dmu_send;
mod dmu_tx;
mod dsl_deadlist;
mod dsl_scan;
mod dsl_snapshot;
mod dsl_synctask;
mod spa_load;
mod spa_sync;
mod spa_vdev;
mod space_map;
mod zil;

pub use audit::AuditReport;
pub use dataset::RECEIVE_PREFIX;
pub use dataset::{Dataset, VolumeProperty};
use dataset::Datasets;
use dmu_tx::TxgState;
pub use dbuf::WriteData;
pub use dmu::ReadData;
pub use dmu_recv::ReceiveMode;
pub use dmu_send::StreamSummary;
use dmu_tx::TxgLimits;
pub use dsl_scan::{ScanFunc, ScanPhase, ScanStatus};
pub use dsl_snapshot::{SnapshotInfo, SnapshotSpace};
pub use spa_load::{ImportOptions, ImportReport, Rewind};
pub use spa_sync::SyncRecord;
pub use zil::LostLog;

use crate::alloc::Allocator;
use crate::dedup::Ddt;
use crate::pool::{Pool, PoolError};
use crate::tunables::Tunables;

/// Volume block sizes allowed.
pub const BLOCK_BYTES_MIN: u32 = 4096;
pub const BLOCK_BYTES_MAX: u32 = 128 << 10;
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

/// A pause point armed by a test ([`Store::arm_pause`]).
#[derive(Debug)]
struct Pause {
    point: &'static str,
    reached: futures::channel::oneshot::Sender<()>,
    release: futures::channel::oneshot::Receiver<()>,
}

/// The pool's own metadata as the last sync wrote it: its space maps and the directory that
/// points at them, freed by the next sync when it writes theirs (spa_sync.rs owns them).
#[derive(Debug)]
struct SyncedMetadata {
    space_maps: Vec<Vec<BlockPointer>>,
    directory: Option<BlockPointer>,
}

/// An open pool with its volumes.
#[derive(Debug)]
pub struct Store {
    // The pool (spa): its vdev tree, its space and its dedup table.
    pool: Arc<Pool>,
    /// Shared with the tasks a sync spawns to write dedup blocks in parallel.
    allocator: Arc<Mutex<Allocator>>,
    ddt: Arc<Ddt>,
    /// Held for a whole change of leaves (attach, detach, replace: their sync and label
    /// rewrites), so that two do not interleave; taken before the sync's lock (spa_vdev.rs).
    vdev_lock: futures::lock::Mutex<()>,
    // The datasets (dsl): the volumes by name, and the background scrub or resilver.
    dsl: RwLock<Datasets>,
    scan: dsl_scan::Scan,
    // The open txg (txg, dmu_tx): its accounting and sync tasks, and what admission and the
    // write throttle work with and did.
    txg: Mutex<TxgState>,
    limits: TxgLimits,
    throttle_stats: ThrottleStats,
    /// The sync (spa_sync.rs): its lock, the syncer's wake-up, the last sync's metadata and
    /// the syncs' history.
    syncer: spa_sync::Syncer,
    /// What the intent logs did (zil.rs).
    log_stats: LogStats,
    /// Whether and why the store stopped writing.
    suspension: Suspension,
    /// Fail and pause points armed by tests.
    test_points: TestPoints,
    /// When this store was created or imported: what "since import" counts from.
    opened: crate::rt::Time,
}

/// Whether the store is suspended, and why (the first cause): a failed sync or a panic
/// ([`Store::suspend`]). Leaves: nothing is taken while holding the cause.
#[derive(Debug, Default)]
struct Suspension {
    suspended: AtomicBool,
    cause: Mutex<Option<String>>,
}

/// Points where tests stop or fail a task ([`Store::arm_fail_point`], [`Store::arm_pause`]).
/// Leaves.
#[derive(Debug, Default)]
struct TestPoints {
    fail_points: Mutex<Vec<&'static str>>,
    /// The point, the signal that a task reached it, and what it then waits for.
    pauses: Mutex<Vec<Pause>>,
}

/// What the write throttle did to writers (zeroes included): the answer to "why are my writes
/// slow" when one writer fills the dirty-data budget for every volume, as ZFS's does.
#[derive(Debug, Default)]
pub struct ThrottleStats {
    /// Writes delayed because dirty data was above `txg.delay_min_dirty_pct`, and for how long.
    pub delayed: crate::stats::Counter,
    pub delayed_nanos: crate::stats::Counter,
    /// Writes that found `txg.dirty_max` reached and waited for a txg sync, and for how long.
    pub waited_for_sync: crate::stats::Counter,
    pub waited_nanos: crate::stats::Counter,
    /// Waits for a txg sync by writes that found too little free space for the dirty data
    /// (one write may wait more than once), and their time.
    pub waited_for_space: crate::stats::Counter,
    pub waited_for_space_nanos: crate::stats::Counter,
    /// Writes that would have been delayed, or stopped at the maximum, but were not: their
    /// volume held less than an equal share of the dirty data, so another volume was filling
    /// it.
    pub spared: crate::stats::Counter,
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
    /// A store on a freshly created pool.
    pub fn create(pool: Pool, tunables: &Tunables) -> Store {
        let allocator = Allocator::new(pool.ashift(), &pool.data_areas());
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
        Store::assemble(pool, allocator, (datasets, synced), ddt, tunables)
    }

    fn assemble(
        pool: Pool,
        mut allocator: Allocator,
        (datasets, synced): (Datasets, SyncedMetadata),
        ddt: DdtHeader,
        tunables: &Tunables,
    ) -> Store {
        allocator.set_log_vdevs(&pool.log_vdevs());
        pool.note_txg_open(pool.uberblock().txg + 1);
        let opened = pool.env().now();
        let limits = TxgLimits::from_tunables(tunables, pool.env().memory_bytes());
        Store {
            allocator: Arc::new(Mutex::new(allocator)),
            ddt: Arc::new(Ddt::new(pool.name(), ddt, tunables)),
            dsl: RwLock::new(datasets),
            scan: dsl_scan::Scan::new(tunables),
            txg: Mutex::new(TxgState::new(
                pool.uberblock().txg,
                synced.directory.map_or(0, |bp| bp.psize_bytes()),
            )),
            limits,
            throttle_stats: ThrottleStats::default(),
            syncer: spa_sync::Syncer::new(synced),
            pool: Arc::new(pool),
            vdev_lock: futures::lock::Mutex::new(()),
            log_stats: LogStats::default(),
            suspension: Suspension::default(),
            test_points: TestPoints::default(),
            opened,
        }
    }

    /// What the intent logs did.
    pub fn log_stats(&self) -> &LogStats {
        &self.log_stats
    }

    /// Txgs synced by this store so far.
    pub fn syncs(&self) -> u64 {
        self.syncer.syncs.get()
    }

    /// What the write throttle did.
    pub fn throttle_stats(&self) -> &ThrottleStats {
        &self.throttle_stats
    }

    /// When the store was created or imported (the counters start there).
    pub fn opened(&self) -> crate::rt::Time {
        self.opened
    }

    /// Dirty bytes in the open txg.
    pub fn dirty_bytes(&self) -> u64 {
        self.txg.lock().dirty_bytes()
    }

    /// The dirty data the open txg may hold (`txg.dirty_max`, `auto` resolved); a sync starts
    /// at a quarter of it.
    pub fn dirty_max_bytes(&self) -> u64 {
        self.limits.dirty_max
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The txg that writes go into now.
    pub fn open_txg(&self) -> u64 {
        self.txg.lock().open_txg()
    }

    pub fn free_bytes(&self) -> u64 {
        self.allocator.lock().free_bytes()
    }

    /// Whether the store is suspended (a failed sync or a panic); see [`StoreError::Suspended`].
    pub fn is_suspended(&self) -> bool {
        self.suspension.suspended.load(Ordering::Acquire)
    }

    /// Why the store is suspended, if it is.
    pub fn suspended_cause(&self) -> Option<String> {
        self.is_suspended().then(|| self.suspension.cause.lock().clone().unwrap_or_default())
    }

    /// Suspends the store: every later operation fails with [`StoreError::Suspended`] and
    /// nothing more is written. The first cause is kept.
    pub(super) fn suspend(&self, cause: String) {
        let mut first = self.suspension.cause.lock();
        if first.is_none() {
            *first = Some(cause);
        }
        self.suspension.suspended.store(true, Ordering::Release);
    }

    /// A guard that suspends the store if it is dropped by a panic's unwinding. parking_lot's
    /// locks do not poison, so after a panic caught above (the NBD server answers the request
    /// with an error and goes on) the store would otherwise keep serving from whatever
    /// half-updated state the panic left; a failed sync already suspends it, and so must this.
    pub(super) fn panic_guard(&self, what: &'static str) -> PanicGuard<'_> {
        PanicGuard { store: self, what }
    }

    /// Arms a fail point: the next time the store passes `point` it panics (tests use this to
    /// show that a panic suspends the store). Points: `dmu.modify` (a write, inside the
    /// txg lock after its blocks went into the open txg and before its log record) and
    /// `spa_sync.write_volumes` (a sync, after the quiesce).
    #[doc(hidden)]
    pub fn arm_fail_point(&self, point: &'static str) {
        self.test_points.fail_points.lock().push(point);
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
        let (reached_tx, reached_rx) = futures::channel::oneshot::channel();
        let (release_tx, release_rx) = futures::channel::oneshot::channel();
        self.test_points.pauses.lock().push(Pause { point, reached: reached_tx, release: release_rx });
        (reached_rx, release_tx)
    }

    /// Stops at `point` if a pause is armed there (once), until the test releases it.
    pub(super) async fn pause_point(&self, point: &'static str) {
        let armed = {
            let mut pauses = self.test_points.pauses.lock();
            let at = pauses.iter().position(|p| p.point == point);
            at.map(|at| pauses.swap_remove(at))
        };
        if let Some(pause) = armed {
            let _ = pause.reached.send(());
            let _ = pause.release.await;
        }
    }

    /// Panics if `point` is armed (once).
    pub(super) fn fail_point(&self, point: &'static str) {
        let armed = {
            let mut points = self.test_points.fail_points.lock();
            let at = points.iter().position(|&p| p == point);
            at.map(|at| points.swap_remove(at)).is_some()
        };
        assert!(!armed, "fail point {point} reached");
    }

    fn check_live(&self) -> Result<(), StoreError> {
        if self.suspension.suspended.load(Ordering::Acquire) {
            let cause = self.suspension.cause.lock().clone().unwrap_or_default();
            Err(StoreError::Suspended { pool: self.pool.name().to_owned(), cause })
        } else {
            Ok(())
        }
    }

    /// The dedup table: its totals as of the last sync and what it did since the pool opened.
    pub fn dedup_table(&self) -> &Ddt {
        &self.ddt
    }

    /// Syncs and closes.
    pub async fn export(self) -> Result<(), StoreError> {
        // Owning the store, no scan chunk is in work: a task between chunks finds it gone.
        self.forget_scan();
        self.sync().await?;
        let name = self.pool.name().to_owned();
        let pool = Arc::try_unwrap(self.pool).map_err(|_| {
            StoreError::Pool(PoolError::Format {
                pool: name,
                cause: sluice_format::FormatError::Invalid {
                    what: "pool",
                    field: "still in use by a task at export",
                    value: 0,
                },
            })
        })?;
        Ok(pool.export().await?)
    }
}

/// Suspends its store when dropped during a panic ([`Store::panic_guard`]).
pub(super) struct PanicGuard<'a> {
    store: &'a Store,
    what: &'static str,
}

impl Drop for PanicGuard<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.store.suspend(format!("a panic in {}", self.what));
        }
    }
}
