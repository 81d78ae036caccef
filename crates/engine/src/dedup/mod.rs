//! The dedup table (ZFS: `ddt.c`, and the dedup stages of `zio_ddt_write` in `zio.c`; seed 001).
//!
//! A data block of a volume with `dedup=on` is keyed by the keyed BLAKE3 of its contents (the
//! key is the pool's salt, so nobody outside the pool can build two blocks with one key). The
//! table maps each key to the one stored copy and the number of block pointers sharing it. A
//! txg sync writes the dirty data blocks of dedup volumes through [`Ddt::write`], in stages:
//!
//! 1. *lookup* (table lock): find the key's entry or insert an empty one;
//! 2. *load* (no table lock): an entry new to memory reads its bucket from disk, once, however
//!    many writers wait for it;
//! 3. *claim* (table lock): take a reference. The entry has a stored copy: share it, nothing is
//!    written. A write of the same block is in flight: share the copy it is writing. Neither:
//!    this writer becomes the entry's lead and writes the block;
//! 4. *ready*, once the lead's space is allocated: record the copy in the entry and hand it to
//!    the writers waiting on the lead;
//! 5. *done*, once the lead's write completed: the entry has no write in flight; on an error the
//!    entry returns to what it was and the references taken optimistically are dropped.
//!
//! `dedup.locking` says what guards the entry's I/O fields (stored copy, lead, waiters) in
//! stages 4 and 5. `entry` (default, seed 001's after, ZFS's `dde_io_lock`): the entry's own
//! lock, so the table-wide lock is taken twice per written block, both times by the writer
//! before its I/O. `global` (the before): the table-wide lock, four times per written block.
//! Rust makes the fields live behind the entry's mutex in both modes; in `global` every access
//! happens with the table lock held, so that mutex is never contended, and the table lock is
//! what writers queue on, as before the change. Every table-lock acquisition is counted by
//! stage, with the time spent waiting for it, so the difference is measured, not inferred.
//!
//! Freeing a dedup block pointer drops a reference (lookup and claim again). Nothing is freed
//! then: [`Ddt::flush`], at the end of the sync, writes every entry that changed into its
//! bucket, removes the entries left without references and returns their blocks to be freed
//! in the txg. A block freed and shared again within one txg so never loses its space.
//!
//! On disk the table is a set of buckets (sluice_format's `DdtBucket`) under a block tree, the
//! bucket of a key being its top `bucket_bits` bits; when the table outgrows its buckets, the
//! flush doubles them, rewriting the table once. In memory, entries touched since the last
//! flush stay (they are dirty); beyond `dedup.table_mem_max` clean ones are dropped after each
//! flush and read back from their bucket when needed again (ZFS keeps its DDT in ZAP objects
//! and the ARC; a bucket per lookup is the same idea with fewer moving parts).
//!
//! Lock order: table lock -> an entry's lock -> allocator. None is held across an `.await`.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Instant;

use futures::{StreamExt, TryStreamExt};
use parking_lot::{Mutex, MutexGuard};
use sluice_format::{
    BlockPointer, Compression, DdtBucket, DdtEntry, DdtHeader, DdtKey, FormatError,
    DDT_BUCKET_BITS_MAX, DDT_ENTRY_BYTES, DDT_KEY_BYTES,
};

use crate::alloc::{AllocClass, Allocator};
use crate::device::AlignedBuf;
use crate::objset::{self, TreeUpdate};
use crate::pool::{Pool, PoolError};
use crate::stats::Counter;
use crate::tunables::{IoClass, Tunable, Tunables};
use crate::zio::{self, BlockProps, Issue, Writer};

/// What guards an entry's I/O fields while its block is written (`dedup.locking`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Locking {
    /// A per-entry lock (seed 001's after): two table-lock acquisitions per written block.
    Entry,
    /// The table-wide lock (seed 001's before): four per written block.
    Global,
}

impl Locking {
    pub fn from_tunables(tunables: &Tunables) -> Locking {
        match tunables.choice(Tunable::DedupLocking) {
            "global" => Locking::Global,
            _ => Locking::Entry,
        }
    }
}

/// Where the table-wide lock was taken, for the acquisition counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// A write finds or inserts its entry.
    Lookup = 0,
    /// A write takes its reference and decides: share, wait for the lead, or lead.
    Claim = 1,
    /// `global` only: the lead's copy is recorded and handed to the waiters.
    Ready = 2,
    /// `global` only: the lead's write completed.
    Done = 3,
    /// A failed lead drops the references its waiters took (rare; `entry` mode too).
    Rollback = 4,
    /// `dedup=verify` re-enters after comparing the bytes.
    Verify = 5,
    /// A free finds its entry and drops a reference (two acquisitions).
    Free = 6,
    /// The sync writes the dirty entries out.
    Flush = 7,
}

