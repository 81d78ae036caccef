//! Dirty blocks of the open and syncing txgs (ZFS: `dbuf.c`).
//!
//! A volume block changed in memory is a [`Block`]: whole new bytes, a hole, or a patch of the
//! sectors a partial write covered over the version below it. A patch lets a 4 KiB write into a
//! 16 KiB block be answered without reading the block first; the read happens when the block is
//! read or synced, or completed when the write path asks (`dmu.rs`, `spa_sync.rs`,
//! `dbuf_read.rs`).
//!
//! A whole block of the open txg may also have been written in place already, for an indirect
//! log record (`zil_commit.rs`): a [`Prewritten`] block, which the sync links into the tree instead
//! of writing the bytes again (ZFS: a dirty record's override, `dmu_sync`).

use std::sync::Arc;

use sluice_format::BlockPointer;

use crate::device::{AlignedBuf, UninitBuf};
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

/// Sectors a partial write (or several) covered in one block, over a version of the block not
/// read yet. The buffer is block-sized so that the patch can become the block in place, but
/// only its covered sectors are ever written before then: the others are filled from the
/// version below (or with zeros) when the block is built, so a new patch costs no zeroing
/// (16 KiB zeroed per 4 KiB write was 6% of the serving core at 32 clients, perf 2026-11-26).
pub(super) struct Patch {
    /// The whole block's buffer. Invariant: every covered sector has been written, and no
    /// other byte is read (the safety of every `bytes` call below rests on it).
    data: UninitBuf,
    /// One bit per 512-byte sector.
    covered: Vec<u64>,
}

pub(super) const SECTOR: u64 = 512;

impl Patch {
    pub(super) fn new(block_bytes: u64) -> Patch {
        assert_eq!(block_bytes % SECTOR, 0, "a block is whole sectors");
        let sectors = block_bytes / SECTOR;
        Patch {
            data: UninitBuf::new(block_bytes as usize),
            covered: vec![0; sectors.div_ceil(64) as usize],
        }
    }

    /// The block's size in bytes (0 once taken).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.data.len()
    }

    /// Writes `bytes` (or zeros) at `at` within the block; both are whole sectors.
    pub(super) fn write(&mut self, at: usize, len: usize, bytes: Option<&[u8]>) {
        // Whole sectors only: a sector marked covered must be written in full.
        assert!(
            at as u64 % SECTOR == 0 && len as u64 % SECTOR == 0,
            "a patch covers whole sectors ({len} bytes at {at})"
        );
        match bytes {
            Some(b) => {
                assert_eq!(b.len(), len, "a patch's write gives its bytes");
                self.data.write_at(at, b);
            }
            None => self.data.fill_at(at, len, 0),
        }
        for sector in at as u64 / SECTOR..(at + len) as u64 / SECTOR {
            self.covered[(sector / 64) as usize] |= 1 << (sector % 64);
        }
    }

    /// The byte ranges of the runs of covered sectors (`want`: true) or uncovered ones.
    fn runs(&self, want: bool) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
        sector_runs(&self.covered, self.data.len() / SECTOR as usize, want)
    }

    /// Whether every sector is covered (also true of a patch taken, which has none).
    pub(super) fn complete(&self) -> bool {
        self.runs(false).next().is_none()
    }

    /// The block: `base` (None: zeros) with the covered sectors replaced.
    pub(super) fn apply(&self, base: Option<&[u8]>) -> AlignedBuf {
        self.apply_owned(base.map(|b| AlignedBuf::copy_from(&b[..self.data.len()])))
    }

    /// The block, built in this patch's own buffer: the sectors it does not cover are copied
    /// from `base` (None: zeros). Where the caller holds the patch alone this copies only the
    /// uncovered sectors, where [`Patch::apply`] allocates a block and copies the whole base.
    /// Leaves the patch empty.
    pub(super) fn take_applied(&mut self, base: Option<&[u8]>) -> AlignedBuf {
        if let Some(base) = base {
            assert!(base.len() >= self.data.len(), "a patch applies over a whole block");
        }
        let sectors = self.data.len() / SECTOR as usize;
        let mut out = std::mem::replace(&mut self.data, UninitBuf::new(0));
        for range in sector_runs(&self.covered, sectors, false) {
            match base {
                Some(base) => out.write_at(range.start, &base[range]),
                None => out.fill_at(range.start, range.len(), 0),
            }
        }
        // Empty now: nothing is covered.
        self.covered.fill(0);
        // SAFETY: the covered sectors were written (the invariant) and the gaps just now.
        unsafe { out.assume_init() }
    }

    /// [`Patch::apply`] over a base the caller already owns (one copy fewer).
    pub(super) fn apply_owned(&self, base: Option<AlignedBuf>) -> AlignedBuf {
        let mut out = base.unwrap_or_else(|| AlignedBuf::zeroed(self.data.len()));
        assert_eq!(out.len(), self.data.len(), "a patch applies to a whole block");
        for range in self.runs(true) {
            // SAFETY: the range is covered, so it was written (the invariant).
            out[range.clone()].copy_from_slice(unsafe { self.data.bytes(range) });
        }
        out
    }
}

