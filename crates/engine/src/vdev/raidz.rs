//! RAID-Z vdevs: every block a full stripe of its own, its data in columns on the children
//! beside one, two or three columns of parity (ZFS: `vdev_raidz.c`; the layout and the parity
//! arithmetic are the on-disk format, in `sluice_format::raidz`).
//!
//! Addresses: a RAID-Z vdev numbers its sectors row by row across the children, so a block's
//! offset on the vdev is `row * width + child` sectors, and a child's sector `row` lies at byte
//! `row << ashift` of the leaf. The vdev's data space is the children's data areas side by side:
//! `[width * DATA_START_BYTES, width * child_end_bytes)`. Labels are the leaves' own (every leaf
//! carries the pool's labels and uberblocks whole), so nothing of them is striped.
//!
//! Reads ask the children only for the block's data columns. A column whose child cannot serve
//! it (out of service, or behind: a resilver has yet to copy what it missed) is rebuilt from
//! parity, up to `parity` of them. When the assembled block fails its checksum, every column is
//! read and the vdev tries each combination of up to `parity` columns as the wrong ones,
//! rebuilding them from the rest until the block verifies (ZFS's combinatorial reconstruction);
//! the columns found wrong are counted as checksum errors on their leaves and rewritten. The
//! search is bounded by [`RECONSTRUCT_COMBINATIONS_MAX`] and says when it gave up.
//!
//! Intent-log blocks are laid out as the vdev's config says ([`RaidzLayout`]): striped like
//! any block on pools made before `raidz_log_copies`, else as one data column and its copies
//! ([`Raidz::read_log`], [`Raidz::write_log`]), so that a log block is `parity + 1` writes.
//!
//! Writes compute the parity and write one column per child. A write succeeds when at most
//! `parity` columns failed (the block can still be read); a durable write (the intent log's,
//! its lwbs' and its indirect records' blocks') fails when a present child failed, as a
//! mirror's does, so that an acknowledged record does not depend on a column that never
//! reached its disk. Flushes go only to the children written
//! since their last flush.
//!
//! A child being replaced is a pair in its column's slot: writes go to both leaves, reads to the
//! old one until the new one has caught up (the pool marks it behind until its resilver is done).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use futures::future::join_all;
use sluice_format::raidz::{self, RaidzGeometry, RaidzLayout, RaidzMap};
use sluice_format::DATA_START_BYTES;

use super::leaf::{Leaf, LeafState};
use super::mirror::ScrubOutcome;
use super::{RunBlock, VdevError, VdevId};
use crate::device::{AlignedBuf, SharedBuf};
use crate::tunables::IoClass;

/// The most combinations of wrong columns one read tries before it gives up: a raidz3 of 64
/// children has 43,745 combinations of up to three columns (the empty one included), each a
/// rebuild and a checksum of the block; past this many, a block is called lost rather than
/// holding up its reader for seconds. Every combination of a raidz3 of up to 41 children
/// fits.
pub const RECONSTRUCT_COMBINATIONS_MAX: u32 = 12_000;

/// A RAID-Z vdev.
#[derive(Debug)]
pub struct Raidz {
    id: VdevId,
    geometry: RaidzGeometry,
    /// One per column, in column order.
    children: Vec<Arc<Leaf>>,
    /// The leaf replacing each column's child, while a replace runs.
    replacing: Vec<Option<Arc<Leaf>>>,
    /// Where each child's data area ends (see the module doc).
    child_end_bytes: u64,
    /// False while the pool is opened read-only: wrong columns found are left as they are.
    repairs: AtomicBool,
    /// Held while a child's diagnosis is acted on, so two children failing at once cannot
    /// each count the other as serving and both be taken out.
    diagnosis: parking_lot::Mutex<()>,
    /// Per column: writes of a column that no leaf took (out of service, or failed), counted;
    /// and of that count, how many a successful flush has accounted for (the count when it
    /// started). A flush counts a column with writes not accounted for as one whose blocks
    /// lack it, beside the columns whose flush failed: blocks written since the last flush
    /// are durable only if at most `parity` of their columns are not.
    missed: Vec<AtomicU64>,
    missed_flushed: Vec<AtomicU64>,
    /// Parity buffers of writes that have ended, kept for the next ones: a sync of 1 MiB
    /// writes on a raidz1 of 4 allocates a third of its bytes again as parity, and fresh
    /// allocations cost page faults (with huge pages, a 2 MiB clear each) that made the
    /// server's CPU per MiB half again a mirror's (perf, 2026-11-29). Parity is computed over
    /// the whole buffer, so a reused one needs no clearing. At most [`PARITY_SPARE_BYTES`].
    parity_spare: parking_lot::Mutex<ParitySpare>,
}

/// Kept parity buffers by length, and their bytes. Kept by length because a vdev holds
/// thousands of small ones (a 4 KiB log block's parity is one sector): a list searched and
/// summed at each write took more of a 4 KiB write's CPU than computing its parity (perf,
/// 2026-11-29).
#[derive(Debug, Default)]
struct ParitySpare {
    by_len: std::collections::HashMap<usize, Vec<AlignedBuf>>,
    held: usize,
}

/// The most bytes of parity buffers a RAID-Z vdev keeps for reuse.
const PARITY_SPARE_BYTES: usize = 16 << 20;

/// The columns of one block as read: each column's bytes, or why it has none.
struct Stripe {
    map: RaidzMap,
    bufs: Vec<Option<AlignedBuf>>,
    /// The leaf each column was read from (its index in the column's slot), if one was asked.
    source: Vec<Option<usize>>,
    /// Columns whose read failed on a present leaf: unknown, not wrong.
    unreadable: Vec<bool>,
}

