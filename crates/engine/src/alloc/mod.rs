//! Space allocation per top-level vdev, with deferred frees and a slop reserve
//! (ZFS: `metaslab.c`, `space_map.c`).
//!
//! Each top-level vdev's data area is a [`RangeTree`] of free space. Allocation is next-fit
//! from a per-vdev cursor (blocks written together land together, which keeps sequential
//! streams sequential on disk) in units of `1 << ashift`. A rotor moves to the next top-level
//! vdev every `ROTOR_ALIQUOT_BYTES`, which is how the pool stripes; a full vdev is skipped.
//! The blocks of one write span go back to back into one free range near the cursor; where
//! no range holds them all, piece by piece into the smallest range that holds the rest of the
//! span or else the largest ([`Allocator::allocate_span`]), so that the small holes random
//! writes leave are used last and grow as the blocks beside them are freed.
//! A vdev short of space (under `BEST_FIT_FREE_PCT` free, or no free range of
//! `BEST_FIT_LARGEST_BYTES`) switches to best fit, as ZFS's metaslab allocator does, so that
//! small blocks fill small holes and larger metadata blocks still find room.
//!
//! Frees are deferred: a block freed in txg T stays allocated until T has synced and
//! `FREE_DEFER_TXGS` more txgs have synced too. Until then the previous uberblocks (which an
//! import after a crash may fall back to) still reference it, so reusing it sooner could
//! overwrite the only copy of live data.
//!
//! A scrub or resilver walking the tree of synced txg T pins T ([`Allocator::pin`]): frees of
//! later txgs then stay deferred until the pin goes, so no indirect block the walk reads is
//! handed out again meanwhile. Frees of T and earlier are of blocks that tree no longer holds.
//! The blocks the walk gathered are then queued ([`Allocator::scan_queue`]) and the pin goes:
//! from then on only a free of a block whose scan I/O is in flight waits for it (`scan_queue`
//! says why).
//!
//! A slop reserve (1/32 of the space, at least `SLOP_BYTES_MIN`) is kept back from ordinary
//! allocations and open only to [`AllocClass::Reserved`] ones: txg sync metadata, log replay and
//! the bookkeeping of frees, so a full pool can still sync, import and free space. Work that
//! must not stop where thin writes do goes part of the way into it, each kind to its
//! [`SlopTier`]: a thick volume's overwrites, then what frees space and the intent log's
//! blocks; the sync has the rest.
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
mod scan_queue;

use std::collections::BTreeMap;

pub use range_tree::RangeTree;
use scan_queue::ScanQueue;
use sluice_format::raidz::{RaidzGeometry, RaidzLayout};
use sluice_format::SpaceMap;

/// Txgs a free waits after its own txg has synced.
pub const FREE_DEFER_TXGS: u64 = 2;
/// Bytes written to one top-level vdev before the rotor moves on (ZFS's metaslab aliquot).
pub const ROTOR_ALIQUOT_BYTES: u64 = 1 << 20;
/// The largest block a sync writes for itself (indirect blocks, space-map pieces): free
/// ranges counted in whole blocks of this size are what its metadata can use, and what data
/// blocks of up to this size can use whatever they compress to ([`Allocator::room_bytes`]).
pub const METADATA_BLOCK_BYTES_MAX: u64 = 16 << 10;
/// The block sizes whose room each vdev's free space keeps count of
/// ([`Allocator::room_bytes_for`]): the metadata block, then the larger data blocks up to the
/// largest a volume may have. There are no gang blocks, so a block needs a free range of its
/// own size, and a pool whose free space is 16 KiB holes has room for 16 KiB blocks and none for
/// 128 KiB ones.
pub const ROOM_BLOCK_BYTES: [u64; range_tree::ROOM_TIERS] =
    [METADATA_BLOCK_BYTES_MAX, 32 << 10, 64 << 10, 128 << 10];
/// The index in [`ROOM_BLOCK_BYTES`] of the smallest block size that holds a block of
/// `block_bytes`: the room such blocks are counted in.
pub fn room_tier(block_bytes: u64) -> usize {
    ROOM_BLOCK_BYTES
        .iter()
        .position(|&b| b >= block_bytes)
        .unwrap_or_else(|| panic!("a block of {block_bytes} bytes is larger than any counted room"))
}

/// The run lengths whose room after its log region each vdev's free space keeps count of
/// ([`Allocator::run_room_bytes`]): where blocks written together still lie in runs that
/// long, up to dmu_rewrite.rs's default run, which a sequential read takes in few device
/// commands.
pub const RUN_ROOM_BYTES: [u64; range_tree::RUN_TIERS] = [32 << 10, 64 << 10, 128 << 10];
/// Below this percentage of a vdev's space free, allocations take the smallest range that fits.
const BEST_FIT_FREE_PCT: u64 = 4;
/// ... and likewise once no free range of the vdev is this long.
const BEST_FIT_LARGEST_BYTES: u64 = 128 << 10;
/// How many free ranges a span's piece looks at, largest first, for one after the log region
/// ([`VdevSpace::piece_fit`]): the ranges it passes over are the region's, and a region with
/// that many larger than every range after it is left to the block-by-block fit.
const PIECE_SEARCH_RANGES: usize = 64;
/// A pool with less room for a volume's blocks than this many slop reserves is short of room:
/// a thick volume's blocks are then stored whole ([`Allocator::short_of_room`]).
const SHORT_OF_ROOM_SLOPS: u64 = 4;
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

