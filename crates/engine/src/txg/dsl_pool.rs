//! The open txg and its dirty-data accounting (ZFS: `txg.c`'s open state with `dsl_pool.c`'s
//! dirty data): [`TxgState`] behind the txg lock, the limits admission and the throttle hold
//! writers to ([`TxgLimits`]), what the throttle did ([`ThrottleStats`]), where the open txgs'
//! patches were completed ([`PatchStats`]), and what the open and syncing txgs will allocate
//! ([`InFlight`], [`SyncShape`]). It knows no volume: admission (dmu_tx.rs), the write path
//! (dmu.rs), the log's commits and replay (zil_commit.rs, zil.rs), the namespace (dataset.rs)
//! and the quiesce (spa_sync.rs) count against it.

use super::dsl_synctask::SyncTask;
use crate::intent_log::CommitPolicy;
use crate::tunables::{Tunable, Tunables};
use std::sync::atomic::{AtomicU64, Ordering};

/// The open txg and what is counted of it and of the syncing one (ZFS: `txg.c`'s state and
/// `dsl_pool`'s dirty accounting), with the sync tasks queued for its sync, behind
/// [`Txg`]'s lock. Admission (dmu_tx.rs), the write path (dmu.rs), the log's commits (zil_commit.rs) and
/// the quiesce (spa_sync.rs) share it; each change to a volume's open layer is counted here
/// under the same lock.
#[derive(Debug)]
pub(super) struct TxgState {
    open_txg: u64,
    dirty_bytes: u64,
    /// The part of `dirty_bytes` already written in place for the intent log (indirect
    /// records): their space is allocated, so the space check leaves them out, but they stay
    /// dirty for the throttle and for starting a sync, because until a sync links them (and
    /// frees the versions they replaced) they hold space like any other write.
    prewritten_bytes: u64,
    /// `dirty_bytes` and `prewritten_bytes` as the space their blocks allocate: the same on a
    /// pool of leaves and mirrors, with parity and padding for the block's size where a data
    /// vdev is RAID-Z (`Pool::inflate`).
    dirty_alloc_bytes: u64,
    prewritten_alloc_bytes: u64,
    /// What an indirect block allocates at most (`Pool::asize_max`): the open txg's indirect
    /// blocks are counted in bytes of them.
    indirect_asize: u64,
    /// Indirect blocks the open txg will rewrite, estimated: the path to the root for each
    /// group of `INDIRECT_BPS` blocks it dirtied.
    dirty_metadata_bytes: u64,
    /// Blocks the open txg dirtied, counted as `dirty_bytes` counts their bytes (once per
    /// write that touched each): what bounds the space maps and dead lists its sync writes.
    dirty_blocks: u64,
    /// What administrative changes made in the open txg add to its sync's allocations (the
    /// dead list a snapshot destroy rewrites, the levels a grow adds), at allocated sizes.
    pending_metadata_bytes: u64,
    /// Frees (block copies) those changes make its sync write into the space maps, at most:
    /// a destroyed volume's tree and dead lists, a rollback's blocks, a destroyed snapshot's.
    pending_frees: u64,
    /// What the syncing txg will allocate (its dirty data and metadata at quiesce), until its
    /// sync ends: admission counts it, since its blocks are not allocated yet.
    syncing_bytes: u64,
    /// [`crate::alloc::Allocator::allocated_total`] when the syncing txg quiesced: what it has allocated
    /// since is in the allocator's free space already ([`InFlight`]).
    syncing_allocated_base: u64,
    /// The last synced directory's bytes: the open txg's sync rewrites it, a little larger
    /// perhaps (admission counts it, [`SyncShape`]).
    directory_bytes: u64,
    /// Work asked in the open txg that its sync does, in this order (dsl_synctask.rs).
    tasks: Vec<Box<dyn SyncTask>>,
}

impl TxgState {
    /// The open txg's dirty data that its sync still has to allocate space for.
    pub(super) fn dirty_to_allocate(&self) -> u64 {
        self.dirty_alloc_bytes.saturating_sub(self.prewritten_alloc_bytes)
    }

    /// The open txg's indirect blocks as the space they allocate.
    pub(super) fn metadata_to_allocate(&self) -> u64 {
        let block = crate::objset::INDIRECT_BYTES as u64;
        if self.indirect_asize == block {
            return self.dirty_metadata_bytes;
        }
        self.dirty_metadata_bytes.div_ceil(block) * self.indirect_asize
    }

