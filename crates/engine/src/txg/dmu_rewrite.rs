//! Rewriting the blocks a sequential read found scattered on disk (NetApp WAFL's read
//! reallocation; OpenZFS 2.4's `zfs rewrite` moves blocks the same way, by hand).
//!
//! Copy-on-write puts a changed block wherever its txg allocates. The blocks of one txg lie
//! side by side in block order, but on a volume that random writes changed over many txgs,
//! neighbouring blocks lie far apart, and a sequential read costs a device command for every
//! block or two (44 for 1 MiB of 16 KiB blocks on a volume aged as bench/peers.sh ages it)
//! where the same read of a volume written in order costs one; prefetch (dmu_zfetch.rs) hides
//! some of that, not the device's limit on small reads. So a read that continues a stream
//! counts the runs the blocks it reads from the disk lie in (blocks the cache holds cost it
//! nothing now, and are left alone), and if they average fewer bytes than
//! `zfetch.rewrite_run_bytes`, it hands the blocks it has just read and verified to the open
//! txg, as if a client had written them again; that txg's sync writes them side by side with
//! the stream's other blocks. The data is in memory already: a rewrite costs the sync's write
//! and no read.
//!
//! What is rewritten must be exactly what the volume holds, and nobody else may pay for it:
//! - A block goes in only under the txg's and the volume's locks, and only if the volume's
//!   tree is still the one the read found it in (its root pointer unchanged: every sync that
//!   changes the volume, and every rollback, replaces it) and no version of the block is in
//!   memory (a write since the read). So a client's write is never undone by an older copy.
//! - Blocks a snapshot or a clone's origin shares (born at or before the volume's
//!   `prev_snap_txg`) stay where they are: the old copy would stay allocated for the snapshot
//!   and the new one take space beside it (OpenZFS's `zfs rewrite -S` skips them too). So do
//!   blocks shared through the dedup table, and every block of a volume with dedup on, of a
//!   snapshot's or a raw receive's dataset, and of an encrypted volume whose key cannot take
//!   writes.
//! - Nothing is logged: the blocks hold what they held, and if the pool stops before the
//!   sync, the old copies are still the volume's.
//! - A rewrite never waits and never delays anyone: blocks go in only while the open txg
//!   holds under a quarter of `txg.dirty_max` (where a writer would start its sync) and the
//!   pool's free space leaves twice the room they take, with no writer waiting for space
//!   (dmu_tx.rs, `Admission::try_admit_rewrite`); otherwise they wait for the next pass. The
//!   read is answered the same either way.
//! - A rewrite needs room for its blocks in runs at least twice as long as it found them in,
//!   or as long as `zfetch.rewrite_run_bytes` asks: they go in only while what the open and
//!   syncing txgs still place, these blocks included, fits in half the pool's free ranges of
//!   that length after the log regions (`Allocator::run_room_bytes`, counted at 32, 64 and
//!   128 KiB). It is a check on admission, not a placement (the sync reserves nothing, hence
//!   the half), so blocks move seldom rather than a bounded number of times, and where the
//!   free space is all 16 KiB holes, not at all. Without that, rewritten blocks
//!   went into holes as scattered as those they left, the next pass found them scattered
//!   again, and an uncached stream over an aged 1 GiB span on a half-full pool rewrote it
//!   about nine times over before its runs grew long (bench/rewrite-passes.sh).
//! - A block rewritten is born in the rewrite's txg. OpenZFS's `zfs rewrite -P` keeps a
//!   block's logical birth in a field of its own so incremental sends skip it; sluice's
//!   pointers have one birth, but every block rewritten was born after the newest snapshot,
//!   so any incremental send carries it anyway.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use sluice_format::BlockPointer;

use super::dataset::{Dataset, VolumeState};
use super::dbuf::Block;
use super::dmu_tx::Admission;
use crate::device::AlignedBuf;
use crate::objset;

/// Whether `next` lies on disk right after `prev` (their first copies: a second copy, where
/// there is one, is written beside the first's run).
fn adjacent(prev: &BlockPointer, next: &BlockPointer) -> bool {
    let (p, n) = (prev.dvas[0], next.dvas[0]);
    n.vdev == p.vdev && n.offset_bytes() == p.offset_bytes() + p.asize_bytes()
}

/// Whether a stream's read of `bps` (the blocks it found on disk, in block order, holes left
/// out) found them scattered: in three runs or more that average fewer than `run_bytes_min`
/// of the volume's bytes. Two runs are a txg's edge, not scattering. Returns the runs'
/// average bytes if so.
fn scattered(bps: &[BlockPointer], block_bytes: u64, run_bytes_min: u64) -> Option<u64> {
    if run_bytes_min == 0 || bps.len() < 3 {
        return None;
    }
    let runs = 1 + bps.windows(2).filter(|pair| !adjacent(&pair[0], &pair[1])).count() as u64;
    let bytes = bps.len() as u64 * block_bytes;
    (runs >= 3 && bytes < runs * run_bytes_min).then(|| bytes / runs)
}

