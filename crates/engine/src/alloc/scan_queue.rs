//! The blocks a scan has gathered and not yet read, and those it is reading (ZFS: the scan's
//! sorted queues, and `dsl_scan_freed`, which drops a freed block from them).
//!
//! A scrub or resilver chunk gathers block pointers from one synced tree and then issues them
//! over seconds (longer while clients are busy, when it yields to them). A block of that tree
//! may be freed meanwhile, and once its deferral ends its space may be handed out again: a
//! read of it would then find another block's bytes, and a repair write would overwrite them.
//! Holding back every free made after the tree's txg until the chunk ended (a pin for the whole
//! chunk, as sluice did first) kept that safe but also kept the space of everything overwritten
//! meanwhile from coming back: on a pool short of room, writers waited out their deferral and
//! were then told no space, a thick volume's among them.
//!
//! Instead, as in ZFS, a free whose deferral ends looks here: a block still only queued is
//! dropped from the queue (the scan no longer needs to read it: nothing references it) and its
//! space is free at once; a block whose read or repair is in flight keeps its space until a
//! later sync after that I/O ends. What can be held back is bounded by the scan's I/Os in
//! flight, not by how long the chunk takes.

use super::RangeTree;

/// Per top-level vdev, the ranges of queued blocks and of blocks being read.
#[derive(Clone, Debug, Default)]
pub(super) struct ScanQueue {
    queued: Vec<RangeTree>,
    issuing: Vec<RangeTree>,
}

impl ScanQueue {
    pub(super) fn new(vdevs: usize) -> ScanQueue {
        ScanQueue {
            queued: vec![RangeTree::default(); vdevs],
            issuing: vec![RangeTree::default(); vdevs],
        }
    }

    /// Makes room for one more top-level vdev (`pool add`).
    pub(super) fn add_vdev(&mut self) {
        self.queued.push(RangeTree::default());
        self.issuing.push(RangeTree::default());
    }

    /// Queues a copy of a gathered block. The same copy gathered twice (a block two trees
    /// reach) is queued once, and read once.
    pub(super) fn queue(&mut self, vdev: u32, start: u64, len: u64) {
        if let Some(tree) = self.queued.get_mut(vdev as usize) {
            let _already = tree.try_insert(start, len);
        }
    }

    /// Takes a block's copies from the queue to be read: `false` (and nothing taken) when any
    /// copy is no longer queued, because the block was freed, or taken already.
    pub(super) fn issue(&mut self, copies: &[(u32, u64, u64)]) -> bool {
        let queued = |&(vdev, start, len): &(u32, u64, u64)| {
            self.queued.get(vdev as usize).is_some_and(|t| t.contains(start, len))
        };
        if copies.is_empty() || !copies.iter().all(queued) {
            for &(vdev, start, len) in copies {
                if let Some(tree) = self.queued.get_mut(vdev as usize) {
                    tree.remove_within(start, len);
                }
            }
            return false;
        }
        for &(vdev, start, len) in copies {
            self.queued[vdev as usize].remove(start, len);
            self.issuing[vdev as usize].insert(start, len);
        }
        true
    }

    /// A block's read (and repair) has ended.
    pub(super) fn done(&mut self, copies: &[(u32, u64, u64)]) {
        for &(vdev, start, len) in copies {
            self.issuing[vdev as usize].remove(start, len);
        }
    }

    /// The chunk has ended (or was dropped, its reads with it): nothing is queued or being
    /// read any more.
    pub(super) fn clear(&mut self) {
        for tree in self.queued.iter_mut().chain(&mut self.issuing) {
            *tree = RangeTree::default();
        }
    }

    /// The parts of a free whose deferral has ended that a scan I/O is reading, as (start,
    /// end): they stay allocated, and the rest may be [`ScanQueue::release`]d. A free covers
    /// several blocks where they were freed back to back (`Allocator::free`).
    pub(super) fn reading_within(&self, vdev: u32, start: u64, len: u64) -> Vec<(u64, u64)> {
        match self.issuing.get(vdev as usize) {
            Some(tree) if !tree.is_empty() => tree.parts_within(start, len).collect(),
            _ => Vec::new(),
        }
    }

    /// Whether a free whose deferral has ended may become free space now: not while a scan I/O
    /// reads any of it. A queued block it covers leaves the queue.
    pub(super) fn release(&mut self, vdev: u32, start: u64, len: u64) -> bool {
        let v = vdev as usize;
        if self.issuing.get(v).is_some_and(|t| t.intersects(start, len)) {
            return false;
        }
        if let Some(tree) = self.queued.get_mut(v).filter(|t| !t.is_empty()) {
            tree.remove_within(start, len);
        }
        true
    }

    /// Bytes queued and being read, for tests and the audit.
    pub(super) fn bytes(&self) -> (u64, u64) {
        let sum = |trees: &[RangeTree]| trees.iter().map(RangeTree::total_bytes).sum();
        (sum(&self.queued), sum(&self.issuing))
    }
}
