//! Block I/O on an open pool (ZFS: the read and write halves of the zio pipeline).
//!
//! A block is read from the first of its copies whose bytes match the checksum in its pointer;
//! each copy is read through its top-level vdev with that checksum as the verify callback, so a
//! mirror tries its other children and rewrites the bad one before a copy is given up on. A
//! metadata block has more than one copy (`pool.metadata_copies`): copies that failed before
//! a good one was found are rewritten from it. A
//! block is written to space the caller allocated, and its pointer records the copy's address,
//! sizes, birth txg and checksum. Data handed out has always passed its checksum.

use std::sync::Arc;

use sluice_format::{
    BlockCompression, BlockKind, BlockPointer, Checksum, ChecksumAlg, Dva, SECTOR_BYTES,
};

use super::{compress, Pool, PoolError};
use crate::device::{AlignedBuf, SharedBuf};
use crate::tunables::IoClass;
use crate::vdev;

impl Pool {
    /// Reads and verifies a block, through the block cache; returns its logical bytes (the
    /// cache holds those).
    pub async fn read_block_cached(
        &self,
        bp: &BlockPointer,
        class: IoClass,
    ) -> Result<Arc<AlignedBuf>, PoolError> {
        if let Some(hit) = self.cache().get(bp) {
            return Ok(hit);
        }
        let block = Arc::new(self.read_block_logical(bp, class).await?);
        self.cache().insert(bp, Arc::clone(&block));
        Ok(block)
    }

    /// Reads and verifies a block from disk, bypassing the cache; returns its logical bytes.
    pub async fn read_block_logical(
        &self,
        bp: &BlockPointer,
        class: IoClass,
    ) -> Result<AlignedBuf, PoolError> {
        let stored = self.read_block(bp, class).await?;
        if bp.compression == BlockCompression::None {
            return Ok(stored);
        }
        self.decompress(bp, &stored)
    }

    /// The logical bytes of a block whose stored bytes passed its checksum.
    pub fn decompress(&self, bp: &BlockPointer, stored: &[u8]) -> Result<AlignedBuf, PoolError> {
        compress::decompress(bp, stored).map_err(|source| PoolError::Decompress {
            pool: self.name().to_owned(),
            block: format!(
                "the block of txg {} at offset {} of top-level vdev {}",
                bp.birth_txg,
                bp.dvas[0].offset_bytes(),
                bp.dvas[0].vdev
            ),
            source,
        })
    }

    /// Reads and verifies a block's stored bytes from disk, bypassing the cache (scrub must see
    /// the disk); a compressed block comes back compressed.
    pub async fn read_block(
        &self,
        bp: &BlockPointer,
        class: IoClass,
    ) -> Result<AlignedBuf, PoolError> {
        let psize = u32::try_from(bp.psize_bytes()).unwrap_or(u32::MAX);
        let verify = |bytes: &[u8]| bp.verifies(bytes);
        let mut last = None;
        let mut bad = Vec::new();
        for dva in bp.copies() {
            let at = vdev::VdevAddress { vdev: dva.vdev, offset_bytes: dva.offset_bytes() };
            match self.root().read(at, psize, class, &verify).await {
                Ok(buf) => {
                    // Earlier copies that failed are rewritten from this one (a metadata
                    // block's ditto copies heal each other, as a mirror's children do).
                    if !bad.is_empty() {
                        self.heal_copies(&bad, &buf).await;
                    }
                    return Ok(buf);
                }
                Err(error) => {
                    // Bad or unreadable: either way a rewrite gives it back its bytes (a
                    // device that is gone refuses the write, and nothing is lost).
                    bad.push(*dva);
                    last = Some(error);
                }
            }
        }
        Err(PoolError::Vdev {
            pool: self.name().to_owned(),
            source: last.unwrap_or(vdev::VdevError::NoSuchVdev { vdev: u32::MAX, count: 0 }),
        })
    }

    /// Rewrites the copies `bad` of a block from `good`, its verified bytes, unless the pool
    /// is read-only; each leaf written counts a repair. Returns how many copies were rewritten.
    pub(super) async fn heal_copies(&self, bad: &[sluice_format::Dva], good: &[u8]) -> u32 {
        if self.read_only.load(std::sync::atomic::Ordering::Relaxed) {
            return 0;
        }
        let mut healed = 0;
        let root = self.root();
        for dva in bad {
            let Some(top) = root.top_level().get(dva.vdev as usize) else { continue };
            let data = SharedBuf::copy_from(good);
            if top.write(dva.offset_bytes(), data, IoClass::AsyncWrite, false).await.is_ok() {
                healed += 1;
                for leaf in top.leaves() {
                    leaf.stats().repairs.inc();
                }
            }
        }
        healed
    }