/// A block read whole, with what was wrong on the way.
struct Found {
    map: RaidzMap,
    data: AlignedBuf,
    /// Every column's correct bytes (data and parity), in map order; empty when the block was
    /// read from its data columns alone and nothing needs rewriting.
    columns: Vec<AlignedBuf>,
    /// Columns that were read and held wrong bytes.
    wrong: Vec<usize>,
    /// Columns whose read failed on a present leaf.
    unreadable: Vec<usize>,
    /// The leaf each column was read from (its index in the column's slot).
    source: Vec<Option<usize>>,
}

/// Why a block could not be had.
struct Lost {
    unreadable: u32,
    combinations: u32,
    gave_up: bool,
    /// The leaves columns were read from, as (child, index in the slot): each may hold the
    /// wrong bytes, so each is counted when nothing verified.
    read: Vec<(u32, usize)>,
}

impl Raidz {
    /// A RAID-Z vdev of `children` in column order, with `replacing[c]` the leaf replacing
    /// column `c`'s child, if any.
    pub fn new(
        id: VdevId,
        geometry: RaidzGeometry,
        children: Vec<Arc<Leaf>>,
        replacing: Vec<Option<Arc<Leaf>>>,
        child_end_bytes: u64,
    ) -> Raidz {
        assert_eq!(children.len(), geometry.width() as usize, "one child per column");
        assert_eq!(replacing.len(), children.len(), "a replacing slot per column");
        assert!(child_end_bytes > DATA_START_BYTES, "children have a data area");
        let width = children.len();
        Raidz {
            id,
            geometry,
            children,
            replacing,
            child_end_bytes,
            repairs: AtomicBool::new(true),
            diagnosis: parking_lot::Mutex::new(()),
            missed: (0..width).map(|_| AtomicU64::new(0)).collect(),
            missed_flushed: (0..width).map(|_| AtomicU64::new(0)).collect(),
            parity_spare: parking_lot::Mutex::new(ParitySpare::default()),
        }
    }

    pub fn id(&self) -> VdevId {
        self.id
    }

    pub fn geometry(&self) -> RaidzGeometry {
        self.geometry
    }

    /// The children in column order (not their replacements).
    pub fn children(&self) -> &[Arc<Leaf>] {
        &self.children
    }

    /// The leaf replacing column `column`'s child, if a replace runs there.
    pub fn replacement(&self, column: usize) -> Option<&Arc<Leaf>> {
        self.replacing.get(column).and_then(Option::as_ref)
    }

    /// Every leaf: each column's child, followed by its replacement if it has one.
    pub fn leaves(&self) -> Vec<Arc<Leaf>> {
        self.children
            .iter()
            .zip(&self.replacing)
            .flat_map(|(child, new)| std::iter::once(child).chain(new.as_ref()))
            .cloned()
            .collect()
    }

    pub fn child_end_bytes(&self) -> u64 {
        self.child_end_bytes
    }

    /// The vdev's data space (see the module doc).
    pub fn data_area(&self) -> (u64, u64) {
        let width = u64::from(self.geometry.width());
        (width * DATA_START_BYTES, width * self.child_end_bytes)
    }

    /// The bytes a block of `psize` allocates here.
    pub fn asize(&self, psize: u64) -> u64 {
        self.geometry.asize(psize)
    }

    /// Turns the rewriting of wrong columns on or off (off while opened read-only).
    pub fn set_repairs(&self, on: bool) {
        self.repairs.store(on, Ordering::Relaxed);
    }

    /// The leaves of column `c`'s slot: its child, then its replacement.
    fn slot(&self, c: u32) -> impl Iterator<Item = &Arc<Leaf>> + Clone {
        let c = c as usize;
        std::iter::once(&self.children[c]).chain(self.replacing[c].as_ref())
    }

    /// The leaf (index in the slot) to read column `child` from: an up-to-date one in service,
    /// or with `stale_ok` any in service.
    fn reader(&self, child: u32, stale_ok: bool) -> Option<usize> {
        let serves =
            |leaf: &Arc<Leaf>| !leaf.is_out_of_service() && (stale_ok || !leaf.is_behind());
        // The up-to-date leaf first even when a stale one would do.
        self.slot(child)
            .position(|l| serves(l) && !l.is_behind())
            .or_else(|| stale_ok.then(|| self.slot(child).position(serves)).flatten())
    }

    fn slot_leaf(&self, child: u32, index: usize) -> &Arc<Leaf> {
        match index {
            0 => &self.children[child as usize],
            _ => self.replacing[child as usize].as_ref().expect("a slot's second leaf replaces"),
        }
    }

    pub async fn read(
        &self,
        offset: u64,
        len: u32,
        class: IoClass,
        verify: &(dyn Fn(&[u8]) -> bool + Send + Sync),
    ) -> Result<AlignedBuf, VdevError> {
        self.read_counting(offset, len, class, verify, true).await
    }

    /// Reads the block of `len` bytes at `offset`: its data columns, rebuilding the ones whose
    /// child cannot serve them, then if it fails `verify` every column and the combinations
    /// (see the module doc). With `count_if_none` false, a block that no combination verifies
    /// is not counted as checksum errors (the end of an intent-log chain is such a block).
    pub async fn read_counting(
        &self,
        offset: u64,
        len: u32,
        class: IoClass,
        verify: &(dyn Fn(&[u8]) -> bool + Send + Sync),
        count_if_none: bool,
    ) -> Result<AlignedBuf, VdevError> {
        self.read_in(RaidzLayout::Striped, offset, len, class, verify, count_if_none).await
    }

