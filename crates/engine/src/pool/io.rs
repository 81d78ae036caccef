//! The pool's side of the block pipeline (crate::zio): reads through the block cache, healing
//! copies that failed, and writes whose done stage fills the cache.
//!
//! A block is read from the first of its copies whose bytes match the checksum in its pointer
//! (zio's issue and verify stages); copies that failed before a good one was found are
//! rewritten from it (a metadata block's ditto copies heal each other, as a mirror's children
//! do). Data handed out has always passed its checksum. A write goes through every zio stage
//! ([`Pool::write_blocks`]), or, for a writer that allocates its own way (the intent log's
//! blocks written in place, the dedup table's lead writer), through the stages one by one
//! ([`Pool::seal_blocks`], [`Pool::allocate`], [`Pool::issue_placed`]).

use std::sync::Arc;

use parking_lot::Mutex;
use sluice_format::{BlockPointer, Dva};

use super::{Pool, PoolError};
use crate::alloc::{AllocClass, Allocator};
use crate::device::{AlignedBuf, SharedBuf};
use crate::tunables::IoClass;
use crate::vdev;
use crate::zio::{self, BlockProps, Issue, Places, Sealed, Writer, ZioError};

impl Pool {
    /// Reads and verifies a block, through the block cache; returns its logical bytes (the
    /// cache holds those).
    pub async fn read_block_cached(
        &self,
        bp: &BlockPointer,
        class: IoClass,
    ) -> Result<Arc<AlignedBuf>, PoolError> {
        self.check_key(bp)?;
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
        self.read(bp, class, zio::ReadMode::Logical).await
    }

    /// Refuses an encrypted block whose family's key is not loaded, before the cache is
    /// asked: a read that decrypted it just before an unload may have cached it after the
    /// unload emptied the cache.
    pub fn check_key(&self, bp: &BlockPointer) -> Result<(), PoolError> {
        match bp.crypt {
            sluice_format::BlockCrypt::Encrypted { family, .. }
                if !self.zio().keys().is_loaded(family) =>
            {
                Err(PoolError::KeyUnavailable {
                    pool: self.name().to_owned(),
                    block: format!(
                        "the block of txg {} at offset {} of top-level vdev {}",
                        bp.birth_txg,
                        bp.dvas[0].offset_bytes(),
                        bp.dvas[0].vdev
                    ),
                    family,
                })
            }
            _ => Ok(()),
        }
    }

    /// The logical bytes of a block whose stored bytes passed its checksum (decrypted and
    /// decompressed).
    pub fn unseal(&self, bp: &BlockPointer, stored: &[u8]) -> Result<AlignedBuf, PoolError> {
        zio::unseal_from(self.zio().keys(), bp, stored)
            .map_err(|source| self.undecodable(bp, source))
    }

    /// [`Pool::unseal`]'s decrypt stage where the stored bytes lie ([`zio::open_in_place`]).
    pub fn open_in_place(&self, bp: &BlockPointer, stored: &mut [u8]) -> Result<(), PoolError> {
        zio::open_in_place(self.zio().keys(), bp, stored)
            .map_err(|source| self.undecodable(bp, source))
    }

    /// The logical bytes of a block opened in place (decompressed if it is compressed, and
    /// then its children's MACs checked if it is an indirect block that carries them).
    pub fn decompressed(&self, bp: &BlockPointer, opened: &[u8]) -> Result<AlignedBuf, PoolError> {
        if bp.compression == sluice_format::BlockCompression::None {
            return Ok(AlignedBuf::copy_from(&opened[..bp.lsize_bytes() as usize]));
        }
        let logical = zio::compress::decompress(bp, opened)
            .map_err(|source| self.undecodable(bp, zio::UnsealError::Decompress(source)))?;
        zio::check_children_mac(bp, &logical).map_err(|source| self.undecodable(bp, source))?;
        Ok(logical)
    }

