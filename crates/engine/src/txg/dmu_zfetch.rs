//! Predictive prefetch of sequential reads (ZFS: `dmu_zfetch.c`).
//!
//! A volume keeps up to `zfetch.max_streams` streams. A read that starts where a stream's reads
//! have reached, or inside what the stream fetched ahead (a client's queued reads may arrive a
//! little out of order), is a hit: the stream's distance doubles, up to `zfetch.max_distance`,
//! and the blocks up to that distance past the read are fetched ahead, in batches of at least
//! half the distance. A read that matches no stream starts one and fetches nothing ahead: one
//! read is no pattern. A stream unused for [`REAP_AFTER`] is dropped with whatever it fetched
//! that nobody read; a full set of streams takes no new one until then (ZFS does the same).
//!
//! What a batch does differs from ZFS, which prefetches block by block into the ARC and leaves
//! the merging to the vdev queue. A batch looks up its blocks' pointers, sorts them by where
//! they lie, and reads blocks that lie within `vdev.read_gap_limit` of each other in one I/O of
//! at most [`FETCH_SPAN_BYTES_MAX`], reading through the gaps. On a volume whose blocks random
//! writes have scattered, neighbouring blocks were written by different txgs, but the blocks of
//! one txg lie in block order: a window of many blocks then reads in far fewer I/Os than the
//! same blocks read a request at a time (a 1 MiB read of 16 KiB blocks took 44 I/Os on a
//! volume aged as bench/peers.sh ages it: docs/bench/peers-notes.md).
//!
//! A batch's I/Os go in the sync-read class, as the reads they run ahead of do. In the async
//! class (at most `vdev.async_read_max_active` in flight), where ZFS issues prefetches and
//! raises one to sync priority when a read waits for it, the reads waited behind their own
//! prefetch: 1 MiB reads at queue depth 8 on an aged volume ran at 0.85x-0.94x of their rate
//! with no prefetch, and at 1.23x-1.27x of it in the sync class (docs/bench/peers-notes.md,
//! 2026-11-30).
//!
//! The blocks fetched are held as they are stored (verified against their pointers, still
//! compressed and encrypted), outside the block cache, so `cache.contents=metadata` prefetches
//! too and no plaintext outlives a key's unload. A read takes a held block only if the pointer
//! it finds for the block is the one fetched: a block written since has another pointer (its
//! birth txg at least), so nothing stale is ever returned. A read that arrives while its
//! block's I/O is in flight waits for that I/O instead of issuing its own; if the fetch failed,
//! the read goes to the disk itself, which heals a bad copy.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use futures::future::{FutureExt, Shared};
use parking_lot::Mutex;
use sluice_format::BlockPointer;

use crate::device::AlignedBuf;
use crate::objset;
use crate::pool::{single_copy, Pool};
use crate::rt::{BoxFuture, Time};
use crate::stats::VolumeStats;
use crate::tunables::{IoClass, Tunable, Tunables};
use crate::vdev::{Vdev, VdevAddress};

/// A stream not read for this long is dropped, with the blocks it fetched that nobody read
/// (ZFS: `zfetch_max_sec_reap`).
const REAP_AFTER: Duration = Duration::from_secs(2);

/// How far from a stream's end, in reads of the size of the one that arrives, a read may start
/// and still continue it: a client's queued reads reach the volume a little out of order.
const REORDER_READS: u64 = 8;

/// The largest single I/O of a batch (the read path's own spans are as large).
const FETCH_SPAN_BYTES_MAX: u64 = super::dmu::READ_SPAN_BYTES_MAX;

/// The I/O that holds a fetched block's stored bytes: its span's buffer once read, or `None`
/// if the read failed (the reader then reads the block itself).
pub(super) type SpanRead = Shared<BoxFuture<Option<Arc<AlignedBuf>>>>;

/// A block fetched ahead: its pointer when fetched, and where its stored bytes lie.
#[derive(Clone)]
pub(super) struct Held {
    pub(super) bp: BlockPointer,
    pub(super) span: SpanRead,
    pub(super) at: usize,
    stream: u64,
}