    /// Reads an intent-log block, laid out as the vdev lays out log blocks. The end of a
    /// chain is a block no combination verifies, so that is not counted as checksum errors.
    pub async fn read_log(
        &self,
        offset: u64,
        len: u32,
        class: IoClass,
        verify: &(dyn Fn(&[u8]) -> bool + Send + Sync),
    ) -> Result<AlignedBuf, VdevError> {
        self.read_in(self.geometry.log_layout(), offset, len, class, verify, false).await
    }

    /// [`Raidz::read_counting`] of a block laid out as `layout`.
    async fn read_in(
        &self,
        layout: RaidzLayout,
        offset: u64,
        len: u32,
        class: IoClass,
        verify: &(dyn Fn(&[u8]) -> bool + Send + Sync),
        count_if_none: bool,
    ) -> Result<AlignedBuf, VdevError> {
        match self.find(layout, offset, len, class, verify).await {
            Ok(found) => {
                for &c in &found.wrong {
                    self.count_mismatch(&found, c);
                }
                let fix: Vec<usize> =
                    found.wrong.iter().chain(&found.unreadable).copied().collect();
                self.rewrite(&found.map, &found.columns, &fix).await;
                Ok(found.data)
            }
            Err(lost) => {
                // Counted only where columns were tried and none fitted: with too many columns
                // missing nothing says the ones read are wrong.
                if count_if_none && lost.combinations > 0 && !lost.gave_up {
                    for &(child, index) in &lost.read {
                        let leaf = self.slot_leaf(child, index);
                        if !leaf.is_behind() {
                            leaf.count_checksum_error();
                        }
                    }
                }
                Err(self.lost_error(offset, len, &lost))
            }
        }
    }

    fn lost_error(&self, offset: u64, len: u32, lost: &Lost) -> VdevError {
        VdevError::NotReconstructed {
            vdev: self.id,
            offset_bytes: offset,
            len_bytes: len,
            width: self.geometry.width(),
            parity: self.geometry.parity(),
            unreadable: lost.unreadable,
            combinations: lost.combinations,
            gave_up: lost.gave_up,
        }
    }

    /// Reads a block whole (see `read_counting`), without counting or repairing anything.
    async fn find(
        &self,
        layout: RaidzLayout,
        offset: u64,
        len: u32,
        class: IoClass,
        verify: &(dyn Fn(&[u8]) -> bool + Send + Sync),
    ) -> Result<Found, Lost> {
        let mut stripe = self.stripe(layout, offset, len);
        let parity = stripe.map.parity;
        let count = stripe.map.columns.len();
        // First the data columns from up-to-date leaves, parity only for the ones that cannot
        // be had that way.
        let want_data: Vec<usize> = (parity..count).collect();
        self.read_columns(&mut stripe, &want_data, false, class).await;
        let missing: Vec<usize> = (parity..count).filter(|&c| stripe.bufs[c].is_none()).collect();
        if missing.is_empty() {
            let data = assemble(&stripe.map, &stripe.bufs, len);
            if verify(&data) {
                let source = stripe.source;
                return Ok(Found {
                    map: stripe.map,
                    data,
                    columns: Vec::new(),
                    wrong: Vec::new(),
                    unreadable: Vec::new(),
                    source,
                });
            }
        } else if missing.len() <= parity {
            let parities: Vec<usize> = (0..parity).collect();
            self.read_columns(&mut stripe, &parities, false, class).await;
            let absent: Vec<usize> = (0..count).filter(|&c| stripe.bufs[c].is_none()).collect();
            if let Some(found) = self.attempt(&stripe, &absent, len, verify) {
                return Ok(found);
            }
        }
        // The slow way: every column, from any leaf in service, and each combination of
        // columns taken as wrong.
        let all: Vec<usize> = (0..count).collect();
        self.read_columns(&mut stripe, &all, true, class).await;
        self.search(&stripe, len, verify)
    }

    /// Reads the listed columns that have no bytes yet, concurrently; `stale_ok` lets a leaf
    /// that is behind serve.
    async fn read_columns(
        &self,
        stripe: &mut Stripe,
        columns: &[usize],
        stale_ok: bool,
        class: IoClass,
    ) {
        let reads = columns
            .iter()
            .copied()
            .filter(|&c| stripe.bufs[c].is_none() && !stripe.unreadable[c])
            .filter_map(|c| {
                let column = stripe.map.columns[c];
                let index = self.reader(column.child, stale_ok)?;
                // A column already asked of this leaf is not asked again.
                if stripe.source[c] == Some(index) {
                    return None;
                }
                let leaf = self.slot_leaf(column.child, index);
                let size = u32::try_from(column.size).expect("a column fits an I/O");
                Some(async move { (c, index, leaf.read(column.offset, size, class).await) })
            });
        for (c, index, result) in join_all(reads).await {
            stripe.source[c] = Some(index);
            match result {
                Ok(buf) => stripe.bufs[c] = Some(buf),
                Err(_) => {
                    let leaf = self.slot_leaf(stripe.map.columns[c].child, index);
                    if !leaf.is_out_of_service() {
                        stripe.unreadable[c] = true;
                    }
                    self.diagnose(leaf);
                }
            }
        }
    }

