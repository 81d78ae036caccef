//! Volume block trees (ZFS: `dnode`/`dbuf`, the DMU's indirect blocks).
//!
//! A volume's data blocks hang under a tree of indirect blocks, each an array of
//! `INDIRECT_BPS` block pointers (16 KiB). With `levels` levels, data block `i` is reached from
//! the root through slot `(i / INDIRECT_BPS^(l-1)) % INDIRECT_BPS` of the indirect block at
//! each level `l`; with zero levels the root points at data block 0 itself. A hole at any level
//! means zeros below it.
//!
//! Updates are copy-on-write: [`update_tree`] rewrites every indirect block on the path to a
//! changed data block into new space and returns the new root, collecting the pointers it
//! replaced so the caller frees them in the syncing txg. An indirect block whose children all
//! became holes becomes a hole itself. The tree is rewritten a level at a time, bottom up:
//! the touched blocks of one level are read concurrently and written together.
//!
//! New blocks reach the disk in spans (crate::zio's issue stage): blocks allocated back to back
//! are written as one I/O of up to [`crate::zio::WRITE_SPAN_BYTES_MAX`] (ZFS gets the same
//! from write aggregation in the vdev queue). The allocator's next-fit cursor places consecutive
//! allocations next to each other, so a txg's blocks lie in runs even when the client wrote
//! at random offsets. The leaf queue also merges neighbours, but only those that wait in it
//! together: with free slots it issued each block alone, so a txg of 4 KiB random writes cost
//! a device command per block, each with its own I/O-thread trip (measured with 32 sync
//! writers: 124k device writes for 96k client writes). A span is only how blocks are written:
//! each keeps its own pointer and checksum, and reads, scrub and healing see ordinary blocks.

use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use sluice_format::{
    BlockCrypt, BlockKind, BlockPointer, FormatError, VolumeSpace, BLKPTR_BYTES, CHILDREN_MAC_BYTES,
};

use crate::alloc::{AllocClass, Allocator};
use crate::device::{AlignedBuf, UninitBuf};
use crate::pool::{Pool, PoolError};
use crate::tunables::IoClass;
use crate::zio::BlockProps;

/// Block pointers per indirect block.
pub const INDIRECT_BPS: u64 = 128;
pub const INDIRECT_BYTES: usize = INDIRECT_BPS as usize * BLKPTR_BYTES;
/// Indirect blocks of one level read and rebuilt concurrently.
const NODES_IN_FLIGHT: usize = 64;
/// Groups of new indirect blocks (each up to a span) being written at once.
const SPANS_IN_FLIGHT: usize = 8;

/// Levels of indirection needed to address `blocks` data blocks.
pub fn levels_for(blocks: u64) -> u8 {
    let mut levels = 0u8;
    let mut span = 1u64;
    while span < blocks {
        span = span.saturating_mul(INDIRECT_BPS);
        levels += 1;
    }
    levels
}

pub(crate) fn span_of(level: u8) -> u64 {
    INDIRECT_BPS.saturating_pow(u32::from(level))
}

fn format_error(pool: &Pool, source: FormatError) -> PoolError {
    PoolError::Format { pool: pool.name().to_owned(), cause: source }
}

/// An indirect block's slots: always [`INDIRECT_BPS`] of them (the sync rebuilds a block from
/// these, every slot written), so a block of another length is refused.
fn decode_indirect(pool: &Pool, bytes: &[u8]) -> Result<Vec<Option<BlockPointer>>, PoolError> {
    if bytes.len() != INDIRECT_BYTES {
        return Err(format_error(pool, indirect_length_error(bytes.len())));
    }
    bytes
        .chunks_exact(BLKPTR_BYTES)
        .map(|slot| BlockPointer::decode(slot).map_err(|e| format_error(pool, e)))
        .collect()
}

fn indirect_length_error(have: usize) -> FormatError {
    FormatError::Truncated { what: "indirect block", need: INDIRECT_BYTES, have }
}

/// The pointer of data block `index`, reading only indirect blocks; `None` is a hole.
pub async fn data_block_pointer(
    pool: &Pool,
    root: Option<BlockPointer>,
    levels: u8,
    index: u64,
) -> Result<Option<BlockPointer>, PoolError> {
    node_pointer(pool, root, levels, 0, index).await
}

