//! The block pipeline (ZFS: `zio.c`, `zio_impl.h`): every block the pool stores goes through
//! the same stages, in the same order, whoever writes it.
//!
//! A write is a [`BlockProps`] (who writes it, its type, level, birth txg, the compression to
//! try, its checksum and how many copies) and its logical bytes. Its stages:
//!
//! 1. **compress** ([`compress`]): stored compressed when that saves an eighth (indirect blocks
//!    of a pool with the `lz4_indirect` feature always try lz4, whatever their volume's
//!    compression: [`BlockProps::indirect`]);
//! 2. **encrypt** ([`crypt`]): a data block of an encrypted volume is sealed with AES-256-GCM
//!    under its key family's block key (the stored bytes, padding included), its salt, nonce
//!    and tag going into its pointer; an indirect block above encrypted blocks carries a hash
//!    of its children's MACs instead;
//! 3. **checksum**: of the stored bytes padded to the allocation unit, what its pointer keeps;
//! 4. **dedup**: a dedup volume's table is consulted (crate::dedup, which runs the rest of the
//!    pipeline only for the entry's first writer); its key is of the logical bytes, so the
//!    table is asked before the lead compresses;
//! 5. **allocate**: space for the first copy, best effort for ditto copies (crate::alloc);
//! 6. **ready**: the block's pointer is known ([`describe`]), before any byte is on disk, so
//!    the dedup table can hand it to other writers of the same bytes;
//! 7. **issue**: to the vdev tree, blocks back to back on one vdev as one vectored write
//!    ([`span_runs`]; ZFS gets this from the vdev queue's aggregation);
//! 8. **done**: the pool caches what the writer's blocks are read back for (crate::pool).
//!
//! Stages 1 to 3 are CPU alone ([`seal_batch`]). A batch whose blocks cost more to seal than
//! to move (zstd, a 1 MiB request's compressed blocks logged by pointer) runs them spread over
//! the host's threads (`Env::map_spread`, so the simulator runs them inline and stays
//! deterministic), as ZFS's write-issue taskqs spread them over CPUs; the sync's spans go to
//! its core's own write-issue taskq ([`taskq`]), which seals them in order. Allocation and
//! issue are done by the caller, in order, so a batch's blocks land back to back.
//!
//! A read ([`read_stored`], then [`unseal`]) runs issue (copy after copy), verify (each copy
//! against its pointer's checksum, so a mirror tries its other children), decrypt (an
//! encrypted block with its family's key, which fails what its MAC does not authenticate) and
//! decompress; an indirect block above encrypted blocks then has its children's MACs checked
//! on the pointers it holds, so after decompression. Its raw mode stops after verify: scrub,
//! resilver, healing and send move stored bytes as they are. A block in a span other blocks or
//! reads share is opened from where it lies into a buffer of its own ([`unseal_from`]); one in
//! a span its read owns, in the span itself ([`open_in_place`]).
//!
//! The intent log's chain blocks carry their own checksum (crates/format `lwb`) and go through
//! the issue stage only; the blocks it writes in place for records logged by pointer go
//! through every stage.
//!
//! Every stage of every writer passes through [`Pipeline::stage`], where a fault armed for a
//! stage and a writer ([`Pipeline::arm_fault`], what zinject does for ZFS) fails the next block
//! there, and where a test can watch which thread ran a stage ([`Pipeline::observe`]). Write
//! errors are counted by writer ([`Pipeline::errors`]).
//!
//! This module sits below the pool: it knows the vdev tree, the allocator and the runtime,
//! and its errors are its own ([`ZioError`]); crate::pool binds it to an open pool (its name,
//! its cache, its read-only switch).

pub mod compress;
pub mod crypt;
mod taskq;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use sluice_format::{
    BlockCompression, BlockCrypt, BlockKind, BlockPointer, Checksum, ChecksumAlg, Compression,
    DdtKey, Dva, CHILDREN_MAC_BYTES, SECTOR_BYTES,
};

use crate::alloc::{AllocClass, AllocError, Allocator};
use crate::device::{AlignedBuf, SharedBuf};
use crate::rt::Env;
use crate::stats::Counter;
use crate::tunables::IoClass;
use crate::vdev::{Root, RunBlock, VdevAddress, VdevError};

pub use crate::vdev::WRITE_SPAN_BYTES_MAX;

/// A stage of the pipeline, in the order a write runs them (the read stages after).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stage {
    Compress,
    Encrypt,
    Checksum,
    Dedup,
    Allocate,
    Ready,
    Issue,
    Done,
}

impl Stage {
    /// The write stages, in order.
    pub const WRITE: [Stage; 8] = [
        Stage::Compress,
        Stage::Encrypt,
        Stage::Checksum,
        Stage::Dedup,
        Stage::Allocate,
        Stage::Ready,
        Stage::Issue,
        Stage::Done,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Stage::Compress => "compress",
            Stage::Encrypt => "encrypt",
            Stage::Checksum => "checksum",
            Stage::Dedup => "dedup",
            Stage::Allocate => "allocate",
            Stage::Ready => "ready",
            Stage::Issue => "issue",
            Stage::Done => "done",
        }
    }
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Who writes a block: errors are counted, and faults armed, by writer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Writer {
    /// A volume's data block, written by the txg sync.
    VolumeData,
    /// An indirect block of a volume's tree, written by the txg sync.
    Indirect,
    /// A piece of a top-level vdev's space map.
    SpaceMap,
    /// The pool directory (what the uberblock points at).
    Directory,
    /// A piece of a snapshot's or volume's dead list.
    Deadlist,
    /// A bucket or tree block of the dedup table.
    DedupTable,
    /// A data block of a dedup volume, written by its table entry's first writer.
    DedupData,
    /// A block written in place for an intent-log record logged by pointer (ZFS:
    /// `WR_INDIRECT`), before its txg syncs.
    LogIndirect,
    /// A block of a volume's intent-log chain.
    LogChain,
    /// A data block a receive wrote in place, as the stream carried it (raw), before its txg
    /// syncs.
    Receive,
}

impl Writer {
    pub const ALL: [Writer; 10] = [
        Writer::VolumeData,
        Writer::Indirect,
        Writer::SpaceMap,
        Writer::Directory,
        Writer::Deadlist,
        Writer::DedupTable,
        Writer::DedupData,
        Writer::LogIndirect,
        Writer::LogChain,
        Writer::Receive,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Writer::VolumeData => "volume data",
            Writer::Indirect => "indirect",
            Writer::SpaceMap => "space map",
            Writer::Directory => "pool directory",
            Writer::Deadlist => "dead list",
            Writer::DedupTable => "dedup table",
            Writer::DedupData => "dedup data",
            Writer::LogIndirect => "log-by-pointer",
            Writer::LogChain => "intent log chain",
            Writer::Receive => "received",
        }
    }

    /// Whether the pool caches this writer's blocks as they are written: the blocks the next
    /// txg reads back (indirect blocks it updates, data blocks a partial write completes,
    /// the table's buckets). Blocks written in place for the log are cached when a sync
    /// links them.
    pub fn cached(self) -> bool {
        matches!(self, Writer::VolumeData | Writer::Indirect | Writer::DedupTable)
    }
}

impl std::fmt::Display for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a block's pointer says about it, besides where it is and its checksum's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockProps {
    pub writer: Writer,
    pub kind: BlockKind,
    pub level: u8,
    /// Data blocks at or below it (1 for a data block).
    pub fill: u64,
    pub birth_txg: u64,
    /// The compression to try; the pointer records what was used.
    pub compression: Compression,
    pub checksum: ChecksumAlg,
    /// Copies to allocate: the first is required, the others are ditto copies placed on other
    /// vdevs where there is room (ZFS: `copies`, and metadata's extra copies).
    pub copies: usize,
    /// The dedup table entry that counts the block's references, if any.
    pub dedup: Option<DdtKey>,
    pub crypt: PropsCrypt,
}

