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
//! became holes becomes a hole itself.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;

use sluice_format::{BlockKind, BlockPointer, FormatError, BLKPTR_BYTES};

use crate::alloc::{AllocClass, Allocator};
use crate::device::{AlignedBuf, SharedBuf};
use crate::pool::{Pool, PoolError};
use crate::tunables::IoClass;

/// Block pointers per indirect block.
pub const INDIRECT_BPS: u64 = 128;
pub const INDIRECT_BYTES: usize = INDIRECT_BPS as usize * BLKPTR_BYTES;

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

fn span_of(level: u8) -> u64 {
    INDIRECT_BPS.saturating_pow(u32::from(level))
}

fn format_error(pool: &Pool, source: FormatError) -> PoolError {
    PoolError::Format { pool: pool.name().to_owned(), source }
}

fn decode_indirect(pool: &Pool, bytes: &[u8]) -> Result<Vec<Option<BlockPointer>>, PoolError> {
    bytes
        .chunks_exact(BLKPTR_BYTES)
        .take(INDIRECT_BPS as usize)
        .map(|slot| BlockPointer::decode(slot).map_err(|e| format_error(pool, e)))
        .collect()
}

/// The pointer of data block `index`, reading only indirect blocks; `None` is a hole.
pub async fn data_block_pointer(
    pool: &Pool,
    root: Option<BlockPointer>,
    levels: u8,
    index: u64,
) -> Result<Option<BlockPointer>, PoolError> {
    let mut bp = root;
    for level in (1..=levels).rev() {
        let Some(indirect) = bp else { return Ok(None) };
        let bytes = pool.read_block_cached(&indirect, IoClass::SyncRead).await?;
        let slot = ((index / span_of(level - 1)) % INDIRECT_BPS) as usize;
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
}

type Boxed<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Applies `updates` (data block index -> new pointer, `None` for a hole) and returns the
/// new root.
pub fn update_tree<'a>(
    ctx: &'a mut TreeUpdate<'_>,
    root: Option<BlockPointer>,
    levels: u8,
    updates: &'a BTreeMap<u64, Option<BlockPointer>>,
) -> Boxed<'a, Result<Option<BlockPointer>, PoolError>> {
    update_node(ctx, root, levels, 0, updates)
}

fn update_node<'a>(
    ctx: &'a mut TreeUpdate<'_>,
    old: Option<BlockPointer>,
    level: u8,
    base: u64,
    updates: &'a BTreeMap<u64, Option<BlockPointer>>,
) -> Boxed<'a, Result<Option<BlockPointer>, PoolError>> {
    Box::pin(async move {
        if level == 0 {
            let Some(&new) = updates.get(&base) else { return Ok(old) };
            // Replaced even when the new pointer is the same (a dedup block rewritten with its
            // own contents): the write took a reference, which the old pointer's free drops.
            if let Some(previous) = old {
                ctx.replaced.push(previous);
            }
            return Ok(new);
        }
        let mut slots = match old {
            Some(bp) => {
                let bytes = ctx.pool.read_block_cached(&bp, IoClass::SyncRead).await?;
                decode_indirect(ctx.pool, &bytes)?
            }
            None => vec![None; INDIRECT_BPS as usize],
        };
        let child_span = span_of(level - 1);
        let end = base.saturating_add(span_of(level));
        let touched: Vec<u64> =
            updates.range(base..end).map(|(&i, _)| (i - base) / child_span).collect();
        let mut last = None;
        for slot in touched {
            if last == Some(slot) {
                continue;
            }
            last = Some(slot);
            let child_base = base + slot * child_span;
            let child_updates: BTreeMap<u64, Option<BlockPointer>> = updates
                .range(child_base..child_base.saturating_add(child_span))
                .map(|(&i, &b)| (i, b))
                .collect();
            let updated =
                update_node(ctx, slots[slot as usize], level - 1, child_base, &child_updates)
                    .await?;
            slots[slot as usize] = updated;
        }
        if let Some(previous) = old {
            ctx.replaced.push(previous);
        }
        if slots.iter().all(Option::is_none) {
            return Ok(None);
        }
        let mut bytes = AlignedBuf::zeroed(INDIRECT_BYTES);
        let mut fill = 0u64;
        for (index, slot) in slots.iter().enumerate() {
            bytes[index * BLKPTR_BYTES..(index + 1) * BLKPTR_BYTES]
                .copy_from_slice(&BlockPointer::encode(slot.as_ref()));
            fill += slot.map_or(0, |bp| bp.fill);
        }
        let bp = write_new_block(
            ctx,
            bytes,
            INDIRECT_BYTES as u64,
            BlockKind::Indirect,
            level,
            fill,
            AllocClass::Reserved,
        )
        .await?;
        Ok(Some(bp))
    })
}

/// Writes one data block into newly allocated space.
pub async fn write_data_block(
    ctx: &TreeUpdate<'_>,
    data: &[u8],
    class: AllocClass,
) -> Result<BlockPointer, PoolError> {
    let asize = ctx.allocator.lock().asize(data.len() as u64);
    let mut padded = AlignedBuf::zeroed(asize as usize);
    padded[..data.len()].copy_from_slice(data);
    write_new_block(ctx, padded, data.len() as u64, BlockKind::Data, 0, 1, class).await
}

/// Allocates space for `bytes` (already whole allocation units) and writes it there: the one
/// way new blocks of a tree reach the disk.
async fn write_new_block(
    ctx: &TreeUpdate<'_>,
    bytes: AlignedBuf,
    lsize_bytes: u64,
    kind: BlockKind,
    level: u8,
    fill: u64,
    class: AllocClass,
) -> Result<BlockPointer, PoolError> {
    let (vdev, offset, _) = ctx
        .allocator
        .lock()
        .allocate(bytes.len() as u64, class, &[])
        .map_err(|e| PoolError::NoSpace { pool: ctx.pool.name().to_owned(), source: e })?;
    let shared: SharedBuf = bytes.into_shared();
    ctx.pool.write_block_at(vdev, offset, shared, lsize_bytes, kind, level, fill, ctx.txg).await
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

/// Adds levels above `root` until it has `to` levels: the old root becomes slot 0 of a new
/// indirect block. Returns the new root.
pub async fn grow_levels(
    ctx: &TreeUpdate<'_>,
    mut root: Option<BlockPointer>,
    from: u8,
    to: u8,
) -> Result<Option<BlockPointer>, PoolError> {
    for level in (from + 1)..=to {
        let Some(child) = root else { return Ok(None) };
        let mut bytes = AlignedBuf::zeroed(INDIRECT_BYTES);
        bytes[..BLKPTR_BYTES].copy_from_slice(&BlockPointer::encode(Some(&child)));
        let level_bp = write_new_block(
            ctx,
            bytes,
            INDIRECT_BYTES as u64,
            BlockKind::Indirect,
            level,
            child.fill,
            AllocClass::Reserved,
        )
        .await?;
        root = Some(level_bp);
    }
    Ok(root)
}
