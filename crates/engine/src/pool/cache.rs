//! A bounded cache of verified blocks (ZFS: the ARC, in its simplest form: one LRU list).
//!
//! Copy-on-write never overwrites a live block in place, so a block read and verified once stays
//! valid for as long as anything points at it. Blocks are keyed by their first copy's address
//! *and* birth txg: when freed space is reused, the new block has a later birth txg, so a stale
//! entry can never be returned for it. Only verified bytes enter the cache: blocks read and
//! checked, and blocks a sync has just written from memory (as ZFS keeps a written dbuf's data
//! in the ARC). The second matters for partial writes: a 4 KiB write into a 16 KiB block needs
//! the block's old bytes, and a block the pool wrote recently is then found here rather than
//! read back. A freed block leaves the cache when the sync frees it, so memory holds live
//! blocks, not the old versions random overwrites leave behind. Memory is bounded by
//! `cache.bytes_max`; the least recently used blocks go first. With `cache.contents=metadata`
//! data blocks are never kept (ZFS's `primarycache=metadata`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;
use sluice_format::{BlockKind, BlockPointer};

use crate::device::AlignedBuf;
use crate::stats::Counter;

type Key = (u32, u64, u64);

fn key(bp: &BlockPointer) -> Key {
    (bp.dvas[0].vdev, bp.dvas[0].offset_sectors, bp.birth_txg)
}

#[derive(Debug, Default)]
struct Inner {
    blocks: HashMap<Key, (Arc<AlignedBuf>, u64)>,
    by_use: BTreeMap<u64, Key>,
    tick: u64,
    bytes: u64,
}

/// The block cache.
#[derive(Debug)]
pub struct BlockCache {
    bytes_max: u64,
    /// Whether data blocks are kept, or only indirect blocks and metadata.
    data: bool,
    inner: Mutex<Inner>,
    pub hits: Counter,
    pub misses: Counter,
}

impl BlockCache {
    pub fn new(bytes_max: u64, data: bool) -> BlockCache {
        BlockCache {
            bytes_max,
            data,
            inner: Mutex::new(Inner::default()),
            hits: Counter::default(),
            misses: Counter::default(),
        }
    }

    pub fn get(&self, bp: &BlockPointer) -> Option<Arc<AlignedBuf>> {
        // A block the cache never keeps is neither looked up nor counted as a miss.
        if !self.keeps(bp) {
            return None;
        }
        let mut inner = self.inner.lock();
        inner.tick += 1;
        let tick = inner.tick;
        let Inner { blocks, by_use, .. } = &mut *inner;
        match blocks.get_mut(&key(bp)) {
            Some((buf, used)) => {
                by_use.remove(used);
                *used = tick;
                by_use.insert(tick, key(bp));
                self.hits.inc();
                Some(Arc::clone(buf))
            }
            None => {
                self.misses.inc();
                None
            }
        }
    }

    /// Whether a block like `bp` would be kept (so a caller can skip copying one that would
    /// not).
    pub fn keeps(&self, bp: &BlockPointer) -> bool {
        bp.psize_bytes() <= self.bytes_max && (self.data || bp.kind != BlockKind::Data)
    }

    /// Adds a block that has passed its checksum.
    pub fn insert(&self, bp: &BlockPointer, buf: Arc<AlignedBuf>) {
        let len = buf.len() as u64;
        if len > self.bytes_max || !self.keeps(bp) {
            return;
        }
        let mut inner = self.inner.lock();
        inner.tick += 1;
        let tick = inner.tick;
        if let Some((old, used)) = inner.blocks.insert(key(bp), (buf, tick)) {
            inner.by_use.remove(&used);
            inner.bytes -= old.len() as u64;
        }
        inner.by_use.insert(tick, key(bp));
        inner.bytes += len;
        while inner.bytes > self.bytes_max {
            let Some((_, oldest)) = inner.by_use.pop_first() else { break };
            if let Some((evicted, _)) = inner.blocks.remove(&oldest) {
                inner.bytes -= evicted.len() as u64;
            }
        }
        debug_assert_eq!(inner.blocks.len(), inner.by_use.len());
    }

    /// Drops a block that was freed; it can never be read again under this pointer.
    pub fn remove(&self, bp: &BlockPointer) {
        let mut inner = self.inner.lock();
        if let Some((buf, used)) = inner.blocks.remove(&key(bp)) {
            inner.by_use.remove(&used);
            inner.bytes -= buf.len() as u64;
        }
    }

    pub fn bytes(&self) -> u64 {
        self.inner.lock().bytes
    }

    pub fn bytes_max(&self) -> u64 {
        self.bytes_max
    }
}

#[cfg(test)]
mod tests {
    use sluice_format::{BlockKind, Checksum, ChecksumAlg, Dva};

    use super::*;

    fn bp(offset_sectors: u64, birth_txg: u64) -> BlockPointer {
        BlockPointer {
            dvas: [
                Dva { vdev: 0, asize_sectors: 8, offset_sectors },
                Dva::default(),
                Dva::default(),
            ],
            lsize_sectors: 8,
            psize_sectors: 8,
            birth_txg,
            checksum_alg: ChecksumAlg::Xxh3_128,
            compression: sluice_format::BlockCompression::None,
            kind: BlockKind::Data,
            level: 0,
            fill: 1,
            checksum: Checksum::default(),
            dedup: None,
        }
    }

    /// Entries are bounded in bytes, evicted least recently used first, and a reused address
    /// with a newer birth txg never returns the old block.
    #[test]
    fn bounded_lru_keyed_by_birth() {
        let cache = BlockCache::new(3 * 4096, true);
        for i in 0..3 {
            cache.insert(&bp(i * 8, 1), Arc::new(AlignedBuf::copy_from(&[i as u8; 4096])));
        }
        assert!(cache.get(&bp(0, 1)).is_some());
        cache.insert(&bp(24, 1), Arc::new(AlignedBuf::zeroed(4096)));
        assert!(cache.get(&bp(8, 1)).is_none(), "least recently used went first");
        assert!(cache.get(&bp(0, 1)).is_some());
        assert!(cache.get(&bp(0, 2)).is_none(), "same address, newer block: a miss");
        assert_eq!(cache.bytes(), 3 * 4096);
        cache.remove(&bp(0, 1));
        assert!(cache.get(&bp(0, 1)).is_none(), "removed");
        assert_eq!(cache.bytes(), 2 * 4096);
        cache.remove(&bp(0, 1));
        assert_eq!(cache.bytes(), 2 * 4096, "removing twice changes nothing");
    }

    /// `cache.contents=metadata` keeps indirect blocks and drops data blocks.
    #[test]
    fn metadata_only_keeps_no_data() {
        let cache = BlockCache::new(1 << 20, false);
        let data = bp(0, 1);
        let mut indirect = bp(8, 1);
        indirect.kind = BlockKind::Indirect;
        cache.insert(&data, Arc::new(AlignedBuf::zeroed(4096)));
        cache.insert(&indirect, Arc::new(AlignedBuf::zeroed(4096)));
        assert!(cache.get(&data).is_none());
        assert!(cache.get(&indirect).is_some());
        assert!(!cache.keeps(&data) && cache.keeps(&indirect));
        assert_eq!(cache.bytes(), 4096);
    }
}
