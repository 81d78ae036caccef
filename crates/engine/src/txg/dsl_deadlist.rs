//! Dead lists on disk (ZFS: `dsl_deadlist.c`, `bpobj.c`): appending what a sync replaced,
//! reading a list back, and keeping its bytes by birth range.
//!
//! Its functions take the pool ([`Spa`]) they read and write through, and nothing else of the
//! store: the sync (dsl_snapshot.rs) and a destroy pass the lists they hold.
//!
//! A list's pieces are metadata blocks of up to [`PIECE_ENTRIES_WRITTEN`] pointers (readers
//! take up to [`sluice_format::DEADLIST_PIECE_ENTRIES`], 128 KiB), written in as many copies
//! as the pool's other metadata. A piece is kept within 16 KiB, the block size admission
//! counts free space in, because a sync places it wherever a 16 KiB range is left: pieces of
//! up to 128 KiB, which sluice wrote first, needed ranges that a full, fragmented pool no
//! longer has, and a snapshot destroy's sync (which rewrites the next list whole) could fail
//! there. A sync appends by rewriting the list's
//! last piece, when it has room, with the new pointers after its own, so a list that grows a
//! little each txg keeps about one piece per thousand entries instead of one per txg. The
//! bytes are kept per birth range (sluice_format::Deadlist), so a snapshot's unique space is
//! read off the directory: `snapshot list` reads no pieces.

use sluice_format::{BlockPointer, Deadlist, DeadlistPiece, FormatError, BLKPTR_BYTES};

use super::spa::Spa;
use crate::device::AlignedBuf;
use crate::pool::PoolError;
use crate::tunables::IoClass;

/// Pointers in one piece this version writes: the piece, with its header, within
/// `METADATA_BLOCK_BYTES_MAX`.
pub(super) const PIECE_ENTRIES_WRITTEN: usize =
    crate::alloc::METADATA_BLOCK_BYTES_MAX as usize / BLKPTR_BYTES - 1;

/// Bytes (every copy) that writing `entries` pointers as new pieces allocates, at most.
pub(super) fn pieces_bytes(entries: u64, copies: u64) -> u64 {
    entries.div_ceil(PIECE_ENTRIES_WRITTEN as u64) * crate::alloc::METADATA_BLOCK_BYTES_MAX * copies
}

/// Allocated bytes of a block, every copy: what a dead list counts for it.
pub(super) fn dead_bytes(bp: &BlockPointer) -> u64 {
    bp.copies().map(|d| d.asize_bytes()).sum()
}

/// Adds `bp` to the birth range of `list` it falls in. `starts` are the ranges' starts for
/// the list's volume: 0 and the txg after each of its snapshots, ascending.
pub(super) fn count_entry(list: &mut Deadlist, starts: &[u64], bp: &BlockPointer) {
    debug_assert!(starts.first() == Some(&0), "ranges start at 0");
    let start = starts.iter().rev().copied().find(|&s| s <= bp.birth_txg).unwrap_or(0);
    let bytes = dead_bytes(bp);
    match list.buckets.binary_search_by_key(&start, |&(s, _)| s) {
        Ok(at) => list.buckets[at].1 += bytes,
        Err(at) => list.buckets.insert(at, (start, bytes)),
    }
}

/// Merges the birth range starting at `start` into the one starting at `below` (the range
/// before it once the snapshot that made `start` a boundary is gone).
pub(super) fn merge_range(list: &mut Deadlist, start: u64, below: u64) {
    let Ok(at) = list.buckets.binary_search_by_key(&start, |&(s, _)| s) else { return };
    let (_, bytes) = list.buckets.remove(at);
    match list.buckets.binary_search_by_key(&below, |&(s, _)| s) {
        Ok(at) => list.buckets[at].1 += bytes,
        Err(at) => list.buckets.insert(at, (below, bytes)),
    }
}