const STAGES: usize = 8;
const STAGE_NAMES: [&str; STAGES] =
    ["lookup", "claim", "ready", "done", "rollback", "verify", "free", "flush"];

/// What the table did since the pool was opened.
#[derive(Debug, Default)]
pub struct DdtStats {
    /// Table-lock acquisitions, by [`Stage`].
    pub table_lock: [Counter; STAGES],
    /// Acquisitions that found the table lock held, and the time they waited in total.
    pub table_lock_contended: Counter,
    pub table_lock_wait_nanos: Counter,
    /// Per-entry lock acquisitions.
    pub entry_lock: Counter,
    /// Blocks written as new copies (lead writes).
    pub blocks_written: Counter,
    /// Blocks that shared a stored copy, and those that shared a copy still being written.
    pub blocks_shared: Counter,
    pub blocks_piggybacked: Counter,
    /// `dedup=verify` comparisons, and those that found different bytes under one key (the
    /// block was then written on its own).
    pub verify_compares: Counter,
    pub verify_mismatches: Counter,
    /// Buckets read to load entries.
    pub bucket_reads: Counter,
    /// References dropped by frees, and blocks freed at zero references.
    pub references_dropped: Counter,
    pub blocks_freed: Counter,
}

impl DdtStats {
    /// Table-lock acquisitions of the write stages (what seed 001 counts per written block).
    pub fn write_acquisitions(&self) -> u64 {
        [Stage::Lookup, Stage::Claim, Stage::Ready, Stage::Done, Stage::Rollback, Stage::Verify]
            .iter()
            .map(|&s| self.table_lock[s as usize].get())
            .sum()
    }

    /// Every table-lock acquisition, by stage name.
    pub fn by_stage(&self) -> Vec<(&'static str, u64)> {
        STAGE_NAMES.iter().zip(&self.table_lock).map(|(&name, c)| (name, c.get())).collect()
    }
}

/// A summary for `pool status`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DdtSummary {
    /// Entries in the table (stored blocks that are shared or shareable).
    pub entries: u64,
    /// Block pointers counted by the entries.
    pub references: u64,
    /// Bytes allocated by the entries' blocks, and bytes they would take without sharing.
    pub allocated_bytes: u64,
    pub referenced_bytes: u64,
    pub bucket_bits: u8,
    /// Entries held in memory now.
    pub in_memory: u64,
}

impl DdtSummary {
    /// Referenced over stored (ZFS's `dedupratio`); 1.0 for an empty table.
    pub fn ratio(&self) -> f64 {
        if self.allocated_bytes == 0 {
            1.0
        } else {
            self.referenced_bytes as f64 / self.allocated_bytes as f64
        }
    }

    /// Bytes the table's entries take encoded on disk.
    pub fn table_bytes(&self) -> u64 {
        self.entries * DDT_ENTRY_BYTES as u64
    }
}

/// Average entries per bucket that makes the flush double the buckets (a 16 KiB block holds
/// 97 entries; doubling at 96 leaves 48).
const BUCKET_ENTRIES_GROW: u64 = 96;
/// Buckets a flush reads and writes at once.
const FLUSH_IN_FLIGHT: usize = 64;
/// Memory one cached entry costs, roughly: the entry, its map slot, its lock.
const ENTRY_MEMORY_BYTES: u64 = 320;

/// The table-wide lock (ZFS: `ddt_lock`), counting acquisitions by stage.
#[derive(Debug)]
struct TableLock {
    inner: Mutex<Table>,
}

impl TableLock {
    fn lock<'a>(&'a self, stage: Stage, stats: &DdtStats) -> MutexGuard<'a, Table> {
        stats.table_lock[stage as usize].inc();
        if let Some(guard) = self.inner.try_lock() {
            return guard;
        }
        // Real time even under the simulator: this is a statistic, it steers nothing.
        let start = Instant::now();
        let guard = self.inner.lock();
        stats.table_lock_contended.inc();
        stats.table_lock_wait_nanos.add(start.elapsed().as_nanos() as u64);
        guard
    }
}

#[derive(Debug)]
struct Table {
    /// Entries in memory: dirty ones (changed since the last flush) and cached clean ones.
    entries: HashMap<DdtKey, Arc<Entry>>,
    dirty: Vec<DdtKey>,
    /// The table as of the last flush (what loads read).
    disk: DdtHeader,
}

/// One entry in memory (ZFS: `ddt_entry_t`).
#[derive(Debug)]
struct Entry {
    key: DdtKey,
    /// The entry as its bucket had it when first needed since the last flush; loaded once.
    loaded: async_lock::OnceCell<Option<DdtEntry>>,
    /// ZFS: `dde_io_lock` and the fields it guards.
    io: Mutex<EntryIo>,
}