    /// The txg writes go into now.
    pub(super) fn open_txg(&self) -> u64 {
        self.open_txg
    }

    /// Dirty bytes in the open txg.
    pub(super) fn dirty_bytes(&self) -> u64 {
        self.dirty_bytes
    }

    /// What the syncing txg will allocate, as bounded at its quiesce; 0 when none syncs.
    pub(super) fn syncing_bytes(&self) -> u64 {
        self.syncing_bytes
    }

    /// What the syncing txg has still to allocate: its bound less what the allocator has
    /// handed out since its quiesce (which is out of the free space already).
    pub(super) fn syncing_to_allocate(&self, allocator: &crate::alloc::Allocator) -> u64 {
        still_to_allocate(self.syncing_bytes, self.syncing_allocated_base, allocator)
    }

    /// A write put `bytes` of data into the open txg (allocating `alloc_bytes`), touching
    /// `blocks` blocks and, at most, `metadata_bytes` of indirect blocks its sync rewrites.
    pub(super) fn count_dirty(
        &mut self,
        bytes: u64,
        alloc_bytes: u64,
        metadata_bytes: u64,
        blocks: u64,
    ) {
        self.dirty_bytes += bytes;
        self.dirty_alloc_bytes += alloc_bytes;
        self.dirty_metadata_bytes += metadata_bytes;
        self.dirty_blocks += blocks;
    }

    /// `bytes` of the open txg's dirty data (allocating `alloc_bytes`) were written in place
    /// for the intent log.
    pub(super) fn count_prewritten(&mut self, bytes: u64, alloc_bytes: u64) {
        self.prewritten_bytes += bytes;
        self.prewritten_alloc_bytes += alloc_bytes;
    }

    /// An administrative change asked in the open txg adds `metadata_bytes` to its sync's
    /// allocations and at most `frees` block copies to its space maps.
    pub(super) fn count_pending(&mut self, metadata_bytes: u64, frees: u64) {
        self.pending_metadata_bytes = self.pending_metadata_bytes.saturating_add(metadata_bytes);
        self.pending_frees = self.pending_frees.saturating_add(frees);
    }

    /// Queues a change for the open txg's sync (dsl_synctask.rs). The caller holds the txg
    /// lock, under which it also counted what the task adds to the sync
    /// ([`TxgState::count_pending`]): admission sees both at once.
    pub(super) fn queue(&mut self, task: impl SyncTask + 'static) {
        self.tasks.push(Box::new(task));
    }

    /// Closes the open txg (the quiesce): it becomes the syncing one, whose sync may allocate
    /// its dirty data and indirect blocks and `metadata_bytes` of its own metadata, counted
    /// from `allocated_base` ([`crate::alloc::Allocator::allocated_total`] now); the next txg opens empty.
    pub(super) fn quiesce(&mut self, metadata_bytes: u64, allocated_base: u64) -> Quiesce {
        let txg = self.open_txg;
        self.open_txg += 1;
        self.syncing_bytes =
            self.dirty_to_allocate() + self.metadata_to_allocate() + metadata_bytes;
        self.syncing_allocated_base = allocated_base;
        self.dirty_blocks = 0;
        self.pending_metadata_bytes = 0;
        self.pending_frees = 0;
        self.dirty_bytes = 0;
        self.prewritten_bytes = 0;
        self.dirty_alloc_bytes = 0;
        self.prewritten_alloc_bytes = 0;
        self.dirty_metadata_bytes = 0;
        Quiesce { txg, syncing_bytes: self.syncing_bytes, tasks: std::mem::take(&mut self.tasks) }
    }

    /// The syncing txg's sync ended (synced, its blocks are allocated and counted as such;
    /// failed, the store is suspended).
    pub(super) fn sync_ended(&mut self) {
        self.syncing_bytes = 0;
    }

    /// The last sync wrote a directory of `bytes`.
    pub(super) fn synced_directory(&mut self, bytes: u64) {
        self.directory_bytes = bytes;
    }

