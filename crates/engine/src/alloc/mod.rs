//! Space allocation per top-level vdev, with deferred frees and a slop reserve
//! (ZFS: `metaslab.c`, `space_map.c`).
//!
//! Each top-level vdev's data area is a [`RangeTree`] of free space. Allocation is next-fit
//! from a per-vdev cursor (blocks written together land together, which keeps sequential
//! streams sequential on disk) in units of `1 << ashift`. A rotor moves to the next top-level
//! vdev every `ROTOR_ALIQUOT_BYTES`, which is how the pool stripes; a full vdev is skipped.
//! A vdev short of space (under `BEST_FIT_FREE_PCT` free, or no free range of
//! `BEST_FIT_LARGEST_BYTES`) switches to best fit, as ZFS's metaslab allocator does, so that
//! small blocks fill small holes and larger metadata blocks still find room.
//!
//! Frees are deferred: a block freed in txg T stays allocated until T has synced and
//! `FREE_DEFER_TXGS` more txgs have synced too. Until then the previous uberblocks (which an
//! import after a crash may fall back to) still reference it, so reusing it sooner could
//! overwrite the only copy of live data.
//!
//! A scrub or resilver reading the tree of synced txg T pins T ([`Allocator::pin`]): frees of
//! later txgs then stay deferred until the pin goes, so no block the scan may still read or
//! repair is handed out again while it works (a repair write would land on someone else's
//! data). Frees of T and earlier are of blocks that tree no longer holds.
//!
//! A slop reserve (1/32 of the space, at least `SLOP_BYTES_MIN`) is kept back from ordinary
//! allocations and open only to [`AllocClass::Reserved`] ones: txg sync metadata, log replay and
//! the bookkeeping of frees, so a full pool can still sync, import and free space.
//!
//! Intent-log blocks are allocated here too, but they live outside the txgs: the space maps
//! record them as free, and import claims the blocks it finds by walking each log chain
//! (ZFS: `zil_claim`). So a block allocated for a log that never reached the disk, or beyond
//! a torn tail, is free again after a crash instead of leaking. Log blocks come from log vdevs
//! (separate intent-log devices) when the pool has them, with their own cursor so consecutive
//! log blocks are consecutive on disk; ordinary allocations never use log vdevs.
//!
//! Each data vdev keeps a log region at the start of its data area ([`log_region_bytes`]: a
//! eighth of the area, at most 1 GiB), as OpenZFS keeps one metaslab per vdev for its
//! embedded log class. Log blocks are placed there first and data is placed after it (data
//! reaches it only once nothing after it fits, or once the vdev is short of space and best fit
//! takes the smallest range anywhere; log blocks then go elsewhere): pool creation
//! writes the region's bytes once (`BlockDevice::prepare_log_region`), so on a file leaf a log
//! write lands on extents the filesystem has already allocated and written, and its durable
//! write needs no extent allocation and no journal commit, only the data and a cache flush.
//!
//! Unlike ZFS, the whole free tree of a vdev is in memory (ZFS splits it into metaslabs loaded
//! on demand). That is simpler and fine up to millions of free fragments; metaslabs can come
//! later behind the same interface.

mod range_tree;

use std::collections::BTreeMap;

pub use range_tree::RangeTree;
use sluice_format::SpaceMap;

/// Txgs a free waits after its own txg has synced.
pub const FREE_DEFER_TXGS: u64 = 2;
/// Bytes written to one top-level vdev before the rotor moves on (ZFS's metaslab aliquot).
pub const ROTOR_ALIQUOT_BYTES: u64 = 1 << 20;
/// The largest block a sync writes for itself (indirect blocks, space-map pieces): free
/// ranges counted in whole blocks of this size are what its metadata can use, and what data
/// blocks of up to this size can use whatever they compress to ([`Allocator::room_bytes`]).
pub const METADATA_BLOCK_BYTES_MAX: u64 = 16 << 10;
/// Below this percentage of a vdev's space free, allocations take the smallest range that fits.
const BEST_FIT_FREE_PCT: u64 = 4;
/// ... and likewise once no free range of the vdev is this long.
const BEST_FIT_LARGEST_BYTES: u64 = 128 << 10;
/// Smallest slop reserve.
pub const SLOP_BYTES_MIN: u64 = 1 << 20;
/// Slop is this fraction of the pool (1 / 2^5, as ZFS's spa_slop_shift).
const SLOP_SHIFT: u32 = 5;
/// The largest log region of one vdev. What it must hold is the log blocks of about four
/// txgs (the open one, the syncing one, and two whose frees wait out their deferral); when
/// they fill three quarters of it the store starts a sync ([`Allocator::log_region_pressed`]),
/// which with txgs of a tenth of memory (`txg.dirty_max=auto`) can come before the dirty-data
/// or timer triggers under heavy small sync writes. A larger region costs a longer write at
/// pool creation.
pub const LOG_REGION_BYTES_MAX: u64 = 1 << 30;
/// Log regions smaller than this never ask for a sync ([`Allocator::log_region_pressed`]):
/// on a small test pool the log would sync the pool at every few blocks.
pub const LOG_REGION_PRESSURE_BYTES_MIN: u64 = 8 << 20;
/// The log region is this fraction of a data area (1 / 2^3). An eighth, not the sixteenth it
/// was before txgs grew to a tenth of memory: 8 clients of 4 KiB write + flush on a pool of
/// one 3 GiB file asked for a sync when the log filled the 192 MiB region a sixteenth made,
/// long before a quarter of the dirty maximum (docs/bench/peers-notes.md). Data uses the
/// region too once the rest of the vdev is full, so it costs no capacity.
const LOG_REGION_SHIFT: u32 = 3;

/// The log region of a data area of `area_bytes`: `[start, start + this)`, in whole MiB.
pub fn log_region_bytes(area_bytes: u64) -> u64 {
    (area_bytes >> LOG_REGION_SHIFT).min(LOG_REGION_BYTES_MAX) >> 20 << 20
}