/// The log region of a top-level vdev whose data area is `area_bytes`, shaped as `geometry`
/// says (`None`: a leaf or a mirror). A RAID-Z vdev whose log blocks are copies gets
/// [`log_region_bytes`] times `width / (parity + 1)` (rounded up), at most a quarter of the
/// area: such a block spans about that many times the vdev space it writes (its rows' other
/// sectors are pads), and the region must hold as many blocks as a mirror's does. At 32
/// clients of 4 KiB write + flush on a raidz1 of 4, the region sized as for striped blocks
/// filled and asked for a sync every second or so, and those syncs cost a fifth more CPU per
/// write than the mirror's (docs/bench/raidz.md). Data still uses the region once the rest of
/// the vdev is full, so it costs no capacity.
pub fn vdev_log_region_bytes(area_bytes: u64, geometry: Option<&RaidzGeometry>) -> u64 {
    let base = log_region_bytes(area_bytes);
    match geometry {
        Some(g) if g.log_layout() == RaidzLayout::Copies => {
            let scale = u64::from(g.width().div_ceil(g.parity() + 1));
            ((base * scale).min(area_bytes / 4) >> 20 << 20).max(base)
        }
        _ => base,
    }
}

/// How much of the slop reserve a kind of work must leave, from the first to stop to the last
/// (ZFS: `spa_slop_shift` and the space-check levels of `dsl_synctask`, which let operations
/// that free space dip into the slop). Each is checked against the free space admission counts
/// (`room_bytes`) less everything in flight, the sync's own metadata included; the txg sync
/// itself has the rest, and what it will allocate is counted by every tier above it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlopTier {
    /// Writes to volumes without a reservation, receives, and setting space aside (a thick
    /// volume made or grown, a snapshot of one): the whole slop is left.
    Normal,
    /// Writes to a thick volume: its overwrites need new space before the blocks they replace
    /// come back, and a pool that thin volumes filled must not refuse them. Three quarters of
    /// the slop are theirs to use.
    Thick,
    /// Operations that free space (a snapshot destroy rewrites the next dead list) and the
    /// intent log's blocks (short-lived; a chain that finds none falls back to a txg sync):
    /// an eighth is left.
    Freeing,
}

impl SlopTier {
    /// The part of `slop` this tier leaves.
    pub fn kept(self, slop: u64) -> u64 {
        match self {
            SlopTier::Normal => slop,
            SlopTier::Thick => slop / 4,
            SlopTier::Freeing => slop / 8,
        }
    }
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
        "no space: {requested_bytes} bytes requested, {free_bytes} free, and {slop_bytes} of \
         the pool are kept for its metadata; free space by trimming or deleting data, or add a \
         vdev"
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
    /// Nothing new goes here: a log device being removed, or the hole left where one was
    /// (an empty data area).
    removing: bool,
    /// End of the log region, `[data_start, log_region_end)`.
    log_region_end: u64,
    data_start: u64,
    data_end: u64,
    /// A RAID-Z vdev's shape: a block allocates its parity and padding beside its sectors.
    geometry: Option<RaidzGeometry>,
}

impl VdevSpace {
    /// Short of space: under `BEST_FIT_FREE_PCT` free, or no free range of
    /// `BEST_FIT_LARGEST_BYTES`; allocations then take the smallest range that fits.
    fn is_tight(&self) -> bool {
        self.free.total_bytes() < (self.data_end - self.data_start) / 100 * BEST_FIT_FREE_PCT
            || self.free.largest() < BEST_FIT_LARGEST_BYTES
    }

    /// The bytes a block of `psize` allocates here, in units of `unit`.
    fn asize(&self, psize: u64, unit: u64) -> u64 {
        match &self.geometry {
            Some(geometry) => geometry.asize(psize.max(1)),
            None => psize.max(1).div_ceil(unit) * unit,
        }
    }

    /// Makes the log region `[data_start, data_start + bytes)`, the cursors where a fresh
    /// allocator starts them: data next fit from the region's end, extra copies from halfway
    /// through the rest.
    fn set_log_region(&mut self, bytes: u64) {
        self.log_region_end = self.data_start + bytes;
        self.cursor = self.log_region_end;
        self.ditto_cursor = self.log_region_end + (self.data_end - self.log_region_end) / 2;
        self.free.count_runs(self.run_floors(), self.log_region_end);
    }

    /// [`RUN_ROOM_BYTES`] as this vdev lays them out: on RAID-Z a run of data holds its parity
    /// and padding too, so the floors are what blocks of those sizes allocate here.
    fn run_floors(&self) -> [u64; range_tree::RUN_TIERS] {
        match &self.geometry {
            Some(geometry) => RUN_ROOM_BYTES.map(|b| geometry.asize(b)),
            None => RUN_ROOM_BYTES,
        }
    }

    /// The bytes an intent-log block of `psize` allocates here: on RAID-Z, as the vdev lays
    /// out log blocks.
    fn log_asize(&self, psize: u64, unit: u64) -> u64 {
        match &self.geometry {
            Some(geometry) => geometry.asize_in(geometry.log_layout(), psize.max(1)),
            None => self.asize(psize, unit),
        }
    }

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

    /// Where the next piece of a span goes when no free range holds the whole span
    /// ([`Allocator::allocate_span`]): after the log region, the smallest range that holds
    /// the `rest` of it, else the largest that holds at least its next block (`least`). The
    /// aligned start and the range's end.
    fn piece_fit(&self, rest: u64, least: u64, unit: u64) -> Option<(u64, u64)> {
        let lo = self.log_region_end;
        self.free
            .best_fit_from(rest, unit, lo)
            .or_else(|| self.free.largest_from(least, unit, lo, PIECE_SEARCH_RANGES))
    }
}

/// Where a block was placed: its vdev, its offset there, and the bytes allocated.
pub type Place = (u32, u64, u64);

