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

    /// The block, built in this patch's own buffer: the sectors it does not cover are copied
    /// from `base` (None: zeros, which they hold already). Where the caller holds the patch
    /// alone this copies only the uncovered sectors, where [`Patch::apply`] allocates a block
    /// and copies the whole base. Leaves the patch empty.
    pub(super) fn take_applied(&mut self, base: Option<&[u8]>) -> AlignedBuf {
        if let Some(base) = base {
            assert!(base.len() >= self.data.len(), "a patch applies over a whole block");
        }
        let mut out = std::mem::replace(&mut self.data, AlignedBuf::zeroed(0));
        let Some(base) = base else { return out };
        let sectors = out.len() / SECTOR as usize;
        let covered = |s: usize| self.covered[s / 64] & (1 << (s % 64)) != 0;
        // Each run of uncovered sectors in one copy.
        let mut sector = 0;
        while sector < sectors {
            if covered(sector) {
                sector += 1;
                continue;
            }
            let start = sector;
            while sector < sectors && !covered(sector) {
                sector += 1;
            }
            let range = start * SECTOR as usize..sector * SECTOR as usize;
            out[range.clone()].copy_from_slice(&base[range]);
        }
        out
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A patch over sectors 1, 2 and 30 of a 16 KiB block (runs at the start, middle and
    /// end of the uncovered space), with a zeroed sector among them.
    fn patch() -> Patch {
        let mut patch = Patch::new(16 << 10);
        patch.write(512, 1024, Some(&[0xaa; 1024]));
        patch.write(30 * 512, 512, None);
        patch.write(31 * 512, 512, Some(&[0xbb; 512]));
        patch
    }

    #[test]
    fn a_patch_taken_gives_the_block_apply_gives() {
        let base: Vec<u8> = (0..16 << 10).map(|i| (i % 251) as u8 + 1).collect();
        for base in [Some(&base[..]), None] {
            let mut taken = patch();
            let expected = taken.apply(base);
            assert_eq!(taken.take_applied(base), expected);
            assert!(taken.data.is_empty(), "the patch gave its buffer away");
        }
        // The base's own bytes show where nothing covers them; a longer base is cut.
        let mut longer = vec![7u8; 20 << 10];
        longer[0] = 9;
        let block = patch().take_applied(Some(&longer));
        assert_eq!(block.len(), 16 << 10);
        assert_eq!(
            (block[0], block[600], block[4096], block[30 * 512], block[31 * 512]),
            (9, 0xaa, 7, 0, 0xbb)
        );
    }
}
