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
//! `cache.bytes_max`. Eviction is CLOCK (second chance), an approximation of least recently
//! used in which a hit only sets a bit: a hand sweeps the blocks' slots round and round,
//! clears the bit of a block used since its last pass and evicts the first block without it
//! (a slot freed by a removal is reused by the next block cached, wherever it lies). An
//! exact LRU list kept in a tree cost a removal and an insertion on every hit, 3% of the
//! server's CPU with 4 KiB sync writes, whose read-modify-writes hit the cache on every write
//! (perf, 2026-11-24). With `cache.contents=metadata` data blocks are never kept (ZFS's
//! `primarycache=metadata`).

use std::collections::hash_map::Entry as Cached;
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};
use sluice_format::{BlockKind, BlockPointer};

use crate::device::AlignedBuf;
use crate::stats::Counter;

type Key = (u32, u64, u64);

/// Blocks [`BlockCache::remove_all`] forgets, or [`BlockCache::insert_all`] caches, per hold
/// of the lock: a hash removal or insert each, a few microseconds in all.
const REMOVE_BATCH: usize = 64;

fn key(bp: &BlockPointer) -> Key {
    (bp.dvas[0].vdev, bp.dvas[0].offset_sectors, bp.birth_txg)
}

#[derive(Debug)]
struct Entry {
    buf: Arc<AlignedBuf>,
    /// Used since the hand last passed it.
    referenced: bool,
    /// Its place on the clock.
    slot: usize,
}

#[derive(Debug, Default)]
struct Inner {
    /// Hashed with foldhash, not std's SipHash: the keys are addresses the pool chose, not
    /// input a client can aim at one bucket, and each block a sync writes or frees is hashed
    /// here (SipHash was 1.4% of the server's CPU under one client's 1 MiB writes).
    blocks: foldhash::HashMap<Key, Entry>,
    /// The clock: each cached block's key in one slot; `None` for slots freed by a removal,
    /// which `free` lists for reuse.
    slots: Vec<Option<Key>>,
    free: Vec<usize>,
    hand: usize,
    bytes: u64,
}

impl Inner {
    /// Evicts blocks other than `keep` (the one just cached, which may sit under the hand)
    /// until at most `bytes_max` are kept.
    /// Evicts until the cache fits `bytes_max` again; the evicted buffers go to `out`, to be
    /// freed once the lock is released.
    fn evict(&mut self, bytes_max: u64, keep: Key, out: &mut Vec<Arc<AlignedBuf>>) {
        // Each pass clears every bit at most once, so two passes find a block to evict.
        while self.bytes > bytes_max && self.blocks.len() > 1 {
            if self.hand >= self.slots.len() {
                self.hand = 0;
            }
            let slot = self.hand;
            self.hand += 1;
            let Some(key) = self.slots[slot] else { continue };
            if key == keep {
                continue;
            }
            let entry = self.blocks.get_mut(&key).expect("every slot's key is cached");
            if entry.referenced {
                entry.referenced = false;
                continue;
            }
            out.extend(self.remove(&key));
        }
    }

    /// Caches `buf` as `key`'s block and evicts others until at most `bytes_max` are kept;
    /// replaced and evicted buffers go to `freed`, to be freed once the lock is released.
    fn insert(
        &mut self,
        key: Key,
        buf: Arc<AlignedBuf>,
        bytes_max: u64,
        freed: &mut Vec<Arc<AlignedBuf>>,
    ) {
        let len = buf.len() as u64;
        // One lookup, where a look and then an insert hashed the key twice.
        match self.blocks.entry(key) {
            Cached::Occupied(mut cached) => {
                let entry = cached.get_mut();
                let old = std::mem::replace(&mut entry.buf, buf);
                entry.referenced = true;
                self.bytes = self.bytes - old.len() as u64 + len;
                freed.push(old);
            }
            Cached::Vacant(vacant) => {
                let slot = match self.free.pop() {
                    Some(slot) => slot,
                    None => {
                        self.slots.push(None);
                        self.slots.len() - 1
                    }
                };
                self.slots[slot] = Some(key);
                // A new block starts without its bit: it is evicted on the hand's next pass
                // unless it is used again before then.
                vacant.insert(Entry { buf, referenced: false, slot });
                self.bytes += len;
            }
        }
        self.evict(bytes_max, key, freed);
        debug_assert_eq!(self.blocks.len() + self.free.len(), self.slots.len());
    }