/// The pointers of data blocks `blocks` that are not holes, in order: each level-1 indirect
/// block is read once for all of its blocks in the range, where [`data_block_pointer`] walks
/// the tree per block (a walk per block was the read path's and the prefetch's cost per
/// block on uncached 1 MiB reads).
pub async fn data_block_pointers(
    pool: &Pool,
    root: Option<BlockPointer>,
    levels: u8,
    blocks: std::ops::Range<u64>,
) -> Result<Vec<(u64, BlockPointer)>, PoolError> {
    // Blocks past what the tree addresses are holes.
    let end = blocks.end.min(span_of(levels));
    let mut out = Vec::with_capacity(end.saturating_sub(blocks.start) as usize);
    if levels == 0 {
        if let Some(bp) = root.filter(|_| blocks.contains(&0)) {
            out.push((0, bp));
        }
        return Ok(out);
    }
    let mut index = blocks.start;
    while index < end {
        let group = index / INDIRECT_BPS;
        let group_end = ((group + 1) * INDIRECT_BPS).min(end);
        if let Some(l1) = node_pointer(pool, root, levels, 1, group).await? {
            let bytes = pool.read_block_cached(&l1, IoClass::SyncRead).await?;
            for i in index..group_end {
                let at = (i % INDIRECT_BPS) as usize * BLKPTR_BYTES;
                let slot = BlockPointer::decode(&bytes[at..at + BLKPTR_BYTES])
                    .map_err(|e| format_error(pool, e))?;
                if let Some(bp) = slot {
                    out.push((i, bp));
                }
            }
        }
        index = group_end;
    }
    Ok(out)
}

/// The pointer of block `node` of `level` (level 0: data block `node`), reading the indirect
/// blocks above it; `None` is a hole.
async fn node_pointer(
    pool: &Pool,
    root: Option<BlockPointer>,
    levels: u8,
    level: u8,
    node: u64,
) -> Result<Option<BlockPointer>, PoolError> {
    assert!(level <= levels, "level {level} of a tree with {levels} levels");
    // Past what the tree addresses (a volume grown since its last sync, a prefetch past the
    // end): a hole. The slot arithmetic below would wrap round onto another node's pointer.
    if node >= span_of(levels - level) {
        return Ok(None);
    }
    let mut bp = root;
    for above in ((level + 1)..=levels).rev() {
        let Some(indirect) = bp else { return Ok(None) };
        let bytes = pool.read_block_cached(&indirect, IoClass::SyncRead).await?;
        let slot = ((node / span_of(above - 1 - level)) % INDIRECT_BPS) as usize;
        let at = slot * BLKPTR_BYTES;
        bp = BlockPointer::decode(&bytes[at..at + BLKPTR_BYTES])
            .map_err(|e| format_error(pool, e))?;
    }
    Ok(bp)
}

/// Reads data block `index`; `None` is a hole.
pub async fn read_data_block(
    pool: &Pool,
    root: Option<BlockPointer>,
    levels: u8,
    index: u64,
) -> Result<Option<std::sync::Arc<AlignedBuf>>, PoolError> {
    match data_block_pointer(pool, root, levels, index).await? {
        Some(data) => Ok(Some(pool.read_block_cached(&data, IoClass::SyncRead).await?)),
        None => Ok(None),
    }
}

/// Whether data block `index` is stored (not a hole), reading only indirect blocks.
pub async fn is_allocated(
    pool: &Pool,
    root: Option<BlockPointer>,
    levels: u8,
    index: u64,
) -> Result<bool, PoolError> {
    Ok(data_block_pointer(pool, root, levels, index).await?.is_some())
}

/// What a copy-on-write update needs besides the tree.
#[derive(Debug)]
pub struct TreeUpdate<'a> {
    pub pool: &'a Pool,
    pub allocator: &'a parking_lot::Mutex<Allocator>,
    pub txg: u64,
    /// Pointers replaced by the update, to be freed in `txg`.
    pub replaced: Vec<BlockPointer>,
    /// Indirect blocks the update wrote (the caller knows the data blocks it wrote): with
    /// `replaced`, what the volume's space figures gain and lose.
    pub born: Vec<BlockPointer>,
}

impl<'a> TreeUpdate<'a> {
    pub fn new(pool: &'a Pool, allocator: &'a parking_lot::Mutex<Allocator>, txg: u64) -> Self {
        TreeUpdate { pool, allocator, txg, replaced: Vec::new(), born: Vec::new() }
    }
}