/// The prefetch settings, from the pool's tunables.
#[derive(Clone, Copy, Debug)]
pub(super) struct ZfetchLimits {
    /// How far past a stream's reads it fetches at most, in bytes (0: no prefetch).
    pub(super) distance_max: u64,
    pub(super) streams_max: usize,
    /// Gaps a batch's I/O reads through (`vdev.read_gap_limit`).
    pub(super) gap_max: u64,
    /// Runs on disk shorter than this on average make a stream's read rewrite its blocks
    /// (`zfetch.rewrite_run_bytes`, dmu_rewrite.rs; 0: never).
    pub(super) rewrite_run_bytes: u64,
}

impl ZfetchLimits {
    pub(super) fn from_tunables(tunables: &Tunables) -> ZfetchLimits {
        ZfetchLimits {
            distance_max: tunables.get(Tunable::ZfetchMaxDistance),
            // At most 64 (the tunable's range).
            streams_max: usize::try_from(tunables.get(Tunable::ZfetchMaxStreams))
                .unwrap_or(usize::MAX),
            gap_max: tunables.get(Tunable::ReadGapLimit),
            rewrite_run_bytes: tunables.get(Tunable::ZfetchRewriteRunBytes),
        }
    }
}

#[derive(Debug)]
struct Stream {
    id: u64,
    /// The block after the furthest one its reads asked for.
    next: u64,
    /// Blocks before this one have been fetched ahead (or read).
    fetched_end: u64,
    /// How far past `next` it fetches, in blocks; 0 until its first hit.
    distance: u64,
    /// Its last read.
    used: Time,
    /// Batches issued; the newest one's task reaps the stream.
    batches: u64,
}

#[derive(Default)]
struct Streams {
    streams: Vec<Stream>,
    /// Blocks fetched ahead and not yet read, by block index.
    held: BTreeMap<u64, Held>,
    next_id: u64,
}

impl Streams {
    /// Forgets stream `id` and what it holds; returns how many held blocks went unread.
    fn remove(&mut self, id: u64) -> u64 {
        self.streams.retain(|s| s.id != id);
        if self.held.is_empty() {
            return 0;
        }
        let before = self.held.len();
        self.held.retain(|_, held| held.stream != id);
        (before - self.held.len()) as u64
    }
}

/// A read that continued stream `stream`, of `count` blocks.
#[derive(Clone, Copy, Debug)]
pub(super) struct Hit {
    stream: u64,
    count: u64,
}

/// A batch to fetch: blocks `blocks` for stream `stream`.
#[derive(Debug)]
pub(super) struct Batch {
    stream: u64,
    seq: u64,
    pub(super) blocks: Range<u64>,
}

/// One volume's prefetch: its streams and the blocks they hold.
pub(super) struct Zfetch {
    limits: ZfetchLimits,
    block_bytes: u64,
    inner: Mutex<Streams>,
    /// The volume's statistics, whose `prefetch` this counts in.
    volume_stats: Arc<VolumeStats>,
}

impl std::fmt::Debug for Zfetch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.inner.lock();
        f.debug_struct("Zfetch")
            .field("streams", &inner.streams)
            .field("held", &inner.held.len())
            .finish()
    }
}

impl Zfetch {
    pub(super) fn new(
        limits: ZfetchLimits,
        block_bytes: u32,
        volume_stats: Arc<VolumeStats>,
    ) -> Zfetch {
        Zfetch {
            limits,
            block_bytes: u64::from(block_bytes),
            inner: Mutex::new(Streams::default()),
            volume_stats,
        }
    }

    /// `zfetch.rewrite_run_bytes` (dmu_rewrite.rs).
    pub(super) fn rewrite_run_bytes(&self) -> u64 {
        self.limits.rewrite_run_bytes
    }

    fn stats(&self) -> &crate::stats::PrefetchStats {
        &self.volume_stats.prefetch
    }