/// Who is allocating: ordinary writes stop at the slop reserve, reserved work may use it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocClass {
    Normal,
    Reserved,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AllocError {
    #[error(
        "no space: {requested_bytes} bytes requested, {free_bytes} free of which {slop_bytes} \
         are reserved for pool metadata; free space by trimming or deleting data, or add a vdev"
    )]
    NoSpace { requested_bytes: u64, free_bytes: u64, slop_bytes: u64 },
    #[error("space map of vdev {vdev} is inconsistent: {reason}; the pool needs repair")]
    Corrupt { vdev: u32, reason: String },
}

/// Allocation state of one top-level vdev.
#[derive(Clone, Debug)]
struct VdevSpace {
    free: RangeTree,
    /// Live intent-log blocks: allocated in memory, free in the space map.
    log: RangeTree,
    cursor: u64,
    /// Where the next extra copy of a metadata block is looked for on this vdev when it must
    /// share the vdev with the block's other copies ([`Allocator::allocate_ditto`]).
    ditto_cursor: u64,
    log_cursor: u64,
    /// A separate intent-log device: only log blocks go here.
    log_only: bool,
    /// End of the log region, `[data_start, log_region_end)`.
    log_region_end: u64,
    data_start: u64,
    data_end: u64,
}

impl VdevSpace {
    /// Where a data block of `asize` bytes goes while the vdev has room: next fit from the
    /// cursor in the space after the log region, wrapping to the region's end, and into the
    /// region only when nothing after it fits. A plain next fit wrapped to the start of the
    /// data area, which is the region: each time the cursor passed the end, data filled the
    /// region's holes, and log blocks, placed next fit within the region, then walked past
    /// thousands of small ranges for each allocation, under the allocator's lock on the commit
    /// path (perf, 32 clients of 4 KiB write + flush on a pool aged by 40 s of random writes,
    /// 2026-11-27: the log block's allocation 4.5% of the server's samples).
    ///
    /// Whether anything after the region fits is asked of the ranges by size first: when
    /// nothing does, the next fit there would walk every range after the region for each
    /// block, and those ranges are then all smaller than the block, while the ones that are
    /// not are few. A cursor left inside the region by such a spill comes back out as soon as
    /// something after the region fits.
    fn data_fit(&self, asize: u64, unit: u64) -> Option<u64> {
        if !self.free.fits_from(asize, unit, self.log_region_end) {
            return self.free.first_fit(asize, unit, self.cursor);
        }
        // Something after the region fits, so the bounded next fit finds it.
        self.free.first_fit_within(asize, unit, self.cursor, (self.log_region_end, self.data_end))
    }
}

/// The pool's allocator.
#[derive(Clone, Debug)]
pub struct Allocator {
    ashift: u8,
    vdevs: Vec<VdevSpace>,
    /// Frees waiting out their deferral: txg -> (vdev, start, len).
    deferred: BTreeMap<u64, Vec<(u32, u64, u64)>>,
    /// Bytes in `deferred`, kept as a total: every write's space check reads it.
    deferred_total: u64,
    /// The synced txg when [`Allocator::log_region_pressed`] last said yes.
    log_pressure_reported: Option<u64>,
    /// Log blocks waiting out their deferral (they return to `free` from `log`).
    deferred_log: BTreeMap<u64, Vec<(u32, u64, u64)>>,
    rotor: usize,
    rotor_bytes: u64,
    log_rotor: usize,
    synced_txg: u64,
    /// Txgs whose trees a scan is reading, with how many scans read each.
    pins: BTreeMap<u64, u32>,
    /// Bytes handed out for blocks of txgs ([`Allocator::allocate`] and
    /// [`Allocator::allocate_ditto`]) since this allocator was made: how far the syncing txg
    /// has got with what it was expected to allocate ([`Allocator::allocated_total`]).
    allocated_total: u64,
}

impl Allocator {
    /// A fresh allocator: every vdev's data area `[start, end)` is free.
    pub fn new(ashift: u8, data_areas: &[(u64, u64)]) -> Allocator {
        assert!((9..=16).contains(&ashift), "ashift {ashift} out of range");
        let vdevs = data_areas
            .iter()
            .map(|&(start, end)| {
                assert!(start < end, "empty data area");
                let mut free = RangeTree::with_large_min(METADATA_BLOCK_BYTES_MAX);
                free.insert(start, end - start);
                let log_region_end = start + log_region_bytes(end - start);
                VdevSpace {
                    free,
                    log: RangeTree::default(),
                    cursor: log_region_end,
                    ditto_cursor: log_region_end + (end - log_region_end) / 2,
                    log_cursor: start,
                    log_only: false,
                    log_region_end,
                    data_start: start,
                    data_end: end,
                }
            })
            .collect();
        Allocator {
            ashift,
            vdevs,
            deferred: BTreeMap::new(),
            deferred_total: 0,
            deferred_log: BTreeMap::new(),
            log_pressure_reported: None,
            rotor: 0,
            rotor_bytes: 0,
            log_rotor: 0,
            synced_txg: 0,
            pins: BTreeMap::new(),
            allocated_total: 0,
        }
    }

    /// Keeps every block of synced txg `txg`'s tree allocated until [`Allocator::unpin`]:
    /// frees of later txgs wait, however long their deferral has run.
    pub fn pin(&mut self, txg: u64) {
        assert!(txg <= self.synced_txg + 1, "pin of txg {txg}, beyond the last synced");
        *self.pins.entry(txg).or_insert(0) += 1;
    }

    /// Ends a [`Allocator::pin`] of `txg`; frees it held back are released at the next sync.
    pub fn unpin(&mut self, txg: u64) {
        let count = self.pins.get_mut(&txg).expect("unpin of a txg that is not pinned");
        *count -= 1;
        if *count == 0 {
            self.pins.remove(&txg);
        }
    }

    pub fn unit_bytes(&self) -> u64 {
        1 << self.ashift
    }

