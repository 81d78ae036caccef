//! Dirty blocks of the open and syncing txgs (ZFS: `dbuf.c`).
//!
//! A volume block changed in memory is a [`Block`]: whole new bytes, a hole, or a patch of the
//! sectors a partial write covered over the version below it. A patch lets a 4 KiB write into a
//! 16 KiB block be answered without reading the block first; the read happens when the block is
//! read or synced (`dmu.rs`, `spa_sync.rs`).
//!
//! A whole block of the open txg may also have been written in place already, for an indirect
//! log record (`zil.rs`): a [`Prewritten`] block, which the sync links into the tree instead
//! of writing the bytes again (ZFS: a dirty record's override, `dmu_sync`).

use std::sync::Arc;

use sluice_format::BlockPointer;

use crate::device::AlignedBuf;
use crate::intent_log::DataWrite;

/// A block of the open txg written in place for the intent log. The sync links `bp` if the
/// block it syncs is still `data` (the same allocation, not a later write's) and `write`
/// succeeded; otherwise it waits for `write` to end and frees `bp`'s space.
#[derive(Clone)]
pub(super) struct Prewritten {
    pub(super) data: Arc<AlignedBuf>,
    pub(super) bp: BlockPointer,
    pub(super) write: DataWrite,
}

impl std::fmt::Debug for Prewritten {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prewritten").field("bp", &self.bp).finish_non_exhaustive()
    }
}

#[derive(Clone, Debug)]
pub(super) enum Block {
    /// Whole bytes, in an I/O buffer: the sync writes them and the block cache keeps this very
    /// buffer afterwards, without copies.
    Data(Arc<AlignedBuf>),
    Zero,
    /// Sectors written over a version of the block not read yet: the version below (the
    /// syncing txg's block, else the disk's) with the `covered` sectors replaced by `data`'s.
    /// A partial write so costs no read; the read happens when the block is read or synced.
    Patched(Arc<Patch>),
}

#[derive(Clone, Debug)]
pub(super) struct Patch {
    /// The whole block's bytes; only covered sectors count.
    pub(super) data: AlignedBuf,
    /// One bit per 512-byte sector.
    pub(super) covered: Vec<u64>,
}

pub(super) const SECTOR: u64 = 512;

impl Patch {
    pub(super) fn new(block_bytes: u64) -> Patch {
        let sectors = block_bytes / SECTOR;
        Patch {
            data: AlignedBuf::zeroed(block_bytes as usize),
            covered: vec![0; sectors.div_ceil(64) as usize],
        }
    }

    /// Writes `bytes` (or zeros) at `at` (sector-aligned) within the block.
    pub(super) fn write(&mut self, at: usize, len: usize, bytes: Option<&[u8]>) {
        match bytes {
            Some(b) => self.data[at..at + len].copy_from_slice(b),
            None => self.data[at..at + len].fill(0),
        }
        for sector in at as u64 / SECTOR..(at + len) as u64 / SECTOR {
            self.covered[(sector / 64) as usize] |= 1 << (sector % 64);
        }
    }

    pub(super) fn complete(&self) -> bool {
        let sectors = self.data.len() as u64 / SECTOR;
        (0..sectors).all(|s| self.covered[(s / 64) as usize] & (1 << (s % 64)) != 0)
    }

    /// The block: `base` (None: zeros) with the covered sectors replaced.
    pub(super) fn apply(&self, base: Option<&[u8]>) -> AlignedBuf {
        self.apply_owned(base.map(|b| AlignedBuf::copy_from(&b[..self.data.len()])))
    }

    /// [`Patch::apply`] over a base the caller already owns (one copy fewer).
    pub(super) fn apply_owned(&self, base: Option<AlignedBuf>) -> AlignedBuf {
        let mut out = base.unwrap_or_else(|| AlignedBuf::zeroed(self.data.len()));
        assert_eq!(out.len(), self.data.len(), "a patch applies to a whole block");
        for (word_index, &word) in self.covered.iter().enumerate() {
            let mut bits = word;
            while bits != 0 {
                let sector = word_index as u64 * 64 + u64::from(bits.trailing_zeros());
                bits &= bits - 1;
                let range = (sector * SECTOR) as usize..((sector + 1) * SECTOR) as usize;
                out[range.clone()].copy_from_slice(&self.data[range]);
            }
        }
        out
    }
}
