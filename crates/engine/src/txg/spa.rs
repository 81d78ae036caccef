//! The pool under the store (ZFS: `spa.c`, `spa_misc.c`): its vdev tree, its space, its dedup
//! table, the lock of a change of leaves, whether the store stopped writing and why, and the
//! test points.
//!
//! [`Spa`] is the store's lowest object: every other one (the namespace, the open txg, the log,
//! the syncer) reads the pool and takes the allocator through it, and it calls none of them.
//! The handles it gives out are the `Arc`s the sync and the log writers share with the tasks
//! they spawn; its own state (the suspension, the test points) changes only through its
//! methods. The orchestration that OpenZFS also keeps in `spa.c` (attach, detach, import,
//! the sync) needs the objects above it, so it lives with them: spa_vdev.rs, spa_load.rs and
//! spa_sync.rs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::dbuf::Prewritten;
use super::StoreError;
use crate::alloc::Allocator;
use crate::dedup::Ddt;
use sluice_format::BlockPointer;

use crate::device::AlignedBuf;
use crate::pool::{Pool, PoolError};
use crate::zio::{BlockProps, Issue, Writer};

/// The pool, its space and its dedup table, with the store's suspension and test points.
#[derive(Debug)]
pub(super) struct Spa {
    pool: Arc<Pool>,
    /// Shared with the tasks a sync spawns to write dedup blocks in parallel.
    allocator: Arc<Mutex<Allocator>>,
    ddt: Arc<Ddt>,
    /// The key families' wrapped keys, and which are closing (dsl_crypt.rs); their loaded
    /// keys are the pipeline's.
    crypt: super::dsl_crypt::DslCrypt,
    /// Held for a whole change of leaves (attach, detach, replace: their sync and label
    /// rewrites), so that two do not interleave; taken before the sync's lock (spa_vdev.rs).
    vdev_lock: futures::lock::Mutex<()>,
    /// Whether and why the store stopped writing.
    suspension: Suspension,
    /// Fail and pause points armed by tests.
    test_points: TestPoints,
    /// When this store was created or imported: what "since import" counts from.
    opened: crate::rt::Time,
    /// Held shared by each prefetch while it holds the pool (dmu_zfetch.rs), exclusively by
    /// the export, which waits for them: a prefetch's I/O must not keep the pool from closing.
    fetches: Arc<async_lock::RwLock<()>>,
}

/// Whether the store is suspended, and why (the first cause): a failed sync or a panic
/// ([`Spa::suspend`]). Leaves: nothing is taken while holding the cause.
#[derive(Debug, Default)]
struct Suspension {
    suspended: AtomicBool,
    cause: Mutex<Option<String>>,
}

/// Points where tests stop or fail a task ([`Spa::arm_fail_point`], [`Spa::arm_pause`]).
/// Leaves.
#[derive(Debug, Default)]
struct TestPoints {
    fail_points: Mutex<Vec<&'static str>>,
    /// The point, the signal that a task reached it, and what it then waits for.
    pauses: Mutex<Vec<Pause>>,
}

/// A pause point armed by a test ([`Spa::arm_pause`]).
#[derive(Debug)]
struct Pause {
    point: &'static str,
    reached: futures::channel::oneshot::Sender<()>,
    release: futures::channel::oneshot::Receiver<()>,
}

impl Spa {
    pub(super) fn new(
        pool: Arc<Pool>,
        allocator: Allocator,
        ddt: Ddt,
        crypt: super::dsl_crypt::DslCrypt,
    ) -> Spa {
        let opened = pool.env().now();
        Spa {
            pool,
            allocator: Arc::new(Mutex::new(allocator)),
            ddt: Arc::new(ddt),
            crypt,
            vdev_lock: futures::lock::Mutex::new(()),
            suspension: Suspension::default(),
            test_points: TestPoints::default(),
            opened,
            fetches: Arc::default(),
        }
    }

    /// What a prefetch needs to reach the pool without keeping it open
    /// ([`Spa::export`] waits for the prefetches that reached it).
    pub(super) fn fetch_access(&self) -> super::dmu_zfetch::PoolAccess {
        super::dmu_zfetch::PoolAccess::new(&self.pool, &self.fetches)
    }