    /// The state of a store whose last synced txg is `synced_txg`, with nothing dirty, on a
    /// pool where an indirect block allocates `indirect_asize` bytes at most.
    pub(super) fn new(synced_txg: u64, directory_bytes: u64, indirect_asize: u64) -> TxgState {
        TxgState {
            open_txg: synced_txg + 1,
            dirty_bytes: 0,
            prewritten_bytes: 0,
            dirty_alloc_bytes: 0,
            prewritten_alloc_bytes: 0,
            indirect_asize,
            dirty_metadata_bytes: 0,
            dirty_blocks: 0,
            pending_metadata_bytes: 0,
            pending_frees: 0,
            syncing_bytes: 0,
            syncing_allocated_base: 0,
            directory_bytes,
            tasks: Vec::new(),
        }
    }
}

/// What [`TxgState::quiesce`] closed.
pub(super) struct Quiesce {
    pub(super) txg: u64,
    /// What its sync may allocate: what admission counts for it until the sync ends.
    pub(super) syncing_bytes: u64,
    pub(super) tasks: Vec<Box<dyn SyncTask>>,
}

/// The open txg (ZFS: `txg.c`'s `tx_state` with `dsl_pool`'s dirty accounting and the
/// throttle's settings): its state behind the txg lock, the limits admission and the
/// throttle hold writers to, and what they did to them. What admission weighs against the
/// namespace, the pool's space and the syncer is done where those meet (`dmu_tx::Admission`).
#[derive(Debug)]
pub(super) struct Txg {
    state: parking_lot::Mutex<TxgState>,
    limits: TxgLimits,
    throttle_stats: ThrottleStats,
    patch_stats: PatchStats,
    /// Writers waiting for space: those of thick volumes and the others, each by the room
    /// tier their blocks are counted in (`alloc::ROOM_BLOCK_BYTES`).
    space_lines: [[super::dmu_tx::SpaceLine; crate::alloc::ROOM_BLOCK_BYTES.len()]; 2],
    /// When the last delayed write wakes, in the clock's nanoseconds (ZFS: `dp_last_wakeup`).
    last_wakeup: AtomicU64,
    /// Signalled each time a txg opens (the last one quiesced): writers the throttle holds
    /// for a sync wake then instead of at their delay's end ([`Txg::opened_after`]).
    opened: event_listener::Event,
}

impl Txg {
    pub(super) fn new(state: TxgState, limits: TxgLimits) -> Txg {
        Txg {
            state: parking_lot::Mutex::new(state),
            limits,
            throttle_stats: ThrottleStats::default(),
            patch_stats: PatchStats::default(),
            space_lines: Default::default(),
            last_wakeup: AtomicU64::new(0),
            opened: event_listener::Event::new(),
        }
    }

    /// Wakes the writers waiting in [`Txg::opened_after`]: a txg opened. Called once the
    /// quiesce has let go of the txg lock.
    pub(super) fn notify_opened(&self) {
        self.opened.notify(usize::MAX);
    }

    /// Completes once a txg later than `txg` is open: at once if one is already.
    pub(super) async fn opened_after(&self, txg: u64) {
        loop {
            // Listening before the check, a quiesce between the two is not missed.
            let listener = self.opened.listen();
            if self.lock().open_txg > txg {
                return;
            }
            listener.await;
        }
    }

    /// The line writers of thick (or other) volumes of blocks of `block_bytes` wait for space
    /// in: a volume of 128 KiB blocks short of 128 KiB ranges does not hold up one of 16 KiB
    /// blocks.
    pub(super) fn space_line(&self, thick: bool, block_bytes: u64) -> &super::dmu_tx::SpaceLine {
        &self.space_lines[usize::from(thick)][crate::alloc::room_tier(block_bytes)]
    }

    /// Whether any writer, of any kind and block size, waits for space.
    pub(super) fn anyone_waits_for_space(&self) -> bool {
        self.space_lines.iter().flatten().any(|line| line.is_waiting())
    }