/// What the encrypt stage does with a block.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PropsCrypt {
    /// Nothing: the block is not in an encrypted volume's tree.
    #[default]
    None,
    /// Seal it under key family `family`'s key; with `convergent`, under the salt and nonce
    /// of a keyed MAC of its bytes (a volume with dedup), else random ones.
    Encrypt { family: u64, convergent: bool },
    /// An indirect block above encrypted blocks: its pointer carries this hash of its
    /// children's MACs.
    ChildrenMac([u8; CHILDREN_MAC_BYTES]),
}

impl BlockProps {
    /// A data block of a volume, one copy.
    pub fn data(writer: Writer, birth_txg: u64, compression: Compression) -> BlockProps {
        BlockProps {
            writer,
            kind: BlockKind::Data,
            level: 0,
            fill: 1,
            birth_txg,
            compression,
            checksum: ChecksumAlg::Xxh3_128,
            copies: 1,
            dedup: None,
            crypt: PropsCrypt::None,
        }
    }

    /// An indirect block of `level` over `fill` data blocks, in `copies` copies; with `lz4`
    /// (the pool's `lz4_indirect` feature, every pool made since it) compressed with lz4
    /// whatever its volume's compression, as OpenZFS compresses metadata
    /// (`dmu_write_policy`): a block pointer is mostly zeros and small numbers around its
    /// 16-byte checksum, so a full 16 KiB block of them stores in about half (and one over
    /// mostly holes in a unit), and random writes rewrite many of them every txg, each in
    /// `pool.metadata_copies` copies.
    pub fn indirect(level: u8, fill: u64, birth_txg: u64, copies: usize, lz4: bool) -> BlockProps {
        let compression = if lz4 { Compression::Lz4 } else { Compression::Off };
        BlockProps {
            kind: BlockKind::Indirect,
            level,
            fill,
            copies,
            ..BlockProps::data(Writer::Indirect, birth_txg, compression)
        }
    }

    /// A pool metadata block (space map, directory, dead list), uncompressed.
    pub fn metadata(writer: Writer, birth_txg: u64, copies: usize) -> BlockProps {
        BlockProps {
            kind: BlockKind::Metadata,
            copies,
            ..BlockProps::data(writer, birth_txg, Compression::Off)
        }
    }
}

/// Why a block did not get through the pipeline.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ZioError {
    #[error("an error injected at the {stage} stage of a {writer} block (an armed fault)")]
    Injected { stage: Stage, writer: Writer },
    #[error("no space for a {writer} block: {cause}")]
    NoSpace { writer: Writer, cause: AllocError },
    #[error("writing a {writer} block: {cause}")]
    Vdev { writer: Writer, cause: VdevError },
    /// An encrypted block was to be written with its family's key not loaded.
    #[error(
        "a {writer} block of key family {family:#018x} cannot be encrypted: its key is not loaded"
    )]
    KeyUnavailable { writer: Writer, family: u64 },
    #[error("encrypting a {writer} block: {cause}")]
    Crypt { writer: Writer, cause: crypt::CryptError },
}

impl ZioError {
    pub fn writer(&self) -> Writer {
        match self {
            ZioError::Injected { writer, .. }
            | ZioError::NoSpace { writer, .. }
            | ZioError::Vdev { writer, .. }
            | ZioError::KeyUnavailable { writer, .. }
            | ZioError::Crypt { writer, .. } => *writer,
        }
    }
}

/// Why a verified block's logical bytes could not be had.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UnsealError {
    #[error("it does not decompress: {0}")]
    Decompress(#[from] compress::DecompressError),
    /// Its key family's key is not loaded.
    #[error("it is encrypted with key family {family:#018x}, whose key is not loaded")]
    KeyUnavailable { family: u64 },
    /// Its MAC did not authenticate it: its bytes, or the pointer fields its MAC covers, were
    /// changed on the disk by someone who recomputed its checksum.
    #[error("it fails authentication (it was changed on the disk)")]
    Authentication,
    #[error("decrypting it: {0}")]
    Crypt(crypt::CryptError),
}

impl UnsealError {
    /// A failed open: a bad tag is a failed authentication, anything else OpenSSL's failure.
    fn from_crypt(error: crypt::CryptError) -> UnsealError {
        match error {
            crypt::CryptError::Authentication => UnsealError::Authentication,
            other => UnsealError::Crypt(other),
        }
    }
}

/// Watches stages as blocks pass them (tests: which thread ran a stage).
pub type Observer = Arc<dyn Fn(Stage, Writer) + Send + Sync>;

/// The pipeline's own state: faults armed, observers, errors and bytes written by writer. One
/// per open pool.
#[derive(Default)]
pub struct Pipeline {
    /// Set while a fault or an observer is installed: the common case checks only this.
    armed: AtomicBool,
    faults: Mutex<Vec<(Stage, Writer)>>,
    observer: Mutex<Option<Observer>>,
    errors: [Counter; Writer::ALL.len()],
    /// Stored bytes the issue stage wrote, every copy, before a vdev's own redundancy (a
    /// mirror's legs, RAID-Z's parity): what the disk's bytes per client write are made of.
    written: [Counter; Writer::ALL.len()],
    /// The keys the encrypt and decrypt stages use.
    keys: crypt::Keystore,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline").field("faults", &*self.faults.lock()).finish()
    }
}

impl Pipeline {
    /// The key families loaded for the encrypt and decrypt stages.
    pub fn keys(&self) -> &crypt::Keystore {
        &self.keys
    }

    /// Fails the next `writer` block that reaches `stage`, once (ZFS: `zinject`).
    pub fn arm_fault(&self, stage: Stage, writer: Writer) {
        self.faults.lock().push((stage, writer));
        self.armed.store(true, Ordering::Release);
    }

    /// Calls `observer` at every stage every block passes, on the thread running it.
    pub fn observe(&self, observer: Option<Observer>) {
        *self.observer.lock() = observer;
        self.rearm();
    }

    fn rearm(&self) {
        let armed = !self.faults.lock().is_empty() || self.observer.lock().is_some();
        self.armed.store(armed, Ordering::Release);
    }

    /// A block of `writer` passes `stage`: fails it if a fault is armed there.
    pub fn stage(&self, stage: Stage, writer: Writer) -> Result<(), ZioError> {
        if !self.armed.load(Ordering::Acquire) {
            return Ok(());
        }
        let observer = self.observer.lock().clone();
        if let Some(observer) = observer {
            observer(stage, writer);
        }
        let hit = {
            let mut faults = self.faults.lock();
            let at = faults.iter().position(|&f| f == (stage, writer));
            at.map(|at| faults.swap_remove(at)).is_some()
        };
        if hit {
            self.rearm();
            return Err(ZioError::Injected { stage, writer });
        }
        Ok(())
    }

    /// Counts a block of `writer` that failed.
    pub fn note_error(&self, writer: Writer) {
        self.errors[writer as usize].inc();
    }

    /// Blocks of `writer` that failed to be written since the pool opened.
    pub fn errors(&self, writer: Writer) -> u64 {
        self.errors[writer as usize].get()
    }

    /// Counts `bytes` of `writer`'s blocks that the issue stage wrote.
    fn note_written(&self, writer: Writer, bytes: u64) {
        self.written[writer as usize].add(bytes);
    }

    /// Stored bytes of `writer`'s blocks written since the pool opened, every copy counted
    /// and a vdev's own redundancy not.
    pub fn written(&self, writer: Writer) -> u64 {
        self.written[writer as usize].get()
    }

    /// [`Pipeline::note_error`] for the writer of `result`'s error, passing it on.
    fn counted<T>(&self, result: Result<T, ZioError>) -> Result<T, ZioError> {
        if let Err(error) = &result {
            self.note_error(error.writer());
        }
        result
    }
}

/// A block through its CPU stages (compress, encrypt, checksum): what is stored, and its sum.
#[derive(Clone, Debug)]
pub struct Sealed {
    pub props: BlockProps,
    /// The block's logical bytes (what the cache keeps).
    pub logical: Arc<AlignedBuf>,
    /// What is stored: the logical bytes, or their compressed form, padded to the allocation
    /// (the same buffer as `logical` when neither changed it).
    pub stored: Arc<AlignedBuf>,
    pub compression: BlockCompression,
    pub checksum: Checksum,
    /// How the encrypt stage sealed it, if it did.
    pub sealing: Option<crypt::Sealing>,
}