    /// Rounds a size up to whole allocation units.
    pub fn asize(&self, psize: u64) -> u64 {
        psize.div_ceil(self.unit_bytes()) * self.unit_bytes()
    }

    /// Marks top-level vdevs as separate log devices: from now on only log blocks go there.
    pub fn set_log_vdevs(&mut self, vdevs: &[u32]) {
        for (index, space) in self.vdevs.iter_mut().enumerate() {
            space.log_only = vdevs.contains(&(index as u32));
        }
        assert!(
            self.vdevs.iter().any(|v| !v.log_only),
            "a pool needs at least one vdev that is not a log device"
        );
    }

    /// Data capacity (log devices excluded).
    pub fn capacity_bytes(&self) -> u64 {
        self.vdevs.iter().filter(|v| !v.log_only).map(|v| v.data_end - v.data_start).sum()
    }

    /// Allocatable now for data (excluding deferred frees and log devices).
    pub fn free_bytes(&self) -> u64 {
        self.vdevs.iter().filter(|v| !v.log_only).map(|v| v.free.total_bytes()).sum()
    }

    /// Bytes held by live intent-log blocks.
    pub fn log_bytes(&self) -> u64 {
        self.vdevs.iter().map(|v| v.log.total_bytes()).sum()
    }

    /// Allocates an intent-log block: on a log device when there is one with room, else on
    /// the data vdevs (from the slop reserve if need be, as a log block is short-lived, and a
    /// chain's new head, allocated by a sync or at import, must not fail where the sync
    /// itself may still allocate).
    pub fn allocate_log(&mut self, psize: u64) -> Result<(u32, u64, u64), AllocError> {
        self.allocate_log_near(psize, None)
    }

    /// [`Allocator::allocate_log`], on top-level vdev `near` first when it is a candidate (a
    /// log device, or any vdev when the pool has none): the intent log keeps the blocks of
    /// one group, which share a flush, on one device, and starts a group where fewest are in
    /// flight.
    pub fn allocate_log_near(
        &mut self,
        psize: u64,
        near: Option<u32>,
    ) -> Result<(u32, u64, u64), AllocError> {
        let asize = self.asize(psize.max(1));
        let unit = self.unit_bytes();
        let count = self.vdevs.len();
        let has_log_devices = self.vdevs.iter().any(|v| v.log_only);
        let near = near
            .map(|v| v as usize)
            .filter(|&v| v < count && self.vdevs[v].log_only == has_log_devices);
        // Consecutive log blocks rotate over the candidates, so lwbs in flight together go to
        // different devices, and each device still sees its log blocks in address order.
        self.log_rotor = match near {
            Some(v) => v,
            None => (self.log_rotor + 1) % count,
        };
        let start = self.log_rotor;
        let order: Vec<usize> = (0..count)
            .map(|i| (start + i) % count)
            .filter(|&v| self.vdevs[v].log_only)
            .chain((0..count).map(|i| (start + i) % count).filter(|&v| !self.vdevs[v].log_only))
            .collect();
        for vdev in order {
            let space = &mut self.vdevs[vdev];
            let region = (space.data_start, space.log_region_end);
            let in_region = (!space.log_only)
                .then(|| space.free.first_fit_within(asize, unit, space.log_cursor, region))
                .flatten();
            let at = in_region
                .or_else(|| space.free.first_fit(asize, unit, space.log_cursor))
                .or_else(|| space.free.first_fit(asize, unit, space.data_start));
            if let Some(at) = at {
                space.free.remove(at, asize);
                space.log.insert(at, asize);
                space.log_cursor = at + asize;
                return Ok((vdev as u32, at, asize));
            }
        }
        Err(AllocError::NoSpace {
            requested_bytes: asize,
            free_bytes: self.free_bytes(),
            slop_bytes: self.slop_bytes(),
        })
    }

    /// Whether the store should start a txg sync for the log region of data vdev `vdev`:
    /// log blocks, live or waiting out their deferral, take more than three quarters of it,
    /// so the next blocks would spill out of it. Said at most once per synced txg (the sync
    /// it starts frees only what its txg covers, and deferred frees take two more), and never
    /// for a log device or a region under [`LOG_REGION_PRESSURE_BYTES_MIN`].
    pub fn log_region_pressed(&mut self, vdev: u32) -> bool {
        let space = &self.vdevs[vdev as usize];
        let region = space.log_region_end - space.data_start;
        if space.log_only
            || region < LOG_REGION_PRESSURE_BYTES_MIN
            || self.log_pressure_reported == Some(self.synced_txg)
        {
            return false;
        }
        let held = space.log.bytes_within(space.data_start, space.log_region_end);
        if held <= region / 4 * 3 {
            return false;
        }
        self.log_pressure_reported = Some(self.synced_txg);
        true
    }

    /// Frees a log block in `txg` (deferred like any free: an older uberblock's log header
    /// may still lead to it).
    pub fn free_log(&mut self, txg: u64, vdev: u32, start: u64, len: u64) {
        let space = &self.vdevs[vdev as usize];
        assert!(
            space.log.contains(start, len),
            "free of [{start}, +{len}) on vdev {vdev}, not a live log block"
        );
        assert!(txg > self.synced_txg, "free in txg {txg}, which has already synced");
        self.deferred_log.entry(txg).or_default().push((vdev, start, len));
    }

    /// Allocates a block written in place for the intent log (an indirect write record,
    /// ZFS's `dmu_sync`): placed like data, near the data cursor, but held like a log block
    /// (free in the space maps) until the sync of its txg links it into a volume's tree
    /// ([`Allocator::adopt_log`]) or frees it ([`Allocator::free_log`]). A crash before then
    /// leaves it free on disk, and import claims it from the log record that points at it.
    pub fn allocate_indirect(&mut self, psize: u64) -> Result<(u32, u64, u64), AllocError> {
        let (vdev, at, asize) = self.allocate(psize, AllocClass::Normal, &[])?;
        // Allocated for the open txg's writer, not by a sync: admission counts it apart.
        self.allocated_total -= asize;
        self.vdevs[vdev as usize].log.insert(at, asize);
        Ok((vdev, at, asize))
    }