/// The byte ranges of the runs of `sectors` sectors whose bits in `covered` equal `want`.
fn sector_runs(
    covered: &[u64],
    sectors: usize,
    want: bool,
) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
    let is = move |sector: usize| (covered[sector / 64] & (1 << (sector % 64)) != 0) == want;
    let mut sector = 0;
    std::iter::from_fn(move || {
        while sector < sectors && !is(sector) {
            sector += 1;
        }
        if sector == sectors {
            return None;
        }
        let start = sector;
        while sector < sectors && is(sector) {
            sector += 1;
        }
        Some(start * SECTOR as usize..sector * SECTOR as usize)
    })
}

impl Clone for Patch {
    /// Copies the covered sectors only: no other byte of the buffer may be read.
    fn clone(&self) -> Patch {
        let mut data = UninitBuf::new(self.data.len());
        for range in self.runs(true) {
            // SAFETY: the range is covered, so it was written (the invariant).
            data.write_at(range.start, unsafe { self.data.bytes(range.clone()) });
        }
        Patch { data, covered: self.covered.clone() }
    }
}

impl std::fmt::Debug for Patch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sectors = self.covered.iter().map(|w| w.count_ones()).sum::<u32>();
        write!(f, "Patch({} bytes, {sectors} sectors covered)", self.data.len())
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
            assert_eq!(taken.len(), 0, "the patch gave its buffer away");
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

    /// A patch's copy, and the patch made complete by writes, give the block with the
    /// uncovered sectors from the base or zeros: bytes never written are never read.
    #[test]
    fn a_cloned_or_completed_patch_gives_the_same_block() {
        let original = patch();
        let copy = original.clone();
        assert_eq!(copy.apply(None), original.apply(None));
        let block = copy.clone().take_applied(None);
        assert!(block[..512].iter().all(|&b| b == 0), "uncovered sectors read as zeros");
        assert!(block[512..1536].iter().all(|&b| b == 0xaa));
        let mut whole = Patch::new(16 << 10);
        assert!(!whole.complete());
        whole.write(0, 8 << 10, Some(&[1; 8 << 10]));
        whole.write(8 << 10, 8 << 10, None);
        assert!(whole.complete());
        let block = whole.take_applied(None);
        assert_eq!((block[0], block[(8 << 10) - 1], block[8 << 10]), (1, 1, 0));
    }

    /// Runs that cross the 64-sector words of the map, in a 128 KiB block (256 sectors).
    #[test]
    fn runs_cross_the_words_of_the_sector_map() {
        let mut patch = Patch::new(128 << 10);
        // Sectors 60..70 and 127..129 covered; 255, the last, too.
        patch.write(60 * 512, 10 * 512, Some(&[3; 10 * 512]));
        patch.write(127 * 512, 2 * 512, Some(&[4; 2 * 512]));
        patch.write(255 * 512, 512, Some(&[5; 512]));
        let covered: Vec<_> = patch.runs(true).collect();
        assert_eq!(covered, [60 * 512..70 * 512, 127 * 512..129 * 512, 255 * 512..256 * 512]);
        let gaps: Vec<_> = patch.runs(false).collect();
        assert_eq!(gaps, [0..60 * 512, 70 * 512..127 * 512, 129 * 512..255 * 512]);
        let base = vec![9u8; 128 << 10];
        let expected = patch.apply(Some(&base));
        let block = patch.take_applied(Some(&base));
        assert_eq!(block, expected);
        assert_eq!(
            (
                block[60 * 512 - 1],
                block[60 * 512],
                block[70 * 512],
                block[128 * 512],
                block[255 * 512]
            ),
            (9, 3, 9, 4, 5)
        );
    }
}