impl Sealed {
    /// Bytes the block's first copy takes on disk.
    pub fn psize(&self) -> u64 {
        self.stored.len() as u64
    }
}

/// Runs a block's CPU stages. The stored bytes are padded to `psize` if given (a block whose
/// place was allocated before its bytes were known: a space map piece), else to whole
/// allocation units of `unit` bytes.
pub fn seal(
    pipeline: &Pipeline,
    props: BlockProps,
    logical: Arc<AlignedBuf>,
    unit: u64,
    psize: Option<u64>,
) -> Result<Sealed, ZioError> {
    let stored = transform(pipeline, props, logical, unit, psize, None)?;
    sum(pipeline, stored)
}

/// A block past compress and encrypt, padded: what is stored, not yet checksummed.
#[derive(Clone, Debug)]
struct Transformed {
    props: BlockProps,
    logical: Arc<AlignedBuf>,
    stored: Arc<AlignedBuf>,
    compression: BlockCompression,
    sealing: Option<crypt::Sealing>,
}

/// The compress and encrypt stages of [`seal`], and the padding.
fn transform(
    pipeline: &Pipeline,
    props: BlockProps,
    logical: Arc<AlignedBuf>,
    unit: u64,
    psize: Option<u64>,
    planned: Option<bool>,
) -> Result<Transformed, ZioError> {
    pipeline.stage(Stage::Compress, props.writer)?;
    let compressed = compress::compress(props.compression, &logical, unit, planned);
    let (mut stored, compression) = match compressed {
        Some((bytes, alg)) => (Arc::new(bytes), alg),
        None => (Arc::clone(&logical), BlockCompression::None),
    };
    pipeline.stage(Stage::Encrypt, props.writer)?;
    let unit = unit.max(u64::from(SECTOR_BYTES));
    let padded = psize.unwrap_or_else(|| (stored.len() as u64).div_ceil(unit) * unit);
    assert!(padded >= stored.len() as u64, "a block's place holds its stored bytes");
    let sealing = match props.crypt {
        PropsCrypt::Encrypt { family, convergent } => {
            assert_eq!(props.kind, BlockKind::Data, "only data blocks are encrypted");
            let key = pipeline
                .keys
                .get(family)
                .ok_or(ZioError::KeyUnavailable { writer: props.writer, family })?;
            // The whole stored block, padding included, is sealed, so the padding says
            // nothing of where the compressed bytes end. A fresh buffer: the stored bytes may
            // be the logical ones, which the cache keeps.
            let mut sealed = AlignedBuf::gathered(padded as usize, [(0, &stored[..])]);
            let sector = u64::from(SECTOR_BYTES);
            let sectors = |bytes: u64| u32::try_from(bytes / sector).unwrap_or(u32::MAX);
            let aad = crypt::block_aad(
                family,
                sectors((logical.len() as u64).div_ceil(sector) * sector),
                sectors(padded),
                compression,
                props.kind,
                props.level,
            );
            let sealing = key
                .seal(&mut sealed, &aad, convergent)
                .map_err(|cause| ZioError::Crypt { writer: props.writer, cause })?;
            stored = Arc::new(sealed);
            Some(sealing)
        }
        PropsCrypt::None | PropsCrypt::ChildrenMac(_) => {
            if padded != stored.len() as u64 {
                stored = Arc::new(AlignedBuf::gathered(padded as usize, [(0, &stored[..])]));
            }
            None
        }
    };
    Ok(Transformed { props, logical, stored, compression, sealing })
}

/// The checksum stage of [`seal`].
fn sum(pipeline: &Pipeline, block: Transformed) -> Result<Sealed, ZioError> {
    let Transformed { props, logical, stored, compression, sealing } = block;
    pipeline.stage(Stage::Checksum, props.writer)?;
    // Stored as it arrived (not compressed, not sealed, not padded), a block may carry the
    // checksum taken while the receive had it in the CPU's cache (`UninitBuf::remember_xxh3`).
    let checksum = match (props.checksum, stored.xxh3()) {
        (ChecksumAlg::Xxh3_128, Some(taken)) => {
            #[cfg(any(test, feature = "testing"))]
            assert_eq!(taken, props.checksum.compute(&stored), "a remembered checksum is current");
            taken
        }
        (alg, _) => alg.compute(&stored),
    };
    Ok(Sealed { props, logical, stored, compression, checksum, sealing })
}

/// [`seal`] in raw mode: `stored` is the block as another pool stored it (compressed as
/// `compression` says; a receive's stream carries it so), so compress and encrypt are skipped
/// and only its padding and checksum are this pool's.
pub fn seal_raw(
    pipeline: &Pipeline,
    props: BlockProps,
    logical: Arc<AlignedBuf>,
    stored: &[u8],
    compression: BlockCompression,
    unit: u64,
) -> Result<Sealed, ZioError> {
    let unit = unit.max(u64::from(SECTOR_BYTES));
    let padded = (stored.len() as u64).div_ceil(unit) * unit;
    let stored = Arc::new(AlignedBuf::gathered(padded as usize, [(0, stored)]));
    pipeline.stage(Stage::Checksum, props.writer)?;
    let checksum = props.checksum.compute(&stored);
    Ok(Sealed { props, logical, stored, compression, checksum, sealing: None })
}

/// Whether a batch's CPU stages are worth spreading over the host's threads: the blocks a
/// large request logs by pointer, when compressed, which its committer would otherwise seal
/// alone on the volume's serving core; any batch compressed with zstd, which takes
/// milliseconds a block at high levels (but a committer's batch that turns out to hold
/// nothing to compress is checksummed where it is: [`CHECKSUM_HERE_BYTES_MAX`]). A batch
/// that is only checksummed, or that the sync compresses with lz4, is sealed on its caller's
/// core (in its taskq from
/// [`TASK_BATCH_BYTES_MIN`]): xxh3 takes about a microsecond per 16 KiB
/// and lz4 some 15, less than moving the block to another core and waking it costs there
/// (spreading checksum-only batches cost 1 MiB write + flush 9% more CPU per MiB, and the
/// sync's lz4 batches cost a stream of 1 MiB writes 15%; docs/bench/peers-notes.md).
fn worth_spreading(props: &BlockProps) -> bool {
    match props.compression {
        Compression::Off => false,
        Compression::Zstd(_) => true,
        _ => props.writer == Writer::LogIndirect,
    }
}

/// A committer's batch of blocks logged by pointer, worth spreading for its compression,
/// in which the early abort finds that no block compresses and none is encrypted, is
/// checksummed in the committer's task up to this size. xxh3 takes about a microsecond per
/// 16 KiB, so spreading a 1 MiB write's checksums saves some 30 us, about what waking the
/// other core and waiting for its answer costs: spread, a lone client's 1 MiB write + flush
/// of random data took about 5% more machine CPU per MiB at the same MiB/s, while four
/// clients' flushes, which commit 4 MiB together, lost MiB/s when checksummed on one core
/// (bench/per-op.sh, docs/bench/peers-notes.md, 2026-11-30). 2 MiB lies between the two
/// measured sizes; nothing between them was measured. Encrypted batches stay spread, as
/// before: AES-GCM costs more than the checksum, and sealing them here was not measured.
const CHECKSUM_HERE_BYTES_MAX: usize = 2 << 20;

/// Batches of at least this many bytes that are not spread and are the sync's (a span of
/// volume data, a chunk of indirect blocks) go to the core's taskq: see [`seal_batch`].
const TASK_BATCH_BYTES_MIN: usize = 256 << 10;