    /// The txg lock (crate::txg's lock order: after the namespace, before a volume's state).
    pub(super) fn lock(&self) -> parking_lot::MutexGuard<'_, TxgState> {
        self.state.lock()
    }

    pub(super) fn limits(&self) -> &TxgLimits {
        &self.limits
    }

    pub(super) fn throttle_stats(&self) -> &ThrottleStats {
        &self.throttle_stats
    }

    pub(super) fn patch_stats(&self) -> &PatchStats {
        &self.patch_stats
    }

    /// When a write that started at `start` and is to be delayed by `delay` wakes (ZFS:
    /// `dmu_tx_delay`'s wakeup): `delay` after its start, and at least `delay` after the
    /// write delayed before it, which then wakes no later than this one. Spaced so, the delay
    /// is the time between the pool's writes, and the rate it sets holds whatever the number
    /// of writers; each sleeping its delay alone, 32 writers passed 32 times that rate, and
    /// the open txg ran past the curve into the wall of free space (`txg.delay_spacing`).
    pub(super) fn delay_wakeup(
        &self,
        start: crate::rt::Time,
        delay: std::time::Duration,
    ) -> crate::rt::Time {
        let delay = u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX);
        let mut wakeup = 0;
        // The closure may run again if another writer moved the mark meanwhile; the last run
        // is the one stored.
        let _ = self.last_wakeup.fetch_update(Ordering::AcqRel, Ordering::Acquire, |last| {
            wakeup = start.as_nanos().max(last).saturating_add(delay);
            Some(wakeup)
        });
        crate::rt::Time::from_nanos(wakeup)
    }

    /// Dirty bytes in the open txg.
    pub(super) fn dirty_bytes(&self) -> u64 {
        self.lock().dirty_bytes
    }

    /// The txg that writes go into now.
    pub(super) fn open_txg(&self) -> u64 {
        self.lock().open_txg
    }
}

/// What the write throttle did to writers (zeroes included): the answer to "why are my writes
/// slow" when one writer fills the dirty-data budget for every volume, as ZFS's does.
#[derive(Debug, Default)]
pub struct ThrottleStats {
    /// Writes delayed because dirty data was above `txg.delay_min_dirty_pct`, and for how long.
    pub delayed: crate::stats::Counter,
    pub delayed_nanos: crate::stats::Counter,
    /// Of the delayed writes, those whose delay a txg's quiesce cut short: large writes and
    /// writes at the free space's maximum wake when the txg they fill starts its sync.
    pub woken_by_sync: crate::stats::Counter,
    /// Writes that found `txg.dirty_max` reached and waited for a txg sync, and for how long.
    pub waited_for_sync: crate::stats::Counter,
    pub waited_nanos: crate::stats::Counter,
    /// Writes that waited for space (in line behind another, or for syncs to give space
    /// back), each counted once, and their time.
    pub waited_for_space: crate::stats::Counter,
    pub waited_for_space_nanos: crate::stats::Counter,
    /// Writes that would have been delayed, or stopped at the maximum, but were not: their
    /// volume held less than an equal share of the dirty data, so another volume was filling
    /// it.
    pub spared: crate::stats::Counter,
}

/// Where patches were completed: a patch is what writes into part of a block leave when the
/// block's version below is not in memory (dbuf.rs), and it is completed from that version,
/// read from the disk unless cached: beside its write (by a task of its own, or before the
/// write's answer where the client waits anyway) or by the txg sync, which reads what is left
/// at async priority. A patch that later writes fill whole, or whose volume goes, needs no
/// read and counts in neither. Completing them beside the writes spreads their reads over the
/// txg instead of piling them into the sync; a count left to the sync that keeps rising means
/// the reads fall behind the writes.
#[derive(Debug, Default)]
pub struct PatchStats {
    /// Patches completed beside their writes.
    pub completed_beside: crate::stats::Counter,
    /// Patches completed by the txg sync: a lone write's, left there so that its read does not
    /// run beside its own log write, one whose completion beside failed to read, or one no
    /// task reached before its txg quiesced.
    pub completed_by_sync: crate::stats::Counter,
    /// Writes whose patch found every completing task of their core busy and its line full
    /// (`PATCHES_WAITING_MAX`, dbuf_read.rs), so was left to the sync, unless a later write of the
    /// block finds a task free. A block written again meanwhile counts again.
    pub left_to_sync: crate::stats::Counter,
}