    /// The error of a block whose stored bytes verified but do not open or decompress.
    pub(crate) fn undecodable(&self, bp: &BlockPointer, source: zio::UnsealError) -> PoolError {
        let pool = self.name().to_owned();
        let block = format!(
            "the block of txg {} at offset {} of top-level vdev {}",
            bp.birth_txg,
            bp.dvas[0].offset_bytes(),
            bp.dvas[0].vdev
        );
        match source {
            zio::UnsealError::Decompress(cause) => PoolError::Decompress { pool, block, cause },
            zio::UnsealError::KeyUnavailable { family } => {
                PoolError::KeyUnavailable { pool, block, family }
            }
            zio::UnsealError::Authentication => PoolError::Authentication { pool, block },
            zio::UnsealError::Crypt(cause) => PoolError::Crypt { pool, block, cause },
        }
    }

    /// Reads and verifies a block's stored bytes from disk, bypassing the cache (scrub must see
    /// the disk); a compressed block comes back compressed.
    pub async fn read_block(
        &self,
        bp: &BlockPointer,
        class: IoClass,
    ) -> Result<AlignedBuf, PoolError> {
        self.read(bp, class, zio::ReadMode::Raw).await
    }

    /// A read through zio's stages; copies that failed before a good one are rewritten from it.
    async fn read(
        &self,
        bp: &BlockPointer,
        class: IoClass,
        mode: zio::ReadMode,
    ) -> Result<AlignedBuf, PoolError> {
        let (stored, bad) = zio::read_stored(&self.root(), bp, class)
            .await
            .map_err(|source| PoolError::Vdev { pool: self.name().to_owned(), cause: source })?;
        if !bad.is_empty() {
            self.heal_copies(&bad, &stored).await;
        }
        match mode {
            zio::ReadMode::Raw => Ok(stored),
            zio::ReadMode::Logical => zio::unseal(self.zio().keys(), bp, stored)
                .map_err(|source| self.undecodable(bp, source)),
        }
    }