/// [`seal`] for a batch, answering in order: spread over the host's threads where
/// [`worth_spreading`] says so; in the caller's thread's taskq ([`taskq`]) where it holds
/// [`TASK_BATCH_BYTES_MIN`] or more and is not a log committer's; else here, in the caller's
/// task. The first error fails the batch (each block's error is counted).
///
/// A log committer's batch (blocks logged by pointer, uncompressed, or up to
/// [`CHECKSUM_HERE_BYTES_MAX`] of them with nothing that compresses) is sealed in the
/// committer's task, never queued: a client's flush waits for it, and in the taskq it would
/// wait behind the sync's spans. One thread (the simulator, or a server of one core) seals
/// every batch in the caller's task, as before the taskq, so a simulated run keeps its order
/// of polls.
///
/// The taskq lets the caller's task go on while the batch waits to be sealed: the sync keeps
/// several spans in flight, and sealed inside the span's own future, each 1 MiB span's
/// compression and checksum ran before the sync's task could issue the writes of the spans
/// already sealed. Under 1 MiB sequential writes on a pool short of space, where writers wait
/// for the sync to free space, syncs took longer and writers got 0.65-0.70x the throughput
/// of the binary before the pipeline (docs/bench/peers-notes.md). Batches left uncompressed
/// go there too: their checksums alone, sealed in the sync's task, held back its writes the
/// same way (a 1 MiB stream with `compression=off`: 1,990-2,327 MiB/s sealed there, 2,994-3,081
/// in the taskq; per-op, 2026-11-30).
pub async fn seal_batch(
    env: &Env,
    pipeline: &Arc<Pipeline>,
    blocks: Vec<(BlockProps, Arc<AlignedBuf>)>,
    unit: u64,
    hint: Option<Arc<compress::RunHint>>,
) -> Result<Vec<Sealed>, ZioError> {
    seal_batch_with(env, pipeline, blocks, unit, EarlyAbort::Hint(hint)).await
}

/// [`seal_batch`] with the early abort's `plan` for the batch where the caller made it
/// already ([`stage_as_is`]), so that no block is sampled twice.
pub async fn seal_batch_planned(
    env: &Env,
    pipeline: &Arc<Pipeline>,
    blocks: Vec<(BlockProps, Arc<AlignedBuf>)>,
    unit: u64,
    plan: Vec<Option<bool>>,
) -> Result<Vec<Sealed>, ZioError> {
    assert_eq!(plan.len(), blocks.len(), "a plan decides each block of its batch");
    seal_batch_with(env, pipeline, blocks, unit, EarlyAbort::Planned(plan)).await
}

/// A batch's early abort ([`compress::plan_run`]): decided by the caller, or to be decided
/// where the batch is sealed, going on from the volume's hint where it has one.
#[derive(Debug)]
enum EarlyAbort {
    Planned(Vec<Option<bool>>),
    Hint(Option<Arc<compress::RunHint>>),
}

impl EarlyAbort {
    /// The plan, made now over `blocks` unless it was made already.
    fn plan(self, blocks: &[(BlockProps, Arc<AlignedBuf>)]) -> Vec<Option<bool>> {
        match self {
            EarlyAbort::Planned(plan) => plan,
            EarlyAbort::Hint(hint) => {
                let blocks = blocks.iter().map(|(props, data)| (props.compression, &data[..]));
                compress::plan_run(blocks, hint.as_deref()).0
            }
        }
    }
}

async fn seal_batch_with(
    env: &Env,
    pipeline: &Arc<Pipeline>,
    blocks: Vec<(BlockProps, Arc<AlignedBuf>)>,
    unit: u64,
    early_abort: EarlyAbort,
) -> Result<Vec<Sealed>, ZioError> {
    if !blocks.iter().any(|(props, _)| worth_spreading(props)) {
        let bytes: usize = blocks.iter().map(|(_, data)| data.len()).sum();
        let logged = blocks.iter().any(|(props, _)| props.writer == Writer::LogIndirect);
        // (Only committers plan ahead, and their batches are never queued.)
        if let (true, EarlyAbort::Hint(hint)) =
            (bytes >= TASK_BATCH_BYTES_MIN && !logged && env.parallelism() > 1, &early_abort)
        {
            // A taskq that ended without an answer (a runtime shutting down) leaves the batch
            // to be sealed here.
            let queued = taskq::seal(env, pipeline, blocks.clone(), unit, hint.clone());
            if let Some(sealed) = queued.await {
                return pipeline.counted(sealed);
            }
        }
        return pipeline.counted(seal_stages_now(pipeline, blocks, early_abort, unit));
    }
    let pipeline_ = Arc::clone(pipeline);
    // The early abort is decided over the run here, in order (unless the caller did); each
    // block is then compressed (or not) and checksummed wherever it is spread to.
    let plan = early_abort.plan(&blocks);
    let bytes: usize = blocks.iter().map(|(_, data)| data.len()).sum();
    // Only a committer's: the sync's zstd spans keep their spread (checksummed in the sync's
    // task, spans held back its writes; see above).
    let sealed_here = bytes <= CHECKSUM_HERE_BYTES_MAX
        && plan.iter().all(|planned| *planned == Some(false))
        && blocks.iter().all(|(props, _)| {
            props.writer == Writer::LogIndirect
                && !matches!(props.crypt, PropsCrypt::Encrypt { .. })
        });
    if sealed_here {
        // No block compresses (random or already compressed data) or is encrypted, so what is
        // left is the checksums: see CHECKSUM_HERE_BYTES_MAX.
        return pipeline.counted(seal_stages_now(
            pipeline,
            blocks,
            EarlyAbort::Planned(plan),
            unit,
        ));
    }
    type Item = (BlockProps, Arc<AlignedBuf>, Arc<Pipeline>, Option<bool>);
    let items: Vec<Item> = blocks
        .into_iter()
        .zip(plan)
        .map(|((props, data), planned)| (props, data, Arc::clone(&pipeline_), planned))
        .collect();
    let sealed = env
        .map_spread("zio_write_issue", items, move |(props, data, pipeline, planned)| {
            let stored = transform(pipeline, *props, Arc::clone(data), unit, None, *planned)?;
            sum(pipeline, stored)
        })
        .await;
    pipeline.counted(sealed.into_iter().collect())
}

/// A batch's CPU stages, stage by stage over the batch rather than block by block: the
/// checksum pass then streams through the blocks' bytes in one loop. Interleaved with each
/// block's compression (which reads only samples of a block that does not compress), xxh3
/// took twice the CPU per MiB under 1 MiB sequential writes (perf, docs/bench/peers-notes.md).
/// With a `quantum`, it yields to the thread's other tasks after each that many logical bytes
/// (the taskq); without, it never waits, and its caller takes the answer at once.
async fn seal_stages(
    pipeline: &Pipeline,
    blocks: Vec<(BlockProps, Arc<AlignedBuf>)>,
    early_abort: EarlyAbort,
    unit: u64,
    quantum: Option<usize>,
) -> Result<Vec<Sealed>, ZioError> {
    let plan = early_abort.plan(&blocks);
    assert_eq!(plan.len(), blocks.len(), "a plan decides each block of its batch");
    let mut since_yield = 0;
    let mut pause = async |bytes: usize| {
        since_yield += bytes;
        if quantum.is_some_and(|quantum| since_yield >= quantum) {
            since_yield = 0;
            crate::rt::yield_now().await;
        }
    };
    let mut transformed = Vec::with_capacity(blocks.len());
    for ((props, data), planned) in blocks.into_iter().zip(plan) {
        let bytes = data.len();
        transformed.push(transform(pipeline, props, data, unit, None, planned)?);
        pause(bytes).await;
    }
    let mut sealed = Vec::with_capacity(transformed.len());
    for block in transformed {
        let bytes = block.logical.len();
        sealed.push(sum(pipeline, block)?);
        pause(bytes).await;
    }
    Ok(sealed)
}

/// [`seal_stages`] at once, in the caller's task.
fn seal_stages_now(
    pipeline: &Pipeline,
    blocks: Vec<(BlockProps, Arc<AlignedBuf>)>,
    early_abort: EarlyAbort,
    unit: u64,
) -> Result<Vec<Sealed>, ZioError> {
    use futures::FutureExt;
    seal_stages(pipeline, blocks, early_abort, unit, None)
        .now_or_never()
        .expect("no quantum, no yield")
}