/// How much may be dirty and how often txgs sync.
#[derive(Clone, Copy, Debug)]
pub(super) struct TxgLimits {
    pub(super) timeout: std::time::Duration,
    pub(super) dirty_max: u64,
    pub(super) delay_min: u64,
    /// `txg.delay_min_dirty_pct`: the delay starts at this share of the maximum in force.
    pub(super) delay_min_pct: u64,
    /// `txg.delay_spacing=pool`: delayed writes wake a delay apart ([`Txg::delay_wakeup`]).
    pub(super) delay_spaced: bool,
    pub(super) log_policy: CommitPolicy,
    pub(super) commit_timeout_pct: u64,
    pub(super) early_commit: bool,
    pub(super) log_block_bytes_max: u32,
    /// Writes at least this large are logged by pointer (0: never).
    pub(super) immediate_write_bytes: u64,
    pub(super) request_threads: usize,
    /// Each volume's prefetch (dmu_zfetch.rs).
    pub(super) zfetch: super::dmu_zfetch::ZfetchLimits,
}

/// Delay of a write when dirty data is halfway between the delay threshold and the maximum
/// (ZFS: zfs_delay_scale). Delayed writes wake this far apart (`txg.delay_spacing=pool`), so
/// it is the time between the pool's writes there: 2,000 writes a second, within what one
/// leaf syncs, so that the open txg settles on the curve before its maximum.
pub(super) const DELAY_SCALE: std::time::Duration = std::time::Duration::from_micros(500);
/// No single delay exceeds this; beyond it the writer would rather sync itself.
pub(super) const DELAY_MAX: std::time::Duration = std::time::Duration::from_millis(100);

impl TxgLimits {
    /// The limits `tunables` set, on a machine of `memory_bytes` (see [`crate::rt::Env::memory_bytes`]).
    pub(super) fn from_tunables(tunables: &Tunables, memory_bytes: Option<u64>) -> TxgLimits {
        let dirty_max = tunables.dirty_max_bytes(memory_bytes);
        TxgLimits {
            timeout: std::time::Duration::from_millis(tunables.get(Tunable::TxgTimeoutMs)),
            dirty_max,
            delay_min: dirty_max / 100 * tunables.get(Tunable::TxgDelayMinDirtyPct),
            delay_min_pct: tunables.get(Tunable::TxgDelayMinDirtyPct),
            delay_spaced: tunables.choice(Tunable::TxgDelaySpacing) == "pool",
            log_policy: CommitPolicy::from_tunables(tunables),
            commit_timeout_pct: tunables.get(Tunable::IntentLogCommitTimeoutPct),
            early_commit: tunables.choice(Tunable::IntentLogEarlyCommit) == "auto",
            immediate_write_bytes: tunables.get(Tunable::IntentLogImmediateWriteBytes),
            log_block_bytes_max: u32::try_from(tunables.get(Tunable::IntentLogBlockBytesMax))
                .unwrap_or(128 << 10),
            request_threads: usize::try_from(tunables.get(Tunable::VolumeRequestThreads))
                .unwrap_or(0),
            zfetch: super::dmu_zfetch::ZfetchLimits::from_tunables(tunables),
        }
    }

    /// How long a writer waits with `dirty` bytes dirty when at most `max` may be:
    /// `txg.dirty_max`, or less where the pool's free space holds less (`Admission::throttle`, dmu_tx.rs).
    /// At `max` and past it, the longest delay: only a maximum below `txg.dirty_max` gets
    /// there, since writers wait for a sync at that one.
    pub(super) fn delay(&self, dirty: u64, max: u64) -> std::time::Duration {
        let min = max / 100 * self.delay_min_pct;
        if dirty <= min {
            return std::time::Duration::ZERO;
        }
        if dirty >= max {
            return DELAY_MAX;
        }
        let over = (dirty - min) as f64;
        let room = (max - dirty) as f64;
        DELAY_SCALE.mul_f64(over / room).min(DELAY_MAX)
    }
}

/// What a syncing txg bounded at `syncing` bytes when it quiesced has still to allocate: what
/// the allocator has handed out since (`base` was its total then) is out of the free space.
fn still_to_allocate(syncing: u64, base: u64, allocator: &crate::alloc::Allocator) -> u64 {
    syncing.saturating_sub(allocator.allocated_total().saturating_sub(base))
}