/// What one block adds to its volume's space figures.
pub fn space_of(bp: &BlockPointer) -> VolumeSpace {
    let data = bp.kind == BlockKind::Data;
    VolumeSpace {
        referenced_bytes: bp.copies().map(|d| d.asize_bytes()).sum(),
        logical_bytes: if data { bp.lsize_bytes() } else { 0 },
        physical_bytes: if data { bp.psize_bytes() } else { 0 },
    }
}

/// A volume's space figures counted from its tree: for a volume of a pool written before
/// they were kept, counted once at import. An indirect block that cannot be read is counted
/// without what lies below it, rather than failing the import over figures: the figures come
/// out low, the reads of that range fail as they would anyway, and the audit names the gap.
/// Returns the figures and how many indirect blocks could not be read.
pub async fn count_space(
    pool: &Pool,
    root: Option<BlockPointer>,
    levels: u8,
) -> Result<(VolumeSpace, u64), PoolError> {
    let mut space = VolumeSpace::default();
    let mut unreadable = 0;
    let mut stack: Vec<(u8, BlockPointer)> = root.map(|bp| (levels, bp)).into_iter().collect();
    while let Some((level, bp)) = stack.pop() {
        add_space(&mut space, &bp, true);
        if level == 0 {
            continue;
        }
        let Ok(bytes) = pool.read_block_cached(&bp, IoClass::SyncRead).await else {
            unreadable += 1;
            continue;
        };
        stack.extend(decode_indirect(pool, &bytes)?.into_iter().flatten().map(|c| (level - 1, c)));
    }
    Ok((space, unreadable))
}

/// Adds (`gained`) or takes away `bp`'s share of `space`.
pub fn add_space(space: &mut VolumeSpace, bp: &BlockPointer, gained: bool) {
    let of = space_of(bp);
    let apply = |total: &mut u64, bytes: u64| {
        *total = if gained {
            total.saturating_add(bytes)
        } else {
            debug_assert!(*total >= bytes, "a volume loses space it had counted");
            total.saturating_sub(bytes)
        };
    };
    apply(&mut space.referenced_bytes, of.referenced_bytes);
    apply(&mut space.logical_bytes, of.logical_bytes);
    apply(&mut space.physical_bytes, of.physical_bytes);
}

/// Changes to a level of a tree: (block number in that level, its new pointer or `None` for
/// a hole), in block order, each block once.
pub type Updates = [(u64, Option<BlockPointer>)];

/// Applies `updates` (data blocks' changes) and returns the new root.
///
/// A sorted list rather than a map: a sync of a 1 GiB stream changes 65,536 blocks of 16 KiB,
/// and collecting their 184-byte entries into a `BTreeMap` copied each more than once; the
/// sync's copies were about 3% of the server's samples under 1 MiB writes
/// (docs/bench/peers-notes.md, 2026-12-07 18:33Z).
pub async fn update_tree(
    ctx: &mut TreeUpdate<'_>,
    root: Option<BlockPointer>,
    levels: u8,
    updates: &Updates,
) -> Result<Option<BlockPointer>, PoolError> {
    if updates.is_empty() {
        return Ok(root);
    }
    assert!(updates.is_sorted_by(|a, b| a.0 < b.0), "updates in block order, each block once");
    if levels == 0 {
        assert!(
            updates.len() == 1 && updates[0].0 == 0,
            "a tree without levels holds block 0 only"
        );
        // Replaced even when the new pointer is the same (a dedup block rewritten with its own
        // contents): the write took a reference, which the old pointer's free drops.
        if let Some(previous) = root {
            ctx.replaced.push(previous);
        }
        return Ok(updates[0].1);
    }
    // New pointers of the level below the one being rebuilt, by block number in that level:
    // at level 1 the caller's own list, which is not copied.
    let mut below: Vec<(u64, Option<BlockPointer>)> = Vec::new();
    for level in 1..=levels {
        let changes: &Updates = if level == 1 { updates } else { &below };
        let mut nodes: Vec<u64> = changes.iter().map(|&(child, _)| child / INDIRECT_BPS).collect();
        nodes.dedup();
        // A level's rebuilt nodes are born once each and replace at most their old selves and,
        // at level 1, the data blocks they pointed at: reserved at once, so that a sync of
        // thousands of blocks does not regrow (and copy) these lists of large pointers.
        ctx.born.reserve(nodes.len());
        ctx.replaced.reserve(nodes.len() + if level == 1 { changes.len() } else { 0 });
        let pool = ctx.pool;
        let rebuilt: Vec<Vec<Written>> = futures::stream::iter(
            nodes.into_iter().map(|node| rebuild_node(pool, root, levels, level, node, changes)),
        )
        .buffered(NODES_IN_FLIGHT)
        .try_chunks((crate::zio::WRITE_SPAN_BYTES_MAX as usize / INDIRECT_BYTES).max(1))
        .map_err(|futures::stream::TryChunksError(_, e)| e)
        .map_ok(|chunk| write_nodes(ctx_view(ctx), level, chunk))
        .try_buffer_unordered(SPANS_IN_FLIGHT)
        .try_collect()
        .await?;
        // Born and replaced in the order the spans' writes finished, as the frees and dead
        // lists have always had them; the next level's changes in block order.
        let mut above = Vec::with_capacity(rebuilt.iter().map(Vec::len).sum());
        for (node, bp, mut replaced) in rebuilt.into_iter().flatten() {
            above.push((node, bp));
            ctx.born.extend(bp);
            ctx.replaced.append(&mut replaced);
        }
        above.sort_unstable_by_key(|&(node, _)| node);
        below = above;
    }
    assert!(below.len() == 1 && below[0].0 == 0, "the top level is the root alone");
    Ok(below[0].1)
}