    /// Gives back a block from [`Allocator::allocate_indirect`] that was never written (its
    /// placement was abandoned): nothing can point at it, so it is free at once.
    pub fn release_indirect(&mut self, vdev: u32, start: u64, len: u64) {
        let space = &mut self.vdevs[vdev as usize];
        assert!(
            space.log.contains(start, len),
            "release of [{start}, +{len}) on vdev {vdev}, not a block placed for the log"
        );
        space.log.remove(start, len);
        space.free.insert(start, len);
    }

    /// A block from [`Allocator::allocate_indirect`] (or claimed at import) becomes part of
    /// the tree being synced: allocated in the space maps from this txg on.
    pub fn adopt_log(&mut self, vdev: u32, start: u64, len: u64) {
        let space = &mut self.vdevs[vdev as usize];
        assert!(
            space.log.contains(start, len),
            "adopt of [{start}, +{len}) on vdev {vdev}, not a live log block"
        );
        space.log.remove(start, len);
    }

    /// Whether `[start, start+len)` of `vdev` is free space.
    pub fn is_free(&self, vdev: u32, start: u64, len: u64) -> bool {
        self.vdevs.get(vdev as usize).is_some_and(|space| space.free.contains(start, len))
    }

    /// Claims a log block found on disk at import: it must be free in the space map.
    pub fn claim_log(&mut self, vdev: u32, start: u64, len: u64) -> Result<(), AllocError> {
        let corrupt = |reason: String| AllocError::Corrupt { vdev, reason };
        let space = self
            .vdevs
            .get_mut(vdev as usize)
            .ok_or_else(|| corrupt(String::from("log block on a vdev the pool does not have")))?;
        if len == 0 || !space.free.contains(start, len) {
            return Err(corrupt(format!(
                "log block [{start}, +{len}) is not free space; the log chain crosses live data"
            )));
        }
        space.free.remove(start, len);
        space.log.insert(start, len);
        Ok(())
    }

    /// Where every byte of the vdevs' data areas is, for audits: (area, free, held by log
    /// blocks, waiting out a free's deferral). The rest is allocated to blocks.
    pub fn accounting(&self) -> (u64, u64, u64, u64) {
        let area = self.vdevs.iter().map(|v| v.data_end - v.data_start).sum();
        let free = self.vdevs.iter().map(|v| v.free.total_bytes()).sum();
        (area, free, self.log_bytes(), self.deferred_bytes())
    }

    pub fn deferred_bytes(&self) -> u64 {
        self.deferred_total
    }

    /// Free space (on data vdevs) that blocks of [`METADATA_BLOCK_BYTES_MAX`] could take:
    /// each free range counted in whole such blocks. A block of up to that size placed at
    /// either end of a range takes at most that much of it (a run of blocks from the cursor
    /// does); one placed inside a range, where the cursor or a ditto copy starts, up to twice
    /// that. What is left over at the ends of ranges holds only blocks that compressed to fit.
    pub fn room_bytes(&self) -> u64 {
        self.vdevs.iter().filter(|v| !v.log_only).map(|v| v.free.large_bytes()).sum()
    }

    /// Bytes allocated for txgs' blocks so far (never for log blocks or blocks written in
    /// place for the log). The store reads it when a txg quiesces and again while that txg
    /// syncs: the difference is what the sync has already taken out of [`Allocator::free_bytes`],
    /// which admission must not count a second time as still to come.
    pub fn allocated_total(&self) -> u64 {
        self.allocated_total
    }

    pub fn slop_bytes(&self) -> u64 {
        (self.capacity_bytes() >> SLOP_SHIFT).max(SLOP_BYTES_MIN).min(self.capacity_bytes() / 2)
    }

    /// Allocates `psize` bytes (rounded up to units) on one top-level vdev, avoiding those in
    /// `exclude` when another has room (copies of one block go to different vdevs when they
    /// can). Returns (vdev, offset, asize).
    pub fn allocate(
        &mut self,
        psize: u64,
        class: AllocClass,
        exclude: &[u32],
    ) -> Result<(u32, u64, u64), AllocError> {
        let asize = self.asize(psize.max(1));
        let no_space = self.check_space(asize, class)?;
        let count = self.vdevs.len();
        if self.rotor_bytes >= ROTOR_ALIQUOT_BYTES {
            self.rotor = (self.rotor + 1) % count;
            self.rotor_bytes = 0;
        }
        let vdevs = &self.vdevs;
        let order = (0..count).map(|i| (self.rotor + i) % count).filter(|&v| !vdevs[v].log_only);
        let preferred: Vec<usize> =
            order.clone().filter(|v| !exclude.contains(&(*v as u32))).collect();
        let fallback: Vec<usize> = order.filter(|v| exclude.contains(&(*v as u32))).collect();
        for vdev in preferred.into_iter().chain(fallback) {
            let space = &mut self.vdevs[vdev];
            // Near the cursor while the vdev has room, so blocks written together land
            // together (spans); once it is short of room, the smallest range that fits, so
            // small blocks fill small holes and the ranges that larger blocks (indirect
            // blocks, space-map pieces) need survive (ZFS: metaslab_df_free_pct and
            // metaslab_df_alloc_threshold). Cursor fits alone ate every 16 KiB range of a
            // nearly full pool with 4 KiB blocks, and the next sync could not place its
            // indirect blocks.
            let unit = 1 << self.ashift;
            let tight = space.free.total_bytes()
                < (space.data_end - space.data_start) / 100 * BEST_FIT_FREE_PCT
                || space.free.largest() < BEST_FIT_LARGEST_BYTES;
            let found =
                if tight { space.free.best_fit(asize, unit) } else { space.data_fit(asize, unit) };
            if let Some(at) = found {
                space.free.remove(at, asize);
                space.cursor = at + asize;
                self.allocated_total += asize;
                if vdev == self.rotor {
                    self.rotor_bytes += asize;
                } else {
                    self.rotor = vdev;
                    self.rotor_bytes = asize;
                }
                return Ok((vdev as u32, at, asize));
            }
        }
        // Enough free space in total, but no single free range is large enough.
        Err(no_space)
    }