    /// Notes a read of blocks `blocks` at `now`. Returns the stream it continued, if any: the
    /// read then asks [`Zfetch::batch`] what to fetch ahead once it knows it went to the disk.
    pub(super) fn access(&self, now: Time, blocks: Range<u64>) -> Option<Hit> {
        if self.limits.distance_max < self.block_bytes || blocks.is_empty() {
            return None;
        }
        let count = blocks.end - blocks.start;
        let mut inner = self.inner.lock();
        let mut unused = 0;
        while let Some(s) = inner.streams.iter().find(|s| now.since(s.used) >= REAP_AFTER) {
            let id = s.id;
            unused += inner.remove(id);
        }
        // A hit starts where a stream's reads reached, give or take [`REORDER_READS`] reads of
        // its size (queued reads reach the volume a little out of order); of the streams it
        // could continue, the one whose reads reached closest (a stream that ran into
        // another's blocks, as one that wrapped round a volume's end does, must not take the
        // other's reads). Random reads seldom land so near a stream's end.
        let window = count * REORDER_READS;
        let hit = (0..inner.streams.len())
            .filter(|&i| inner.streams[i].next.abs_diff(blocks.start) <= window)
            .min_by_key(|&i| inner.streams[i].next.abs_diff(blocks.start));
        let Some(at) = hit else {
            self.stats().misses.inc();
            // A full set of streams makes room only by dropping one that never had a hit:
            // random reads make such streams and must not push out the sequential ones.
            if inner.streams.len() >= self.limits.streams_max {
                let lone = (0..inner.streams.len())
                    .filter(|&i| inner.streams[i].distance == 0)
                    .min_by_key(|&i| inner.streams[i].used);
                if let Some(i) = lone {
                    let id = inner.streams[i].id;
                    unused += inner.remove(id);
                }
            }
            if inner.streams.len() < self.limits.streams_max {
                let id = inner.next_id;
                inner.next_id += 1;
                inner.streams.push(Stream {
                    id,
                    next: blocks.end,
                    fetched_end: blocks.end,
                    distance: 0,
                    used: now,
                    batches: 0,
                });
            }
            drop(inner);
            self.stats().blocks_unused.add(unused);
            return None;
        };
        self.stats().hits.inc();
        let inner = &mut *inner;
        let stream = &mut inner.streams[at];
        let distance_max = self.limits.distance_max / self.block_bytes;
        stream.used = now;
        stream.next = stream.next.max(blocks.end);
        stream.fetched_end = stream.fetched_end.max(stream.next);
        stream.distance = (stream.distance * 2).max(count * 2).min(distance_max);
        // Blocks held well behind the reads will not be read: a read skipped them.
        let behind = blocks.start.saturating_sub(stream.distance);
        let id = stream.id;
        let before = inner.held.len();
        let mut skipped = inner.held.range(..behind).filter(|(_, h)| h.stream == id);
        if skipped.next().is_some() {
            inner.held.retain(|&index, h| index >= behind || h.stream != id);
        }
        unused += (before - inner.held.len()) as u64;
        self.stats().blocks_unused.add(unused);
        Some(Hit { stream: id, count })
    }

    /// The batch to fetch ahead for a read that continued a stream and went to the disk (or
    /// to blocks fetched ahead): up to the stream's distance past its reads, once at least
    /// half the distance is to fetch. A read the cache or memory answered whole fetches
    /// nothing: the stream's blocks are likely there too, and looking up a distance's worth
    /// of pointers for nothing cost a quarter of the server's CPU on cached 1 MiB reads.
    pub(super) fn batch(&self, hit: Hit) -> Option<Batch> {
        let mut inner = self.inner.lock();
        let stream = inner.streams.iter_mut().find(|s| s.id == hit.stream)?;
        let target = stream.next + stream.distance;
        // At least half the distance, or the read's own size, but never more than the
        // distance (a `zfetch.max_distance` below the reads' size still fetches).
        let least = (stream.distance / 2).max(hit.count).min(stream.distance);
        let due = least > 0 && target.saturating_sub(stream.fetched_end) >= least;
        due.then(|| {
            let start = stream.fetched_end;
            stream.fetched_end = target;
            stream.batches += 1;
            Batch { stream: hit.stream, seq: stream.batches, blocks: start..target }
        })
    }

    /// Takes block `index` if it was fetched ahead under pointer `bp` (the block a read
    /// found); a block held under another pointer was written since and is dropped.
    pub(super) fn take(&self, index: u64, bp: &BlockPointer) -> Option<Held> {
        let mut inner = self.inner.lock();
        if inner.held.is_empty() {
            return None;
        }
        let held = inner.held.remove(&index)?;
        drop(inner);
        if held.bp == *bp {
            self.stats().blocks_used.inc();
            Some(held)
        } else {
            self.stats().blocks_unused.inc();
            None
        }
    }