/// A log committer's batch past its compress and encrypt stages, each block stored as its
/// logical bytes ([`stage_as_is`]); [`sum_staged`] finishes it.
#[derive(Debug)]
pub struct Staged(Vec<Transformed>);

impl Staged {
    /// Bytes each block's first copy takes on disk, in order.
    pub fn psizes(&self) -> Vec<u64> {
        self.0.iter().map(|block| block.stored.len() as u64).collect()
    }

    /// Block `i`'s stored bytes: its logical bytes.
    pub fn stored(&self, i: usize) -> &Arc<AlignedBuf> {
        &self.0[i].stored
    }
}

/// A log committer's batch whose blocks are all stored as they are (none compresses, by the
/// early abort's plan over the run, or compression is off; none is encrypted; each a whole
/// number of allocation units), of at most [`CHECKSUM_HERE_BYTES_MAX`]: its compress and
/// encrypt stages, run here, change nothing, so each block's size on disk is known before its
/// checksum. Its places can then be allocated and its writes started first, and its checksums
/// computed while the device writes (the stored bytes hold no checksum; only the block
/// pointers do). ZFS runs the checksum stage before the allocation for every block; for a lone
/// client's 1 MiB write + flush the checksums and block pointers kept the device idle about a
/// quarter of the operation (docs/bench/peers-notes.md). Any other batch is for
/// [`seal_batch_planned`] to seal whole, with the plan where one was made.
pub fn stage_as_is(
    pipeline: &Pipeline,
    blocks: &[(BlockProps, Arc<AlignedBuf>)],
    unit: u64,
    hint: Option<&compress::RunHint>,
) -> Result<Staging, ZioError> {
    let unit = unit.max(u64::from(SECTOR_BYTES));
    // Sampled once, whatever comes of the batch: a batch sealed whole follows this plan.
    let (plan, _) =
        compress::plan_run(blocks.iter().map(|(props, data)| (props.compression, &data[..])), hint);
    let bytes: usize = blocks.iter().map(|(_, data)| data.len()).sum();
    let as_is = bytes <= CHECKSUM_HERE_BYTES_MAX
        && blocks.iter().zip(&plan).all(|((props, data), planned)| {
            props.writer == Writer::LogIndirect
                && matches!(props.crypt, PropsCrypt::None)
                && data.len() as u64 % unit == 0
                && compress::stored_as_is(props.compression, data.len(), unit, *planned)
        });
    if !as_is {
        return Ok(Staging::Seal(plan));
    }
    let staged = blocks.iter().zip(plan).map(|((props, data), planned)| {
        let block = transform(pipeline, *props, Arc::clone(data), unit, None, planned)?;
        assert!(
            Arc::ptr_eq(&block.stored, &block.logical),
            "a block staged as it is is stored as its logical bytes"
        );
        Ok(block)
    });
    pipeline.counted(staged.collect::<Result<Vec<_>, _>>().map(|s| Staging::AsIs(Staged(s))))
}

/// What [`stage_as_is`] made of a batch.
#[derive(Debug)]
pub enum Staging {
    /// Stored as it is, past its compress and encrypt stages.
    AsIs(Staged),
    /// To be sealed whole ([`seal_batch_planned`]), with the early abort's plan for it.
    Seal(Vec<Option<bool>>),
}

/// The checksum stage of a batch [`stage_as_is`] staged, here, in order.
pub fn sum_staged(pipeline: &Pipeline, staged: &Staged) -> Result<Vec<Sealed>, ZioError> {
    pipeline.counted(staged.0.iter().map(|block| sum(pipeline, block.clone())).collect())
}

/// A pointer that names only a block's first place and its size, for a block whose write
/// started but whose checksum stage then failed: it lets the sync free the place once the
/// write ends ([`Places`]' first copy), and is never linked into a tree or read through.
pub fn describe_place(staged: &Staged, i: usize, place: (u32, u64, u64)) -> BlockPointer {
    let block = &staged.0[i];
    let sealed = Sealed {
        props: block.props,
        logical: Arc::clone(&block.logical),
        stored: Arc::clone(&block.stored),
        compression: block.compression,
        checksum: Checksum::default(),
        sealing: None,
    };
    describe(&sealed, &[place])
}

/// The places allocated for a block: its first copy, then its ditto copies, each
/// `(vdev, offset, asize)`.
pub type Places = Vec<(u32, u64, u64)>;

/// Allocates `sealed`'s blocks in order (so a batch lands back to back), each's first copy
/// required and its other copies best effort, as ZFS's: a pool too full or too fragmented
/// for a ditto copy keeps the block's single copy.
pub fn allocate(
    pipeline: &Pipeline,
    allocator: &mut Allocator,
    sealed: &[Sealed],
    class: AllocClass,
) -> Result<Vec<Places>, ZioError> {
    let mut placed = Vec::with_capacity(sealed.len());
    // First copies in spans of up to a write's bytes, each in as few free ranges as it can
    // ([`Allocator::allocate_span`]).
    let psizes: Vec<u64> = sealed.iter().map(Sealed::psize).collect();
    for piece in crate::alloc::run_pieces(&psizes, WRITE_SPAN_BYTES_MAX) {
        for block in &sealed[piece.clone()] {
            pipeline.counted(pipeline.stage(Stage::Allocate, block.props.writer))?;
        }
        let span =
            allocator.allocate_span(&psizes[piece.clone()], class).map_err(|(i, source)| {
                let writer = sealed[piece.start + i].props.writer;
                pipeline.note_error(writer);
                ZioError::NoSpace { writer, cause: source }
            })?;
        placed.extend(span.into_iter().map(|at| vec![at]));
    }
    // Ditto copies after every first copy, so the first copies of a batch lie back to back.
    for (block, places) in sealed.iter().zip(&mut placed) {
        // An encrypted block's third DVA holds its salt and key family.
        let most = match block.props.crypt {
            PropsCrypt::Encrypt { .. } => sluice_format::ENCRYPTED_DVAS_MAX,
            _ => sluice_format::DVAS_MAX,
        };
        while places.len() < block.props.copies.min(most) {
            let others: Vec<(u32, u64)> = places.iter().map(|p| (p.0, p.1)).collect();
            match allocator.allocate_ditto(block.psize(), class, &others) {
                Ok(at) => places.push(at),
                Err(_) => break,
            }
        }
    }
    Ok(placed)
}

/// The ready stage: the pointer of `sealed` at `places` (first copy first), before it is
/// written.
pub fn describe(sealed: &Sealed, places: &[(u32, u64, u64)]) -> BlockPointer {
    let sector = u64::from(SECTOR_BYTES);
    let psize = sealed.psize();
    assert!(psize > 0 && psize % sector == 0, "stored blocks are whole sectors");
    assert!(!places.is_empty(), "a block has a first copy");
    let sectors = |bytes: u64| u32::try_from(bytes / sector).unwrap_or(u32::MAX);
    let mut dvas = [Dva::default(); sluice_format::DVAS_MAX];
    for (dva, &(vdev, offset, asize)) in dvas.iter_mut().zip(places) {
        assert!(offset % sector == 0, "blocks start on sector boundaries");
        assert!(asize >= psize, "a copy's place holds the stored bytes");
        *dva = Dva { vdev, asize_sectors: sectors(asize), offset_sectors: offset / sector };
    }
    let props = &sealed.props;
    BlockPointer {
        dvas,
        lsize_sectors: sectors((sealed.logical.len() as u64).div_ceil(sector) * sector),
        psize_sectors: sectors(psize),
        birth_txg: props.birth_txg,
        checksum_alg: props.checksum,
        compression: sealed.compression,
        kind: props.kind,
        level: props.level,
        fill: props.fill,
        checksum: sealed.checksum,
        dedup: props.dedup,
        crypt: match (props.crypt, sealed.sealing) {
            (PropsCrypt::Encrypt { family, .. }, Some(s)) => {
                BlockCrypt::Encrypted { family, salt: s.salt, iv: s.iv, mac: s.mac }
            }
            (PropsCrypt::Encrypt { .. }, None) => {
                unreachable!("a block to encrypt passed the encrypt stage unsealed (raw?)")
            }
            (PropsCrypt::ChildrenMac(hash), _) => BlockCrypt::ChildrenMac(hash),
            (PropsCrypt::None, _) => BlockCrypt::None,
        },
    }
}