    /// Refuses `asize` bytes of `class` when the pool has not that much free above the slop
    /// reserve (which only `Normal` allocations must leave); otherwise returns the error to
    /// give if no free range turns out to fit.
    fn check_space(&self, asize: u64, class: AllocClass) -> Result<AllocError, AllocError> {
        let free = self.free_bytes();
        let floor = if class == AllocClass::Normal { self.slop_bytes() } else { 0 };
        let no_space = AllocError::NoSpace {
            requested_bytes: asize,
            free_bytes: free,
            slop_bytes: self.slop_bytes(),
        };
        if free < asize.saturating_add(floor) {
            return Err(no_space);
        }
        Ok(no_space)
    }

    /// Places another copy of a metadata block whose other copies are at `copies` (vdev,
    /// offset), as ZFS places ditto blocks: on a data vdev that holds none of them, if one has
    /// room; else on the first copy's vdev at least an eighth of its data area away from each
    /// copy there, so that one damaged region of a disk does not take every copy. Copies on a
    /// shared vdev come from a cursor of their own (starting mid-area), so the extra copies of
    /// blocks written together lie together and go out as one write.
    pub fn allocate_ditto(
        &mut self,
        psize: u64,
        class: AllocClass,
        copies: &[(u32, u64)],
    ) -> Result<(u32, u64, u64), AllocError> {
        assert!(!copies.is_empty(), "a ditto copy is placed relative to another copy");
        let asize = self.asize(psize.max(1));
        let no_space = self.check_space(asize, class)?;
        let unit = 1 << self.ashift;
        for vdev in 0..self.vdevs.len() {
            let space = &mut self.vdevs[vdev];
            if space.log_only || copies.iter().any(|&(v, _)| v as usize == vdev) {
                continue;
            }
            if let Some(at) = space.data_fit(asize, unit) {
                space.free.remove(at, asize);
                space.cursor = at + asize;
                self.allocated_total += asize;
                return Ok((vdev as u32, at, asize));
            }
        }
        let vdev = copies[0].0;
        let space = &mut self.vdevs[vdev as usize];
        let (lo, hi) = (space.log_region_end, space.data_end);
        let distance = (hi - lo) / 8;
        let here: Vec<u64> = copies.iter().filter(|c| c.0 == vdev).map(|c| c.1).collect();
        let far = |at: u64| here.iter().all(|&o| at.abs_diff(o) >= distance.max(asize));
        let wrap = |at: u64| lo + (at.saturating_sub(lo)) % (hi - lo);
        let starts =
            [space.ditto_cursor, wrap(here[0] + (hi - lo) / 2), wrap(here[0] + distance), lo];
        // After the log region first, as for data (`VdevSpace::data_fit`); a plain next fit
        // from these starts wraps into the region.
        let outside = |start: u64| space.free.first_fit_within(asize, unit, start, (lo, hi));
        let found = starts
            .into_iter()
            .filter_map(outside)
            .find(|&at| far(at))
            .or_else(|| {
                starts
                    .into_iter()
                    .filter_map(|start| space.free.first_fit(asize, unit, start))
                    .find(|&at| far(at))
            })
            .or_else(|| space.free.best_fit(asize, unit).filter(|&at| far(at)));
        let Some(at) = found else { return Err(no_space) };
        space.free.remove(at, asize);
        space.ditto_cursor = at + asize;
        self.allocated_total += asize;
        Ok((vdev, at, asize))
    }

    /// Frees a range in `txg`; it becomes allocatable once `txg + FREE_DEFER_TXGS` has synced.
    pub fn free(&mut self, txg: u64, vdev: u32, start: u64, len: u64) {
        let space = &self.vdevs[vdev as usize];
        assert!(
            start >= space.data_start && start + len <= space.data_end,
            "free of [{start}, +{len}) outside vdev {vdev}'s data area"
        );
        assert!(txg > self.synced_txg, "free in txg {txg}, which has already synced");
        self.deferred.entry(txg).or_default().push((vdev, start, len));
        self.deferred_total += len;
    }

    /// Records that `txg` is durable: frees whose deferral has ended become allocatable.
    pub fn synced(&mut self, txg: u64) {
        assert!(txg >= self.synced_txg, "txgs sync in order");
        self.synced_txg = txg;
        // A pinned tree's blocks freed after it stay allocated.
        let pinned = self.pins.keys().next().copied().unwrap_or(u64::MAX);
        let last = txg.saturating_sub(FREE_DEFER_TXGS).min(pinned);
        let ready: Vec<u64> = self.deferred.range(..=last).map(|(t, _)| *t).collect();
        for t in ready {
            for (vdev, start, len) in self.deferred.remove(&t).unwrap_or_default() {
                self.deferred_total -= len;
                self.vdevs[vdev as usize].free.insert(start, len);
            }
        }
        let ready: Vec<u64> = self
            .deferred_log
            .range(..=txg.saturating_sub(FREE_DEFER_TXGS))
            .map(|(t, _)| *t)
            .collect();
        for t in ready {
            for (vdev, start, len) in self.deferred_log.remove(&t).unwrap_or_default() {
                let space = &mut self.vdevs[vdev as usize];
                space.log.remove(start, len);
                space.free.insert(start, len);
            }
        }
    }

    /// The persisted state of vdev `vdev`, as of the last synced txg plus the given allocations.
    /// Live log blocks count as free (import claims them from the chains).
    pub fn space_map(&self, vdev: u32) -> SpaceMap {
        let space = &self.vdevs[vdev as usize];
        let free = space.free.union(&space.log).collect();
        let deferred = self.deferred_of(vdev).collect();
        SpaceMap { ashift: self.ashift, synced_txg: self.synced_txg, free, deferred }
    }