    pub(super) fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    pub(super) fn allocator(&self) -> &Arc<Mutex<Allocator>> {
        &self.allocator
    }

    /// The compression a volume's data blocks are stored with now: its property, but none for
    /// a thick volume without dedup while the pool is short of room ([`Allocator::short_of_room`]), so that
    /// the blocks it replaces leave holes its next blocks fit.
    pub(super) fn stored_compression(
        &self,
        entry: &sluice_format::VolumeEntry,
    ) -> sluice_format::Compression {
        // Not with dedup: an encrypted dedup volume's blocks match by their sealed bytes, and
        // storing them otherwise would stop them matching the copies already stored.
        let thick = entry.reservation_bytes > 0 && entry.dedup == sluice_format::DedupMode::Off;
        if thick && self.allocator.lock().short_of_room(u64::from(entry.block_bytes)) {
            return sluice_format::Compression::Off;
        }
        entry.compression
    }

    pub(super) fn crypt(&self) -> &super::dsl_crypt::DslCrypt {
        &self.crypt
    }

    pub(super) fn ddt(&self) -> &Arc<Ddt> {
        &self.ddt
    }

    /// One change of leaves at a time (the lock order's first lock, before the sync's).
    pub(super) async fn lock_vdevs(&self) -> futures::lock::MutexGuard<'_, ()> {
        self.vdev_lock.lock().await
    }

    pub(super) fn opened(&self) -> crate::rt::Time {
        self.opened
    }

    pub(super) fn free_bytes(&self) -> u64 {
        self.allocator.lock().free_bytes()
    }

    pub(super) fn is_suspended(&self) -> bool {
        self.suspension.suspended.load(Ordering::Acquire)
    }

    pub(super) fn suspended_cause(&self) -> Option<String> {
        self.is_suspended().then(|| self.suspension.cause.lock().clone().unwrap_or_default())
    }

    /// Suspends the store: every later operation fails with [`StoreError::Suspended`] and
    /// nothing more is written. The first cause is kept.
    pub(super) fn suspend(&self, cause: String) {
        let mut first = self.suspension.cause.lock();
        if first.is_none() {
            self.pool().events().post(
                crate::fm::EventClass::PoolSuspend,
                None,
                vec![("cause", cause.clone())],
            );
            *first = Some(cause);
        }
        self.suspension.suspended.store(true, Ordering::Release);
    }

    /// A guard that suspends the store if it is dropped by a panic's unwinding. parking_lot's
    /// locks do not poison, so after a panic caught above (the NBD server answers the request
    /// with an error and goes on) the store would otherwise keep serving from whatever
    /// half-updated state the panic left; a failed sync already suspends it, and so must this.
    pub(super) fn panic_guard(&self, what: &'static str) -> PanicGuard<'_> {
        PanicGuard { spa: self, what }
    }

    pub(super) fn check_live(&self) -> Result<(), StoreError> {
        if self.suspension.suspended.load(Ordering::Acquire) {
            let cause = self.suspension.cause.lock().clone().unwrap_or_default();
            Err(StoreError::Suspended { pool: self.pool.name().to_owned(), cause })
        } else {
            Ok(())
        }
    }

    pub(super) fn arm_fail_point(&self, point: &'static str) {
        self.test_points.fail_points.lock().push(point);
    }

    pub(super) fn arm_pause(
        &self,
        point: &'static str,
    ) -> (futures::channel::oneshot::Receiver<()>, futures::channel::oneshot::Sender<()>) {
        let (reached_tx, reached_rx) = futures::channel::oneshot::channel();
        let (release_tx, release_rx) = futures::channel::oneshot::channel();
        self.test_points.pauses.lock().push(Pause {
            point,
            reached: reached_tx,
            release: release_rx,
        });
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

    /// What a thick volume of `size_bytes` in blocks of `block_bytes` sets aside (ZFS:
    /// `zvol_volsize_to_reservation`): every data block, and every indirect block above
    /// them with each of its copies, as each allocates (`Pool::asize_max`).
    pub(super) fn thick_reservation(&self, size_bytes: u64, block_bytes: u32) -> u64 {
        // What each block allocates, on RAID-Z with its parity and padding: a thick volume's
        // reservation must hold every block it may write.
        let whole = |bytes: u64| self.pool.asize_max(bytes);
        let blocks = size_bytes / u64::from(block_bytes);
        let (mut indirect, mut level) = (0, blocks);
        while level > 1 {
            level = level.div_ceil(crate::objset::INDIRECT_BPS);
            indirect += level;
        }
        let copies = self.pool.metadata_copies().max(1) as u64;
        blocks * whole(u64::from(block_bytes))
            + indirect * copies * whole(crate::objset::INDIRECT_BYTES as u64)
    }

    /// Frees (block copies) that freeing all of `entry`'s tree and dead lists writes into the
    /// space maps, at most: each data block, each indirect block's copies, each dead-list
    /// entry's copies and pieces.
    pub(super) fn frees_bound(&self, entry: &sluice_format::VolumeEntry) -> u64 {
        let copies = self.pool.metadata_copies() as u64;
        let (data, indirect) = entry.space.map_or((0, 0), |s| {
            let data = s.logical_bytes / u64::from(entry.block_bytes);
            // Indirect blocks are stored compressed (zio::BlockProps::indirect), down to one
            // allocation unit each: counted at that, the bound holds whatever they took.
            let indirect = s.referenced_bytes.saturating_sub(s.physical_bytes);
            (data, indirect / self.pool.unit_bytes())
        });
        let lists = std::iter::once(&entry.deadlist)
            .chain(entry.snapshots.iter().map(|s| &s.deadlist))
            .map(|l| l.entries.saturating_add(l.pieces.len() as u64).saturating_mul(copies))
            .fold(0u64, u64::saturating_add);
        data.saturating_add(indirect)
            .saturating_add(lists)
            .saturating_add(u64::from(entry.levels) * copies)
    }

    /// Writes one metadata block of `writer` to every place allocated for it (its first copy
    /// and ditto copies, all of one size; `logical` is padded to it) and returns its pointer,
    /// with a DVA per copy.
    pub(super) async fn write_metadata(
        &self,
        writer: Writer,
        places: &[(u32, u64, u64)],
        logical: Arc<AlignedBuf>,
        txg: u64,
    ) -> Result<BlockPointer, PoolError> {
        let props = BlockProps::metadata(writer, txg, places.len());
        // Padded to the most every place holds: its allocation on a leaf or a mirror, less
        // the parity and padding on RAID-Z (a block written longer than its place was
        // allocated for would overrun it there).
        let psize = places.iter().map(|&(vdev, _, asize)| self.pool.max_psize(vdev, asize)).min();
        let sealed = self.pool.seal_block(props, logical, psize)?;
        let written = self.pool.issue_placed(&[sealed], &[places.to_vec()], Issue::ASYNC).await?;
        Ok(written[0])
    }

    /// Frees blocks written in place that no tree links, in `txg`, once their writes have
    /// ended (a write still in flight must not land on space handed out again).
    pub(super) async fn release_prewritten(&self, txg: u64, unused: Vec<Prewritten>) {
        for p in &unused {
            p.write.clone().await;
        }
        let mut allocator = self.allocator.lock();
        for p in unused {
            let dva = p.bp.dvas[0];
            allocator.free_log(txg, dva.vdev, dva.offset_bytes(), dva.asize_bytes());
        }
    }

    /// Closes the pool once the store is done with it: the store's last sync has run, and no
    /// task holds the pool any more.
    pub(super) async fn export(self) -> Result<(), StoreError> {
        let name = self.pool.name().to_owned();
        // No prefetch reaches the pool after this: one that comes later finds it gone.
        let _no_fetches = self.fetches.write().await;
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

/// Suspends the store when dropped during a panic ([`Spa::panic_guard`]).
pub(super) struct PanicGuard<'a> {
    spa: &'a Spa,
    what: &'static str,
}

impl Drop for PanicGuard<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.spa.suspend(format!("a panic in {}", self.what));
        }
    }
}