    /// Holds a batch's blocks for the reads to come, unless its stream ended meanwhile.
    fn hold(&self, stream: u64, blocks: Vec<(u64, Held)>) {
        let mut inner = self.inner.lock();
        if !inner.streams.iter().any(|s| s.id == stream) {
            drop(inner);
            self.stats().blocks_unused.add(blocks.len() as u64);
            return;
        }
        let mut replaced = 0;
        for (index, held) in blocks {
            // Another stream's block for the same index (two readers of one range): the newer
            // fetch stands.
            replaced += u64::from(inner.held.insert(index, held).is_some());
        }
        drop(inner);
        self.stats().blocks_unused.add(replaced);
    }

    /// Drops stream `stream` if it has not been read for [`REAP_AFTER`] at `now`. Returns
    /// whether the caller (the task of the stream's batch `seq`) should look again later:
    /// only the newest batch's task does.
    fn reap(&self, stream: u64, seq: u64, now: Time) -> bool {
        let mut inner = self.inner.lock();
        let Some(s) = inner.streams.iter().find(|s| s.id == stream) else { return false };
        if s.batches != seq {
            return false;
        }
        if now.since(s.used) < REAP_AFTER {
            return true;
        }
        let unused = inner.remove(stream);
        drop(inner);
        self.stats().blocks_unused.add(unused);
        false
    }

    /// Blocks held now.
    #[cfg(test)]
    fn held_blocks(&self) -> usize {
        self.inner.lock().held.len()
    }
}

/// What a batch reads from a volume's tree: its root when the batch was planned, and the
/// blocks with a version in memory, which the reads will not take from the disk.
pub(super) struct BatchTree {
    pub(super) root: Option<BlockPointer>,
    pub(super) levels: u8,
    pub(super) in_memory: Vec<u64>,
}

/// How a prefetch reaches the pool: through a weak reference, upgraded only while it holds the
/// store's prefetch lock shared. An export takes that lock alone, so it waits for the
/// prefetches in flight, and one that starts later finds the pool gone; a prefetch never
/// makes an export fail for a pool still in use.
pub(super) struct PoolAccess {
    pool: std::sync::Weak<Pool>,
    env: crate::rt::Env,
    lock: Arc<async_lock::RwLock<()>>,
}

impl PoolAccess {
    pub(super) fn new(pool: &Arc<Pool>, lock: &Arc<async_lock::RwLock<()>>) -> PoolAccess {
        PoolAccess { pool: Arc::downgrade(pool), env: pool.env().clone(), lock: Arc::clone(lock) }
    }
}

/// Fetches `batch` ahead for `zfetch`'s volume and holds its blocks; then, if the stream is
/// still this batch's, drops it once no read has used it for [`REAP_AFTER`].
pub(super) async fn fetch(access: PoolAccess, zfetch: Arc<Zfetch>, batch: Batch, tree: BatchTree) {
    {
        let Some(_reached) = access.lock.try_read() else { return };
        let Some(pool) = access.pool.upgrade() else { return };
        fetch_batch(pool, &zfetch, &batch, tree).await;
    }
    loop {
        access.env.sleep(REAP_AFTER).await;
        if !zfetch.reap(batch.stream, batch.seq, access.env.now()) {
            break;
        }
    }
}

