//! Admission of writes into the open txg: the free-space check and the write throttle (ZFS:
//! `dmu_tx_assign`, `dmu_tx_delay`, `dsl_pool_need_dirty_delay`).
//!
//! Above `txg.delay_min_dirty_pct` of `txg.dirty_max` each write is delayed by
//! `DELAY_SCALE * (dirty - min) / (max - dirty)`, which grows smoothly towards the maximum
//! instead of stalling writers at a cliff; at the maximum a writer waits for a sync. As in
//! ZFS, delayed writes wake at least a delay apart, so the curve sets the pool's write rate
//! however many clients write (`txg.delay_spacing`). Unlike
//! ZFS, both fall only on volumes that hold at least an equal share of the dirty data: a
//! database's small sync writes are not slowed because another volume streams (measured in
//! docs/design.md). The others go undelayed and may pass the maximum by a reserve of an eighth
//! of it, so dirty memory stays bounded at 9/8 of `txg.dirty_max`.
//!
//! Where the pool's free space holds less dirty data than `txg.dirty_max` (a tenth of memory
//! against a pool of a few GiB), the start of a sync and the delay follow that smaller figure
//! instead ([`Admission::throttle`]'s `space_max`), so writers slow down before the space check
//! would stop them for a whole sync.

use super::dataset::{Dataset, Dsl};
use super::dsl_pool::{InFlight, Txg};
use super::spa::Spa;
use super::spa_sync::SyncHandle;
use super::StoreError;
use crate::alloc::SlopTier;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// A write of at least this many bytes and more than one block is a large one: its blocks
/// form a span the sync wants to place in one free range ([`Admission::throttle`]).
const LARGE_WRITE_BYTES: u64 = 128 << 10;
/// For large writes the throttle takes this fraction (1 / 2^2) of the room the pool's free
/// space leaves the open txg as its maximum: they are delayed towards it and start the sync
/// at a quarter of it. A txg that takes most of the free space takes its small holes too: on
/// a pool whose free space random writes had cut into 16 KiB holes, a 1 MiB stream's txgs grew
/// to most of the free space, its spans went out as 11-21 device writes per MiB, the syncs
/// slowed, and the next txgs grew as large; the layout kept itself (docs/bench/peers-notes.md,
/// 2026-11-30 19:00Z). Held to a quarter, the txgs leave the small holes alone to merge with
/// the blocks freed beside them, and within seconds the stream's spans went out as one write
/// each, at 1.7-2.5x the MiB/s. Small writes keep the whole room: their blocks lie apart
/// whatever the txg's size, and a quarter cost 4 KiB writes 5-10% (indirect blocks rewritten
/// more often).
const LARGE_WRITE_ROOM_SHIFT: u32 = 2;
/// ... but never below this (or all the room, where there is less): on a nearly full pool a
/// quarter of the room can be a write or two, and every large write would then wait the
/// longest delay instead of slowing down along the curve.
const LARGE_WRITE_ROOM_MIN: u64 = 16 << 20;

/// Space a write was admitted for ([`Admission::assign`]), counted by every later space check
/// until the write's blocks are in the open txg's dirty figures ([`Admitted::landed`], under
/// the txg lock) or the write fails (dropped).
#[must_use = "the admitted space stays counted until the write lands or fails"]
pub(super) struct Admitted<'a> {
    spa: &'a Spa,
    bytes: u64,
}

impl Admitted<'_> {
    /// The write's blocks are dirty in the open txg: called with the txg lock held, so that a
    /// space check (which reads both under that lock) counts them once.
    pub(super) fn landed(self) {
        drop(self);
    }
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.spa.allocator().lock().unadmit(self.bytes);
        }
    }
}

