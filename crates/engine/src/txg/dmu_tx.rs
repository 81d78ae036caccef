//! Admission of writes into the open txg: the free-space check and the write throttle (ZFS:
//! `dmu_tx_assign`, `dmu_tx_delay`, `dsl_pool_need_dirty_delay`).
//!
//! Above `txg.delay_min_dirty_pct` of `txg.dirty_max` each write is delayed by
//! `DELAY_SCALE * (dirty - min) / (max - dirty)`, which grows smoothly towards the maximum
//! instead of stalling writers at a cliff; at the maximum a writer waits for a sync. Unlike
//! ZFS, both fall only on volumes that hold at least an equal share of the dirty data: a
//! database's small sync writes are not slowed because another volume streams (measured in
//! docs/design.md). The others go undelayed and may pass the maximum by a reserve of an eighth
//! of it, so dirty memory stays bounded at 9/8 of `txg.dirty_max`.

use super::{Dataset, Store, StoreError};
use crate::intent_log::CommitPolicy;
use crate::tunables::{Tunable, Tunables};
use std::sync::atomic::Ordering;

/// How much may be dirty and how often txgs sync.
#[derive(Clone, Copy, Debug)]
pub(super) struct TxgLimits {
    pub(super) timeout: std::time::Duration,
    pub(super) dirty_max: u64,
    pub(super) delay_min: u64,
    pub(super) log_policy: CommitPolicy,
    pub(super) commit_timeout_pct: u64,
    pub(super) early_commit: bool,
    pub(super) log_block_bytes_max: u32,
    /// Writes at least this large are logged by pointer (0: never).
    pub(super) immediate_write_bytes: u64,
    pub(super) request_threads: usize,
}

/// Delay of a write when dirty data is halfway between the delay threshold and the maximum
/// (ZFS: zfs_delay_scale).
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
            log_policy: CommitPolicy::from_tunables(tunables),
            commit_timeout_pct: tunables.get(Tunable::IntentLogCommitTimeoutPct),
            early_commit: tunables.choice(Tunable::IntentLogEarlyCommit) == "auto",
            immediate_write_bytes: tunables.get(Tunable::IntentLogImmediateWriteBytes),
            log_block_bytes_max: u32::try_from(tunables.get(Tunable::IntentLogBlockBytesMax))
                .unwrap_or(128 << 10),
            request_threads: usize::try_from(tunables.get(Tunable::VolumeRequestThreads))
                .unwrap_or(0),
        }
    }

    /// How long a writer waits with `dirty` bytes dirty.
    pub(super) fn delay(&self, dirty: u64) -> std::time::Duration {
        if dirty <= self.delay_min || dirty >= self.dirty_max {
            return std::time::Duration::ZERO;
        }
        let over = (dirty - self.delay_min) as f64;
        let room = (self.dirty_max - dirty) as f64;
        DELAY_SCALE.mul_f64(over / room).min(DELAY_MAX)
    }
}

impl Store {
    /// Wakes the syncer to start a txg sync now rather than at `txg.timeout_ms`: a quarter of
    /// `txg.dirty_max` is dirty, or the intent log is filling its region.
    pub(super) fn kick_sync(&self) {
        if let Some(kick) = self.kick.lock().as_mut() {
            // A full channel means a kick is already pending; that is enough.
            let _ = kick.try_send(());
        }
    }