    /// Rewrites the copies `bad` of a block from `good`, its verified bytes, unless the pool
    /// is read-only; each leaf written counts a repair. Returns how many copies were rewritten.
    pub(super) async fn heal_copies(&self, bad: &[Dva], good: &[u8]) -> u32 {
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
                // A RAID-Z vdev rewrote the block's columns on children that held them well
                // too: its own reads count repairs on the children that were wrong.
                if !matches!(top, vdev::Vdev::Raidz(_)) {
                    for leaf in top.leaves() {
                        leaf.stats().repairs.inc();
                    }
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
            .map_err(|source| PoolError::Vdev { pool: self.name().to_owned(), cause: source })
    }

    /// The pipeline's faults, observers and error counts.
    pub fn zio(&self) -> &Arc<zio::Pipeline> {
        &self.zio
    }

    /// A block of `writer` passes `stage` (one the pipeline's callers run: dedup's); fails it
    /// where a fault is armed.
    pub fn zio_stage(&self, stage: zio::Stage, writer: Writer) -> Result<(), PoolError> {
        let passed = self.zio.stage(stage, writer);
        if passed.is_err() {
            self.zio.note_error(writer);
        }
        passed.map_err(|e| self.zio_error(e))
    }

    /// A pipeline error, named with this pool.
    pub fn zio_error(&self, error: ZioError) -> PoolError {
        let pool = self.name().to_owned();
        match error {
            ZioError::Injected { stage, writer } => PoolError::Injected { pool, stage, writer },
            ZioError::NoSpace { cause: source, .. } => PoolError::NoSpace { pool, cause: source },
            ZioError::Vdev { cause: source, .. } => PoolError::Vdev { pool, cause: source },
            ZioError::KeyUnavailable { writer, family } => {
                PoolError::KeyUnavailable { pool, block: format!("a {writer} block"), family }
            }
            ZioError::Crypt { writer, cause } => {
                PoolError::Crypt { pool, block: format!("a {writer} block"), cause }
            }
        }
    }

    /// Writes `blocks` through every stage: sealed (compressed, checksummed) as
    /// `zio::seal_batch` says (spread over the host's threads, or in the core's taskq),
    /// allocated in order so they land back to back, issued in runs, and cached where their
    /// writer's blocks are read back. Returns their pointers in order.
    pub async fn write_blocks(
        &self,
        allocator: &Mutex<Allocator>,
        class: AllocClass,
        blocks: Vec<(BlockProps, Arc<AlignedBuf>)>,
        hint: Option<Arc<zio::compress::RunHint>>,
    ) -> Result<Vec<BlockPointer>, PoolError> {
        if blocks.is_empty() {
            return Ok(Vec::new());
        }
        let sealed = self.seal_blocks(blocks, hint).await?;
        let placed = self.allocate(allocator, &sealed, class)?;
        self.issue_placed(&sealed, &placed, Issue::ASYNC).await
    }

    /// zio's CPU stages for a batch (`zio::seal_batch`: spread over the host's threads, in the
    /// core's taskq, or here), its early abort going on from `hint` where the batch is one
    /// volume's data.
    pub async fn seal_blocks(
        &self,
        blocks: Vec<(BlockProps, Arc<AlignedBuf>)>,
        hint: Option<Arc<zio::compress::RunHint>>,
    ) -> Result<Vec<Sealed>, PoolError> {
        zio::seal_batch(self.env(), &self.zio, blocks, self.unit_bytes(), hint)
            .await
            .map_err(|e| self.zio_error(e))
    }

    /// [`zio::stage_as_is`]: a log committer's batch that is stored as it is, past its
    /// compress and encrypt stages, so that its writes can start before its checksums.
    pub fn stage_as_is(
        &self,
        blocks: &[(BlockProps, Arc<AlignedBuf>)],
        hint: Option<&zio::compress::RunHint>,
    ) -> Result<zio::Staging, PoolError> {
        zio::stage_as_is(&self.zio, blocks, self.unit_bytes(), hint).map_err(|e| self.zio_error(e))
    }

    /// [`Pool::seal_blocks`] with the early abort's plan where [`Pool::stage_as_is`] made it.
    pub async fn seal_blocks_planned(
        &self,
        blocks: Vec<(BlockProps, Arc<AlignedBuf>)>,
        plan: Vec<Option<bool>>,
    ) -> Result<Vec<Sealed>, PoolError> {
        zio::seal_batch_planned(self.env(), &self.zio, blocks, self.unit_bytes(), plan)
            .await
            .map_err(|e| self.zio_error(e))
    }

    /// [`zio::sum_staged`]: the checksums of a batch [`Pool::stage_as_is`] staged.
    pub fn sum_staged(&self, staged: &zio::Staged) -> Result<Vec<Sealed>, PoolError> {
        zio::sum_staged(&self.zio, staged).map_err(|e| self.zio_error(e))
    }

    /// zio's CPU stages for one block, here; `psize` pads it to a place allocated already.
    pub fn seal_block(
        &self,
        props: BlockProps,
        logical: Arc<AlignedBuf>,
        psize: Option<u64>,
    ) -> Result<Sealed, PoolError> {
        let sealed = zio::seal(&self.zio, props, logical, self.unit_bytes(), psize);
        if sealed.is_err() {
            self.zio.note_error(props.writer);
        }
        sealed.map_err(|e| self.zio_error(e))
    }

    /// [`zio::seal_raw`]: a block stored elsewhere, checksummed here as it is.
    pub fn seal_raw(
        &self,
        props: BlockProps,
        logical: Arc<AlignedBuf>,
        stored: &[u8],
        compression: sluice_format::BlockCompression,
    ) -> Result<Sealed, PoolError> {
        let unit = self.unit_bytes();
        let sealed = zio::seal_raw(&self.zio, props, logical, stored, compression, unit);
        if sealed.is_err() {
            self.zio.note_error(props.writer);
        }
        sealed.map_err(|e| self.zio_error(e))
    }

    /// zio's allocate stage for sealed blocks, in order.
    pub fn allocate(
        &self,
        allocator: &Mutex<Allocator>,
        sealed: &[Sealed],
        class: AllocClass,
    ) -> Result<Vec<Places>, PoolError> {
        zio::allocate(&self.zio, &mut allocator.lock(), sealed, class)
            .map_err(|e| self.zio_error(e))
    }

    /// zio's ready, issue and done stages for sealed blocks at places already allocated:
    /// returns their pointers once every copy is written.
    pub async fn issue_placed(
        &self,
        sealed: &[Sealed],
        placed: &[Places],
        how: Issue,
    ) -> Result<Vec<BlockPointer>, PoolError> {
        let pointers: Vec<BlockPointer> =
            sealed.iter().zip(placed).map(|(block, places)| zio::describe(block, places)).collect();
        zio::issue_placed(&self.zio, &self.root(), sealed, placed, how)
            .await
            .map_err(|e| self.zio_error(e))?;
        // Done. Indirect blocks written now are the ones the next txg's update reads
        // (measured with 4 KiB random writes: every txg re-read each level-1 block the previous
        // one wrote, 2,000 reads a second); data blocks are what the next partial write of the
        // block reads. A block is cached as the very buffer it was written from, with no copy
        // (dirty data blocks: `txg::dbuf`); the cache holds logical bytes.
        let cached = sealed.iter().zip(&pointers).filter(|(block, _)| block.props.writer.cached());
        self.cache().insert_all(cached.map(|(block, bp)| (bp, Arc::clone(&block.logical))));
        Ok(pointers)
    }

    /// zio's issue stage for one buffer of `writer`'s blocks (the intent log's chain blocks,
    /// and its runs of blocks written in place).
    pub async fn issue(
        &self,
        writer: Writer,
        at: vdev::VdevAddress,
        data: SharedBuf,
        how: Issue,
    ) -> Result<(), PoolError> {
        zio::issue(&self.zio, &self.root(), writer, at, data, how)
            .await
            .map_err(|e| self.zio_error(e))
    }

    /// Writes a run of blocks back to back on top-level vdev `vdev` ([`zio::issue_run`]).
    pub async fn issue_run(
        &self,
        writer: Writer,
        vdev: u32,
        blocks: Vec<vdev::RunBlock>,
        how: Issue,
    ) -> Result<(), PoolError> {
        zio::issue_run(&self.zio, &self.root(), writer, vdev, blocks, how)
            .await
            .map_err(|e| self.zio_error(e))
    }

    /// Stored bytes of `writer`'s blocks written since the pool opened (every copy; a vdev's
    /// own redundancy not counted): `pool iostat`'s bytes by kind.
    pub fn written_bytes(&self, writer: Writer) -> u64 {
        self.zio.written(writer)
    }

    /// The allocation unit: stored blocks are padded to whole units.
    pub fn unit_bytes(&self) -> u64 {
        1 << self.ashift
    }
}

/// Whether `bp` has a single copy that fills its allocation: its stored bytes lie alone and
/// whole at its address, so a read of a range around it finds them there.
pub fn single_copy(bp: &BlockPointer) -> bool {
    bp.copies().count() == 1 && bp.dvas[0].asize_bytes() == bp.psize_bytes()
}

/// Whether `next` lies right after `prev` on the same top-level vdev, both with a single
/// copy that fills its allocation: the rule for blocks one span may read together.
pub fn follows(prev: &BlockPointer, next: &BlockPointer) -> bool {
    let (p, n) = (prev.dvas[0], next.dvas[0]);
    single_copy(prev)
        && single_copy(next)
        && n.vdev == p.vdev
        && n.offset_bytes() == p.offset_bytes() + p.asize_bytes()
}