#[derive(Debug, Default)]
struct EntryIo {
    /// `loaded` has been copied in.
    initialized: bool,
    /// In `dirty` already.
    dirty: bool,
    refcount: u64,
    /// The stored copy, if any (ZFS: `dde_phys`).
    phys: Option<BlockPointer>,
    /// What the entry was before the lead write began, to return to if it fails.
    orig_phys: Option<BlockPointer>,
    /// The write of this block in flight, if any (ZFS: `dde_lead_zio`).
    lead: Option<Lead>,
    /// Refcount in the bucket on disk (0: not there), for the header's totals.
    synced_refcount: u64,
}

#[derive(Debug)]
struct Lead {
    /// Writers sharing the copy being written; each took a reference.
    waiters: Vec<futures::channel::oneshot::Sender<BlockPointer>>,
    /// The bytes being written, for `dedup=verify` comparisons.
    data: Arc<AlignedBuf>,
}

/// What a claim decided.
enum Claim {
    Share(BlockPointer),
    Wait(futures::channel::oneshot::Receiver<BlockPointer>),
    Lead,
    /// `dedup=verify`: compare with these bytes (`Ok`) or this stored copy (`Err`) first.
    Compare(Result<Arc<AlignedBuf>, BlockPointer>),
}

/// The dedup table of one pool.
#[derive(Debug)]
pub struct Ddt {
    pool_name: String,
    /// The pool's key for the keyed hash; fixed at creation, so read without the table lock.
    salt: [u8; 32],
    locking: Locking,
    table: TableLock,
    stats: DdtStats,
    /// Clean entries kept in memory after a flush.
    cached_entries_max: u64,
    /// Bits of each key that are kept (256 normally). Tests lower it to force collisions.
    key_bits: AtomicU32,
}

impl Ddt {
    /// The table as the directory records it.
    pub fn new(pool_name: &str, header: DdtHeader, tunables: &Tunables) -> Ddt {
        Ddt {
            pool_name: pool_name.to_owned(),
            salt: header.salt,
            locking: Locking::from_tunables(tunables),
            table: TableLock {
                inner: Mutex::new(Table {
                    entries: HashMap::new(),
                    dirty: Vec::new(),
                    disk: header,
                }),
            },
            stats: DdtStats::default(),
            cached_entries_max: tunables.get(Tunable::DedupTableMemMax) / ENTRY_MEMORY_BYTES,
            key_bits: AtomicU32::new(DDT_KEY_BYTES as u32 * 8),
        }
    }

    pub fn locking(&self) -> Locking {
        self.locking
    }

    pub fn stats(&self) -> &DdtStats {
        &self.stats
    }

    pub fn summary(&self) -> DdtSummary {
        let table = self.table.inner.lock();
        let disk = &table.disk;
        let per_block = disk.allocated_bytes.checked_div(disk.entries).unwrap_or(0);
        DdtSummary {
            entries: disk.entries,
            references: disk.references,
            allocated_bytes: disk.allocated_bytes,
            referenced_bytes: disk.references * per_block,
            bucket_bits: disk.bucket_bits,
            in_memory: table.entries.len() as u64,
        }
    }

    /// Keeps only the first `bits` bits of every key, so different blocks collide: how tests
    /// show that `dedup=verify` never shares different data. Never set outside tests.
    #[doc(hidden)]
    pub fn truncate_keys_for_tests(&self, bits: u32) {
        self.key_bits.store(bits.min(DDT_KEY_BYTES as u32 * 8), Ordering::Relaxed);
    }

    /// The key of a block's contents.
    pub fn key(&self, salt: &[u8; 32], data: &[u8]) -> DdtKey {
        let mut key = *blake3::keyed_hash(salt, data).as_bytes();
        let bits = self.key_bits.load(Ordering::Relaxed) as usize;
        for (i, byte) in key.iter_mut().enumerate() {
            let kept = bits.saturating_sub(i * 8).min(8);
            *byte &= !(0xffu16 >> kept) as u8;
        }
        DdtKey(key)
    }

    fn corrupt(&self, field: &'static str, value: u64) -> PoolError {
        PoolError::Format {
            pool: self.pool_name.clone(),
            cause: FormatError::Invalid { what: "dedup table", field, value },
        }
    }

    /// Stage 1 (table lock): the key's entry, inserted if new to memory, and the table's
    /// disk state to load it from.
    fn lookup(&self, key: DdtKey, stage: Stage) -> (Arc<Entry>, DdtHeader) {
        let mut table = self.table.lock(stage, &self.stats);
        let entry = table
            .entries
            .entry(key)
            .or_insert_with(|| {
                Arc::new(Entry {
                    key,
                    loaded: async_lock::OnceCell::new(),
                    io: Mutex::new(EntryIo::default()),
                })
            })
            .clone();
        (entry, table.disk)
    }