/// What writing needs of a [`TreeUpdate`], without its list of replaced pointers (which the
/// caller extends once the writes are done).
fn ctx_view<'a>(ctx: &TreeUpdate<'a>) -> TreeUpdate<'a> {
    TreeUpdate::new(ctx.pool, ctx.allocator, ctx.txg)
}

/// An indirect block of `level` with `changes` (the level below's new pointers) applied:
/// its new contents (`None`: every child is a hole), fill and hash of its children's MACs
/// (above encrypted blocks), and the pointers it replaces (its old self, and at level 1 the
/// data blocks it no longer points at).
type Rebuilt =
    (u64, Option<(AlignedBuf, u64, Option<[u8; CHILDREN_MAC_BYTES]>)>, Vec<BlockPointer>);
/// A rebuilt indirect block once written: its new pointer and the pointers it replaces.
type Written = (u64, Option<BlockPointer>, Vec<BlockPointer>);

async fn rebuild_node(
    pool: &Pool,
    root: Option<BlockPointer>,
    levels: u8,
    level: u8,
    node: u64,
    changes: &Updates,
) -> Result<Rebuilt, PoolError> {
    // A sync of thousands of blocks rebuilds hundreds of nodes, each found in the cache
    // (nothing to wait for): the serving core's connections get their turns between them.
    pool.env().pause().await;
    let old = node_pointer(pool, root, levels, level, node).await?;
    let old_bytes = match old {
        Some(bp) => Some(pool.read_block_cached(&bp, IoClass::SyncRead).await?),
        None => None,
    };
    let first = node * INDIRECT_BPS;
    let changed = {
        let from = changes.partition_point(|&(child, _)| child < first);
        let to = changes.partition_point(|&(child, _)| child < first + INDIRECT_BPS);
        &changes[from..to]
    };
    // Its old self, and at level 1 the data blocks the changed slots pointed at.
    let mut replaced: Vec<BlockPointer> = Vec::with_capacity(1 + changed.len());
    replaced.extend(old);
    let plain = old_bytes.as_ref().is_none_or(|bytes| !authenticated(bytes))
        && changed.iter().all(|(_, new)| new.is_none_or(|bp| bp.crypt == BlockCrypt::None));
    if plain {
        return patch_node(
            pool,
            level,
            node,
            old_bytes.as_deref().map(|b| &b[..]),
            changed,
            replaced,
        );
    }
    // Above encrypted blocks the parent hashes every child's MAC: decode them all.
    let mut slots = match &old_bytes {
        Some(bytes) => decode_indirect(pool, bytes)?,
        None => vec![None; INDIRECT_BPS as usize],
    };
    for &(child, new) in changed {
        let slot = &mut slots[(child - first) as usize];
        // Replaced indirect children pushed themselves; data blocks are replaced here, even
        // by the same pointer (a dedup block rewritten with its own contents took a
        // reference, which the old pointer's free drops).
        if level == 1 {
            replaced.extend(*slot);
        }
        *slot = new;
    }
    if slots.iter().all(Option::is_none) {
        return Ok((node, None, replaced));
    }
    // Every byte is one slot's encoding (an empty slot's is zeros), so the block is not
    // zeroed first.
    assert_eq!(slots.len(), INDIRECT_BPS as usize, "an indirect block has one slot per pointer");
    let mut bytes = UninitBuf::new(INDIRECT_BYTES);
    let mut fill = 0u64;
    for (index, slot) in slots.iter().enumerate() {
        bytes.write_at(index * BLKPTR_BYTES, &BlockPointer::encode(slot.as_ref()));
        fill += slot.map_or(0, |bp| bp.fill);
    }
    // SAFETY: the loop wrote all INDIRECT_BPS slots, which make up INDIRECT_BYTES.
    let bytes = unsafe { bytes.assume_init() };
    let mac = crate::zio::crypt::children_mac(&slots);
    Ok((node, Some((bytes, fill, mac)), replaced))
}