/// How the issue stage writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Issue {
    pub class: IoClass,
    /// Flushed on every copy before answering (the intent log's writes:
    /// `Root::write_durable`).
    pub durable: bool,
}

impl Issue {
    /// A txg sync's write: flushed with the uberblock.
    pub const ASYNC: Issue = Issue { class: IoClass::AsyncWrite, durable: false };
}

/// The issue stage: writes `data` at `at` for blocks of `writer`.
pub async fn issue(
    pipeline: &Pipeline,
    root: &Root,
    writer: Writer,
    at: VdevAddress,
    data: SharedBuf,
    how: Issue,
) -> Result<(), ZioError> {
    pipeline.counted(pipeline.stage(Stage::Issue, writer))?;
    let bytes = u64::from(data.len_bytes());
    let written = if writer == Writer::LogChain {
        root.write_log(at, data, how.class, how.durable).await
    } else if how.durable {
        root.write_durable(at, data, how.class).await
    } else {
        root.write(at, data, how.class).await
    };
    pipeline.counted(written.map_err(|source| ZioError::Vdev { writer, cause: source }))?;
    pipeline.note_written(writer, bytes);
    Ok(())
}

/// Issues blocks whose places are allocated: each copy slot in runs of blocks back to back on
/// one vdev ([`span_runs`]), each run one vectored write of the blocks' own buffers, all runs
/// at once. Returns each run's blocks (indices into `sealed`) once all are written.
pub async fn issue_placed(
    pipeline: &Pipeline,
    root: &Root,
    sealed: &[Sealed],
    placed: &[Places],
    how: Issue,
) -> Result<(), ZioError> {
    let copies = placed.iter().map(Vec::len).max().unwrap_or(0);
    let mut writes = Vec::new();
    for copy in 0..copies {
        let blocks: Vec<usize> = (0..sealed.len()).filter(|&i| placed[i].len() > copy).collect();
        let at: Vec<(u32, u64, u64)> = blocks.iter().map(|&i| placed[i][copy]).collect();
        for run in span_runs(&at, root.write_span_bytes()) {
            let (vdev, _, _) = at[run.start];
            let writer = sealed[blocks[run.start]].props.writer;
            let run = run_blocks(&at, run, |j| &sealed[blocks[j]].stored);
            writes.push(issue_run(pipeline, root, writer, vdev, run, how));
        }
    }
    futures::future::try_join_all(writes).await.map(drop)
}

/// Runs of allocations `(vdev, offset, asize)` that lie back to back on one vdev, each within
/// `max_bytes` ([`Root::write_span_bytes`]) and [`crate::device::IOVECS_MAX`] blocks: what one
/// write issues
/// ([`Root::write_run`]: one I/O per leaf of a mirror, one per child of a RAID-Z vdev).
pub fn span_runs(placed: &[(u32, u64, u64)], max_bytes: u64) -> Vec<std::ops::Range<usize>> {
    let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
    for (i, &(vdev, offset, asize)) in placed.iter().enumerate() {
        if let Some(run) = runs.last_mut() {
            let (first_vdev, first_offset, _) = placed[run.start];
            let (_, last_offset, last_asize) = placed[run.end - 1];
            // At most IOVECS_MAX blocks: a run is one vectored write of the blocks' buffers.
            if vdev == first_vdev
                && offset == last_offset + last_asize
                && offset + asize - first_offset <= max_bytes
                && run.len() < crate::device::IOVECS_MAX
            {
                run.end = i + 1;
                continue;
            }
        }
        runs.push(i..i + 1);
    }
    runs
}

/// The blocks of one run of [`span_runs`], as [`Root::write_run`] takes them: each block's
/// (offset, allocated bytes, stored bytes).
pub fn run_blocks<'a>(
    placed: &[(u32, u64, u64)],
    run: std::ops::Range<usize>,
    bytes_of: impl Fn(usize) -> &'a Arc<AlignedBuf>,
) -> Vec<RunBlock> {
    run.map(|i| {
        let (_, offset, asize) = placed[i];
        RunBlock { offset, asize, data: Arc::clone(bytes_of(i)) }
    })
    .collect()
}

/// The issue stage for a run of blocks back to back on top-level vdev `vdev`.
pub async fn issue_run(
    pipeline: &Pipeline,
    root: &Root,
    writer: Writer,
    vdev: u32,
    blocks: Vec<RunBlock>,
    how: Issue,
) -> Result<(), ZioError> {
    pipeline.counted(pipeline.stage(Stage::Issue, writer))?;
    let bytes: u64 = blocks.iter().map(|block| block.data.len() as u64).sum();
    let written = root.write_run(vdev, blocks, how.class, how.durable).await;
    pipeline.counted(written.map_err(|source| ZioError::Vdev { writer, cause: source }))?;
    pipeline.note_written(writer, bytes);
    Ok(())
}

/// What a read returns: logical bytes (decompressed), or stored bytes as they are on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadMode {
    Logical,
    /// Stops after verify: scrub, resilver, healing and send move stored bytes as they are.
    Raw,
}

/// A read's issue and verify stages: the first copy of `bp` whose bytes match its checksum,
/// and the copies that failed before it (to be rewritten from it). Each copy is read through
/// its top-level vdev with the checksum as the verify callback, so a mirror tries its other
/// children, and rewrites the bad one, before a copy is given up on.
pub async fn read_stored(
    root: &Root,
    bp: &BlockPointer,
    class: IoClass,
) -> Result<(AlignedBuf, Vec<Dva>), VdevError> {
    let psize = u32::try_from(bp.psize_bytes()).unwrap_or(u32::MAX);
    let verify = |bytes: &[u8]| bp.verifies(bytes);
    let mut last = None;
    let mut bad = Vec::new();
    for dva in bp.copies() {
        let at = VdevAddress { vdev: dva.vdev, offset_bytes: dva.offset_bytes() };
        match root.read(at, psize, class, &verify).await {
            Ok(buf) => return Ok((buf, bad)),
            Err(error) => {
                // Bad or unreadable: either way a rewrite gives it back its bytes (a device
                // that is gone refuses the write, and nothing is lost).
                bad.push(*dva);
                last = Some(error);
            }
        }
    }
    Err(last.unwrap_or(VdevError::NoSuchVdev { vdev: u32::MAX, count: 0 }))
}

/// A read's decrypt and decompress stages: the logical bytes of a block whose stored bytes
/// passed its checksum.
pub fn unseal(
    keys: &crypt::Keystore,
    bp: &BlockPointer,
    mut stored: AlignedBuf,
) -> Result<AlignedBuf, UnsealError> {
    open_in_place(keys, bp, &mut stored)?;
    if bp.compression == BlockCompression::None {
        return Ok(stored);
    }
    let logical = compress::decompress(bp, &stored)?;
    check_children_mac(bp, &logical)?;
    Ok(logical)
}

/// [`unseal`] of stored bytes that stay where they are (in a fetched span, which the blocks of
/// one I/O and the reads a prefetch serves share): an encrypted block is decrypted straight
/// into a buffer of its own and a compressed one decompressed from them; only a block stored
/// plain is copied. Copying an encrypted block out of its span before decrypting it in place
/// was 16% of the server's CPU under uncached 1 MiB reads of an encrypted volume (perf,
/// 2026-12-04).
pub fn unseal_from(
    keys: &crypt::Keystore,
    bp: &BlockPointer,
    stored: &[u8],
) -> Result<AlignedBuf, UnsealError> {
    let opened = match sealed_with(keys, bp)? {
        Some((key, aad, sealing)) => {
            Some(key.open_to(stored, &aad, &sealing).map_err(UnsealError::from_crypt)?)
        }
        None => None,
    };
    let logical = if bp.compression == BlockCompression::None {
        opened.unwrap_or_else(|| AlignedBuf::copy_from(stored))
    } else {
        compress::decompress(bp, opened.as_deref().unwrap_or(stored))?
    };
    check_children_mac(bp, &logical)?;
    Ok(logical)
}