/// Reads `batch`'s blocks and holds them for the reads to come.
async fn fetch_batch(pool: Arc<Pool>, zfetch: &Zfetch, batch: &Batch, tree: BatchTree) {
    // An unreadable indirect block: the reads will meet it and say so.
    let Ok(pointers) =
        objset::data_block_pointers(&pool, tree.root, tree.levels, batch.blocks.clone()).await
    else {
        return;
    };
    let found: Vec<(u64, BlockPointer)> = pointers
        .into_iter()
        // A block with a version in memory or in the cache is read from there; one without
        // its key is not read.
        .filter(|(index, bp)| {
            tree.in_memory.binary_search(index).is_err()
                && pool.check_key(bp).is_ok()
                && !pool.cache().contains(bp)
        })
        .collect();
    // Gaps are read through only on a vdev that is one leaf. A mirror rewrites a child whose
    // copy failed from the one that verified, the whole I/O: a gap there holds bytes no
    // pointer vouches for (another block's, written since on a child that was away, or a
    // block a sync has just placed), which must not be copied over a good child.
    let gap_max = zfetch.limits.gap_max;
    let root = pool.root();
    let spans = plan(found, |vdev| match root.top_level().get(vdev as usize) {
        Some(Vdev::Leaf(_)) => gap_max,
        _ => 0,
    });
    drop(root);
    let mut held = Vec::new();
    let mut reads = Vec::with_capacity(spans.len());
    for span in spans {
        let read = read_span(Arc::clone(&pool), span.at, span.len, span.members.clone());
        let read: SpanRead = read.boxed().shared();
        for (index, bp, at) in span.members {
            held.push((index, Held { bp, span: read.clone(), at, stream: batch.stream }));
        }
        reads.push(read);
    }
    zfetch.stats().blocks_fetched.add(held.len() as u64);
    zfetch.stats().ios.add(reads.len() as u64);
    zfetch.hold(batch.stream, held);
    futures::future::join_all(reads).await;
}

/// One I/O of a batch: where it starts, how long it is, and its blocks with their offsets in
/// it. A block that is not one plain copy (RAID-Z, several copies) is an I/O of its own, read
/// through the pool's block read, which checks every copy it needs.
#[derive(Debug, PartialEq)]
struct PlannedSpan {
    at: Option<VdevAddress>,
    len: u64,
    members: Vec<(u64, BlockPointer, usize)>,
}

/// Groups blocks into I/Os: sorted by address, a block joins the I/O before it if it lies on
/// the same vdev at most `gap_of(vdev)` past that I/O's end and the I/O stays within
/// [`FETCH_SPAN_BYTES_MAX`].
fn plan(mut blocks: Vec<(u64, BlockPointer)>, gap_of: impl Fn(u32) -> u64) -> Vec<PlannedSpan> {
    let address = |bp: &BlockPointer| (bp.dvas[0].vdev, bp.dvas[0].offset_bytes());
    blocks.sort_by_key(|(index, bp)| (!single_copy(bp), address(bp), *index));
    let mut spans: Vec<PlannedSpan> = Vec::new();
    for (index, bp) in blocks {
        if !single_copy(&bp) {
            spans.push(PlannedSpan {
                at: None,
                len: bp.psize_bytes(),
                members: vec![(index, bp, 0)],
            });
            continue;
        }
        let (vdev, offset) = address(&bp);
        let end = offset + bp.psize_bytes();
        if let Some(PlannedSpan { at: Some(at), len, members }) = spans.last_mut() {
            let joins = at.vdev == vdev
                && offset <= at.offset_bytes + *len + gap_of(vdev)
                && end - at.offset_bytes <= FETCH_SPAN_BYTES_MAX;
            if joins {
                members.push((index, bp, (offset - at.offset_bytes) as usize));
                *len = (*len).max(end - at.offset_bytes);
                continue;
            }
        }
        let at = Some(VdevAddress { vdev, offset_bytes: offset });
        spans.push(PlannedSpan { at, len: bp.psize_bytes(), members: vec![(index, bp, 0)] });
    }
    spans
}