    /// How many free ranges and deferred frees [`Allocator::space_map`] of `vdev` would hold,
    /// counted without building it: the sync sizes the map's pieces before it allocates them.
    pub fn space_map_entries(&self, vdev: u32) -> (usize, usize) {
        let space = &self.vdevs[vdev as usize];
        (space.free.union(&space.log).count(), self.deferred_of(vdev).count())
    }

    /// `vdev`'s frees waiting out their deferral, as (txg, start, len), in txg order.
    fn deferred_of(&self, vdev: u32) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        self.deferred.iter().flat_map(move |(&txg, frees)| {
            frees.iter().filter(move |f| f.0 == vdev).map(move |&(_, s, l)| (txg, s, l))
        })
    }

    /// Rebuilds the allocator from each vdev's space map and data area, checking that every
    /// range lies in its data area and that free and deferred space never overlap.
    pub fn load(ashift: u8, maps: &[(SpaceMap, (u64, u64))]) -> Result<Allocator, AllocError> {
        let mut allocator =
            Allocator::new(ashift, &maps.iter().map(|(_, area)| *area).collect::<Vec<_>>());
        let mut synced_txg = 0;
        for (vdev, (map, (start, end))) in maps.iter().enumerate() {
            let corrupt = |reason: String| AllocError::Corrupt { vdev: vdev as u32, reason };
            if map.ashift != ashift {
                return Err(corrupt(format!(
                    "ashift {} differs from the pool's {ashift}",
                    map.ashift
                )));
            }
            let mut free = RangeTree::with_large_min(METADATA_BLOCK_BYTES_MAX);
            let mut claimed = RangeTree::default();
            for &(s, l) in &map.free {
                if s < *start || s.saturating_add(l) > *end || !free.try_insert(s, l) {
                    return Err(corrupt(format!(
                        "free range [{s}, +{l}) is outside the data area or overlaps"
                    )));
                }
            }
            for &(txg, s, l) in &map.deferred {
                if s < *start
                    || s.saturating_add(l) > *end
                    || free.contains(s, 1)
                    || !claimed.try_insert(s, l)
                {
                    return Err(corrupt(format!("deferred free [{s}, +{l}) is invalid")));
                }
                allocator.deferred.entry(txg).or_default().push((vdev as u32, s, l));
                allocator.deferred_total += l;
            }
            let space = &mut allocator.vdevs[vdev];
            space.free = free;
            space.cursor = space.log_region_end;
            synced_txg = synced_txg.max(map.synced_txg);
        }
        allocator.synced_txg = synced_txg;
        Ok(allocator)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const MIB: u64 = 1 << 20;

    fn allocator() -> Allocator {
        Allocator::new(12, &[(4 * MIB, 68 * MIB), (4 * MIB, 68 * MIB)])
    }

    /// `allocated_total` counts what txgs' blocks take (plain and ditto allocations), not log
    /// blocks nor blocks placed in place for the log, which admission counts apart.
    #[test]
    fn allocated_total_counts_txg_blocks_only() {
        let mut a = allocator();
        let (vdev, at, len) = a.allocate(4096, AllocClass::Normal, &[]).unwrap();
        assert_eq!((a.allocated_total(), len), (4096, 4096));
        a.allocate_ditto(16384, AllocClass::Reserved, &[(vdev, at)]).unwrap();
        assert_eq!(a.allocated_total(), 4096 + 16384);
        a.allocate_indirect(128 << 10).unwrap();
        a.allocate_log(64 << 10).unwrap();
        let free = a.free_bytes();
        a.claim_log(0, 40 * MIB, 8192).unwrap();
        assert_eq!(a.free_bytes(), free - 8192);
        assert_eq!(a.allocated_total(), 4096 + 16384);
    }

    /// Log blocks go to the log region at the start of each data area and data after it, so
    /// the region pool creation wrote is where the log writes; a full region spills.
    #[test]
    fn log_blocks_use_the_log_region() {
        let mut a = allocator();
        let region = log_region_bytes(64 * MIB);
        assert_eq!(region, 8 * MIB);
        let (data_vdev, data_at, _) = a.allocate(64 << 10, AllocClass::Normal, &[]).unwrap();
        assert!(data_at >= 4 * MIB + region, "data at {data_at} is inside the log region");
        let (mut log_blocks, mut asked) = (0u64, 0);
        loop {
            let (vdev, at, len) = a.allocate_log(128 << 10).unwrap();
            if at >= 4 * MIB + region {
                break;
            }
            assert!(at + len <= 4 * MIB + region, "log block crosses the region's end");
            log_blocks += 1;
            asked += u32::from(a.log_region_pressed(vdev));
        }
        // Nothing synced meanwhile: the filling regions asked for a sync once.
        assert_eq!(asked, 1);
        // Both vdevs' regions were used before a block spilled.
        assert_eq!(log_blocks, 2 * region / (128 << 10));
        // Live log blocks are free in the space map, joined to the free space around them, and
        // the count the sync sizes the map's pieces by is the map's.
        a.free(1, data_vdev, data_at, 64 << 10);
        for vdev in 0..2 {
            let map = a.space_map(vdev);
            let mut joined = map.free.clone();
            joined.dedup_by(|next, prev| prev.0 + prev.1 == next.0);
            assert_eq!(joined.len(), map.free.len(), "adjacent free ranges are joined");
            assert_eq!(a.space_map_entries(vdev), (map.free.len(), map.deferred.len()));
        }
        assert_eq!(a.space_map(data_vdev).deferred.len(), 1);
    }

    /// A one-vdev allocator (64 MiB data area) whose space after the log region is all taken
    /// by 1 MiB blocks, in order; with the region's end and those blocks.
    fn filled_after_the_log_region() -> (Allocator, u64, Vec<(u32, u64, u64)>) {
        let mut a = Allocator::new(12, &[(4 * MIB, 68 * MIB)]);
        let region_end = 4 * MIB + log_region_bytes(64 * MIB);
        let blocks = (0..(68 * MIB - region_end) / MIB)
            .map(|_| a.allocate(MIB, AllocClass::Reserved, &[]).unwrap())
            .collect();
        (a, region_end, blocks)
    }

    /// Data's cursor wraps to the log region's end, not into the region: space freed after the
    /// region is reused first, and data takes the region only once nothing after it fits.
    #[test]
    fn data_wraps_past_the_log_region() {
        let (mut a, region_end, blocks) = filled_after_the_log_region();
        assert!(blocks.iter().all(|b| b.1 >= region_end), "data starts after the region");
        let b = a.allocate(MIB, AllocClass::Reserved, &[]).unwrap();
        assert!(b.1 < region_end, "the space after the region is full: data takes the region");
        // The cursor is now in the region. A plain next fit went on from there (the region
        // had room); data goes back past the region's end.
        a.free(1, 0, b.1, b.2);
        for &(vdev, start, len) in &blocks[..4] {
            a.free(1, vdev, start, len);
        }
        for txg in 1..=(1 + FREE_DEFER_TXGS) {
            a.synced(txg);
        }
        for &(_, start, _) in &blocks[..4] {
            let (_, at, _) = a.allocate(MIB, AllocClass::Reserved, &[]).unwrap();
            assert_eq!(at, start, "space freed after the region is reused before the region");
        }
        let (_, at, _) = a.allocate(MIB, AllocClass::Reserved, &[]).unwrap();
        assert!(at < region_end, "with the rest full, data goes into the region");
    }

    /// A metadata block's second copy on the same vdev (a one-vdev pool) also stays out of the
    /// log region while space after it is far enough from the first copy.
    #[test]
    fn ditto_copies_stay_out_of_the_log_region() {
        let (mut a, region_end, blocks) = filled_after_the_log_region();
        let (vdev, start, len) = blocks[0];
        a.free(1, vdev, start, len);
        for txg in 1..=(1 + FREE_DEFER_TXGS) {
            a.synced(txg);
        }
        // The copy's cursor starts mid-area, where nothing is free: a plain next fit from it
        // wrapped into the region, which is far from the first copy too.
        let (_, at, _) =
            a.allocate_ditto(16 << 10, AllocClass::Reserved, &[(0, 67 * MIB)]).unwrap();
        assert_eq!(at, region_end, "the copy goes to the free space after the region");
    }

    /// The store is asked for a sync once log blocks (live or deferred) hold more than three
    /// quarters of a log region, once per synced txg; blocks placed in place for indirect
    /// records (data space, outside the region) do not count, and the freed blocks count
    /// until their deferral ends.
    #[test]
    fn a_filling_log_region_asks_for_a_sync_once_per_txg() {
        let mut a = Allocator::new(12, &[(4 * MIB, 132 * MIB)]);
        let region = log_region_bytes(128 * MIB);
        assert_eq!(region, 16 * MIB);
        // Indirect placements, however many, are not log-region pressure.
        for _ in 0..200 {
            a.allocate_indirect(128 << 10).unwrap();
            assert!(!a.log_region_pressed(0));
        }
        let mut blocks = Vec::new();
        let mut asked = 0;
        while blocks.len() * (128 << 10) < region as usize - (128 << 10) {
            let (vdev, at, len) = a.allocate_log(128 << 10).unwrap();
            assert!(at + len <= 4 * MIB + region);
            blocks.push((at, len));
            let held = blocks.len() as u64 * (128 << 10);
            let pressed = a.log_region_pressed(vdev);
            if pressed {
                asked += 1;
                assert!(held > region / 4 * 3, "asked at {held} of {region}");
            }
            if held > region / 4 * 3 + (128 << 10) {
                assert!(!pressed, "asked again in the same txg");
            }
        }
        assert_eq!(asked, 1);
        // Freed in txg 1, the blocks still hold the region until txg 3 has synced; a new
        // synced txg lets the allocator ask again while they do.
        for &(at, len) in &blocks {
            a.free_log(1, 0, at, len);
        }
        a.synced(1);
        assert!(a.log_region_pressed(0), "deferred blocks still fill the region");
        assert!(!a.log_region_pressed(0));
        a.synced(2);
        a.synced(3);
        assert!(!a.log_region_pressed(0), "the region is free again");
    }

    /// Sequential allocations are contiguous and rotate over vdevs every aliquot.
    #[test]
    fn allocations_stripe_in_aliquots() {
        let mut a = allocator();
        let mut placements = Vec::new();
        for _ in 0..64 {
            placements.push(a.allocate(64 << 10, AllocClass::Normal, &[]).unwrap());
        }
        // Data starts after the log region.
        let base = 4 * MIB + log_region_bytes(64 * MIB);
        assert_eq!(placements[0], (0, base, 64 << 10));
        assert_eq!(placements[1], (0, base + (64 << 10), 64 << 10));
        assert_eq!(placements[16].0, 1, "after 1 MiB the rotor moves to vdev 1");
        assert_eq!(placements[32].0, 0);
        // Copies avoid the vdev of the first copy.
        let (vdev, _, _) = a.allocate(4096, AllocClass::Normal, &[0]).unwrap();
        assert_eq!(vdev, 1);
    }

    /// Extra copies of metadata: on another vdev when there is one; on a lone vdev at least
    /// an eighth of the data area from every other copy, and those of blocks placed one after
    /// another lie back to back; a full vdev refuses rather than placing them close.
    #[test]
    fn ditto_copies_land_apart() {
        let mut a = allocator();
        let (v, at, _) = a.allocate(16 << 10, AllocClass::Reserved, &[]).unwrap();
        let (v2, _, _) = a.allocate_ditto(16 << 10, AllocClass::Reserved, &[(v, at)]).unwrap();
        assert_ne!(v, v2, "another vdev first");

        let mut one = Allocator::new(12, &[(4 * MIB, 68 * MIB)]);
        let area = 64 * MIB - log_region_bytes(64 * MIB);
        let mut last_ditto = None;
        for _ in 0..16 {
            let (v, at, len) = one.allocate(16 << 10, AllocClass::Reserved, &[]).unwrap();
            let (v2, d, _) =
                one.allocate_ditto(16 << 10, AllocClass::Reserved, &[(v, at)]).unwrap();
            assert_eq!(v2, 0);
            assert!(d.abs_diff(at) >= area / 8, "copies {at} and {d} too close");
            if let Some(prev) = last_ditto {
                assert_eq!(d, prev, "ditto copies follow their own cursor");
            }
            last_ditto = Some(d + len);
        }
        let (v, at, _) = one.allocate(16 << 10, AllocClass::Reserved, &[]).unwrap();
        let (_, d, _) = one.allocate_ditto(16 << 10, AllocClass::Reserved, &[(v, at)]).unwrap();
        let (_, third, _) =
            one.allocate_ditto(16 << 10, AllocClass::Reserved, &[(v, at), (v, d)]).unwrap();
        assert!(third.abs_diff(at) >= area / 8 && third.abs_diff(d) >= area / 8);
        // Nearly everything far from the first copy taken: refused, not placed close.
        let mut tight = Allocator::new(12, &[(4 * MIB, 68 * MIB)]);
        let (_, at, _) = tight.allocate(16 << 10, AllocClass::Reserved, &[]).unwrap();
        let region_end = 4 * MIB + log_region_bytes(64 * MIB);
        let keep = (at + (16 << 10), area / 8);
        let mut free = RangeTree::default();
        free.insert(keep.0, keep.1 - (16 << 10));
        tight.vdevs[0].free = free;
        assert!(tight.allocate_ditto(16 << 10, AllocClass::Reserved, &[(0, at)]).is_err());
        assert!(region_end <= at);
    }

    /// Freed space is not reused before the freeing txg plus the deferral has synced.
    #[test]
    fn frees_are_deferred() {
        let mut a = Allocator::new(12, &[(0, 64 * 4096)]);
        let slop = a.slop_bytes();
        let mut blocks = Vec::new();
        while let Ok(b) = a.allocate(4096, AllocClass::Reserved, &[]) {
            blocks.push(b);
        }
        assert_eq!(a.free_bytes(), 0);
        let (vdev, start, len) = blocks[3];
        a.free(5, vdev, start, len);
        for txg in 0..(5 + FREE_DEFER_TXGS) {
            a.synced(txg);
            assert_eq!(a.free_bytes(), 0, "reused after txg {txg} only");
        }
        a.synced(5 + FREE_DEFER_TXGS);
        assert_eq!(a.free_bytes(), 4096);
        assert!(slop > 0);
    }

    /// Ordinary allocations stop at the slop reserve; reserved ones may use it; the error says
    /// what to do.
    #[test]
    fn slop_is_kept_for_reserved_work() {
        let mut a = Allocator::new(12, &[(0, 8 * MIB)]);
        while a.allocate(64 << 10, AllocClass::Normal, &[]).is_ok() {}
        assert!(a.free_bytes() >= a.slop_bytes() - (64 << 10));
        let error = a.allocate(4096, AllocClass::Normal, &[]).unwrap_err();
        assert!(matches!(error, AllocError::NoSpace { .. }));
        assert!(error.to_string().contains("trimming"));
        a.allocate(4096, AllocClass::Reserved, &[]).unwrap();
    }

    /// The space map round-trips through the on-disk encoding and restores the same state;
    /// a map whose ranges overlap is refused with the vdev named.
    #[test]
    fn space_maps_persist_and_validate() {
        let mut a = allocator();
        for i in 0..40u64 {
            let (vdev, start, len) = a.allocate(12288, AllocClass::Normal, &[]).unwrap();
            if i % 3 == 0 {
                a.free(2 + i / 10, vdev, start, len);
            }
        }
        a.synced(3);
        let maps: Vec<_> = (0..2)
            .map(|v| {
                let bytes = a.space_map(v).encode().unwrap();
                (SpaceMap::decode(&bytes).unwrap(), (4 * MIB, 68 * MIB))
            })
            .collect();
        let b = Allocator::load(12, &maps).unwrap();
        assert_eq!(b.free_bytes(), a.free_bytes());
        assert_eq!(b.deferred_bytes(), a.deferred_bytes());
        let mut bad = maps.clone();
        let inside_free = bad[1].0.free[0].0;
        bad[1].0.deferred.push((9, inside_free, 4096));
        let error = Allocator::load(12, &bad).unwrap_err();
        assert!(matches!(error, AllocError::Corrupt { vdev: 1, .. }), "{error}");
    }

    proptest! {
        /// The allocator never hands out a byte twice, whatever mix of allocations, frees and
        /// syncs, and free + allocated + deferred always add up to the capacity.
        #[test]
        fn never_allocates_twice(ops in proptest::collection::vec((0u8..3, 1u64..40_000, any::<prop::sample::Index>()), 1..300)) {
            let mut a = Allocator::new(12, &[(0, 2 * MIB), (0, 3 * MIB)]);
            let mut live: Vec<(u32, u64, u64)> = Vec::new();
            let mut txg = 1u64;
            for (op, size, pick) in ops {
                match op {
                    0 => {
                        if let Ok(block) = a.allocate(size, AllocClass::Reserved, &[]) {
                            for &(v, s, l) in &live {
                                prop_assert!(v != block.0 || s + l <= block.1 || block.1 + block.2 <= s, "overlap");
                            }
                            live.push(block);
                        }
                    }
                    1 if !live.is_empty() => {
                        let (v, s, l) = live.swap_remove(pick.index(live.len()));
                        a.free(txg, v, s, l);
                    }
                    _ => {
                        a.synced(txg);
                        txg += 1;
                    }
                }
                let live_bytes: u64 = live.iter().map(|b| b.2).sum();
                prop_assert_eq!(a.free_bytes() + a.deferred_bytes() + live_bytes, a.capacity_bytes());
                let listed: u64 = a.deferred.values().flatten().map(|&(_, _, len)| len).sum();
                prop_assert_eq!(a.deferred_bytes(), listed, "the running total matches the list");
            }
        }
    }
}