/// `psizes` cut from the front into runs of consecutive blocks of at most `run_bytes` each (a
/// block larger than that alone): how a batch of blocks is offered to
/// [`Allocator::allocate_span`], by the txg sync (`zio::allocate`) and by
/// [`Allocator::allocate_runs`].
pub fn run_pieces(psizes: &[u64], run_bytes: u64) -> Vec<std::ops::Range<usize>> {
    let mut pieces = Vec::new();
    let mut start = 0;
    while start < psizes.len() {
        let mut end = start;
        let mut bytes = 0;
        while end < psizes.len() && (end == start || bytes + psizes[end] <= run_bytes) {
            bytes += psizes[end];
            end += 1;
        }
        pieces.push(start..end);
        start = end;
    }
    pieces
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
    /// Entries in `deferred`, per vdev: a bound of the space maps' size that every write's
    /// space check reads ([`Allocator::space_map_entries_bound`]).
    deferred_entries: Vec<usize>,
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
    /// The blocks a scan has gathered and not yet read, and those it is reading.
    scan: ScanQueue,
    /// What admission last promised the open and syncing txgs' syncs, and `allocated_total`
    /// then ([`Allocator::promise`]): intent-log blocks leave it alone.
    promised: (u64, u64),
    /// What volumes have set aside and the dedup table's rewrite room ([`Allocator::set_aside`]).
    set_aside: u64,
    /// Bytes admission let in whose blocks are not yet dirty in the open txg
    /// ([`Allocator::admit`]).
    admitted: u64,
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
                assert!(start <= end, "data area ends before it starts");
                let mut free = RangeTree::with_room_units(ROOM_BLOCK_BYTES);
                // An empty area is a hole: a removed log device's place.
                if start < end {
                    free.insert(start, end - start);
                }
                let mut space = VdevSpace {
                    free,
                    log: RangeTree::default(),
                    cursor: start,
                    ditto_cursor: start,
                    log_cursor: start,
                    log_only: false,
                    removing: start == end,
                    log_region_end: start,
                    data_start: start,
                    data_end: end,
                    geometry: None,
                };
                space.set_log_region(log_region_bytes(end - start));
                space
            })
            .collect();
        Allocator {
            ashift,
            vdevs,
            deferred: BTreeMap::new(),
            deferred_total: 0,
            deferred_entries: vec![0; data_areas.len()],
            deferred_log: BTreeMap::new(),
            log_pressure_reported: None,
            rotor: 0,
            rotor_bytes: 0,
            log_rotor: 0,
            synced_txg: 0,
            pins: BTreeMap::new(),
            scan: ScanQueue::new(data_areas.len()),
            promised: (0, 0),
            set_aside: 0,
            admitted: 0,
            allocated_total: 0,
        }
    }

    /// Counts `bytes` that admission let in for a write whose blocks are not yet dirty in the
    /// open txg (ZFS: `dsl_dir_tempreserve_space`). Until [`Allocator::unadmit`], every space
    /// check counts them as still to allocate: a write delayed by the throttle between the
    /// check and its blocks landing in the txg was not counted at all, and eight writers
    /// admitted against the same figures overran the slop and failed a sync.
    pub fn admit(&mut self, bytes: u64) {
        self.admitted += bytes;
    }

    /// Ends an [`Allocator::admit`]: the write's blocks are in the open txg's dirty figures, or
    /// the write failed.
    pub fn unadmit(&mut self, bytes: u64) {
        assert!(
            bytes <= self.admitted,
            "{bytes} admitted bytes released, {} outstanding",
            self.admitted
        );
        self.admitted -= bytes;
    }

    /// Bytes admitted and not yet dirty ([`Allocator::admit`]).
    pub fn admitted_bytes(&self) -> u64 {
        self.admitted
    }

    /// Records that admission has let in txgs whose syncs will allocate `bytes` from now on.
    pub fn promise(&mut self, bytes: u64) {
        self.promised = (bytes, self.allocated_total);
    }

    /// What is still promised to the syncs ([`Allocator::promise`]), less what they have
    /// allocated since, what is set aside ([`Allocator::set_aside`]), and what admitted writes
    /// will add ([`Allocator::admit`]; a quiesce's promise does not count them).
    pub fn promised_bytes(&self) -> u64 {
        let (bytes, at) = self.promised;
        bytes
            .saturating_sub(self.allocated_total.saturating_sub(at))
            .saturating_add(self.set_aside)
            .saturating_add(self.admitted)
    }

    /// Records what volumes have set aside and not used, and the dedup table's rewrite room:
    /// intent-log blocks leave that alone too.
    pub fn set_aside(&mut self, bytes: u64) {
        self.set_aside = bytes;
    }

    /// Queues the copies (vdev, offset, asize) of blocks a scan gathered from a pinned tree,
    /// before the pin goes: from then on a free of one of them whose deferral ends drops it
    /// from the queue, unless its read is in flight ([`Allocator::scan_issue`]).
    pub fn scan_queue(&mut self, copies: impl IntoIterator<Item = (u32, u64, u64)>) {
        for (vdev, start, len) in copies {
            self.scan.queue(vdev, start, len);
        }
    }

    /// Whether the scan may read (and repair) a queued block now: `false` when it was freed
    /// meanwhile, and its space may already hold another block. If `true`, frees of its
    /// copies stay deferred until [`Allocator::scan_done`].
    pub fn scan_issue(&mut self, copies: &[(u32, u64, u64)]) -> bool {
        self.scan.issue(copies)
    }

    /// The scan's I/O of a block taken with [`Allocator::scan_issue`] has ended.
    pub fn scan_done(&mut self, copies: &[(u32, u64, u64)]) {
        self.scan.done(copies);
    }

    /// The scan's chunk has ended, or was dropped with its reads: what it left queued or
    /// being read is forgotten.
    pub fn scan_clear(&mut self) {
        self.scan.clear();
    }

    /// Bytes a scan has queued and is reading.
    pub fn scan_bytes(&self) -> (u64, u64) {
        self.scan.bytes()
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

    /// The most a block of `psize` bytes allocates on any data vdev: whole allocation units,
    /// and on RAID-Z its parity and padding too. What admission and space checks count for a
    /// block whose vdev is not chosen yet.
    pub fn asize(&self, psize: u64) -> u64 {
        let unit = self.unit_bytes();
        self.vdevs
            .iter()
            .filter(|v| !v.log_only)
            .map(|v| v.asize(psize, unit))
            .max()
            .unwrap_or_else(|| psize.max(1).div_ceil(unit) * unit)
    }

    /// Whether intent-log blocks may land on a RAID-Z vdev: no log device, and some data vdev
    /// is RAID-Z (log devices are never RAID-Z).
    pub fn log_blocks_on_raidz(&self) -> bool {
        !self.vdevs.iter().any(|v| v.log_only && !v.removing)
            && self.vdevs.iter().any(|v| v.geometry.is_some())
    }

    /// Whether a log block on `vdev` must be written whole, to its full length: on RAID-Z
    /// whose log blocks are striped, where a block's columns depend on its length.
    pub fn log_written_whole(&self, vdev: u32) -> bool {
        self.vdevs
            .get(vdev as usize)
            .and_then(|v| v.geometry)
            .is_some_and(|g| g.log_layout() == RaidzLayout::Striped)
    }

    /// The most an intent-log block of `psize` bytes allocates on any data vdev.
    fn log_asize(&self, psize: u64) -> u64 {
        let unit = self.unit_bytes();
        self.vdevs
            .iter()
            .filter(|v| !v.log_only)
            .map(|v| v.log_asize(psize, unit))
            .max()
            .unwrap_or_else(|| self.asize(psize))
    }

    /// The bytes a block of `psize` allocates on `vdev`.
    pub fn asize_on(&self, vdev: u32, psize: u64) -> u64 {
        self.vdevs[vdev as usize].asize(psize, self.unit_bytes())
    }

    /// Gives RAID-Z vdevs their shape (`None` for the others), before anything is allocated
    /// or right after a load: their free space then counts in whole blocks of each of
    /// [`ROOM_BLOCK_BYTES`] at what such a block allocates there ([`Allocator::room_bytes`]),
    /// and a vdev whose log blocks are copies gets a log region to match.
    pub fn with_geometries(mut self, geometries: &[Option<RaidzGeometry>]) -> Allocator {
        assert_eq!(geometries.len(), self.vdevs.len(), "a shape per top-level vdev");
        for (space, geometry) in self.vdevs.iter_mut().zip(geometries) {
            space.geometry = *geometry;
            if let Some(geometry) = geometry {
                let mut free =
                    RangeTree::with_room_units(ROOM_BLOCK_BYTES.map(|b| geometry.asize(b)));
                for (start, len) in space.free.iter() {
                    free.insert(start, len);
                }
                space.free = free;
                let area = space.data_end - space.data_start;
                space.set_log_region(vdev_log_region_bytes(area, Some(geometry)));
            }
        }
        self
    }

    /// Adds a top-level vdev whose data area `[start, end)` is all free (`pool add`): a RAID-Z
    /// one with its shape, a separate log device holding only log blocks. Returns its index.
    pub fn add_vdev(
        &mut self,
        (start, end): (u64, u64),
        geometry: Option<RaidzGeometry>,
        log_only: bool,
    ) -> u32 {
        let mut fresh = Allocator::new(self.ashift, &[(start, end)]);
        if geometry.is_some() {
            fresh = fresh.with_geometries(&[geometry]);
        }
        let mut space = fresh.vdevs.remove(0);
        space.log_only = log_only;
        self.vdevs.push(space);
        self.deferred_entries.push(0);
        self.scan.add_vdev();
        (self.vdevs.len() - 1) as u32
    }

    /// Stops (or, with `removing` false, resumes) placing log blocks on log device `vdev`:
    /// the first step of its removal ([`Allocator::remove_vdev`]).
    pub fn set_removing(&mut self, vdev: u32, removing: bool) {
        let space = &mut self.vdevs[vdev as usize];
        assert!(space.log_only, "only a log device is removed (vdev {vdev})");
        space.removing = removing;
    }

    /// Bytes of log blocks on `vdev` that are live or waiting out their free's deferral.
    pub fn log_held_on(&self, vdev: u32) -> u64 {
        self.vdevs[vdev as usize].log.total_bytes()
    }

    /// Whether `vdev` is a hole: a removed log device's place, with no data area.
    pub fn is_hole(&self, vdev: u32) -> bool {
        let space = &self.vdevs[vdev as usize];
        space.data_start == space.data_end
    }

    /// Makes log device `vdev` a hole (`pool remove`): no space and nothing placed there
    /// again. It must hold no log block ([`Allocator::log_held_on`]), and a log device holds
    /// nothing else.
    pub fn remove_vdev(&mut self, vdev: u32) {
        let space = &mut self.vdevs[vdev as usize];
        assert!(space.log_only && space.removing, "vdev {vdev} is not a log device being removed");
        assert!(space.log.is_empty(), "vdev {vdev} still holds log blocks");
        assert_eq!(self.deferred_entries[vdev as usize], 0, "a log device holds no data");
        let start = space.data_start;
        let mut hole = Allocator::new(self.ashift, &[(start, start)]).vdevs.remove(0);
        hole.removing = true;
        *space = hole;
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

    /// An intent-log block that is not a chain's head: as [`Allocator::allocate_log_near`],
    /// but on the data vdevs only while what admission promised the syncs
    /// ([`Allocator::promise`]) and [`SlopTier::Freeing`]'s part of the slop stay free. Log
    /// blocks are allocated between a txg's admission and its sync, which does not count them,
    /// so without this they could take the room the sync was promised; a chain that finds no
    /// block falls back to a txg sync, where a head must not fail.
    pub fn allocate_log_block(
        &mut self,
        psize: u64,
        near: Option<u32>,
    ) -> Result<(u32, u64, u64), AllocError> {
        // A log device with room takes it, whatever the data vdevs hold.
        if self.vdevs.iter().any(|v| v.log_only && !v.removing) {
            if let Ok(placed) = self.place_log(psize, near, false) {
                return Ok(placed);
            }
        }
        let asize = self.log_asize(psize.max(1));
        let floor = SlopTier::Freeing.kept(self.slop_bytes());
        let room_floor = floor.saturating_add(self.promised_bytes());
        if self.free_bytes() < asize.saturating_add(floor)
            || self.room_bytes() < asize.saturating_add(room_floor)
        {
            return Err(AllocError::NoSpace {
                requested_bytes: asize,
                free_bytes: self.free_bytes(),
                slop_bytes: self.slop_bytes(),
            });
        }
        self.place_log(psize, near, true)
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
        self.place_log(psize, near, true)
    }

    /// Places a log block on a log device, else (with `data_vdevs`) on a data vdev.
    fn place_log(
        &mut self,
        psize: u64,
        near: Option<u32>,
        data_vdevs: bool,
    ) -> Result<(u32, u64, u64), AllocError> {
        let worst = self.log_asize(psize.max(1));
        let unit = self.unit_bytes();
        let count = self.vdevs.len();
        let has_log_devices = self.vdevs.iter().any(|v| v.log_only && !v.removing);
        let near = near.map(|v| v as usize).filter(|&v| {
            v < count && self.vdevs[v].log_only == has_log_devices && !self.vdevs[v].removing
        });
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
            .chain(
                (0..count)
                    .map(|i| (start + i) % count)
                    .filter(|&v| data_vdevs && !self.vdevs[v].log_only),
            )
            .filter(|&v| !self.vdevs[v].removing)
            .collect();
        for vdev in order {
            let space = &mut self.vdevs[vdev];
            let asize = space.log_asize(psize, unit);
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
            requested_bytes: worst,
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

    /// [`Allocator::allocate_indirect`] for blocks of each of `psizes`, all or none, placed
    /// in as few runs of at most `run_bytes` as the free ranges allow
    /// ([`Allocator::allocate_runs`]): a large write's blocks go out as a few long writes.
    pub fn allocate_indirect_all(
        &mut self,
        psizes: &[u64],
        run_bytes: u64,
    ) -> Result<Vec<(u32, u64, u64)>, AllocError> {
        let placed = self.allocate_runs(psizes, AllocClass::Normal, run_bytes)?;
        // Allocated for the open txg's writer, not by a sync: admission counts it apart. Held
        // as log space a run at a time (one insert each, not one per block).
        let mut held: Option<(u32, u64, u64)> = None;
        for &(vdev, at, asize) in &placed {
            self.allocated_total -= asize;
            held = match held {
                Some((v, start, len)) if v == vdev && start + len == at => {
                    Some((v, start, len + asize))
                }
                Some((v, start, len)) => {
                    self.vdevs[v as usize].log.insert(start, len);
                    Some((vdev, at, asize))
                }
                None => Some((vdev, at, asize)),
            };
        }
        if let Some((v, start, len)) = held {
            self.vdevs[v as usize].log.insert(start, len);
        }
        Ok(placed)
    }

    /// [`Allocator::allocate_indirect_all`] for a commit's blocks of the open txg, refused
    /// (nothing placed) unless what admission promised the syncs ([`Allocator::promise`])
    /// still fits beside them above the slop, in free ranges that hold blocks of
    /// `block_bytes`. Those blocks are in the promise too, but they cannot count against it:
    /// should their txg close before the commit records them (the syncer runs on a thread of
    /// its own, and a stream's final flush seals and places up to a txg of blocks), they are
    /// orphans that hold their space until a sync frees them while that txg's sync allocates
    /// the same data again. A pool was suspended for space by a sync at the final flush of
    /// 1 MiB writes streamed over a thick volume half its size (bench/peers.sh, 2026-11-30),
    /// and this was the one allocation of a commit found not held to the promise. A commit
    /// refused falls back to a sync, which writes the blocks once.
    pub fn allocate_indirect_promised(
        &mut self,
        psizes: &[u64],
        run_bytes: u64,
        block_bytes: u64,
    ) -> Result<Vec<(u32, u64, u64)>, AllocError> {
        let placed = self.allocate_indirect_all(psizes, run_bytes)?;
        let keep = self.slop_bytes().saturating_add(self.promised_bytes());
        if self.room_bytes_for(block_bytes) < keep {
            let requested_bytes = placed.iter().map(|p| p.2).sum();
            for &(vdev, at, asize) in &placed {
                self.release_indirect(vdev, at, asize);
            }
            return Err(AllocError::NoSpace {
                requested_bytes,
                free_bytes: self.free_bytes(),
                slop_bytes: self.slop_bytes(),
            });
        }
        Ok(placed)
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
        self.room_bytes_for(METADATA_BLOCK_BYTES_MAX)
    }

    /// Free space (on data vdevs taking new blocks and not short of space) in ranges after the
    /// log region of at least the smallest of [`RUN_ROOM_BYTES`] that is `run_bytes` or more
    /// (or the largest; on RAID-Z, what blocks of those sizes allocate there): what
    /// blocks written together can take and still lie in runs that long. Once random writes
    /// have left the rest in small holes, blocks placed there lie as scattered as before.
    pub fn run_room_bytes(&self, run_bytes: u64) -> u64 {
        let tier =
            RUN_ROOM_BYTES.iter().position(|&b| b >= run_bytes).unwrap_or(RUN_ROOM_BYTES.len() - 1);
        // A tight vdev places by best fit into the smallest hole that holds a block, so its
        // long runs are not where the next blocks go.
        let taking = self.vdevs.iter().filter(|v| !v.log_only && !v.removing && !v.is_tight());
        taking.map(|v| v.free.run_bytes(tier)).sum()
    }

    /// Free space (on data vdevs) that data blocks of `block_bytes` could take, each free range
    /// counted in whole blocks of the smallest of [`ROOM_BLOCK_BYTES`] that holds one: what
    /// admission weighs a volume's writes against.
    pub fn room_bytes_for(&self, block_bytes: u64) -> u64 {
        let tier = room_tier(block_bytes);
        self.vdevs.iter().filter(|v| !v.log_only).map(|v| v.free.room_bytes(tier)).sum()
    }

    /// Bytes allocated for txgs' blocks so far (never for log blocks or blocks written in
    /// place for the log). The store reads it when a txg quiesces and again while that txg
    /// syncs: the difference is what the sync has already taken out of [`Allocator::free_bytes`],
    /// which admission must not count a second time as still to come.
    pub fn allocated_total(&self) -> u64 {
        self.allocated_total
    }

    /// Whether the data vdevs have less room for blocks of `block_bytes` than
    /// [`SHORT_OF_ROOM_SLOPS`] slop reserves. A thick volume then stores its blocks whole,
    /// uncompressed: a block that compressed leaves, when it is replaced, a hole smaller than
    /// a block, which no block that does not compress can use (there are no gang blocks to
    /// split one). On a pool the volume nearly filled, such holes took 320 MB of 340 MB free,
    /// and 1 MiB overwrites of the thick volume were refused for space (2026-11-29).
    pub fn short_of_room(&self, block_bytes: u64) -> bool {
        self.room_bytes_for(block_bytes) < SHORT_OF_ROOM_SLOPS.saturating_mul(self.slop_bytes())
    }

    pub fn slop_bytes(&self) -> u64 {
        (self.capacity_bytes() >> SLOP_SHIFT).max(SLOP_BYTES_MIN).min(self.capacity_bytes() / 2)
    }

    /// Allocates a metadata block of `bytes` in `copies` copies (ditto blocks) from the
    /// sync's reserve; an extra copy that finds no room is left out, as in ZFS. Returns each
    /// copy's (vdev, offset, asize), the first copy first.
    pub fn allocate_metadata(
        &mut self,
        bytes: u64,
        copies: usize,
    ) -> Result<Vec<(u32, u64, u64)>, AllocError> {
        let first = self.allocate(bytes, AllocClass::Reserved, &[])?;
        let mut placed = vec![first];
        while placed.len() < copies {
            let others: Vec<(u32, u64)> = placed.iter().map(|p| (p.0, p.1)).collect();
            match self.allocate_ditto(bytes, AllocClass::Reserved, &others) {
                Ok(at) => placed.push(at),
                Err(_) => break,
            }
        }
        Ok(placed)
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
        let worst = self.asize(psize.max(1));
        let no_space = self.check_space(worst, class)?;
        let count = self.vdevs.len();
        self.advance_rotor();
        let vdevs = &self.vdevs;
        let order = (0..count)
            .map(|i| (self.rotor + i) % count)
            .filter(|&v| !vdevs[v].log_only && !vdevs[v].removing);
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
            let asize = space.asize(psize, unit);
            let tight = space.is_tight();
            let found =
                if tight { space.free.best_fit(asize, unit) } else { space.data_fit(asize, unit) };
            if let Some(at) = found {
                self.take(vdev, at, asize);
                return Ok((vdev as u32, at, asize));
            }
        }
        // Enough free space in total, but no single free range is large enough.
        Err(no_space)
    }

    /// Moves the rotor to the next vdev once this one has had its aliquot.
    fn advance_rotor(&mut self) {
        if self.rotor_bytes >= ROTOR_ALIQUOT_BYTES {
            self.rotor = (self.rotor + 1) % self.vdevs.len();
            self.rotor_bytes = 0;
        }
    }

    /// Takes `[at, at + len)` of `vdev`'s free space for txgs' blocks: the cursor moves past
    /// it, `allocated_total` and the rotor count it.
    fn take(&mut self, vdev: usize, at: u64, len: u64) {
        let space = &mut self.vdevs[vdev];
        space.free.remove(at, len);
        space.cursor = at + len;
        self.allocated_total += len;
        if vdev == self.rotor {
            self.rotor_bytes += len;
        } else {
            self.rotor = vdev;
            self.rotor_bytes = len;
        }
    }

    /// Places blocks of `psizes` back to back in one free range of one data vdev, so that they
    /// go out as one write and a later sequential read takes them as one span; `None` when no
    /// vdev with room has a free range that holds them all, or the vdevs are short of space
    /// (best fit then keeps the large ranges), and [`Allocator::allocate_span`] places them in
    /// pieces or one by one. A txg's
    /// blocks placed one at a time from the cursor took, on a pool that random 4 KiB writes
    /// had left full of 16 KiB holes, one hole each: a 1 MiB write became dozens of writes, and
    /// its sequential read as many reads.
    pub fn allocate_run(
        &mut self,
        psizes: &[u64],
        class: AllocClass,
    ) -> Option<Vec<(u32, u64, u64)>> {
        if psizes.len() < 2 {
            return None;
        }
        self.place_back_to_back(psizes, class, |space, total, _, unit| {
            // Only after the log region ([`VdevSpace::data_fit`] enters it when nothing after
            // it fits, which for a whole run is the common case on an aged pool, and the
            // region, often the largest range, would take every run), and only where the
            // ranges by size say something fits (no walk of every range under the lock).
            let (lo, hi) = (space.log_region_end, space.data_end);
            if !space.free.fits_from(total, unit, lo) {
                return None;
            }
            let start = space.free.first_fit_within(total, unit, space.cursor, (lo, hi))?;
            Some((start, start + total))
        })
    }

    /// Places blocks of `psizes`, in order, in spans of at most `run_bytes`, each placed by
    /// [`Allocator::allocate_span`]. All or none: on a block that finds no room, every block
    /// placed before it is given back and that block's error returned. Blocks written in place
    /// for the log and a receive's are placed this way.
    pub fn allocate_runs(
        &mut self,
        psizes: &[u64],
        class: AllocClass,
        run_bytes: u64,
    ) -> Result<Vec<(u32, u64, u64)>, AllocError> {
        let mut placed = Vec::with_capacity(psizes.len());
        for piece in run_pieces(psizes, run_bytes) {
            match self.allocate_span(&psizes[piece], class) {
                Ok(span) => placed.extend(span),
                Err((_, error)) => {
                    self.untake_all(&placed);
                    return Err(error);
                }
            }
        }
        Ok(placed)
    }

    /// Places the blocks of a span (`psizes`, in order: what one write would carry) in as few
    /// free ranges as it can. One range that holds them all, near the cursor, first
    /// ([`Allocator::allocate_run`]); else piece by piece, each piece the blocks that fit in
    /// the smallest range that holds the rest of the span, or else in the largest range
    /// ([`VdevSpace::piece_fit`]); a vdev short of space, and a lone block, block by block
    /// ([`Allocator::allocate`]). All or none: on a block that finds no room, everything placed
    /// is given back, and the error comes with that block's index.
    ///
    /// Why the largest ranges: once random writes have left the free space in 16 KiB holes, a
    /// span placed block by block near the cursor fills the holes there, and the next pass
    /// of a stream over the same blocks frees the same holes again: the layout keeps itself,
    /// and every 1 MiB write went out as 13-24 device writes (bench/per-op.sh seqwrite
    /// --volume-mib 2048 --age 30). Pieces taken from the largest ranges leave the small
    /// holes alone, so they merge with the blocks freed beside them, and each pass of the
    /// stream finds longer ranges than the last. ZFS gets there by weighting its metaslabs by
    /// their largest free segment.
    pub fn allocate_span(
        &mut self,
        psizes: &[u64],
        class: AllocClass,
    ) -> Result<Vec<Place>, (usize, AllocError)> {
        if let Some(run) = self.allocate_run(psizes, class) {
            return Ok(run);
        }
        let mut placed: Vec<(u32, u64, u64)> = Vec::with_capacity(psizes.len());
        // Once no piece is found, none will be for this span: the rest goes block by block.
        let mut pieces = psizes.len() >= 2;
        while placed.len() < psizes.len() {
            let rest = &psizes[placed.len()..];
            if pieces && rest.len() >= 2 {
                if let Some(piece) = self.allocate_piece(rest, class) {
                    placed.extend(piece);
                    continue;
                }
                pieces = false;
            }
            match self.allocate(rest[0], class, &[]) {
                Ok(at) => placed.push(at),
                Err(error) => {
                    let block = placed.len();
                    self.untake_all(&placed);
                    return Err((block, error));
                }
            }
        }
        Ok(placed)
    }

    /// The first blocks of `psizes` back to back in the range [`VdevSpace::piece_fit`] picks
    /// on the rotor's vdev (or the next with room that is not short of space); `None` when
    /// none has one, or the pool has no room for them all.
    fn allocate_piece(
        &mut self,
        psizes: &[u64],
        class: AllocClass,
    ) -> Option<Vec<(u32, u64, u64)>> {
        self.place_back_to_back(psizes, class, |space, rest, first, unit| {
            space.piece_fit(rest, first, unit)
        })
    }

    /// The first blocks of `psizes` back to back from where `fit` says, on the rotor's vdev or
    /// the next data vdev that `fit` finds room on; vdevs short of space are passed over (best
    /// fit keeps their large ranges). `fit` gets the blocks' total and first size as that vdev
    /// allocates them, and the unit, and answers the aligned start and the end of the range;
    /// as many blocks as fit before that end are taken. `None` when no vdev has such a range,
    /// or the pool has no room for them all.
    fn place_back_to_back(
        &mut self,
        psizes: &[u64],
        class: AllocClass,
        fit: impl Fn(&VdevSpace, u64, u64, u64) -> Option<(u64, u64)>,
    ) -> Option<Vec<Place>> {
        let worst: u64 = psizes.iter().map(|&p| self.asize(p)).sum();
        self.check_space(worst, class).ok()?;
        let unit = 1 << self.ashift;
        let count = self.vdevs.len();
        self.advance_rotor();
        for vdev in (0..count).map(|i| (self.rotor + i) % count) {
            let space = &self.vdevs[vdev];
            if space.log_only || space.removing || space.is_tight() {
                continue;
            }
            let sizes: Vec<u64> = psizes.iter().map(|&p| space.asize(p, unit)).collect();
            let Some((start, end)) = fit(space, sizes.iter().sum(), sizes[0], unit) else {
                continue;
            };
            let mut at = start;
            let placed: Vec<Place> = sizes
                .iter()
                .map_while(|&asize| {
                    (at + asize <= end).then(|| {
                        at += asize;
                        (vdev as u32, at - asize, asize)
                    })
                })
                .collect();
            assert!(!placed.is_empty(), "the range found holds at least the first block");
            assert!(start >= space.log_region_end, "blocks placed back to back in the log region");
            self.take(vdev, start, at - start);
            return Some(placed);
        }
        None
    }

    /// Gives back `[at, at + len)` that [`Allocator::take`] took and nothing was written to.
    fn untake(&mut self, vdev: usize, at: u64, len: u64) {
        self.vdevs[vdev].free.insert(at, len);
        self.allocated_total -= len;
    }

    /// [`Allocator::untake`] for each of `placed`.
    fn untake_all(&mut self, placed: &[(u32, u64, u64)]) {
        for &(vdev, at, asize) in placed {
            self.untake(vdev as usize, at, asize);
        }
    }

    /// Refuses `asize` bytes of `class` when the pool has not that much free above the slop
    /// reserve (which only `Normal` allocations must leave); otherwise returns the error to
    /// give if no free range turns out to fit.
    fn check_space(&self, asize: u64, class: AllocClass) -> Result<AllocError, AllocError> {
        let free = self.free_bytes();
        let no_space = AllocError::NoSpace {
            requested_bytes: asize,
            free_bytes: free,
            slop_bytes: self.slop_bytes(),
        };
        // An ordinary allocation is held to the figure admission counts (whole blocks in free
        // ranges), so the two never disagree about what is left above the slop.
        let (have, floor) = match class {
            AllocClass::Normal => (self.room_bytes(), self.slop_bytes()),
            AllocClass::Reserved => (free, 0),
        };
        if have < asize.saturating_add(floor) {
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
        let worst = self.asize(psize.max(1));
        let no_space = self.check_space(worst, class)?;
        let unit = 1 << self.ashift;
        for vdev in 0..self.vdevs.len() {
            let space = &mut self.vdevs[vdev];
            if space.log_only || space.removing || copies.iter().any(|&(v, _)| v as usize == vdev) {
                continue;
            }
            let asize = space.asize(psize, unit);
            if let Some(at) = space.data_fit(asize, unit) {
                space.free.remove(at, asize);
                space.cursor = at + asize;
                self.allocated_total += asize;
                return Ok((vdev as u32, at, asize));
            }
        }
        let vdev = copies[0].0;
        let space = &mut self.vdevs[vdev as usize];
        let asize = space.asize(psize, unit);
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
        self.deferred_total += len;
        // A free that continues the last one joins it: a sync frees the blocks a stream
        // replaced, mostly back to back, and each entry is an insert into a free tree once
        // its deferral ends, and an entry in the space map until then.
        let frees = self.deferred.entry(txg).or_default();
        match frees.last_mut() {
            Some((v, s, l)) if *v == vdev && *s + *l == start => *l += len,
            _ => {
                frees.push((vdev, start, len));
                self.deferred_entries[vdev as usize] += 1;
            }
        }
    }

    /// Records that `txg` is durable: frees whose deferral has ended become allocatable.
    pub fn synced(&mut self, txg: u64) {
        while self.synced_some(txg, usize::MAX) {}
    }

    /// [`Allocator::synced`] a step at a time: makes at most `budget` of the frees whose
    /// deferral has ended allocatable and returns whether any is left, for the caller to ask
    /// again after letting the allocator's lock go. A sync after many small writes ends the
    /// deferral of tens of thousands of frees, each an insert into a free tree, and every
    /// write's admission and every log block waits for this lock: in one go that held the
    /// volume's serving core for about 10 ms (docs/bench/peers-notes.md). Frees a scan still
    /// holds stay deferred and are not counted against `budget`, so each step but the last
    /// makes `budget` of them allocatable and the steps end.
    pub fn synced_some(&mut self, txg: u64, budget: usize) -> bool {
        assert!(txg >= self.synced_txg, "txgs sync in order");
        assert!(budget > 0, "a step that may release nothing never ends");
        self.synced_txg = txg;
        // Log blocks first, all at once: a txg frees a few of them.
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
        // A pinned tree's blocks freed after it stay allocated.
        let pinned = self.pins.keys().next().copied().unwrap_or(u64::MAX);
        let last = txg.saturating_sub(FREE_DEFER_TXGS).min(pinned);
        let ready: Vec<u64> = self.deferred.range(..=last).map(|(t, _)| *t).collect();
        let mut left = budget;
        for t in ready {
            let frees = self.deferred.get_mut(&t).expect("a ready txg has frees");
            let mut held = Vec::new();
            while let Some((vdev, start, len)) = frees.pop() {
                // A block a scan is reading stays allocated (and in the space map's deferred
                // frees) until a sync after its read; the rest of a free that covers it (frees
                // of blocks back to back are joined) is released around it.
                let reading = self.scan.reading_within(vdev, start, len);
                let end = start + len;
                let mut at = start;
                let mut released = false;
                self.deferred_entries[vdev as usize] -= 1;
                for (from, to) in reading.into_iter().chain([(end, end)]) {
                    if at < from {
                        let released_now = self.scan.release(vdev, at, from - at);
                        assert!(released_now, "no scan read lies between the ones found");
                        self.deferred_total -= from - at;
                        self.vdevs[vdev as usize].free.insert(at, from - at);
                        released = true;
                    }
                    if from < to {
                        held.push((vdev, from, to - from));
                        self.deferred_entries[vdev as usize] += 1;
                    }
                    at = to;
                }
                if !released {
                    continue;
                }
                left -= 1;
                if left == 0 {
                    // Held frees go in front, so the next step takes the others first.
                    held.append(frees);
                    *frees = held;
                    if frees.is_empty() {
                        self.deferred.remove(&t);
                    }
                    return self.deferred.range(..=last).next().is_some();
                }
            }
            if held.is_empty() {
                self.deferred.remove(&t);
            } else {
                *frees = held;
            }
        }
        false
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

    /// At least as many entries as [`Allocator::space_map_entries`] counts for `vdev`, read
    /// off running counts (every write's space check bounds the next maps' size with it).
    pub fn space_map_entries_bound(&self, vdev: u32) -> (usize, usize) {
        let space = &self.vdevs[vdev as usize];
        (space.free.len() + space.log.len(), self.deferred_entries[vdev as usize])
    }

    /// Top-level vdevs, log devices included: each has a space map.
    pub fn vdev_count(&self) -> usize {
        self.vdevs.len()
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
            let mut free = RangeTree::with_room_units(ROOM_BLOCK_BYTES);
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
                    || free.intersects(s, l)
                    || !claimed.try_insert(s, l)
                {
                    return Err(corrupt(format!("deferred free [{s}, +{l}) is invalid")));
                }
                allocator.deferred.entry(txg).or_default().push((vdev as u32, s, l));
                allocator.deferred_total += l;
                allocator.deferred_entries[vdev] += 1;
            }
            let space = &mut allocator.vdevs[vdev];
            space.free = free;
            let floors = space.run_floors();
            space.free.count_runs(floors, space.log_region_end);
            space.cursor = space.log_region_end;
            synced_txg = synced_txg.max(map.synced_txg);
        }
        allocator.synced_txg = synced_txg;
        Ok(allocator)
    }
}

#[cfg(test)]
mod tests;