    /// Stage 2 (no table lock): what the bucket on disk holds for the entry. Concurrent
    /// callers for one entry share one read.
    async fn load(&self, pool: &Pool, entry: &Entry, disk: &DdtHeader) -> Result<(), PoolError> {
        entry
            .loaded
            .get_or_try_init(|| async {
                let index = entry.key.bucket(disk.bucket_bits);
                let Some(bytes) =
                    objset::read_data_block(pool, disk.root, disk.levels, index).await?
                else {
                    return Ok(None);
                };
                self.stats.bucket_reads.inc();
                DdtBucket::find(&bytes, &entry.key).map_err(|source| PoolError::Format {
                    pool: self.pool_name.clone(),
                    cause: source,
                })
            })
            .await?;
        Ok(())
    }

    async fn read_bucket(
        &self,
        pool: &Pool,
        disk: &DdtHeader,
        index: u64,
    ) -> Result<Option<DdtBucket>, PoolError> {
        let Some(bytes) = objset::read_data_block(pool, disk.root, disk.levels, index).await?
        else {
            return Ok(None);
        };
        self.stats.bucket_reads.inc();
        let bucket = DdtBucket::decode(&bytes)
            .map_err(|source| PoolError::Format { pool: self.pool_name.clone(), cause: source })?;
        if bucket.index != index || bucket.bucket_bits != disk.bucket_bits {
            return Err(self.corrupt("bucket index", bucket.index));
        }
        Ok(Some(bucket))
    }

    /// Copies the loaded state in, the first time the entry's I/O fields are used. Called
    /// with the entry's lock held.
    fn initialize(entry: &Entry, io: &mut EntryIo) {
        if io.initialized {
            return;
        }
        io.initialized = true;
        if let Some(Some(on_disk)) = entry.loaded.get() {
            io.refcount = on_disk.refcount;
            io.synced_refcount = on_disk.refcount;
            io.phys = Some(on_disk.bp);
        }
    }

    fn mark_dirty(table: &mut Table, entry: &Entry, io: &mut EntryIo) {
        if !io.dirty {
            io.dirty = true;
            table.dirty.push(entry.key);
        }
    }