/// The writers of one kind (thick or thin volumes) waiting for space, served in turn (ZFS
/// waits on the txg in `dmu_tx_wait` instead, and a writer may lose the space that comes back
/// to others over and over). While a writer waits, later writers of its kind queue behind it
/// even when they would fit, so the space each sync gives back goes to the writer that has
/// waited longest, and that writer counts syncs towards a refusal only at the head of the
/// line. Without it a thick volume's write that lost the race at every sync was refused
/// after `FREE_DEFER_TXGS + 2` syncs with the space it was promised. Thick and thin volumes
/// queue apart: a thin volume's writes waiting to be refused do not hold up a thick one's,
/// which may use more of the slop.
#[derive(Debug, Default)]
pub(super) struct SpaceLine {
    /// Writers in the line, the head included.
    waiting: AtomicUsize,
    head: futures::lock::Mutex<()>,
    /// Tickets handed out: each writer that joins takes the next.
    tickets: AtomicU64,
    /// The last refusal of a head: the sync count it saw, and the last ticket handed out then.
    refused: parking_lot::Mutex<Option<(u64, u64)>>,
}

impl SpaceLine {
    /// Whether a head holding `ticket` that saw `syncs` finds what the last refused head
    /// found: it joined before that refusal and no sync has run since. Writers that join later
    /// look for themselves (a trim may have freed space meanwhile).
    fn refused_with(&self, ticket: u64, syncs: u64) -> bool {
        self.refused.lock().is_some_and(|(at, last)| at == syncs && ticket <= last)
    }

    fn refused(&self, syncs: u64) {
        *self.refused.lock() = Some((syncs, self.tickets.load(Ordering::Acquire)));
    }

    pub(super) fn is_waiting(&self) -> bool {
        self.waiting.load(Ordering::Acquire) > 0
    }

    /// Joins the line and waits to be its head.
    async fn join(&self) -> InLine<'_> {
        self.waiting.fetch_add(1, Ordering::AcqRel);
        let leave = Leave(&self.waiting);
        let ticket = self.tickets.fetch_add(1, Ordering::AcqRel) + 1;
        let head = self.head.lock().await;
        InLine { ticket, _head: head, _leave: leave }
    }
}

/// A place at the head of a [`SpaceLine`]; leaving it lets the next writer in.
struct InLine<'a> {
    ticket: u64,
    _head: futures::lock::MutexGuard<'a, ()>,
    _leave: Leave<'a>,
}

/// Counts a writer out of its line however it leaves (admitted, refused, or its request
/// dropped while it waited).
struct Leave<'a>(&'a AtomicUsize);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What one admission weighed ([`Admission::weigh`]).
struct Weighed {
    /// What the syncs will allocate, admitted writes included.
    dirty: u64,
    /// The free space whole blocks can use, less what is kept and set aside.
    usable: u64,
    /// Frees waiting out their deferral.
    deferred: u64,
    /// Blocks written in place that a sync will link (and free what they replace).
    in_memory: u64,
    /// Writes admitted and not yet in the open txg.
    admitted: u64,
    figures: InFlight,
    /// Whether the write was admitted.
    fitted: bool,
}

/// A write's admission into the open txg (ZFS: a `dmu_tx` being assigned): what it is
/// weighed against (the pool's free space, what volumes have reserved, the open and syncing
/// txgs' dirty data) and the syncs it may wait for. It changes none of them but the
/// allocator's promise and set-aside figures and the throttle's figures.
#[derive(Clone, Copy)]
pub(super) struct Admission<'a> {
    pub(super) spa: &'a Spa,
    pub(super) dsl: &'a Dsl,
    pub(super) txg: &'a Txg,
    pub(super) sync: SyncHandle<'a>,
}