/// The decrypt stage alone, where the stored bytes lie (a span read of several blocks opens
/// each in the span's buffer, with no copy): decrypts an encrypted block in place (its tag
/// checked), and checks the children's MACs of an indirect block stored plain. `stored` stays
/// compressed if the block is; an indirect block stored compressed is checked once
/// decompressed ([`check_children_mac`]).
pub fn open_in_place(
    keys: &crypt::Keystore,
    bp: &BlockPointer,
    stored: &mut [u8],
) -> Result<(), UnsealError> {
    if bp.compression == BlockCompression::None {
        check_children_mac(bp, stored)?;
    }
    if let Some((key, aad, sealing)) = sealed_with(keys, bp)? {
        key.open(stored, &aad, &sealing).map_err(UnsealError::from_crypt)?;
    }
    Ok(())
}

/// An indirect block of an encrypted tree: its children must be the ones its parent hashed (a
/// child swapped for another, or for an older version of itself, is not). `logical` is the
/// block's pointers as they are decoded: decompressed, if it was stored compressed.
pub(crate) fn check_children_mac(bp: &BlockPointer, logical: &[u8]) -> Result<(), UnsealError> {
    if let BlockCrypt::ChildrenMac(hash) = bp.crypt {
        if crypt::children_mac_of_bytes(logical) != Some(hash) {
            return Err(UnsealError::Authentication);
        }
    }
    Ok(())
}

/// What opens an encrypted block: its family's key, the fields its MAC covers and its
/// sealing.
type Opening = (Arc<crypt::FamilyKey>, [u8; crypt::BLOCK_AAD_BYTES], crypt::Sealing);