/// The bytes of `list` born in the range that starts at `start`.
pub(super) fn range_bytes(list: &Deadlist, start: u64) -> u64 {
    list.buckets.iter().find(|&&(s, _)| s == start).map_or(0, |&(_, bytes)| bytes)
}

fn deadlist_error(spa: &Spa, field: &'static str, value: u64) -> PoolError {
    PoolError::Format {
        pool: spa.pool().name().to_owned(),
        cause: FormatError::Invalid { what: "dead list", field, value },
    }
}

/// Reads one piece of a dead list.
async fn read_piece(spa: &Spa, bp: &BlockPointer) -> Result<DeadlistPiece, PoolError> {
    let bytes = spa.pool().read_block(bp, IoClass::AsyncRead).await?;
    DeadlistPiece::decode(&bytes)
        .map_err(|source| PoolError::Format { pool: spa.pool().name().to_owned(), cause: source })
}

/// Every pointer of `list`, in the order appended.
pub(super) async fn entries(spa: &Spa, list: &Deadlist) -> Result<Vec<BlockPointer>, PoolError> {
    let mut entries = Vec::with_capacity(usize::try_from(list.entries).unwrap_or(0));
    for piece in &list.pieces {
        entries.extend(read_piece(spa, piece).await?.entries);
    }
    if entries.len() as u64 != list.entries {
        return Err(deadlist_error(spa, "entries (pieces hold a different count)", list.entries));
    }
    Ok(entries)
}

/// Writes `entries` as new pieces in `txg`; returns the pieces' pointers.
pub(super) async fn write_pieces(
    spa: &Spa,
    txg: u64,
    entries: &[BlockPointer],
) -> Result<Vec<BlockPointer>, PoolError> {
    let unit = 1usize << spa.pool().ashift();
    let copies = spa.pool().metadata_copies();
    let mut pieces = Vec::with_capacity(entries.len().div_ceil(PIECE_ENTRIES_WRITTEN));
    for chunk in entries.chunks(PIECE_ENTRIES_WRITTEN) {
        let piece = DeadlistPiece { entries: chunk.to_vec() };
        let bytes = piece.encode(unit).map_err(|source| PoolError::Format {
            pool: spa.pool().name().to_owned(),
            cause: source,
        })?;
        debug_assert!(bytes.len() as u64 <= crate::alloc::METADATA_BLOCK_BYTES_MAX);
        let places = {
            let mut allocator = spa.allocator().lock();
            allocator.allocate_metadata(bytes.len() as u64, copies).map_err(|source| {
                PoolError::NoSpace { pool: spa.pool().name().to_owned(), cause: source }
            })?
        };
        let logical = std::sync::Arc::new(AlignedBuf::copy_from(&bytes));
        let writer = crate::zio::Writer::Deadlist;
        pieces.push(spa.write_metadata(writer, &places, logical, txg).await?);
    }
    Ok(pieces)
}

/// Appends `new` to `list` in `txg`, counting each in its birth range (`starts`). The
/// last piece, when it has room, is rewritten with the new pointers after its own; the
/// piece it replaces goes into `freed`.
pub(super) async fn append(
    spa: &Spa,
    txg: u64,
    list: &mut Deadlist,
    starts: &[u64],
    new: Vec<BlockPointer>,
    freed: &mut Vec<BlockPointer>,
) -> Result<(), PoolError> {
    if new.is_empty() {
        return Ok(());
    }
    for bp in &new {
        count_entry(list, starts, bp);
    }
    list.entries += new.len() as u64;
    let mut write = new;
    if let Some(last) = list.pieces.last().copied() {
        let piece = read_piece(spa, &last).await?;
        if piece.entries.len() < PIECE_ENTRIES_WRITTEN {
            list.pieces.pop();
            freed.push(last);
            let mut merged = piece.entries;
            merged.append(&mut write);
            write = merged;
        }
    }
    let pieces = write_pieces(spa, txg, &write).await?;
    list.pieces.extend(pieces);
    Ok(())
}