/// What the open and syncing txgs will allocate, as the store's state has it; the syncing
/// txg's part is settled against the allocator ([`InFlight::to_allocate`]).
pub(super) struct InFlight {
    /// The open txg's dirty data and estimated indirect blocks.
    open: u64,
    /// Of `open`, the indirect blocks.
    open_metadata: u64,
    /// Blocks the open txg's sync writes (data and indirect) and what its administrative
    /// changes add: its own metadata is bounded from them and the allocator's counts.
    open_shape: SyncShape,
    /// Dirty data already written in place for the log: not in `open`, but in the dirty
    /// bytes the throttle weighs.
    prewritten: u64,
    /// The syncing txg's, as bounded when it quiesced (its metadata included).
    syncing: u64,
    syncing_allocated_base: u64,
}

impl InFlight {
    /// The in-flight figures; `appending` as [`SyncShape::of_open`] takes it.
    pub(super) fn of(appending: u64, txg: &TxgState, pool: &crate::pool::Pool) -> InFlight {
        InFlight {
            open: txg.dirty_to_allocate() + txg.metadata_to_allocate(),
            open_metadata: txg.metadata_to_allocate(),
            open_shape: SyncShape::of_open(appending, txg, pool),
            prewritten: txg.prewritten_bytes,
            syncing: txg.syncing_bytes,
            syncing_allocated_base: txg.syncing_allocated_base,
        }
    }

    /// Bytes still to allocate: the open txg's data, indirect blocks and the metadata its sync
    /// will write, and what the syncing txg has not allocated yet. What the syncing txg has
    /// already allocated is out of the free space, so it is no longer counted here: counting
    /// all of its estimate until the sync ended counted those bytes twice, and with txgs of a
    /// tenth of memory on a pool of a few GiB, writers found the pool full while a sync ran and
    /// each synced again in turn (docs/bench/peers-notes.md).
    pub(super) fn to_allocate(&self, allocator: &crate::alloc::Allocator) -> u64 {
        self.open
            + self.open_shape.metadata_bytes(allocator)
            + still_to_allocate(self.syncing, self.syncing_allocated_base, allocator)
    }

    /// What is dirty in memory, in the open and syncing txgs and written in place for the log:
    /// while any of it is, a sync may still free space.
    pub(super) fn in_memory(&self) -> u64 {
        self.open + self.syncing + self.prewritten
    }

    /// Dirty data written in place for the log.
    pub(super) fn prewritten(&self) -> u64 {
        self.prewritten
    }

    /// The open txg's part of [`InFlight::to_allocate`] that is its data.
    pub(super) fn open_data(&self) -> u64 {
        self.open - self.open_metadata
    }
}

/// What bounds the metadata one txg's sync allocates beside its data and indirect blocks
/// (ZFS counts the MOS's share of a txg against the slop; sluice counts it per txg).
#[derive(Clone, Copy, Debug)]
pub(super) struct SyncShape {
    /// Blocks the sync writes (data and indirect): each allocation splits at most one free
    /// range, and each block it replaces is one deferred free per copy.
    pub(super) blocks: u64,
    /// Known extra allocations of administrative changes (`State::pending_metadata_bytes`),
    /// and the frees they make (`State::pending_frees`).
    pub(super) pending: u64,
    pub(super) pending_frees: u64,
    /// Metadata copies (ditto blocks) and the allocation unit.
    pub(super) copies: u64,
    pub(super) unit: u64,
    /// What a metadata block of [`crate::alloc::METADATA_BLOCK_BYTES_MAX`] allocates at most
    /// (more than its size where a data vdev is RAID-Z).
    pub(super) metadata_asize: u64,
    /// The last directory's bytes, and the volumes whose dead lists the sync appends to.
    pub(super) directory_bytes: u64,
    pub(super) volumes: u64,
}

/// Allocations and frees a sync makes beyond its blocks' own: space-map pieces, the
/// directory, dead-list pieces, the old maps and directory freed.
const SYNC_METADATA_SLACK: u64 = 64;
/// What the directory may grow by in one txg besides its space-map pointers (a snapshot
/// created or destroyed, a scan's record, a volume made).
const DIRECTORY_GROWTH_BYTES: u64 = 16 << 10;