    /// Rebuilds the columns in `lost` from the others and checks the block; `None` when it
    /// does not verify (or too much is lost).
    fn attempt(
        &self,
        stripe: &Stripe,
        lost: &[usize],
        len: u32,
        verify: &(dyn Fn(&[u8]) -> bool + Send + Sync),
    ) -> Option<Found> {
        let map = &stripe.map;
        if lost.len() > map.parity {
            return None;
        }
        let mut columns: Vec<AlignedBuf> = map
            .columns
            .iter()
            .zip(&stripe.bufs)
            .enumerate()
            .map(|(c, (column, buf))| match buf {
                Some(buf) if !lost.contains(&c) => buf.clone(),
                _ => AlignedBuf::zeroed(column.size as usize),
            })
            .collect();
        if !lost.is_empty() {
            let mut views: Vec<&mut [u8]> = columns.iter_mut().map(|b| &mut b[..]).collect();
            // Lost data is solved from the parity; lost parity is computed again from the data.
            if raidz::reconstruct(&mut views, map.parity, lost).is_err() {
                return None;
            }
        }
        let data = assemble_owned(map, &columns, len);
        if !verify(&data) {
            return None;
        }
        Some(Found {
            map: map.clone(),
            data,
            columns,
            wrong: Vec::new(),
            unreadable: (0..map.columns.len()).filter(|&c| stripe.unreadable[c]).collect(),
            source: stripe.source.clone(),
        })
    }