    /// Reads blocks that lie back to back on one top-level vdev (each with a single copy) in
    /// one I/O, verifying every block against its own pointer; returns the span's bytes. On
    /// any failure the caller reads the blocks one by one, which finds and heals each bad copy.
    /// Not cached: a span is a bulk read (the cache would split and copy it).
    pub async fn read_span(&self, bps: &[BlockPointer]) -> Result<AlignedBuf, PoolError> {
        let first = bps.first().map(|bp| bp.dvas[0]).unwrap_or_default();
        let mut ends = Vec::with_capacity(bps.len());
        let mut total = 0u64;
        for (i, bp) in bps.iter().enumerate() {
            assert!(
                i == 0 || follows(&bps[i - 1], bp),
                "block {i} of a span does not follow the one before it"
            );
            total += bp.psize_bytes();
            ends.push(total as usize);
        }
        let verify = |bytes: &[u8]| {
            bytes.len() == total as usize
                && bps.iter().zip(&ends).all(|(bp, &end)| {
                    let start = end - bp.psize_bytes() as usize;
                    bp.verifies(&bytes[start..end])
                })
        };
        let at = vdev::VdevAddress { vdev: first.vdev, offset_bytes: first.offset_bytes() };
        let len = u32::try_from(total).unwrap_or(u32::MAX);
        self.root()
            .read(at, len, IoClass::SyncRead, &verify)
            .await
            .map_err(|source| PoolError::Vdev { pool: self.name().to_owned(), source })
    }

    /// Writes `data` (already padded to whole sectors) at `(vdev, offset)` and returns the block
    /// pointer describing it.
    #[allow(clippy::too_many_arguments)]
    pub async fn write_block_at(
        &self,
        vdev: u32,
        offset_bytes: u64,
        data: SharedBuf,
        lsize_bytes: u64,
        kind: BlockKind,
        level: u8,
        fill: u64,
        txg: u64,
    ) -> Result<BlockPointer, PoolError> {
        let bp = describe_block(vdev, offset_bytes, &data, lsize_bytes, kind, level, fill, txg);
        self.write_copy(vdev, offset_bytes, data).await?;
        Ok(bp)
    }

    /// Writes one copy of a block already described by [`describe_block`].
    pub async fn write_copy(
        &self,
        vdev: u32,
        offset_bytes: u64,
        data: SharedBuf,
    ) -> Result<(), PoolError> {
        self.root()
            .write(vdev::VdevAddress { vdev, offset_bytes }, data, IoClass::AsyncWrite)
            .await
            .map_err(|source| PoolError::Vdev { pool: self.name().to_owned(), source })
    }
}

/// Whether `next` lies right after `prev` on the same top-level vdev, both with a single
/// copy that fills its allocation: the rule for blocks one span may read together.
pub fn follows(prev: &BlockPointer, next: &BlockPointer) -> bool {
    let single = |bp: &BlockPointer| {
        bp.copies().count() == 1 && bp.dvas[0].asize_bytes() == bp.psize_bytes()
    };
    let (p, n) = (prev.dvas[0], next.dvas[0]);
    single(prev)
        && single(next)
        && n.vdev == p.vdev
        && n.offset_bytes() == p.offset_bytes() + p.asize_bytes()
}

/// The pointer of a block holding `data` (whole sectors) at `(vdev, offset)`, before it is
/// written: the dedup table hands it to writers of the same block while the write is in flight
/// (ZFS: a zio's ready stage).
#[allow(clippy::too_many_arguments)]
pub fn describe_block(
    vdev: u32,
    offset_bytes: u64,
    data: &[u8],
    lsize_bytes: u64,
    kind: BlockKind,
    level: u8,
    fill: u64,
    txg: u64,
) -> BlockPointer {
    let checksum = block_checksum(data);
    describe_summed_block(vdev, offset_bytes, data, lsize_bytes, kind, level, fill, txg, checksum)
}

/// The checksum [`describe_block`] gives `data`, for a caller that computes it elsewhere
/// (txg/zil.rs spreads it over the cores) and then calls [`describe_summed_block`].
pub fn block_checksum(data: &[u8]) -> Checksum {
    ChecksumAlg::Xxh3_128.compute(data)
}

/// [`describe_block`] with `checksum`, which must be [`block_checksum`] of `data`.
#[allow(clippy::too_many_arguments)]
pub fn describe_summed_block(
    vdev: u32,
    offset_bytes: u64,
    data: &[u8],
    lsize_bytes: u64,
    kind: BlockKind,
    level: u8,
    fill: u64,
    txg: u64,
    checksum: Checksum,
) -> BlockPointer {
    let sector = u64::from(SECTOR_BYTES);
    let psize = data.len() as u64;
    assert!(psize > 0 && psize % sector == 0, "block data must be whole sectors");
    assert!(offset_bytes % sector == 0, "blocks start on sector boundaries");
    let sectors = |bytes: u64| u32::try_from(bytes / sector).unwrap_or(u32::MAX);
    BlockPointer {
        dvas: [
            Dva { vdev, asize_sectors: sectors(psize), offset_sectors: offset_bytes / sector },
            Dva::default(),
            Dva::default(),
        ],
        lsize_sectors: sectors(lsize_bytes.div_ceil(sector) * sector),
        psize_sectors: sectors(psize),
        birth_txg: txg,
        checksum_alg: ChecksumAlg::Xxh3_128,
        compression: BlockCompression::None,
        kind,
        level,
        fill,
        checksum,
        dedup: None,
    }
}