    /// The entry's I/O fields in stages 4 and 5: under the table lock in `global` mode (the
    /// returned guard holds it), under the entry's own lock alone in `entry` mode.
    fn io_stage<'a>(
        &'a self,
        entry: &'a Entry,
        stage: Stage,
    ) -> (Option<MutexGuard<'a, Table>>, MutexGuard<'a, EntryIo>) {
        let table = match self.locking {
            Locking::Global => Some(self.table.lock(stage, &self.stats)),
            Locking::Entry => None,
        };
        self.stats.entry_lock.inc();
        (table, entry.io.lock())
    }

    /// Writes one data block of a dedup volume in `txg` and returns its pointer: a shared one
    /// when the table has (or is writing) the same block, else a new copy that the table
    /// now counts. With `verify`, the bytes are compared first, and a block whose key matches
    /// different bytes is written on its own, outside the table. A new copy is stored
    /// compressed as `compression` asks; the key is of the logical bytes, so volumes that
    /// compress differently still share blocks.
    ///
    /// A block of key family `family` (an encrypted volume; 0: none) is sealed first, with the
    /// salt and nonce of a keyed MAC of its bytes under the family's key (as ZFS does), so the
    /// same data in the same family seals to the same bytes; its key is then its checksum and
    /// tag (`BlockPointer::encrypted_dedup_key`), which a keyless free finds again and which
    /// says nothing of the data. Blocks of other families, or not encrypted, never match it:
    /// their bytes, and so their keys, differ.
    #[allow(clippy::too_many_arguments)]
    pub async fn write(
        &self,
        pool: &Pool,
        allocator: &Mutex<Allocator>,
        txg: u64,
        data: Arc<AlignedBuf>,
        verify: bool,
        compression: Compression,
        family: u64,
    ) -> Result<BlockPointer, PoolError> {
        pool.zio_stage(zio::Stage::Dedup, Writer::DedupData)?;
        let mut sealed = None;
        let key = if family == 0 {
            self.key(&self.salt, &data)
        } else {
            let props = BlockProps {
                crypt: zio::PropsCrypt::Encrypt { family, convergent: true },
                ..BlockProps::data(Writer::DedupData, txg, compression)
            };
            let block = pool.seal_block(props, Arc::clone(&data), None)?;
            let mac = block.sealing.expect("an encrypted block is sealed").mac;
            let key = BlockPointer::encrypted_dedup_key(&block.checksum, &mac);
            sealed = Some(block);
            key
        };
        let (entry, disk) = self.lookup(key, Stage::Lookup);
        self.load(pool, &entry, &disk).await?;
        let mut stage = Stage::Claim;
        let mut compared = false;
        let claim = loop {
            let claim = {
                let mut table = self.table.lock(stage, &self.stats);
                self.stats.entry_lock.inc();
                let mut io = entry.io.lock();
                Self::initialize(&entry, &mut io);
                let existing = match (&io.lead, io.phys) {
                    (Some(lead), _) => Some(Ok(Arc::clone(&lead.data))),
                    (None, Some(phys)) => Some(Err(phys)),
                    (None, None) => None,
                };
                match existing {
                    Some(existing) if verify && !compared => Claim::Compare(existing),
                    _ => {
                        io.refcount += 1;
                        Self::mark_dirty(&mut table, &entry, &mut io);
                        // A copy is known once the lead is ready, before its write is done:
                        // share it then (the sync waits for that write anyway).
                        if let Some(phys) = io.phys {
                            if io.lead.is_some() {
                                self.stats.blocks_piggybacked.inc();
                            }
                            Claim::Share(phys)
                        } else if let Some(lead) = io.lead.as_mut() {
                            let (tx, rx) = futures::channel::oneshot::channel();
                            lead.waiters.push(tx);
                            Claim::Wait(rx)
                        } else {
                            io.orig_phys = io.phys;
                            io.lead = Some(Lead { waiters: Vec::new(), data: Arc::clone(&data) });
                            Claim::Lead
                        }
                    }
                }
            };
            let Claim::Compare(existing) = claim else { break claim };
            self.stats.verify_compares.inc();
            let same = match existing {
                Ok(bytes) => bytes == data,
                Err(phys) => {
                    let stored = pool.read_block_cached(&phys, IoClass::SyncRead).await?;
                    stored.get(..data.len()) == Some(&data[..])
                }
            };
            if !same {
                self.stats.verify_mismatches.inc();
                return write_plain(pool, allocator, txg, data, compression, family).await;
            }
            compared = true;
            stage = Stage::Verify;
        };
        // A shared copy's pointer is born now, where it is written (ZFS: the logical birth,
        // against the copy's physical one): snapshots tell by birth which pointers they
        // hold, and this place held something else until now. Its copies' places and
        // checksum are the table's; the scan reaches them through the table, by its birth.
        let born_now = |phys: BlockPointer| BlockPointer { birth_txg: txg, ..phys };
        match claim {
            Claim::Share(phys) => {
                self.stats.blocks_shared.inc();
                Ok(born_now(phys))
            }
            Claim::Wait(rx) => {
                self.stats.blocks_shared.inc();
                self.stats.blocks_piggybacked.inc();
                // The lead answers at its ready stage, or drops the sender when it failed (its
                // error fails this sync).
                rx.await
                    .map(born_now)
                    .map_err(|_| self.corrupt("write of the shared copy failed in txg", txg))
            }
            Claim::Lead => {
                self.write_lead(pool, allocator, txg, &entry, &data, compression, sealed).await
            }
            Claim::Compare(_) => unreachable!("the loop breaks only on a decision"),
        }
    }

    /// The lead writer: the rest of the pipeline (compress, checksum, allocate), ready
    /// (publish the copy), issue, done. An encrypted block comes `sealed` already (its key is
    /// of its sealed bytes).
    #[allow(clippy::too_many_arguments)]
    async fn write_lead(
        &self,
        pool: &Pool,
        allocator: &Mutex<Allocator>,
        txg: u64,
        entry: &Entry,
        data: &Arc<AlignedBuf>,
        compression: Compression,
        sealed: Option<zio::Sealed>,
    ) -> Result<BlockPointer, PoolError> {
        let props = BlockProps {
            dedup: Some(entry.key),
            ..BlockProps::data(Writer::DedupData, txg, compression)
        };
        let sealed = match sealed {
            Some(mut sealed) => {
                sealed.props.dedup = Some(entry.key);
                Ok(sealed)
            }
            None => pool.seal_block(props, Arc::clone(data), None),
        };
        let prepared = sealed.and_then(|sealed| {
            let placed =
                pool.allocate(allocator, std::slice::from_ref(&sealed), AllocClass::Reserved)?;
            Ok((sealed, placed))
        });
        let (sealed, placed) = match prepared {
            Ok(prepared) => prepared,
            Err(error) => {
                self.fail_lead(entry);
                return Err(error);
            }
        };
        let bp = zio::describe(&sealed, &placed[0]);
        // Ready: the copy is known before it is written, so waiters need not wait for the I/O.
        {
            let (_table, mut io) = self.io_stage(entry, Stage::Ready);
            io.phys = Some(bp);
            if let Some(lead) = io.lead.as_mut() {
                for waiter in lead.waiters.drain(..) {
                    let _ = waiter.send(bp);
                }
            }
        }
        let written = pool.issue_placed(&[sealed], &placed, Issue::ASYNC).await;
        if written.is_err() {
            self.fail_lead(entry);
        } else {
            let (_table, mut io) = self.io_stage(entry, Stage::Done);
            let lead = io.lead.take();
            assert!(
                lead.is_some_and(|l| l.waiters.is_empty()),
                "the done stage finds its lead, whose waiters were answered when it was ready"
            );
            self.stats.blocks_written.inc();
        }
        written.map(|_| bp)
    }

    /// A lead write failed: the entry returns to what it was before it, and the references
    /// taken by the lead and its waiters are dropped (ZFS: `zio_ddt_child_write_done` on error).
    fn fail_lead(&self, entry: &Entry) {
        let _table = self.table.lock(Stage::Rollback, &self.stats);
        self.stats.entry_lock.inc();
        let mut io = entry.io.lock();
        let waiters = io.lead.take().map_or(0, |lead| lead.waiters.len() as u64);
        io.phys = io.orig_phys;
        io.refcount -= 1 + waiters;
    }

    /// Drops one reference of a dedup block pointer freed in this txg. The block itself is
    /// freed by [`Ddt::flush`] if no reference is left then.
    pub async fn free(&self, pool: &Pool, bp: &BlockPointer) -> Result<(), PoolError> {
        let Some(key) = bp.dedup else { return Err(self.corrupt("free of a non-dedup block", 0)) };
        let (entry, disk) = self.lookup(key, Stage::Free);
        self.load(pool, &entry, &disk).await?;
        let mut table = self.table.lock(Stage::Free, &self.stats);
        self.stats.entry_lock.inc();
        let mut io = entry.io.lock();
        Self::initialize(&entry, &mut io);
        if io.refcount == 0 || io.phys.map(|p| p.dvas) != Some(bp.dvas) {
            return Err(self.corrupt("free of a block the table does not count", io.refcount));
        }
        io.refcount -= 1;
        self.stats.references_dropped.inc();
        Self::mark_dirty(&mut table, &entry, &mut io);
        Ok(())
    }

    /// Writes every entry changed since the last flush into its bucket, as part of `ctx.txg`
    /// (after all of the sync's writes and frees). Buckets and tree blocks it replaces, and
    /// the blocks of entries left without references, go into `ctx.replaced` to be freed.
    /// Returns the header for the directory.
    pub async fn flush(&self, ctx: &mut TreeUpdate<'_>) -> Result<DdtHeader, PoolError> {
        // Nothing writes or frees during the flush (one sync at a time, and only syncs use
        // the table), so the dirty entries are stable from here on.
        let (dirty, disk) = {
            let mut table = self.table.lock(Stage::Flush, &self.stats);
            let keys = std::mem::take(&mut table.dirty);
            let dirty: Vec<(Arc<Entry>, u64, Option<BlockPointer>, u64)> = keys
                .iter()
                .filter_map(|key| table.entries.get(key))
                .map(|entry| {
                    let mut io = entry.io.lock();
                    assert!(io.lead.is_none(), "no dedup write is in flight during a flush");
                    io.dirty = false;
                    (Arc::clone(entry), io.refcount, io.phys, io.synced_refcount)
                })
                .collect();
            (dirty, table.disk)
        };
        if dirty.is_empty() {
            return Ok(disk);
        }
        let mut header = disk;
        // The new state of every changed entry: `None` removes it.
        let mut changes: BTreeMap<DdtKey, Option<DdtEntry>> = BTreeMap::new();
        for (entry, refcount, phys, synced) in &dirty {
            if *refcount == 0 && *synced == 0 {
                // Never in the table on disk. Written in this txg and freed in it too (a
                // rollback frees what its own sync wrote): the block goes. Its only write
                // failed (`fail_lead` left no block): nothing to write or free.
                if let Some(phys) = phys {
                    self.stats.blocks_freed.inc();
                    ctx.replaced.push(BlockPointer { dedup: None, ..*phys });
                }
                continue;
            }
            let phys = phys.ok_or_else(|| self.corrupt("entry without a block", *refcount))?;
            let asize: u64 = phys.copies().map(|d| d.asize_bytes()).sum();
            match (*synced, *refcount) {
                (0, 0) => {}
                (0, _) => {
                    header.entries += 1;
                    header.allocated_bytes += asize;
                }
                (_, 0) => {
                    header.entries -= 1;
                    header.allocated_bytes -= asize;
                }
                _ => {}
            }
            header.references = header.references + refcount - synced;
            if *refcount == 0 {
                self.stats.blocks_freed.inc();
                ctx.replaced.push(BlockPointer { dedup: None, ..phys });
                changes.insert(entry.key, None);
            } else {
                changes.insert(
                    entry.key,
                    Some(DdtEntry { key: entry.key, refcount: *refcount, bp: phys }),
                );
            }
        }
        let mut bits = disk.bucket_bits;
        while bits < DDT_BUCKET_BITS_MAX && header.entries > (1u64 << bits) * BUCKET_ENTRIES_GROW {
            bits += 1;
        }
        // Buckets to write: every bucket of the table when it grows, else the changed ones,
        // each read, merged, encoded and written concurrently with the others.
        let levels = objset::levels_for(1u64 << bits);
        let shared: &TreeUpdate<'_> = ctx;
        let mut updates: Vec<(u64, Option<BlockPointer>)> = if bits != disk.bucket_bits {
            let mut buckets: BTreeMap<u64, Vec<DdtEntry>> = BTreeMap::new();
            let mut old_tree = Vec::new();
            for (level, index, bp) in objset::walk(shared.pool, disk.root, disk.levels).await? {
                old_tree.push(bp);
                if level != 0 {
                    continue;
                }
                if let Some(bucket) = self.read_bucket(shared.pool, &disk, index).await? {
                    for e in bucket.entries {
                        buckets.entry(e.key.bucket(bits)).or_default().push(e);
                    }
                }
            }
            for (key, change) in &changes {
                let bucket = buckets.entry(key.bucket(bits)).or_default();
                bucket.retain(|e| e.key != *key);
                bucket.extend(change.iter().copied());
            }
            let written = futures::stream::iter(
                buckets
                    .into_iter()
                    .map(|(index, entries)| self.write_bucket(shared, index, bits, entries)),
            )
            .buffer_unordered(FLUSH_IN_FLIGHT)
            .try_collect()
            .await?;
            ctx.replaced.extend(old_tree);
            written
        } else {
            let touched: std::collections::BTreeSet<u64> =
                changes.keys().map(|k| k.bucket(bits)).collect();
            let changes = &changes;
            let disk = &disk;
            futures::stream::iter(touched.into_iter().map(|index| async move {
                let mut entries: BTreeMap<DdtKey, DdtEntry> = self
                    .read_bucket(shared.pool, disk, index)
                    .await?
                    .map(|b| b.entries.into_iter().map(|e| (e.key, e)).collect())
                    .unwrap_or_default();
                for (key, change) in changes.range(bucket_keys(index, bits)) {
                    match change {
                        Some(e) => entries.insert(*key, *e),
                        None => entries.remove(key),
                    };
                }
                self.write_bucket(shared, index, bits, entries.into_values().collect()).await
            }))
            .buffer_unordered(FLUSH_IN_FLIGHT)
            .try_collect()
            .await?
        };
        updates.sort_unstable_by_key(|&(index, _)| index);
        let old_root = if bits != disk.bucket_bits { None } else { disk.root };
        header.root = objset::update_tree(ctx, old_root, levels, &updates).await?;
        header.bucket_bits = bits;
        header.levels = levels;
        // The new state becomes the synced one; entries without references leave memory, and
        // clean entries beyond the memory bound are dropped.
        let mut table = self.table.lock(Stage::Flush, &self.stats);
        for (entry, refcount, _, _) in &dirty {
            entry.io.lock().synced_refcount = *refcount;
            if *refcount == 0 {
                table.entries.remove(&entry.key);
            }
        }
        table.disk = header;
        let excess = (table.entries.len() as u64).saturating_sub(self.cached_entries_max);
        if excess > 0 {
            let clean: Vec<DdtKey> = table
                .entries
                .iter()
                .filter(|(_, e)| !e.io.lock().dirty)
                .map(|(k, _)| *k)
                .take(excess as usize)
                .collect();
            for key in clean {
                table.entries.remove(&key);
            }
        }
        Ok(header)
    }

    /// Writes one bucket (sorted here); an empty bucket becomes a hole.
    async fn write_bucket(
        &self,
        ctx: &TreeUpdate<'_>,
        index: u64,
        bits: u8,
        mut entries: Vec<DdtEntry>,
    ) -> Result<(u64, Option<BlockPointer>), PoolError> {
        if entries.is_empty() {
            return Ok((index, None));
        }
        entries.sort_by_key(|e| e.key);
        let align = ctx.allocator.lock().unit_bytes() as usize;
        let bytes = DdtBucket { index, bucket_bits: bits, entries }
            .encode(align)
            .map_err(|source| PoolError::Format { pool: self.pool_name.clone(), cause: source })?;
        let props = BlockProps::data(Writer::DedupTable, ctx.txg, Compression::Off);
        let block = (props, Arc::new(AlignedBuf::copy_from(&bytes)));
        let bp =
            ctx.pool.write_blocks(ctx.allocator, AllocClass::Reserved, vec![block], None).await?[0];
        Ok((index, Some(bp)))
    }

    /// Space a txg's flush may need to rewrite the table: every bucket once, each rounded up to
    /// the allocation unit, with room for this txg's new entries (one per unique block written,
    /// `new_blocks`), plus the tree above the buckets. Copy-on-write allocates the new buckets
    /// before the old ones are freed, and those frees wait out the deferral, so admission keeps
    /// this much free beyond the slop, `FREE_DEFER_TXGS + 1` times over: a trim, which drops
    /// references and so rewrites buckets on a full pool, must always be able to sync.
    pub fn rewrite_reserve_bytes(&self, unit_bytes: u64, new_blocks: u64) -> u64 {
        let disk = self.synced_header();
        if disk.entries == 0 && new_blocks == 0 {
            return 0;
        }
        // The buckets the flush will write: it doubles them while the entries outgrow them.
        let entries = disk.entries + new_blocks;
        let mut bits = disk.bucket_bits;
        while bits < DDT_BUCKET_BITS_MAX && entries > (1u64 << bits) * BUCKET_ENTRIES_GROW {
            bits += 1;
        }
        let buckets = 1u64 << bits;
        let buckets_bytes = entries * DDT_ENTRY_BYTES as u64 + buckets * unit_bytes;
        let tree_bytes = buckets.div_ceil(objset::INDIRECT_BPS)
            * objset::INDIRECT_BYTES as u64
            * u64::from(disk.levels.max(1));
        (buckets_bytes + tree_bytes) * (crate::alloc::FREE_DEFER_TXGS + 1)
    }

    /// The table as of the last flush.
    pub fn synced_header(&self) -> DdtHeader {
        self.table.inner.lock().disk
    }

    /// Every entry stored in the table as of the last flush, and the blocks of its tree.
    pub async fn stored(
        &self,
        pool: &Pool,
    ) -> Result<(Vec<DdtEntry>, Vec<BlockPointer>), PoolError> {
        let disk = self.synced_header();
        let mut entries = Vec::new();
        let mut blocks = Vec::new();
        for (level, index, bp) in objset::walk(pool, disk.root, disk.levels).await? {
            blocks.push(bp);
            if level == 0 {
                if let Some(bucket) = self.read_bucket(pool, &disk, index).await? {
                    entries.extend(bucket.entries);
                }
            }
        }
        Ok((entries, blocks))
    }
}