    /// Tries each combination of up to `parity` columns, beside those that could not be read,
    /// as the wrong ones, fewest first.
    fn search(
        &self,
        stripe: &Stripe,
        len: u32,
        verify: &(dyn Fn(&[u8]) -> bool + Send + Sync),
    ) -> Result<Found, Lost> {
        let count = stripe.map.columns.len();
        let parity = stripe.map.parity;
        let known: Vec<usize> = (0..count).filter(|&c| stripe.bufs[c].is_none()).collect();
        let read: Vec<usize> = (0..count).filter(|&c| stripe.bufs[c].is_some()).collect();
        let unreadable = stripe.unreadable.iter().filter(|&&u| u).count() as u32;
        let mut combinations = 0u32;
        let mut gave_up = false;
        if known.len() <= parity {
            'sizes: for extra in 0..=parity - known.len() {
                let mut pick: Vec<usize> = (0..extra).collect();
                loop {
                    if combinations >= RECONSTRUCT_COMBINATIONS_MAX {
                        gave_up = true;
                        break 'sizes;
                    }
                    combinations += 1;
                    let guess: Vec<usize> = pick.iter().map(|&i| read[i]).collect();
                    let lost: Vec<usize> = known.iter().chain(&guess).copied().collect();
                    if let Some(mut found) = self.attempt(stripe, &lost, len, verify) {
                        // A guessed column is wrong only if its bytes differ from the rebuilt.
                        found.wrong = guess
                            .into_iter()
                            .filter(|&c| {
                                stripe.bufs[c]
                                    .as_ref()
                                    .is_some_and(|b| b[..] != found.columns[c][..])
                            })
                            .collect();
                        return Ok(found);
                    }
                    if !next_combination(&mut pick, read.len()) {
                        break;
                    }
                }
            }
        }
        let read = read
            .iter()
            .filter_map(|&c| Some((stripe.map.columns[c].child, stripe.source[c]?)))
            .collect();
        Err(Lost { unreadable, combinations, gave_up, read })
    }

    /// Counts a wrong column against the leaf it was read from, unless that leaf is known to
    /// be behind, and feeds the leaf's diagnosis (a scrub's finding as a read's: see
    /// docs/design.md, "Fault diagnosis and events").
    fn count_mismatch(&self, found: &Found, c: usize) {
        let Some(index) = found.source[c] else { return };
        let leaf = self.slot_leaf(found.map.columns[c].child, index);
        if leaf.is_behind() {
            return;
        }
        leaf.count_checksum_error();
        leaf.note_checksum_error();
        self.diagnose(leaf);
    }

    /// Rewrites columns `fix` of the block mapped by `map` from `columns` on every leaf of
    /// their slots in service, unless repairs are off. Counts a repair on each leaf that took
    /// one; returns how many did.
    async fn rewrite(&self, map: &RaidzMap, columns: &[AlignedBuf], fix: &[usize]) -> u32 {
        if fix.is_empty() || !self.repairs.load(Ordering::Relaxed) {
            return 0;
        }
        let writes = fix.iter().flat_map(|&c| {
            let column = map.columns[c];
            let data = SharedBuf::copy_from(&columns[c]);
            self.slot(column.child)
                .filter(|leaf| !leaf.is_out_of_service())
                .map(move |leaf| {
                    let data = data.clone();
                    async move {
                        let ok = leaf.write(column.offset, data, IoClass::AsyncWrite).await.is_ok();
                        if ok {
                            leaf.stats().repairs.inc();
                        }
                        ok
                    }
                })
                .collect::<Vec<_>>()
        });
        join_all(writes).await.into_iter().filter(|&ok| ok).count() as u32
    }

    /// Writes the block's columns, parity computed here; with `durable`, each child flushes its
    /// column before answering (see the module doc for what counts as success).
    pub async fn write_flushed(
        &self,
        offset: u64,
        data: SharedBuf,
        class: IoClass,
        durable: bool,
    ) -> Result<(), VdevError> {
        let asize = self.geometry.asize(data.len() as u64);
        let data = Arc::new(AlignedBuf::copy_from(&data));
        self.write_stripes(RaidzLayout::Striped, &[(offset, asize, data)], class, durable).await
    }

    /// Writes an intent-log block, laid out as the vdev lays out log blocks, as
    /// [`Raidz::write_flushed`] does a block. Laid out as copies, the block's own buffer goes
    /// to each of its columns, as a mirror's write does: the parity of one data column is that
    /// column, so there is nothing to compute or copy. Such a block may be shorter than its
    /// allocation: its columns are where a longer one's begin (the format's module doc).
    pub async fn write_log(
        &self,
        offset: u64,
        data: SharedBuf,
        class: IoClass,
        durable: bool,
    ) -> Result<(), VdevError> {
        match self.geometry.log_layout() {
            RaidzLayout::Striped => self.write_flushed(offset, data, class, durable).await,
            RaidzLayout::Copies => {
                let map = self.geometry.map_in(RaidzLayout::Copies, offset, data.len() as u64);
                let mut per_child: Vec<Vec<(u64, SharedBuf)>> =
                    vec![Vec::new(); self.geometry.width() as usize];
                for column in &map.columns {
                    per_child[column.child as usize].push((column.offset, data.clone()));
                }
                let len = self.geometry.asize_in(RaidzLayout::Copies, data.len() as u64);
                self.write_children(per_child, offset, len, class, durable).await
            }
        }
    }

    /// Writes a run of blocks back to back: each block's columns, parity computed here, and
    /// one write per child of everything the run puts there. The pad sectors of every block
    /// but the last are written too (as zeros): they lie between one block's rows and the
    /// next's on their child, and with them each child's part of the run is one piece (ZFS
    /// writes them for its queue's aggregation). With `durable`, each child flushes its write
    /// before answering. Succeeds when at most `parity` children failed, each block having at
    /// most one column per child; a durable write fails when a present child failed.
    pub async fn write_run(
        &self,
        blocks: &[RunBlock],
        class: IoClass,
        durable: bool,
    ) -> Result<(), VdevError> {
        let stripes: Vec<(u64, u64, Arc<AlignedBuf>)> =
            blocks.iter().map(|b| (b.offset, b.asize, Arc::clone(&b.data))).collect();
        self.write_stripes(RaidzLayout::Striped, &stripes, class, durable).await
    }

    /// [`Raidz::write_run`] of blocks given as (offset, allocated bytes, stored bytes).
    async fn write_stripes(
        &self,
        layout: RaidzLayout,
        blocks: &[(u64, u64, Arc<AlignedBuf>)],
        class: IoClass,
        durable: bool,
    ) -> Result<(), VdevError> {
        let width = self.geometry.width() as usize;
        let sector = 1usize << self.geometry.ashift();
        // Made when a pad is written, which a lone block (a log block, a read's repair) never is.
        let mut zeros: Option<Arc<AlignedBuf>> = None;
        // Each child's pieces, in the order blocks and rows come: (device offset, bytes).
        let mut pieces: Vec<Vec<(u64, Part)>> = vec![Vec::new(); width];
        // The parity buffers, to keep for reuse once the writes are done.
        let mut kept: Vec<Arc<AlignedBuf>> = Vec::new();
        let last = blocks.len().saturating_sub(1);
        for (i, (offset, _, data)) in blocks.iter().enumerate() {
            if let Some(&(before, asize, _)) = i.checked_sub(1).map(|p| &blocks[p]) {
                assert_eq!(before + asize, *offset, "a run's blocks lie back to back");
            }
            assert!(
                self.geometry.asize_in(layout, data.len() as u64) <= blocks[i].1,
                "a block's columns, parity and pads fit its allocation"
            );
            let map = self.geometry.map_in(layout, *offset, data.len() as u64);
            let mut placed: Vec<(u32, u64, Part)> = map
                .columns
                .iter()
                .zip(column_parts(
                    &map,
                    data,
                    &mut || self.parity_buffer(parity_len(&map)),
                    &mut kept,
                ))
                .map(|(column, part)| (column.child, column.offset, part))
                .collect();
            if i != last {
                let zeros = zeros.get_or_insert_with(|| Arc::new(AlignedBuf::zeroed(sector)));
                placed.extend(
                    map.pads.iter().map(|&(child, at)| (child, at, (Arc::clone(zeros), 0..sector))),
                );
            }
            placed.sort_by_key(|&(child, at, _)| (child, at));
            for (child, at, part) in placed {
                pieces[child as usize].push((at, part));
            }
        }
        let (first, end) =
            blocks.first().zip(blocks.last()).map_or((0, 0), |(f, l)| (f.0, l.0 + l.1));
        let per_child = pieces.into_iter().map(contiguous).collect();
        let written = self.write_children(per_child, first, end - first, class, durable).await;
        self.keep_parity(kept);
        written
    }

    /// Writes each child's pieces (`per_child[c]`: device offset and bytes, in order) to the
    /// leaves of its slot in service, then says whether the blocks of `len` bytes at `first`
    /// are written: at most `parity` children failed, and for a `durable` write no present
    /// child failed.
    async fn write_children(
        &self,
        per_child: Vec<Vec<(u64, SharedBuf)>>,
        first: u64,
        len: u64,
        class: IoClass,
        durable: bool,
    ) -> Result<(), VdevError> {
        let writes = per_child.into_iter().enumerate().filter(|(_, p)| !p.is_empty()).map(
            |(child, writes)| async move {
                let mut took = true;
                let mut failed_present = None;
                // Per leaf of the slot: whether it missed one of the pieces.
                let mut lacking = [false; 2];
                for (at, data) in writes {
                    let mut this = false;
                    for (index, leaf) in self.slot(child as u32).enumerate() {
                        if leaf.is_out_of_service() {
                            leaf.note_skipped_write();
                            lacking[index] = true;
                            continue;
                        }
                        match leaf.write_flushed(at, data.clone(), class, durable).await {
                            Ok(()) => this = true,
                            Err(error) => {
                                lacking[index] = true;
                                self.diagnose(leaf);
                                if !leaf.is_out_of_service() {
                                    failed_present.get_or_insert(error);
                                }
                            }
                        }
                    }
                    took &= this;
                }
                if !took {
                    self.missed[child].fetch_add(1, Ordering::AcqRel);
                }
                (took, failed_present, (child, lacking))
            },
        );
        let results = join_all(writes).await;
        let failed = results.iter().filter(|(took, _, _)| !took).count();
        let lacking: Vec<(usize, [bool; 2])> = results.iter().map(|r| r.2).collect();
        let first_error = results.into_iter().find_map(|(_, error, _)| error);
        if failed > self.geometry.parity() as usize {
            return Err(VdevError::AllChildrenFailed {
                vdev: self.id,
                op: "write",
                offset_bytes: first,
                len_bytes: len,
                last: first_error.map(Box::new),
            });
        }
        match first_error {
            Some(cause) if durable => Err(VdevError::ChildWriteFailed {
                vdev: self.id,
                offset_bytes: first,
                len_bytes: len,
                cause: Box::new(cause),
            }),
            _ => {
                // Answered as written: the leaves that missed a piece lack their copy.
                for (child, lacking) in lacking {
                    for (index, leaf) in self.slot(child as u32).enumerate() {
                        if lacking[index] {
                            leaf.note_copy_missed();
                        }
                    }
                }
                Ok(())
            }
        }
    }

    /// Reads every column, checks the block and its parity, and rewrites what was wrong.
    pub async fn scrub(
        &self,
        offset: u64,
        len: u32,
        verify: &(dyn Fn(&[u8]) -> bool + Send + Sync),
    ) -> ScrubOutcome {
        let mut stripe = self.stripe(RaidzLayout::Striped, offset, len);
        let all: Vec<usize> = (0..stripe.map.columns.len()).collect();
        self.read_columns(&mut stripe, &all, false, IoClass::Scrub).await;
        self.check_all(stripe, len, verify, &[]).await
    }

    /// Writes the columns of `targets` (leaves that missed writes) from the block rebuilt out of
    /// the other columns, and repairs the others' wrong columns on the way. A target's own
    /// column serves only when the block cannot be had without it.
    pub async fn resilver(
        &self,
        offset: u64,
        len: u32,
        verify: &(dyn Fn(&[u8]) -> bool + Send + Sync),
        targets: &[VdevId],
    ) -> ScrubOutcome {
        let mut stripe = self.stripe(RaidzLayout::Striped, offset, len);
        let all: Vec<usize> = (0..stripe.map.columns.len()).collect();
        // Targets are behind, so this reads around them.
        self.read_columns(&mut stripe, &all, false, IoClass::Scrub).await;
        self.check_all(stripe, len, verify, targets).await
    }

    fn stripe(&self, layout: RaidzLayout, offset: u64, len: u32) -> Stripe {
        let map = self.geometry.map_in(layout, offset, u64::from(len));
        let count = map.columns.len();
        Stripe {
            bufs: (0..count).map(|_| None).collect(),
            source: vec![None; count],
            unreadable: vec![false; count],
            map,
        }
    }

    /// Finds the block from the columns read (searching if it must), then compares every
    /// column read against the columns the block makes and rewrites the wrong ones, and every
    /// column of the `targets` leaves.
    async fn check_all(
        &self,
        mut stripe: Stripe,
        len: u32,
        verify: &(dyn Fn(&[u8]) -> bool + Send + Sync),
        targets: &[VdevId],
    ) -> ScrubOutcome {
        let absent: Vec<usize> =
            (0..stripe.map.columns.len()).filter(|&c| stripe.bufs[c].is_none()).collect();
        let found = match self.attempt(&stripe, &absent, len, verify) {
            Some(found) => Ok(found),
            None => {
                let all: Vec<usize> = (0..stripe.map.columns.len()).collect();
                self.read_columns(&mut stripe, &all, true, IoClass::Scrub).await;
                self.search(&stripe, len, verify)
            }
        };
        let is_target = |leaf: &Arc<Leaf>| targets.contains(&leaf.id());
        let found = match found {
            Ok(found) => found,
            Err(lost) => {
                for leaf in stripe.map.columns.iter().flat_map(|c| self.slot(c.child)) {
                    if is_target(leaf) {
                        leaf.note_resilver_miss();
                    }
                }
                return ScrubOutcome {
                    errors: lost.read.len() as u32 + lost.unreadable,
                    repaired: 0,
                    unrecoverable: true,
                };
            }
        };
        // The columns the block makes, parity computed afresh: parity that was never read in
        // a rebuild is checked too.
        let fresh = columns_of(&found.map, &found.data);
        let mut outcome = ScrubOutcome::default();
        let mut fix = Vec::new();
        for (c, made) in fresh.iter().enumerate() {
            let wrong = stripe.bufs[c].as_ref().is_some_and(|bytes| bytes[..] != made[..]);
            if wrong {
                self.count_mismatch(&found, c);
            }
            if wrong || found.unreadable.contains(&c) {
                outcome.errors += 1;
                fix.push(c);
            }
        }
        outcome.repaired = self.rewrite(&found.map, &fresh, &fix).await;
        // The targets' columns, written whatever they hold (they are known to have missed
        // writes, and a stale column may even verify by chance).
        let writes = found.map.columns.iter().enumerate().flat_map(|(c, column)| {
            let data = SharedBuf::copy_from(&fresh[c]);
            self.slot(column.child)
                .filter(|leaf| is_target(leaf) && !fix.contains(&c))
                .map(move |leaf| {
                    let data = data.clone();
                    async move {
                        let ok = !leaf.is_out_of_service()
                            && leaf.write(column.offset, data, IoClass::AsyncWrite).await.is_ok();
                        if !ok {
                            leaf.note_resilver_miss();
                        }
                        ok
                    }
                })
                .collect::<Vec<_>>()
        });
        outcome.repaired += join_all(writes).await.into_iter().filter(|&ok| ok).count() as u32;
        outcome
    }

    /// A parity buffer of `len` bytes: a kept one of that length, or a new one.
    fn parity_buffer(&self, len: usize) -> AlignedBuf {
        let mut spare = self.parity_spare.lock();
        match spare.by_len.get_mut(&len).and_then(Vec::pop) {
            Some(buffer) => {
                spare.held -= len;
                buffer
            }
            None => AlignedBuf::zeroed(len),
        }
    }

    /// Keeps the parity buffers of a finished write that nothing else holds, up to
    /// [`PARITY_SPARE_BYTES`].
    fn keep_parity(&self, buffers: Vec<Arc<AlignedBuf>>) {
        let mut spare = self.parity_spare.lock();
        for buffer in buffers {
            let Ok(buffer) = Arc::try_unwrap(buffer) else { continue };
            if spare.held + buffer.len() > PARITY_SPARE_BYTES {
                break;
            }
            spare.held += buffer.len();
            spare.by_len.entry(buffer.len()).or_default().push(buffer);
        }
    }

    /// Flushes the children written since their last flush. Fails when more columns than the
    /// parity have a leaf whose writes it could not make durable (its flush failed, or it went
    /// out of service with writes unflushed): the blocks written since may then be lost.
    pub async fn flush(&self) -> Result<(), VdevError> {
        let width = self.geometry.width();
        let missed: Vec<u64> = self.missed.iter().map(|m| m.load(Ordering::Acquire)).collect();
        let dirty: Vec<(u32, &Arc<Leaf>)> = (0..width)
            .flat_map(|c| self.slot(c).map(move |leaf| (c, leaf)))
            .filter(|(_, leaf)| leaf.has_unflushed())
            .collect();
        let results = join_all(dirty.iter().map(|&(c, leaf)| async move {
            let result = if leaf.is_out_of_service() {
                leaf.skip_flush();
                Err(VdevError::Offline { vdev: leaf.id(), device: leaf.device().name().to_owned() })
            } else {
                leaf.flush().await
            };
            (c, result)
        }))
        .await;
        let mut failed_columns: Vec<u32> = (0..width)
            .filter(|&c| {
                missed[c as usize] > self.missed_flushed[c as usize].load(Ordering::Acquire)
            })
            .collect();
        let mut last = None;
        for (c, result) in results {
            if let Err(error) = result {
                failed_columns.push(c);
                last = Some(error);
            }
        }
        failed_columns.sort_unstable();
        failed_columns.dedup();
        if failed_columns.len() > self.geometry.parity() as usize {
            return Err(VdevError::AllChildrenFailed {
                vdev: self.id,
                op: "flush",
                offset_bytes: 0,
                len_bytes: 0,
                last: last.map(Box::new),
            });
        }
        // What was missed before it began is accounted for: those blocks are as durable as
        // they will be.
        for (c, &count) in missed.iter().enumerate() {
            self.missed_flushed[c].fetch_max(count, Ordering::AcqRel);
        }
        Ok(())
    }

    fn leaves_ref(&self) -> impl Iterator<Item = &Arc<Leaf>> {
        self.children.iter().zip(&self.replacing).flat_map(|(c, r)| std::iter::once(c).chain(r))
    }

    /// Discards `[offset, offset + len)` of the vdev: on each child, the rows that lie wholly
    /// inside it (a partial row's sectors on some children belong to other blocks).
    pub async fn discard(&self, offset: u64, len: u64) -> Result<(), VdevError> {
        let shift = self.geometry.ashift();
        let width = u64::from(self.geometry.width());
        let (first, end) = (offset >> shift, (offset + len) >> shift);
        let (row_from, row_to) = (first.div_ceil(width), end / width);
        if row_from >= row_to {
            return Ok(());
        }
        let (at, bytes) = (row_from << shift, (row_to - row_from) << shift);
        let results = join_all(
            self.leaves_ref().filter(|l| !l.is_out_of_service()).map(|l| l.discard(at, bytes)),
        )
        .await;
        // A discard is advice: one child that cannot take it loses nothing.
        let _ = results;
        Ok(())
    }

    /// Acts on a leaf's recent errors ([`Leaf::verdict`]) as a mirror does, unless taking it
    /// out would leave more columns without an up-to-date leaf than the parity rebuilds.
    fn diagnose(&self, leaf: &Arc<Leaf>) {
        let Some(verdict) = leaf.verdict() else { return };
        let _one_verdict_at_a_time = self.diagnosis.lock();
        let applies = matches!(
            (leaf.state(), verdict),
            (LeafState::Online, _) | (LeafState::Degraded, LeafState::Faulted(_))
        );
        let width = self.geometry.width();
        let unserved = (0..width)
            .filter(|&c| {
                !self.slot(c).any(|l| {
                    !Arc::ptr_eq(l, leaf) && l.state() == LeafState::Online && !l.is_behind()
                })
            })
            .count();
        if applies && unserved <= self.geometry.parity() as usize {
            leaf.set_state(verdict);
        }
    }
}