/// The runs a rewrite of blocks found in runs of `found_run_bytes` on average must be able to
/// place them in: twice as long, or `run_bytes_min` (where a read no longer finds them
/// scattered). A block is so rewritten at most a few times, each leaving it in runs at least
/// twice as long, until its runs are long enough.
fn run_wanted(found_run_bytes: u64, run_bytes_min: u64) -> u64 {
    found_run_bytes.saturating_mul(2).min(run_bytes_min)
}

/// Blocks of the volume born at or before the returned txg are shared (with a snapshot, a
/// clone's origin, or a snapshot about to be taken) and stay where they lie; `None`: the
/// volume rewrites nothing (a snapshot's dataset, dedup on, a receive in progress).
pub(super) fn shared_up_to(dataset: &Dataset, v: &VolumeState) -> Option<u64> {
    let rewrites = !dataset.read_only
        && v.entry.dedup == sluice_format::DedupMode::Off
        && !v.raw_receive
        && v.entry.receive.is_none();
    rewrites.then(|| v.shared_up_to())
}

/// Whether `bp` is the volume's alone, given its [`shared_up_to`].
fn own(bp: &BlockPointer, shared_up_to: u64) -> bool {
    bp.dedup.is_none() && bp.birth_txg > shared_up_to
}

/// The blocks of a stream's read to rewrite: those of `found` (the blocks it reads from the
/// disk, in block order) that are the volume's alone, if `found` lies scattered, and the
/// runs the rewrite must be able to place them in ([`run_wanted`]); counted in the volume's
/// statistics.
pub(super) fn plan(
    dataset: &Dataset,
    found: Vec<(u64, BlockPointer)>,
    run_bytes_min: u64,
    shared_up_to: u64,
) -> (Vec<(u64, BlockPointer)>, u64) {
    let bps: Vec<BlockPointer> = found.iter().map(|&(_, bp)| bp).collect();
    let Some(found_run) = scattered(&bps, u64::from(dataset.block_bytes), run_bytes_min) else {
        return (Vec::new(), 0);
    };
    let stats = &dataset.stats.rewrite;
    stats.scattered_reads.inc();
    let before = found.len();
    let own: Vec<_> = found.into_iter().filter(|(_, bp)| own(bp, shared_up_to)).collect();
    stats.blocks_shared.add((before - own.len()) as u64);
    (own, run_wanted(found_run, run_bytes_min))
}

/// A block a read found scattered: its index, the pointer the read found, and its bytes: a
/// whole block's buffer, or a span's with the block at `at`.
pub(super) struct Found {
    pub(super) index: u64,
    pub(super) bp: BlockPointer,
    pub(super) buf: Arc<AlignedBuf>,
    pub(super) at: Option<usize>,
}

impl Found {
    /// The block's bytes as a buffer of its own; `None` if they are not a whole block.
    fn whole(&self, block_bytes: usize) -> Option<Arc<AlignedBuf>> {
        match self.at {
            None => (self.buf.len() == block_bytes).then(|| Arc::clone(&self.buf)),
            Some(at) => {
                let bytes = self.buf.get(at..at.checked_add(block_bytes)?)?;
                Some(Arc::new(AlignedBuf::copy_from(bytes)))
            }
        }
    }
}