/// What opens `bp`, or `None` for a block not encrypted.
fn sealed_with(keys: &crypt::Keystore, bp: &BlockPointer) -> Result<Option<Opening>, UnsealError> {
    let BlockCrypt::Encrypted { family, salt, iv, mac } = bp.crypt else { return Ok(None) };
    let key = keys.get(family).ok_or(UnsealError::KeyUnavailable { family })?;
    let aad = crypt::block_aad(
        family,
        bp.lsize_sectors,
        bp.psize_sectors,
        bp.compression,
        bp.kind,
        bp.level,
    );
    Ok(Some((key, aad, crypt::Sealing { salt, iv, mac })))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs join placements back to back on one vdev, within the span limit and at most
    /// IOVECS_MAX blocks each (one vectored write).
    #[test]
    fn span_runs_join_back_to_back_blocks_up_to_the_limits() {
        let placed: Vec<(u32, u64, u64)> = (0..2500u64).map(|i| (0, i * 512, 512)).collect();
        let runs = span_runs(&placed, WRITE_SPAN_BYTES_MAX);
        assert_eq!(runs.iter().map(|r| r.len()).collect::<Vec<_>>(), [1024, 1024, 452]);
        let mut gaps = vec![(0, 0, 4096), (0, 4096, 4096), (0, 16384, 4096), (1, 20480, 4096)];
        gaps.extend((0..300u64).map(|i| (1, 24576 + i * 4096, 4096)));
        let runs = span_runs(&gaps, WRITE_SPAN_BYTES_MAX);
        // A gap and a change of vdev end runs; 1 MiB ends one too (256 blocks of 4 KiB).
        assert_eq!(runs.iter().map(|r| r.len()).collect::<Vec<_>>(), [2, 1, 256, 45]);
    }

    fn block(len: usize, fill: u8) -> Arc<AlignedBuf> {
        Arc::new(AlignedBuf::copy_from(&vec![fill; len]))
    }

    /// [`unseal`] of a copy of `stored` (opened in place) and [`unseal_from`] (opened from
    /// where it lies), which must agree: the same bytes, or the same kind of error.
    fn unsealed(
        keys: &crypt::Keystore,
        bp: &BlockPointer,
        stored: &[u8],
    ) -> Result<AlignedBuf, UnsealError> {
        let in_place = unseal(keys, bp, AlignedBuf::copy_from(stored));
        let from = unseal_from(keys, bp, stored);
        match (&in_place, &from) {
            (Ok(a), Ok(b)) => assert_eq!(&a[..], &b[..], "the two ways read differently"),
            (Err(a), Err(b)) => assert_eq!(
                std::mem::discriminant(a),
                std::mem::discriminant(b),
                "the two ways fail differently: {a} against {b}"
            ),
            _ => panic!("one way read and the other did not: {in_place:?} against {from:?}"),
        }
        from
    }

    /// Seal pads to whole units, compresses what saves an eighth, and sums what is stored;
    /// the pointer it describes verifies those bytes.
    #[test]
    fn seal_pads_compresses_and_sums_what_is_stored() {
        let pipeline = Pipeline::default();
        let props = BlockProps::data(Writer::VolumeData, 7, Compression::Lz4);
        let sealed = seal(&pipeline, props, block(16384, 3), 4096, None).unwrap();
        assert_eq!(sealed.compression, BlockCompression::Lz4);
        assert_eq!(sealed.psize(), 4096);
        let bp = describe(&sealed, &[(0, 8192, 4096)]);
        assert!(bp.verifies(&sealed.stored));
        assert_eq!((bp.lsize_bytes(), bp.psize_bytes(), bp.birth_txg), (16384, 4096, 7));
        let keys = crypt::Keystore::default();
        assert_eq!(&unsealed(&keys, &bp, &sealed.stored).unwrap()[..], &sealed.logical[..]);
        // A space map piece: padded to its preallocated place, uncompressed.
        let props = BlockProps::metadata(Writer::SpaceMap, 7, 2);
        let sealed = seal(&pipeline, props, block(1000, 1), 4096, Some(16384)).unwrap();
        assert_eq!((sealed.psize(), sealed.compression), (16384, BlockCompression::None));
        let bp = describe(&sealed, &[(0, 0, 16384), (1, 0, 16384)]);
        assert_eq!((bp.lsize_bytes(), bp.copies().count()), (1024, 2));
        // Stored plain: read back whole, as stored (its padding too), both ways.
        let read = unsealed(&keys, &bp, &sealed.stored).unwrap();
        assert_eq!(&read[..], &sealed.stored[..]);
    }

    /// A block that carries the checksum taken as it arrived is stored with it when it is
    /// stored as it arrived; compressed, its stored bytes get their own.
    #[test]
    fn a_checksum_taken_on_arrival_is_used_only_for_the_same_bytes() {
        let pipeline = Pipeline::default();
        let arrived = |bytes: &[u8]| {
            let mut block = crate::device::UninitBuf::new(bytes.len());
            block.write_at(0, bytes);
            // SAFETY: every byte was written.
            unsafe { block.remember_xxh3() };
            // SAFETY: every byte was written.
            Arc::new(unsafe { block.assume_init() })
        };
        let mut rng = fastrand::Rng::with_seed(5);
        let random: Vec<u8> = (0..16384).map(|_| rng.u8(..)).collect();
        for compression in [Compression::Off, Compression::Lz4] {
            let props = BlockProps::data(Writer::VolumeData, 7, compression);
            let sealed = seal(&pipeline, props, arrived(&random), 4096, None).unwrap();
            assert!(Arc::ptr_eq(&sealed.stored, &sealed.logical), "{compression:?}: as it came");
            assert_eq!(Some(sealed.checksum), sealed.stored.xxh3());
            assert!(describe(&sealed, &[(0, 0, 16384)]).verifies(&sealed.stored));
        }
        let props = BlockProps::data(Writer::VolumeData, 7, Compression::Lz4);
        let sealed = seal(&pipeline, props, arrived(&[3; 16384]), 4096, None).unwrap();
        assert_eq!((sealed.compression, sealed.psize()), (BlockCompression::Lz4, 4096));
        assert_eq!(sealed.checksum, ChecksumAlg::Xxh3_128.compute(&sealed.stored));
        assert!(describe(&sealed, &[(0, 0, 4096)]).verifies(&sealed.stored));
    }

    /// A fault fails the next block of its writer at its stage, once, and is counted; other
    /// writers and stages pass.
    #[test]
    fn an_armed_fault_fails_one_block_of_its_writer_at_its_stage() {
        let pipeline = Pipeline::default();
        pipeline.arm_fault(Stage::Checksum, Writer::Deadlist);
        let props = BlockProps::metadata(Writer::Deadlist, 1, 1);
        let other = BlockProps::metadata(Writer::SpaceMap, 1, 1);
        assert!(seal(&pipeline, other, block(512, 0), 512, None).is_ok());
        let failed = pipeline.counted(seal(&pipeline, props, block(512, 0), 512, None));
        assert!(matches!(
            failed,
            Err(ZioError::Injected { stage: Stage::Checksum, writer: Writer::Deadlist })
        ));
        assert!(seal(&pipeline, props, block(512, 0), 512, None).is_ok(), "once");
        assert_eq!((pipeline.errors(Writer::Deadlist), pipeline.errors(Writer::SpaceMap)), (1, 0));
    }

    /// An encrypted data block: its stored bytes hold neither its data nor its compressed form,
    /// its pointer carries family, salt, nonce and tag and still verifies (a keyless checksum
    /// over the ciphertext), it reads back with its family's key loaded and not without, and
    /// a change its checksum does not catch (the checksum recomputed) fails authentication.
    #[test]
    fn encrypted_blocks_round_trip_and_fail_what_their_mac_does_not_cover() {
        let pipeline = Pipeline::default();
        let family = 0xfa17;
        let master = crypt::MasterKey::generate().unwrap();
        pipeline.keys().load(family, crypt::FamilyKey::new(master.clone()).unwrap());
        let pattern: Vec<u8> =
            b"a known pattern, repeated: ".iter().copied().cycle().take(16384).collect();
        let lz4 = lz4_flex::block::compress(&pattern);
        for compression in [Compression::Off, Compression::Lz4] {
            let mut props = BlockProps::data(Writer::VolumeData, 9, compression);
            props.crypt = PropsCrypt::Encrypt { family, convergent: false };
            let logical = Arc::new(AlignedBuf::copy_from(&pattern));
            let sealed = seal(&pipeline, props, Arc::clone(&logical), 4096, None).unwrap();
            let stored = &sealed.stored[..];
            let holds = |needle: &[u8]| stored.windows(needle.len()).any(|w| w == needle);
            assert!(!holds(&pattern[..64]), "{compression:?}: the data is in the clear");
            assert!(!holds(&lz4[8..72]), "{compression:?}: the compressed data is in the clear");
            assert_eq!(&sealed.logical[..], &pattern[..], "the cache keeps the plaintext");
            let bp = describe(&sealed, &[(0, 8192, sealed.psize())]);
            let bp = BlockPointer::decode(&BlockPointer::encode(Some(&bp))).unwrap().unwrap();
            assert!(matches!(bp.crypt, BlockCrypt::Encrypted { family: 0xfa17, .. }));
            assert!(bp.verifies(stored), "scrub verifies it without a key");
            let read = unsealed(pipeline.keys(), &bp, stored).unwrap();
            assert_eq!(&read[..pattern.len()], &pattern[..]);
            // Without the key: refused, not garbage.
            let keyless = crypt::Keystore::default();
            assert!(matches!(
                unsealed(&keyless, &bp, stored),
                Err(UnsealError::KeyUnavailable { family: 0xfa17 })
            ));
            // A changed byte whose checksum was recomputed (someone who can write the disk).
            let mut changed = AlignedBuf::copy_from(stored);
            changed[100] ^= 0x40;
            let forged = BlockPointer { checksum: bp.checksum_alg.compute(&changed), ..bp };
            assert!(forged.verifies(&changed));
            assert!(matches!(
                unsealed(pipeline.keys(), &forged, &changed),
                Err(UnsealError::Authentication)
            ));
            // The fields the MAC covers: ciphertext passed off as uncompressed (or compressed).
            let other = match bp.compression {
                BlockCompression::None => BlockCompression::Lz4,
                _ => BlockCompression::None,
            };
            let relabelled = BlockPointer { compression: other, ..bp };
            assert!(matches!(
                unsealed(pipeline.keys(), &relabelled, stored),
                Err(UnsealError::Authentication)
            ));
        }
        // Unloaded, the key seals nothing either.
        assert!(pipeline.keys().unload(family));
        let mut props = BlockProps::data(Writer::VolumeData, 9, Compression::Off);
        props.crypt = PropsCrypt::Encrypt { family, convergent: false };
        assert!(matches!(
            seal(&pipeline, props, block(16384, 1), 4096, None),
            Err(ZioError::KeyUnavailable { family: 0xfa17, .. })
        ));
    }

    /// An indirect block above encrypted blocks carries a hash of its children's MACs: a
    /// child pointer swapped for another valid one (an older version of the block, with its
    /// own good checksum and tag) fails the parent's check even when the indirect block's own
    /// checksum is recomputed; the block as written passes.
    #[test]
    fn a_swapped_child_fails_its_parents_children_mac() {
        let pipeline = Pipeline::default();
        let family = 0xfa17;
        pipeline
            .keys()
            .load(family, crypt::FamilyKey::new(crypt::MasterKey::generate().unwrap()).unwrap());
        let mut children = Vec::new();
        for version in 0..2u8 {
            let mut props =
                BlockProps::data(Writer::VolumeData, 5 + u64::from(version), Compression::Off);
            props.crypt = PropsCrypt::Encrypt { family, convergent: false };
            let sealed = seal(&pipeline, props, block(16384, version), 4096, None).unwrap();
            children
                .push(describe(&sealed, &[(0, 8192 * (1 + u64::from(version)), sealed.psize())]));
        }
        let (old, new) = (children[0], children[1]);
        let indirect = |child: &BlockPointer| {
            let mut bytes = AlignedBuf::zeroed(16384);
            bytes[..sluice_format::BLKPTR_BYTES]
                .copy_from_slice(&BlockPointer::encode(Some(child)));
            bytes
        };
        let written = indirect(&new);
        let mut props = BlockProps::indirect(1, 1, 6, 1, true);
        props.crypt = PropsCrypt::ChildrenMac(crypt::children_mac_of_bytes(&written).unwrap());
        let sealed = seal(&pipeline, props, Arc::new(written), 4096, None).unwrap();
        let bp = describe(&sealed, &[(0, 65536, sealed.psize())]);
        // Stored compressed (lz4, whatever the volume's compression), checked once decompressed.
        assert_eq!(bp.compression, BlockCompression::Lz4);
        assert_eq!(bp.psize_bytes(), 4096, "one pointer among holes fills one unit");
        assert!(unsealed(pipeline.keys(), &bp, &sealed.stored).is_ok(), "as written");
        // The older version put back in its slot (sealed as the parent's block would be, so
        // its stored bytes decompress), the parent's checksum recomputed to match; then a hole
        // put where the child was, stored compressed and plain.
        let forge = |logical: AlignedBuf, compress: bool| {
            let mut props = props;
            if !compress {
                props.compression = Compression::Off;
            }
            let sealed = seal(&pipeline, props, Arc::new(logical), 4096, None).unwrap();
            (describe(&sealed, &[(0, 65536, sealed.psize())]), sealed.stored)
        };
        for (logical, compress) in [
            (indirect(&old), true),
            (indirect(&old), false),
            (AlignedBuf::zeroed(16384), true),
            (AlignedBuf::zeroed(16384), false),
        ] {
            let (forged, stored) = forge(logical, compress);
            assert!(forged.verifies(&stored));
            assert_eq!(forged.compression == BlockCompression::Lz4, compress);
            assert!(matches!(
                unsealed(pipeline.keys(), &forged, &stored),
                Err(UnsealError::Authentication)
            ));
        }
    }
}