/// Advances `pick` (ascending indices below `n`) to the next combination of its size; false
/// after the last.
fn next_combination(pick: &mut [usize], n: usize) -> bool {
    let k = pick.len();
    for i in (0..k).rev() {
        if pick[i] < n - k + i {
            pick[i] += 1;
            for j in i + 1..k {
                pick[j] = pick[j - 1] + 1;
            }
            return true;
        }
    }
    false
}

/// The block's bytes (the first `len`) from its data columns as read; every data column is
/// there.
fn assemble(map: &RaidzMap, bufs: &[Option<AlignedBuf>], len: u32) -> AlignedBuf {
    let data: Vec<&[u8]> = bufs[map.parity..]
        .iter()
        .map(|b| &b.as_ref().expect("every data column read")[..])
        .collect();
    gather(&data, len)
}

/// As [`assemble`], from a whole set of columns.
fn assemble_owned(map: &RaidzMap, columns: &[AlignedBuf], len: u32) -> AlignedBuf {
    let data: Vec<&[u8]> = columns[map.parity..].iter().map(|b| &b[..]).collect();
    gather(&data, len)
}

fn gather(data: &[&[u8]], len: u32) -> AlignedBuf {
    let len = len as usize;
    let mut at = 0usize;
    AlignedBuf::gathered(
        len,
        data.iter().map_while(|column| {
            let take = column.len().min(len.saturating_sub(at));
            (take > 0).then(|| {
                let piece = (at, &column[..take]);
                at += take;
                piece
            })
        }),
    )
}