/// Hands `blocks`, which a read of `dataset` found scattered under root `root`, to the open
/// txg where the module's rules allow, one being that the pool has room for them in runs of
/// `run_bytes`; counts what it did in the volume's statistics.
pub(super) fn rewrite(
    admission: Admission<'_>,
    dataset: &Dataset,
    root: Option<BlockPointer>,
    blocks: Vec<Found>,
    run_bytes: u64,
) {
    let stats = &dataset.stats.rewrite;
    let offered = blocks.len() as u64;
    let spa = admission.spa;
    let bs = u64::from(dataset.block_bytes);
    // Everything the open and syncing txgs still place (the syncing txg's less what it has
    // allocated, which is out of the free ranges already), these blocks included, must fit in
    // half the room for runs of `run_bytes` (the txgs' other blocks take from it too);
    // weighed first, as it is what an aged pool most often lacks, and before anything is
    // copied.
    let long_runs = {
        let txg = admission.txg.lock();
        let allocator = spa.allocator().lock();
        let placing = txg.dirty_to_allocate()
            + txg.syncing_to_allocate(&allocator)
            + spa.pool().inflate(offered * bs, bs);
        placing <= allocator.run_room_bytes(run_bytes) / 2
    };
    if !long_runs {
        stats.blocks_deferred.add(offered);
        return;
    }
    // A rollback holds the gate until its sync has replaced the tree: blocks read from the
    // tree it discards must not come back after it.
    let not_rolling_back = dataset.rollback_gate.try_read();
    let admitted = match not_rolling_back {
        Some(_) if spa.check_live().is_ok() => admission.try_admit_rewrite(dataset, offered * bs),
        _ => None,
    };
    let Some(admitted) = admitted else {
        stats.blocks_deferred.add(offered);
        return;
    };
    // Copied outside the locks.
    let blocks: Vec<(u64, BlockPointer, Arc<AlignedBuf>)> = blocks
        .into_iter()
        .filter_map(|found| Some((found.index, found.bp, found.whole(bs as usize)?)))
        .collect();
    let dirty_max = admission.txg.limits().dirty_max;
    let (added, shared, kick) = {
        let mut txg = admission.txg.lock();
        if admission.dsl.check_exists(dataset).is_err()
            || txg.dirty_bytes() + offered * bs > dirty_max / 4
        {
            drop(txg);
            stats.blocks_deferred.add(offered);
            return;
        }
        let mut v = dataset.state.lock();
        let keys = spa.pool().zio().keys();
        // Checked again under the locks: the tree, the key, and what the volume shares.
        let up_to = shared_up_to(dataset, &v);
        let Some(up_to) = up_to
            .filter(|_| v.entry.root == root && spa.crypt().writable(keys, v.entry.key_family))
        else {
            drop(v);
            drop(txg);
            stats.blocks_deferred.add(offered);
            return;
        };
        let end = v.entry.size_bytes / bs;
        let metadata_per_group = v.metadata_per_new_group(spa.pool());
        let (mut added, mut new_groups, mut shared) = (0u64, 0u64, 0u64);
        for (index, bp, data) in blocks {
            // A snapshot queued since the read shares the block now.
            if !own(&bp, up_to) {
                shared += 1;
                continue;
            }
            if index >= end || v.cached(index).is_some() || v.prewritten.contains_key(&index) {
                continue;
            }
            new_groups += u64::from(v.group_clean(index / objset::INDIRECT_BPS));
            v.open.insert(index, Block::Data(data));
            added += 1;
        }
        let added_alloc = spa.pool().inflate(added * bs, bs);
        txg.count_dirty(added * bs, added_alloc, new_groups * metadata_per_group, added);
        admitted.landed();
        dataset.dirty_bytes.fetch_add(added * bs, Ordering::Relaxed);
        (added, shared, txg.dirty_bytes() >= dirty_max / 8)
    };
    stats.blocks_rewritten.add(added);
    stats.blocks_shared.add(shared);
    stats.blocks_deferred.add(offered - added - shared);
    // Started early, the sync writes the rewritten blocks while the stream reads on and
    // leaves the open txg room for the next ones.
    if kick {
        admission.sync.kick();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A one-copy 16 KiB block at byte `offset` of vdev `vdev`.
    fn on(vdev: u32, offset: u64) -> BlockPointer {
        crate::pool::test_bp(vdev, offset / 512, 32, 1)
    }

    fn at(offset: u64) -> BlockPointer {
        on(0, offset)
    }

    #[test]
    fn blocks_in_few_runs_are_not_scattered_and_in_many_short_ones_are() {
        let bs = 16384;
        // In order: one run.
        let sequential: Vec<_> = (0..64).map(|i| at(i * bs)).collect();
        assert_eq!(scattered(&sequential, bs, 256 << 10), None);
        // Two runs (a txg's edge): not scattered, however short.
        let two: Vec<_> =
            (0..64).map(|i| at(if i < 32 { i * bs } else { (1000 + i) * bs })).collect();
        assert_eq!(scattered(&two, bs, 256 << 10), None);
        // Sixteen runs of four blocks (64 KiB each): scattered at 256 KiB, not at 64 KiB.
        let fours: Vec<_> = (0..64).map(|i| at((i / 4) * 100 * bs + (i % 4) * bs)).collect();
        assert_eq!(scattered(&fours, bs, 256 << 10), Some(64 << 10));
        assert_eq!(scattered(&fours, bs, 64 << 10), None);
        // Off.
        assert_eq!(scattered(&fours, bs, 0), None);
        // Runs on another vdev break too.
        let mut other = sequential.clone();
        for bp in other.iter_mut().skip(1).step_by(2) {
            *bp = on(1, bp.dvas[0].offset_bytes());
        }
        assert!(scattered(&other, bs, 256 << 10).is_some());
    }

    #[test]
    fn a_rewrite_wants_runs_twice_as_long_up_to_the_runs_asked_for() {
        assert_eq!(run_wanted(16 << 10, 128 << 10), 32 << 10);
        assert_eq!(run_wanted(48 << 10, 128 << 10), 96 << 10);
        assert_eq!(run_wanted(100 << 10, 128 << 10), 128 << 10);
    }
}