/// Whether any slot of an indirect block is part of an encrypted tree.
fn authenticated(bytes: &[u8]) -> bool {
    bytes
        .chunks_exact(BLKPTR_BYTES)
        .any(|slot| BlockPointer::encoded_is_authenticated(slot_array(slot)))
}

/// One slot of `chunks_exact(BLKPTR_BYTES)` as the array the format's readers take.
fn slot_array(slot: &[u8]) -> &[u8; BLKPTR_BYTES] {
    slot.try_into().expect("chunks_exact yields whole slots")
}

/// [`rebuild_node`] outside encrypted trees, where no slot needs its neighbours: the old
/// block's bytes copied and only the changed slots encoded. Decoding and encoding all 128
/// slots for each block changed under them (a random write changes one slot of its level-1
/// block and one of each block above) cost scattered small writes about a twentieth of the
/// server's CPU per write (`bench/ab.sh`, mixed writes and 4 KiB write + flush at 8 clients,
/// 2026-12-07). Decode and encode are exact inverses on every slot that decodes, so the bytes
/// are those the full rebuild would make; the fill is summed from each slot's encoded field.
fn patch_node(
    pool: &Pool,
    level: u8,
    node: u64,
    old: Option<&[u8]>,
    changed: &Updates,
    mut replaced: Vec<BlockPointer>,
) -> Result<Rebuilt, PoolError> {
    let first = node * INDIRECT_BPS;
    let mut bytes = match old {
        // Refused as `decode_indirect` refuses it: a block of another length has no slots.
        Some(old) if old.len() != INDIRECT_BYTES => {
            return Err(format_error(pool, indirect_length_error(old.len())));
        }
        Some(old) => AlignedBuf::copy_from(old),
        None => AlignedBuf::zeroed(INDIRECT_BYTES),
    };
    let mut emptied = false;
    for (child, new) in changed {
        let at = (child - first) as usize * BLKPTR_BYTES;
        let slot = &mut bytes[at..at + BLKPTR_BYTES];
        // As in the full rebuild: at level 1 the data block a slot pointed at is replaced.
        if level == 1 {
            replaced.extend(BlockPointer::decode(slot).map_err(|e| format_error(pool, e))?);
        }
        slot.copy_from_slice(&BlockPointer::encode(new.as_ref()));
        emptied |= new.is_none();
    }
    // A slot that is not a hole has some non-zero byte (its first DVA), so all zeros is an
    // indirect block whose every child is a hole: it becomes a hole itself.
    if emptied && bytes.iter().all(|&b| b == 0) {
        return Ok((node, None, replaced));
    }
    let fill = bytes
        .chunks_exact(BLKPTR_BYTES)
        .map(|slot| BlockPointer::encoded_fill(slot_array(slot)))
        .sum();
    Ok((node, Some((bytes, fill, None)), replaced))
}

/// The props of an indirect block of `level` over `fill` data blocks: above encrypted blocks
/// it carries `mac`, the hash of its children's MACs.
fn indirect_props(
    ctx: &TreeUpdate<'_>,
    level: u8,
    fill: u64,
    mac: Option<[u8; CHILDREN_MAC_BYTES]>,
) -> BlockProps {
    let lz4 = ctx.pool.config().lz4_indirect;
    let mut props = BlockProps::indirect(level, fill, ctx.txg, ctx.pool.metadata_copies(), lz4);
    if let Some(mac) = mac {
        props.crypt = crate::zio::PropsCrypt::ChildrenMac(mac);
    }
    props
}