    /// Admits a write of `len` bytes to `dataset` into the open txg (ZFS: `dmu_tx_assign`):
    /// with `check_space`, refuses what could not be synced, then applies the throttle.
    pub(super) async fn assign(
        &self,
        dataset: &Dataset,
        len: u64,
        check_space: bool,
    ) -> Result<(), StoreError> {
        // Refuse what could not be synced: new dirty data beyond the free space above the slop,
        // after what the open and syncing txgs will allocate (their data and an estimate of
        // their indirect blocks; counting data alone let random 4 KiB overwrites of a nearly
        // full pool spend the slop on indirect blocks and fail a sync). Space that is only in
        // flight (dirty data about to replace old blocks, frees waiting out their deferral)
        // comes back as txgs sync: wait for it, as ZFS does, before saying no. After the
        // deferral window has passed, what is still missing is missing. The indirect blocks
        // need whole free ranges of their size, which a pool full of 4 KiB holes lacks even
        // with bytes to spare, so their estimate is also checked against the free space in
        // ranges that can hold them, less part of the slop (space maps, the directory).
        //
        // Space other volumes have reserved and not used is not there to take. A thick volume
        // (one with a reservation) may go into the slop down to a quarter of it: overwriting
        // its blocks needs new space before the old comes back, and without this a pool that
        // thin volumes filled would refuse the writes it promised (ZFS keeps its slop for the
        // same kind of need).
        if check_space {
            let (dedup, thick) = {
                let volume = dataset.state.lock();
                (
                    volume.entry.dedup != sluice_format::DedupMode::Off,
                    volume.entry.reservation_bytes > 0,
                )
            };
            let mut waited = 0;
            loop {
                // One lock at a time: the lock order is state -> allocator.
                let (dirty, in_memory, metadata, reserved) = {
                    let state = self.state.lock();
                    let metadata = state.dirty_metadata_bytes + state.syncing_metadata_bytes;
                    let reserved: u64 = (state.volumes.values())
                        .filter(|d| d.id != dataset.id)
                        .map(|d| d.unused_reservation())
                        .sum();
                    let dirty = state.dirty_to_allocate()
                        + state.dirty_metadata_bytes
                        + state.syncing_bytes;
                    // Blocks written in place need no new space, but a sync still frees the
                    // versions they replaced: while any are dirty, waiting can help.
                    let in_memory = dirty + state.prewritten_bytes;
                    (dirty, in_memory, metadata, reserved)
                };
                // Room a sync needs to rewrite the dedup table, kept beyond the slop (taken
                // before the allocator: the lock order is dedup table -> allocator).
                let unit = 1u64 << self.pool.ashift();
                let new_entries = if dedup { dirty.saturating_add(len) / unit } else { 0 };
                let ddt_reserve = self.ddt.rewrite_reserve_bytes(unit, new_entries);
                let (usable, room, deferred) = {
                    let allocator = self.allocator.lock();
                    let slop = allocator.slop_bytes();
                    let kept = if thick { slop / 4 } else { slop };
                    let usable =
                        allocator.free_bytes().saturating_sub(kept + ddt_reserve + reserved);
                    let room =
                        allocator.metadata_room_bytes().saturating_sub(slop / 4 + ddt_reserve);
                    (usable, room, allocator.deferred_bytes())
                };
                if dirty.saturating_add(len) <= usable && metadata <= room {
                    break;
                }
                if waited > crate::alloc::FREE_DEFER_TXGS || (in_memory == 0 && deferred == 0) {
                    return Err(StoreError::NoSpace {
                        pool: self.pool.name().to_owned(),
                        requested_bytes: len,
                    });
                }
                self.sync().await?;
                waited += 1;
            }
        }
        self.throttle(dataset).await
    }

    /// Applies backpressure before a write to `volume`: wake the syncer early, delay smoothly
    /// above the threshold, and at the maximum sync before continuing. Volumes holding less
    /// than an equal share of the dirty data skip the delay and may use a reserve past the
    /// maximum (an eighth of it); past that they wait too.
    pub(super) async fn throttle(&self, dataset: &Dataset) -> Result<(), StoreError> {
        let (dirty, under_share) = {
            let state = self.state.lock();
            let mine = dataset.dirty_bytes.load(Ordering::Relaxed);
            // The writer's volume counts even before its first dirty block.
            let dirtying = state
                .volumes
                .values()
                .filter(|d| d.id == dataset.id || d.dirty_bytes.load(Ordering::Relaxed) > 0)
                .count() as u64;
            (state.dirty_bytes, dirtying > 1 && mine.saturating_mul(dirtying) < state.dirty_bytes)
        };
        if dirty >= self.limits.dirty_max / 4 {
            self.kick_sync();
        }
        let stats = &self.throttle_stats;
        let since = |start: crate::rt::Time| {
            u64::try_from(self.pool.env().now().since(start).as_nanos()).unwrap_or(u64::MAX)
        };
        // A volume that is not filling the budget may go into a reserve past the maximum (an
        // eighth of it), so another volume's stream does not stall it behind a whole sync.
        let limit = if under_share {
            self.limits.dirty_max + self.limits.dirty_max / 8
        } else {
            self.limits.dirty_max
        };
        if under_share && dirty >= self.limits.dirty_max && dirty < limit {
            stats.spared.inc();
            return Ok(());
        }
        if dirty >= limit {
            // Every writer that finds the maximum waits for a sync, but one sync is enough for
            // all of them: whoever gets the lock after it finds the dirty data gone and goes
            // on. (Each syncing in turn made a storm of empty syncs that serialized writers.)
            let start = self.pool.env().now();
            let one_at_a_time = self.sync_lock.lock().await;
            let result = if self.state.lock().dirty_bytes >= limit {
                self.sync_holding_lock(one_at_a_time).await.map(drop)
            } else {
                Ok(())
            };
            stats.waited_for_sync.inc();
            stats.waited_nanos.add(since(start));
            return result;
        }
        let delay = self.limits.delay(dirty);
        if under_share && !delay.is_zero() {
            stats.spared.inc();
        } else if !delay.is_zero() {
            let start = self.pool.env().now();
            self.pool.env().sleep(delay).await;
            stats.delayed.inc();
            stats.delayed_nanos.add(since(start));
        }
        Ok(())
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
        assert_eq!(limits.delay(limits.delay_min), std::time::Duration::ZERO);
        let mut last = std::time::Duration::ZERO;
        for step in 1..100u64 {
            let dirty = limits.delay_min + (limits.dirty_max - limits.delay_min) * step / 100;
            let delay = limits.delay(dirty);
            assert!(delay >= last && delay <= DELAY_MAX, "delay at {dirty}: {delay:?}");
            last = delay;
        }
        assert!(last > DELAY_SCALE);
    }
}