/// Bytes to write: a buffer and the part of it.
type Part = (Arc<AlignedBuf>, std::ops::Range<usize>);

/// One child's pieces of a run, in order, joined into writes of contiguous bytes: (device
/// offset, the pieces as one buffer).
fn contiguous(pieces: Vec<(u64, Part)>) -> Vec<(u64, SharedBuf)> {
    let mut writes: Vec<(u64, Vec<Part>)> = Vec::new();
    let mut end = u64::MAX;
    for (at, part) in pieces {
        let len = part.1.len() as u64;
        match writes.last_mut() {
            Some((_, group)) if at == end => group.push(part),
            _ => writes.push((at, vec![part])),
        }
        end = at + len;
    }
    writes.into_iter().map(|(at, group)| (at, SharedBuf::gather_parts(group))).collect()
}

/// A block's columns to write, in map order: its parity, computed here, and its data columns
/// as parts of the block's own buffer (a short last column, in a block not whole sectors,
/// copied and padded with zeros).
fn column_parts(
    map: &RaidzMap,
    data: &Arc<AlignedBuf>,
    buffer: &mut dyn FnMut() -> AlignedBuf,
    kept: &mut Vec<Arc<AlignedBuf>>,
) -> Vec<Part> {
    let ranges: Vec<std::ops::Range<usize>> = map.data_ranges().collect();
    let mut parity: Vec<AlignedBuf> = (0..map.parity).map(|_| buffer()).collect();
    {
        // A column cut short by the end of the data counts as zeros past it.
        let views: Vec<&[u8]> =
            ranges.iter().map(|r| &data[r.start.min(data.len())..r.end.min(data.len())]).collect();
        let mut outs: Vec<&mut [u8]> = parity.iter_mut().map(|p| &mut p[..]).collect();
        raidz::generate_parity(&views, &mut outs);
    }
    let parity: Vec<Part> = parity
        .into_iter()
        .map(|p| {
            let whole = 0..p.len();
            let p = Arc::new(p);
            kept.push(Arc::clone(&p));
            (p, whole)
        })
        .collect();
    let columns = ranges.into_iter().map(|range| {
        if range.end <= data.len() {
            (Arc::clone(data), range)
        } else {
            let have = data.len().saturating_sub(range.start).min(range.len());
            let padded =
                AlignedBuf::gathered(range.len(), [(0, &data[range.start..range.start + have])]);
            (Arc::new(padded), 0..range.len())
        }
    });
    parity.into_iter().chain(columns).collect()
}