    /// Takes `key`'s block out of the cache; the caller decides where its buffer is freed.
    fn remove(&mut self, key: &Key) -> Option<Arc<AlignedBuf>> {
        let entry = self.blocks.remove(key)?;
        self.slots[entry.slot] = None;
        self.free.push(entry.slot);
        self.bytes -= entry.buf.len() as u64;
        Some(entry.buf)
    }
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
        match inner.blocks.get_mut(&key(bp)) {
            Some(entry) => {
                entry.referenced = true;
                self.hits.inc();
                Some(Arc::clone(&entry.buf))
            }
            None => {
                self.misses.inc();
                None
            }
        }
    }

    /// Whether `bp`'s block is cached, without using it (not a hit, not a miss): a prefetch
    /// asks before it reads a block the reads would find here anyway.
    pub fn contains(&self, bp: &BlockPointer) -> bool {
        self.keeps(bp) && self.inner.lock().blocks.contains_key(&key(bp))
    }

    /// Whether a block like `bp` would be kept (so a caller can skip copying one that would
    /// not).
    pub fn keeps(&self, bp: &BlockPointer) -> bool {
        bp.psize_bytes() <= self.bytes_max && (self.data || bp.kind != BlockKind::Data)
    }

    /// Adds a block that has passed its checksum.
    pub fn insert(&self, bp: &BlockPointer, buf: Arc<AlignedBuf>) {
        self.insert_all([(bp, buf)]);
    }

    /// Inserts blocks, holding the lock for [`REMOVE_BATCH`] of them at a time: a txg sync
    /// inserts every block it wrote or linked, 64 a MiB of 16 KiB blocks, and a hold per block
    /// was a cost per block of every large write. Buffers that leave the cache are freed
    /// after the lock is released, as the serving cores look up blocks meanwhile. `blocks`
    /// is iterated under the lock: it must not use the cache.
    pub fn insert_all<'a>(
        &self,
        blocks: impl IntoIterator<Item = (&'a BlockPointer, Arc<AlignedBuf>)>,
    ) {
        let mut blocks = blocks
            .into_iter()
            .filter(|(bp, buf)| buf.len() as u64 <= self.bytes_max && self.keeps(bp))
            .peekable();
        let mut freed = Vec::new();
        while blocks.peek().is_some() {
            let mut inner = self.inner.lock();
            for (bp, buf) in blocks.by_ref().take(REMOVE_BATCH) {
                inner.insert(key(bp), buf, self.bytes_max, &mut freed);
            }
            MutexGuard::unlock_fair(inner);
            freed.clear();
        }
    }

    /// Forgets every block: what a key unload does, so that no plaintext of the family
    /// stays readable.
    pub fn clear(&self) {
        *self.inner.lock() = Inner::default();
    }

    /// Drops blocks that were freed; none can be read again under its pointer. The lock is
    /// taken for [`REMOVE_BATCH`] at a time and their buffers are freed outside it. A txg
    /// sync forgets every block it
    /// replaced, tens of thousands after many small writes, while the serving cores look up
    /// blocks for their reads and writes: in one hold, or with each buffer freed under the
    /// lock, the lookups waited milliseconds (docs/bench/peers-notes.md).
    pub fn remove_all<'a>(&self, bps: impl IntoIterator<Item = &'a BlockPointer>) {
        let mut bps = bps.into_iter().peekable();
        let mut taken = Vec::with_capacity(REMOVE_BATCH);
        while bps.peek().is_some() {
            let mut inner = self.inner.lock();
            taken.extend(bps.by_ref().take(REMOVE_BATCH).filter_map(|bp| inner.remove(&key(bp))));
            // Handed over fairly: let go plainly, this loop took the lock straight back before
            // a woken reader ran.
            MutexGuard::unlock_fair(inner);
            taken.clear();
        }
    }

    pub fn bytes(&self) -> u64 {
        self.inner.lock().bytes
    }

    pub fn bytes_max(&self) -> u64 {
        self.bytes_max
    }
}

/// A one-copy data block of `sectors` 512-byte sectors at `offset_sectors` of `vdev`, born in
/// `birth_txg`: the pointer the cache's and the prefetch's tests key their blocks by.
#[cfg(test)]
pub(crate) fn test_bp(
    vdev: u32,
    offset_sectors: u64,
    sectors: u32,
    birth_txg: u64,
) -> BlockPointer {
    use sluice_format::{Checksum, ChecksumAlg, Dva};
    BlockPointer {
        dvas: [
            Dva { vdev, asize_sectors: sectors, offset_sectors },
            Dva::default(),
            Dva::default(),
        ],
        lsize_sectors: sectors,
        psize_sectors: sectors,
        birth_txg,
        checksum_alg: ChecksumAlg::Xxh3_128,
        compression: sluice_format::BlockCompression::None,
        kind: BlockKind::Data,
        level: 0,
        fill: 1,
        checksum: Checksum::default(),
        dedup: None,
        crypt: sluice_format::BlockCrypt::None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bp(offset_sectors: u64, birth_txg: u64) -> BlockPointer {
        test_bp(0, offset_sectors, 8, birth_txg)
    }

    /// Entries are bounded in bytes, a block used since it was cached outlives one that was
    /// not, and a reused address with a newer birth txg never returns the old block.
    #[test]
    fn bounded_clock_keyed_by_birth() {
        let cache = BlockCache::new(3 * 4096, true);
        for i in 0..3 {
            cache.insert(&bp(i * 8, 1), Arc::new(AlignedBuf::copy_from(&[i as u8; 4096])));
        }
        assert!(cache.get(&bp(0, 1)).is_some());
        cache.insert(&bp(24, 1), Arc::new(AlignedBuf::zeroed(4096)));
        assert!(cache.get(&bp(8, 1)).is_none(), "the first block not used since went first");
        assert!(cache.get(&bp(0, 1)).is_some());
        assert!(cache.get(&bp(0, 2)).is_none(), "same address, newer block: a miss");
        assert_eq!(cache.bytes(), 3 * 4096);
        cache.remove_all([&bp(0, 1)]);
        assert!(cache.get(&bp(0, 1)).is_none(), "removed");
        assert_eq!(cache.bytes(), 2 * 4096);
        cache.remove_all([&bp(0, 1)]);
        assert_eq!(cache.bytes(), 2 * 4096, "removing twice changes nothing");
        // A removed block's slot is reused, and eviction still finds blocks past it.
        for i in 10..20 {
            cache.insert(&bp(i * 8, 1), Arc::new(AlignedBuf::zeroed(4096)));
            assert!(cache.bytes() <= 3 * 4096);
            assert!(cache.get(&bp(i * 8, 1)).is_some(), "the block just cached is kept");
        }
        let inner = cache.inner.lock();
        assert!(inner.slots.len() <= 5, "slots are reused: {}", inner.slots.len());
        assert_eq!(inner.blocks.len() + inner.free.len(), inner.slots.len());
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