impl Admission<'_> {
    /// Admits a write of `len` bytes to `dataset` into the open txg (ZFS: `dmu_tx_assign`):
    /// with `check_space`, refuses what could not be synced, then applies the throttle. `len`
    /// is what the write's blocks take whole: the txg counts a partial block as a whole one.
    /// The space stays counted until the returned [`Admitted`] ends.
    pub(super) async fn assign(
        &self,
        dataset: &Dataset,
        len: u64,
        check_space: bool,
    ) -> Result<Admitted<'_>, StoreError> {
        // What the throttle's delay counts from: a write that waited in a space line as long
        // as its delay has had it (ZFS: `tx_start`).
        let start = self.spa.pool().env().now();
        // Refuse what could not be synced: new dirty data beyond the free space above the slop,
        // after what the open and syncing txgs will allocate (their data and an estimate of
        // their indirect blocks; counting data alone let random 4 KiB overwrites of a nearly
        // full pool spend the slop on indirect blocks and fail a sync). Space that is only in
        // flight (dirty data about to replace old blocks, frees waiting out their deferral)
        // comes back as txgs sync: wait for it, as ZFS does, before saying no. After the
        // deferral window has passed, what is still missing is missing. Blocks need whole
        // free ranges of their size, which a pool full of 4 KiB holes lacks even with bytes
        // to spare, so the free space counted is what whole blocks can use of it.
        //
        // Space other volumes have reserved and not used is not there to take. A thick volume
        // (one with a reservation) may go into the slop down to a quarter of it: overwriting
        // its blocks needs new space before the old comes back, and without this a pool that
        // thin volumes filled would refuse the writes it promised (ZFS keeps its slop for the
        // same kind of need).
        if check_space {
            let (dedup, thick, block_bytes) = {
                let volume = dataset.state.lock();
                (
                    volume.entry.dedup != sluice_format::DedupMode::Off,
                    volume.entry.reservation_bytes > 0,
                    u64::from(volume.entry.block_bytes),
                )
            };
            // Of more than one block and at least `LARGE_WRITE_BYTES`, as the client sent it.
            let large = len >= LARGE_WRITE_BYTES && len > block_bytes;
            // The write as the space its blocks allocate (parity and padding on RAID-Z).
            let len = self.spa.pool().inflate(len, block_bytes);
            let line = self.txg.space_line(thick, block_bytes);
            // Held from when this writer finds the space short until it is admitted or
            // refused; joined at once while another writer holds it.
            let mut in_line = None;
            // When it joined: a write that waited for space counts once, with its whole wait.
            let mut joined = None;
            // The syncs counted when the space was first found short at the head of the line.
            let mut short_since = None;
            let space_max = loop {
                if in_line.is_none() && line.is_waiting() {
                    joined = Some(self.spa.pool().env().now());
                    in_line = Some(line.join().await);
                }
                // A sync that ends after this is one to wait for, not to follow with another.
                let seen = self.sync.syncs();
                let weighed = self.weigh(dataset, len, (dedup, thick, block_bytes), |fit| {
                    fit.dirty.saturating_add(len) <= fit.usable
                });
                let Weighed { dirty, usable, deferred, in_memory, admitted, figures, fitted } =
                    weighed;
                if fitted {
                    // The most the open txg's dirty data may grow to before writers meet the
                    // wall, on the throttle's measure (which counts blocks written in place):
                    // its maximum where it is below `txg.dirty_max`.
                    let open_data = figures.open_data();
                    break usable.saturating_sub(dirty - open_data) + figures.prewritten();
                }
                // Short: into the line, and look again once at its head (syncs ran meanwhile).
                if in_line.is_none() {
                    joined = Some(self.spa.pool().env().now());
                    in_line = Some(line.join().await);
                    continue;
                }
                // Space freed in the txg open when it was first found short is back once that
                // txg and `FREE_DEFER_TXGS` more have synced, whoever ran the syncs; one more
                // allows for a sync that was already running then. After that, what is
                // missing is missing: at the head of the line, no writer of this kind took
                // what came back meanwhile.
                // A head that joined before the last refusal, with no sync since, finds what
                // that head found: the writers queued behind a refusal are refused together,
                // not after a window each. Later arrivals look for themselves (a trim, say,
                // may have freed space since; its frees come back after syncs).
                let first = *short_since.get_or_insert(seen);
                let synced = self.sync.syncs().saturating_sub(first);
                let nothing_to_wait_for = in_memory == 0 && deferred == 0 && admitted == 0;
                if synced >= crate::alloc::FREE_DEFER_TXGS + 2
                    || nothing_to_wait_for
                    || in_line.as_ref().is_some_and(|l| line.refused_with(l.ticket, seen))
                {
                    line.refused(seen);
                    self.count_space_wait(joined);
                    return Err(StoreError::NoSpace {
                        pool: self.spa.pool().name().to_owned(),
                        volume: dataset.name(),
                        requested_bytes: len,
                        snapshots_bytes: self.dsl.snapshots_bytes(),
                    });
                }
                self.sync.sync_unless(|| self.sync.syncs() != seen).await?;
            };
            let admitted = Admitted { spa: self.spa, bytes: len };
            drop(in_line);
            self.count_space_wait(joined);
            self.throttle(dataset, start, Some(space_max), large).await?;
            return Ok(admitted);
        }
        self.throttle(dataset, start, None, false).await?;
        Ok(Admitted { spa: self.spa, bytes: 0 })
    }

    /// Admits, without waiting, `len` bytes of blocks a read rewrites into `dataset`
    /// (dmu_rewrite.rs), or says no: only while no writer of any kind waits for space and
    /// the pool's free space leaves at least twice the room, so a rewrite never takes space a
    /// client's write would have had.
    pub(super) fn try_admit_rewrite(&self, dataset: &Dataset, len: u64) -> Option<Admitted<'_>> {
        let (thick, block_bytes) = {
            let volume = dataset.state.lock();
            (volume.entry.reservation_bytes > 0, u64::from(volume.entry.block_bytes))
        };
        let len = self.spa.pool().inflate(len, block_bytes);
        if self.txg.anyone_waits_for_space() {
            return None;
        }
        // A volume with dedup on rewrites nothing (dmu_rewrite.rs), so its table's growth is
        // not weighed.
        let weighed = self.weigh(dataset, len, (false, thick, block_bytes), |fit| {
            fit.dirty.saturating_add(len).saturating_mul(2) <= fit.usable
        });
        // Built only when admitted: a dropped `Admitted` gives its bytes back.
        if weighed.fitted {
            Some(Admitted { spa: self.spa, bytes: len })
        } else {
            None
        }
    }

    /// The figures one admission of `len` bytes to `dataset` weighs (`kind`: whether the
    /// volume dedups, whether it is thick, its block size), read under the namespace's, the
    /// txg's and the allocator's locks; admits `len` (promising what the syncs will allocate)
    /// if `fits` says it fits.
    fn weigh(
        &self,
        dataset: &Dataset,
        len: u64,
        (dedup, thick, block_bytes): (bool, bool, u64),
        fits: impl FnOnce(&Weighed) -> bool,
    ) -> Weighed {
        // Room a sync needs to rewrite the dedup table, kept beyond the slop: taken
        // first, apart from the figures below (the lock order is dedup table ->
        // allocator), from the open and syncing txgs' data as they are now.
        let unit = 1u64 << self.spa.pool().ashift();
        let new_entries = if dedup {
            let txg = self.txg.lock();
            let upper = txg.dirty_to_allocate() + txg.metadata_to_allocate() + txg.syncing_bytes();
            upper.saturating_add(len) / unit
        } else {
            0
        };
        // At what its blocks allocate (parity and padding on RAID-Z).
        let ddt_reserve =
            self.spa.pool().inflate(self.spa.ddt().rewrite_reserve_bytes(unit, new_entries), unit);
        // The txg's figures and the allocator's read and changed under one hold of
        // both locks (the order is dsl -> txg -> allocator): a write's blocks land in
        // the txg and leave the admitted count under the txg lock, so the two never
        // both miss it nor both count it.
        let dsl = self.dsl.read();
        let txg = self.txg.lock();
        let (mut reserved, mut own_reserved) = (0u64, 0u64);
        for d in dsl.values() {
            if d.id == dataset.id {
                own_reserved += d.unused_reservation();
            } else {
                reserved += d.unused_reservation();
            }
        }
        let figures = InFlight::of(dsl.appending_deadlists(), &txg, self.spa.pool());
        // Blocks written in place need no new space, but a sync still frees the
        // versions they replaced: while any are dirty, waiting can help.
        let in_memory = figures.in_memory();
        let mut allocator = self.spa.allocator().lock();
        // What the syncs will allocate, and what writes admitted before this one
        // will add to the open txg once the throttle lets them in.
        let to_allocate = figures.to_allocate(&allocator);
        let admitted = allocator.admitted_bytes();
        let dirty = to_allocate + admitted;
        let tier = if thick { SlopTier::Thick } else { SlopTier::Normal };
        let kept = tier.kept(allocator.slop_bytes());
        // Data blocks, too, are counted against the free space each free range
        // has in whole blocks of the volume's block size (`room_bytes_for`), not
        // against all free bytes: a block that does not compress needs a range of
        // its size (there are no gang blocks), and the holes left by blocks that
        // did compress, or at the ends of ranges, do not hold it. Counted in bytes,
        // 1 MiB overwrites of a thick volume admitted more than the sync could place,
        // and it failed with 69 MB free but no 16 KiB range left (peers run,
        // 2026-11-27); counted in 16 KiB blocks for every volume, a volume of 128 KiB
        // blocks did the same with 198 MB free in 16 KiB holes (bench/raidz.py,
        // 2026-11-29). Each block placed at the end of a range takes at most a block
        // of this; a run that starts inside a range loses up to a block more before
        // it, which the kept slop absorbs, as it does smaller blocks of other
        // volumes placed in ranges counted for larger ones.
        let usable =
            allocator.room_bytes_for(block_bytes).saturating_sub(kept + ddt_reserve + reserved);
        // Intent-log blocks leave alone what volumes have set aside, the dedup
        // table's rewrite room, and what the syncs will allocate (admitted writes
        // included, `Allocator::promised_bytes`).
        allocator.set_aside(reserved + own_reserved + ddt_reserve);
        let mut weighed = Weighed {
            dirty,
            usable,
            deferred: allocator.deferred_bytes(),
            in_memory,
            admitted,
            figures,
            fitted: false,
        };
        if fits(&weighed) {
            allocator.promise(to_allocate);
            allocator.admit(len);
            weighed.fitted = true;
        }
        weighed
    }

    /// Counts a write that waited for space since `joined` (its line), if it did.
    fn count_space_wait(&self, joined: Option<crate::rt::Time>) {
        if let Some(joined) = joined {
            let stats = self.txg.throttle_stats();
            let waited = self.spa.pool().env().now().since(joined).as_nanos();
            stats.waited_for_space.inc();
            stats.waited_for_space_nanos.add(u64::try_from(waited).unwrap_or(u64::MAX));
        }
    }

    /// Applies backpressure before a write to `volume`: wake the syncer early, delay smoothly
    /// above the threshold, and at the maximum sync before continuing. Volumes holding less
    /// than an equal share of the dirty data skip the delay and may use a reserve past the
    /// maximum (an eighth of it); past that they wait too.
    ///
    /// `space_max` is about the most the open txg's dirty data can reach before the pool's
    /// free space refuses writes (the dedup table's reserve, which grows with the data, can
    /// refuse a little sooner). Where it is below `txg.dirty_max` the sync starts and the
    /// delay rises by it instead: a tenth of memory can be more than a pool of a few GiB holds
    /// beside the syncing txg and two txgs of deferred frees, and writers then stopped at the
    /// space check for a whole sync each (2-4 s measured) instead of slowing down smoothly.
    /// Writers still wait for a sync only at the space check itself or at `txg.dirty_max`.
    ///
    /// For a `large` write (`LARGE_WRITE_BYTES` or more, of several blocks) the maximum is a
    /// quarter of `space_max` (`LARGE_WRITE_ROOM_SHIFT`, at least `LARGE_WRITE_ROOM_MIN`).
    ///
    /// The delay counts from `start`, when the write asked to be admitted, and delayed writes
    /// wake a delay apart ([`super::dsl_pool::Txg::delay_wakeup`]); those that sleep alone
    /// (large writes, and any at the maximum) wake early if the txg they fill quiesces.
    pub(super) async fn throttle(
        &self,
        dataset: &Dataset,
        start: crate::rt::Time,
        space_max: Option<u64>,
        large: bool,
    ) -> Result<(), StoreError> {
        let (dirty, open_txg, under_share) = {
            // The writer's volume counts even before its first dirty block. Read apart from
            // the total: the share is a heuristic, and a volume made or gone between the two
            // reads changes it by one volume's share at most.
            let dirtying = self
                .dsl
                .read()
                .values()
                .filter(|d| d.id == dataset.id || d.dirty_bytes.load(Ordering::Relaxed) > 0)
                .count() as u64;
            let (total, open_txg) = {
                let txg = self.txg.lock();
                (txg.dirty_bytes(), txg.open_txg())
            };
            let mine = dataset.dirty_bytes.load(Ordering::Relaxed);
            (total, open_txg, dirtying > 1 && mine.saturating_mul(dirtying) < total)
        };
        let limits = self.txg.limits();
        // A large write's share of the room is a quarter of it (`LARGE_WRITE_ROOM_SHIFT`).
        let room = |room: u64| {
            if large {
                room.min((room >> LARGE_WRITE_ROOM_SHIFT).max(LARGE_WRITE_ROOM_MIN))
            } else {
                room
            }
        };
        let max = space_max.map_or(limits.dirty_max, |r| room(r).min(limits.dirty_max));
        if dirty >= max / 4 {
            self.sync.kick();
        }
        let stats = self.txg.throttle_stats();
        let since = |start: crate::rt::Time| {
            u64::try_from(self.spa.pool().env().now().since(start).as_nanos()).unwrap_or(u64::MAX)
        };
        // A volume that is not filling the budget may go into a reserve past the maximum (an
        // eighth of it), so another volume's stream does not stall it behind a whole sync.
        let limit =
            if under_share { limits.dirty_max + limits.dirty_max / 8 } else { limits.dirty_max };
        if under_share && dirty >= limits.dirty_max && dirty < limit {
            stats.spared.inc();
            return Ok(());
        }
        if dirty >= limit {
            // Every writer that finds the maximum waits for a sync, but one sync is enough for
            // all of them: whoever gets the lock after it finds the dirty data gone and goes
            // on. (Each syncing in turn made a storm of empty syncs that serialized writers.)
            let start = self.spa.pool().env().now();
            let result = self.sync.sync_unless(|| self.txg.lock().dirty_bytes() < limit).await;
            stats.waited_for_sync.inc();
            stats.waited_nanos.add(since(start));
            return result;
        }
        let delay = limits.delay(dirty, max);
        if under_share && !delay.is_zero() {
            stats.spared.inc();
        } else if !delay.is_zero() {
            let env = self.spa.pool().env();
            let now = env.now();
            // At the maximum below `txg.dirty_max` (the free space's, or a large write's
            // quarter of the room) every writer sleeps the longest delay alone: spaced, the
            // 32nd of 32 writers would wake 3.2 s later, where a sync is what they wait for.
            // (Just below it they are spaced at nearly the longest delay, as in ZFS: the
            // curve's rate there is what lets the sync catch up.) A large write sleeps alone
            // too: its curve ends at its quarter of the room, so its delays are long where a
            // small write's are short, and spaced they would push the mark ahead of the small
            // writes behind it.
            let alone = large || dirty >= max;
            let wakeup = if !limits.delay_spaced || alone {
                Some(now.plus(delay))
            } else if now.since(start) >= delay {
                // It has waited that long already (for space, say), and takes no place in the
                // spacing (ZFS does the same).
                None
            } else {
                Some(self.txg.delay_wakeup(start, delay))
            };
            if let Some(wakeup) = wakeup {
                let sleep = env.sleep_until(wakeup);
                if alone {
                    // Those sleeping alone wait at most for the txg they fill to quiesce:
                    // once it has, the open txg is empty and the delay's reason gone. Slept
                    // out whatever the sync did, a stream's writers at the maximum woke up
                    // to 100 ms after the next txg had opened (ZFS too wakes writers past
                    // its maximum when dirty data falls: `dmu_tx_wait`).
                    let opened = self.txg.opened_after(open_txg);
                    futures::pin_mut!(opened);
                    if let futures::future::Either::Right(_) =
                        futures::future::select(sleep, opened).await
                    {
                        stats.woken_by_sync.inc();
                    }
                } else {
                    sleep.await;
                }
                stats.delayed.inc();
                stats.delayed_nanos.add(since(now));
            }
        }
        Ok(())
    }
}