/// The length of a map's parity columns.
fn parity_len(map: &RaidzMap) -> usize {
    map.columns[0].size as usize
}

/// The block's columns to write: parity computed from the data, data cut from `data` (a short
/// last sector padded with zeros).
fn columns_of(map: &RaidzMap, data: &[u8]) -> Vec<AlignedBuf> {
    let ranges: Vec<std::ops::Range<usize>> = map.data_ranges().collect();
    let piece = |range: &std::ops::Range<usize>| -> AlignedBuf {
        if range.end <= data.len() {
            AlignedBuf::copy_from(&data[range.clone()])
        } else {
            let have = data.len().saturating_sub(range.start).min(range.len());
            AlignedBuf::gathered(range.len(), [(0, &data[range.start..range.start + have])])
        }
    };
    let pieces: Vec<AlignedBuf> = ranges.iter().map(piece).collect();
    let parity_len = map.columns[0].size as usize;
    let mut parity: Vec<AlignedBuf> =
        (0..map.parity).map(|_| AlignedBuf::zeroed(parity_len)).collect();
    {
        let views: Vec<&[u8]> = pieces.iter().map(|p| &p[..]).collect();
        let mut outs: Vec<&mut [u8]> = parity.iter_mut().map(|p| &mut p[..]).collect();
        raidz::generate_parity(&views, &mut outs);
    }
    parity.into_iter().chain(pieces).collect()
}
