//! sluice's storage engine: devices, the vdev tree, device queues, tunables and stats.
//!
//! Layers, bottom up (docs/design.md, "Layers"): [`device`] (the `BlockDevice` seam: files, block devices,
//! simulated disks), [`vdev`] (leaves with their queues, mirrors, the root), with [`tunables`]
//! and [`stats`] beside them and [`rt`] as the runtime seam; [`alloc`] hands out space on the
//! top-level vdevs and [`zio`] runs every block through one pipeline. Pools, transaction groups, the
//! intent log, dedup and volumes build on these.
//!
//! Lock order, outer to inner (a thread holding one lock takes only locks to its right; no
//! `parking_lot` lock is held across an `.await`):
//!
//! `txg::spa::Spa::vdev_lock` (async, one change of leaves at a time) or a volume's
//! `txg::Dataset::rollback_gate` (async: its writes share it, a rollback or a receive taking
//! the volume's place holds it alone across a whole sync; never held with `vdev_lock`) ->
//! the head of a space line (`txg::dmu_tx::SpaceLine`, async, held across syncs by a writer
//! waiting for space) -> the sync's lock (`txg::spa_sync::Syncer::lock`, async, one sync at a time) -> the
//! background scan's state (`txg::dsl_scan::Scan`) -> the store's volume namespace
//! (`txg::dataset::Dsl`) -> its open txg (`txg::dsl_pool::Txg`) -> a volume's `txg::Dataset` state -> its `intent_log::LogWriter` state ->
//! the dedup table -> a dedup entry -> the allocator -> a leaf's queue (`vdev::queue`) -> a
//! simulated device's state. The block cache, the pool's
//! state, the pool's vdev tree (held only to clone or swap an `Arc`), the store's
//! suspension cause and the pool's events (`fm::Events`, posted to under any of the others)
//! are leaves: nothing is taken while holding them, but for the pool's
//! administration lock (`pool/admin.rs`, `pool/attach.rs`), which is taken before the
//! pool's state and tree, never across an `.await`.
//!
//! Each module that takes two of these writes the part it enforces in its own doc.

// The runtime seam, the tunables and the counters are interfaces as they stand: the host
// runtime implements the first, the CLI sets the second and reads the third.
pub mod fm;
pub mod rt;
pub mod stats;
pub mod tunables;

/// The mechanisms are the crate's own. The simulator, the seed experiments and the engine's
/// integration tests reach inside them (the simulated device, fail points, the allocator and
/// log writer alone, audits) through the `testing` feature, which sluice-bench and the NBD
/// server's tests turn on and the engine's tests take through a dev-dependency on the crate
/// itself. The
/// served binary and the NBD server build without it and see only what is re-exported below:
/// `cargo check -p sluice-cli -p sluice-nbd` (scripts/test) checks that they need nothing more.
macro_rules! mechanisms {
    ($($name:ident),* $(,)?) => {$(
        #[cfg(feature = "testing")]
        pub mod $name;
        #[cfg(not(feature = "testing"))]
        pub(crate) mod $name;
    )*};
}

mechanisms!(alloc, dedup, device, intent_log, objset, pool, txg, vdev, volume, zio);

pub use dedup::Locking;
pub use device::{
    core_ring, inject, AlignedBuf, BlockDevice, DeviceError, FileDevice, FileDeviceOptions,
    SharedBuf, UninitBuf, IOVECS_MAX,
};
pub use pool::{
    probe, LeafSpec, NewFeatures, Pool, PoolError, PoolLeaf, PoolSpec, PreparedActivation,
    PreparedAdd, PreparedAttach, PreparedSpares, ScrubReport, SpareLeaf, SpareStatus, TopSpec,
    VerifyReport,
};
pub use txg::{auto_name, DeviceOpener, CHECK_INTERVAL as SCHEDULE_CHECK_INTERVAL};
pub use txg::{
    AuditReport, EncryptionInfo, ImportOptions, ImportReport, KeyStatus, LostLog, NewKey, ReadData,
    ReceiveMode, Rewind, ScanFunc, ScanPhase, ScanStatus, ScheduleReport, SnapshotInfo,
    SnapshotSpace, Store, StoreError, StreamSummary, SyncRecord, VolumeProperty, AUTO_PREFIX,
    BLOCK_BYTES_DEFAULT, RECEIVE_PREFIX,
};
pub use vdev::{LeafState, ReadPolicy, VdevError};
pub use volume::Volume;
pub use zio::crypt::{CryptError, UserKey};
pub use zio::Writer;

/// An error and its causes, joined by ": ", for a person to read (a log line, a suspension's
/// cause, the CLI's message): a mirror's "failed on every child" says why only through its
/// source. Each cause is printed once: an engine error either names its cause in its own
/// message (a field called `cause`, which is not its `source()`) or leaves it to its source,
/// never both.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut out = error.to_string();
    let mut cause = error.source();
    while let Some(error) = cause {
        out.push_str(": ");
        out.push_str(&error.to_string());
        cause = error.source();
    }
    out
}

/// What kind of failure an engine error is, for callers that must answer in another vocabulary
/// (the NBD server's errno values, exit codes). Match on this, not on error variants: a
/// no-space condition can come from the store's admission check, the allocator or the intent
/// log, and all of them are `NoSpace` here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The pool has no room for the request; freeing space (trim, delete) helps.
    NoSpace,
    /// The request itself is malformed or out of range.
    Invalid,
    /// A named pool, volume or device does not exist.
    NotFound,
    /// The name is taken.
    Exists,
    /// The pool stopped serving (a failed sync or a panic) until it is imported again.
    Suspended,
    /// The data failed its checksum on every copy.
    Checksum,
    /// A device failed, or the pool's own state is inconsistent.
    Io,
    /// A write to something that never changes (a snapshot).
    ReadOnly,
    /// An encrypted volume whose key is not loaded (`sluice key load`).
    KeyUnavailable,
}