/// Reads one planned I/O and verifies each of its blocks against its pointer (a mirror tries
/// its other children when one fails); `None` if none verifies.
async fn read_span(
    pool: Arc<Pool>,
    at: Option<VdevAddress>,
    len: u64,
    members: Vec<(u64, BlockPointer, usize)>,
) -> Option<Arc<AlignedBuf>> {
    let Some(at) = at else {
        let (_, bp, _) = members.first()?;
        return pool.read_block(bp, IoClass::SyncRead).await.ok().map(Arc::new);
    };
    let verify = |bytes: &[u8]| {
        bytes.len() as u64 == len
            && members
                .iter()
                .all(|(_, bp, at)| bp.verifies(&bytes[*at..*at + bp.psize_bytes() as usize]))
    };
    let len = u32::try_from(len).ok()?;
    let root = pool.root();
    let read = match root.top_level().get(at.vdev as usize) {
        // One leaf: a bad block is not counted here; the reads count it, block by block, when
        // they read the blocks themselves.
        Some(leaf @ Vdev::Leaf(_)) => {
            leaf.read_counting(at.offset_bytes, len, IoClass::SyncRead, &verify, false).await
        }
        // A mirror's I/O holds only blocks back to back, all verified, so its repair of a
        // bad child is the read path's own (`Pool::read_span`).
        _ => root.read(at, len, IoClass::SyncRead, &verify).await,
    };
    read.ok().map(Arc::new)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> ZfetchLimits {
        ZfetchLimits {
            distance_max: 64 * 16384,
            streams_max: 2,
            gap_max: 32768,
            rewrite_run_bytes: 0,
        }
    }

    fn at(secs: u64) -> Time {
        Time::from_nanos(secs * 1_000_000_000)
    }

    /// A one-copy block of `sectors` 512-byte sectors at `offset_sectors` of `vdev`.
    fn bp(vdev: u32, offset_sectors: u64, sectors: u32, birth_txg: u64) -> BlockPointer {
        crate::pool::test_bp(vdev, offset_sectors, sectors, birth_txg)
    }

    /// A read that goes to the disk: the batch it fetches ahead, if any.
    fn read(z: &Zfetch, now: Time, blocks: Range<u64>) -> Option<Batch> {
        z.access(now, blocks).and_then(|hit| z.batch(hit))
    }

    #[test]
    fn a_second_read_in_sequence_fetches_ahead_and_the_distance_doubles() {
        let z = Zfetch::new(limits(), 16384, Arc::default());
        assert!(read(&z, at(0), 0..4).is_none(), "one read is no pattern");
        let first = read(&z, at(0), 4..8).expect("the second read in sequence fetches ahead");
        assert_eq!(first.blocks, 8..16, "twice the read past it");
        let mut end = 16;
        let mut distances = Vec::new();
        for start in (8..400).step_by(4) {
            if let Some(batch) = read(&z, at(0), start..start + 4) {
                assert_eq!(batch.blocks.start, end, "batches follow each other");
                distances.push(batch.blocks.end - start - 4);
                end = batch.blocks.end;
            }
        }
        assert_eq!(distances[..3], [16, 32, 64], "the distance doubles up to its maximum");
        assert!(distances.iter().all(|&d| d <= 64), "never past zfetch.max_distance");
        assert!(distances.len() >= 6, "a long stream keeps fetching: {distances:?}");
        assert!(end >= 400 + 32, "at least half the distance ahead at the end: {end}");
        assert_eq!((z.stats().misses.get(), z.stats().hits.get()), (1, 99));
    }

    #[test]
    fn reads_elsewhere_start_streams_up_to_the_maximum_and_idle_ones_are_reaped() {
        let z = Zfetch::new(limits(), 16384, Arc::default());
        let streams =
            |z: &Zfetch| z.inner.lock().streams.iter().map(|s| s.next).collect::<Vec<_>>();
        read(&z, at(0), 0..4);
        assert!(read(&z, at(0), 4..8).is_some(), "a sequential stream");
        read(&z, at(0), 1000..1004);
        assert_eq!(streams(&z), vec![8, 1004]);
        // Full (zfetch.max_streams = 2): a new read pushes out the lone read, not the stream.
        read(&z, at(0), 5000..5004);
        assert_eq!(streams(&z), vec![8, 5004]);
        assert!(read(&z, at(0), 5004..5008).is_some(), "the new stream continues");
        // Both have had hits now: a read elsewhere gets no stream until they are idle.
        read(&z, at(1), 1004..1008);
        assert_eq!(streams(&z), vec![8, 5008]);
        read(&z, at(3), 9000..9004);
        assert_eq!(streams(&z), vec![9004], "idle streams were reaped for a new one");
    }

    #[test]
    fn random_reads_seldom_continue_a_stream() {
        let z = Zfetch::new(limits(), 16384, Arc::default());
        let mut rng = crate::rt::Rng::new(7);
        let fetched: u64 = (0..10_000)
            .filter_map(|_| {
                let start = rng.below(65_536);
                read(&z, at(0), start..start + 1)
            })
            .map(|b| b.blocks.end - b.blocks.start)
            .sum();
        assert!(z.stats().hits.get() < 100, "{} hits", z.stats().hits.get());
        assert!(fetched < 500, "{fetched} blocks fetched ahead of random reads");
        // Reads a little out of order still continue their stream.
        let z = Zfetch::new(limits(), 16384, Arc::default());
        for start in [0, 4, 12, 8, 16, 24, 20] {
            read(&z, at(0), start..start + 4);
        }
        assert_eq!((z.stats().misses.get(), z.stats().hits.get()), (1, 6));
    }

    #[test]
    fn a_held_block_is_given_only_under_the_pointer_it_was_fetched_with() {
        let z = Zfetch::new(limits(), 16384, Arc::default());
        z.access(at(0), 0..4);
        let batch = read(&z, at(0), 4..8).unwrap();
        let span: SpanRead = futures::future::ready(None).boxed().shared();
        let held = |birth| Held {
            bp: bp(0, 100, 32, birth),
            span: span.clone(),
            at: 0,
            stream: batch.stream,
        };
        z.hold(batch.stream, vec![(8, held(5)), (9, held(5))]);
        assert!(z.take(8, &bp(0, 100, 32, 5)).is_some());
        assert!(z.take(8, &bp(0, 100, 32, 5)).is_none(), "taken once");
        assert!(z.take(9, &bp(0, 100, 32, 6)).is_none(), "written since: another birth");
        assert_eq!((z.stats().blocks_used.get(), z.stats().blocks_unused.get()), (1, 1));
        assert_eq!(z.held_blocks(), 0);
        // A stream reaped drops what it holds; its batch's task stops looking.
        z.hold(batch.stream, vec![(10, held(5))]);
        assert!(z.reap(batch.stream, batch.seq, at(1)), "still in use");
        assert!(!z.reap(batch.stream, batch.seq, at(2)));
        assert_eq!((z.held_blocks(), z.stats().blocks_unused.get()), (0, 2));
        z.hold(batch.stream, vec![(11, held(5))]);
        assert_eq!(z.held_blocks(), 0, "an ended stream holds nothing");
    }

    #[test]
    fn blocks_near_each_other_share_an_io_and_others_do_not() {
        // 16 KiB blocks (32 sectors): 0 and 1 back to back, 2 after a 16 KiB gap, 3 past the
        // gap limit, 4 on another vdev, 5 with two copies.
        let mut two = bp(0, 1000, 32, 1);
        two.dvas[1] = sluice_format::Dva { vdev: 0, asize_sectors: 32, offset_sectors: 5000 };
        let blocks = vec![
            (2, bp(0, 128, 32, 1)),
            (0, bp(0, 32, 32, 1)),
            (1, bp(0, 64, 32, 1)),
            (3, bp(0, 300, 32, 1)),
            (4, bp(1, 0, 32, 1)),
            (5, two),
        ];
        let spans = plan(blocks, |vdev| if vdev == 0 { 32768 } else { 0 });
        // Each I/O as (vdev and offset, length, (block, offset in the I/O) of its blocks).
        type Shape = (Option<(u32, u64)>, u64, Vec<(u64, usize)>);
        let shape: Vec<Shape> = spans
            .iter()
            .map(|s| {
                let at = s.at.map(|a| (a.vdev, a.offset_bytes));
                (at, s.len, s.members.iter().map(|(i, _, at)| (*i, *at)).collect())
            })
            .collect();
        assert_eq!(
            shape,
            vec![
                (Some((0, 16384)), 65536, vec![(0, 0), (1, 16384), (2, 49152)]),
                (Some((0, 153_600)), 16384, vec![(3, 0)]),
                (Some((1, 0)), 16384, vec![(4, 0)]),
                (None, 16384, vec![(5, 0)]),
            ]
        );
        // No I/O outgrows the largest span.
        let run: Vec<_> = (0..200).map(|i| (i, bp(0, i * 32, 32, 1))).collect();
        let spans = plan(run, |_| 32768);
        assert_eq!(spans.len(), 4);
        assert!(spans.iter().all(|s| s.len <= FETCH_SPAN_BYTES_MAX));
        // No gap is read where the vdev allows none (a mirror).
        let apart: Vec<_> = (0..4).map(|i| (i, bp(0, i * 64, 32, 1))).collect();
        let spans = plan(apart, |_| 0);
        assert_eq!(spans.len(), 4, "blocks 16 KiB apart are read one by one");
    }
}