/// Writes a chunk of rebuilt indirect blocks of `level`; returns each one's new pointer.
async fn write_nodes(
    ctx: TreeUpdate<'_>,
    level: u8,
    chunk: Vec<Rebuilt>,
) -> Result<Vec<Written>, PoolError> {
    let mut blocks = Vec::with_capacity(chunk.len());
    let mut nodes = Vec::with_capacity(chunk.len());
    for (node, contents, replaced) in chunk {
        nodes.push((node, contents.is_some(), replaced));
        if let Some((bytes, fill, mac)) = contents {
            blocks.push((indirect_props(&ctx, level, fill, mac), Arc::new(bytes)));
        }
    }
    let mut written =
        ctx.pool.write_blocks(ctx.allocator, AllocClass::Reserved, blocks, None).await?.into_iter();
    Ok(nodes
        .into_iter()
        .map(|(node, stored, replaced)| {
            let bp = stored.then(|| written.next().expect("one pointer per block written"));
            (node, bp, replaced)
        })
        .collect())
}

/// Every block of a tree, as (level, first data block index it covers, pointer), parents
/// before children. Used to free a destroyed volume and to find what a shrink cuts off.
pub async fn walk(
    pool: &Pool,
    root: Option<BlockPointer>,
    levels: u8,
) -> Result<Vec<(u8, u64, BlockPointer)>, PoolError> {
    let mut out = Vec::new();
    let mut stack: Vec<(u8, u64, BlockPointer)> =
        root.map(|bp| (levels, 0, bp)).into_iter().collect();
    while let Some((level, base, bp)) = stack.pop() {
        out.push((level, base, bp));
        if level == 0 {
            continue;
        }
        let bytes = pool.read_block_cached(&bp, IoClass::SyncRead).await?;
        for (slot, child) in decode_indirect(pool, &bytes)?.into_iter().enumerate() {
            if let Some(child) = child {
                stack.push((level - 1, base + slot as u64 * span_of(level - 1), child));
            }
        }
    }
    Ok(out)
}

/// Every block of a tree born after `txg` (ZFS: what `zfs rollback` frees), parents before
/// children. A subtree born at or before `txg` is skipped whole: copy-on-write gives a parent
/// a birth no older than any of its children, so the walk costs what changed since `txg`,
/// not the volume's size.
pub async fn walk_born_after(
    pool: &Pool,
    root: Option<BlockPointer>,
    levels: u8,
    txg: u64,
) -> Result<Vec<BlockPointer>, PoolError> {
    let mut out = Vec::new();
    let mut stack: Vec<(u8, BlockPointer)> = root.map(|bp| (levels, bp)).into_iter().collect();
    while let Some((level, bp)) = stack.pop() {
        if bp.birth_txg <= txg {
            continue;
        }
        out.push(bp);
        if level == 0 {
            continue;
        }
        let bytes = pool.read_block_cached(&bp, IoClass::SyncRead).await?;
        stack.extend(decode_indirect(pool, &bytes)?.into_iter().flatten().map(|c| (level - 1, c)));
    }
    Ok(out)
}

/// Adds levels above `root` until it has `to` levels: the old root becomes slot 0 of a new
/// indirect block. Returns the new root.
pub async fn grow_levels(
    ctx: &mut TreeUpdate<'_>,
    mut root: Option<BlockPointer>,
    from: u8,
    to: u8,
) -> Result<Option<BlockPointer>, PoolError> {
    for level in (from + 1)..=to {
        let Some(child) = root else { return Ok(None) };
        let mut bytes = AlignedBuf::zeroed(INDIRECT_BYTES);
        bytes[..BLKPTR_BYTES].copy_from_slice(&BlockPointer::encode(Some(&child)));
        let mut slots = vec![None; INDIRECT_BPS as usize];
        slots[0] = Some(child);
        let mac = crate::zio::crypt::children_mac(&slots);
        let props = indirect_props(ctx, level, child.fill, mac);
        let written = ctx.pool.write_blocks(
            ctx.allocator,
            AllocClass::Reserved,
            vec![(props, Arc::new(bytes))],
            None,
        );
        let level_bp = written.await?[0];
        ctx.born.push(level_bp);
        root = Some(level_bp);
    }
    Ok(root)
}