impl SyncShape {
    /// The open txg's shape; `appending` volumes append to a dead list in its sync
    /// (`Datasets::appending_deadlists`, dataset.rs).
    pub(super) fn of_open(appending: u64, txg: &TxgState, pool: &crate::pool::Pool) -> SyncShape {
        let indirect = txg.dirty_metadata_bytes / crate::objset::INDIRECT_BYTES as u64;
        SyncShape {
            blocks: txg.dirty_blocks + indirect,
            pending: txg.pending_metadata_bytes,
            pending_frees: txg.pending_frees,
            copies: pool.metadata_copies() as u64,
            unit: 1 << pool.ashift(),
            metadata_asize: pool.asize_max(crate::alloc::METADATA_BLOCK_BYTES_MAX),
            directory_bytes: txg.directory_bytes,
            volumes: appending,
        }
    }

    /// At most what the sync allocates for the pool's own metadata: every vdev's space map
    /// (its free ranges and deferred frees now, each allocation of the sync splitting a range
    /// and each replaced copy adding a deferred free, plus the spare piece), the directory in
    /// one copy more than other metadata, the dead-list entries of every replaced block (and
    /// each volume's last piece rewritten), and `pending`.
    pub(super) fn metadata_bytes(&self, allocator: &crate::alloc::Allocator) -> u64 {
        use super::space_map::{pieces_bound, SPACE_MAP_PIECE_BYTES};
        let block = crate::alloc::METADATA_BLOCK_BYTES_MAX;
        // Dead-list pieces: the replaced blocks' entries, and each volume's last piece
        // rewritten (it may hold up to a piece's worth already, and rounds up on its own).
        let deadlist_pieces =
            (self.blocks.div_ceil(super::dsl_deadlist::PIECE_ENTRIES_WRITTEN as u64))
                + 2 * self.volumes;
        // Each allocation splits at most one free range; each replaced or freed copy is one
        // deferred free; the old maps and directory are freed too.
        let allocations = self
            .blocks
            .saturating_add(deadlist_pieces * self.copies)
            .saturating_add(self.pending / block * self.copies)
            .saturating_add(SYNC_METADATA_SLACK);
        let frees = self
            .blocks
            .saturating_mul(self.copies)
            .saturating_add(self.pending_frees)
            .saturating_add(SYNC_METADATA_SLACK);
        let pieces: u64 = (0..allocator.vdev_count() as u32)
            .map(|vdev| {
                let (free, deferred) = allocator.space_map_entries_bound(vdev);
                let free = (free as u64).saturating_add(allocations);
                pieces_bound(free, (deferred as u64).saturating_add(frees)) + 1
            })
            .sum();
        // Blocks of up to `block` bytes as what they allocate: on RAID-Z, whole such blocks
        // with their parity and padding (an allocation of a block's size never costs more
        // than the sum of its parts').
        let allocated = |bytes: u64| {
            if self.metadata_asize == block {
                bytes.next_multiple_of(self.unit)
            } else {
                bytes.div_ceil(block) * self.metadata_asize
            }
        };
        let maps = pieces * allocated(SPACE_MAP_PIECE_BYTES) * self.copies;
        // The directory names every space-map piece and dead-list piece.
        let pending_pieces = self.pending / block * self.copies;
        let directory = allocated(
            self.directory_bytes
                + (pieces + deadlist_pieces + pending_pieces) * sluice_format::BLKPTR_BYTES as u64
                + DIRECTORY_GROWTH_BYTES,
        ) * (self.copies + 1).min(sluice_format::DVAS_MAX as u64);
        let deadlists = deadlist_pieces * allocated(block) * self.copies;
        maps + directory + deadlists + self.pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The write delay is zero below the threshold, grows monotonically towards the maximum,
    /// and is capped.
    #[test]
    pub(super) fn delay_curve() {
        let limits =
            TxgLimits::from_tunables(&Tunables::with([("txg.dirty_max", "100M")]).unwrap(), None);
        let max = limits.dirty_max;
        assert_eq!(limits.delay(limits.delay_min, max), std::time::Duration::ZERO);
        let mut last = std::time::Duration::ZERO;
        for step in 1..100u64 {
            let dirty = limits.delay_min + (limits.dirty_max - limits.delay_min) * step / 100;
            let delay = limits.delay(dirty, max);
            assert!(delay >= last && delay <= DELAY_MAX, "delay at {dirty}: {delay:?}");
            last = delay;
        }
        assert!(last > DELAY_SCALE);
    }
}