/// The key range of bucket `index` in a table of `bits` bucket bits.
fn bucket_keys(index: u64, bits: u8) -> std::ops::RangeInclusive<DdtKey> {
    let mut low = [0u8; DDT_KEY_BYTES];
    let mut high = [0xffu8; DDT_KEY_BYTES];
    if bits > 0 {
        let prefix = index << (64 - u32::from(bits));
        let mask = u64::MAX >> u32::from(bits);
        low[..8].copy_from_slice(&prefix.to_be_bytes());
        high[..8].copy_from_slice(&(prefix | mask).to_be_bytes());
    }
    DdtKey(low)..=DdtKey(high)
}

/// Writes a block outside the table (a `dedup=verify` mismatch).
async fn write_plain(
    pool: &Pool,
    allocator: &Mutex<Allocator>,
    txg: u64,
    data: Arc<AlignedBuf>,
    compression: Compression,
    family: u64,
) -> Result<BlockPointer, PoolError> {
    let mut props = BlockProps::data(Writer::VolumeData, txg, compression);
    if family != 0 {
        props.crypt = zio::PropsCrypt::Encrypt { family, convergent: false };
    }
    Ok(pool.write_blocks(allocator, AllocClass::Reserved, vec![(props, data)], None).await?[0])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_key_ranges_hold_exactly_their_keys() {
        for bits in [0u8, 1, 3, 8, 13] {
            for probe in 0..200u32 {
                let mut key = [0u8; DDT_KEY_BYTES];
                key[..4].copy_from_slice(&probe.wrapping_mul(0x9e37_79b9).to_be_bytes());
                key[31] = probe as u8;
                let key = DdtKey(key);
                let index = key.bucket(bits);
                assert!(bucket_keys(index, bits).contains(&key), "bits {bits} probe {probe}");
                if index > 0 {
                    assert!(!bucket_keys(index - 1, bits).contains(&key));
                }
            }
        }
    }

    #[test]
    fn truncated_keys_collide_and_full_keys_do_not() {
        let ddt = Ddt::new("tank", DdtHeader::default(), &Tunables::default());
        let salt = [9u8; 32];
        assert_ne!(ddt.key(&salt, b"one"), ddt.key(&salt, b"two"));
        assert_ne!(ddt.key(&salt, b"one"), ddt.key(&[8u8; 32], b"one"), "the salt keys the hash");
        ddt.truncate_keys_for_tests(4);
        let (a, b) = (ddt.key(&salt, b"one"), ddt.key(&salt, b"two"));
        assert_eq!(a.0[0] & 0x0f, 0);
        assert!(a.0[1..].iter().all(|&x| x == 0));
        assert_eq!(a.bucket(4), a.0[0] as u64 >> 4);
        let _ = b;
    }
}