/// Whether a change comes from a client (and is logged) or from replaying the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Apply {
    Live,
    /// Replaying the record with this sequence.
    Replay(u64),
    /// A raw receive's blocks, already sealed and written in place (or its frees): not
    /// logged, and taken without the key, which a raw stream's volume need not have.
    Receive,
}

/// The bytes of a write: borrowed, or handed over by a caller that no longer needs them (the
/// NBD server's request buffer, whose capacity is its length). Handed over, a write that the
/// log records in one piece keeps the buffer itself as its record's bytes instead of a copy:
/// one copy of the payload fewer on the small sync write's path (the others: the read buffer's
/// into the request's, the request's into the dirty block, and the record's into the log block
/// it is encoded in; docs/design.md, The payload's copies).
pub enum WriteData<'a> {
    Borrowed(&'a [u8]),
    Owned(Vec<u8>),
    /// Whole blocks from a block boundary, each received into a buffer of its own (ZFS's
    /// `dmu_assign_arcbuf`): each becomes its dirty block as it is, so a large write's bytes are
    /// not copied from the request's buffer into its blocks ([`crate::Volume::write_blocks`]).
    Blocks(Vec<Arc<AlignedBuf>>),
}

impl std::fmt::Debug for WriteData<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            WriteData::Borrowed(_) => "Borrowed",
            WriteData::Owned(_) => "Owned",
            WriteData::Blocks(_) => "Blocks",
        };
        write!(f, "WriteData::{kind}({} bytes)", self.len())
    }
}

impl WriteData<'_> {
    pub fn len(&self) -> usize {
        match self {
            WriteData::Borrowed(b) => b.len(),
            WriteData::Owned(v) => v.len(),
            WriteData::Blocks(blocks) => blocks.iter().map(|b| b.len()).sum(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The payload's bytes at `range` (from its start); of a [`WriteData::Blocks`] payload,
    /// a range within one of its blocks (all the write path asks for: a block's part).
    pub fn slice(&self, range: std::ops::Range<usize>) -> &[u8] {
        match self {
            WriteData::Borrowed(b) => &b[range],
            WriteData::Owned(v) => &v[range],
            WriteData::Blocks(blocks) => {
                let (block, at) = Self::block_at(blocks, range.start);
                assert!(
                    at + range.len() <= blocks[block].len(),
                    "a received block's payload is sliced within one block"
                );
                &blocks[block][at..at + range.len()]
            }
        }
    }

    /// The payload's bytes at `range` as a whole block's buffer: the received one itself
    /// where `range` is exactly one of a [`WriteData::Blocks`] payload's, else a copy.
    pub fn block(&self, range: std::ops::Range<usize>) -> Arc<AlignedBuf> {
        if let WriteData::Blocks(blocks) = self {
            let (block, at) = Self::block_at(blocks, range.start);
            if at == 0 && blocks[block].len() == range.len() {
                return Arc::clone(&blocks[block]);
            }
        }
        Arc::new(AlignedBuf::copy_from(self.slice(range)))
    }

    /// A copy of the payload's bytes at `range`, which may span blocks (a log record's).
    pub fn to_vec(&self, range: std::ops::Range<usize>) -> Vec<u8> {
        let WriteData::Blocks(blocks) = self else { return self.slice(range).to_vec() };
        let mut out = Vec::with_capacity(range.len());
        let (mut block, mut at) = Self::block_at(blocks, range.start);
        while out.len() < range.len() {
            let n = (blocks[block].len() - at).min(range.len() - out.len());
            out.extend_from_slice(&blocks[block][at..at + n]);
            (block, at) = (block + 1, 0);
        }
        out
    }

    /// Which block of `blocks` holds the payload's byte `at`, and where in it. Every block of
    /// a received payload is the volume's block size ([`crate::Volume::write_blocks`]).
    fn block_at(blocks: &[Arc<AlignedBuf>], at: usize) -> (usize, usize) {
        let bs = blocks.first().map_or(1, |b| b.len()).max(1);
        let block = at / bs;
        assert!(
            block < blocks.len(),
            "byte {at} past a received payload of {} blocks",
            blocks.len()
        );
        (block, at % bs)
    }
}
