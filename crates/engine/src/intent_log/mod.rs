//! The intent log's commit path (ZFS: `zil.c`; seed 004).
//!
//! Records (itxs) are appended with increasing sequence numbers. `commit(seq)` returns once
//! every record up to `seq` is durable. Records travel in log write blocks (lwbs): each lwb is
//! encoded with the address of its already-allocated successor, written at `LogWrite` priority,
//! and flushed: by each leaf right after its copy (a lone lwb, and every lwb on a mirror or
//! RAID-Z, where a plain write and a flush succeed when one child did), or, for several on a
//! single leaf, by one flush of that leaf once all are written. An lwb counts as durable only
//! once it and every earlier lwb are; waiters are woken lwb by lwb as that frontier advances.
//!
//! Three policies, all first-class:
//! - `Pipelined` (default, the seed's "after"): a committer with records not yet in an lwb
//!   issues one while others are in flight, so a stream of committers keeps many lwbs moving.
//!   When another lwb is in flight and the pending records do not fill a block, the open lwb
//!   waits up to `commit_timeout_pct` of the smoothed lwb latency for more records; a lone
//!   writer never waits. Without this wait every committer would send a one-record block and
//!   its flush (measured: -58% IOPS against batch on 8 HDDs).
//! - `Batch` (the seed's "before"): one batch in flight. It writes all its lwbs, flushes once,
//!   then wakes everyone; records arriving meanwhile wait for the next batch.
//! - `Auto`: groups. A group is every ready record (or its share, below), written in blocks sized
//!   to hold exactly what it carries, all on one top-level vdev, and made durable by one flush of
//!   that vdev. A vdev runs at most a few groups at once ([`GroupTuner`]: one on a rotational
//!   device, where each extra flush costs a rotation; two on a file, whose flushes do not overlap,
//!   the second starting only once it carries an even share of what is outstanding and never split
//!   over free slots; eight otherwise); a committer whose vdev is at its cap waits for a group to
//!   finish, unless every record it would carry is logged by pointer (their blocks are already
//!   being written, on a single leaf needing the group's flush anyway; such records go out as one
//!   group, however many blocks it takes). Records that find several slots free are spread evenly
//!   over them (over one slot per vdev on a file), so a burst uses the parallel flushes a device
//!   offers, and each group's last block allocates the next group's first block on the vdev with
//!   the fewest groups in flight. When a finishing group wakes writers, the next committer yields
//!   once first, so the next group carries the records they append instead of its own alone
//!   (without this, batches alternated between one record and all the others); a lone writer's
//!   committer does not, as nobody else appends.
//!
//! The reader ([`read_chain`]) walks the chain from its head. Each block is read through the
//! mirror with "decodes as the expected block" as the verify callback, so a damaged copy is
//! healed from another leg. The first block that is not the expected one (never written, stale,
//! torn) ends the log.
//!
//! Block sizes follow the workload, as ZFS sizes its lwbs: the successor's size is chosen when it
//! is allocated, from the largest of the last few lwbs and the records already waiting,
//! rounded up to a power of two between 4 KiB and the maximum. A record that does not fit the
//! block already allocated closes it as it is (possibly empty) and gets a larger successor.
//!
//! Each txg sync calls [`LogWriter::anchor`]: lwbs whose records all belong to synced txgs are
//! no longer needed, and the first lwb that is becomes the head recorded in the pool
//! directory. Records of synced txgs that were never issued are dropped
//! ([`LogWriter::synced`]), and their committers return: the txg made them durable. A chain
//! that no sync has anchored yet is not reachable after a crash, so the store syncs instead of
//! committing to it.
//!
//! Large writes are logged by pointer (ZFS's `WR_INDIRECT`): the store appends such a record
//! unfilled ([`LogWriter::append_unfilled`]), and a committer that needs it writes the block to
//! its final place and fills in the pointer ([`LogWriter::claim_unfilled`],
//! [`LogWriter::fill`]) before the lwb that carries it is built. The block's write is started
//! at once (on a single leaf unflushed; the lwb is written beside it, and once both have
//! completed each vdev either touched is flushed, ZFS's `zil_lwb_flush_vdevs`; on a mirror or
//! RAID-Z durably on every present child), so no committer is answered while a record points
//! at a block that might not be there. An lwb never carries a
//! record that is still unfilled: the chain waits for it, and records keep their order.
//!
//! After a failed log write the writer refuses commits (its chain has a hole; later blocks
//! would be unreachable) and the store falls back to txg syncs, then starts a new chain.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use futures::channel::oneshot;
use futures::future::{join_all, BoxFuture, Shared};
use parking_lot::Mutex;
use sluice_format::{
    BlockKind, BlockPointer, Checksum, ChecksumAlg, Dva, LogBlock, LogRecord, LogVerifier,
    RecordSeal, LOG_HEADER_BYTES, SECTOR_BYTES,
};

use crate::alloc::Allocator;
use crate::device::{AlignedBuf, SharedBuf};
use crate::pool::{Pool, PoolError};
use crate::tunables::IoClass;
use crate::vdev;
use crate::zio::crypt::FamilyKey;
use crate::zio::{Issue, Writer};

/// How a lone log block is written: written and flushed on every copy in one trip.
const LOG_DURABLE: Issue = Issue { class: IoClass::LogWrite, durable: true };
/// How a log block of a batch, or one beside indirect records' blocks on a single leaf, is
/// written: its top-level vdevs are flushed once after all.
const LOG_WRITE: Issue = Issue { class: IoClass::LogWrite, durable: false };

mod groups;
mod tuner;
pub use tuner::GroupTuner;

/// A log writer's counters and current choices (`pool iostat` shows them per pool).
#[derive(Clone, Copy, Debug)]
pub struct LogFigures {
    pub policy: CommitPolicy,
    pub lwbs_written: u64,
    /// Groups of lwbs written and flushed together (one lwb each under `Pipelined`).
    pub groups_written: u64,
    pub records_written: u64,
    /// Bytes written to lwbs, and bytes allocated for them (the rest of each block is left
    /// unwritten).
    pub block_bytes_written: u64,
    pub block_bytes_allocated: u64,
    pub groups_in_flight: u32,
    pub lwbs_in_flight: u32,
    /// `Auto`: how many groups may be in flight per top-level vdev (none before the first
    /// commit).
    pub group_cap_per_vdev: Option<u32>,
    /// Size of the block allocated for the next lwb.
    pub next_block_bytes: u32,
    /// Smoothed time from a group's (or lwb's) issue to its being durable, in nanoseconds;
    /// the commit timeout is a share of it.
    pub group_latency_nanos: u64,
}

/// How commits are grouped into log writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommitPolicy {
    /// Groups sized and paced by what the log measures (the default).
    Auto,
    Pipelined,
    Batch,
}

impl CommitPolicy {
    pub fn from_tunables(tunables: &crate::tunables::Tunables) -> CommitPolicy {
        match tunables.choice(crate::tunables::Tunable::IntentLogPolicy) {
            "batch" => CommitPolicy::Batch,
            "pipelined" => CommitPolicy::Pipelined,
            // The tunables accept only the listed choices; "auto" is the rest.
            _ => CommitPolicy::Auto,
        }
    }

    /// The policy's name, as `intent_log.policy` spells it.
    pub fn name(self) -> &'static str {
        match self {
            CommitPolicy::Auto => "auto",
            CommitPolicy::Pipelined => "pipelined",
            CommitPolicy::Batch => "batch",
        }
    }
}

/// Smallest log block.
pub const LOG_BLOCK_BYTES_MIN: u32 = 4096;
/// lwbs whose sizes choose the next one's.
const SIZE_HISTORY: usize = 8;

/// Where a log block lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogAddress {
    pub vdev: u32,
    pub offset_bytes: u64,
    /// The block's bytes: what is written and read.
    pub len_bytes: u32,
    /// What it allocates: `len_bytes` in whole sectors on a leaf or a mirror, with parity and
    /// padding on RAID-Z. What is claimed and freed.
    pub alloc_bytes: u64,
}

impl LogAddress {
    /// As a block pointer (the chain's `next` field and the directory's log head): address and
    /// size; the checksum is not used, since a log block is verified by its embedded checksum
    /// and verifier.
    pub fn pointer(self, txg: u64) -> BlockPointer {
        let sectors = self.len_bytes / SECTOR_BYTES;
        BlockPointer {
            dvas: [
                Dva {
                    vdev: self.vdev,
                    asize_sectors: u32::try_from(self.alloc_bytes / u64::from(SECTOR_BYTES))
                        .unwrap_or(u32::MAX),
                    offset_sectors: self.offset_bytes / u64::from(SECTOR_BYTES),
                },
                Dva::default(),
                Dva::default(),
            ],
            lsize_sectors: sectors,
            psize_sectors: sectors,
            birth_txg: txg,
            checksum_alg: ChecksumAlg::Xxh3_128,
            compression: sluice_format::BlockCompression::None,
            kind: BlockKind::Metadata,
            level: 0,
            fill: 1,
            checksum: Checksum::default(),
            dedup: None,
            crypt: sluice_format::BlockCrypt::None,
        }
    }

    pub fn from_pointer(bp: &BlockPointer) -> LogAddress {
        LogAddress {
            vdev: bp.dvas[0].vdev,
            offset_bytes: bp.dvas[0].offset_bytes(),
            len_bytes: u32::try_from(bp.psize_bytes()).unwrap_or(u32::MAX),
            // Pointers written before RAID-Z carry the block's size here, which was its
            // allocation.
            alloc_bytes: bp.dvas[0].asize_bytes(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    #[error(transparent)]
    Pool(#[from] PoolError),
    #[error(
        "log of volume {volume_id}: a log write or flush failed earlier; sync the txg instead"
    )]
    Failed { volume_id: u64 },
}

/// The write of an indirect record's block (or a receive's), once it has ended. Shared by the
/// lwb that carries the record and the sync that links the block.
pub type DataWrite = Shared<BoxFuture<'static, BlockWritten>>;

/// How a block's write ended.
#[derive(Clone, Debug)]
pub enum BlockWritten {
    Failed,
    /// Durable on every present copy (`Root::write_durable`'s rule), or written by a
    /// receive, whose sync flushes it.
    Flushed,
    /// Written without a flush on this leaf, a top-level vdev of its own from before the
    /// write to after it ([`vdev::Root::plain_leaf`]): the lwb carrying its record flushes
    /// that leaf, and a sync that links it flushes before its uberblock.
    Unflushed(Arc<vdev::Leaf>),
}

impl BlockWritten {
    /// Whether the block is where its pointer says.
    pub fn ok(&self) -> bool {
        !matches!(self, BlockWritten::Failed)
    }

    /// How a log write to top-level vdev `vdev` ended that succeeded or not (`ok`), written
    /// unflushed on `unflushed_on` (what [`vdev::Root::plain_leaf`] said before the write) or
    /// durably (none). Unflushed only where that one leaf took it whole: a vdev that became a
    /// mirror meanwhile (an attach, a replace, a spare) may have had the write from one child
    /// only, so the write fails and the commit falls back to a sync.
    pub fn after(pool: &Pool, vdev: u32, unflushed_on: Option<Arc<vdev::Leaf>>, ok: bool) -> Self {
        match unflushed_on {
            _ if !ok => BlockWritten::Failed,
            None => BlockWritten::Flushed,
            Some(leaf) => match pool.root().plain_leaf(vdev) {
                Some(now) if Arc::ptr_eq(&now, &leaf) => BlockWritten::Unflushed(leaf),
                _ => BlockWritten::Failed,
            },
        }
    }
}

/// An lwb ready to write: where, its sequence, its bytes, and the block writes of the
/// indirect records it carries.
struct Lwb {
    at: LogAddress,
    sequence: u64,
    /// Records it carries.
    records: u32,
    /// The encoded block, in the aligned buffer it is written from.
    bytes: SharedBuf,
    /// The data writes of its records logged by pointer, one per record: a run's records
    /// share one write, which `write_with_data` awaits once.
    writes: Vec<DataWrite>,
    /// `Auto`: when the group this lwb opens was formed (`None` for the rest).
    group_formed: Option<crate::rt::Time>,
}

#[derive(Debug)]
struct State {
    /// Whether the chain's records are sealed (an encrypted volume's).
    sealed: bool,
    /// Verifier of the next lwb to issue.
    verifier: LogVerifier,
    /// Where the next lwb goes (allocated when the previous one was issued).
    next_address: LogAddress,
    /// Records not yet in an lwb, in sequence order (appended at the back, taken from the front).
    pending: VecDeque<LogRecord>,
    /// Pending indirect records whose block pointer is not known yet (a subset of
    /// `pending`): no lwb takes them, or anything after them, until they are filled.
    unfilled: BTreeSet<u64>,
    /// Of `unfilled`, those a committer is filling now.
    filling: BTreeSet<u64>,
    /// The block writes filled records depend on, by record sequence.
    data_writes: BTreeMap<u64, DataWrite>,
    next_record: u64,
    /// Highest record sequence in each issued lwb, by lwb sequence.
    lwb_last_record: BTreeMap<u64, u64>,
    /// lwbs written and flushed, not yet contiguous with the durable frontier.
    done: BTreeSet<u64>,
    /// Every lwb up to here is durable.
    durable_lwb: u64,
    /// Every record up to here is durable in the log.
    durable_record: u64,
    /// Every record up to here belongs to a synced txg.
    synced_record: u64,
    /// The last record appended in each txg not yet synced.
    txg_last_record: BTreeMap<u64, u64>,
    /// lwbs issued and still needed (their txgs have not all synced), in chain order:
    /// (lwb sequence, address, highest txg of its records).
    live: VecDeque<(u64, LogAddress, u64)>,
    /// Bytes the last lwbs were asked to carry (pending when they were built), for sizing
    /// the next.
    recent_used: VecDeque<usize>,
    batch_in_flight: bool,
    /// `Auto`: when each group issued and not yet durable was formed and how many records it
    /// carries, by the top-level vdev it started on (oldest first).
    groups_on_vdev: Vec<Vec<(crate::rt::Time, usize)>>,
    /// `Auto`: records in those groups.
    records_in_groups: usize,
    /// `Auto`: a group finished and woke writers, which should append before the next group
    /// is built (the next committer yields once).
    gather: bool,
    /// `Auto`: smoothed bytes a group was asked to carry (header included), which sizes the
    /// block that will open the next group.
    group_demand: f64,
    /// `Auto`: smoothed records per group; near 1 when one writer commits at a time.
    group_records: f64,
    /// `Auto`: how many groups may be in flight.
    tuner: Option<GroupTuner>,
    /// The pool's top-level vdevs and log devices when `tuner` was made.
    tuned_for: (usize, usize),
    waiters: Vec<(u64, oneshot::Sender<()>)>,
    failed: bool,
    /// A synced txg recorded this chain's head: a crash now finds it.
    anchored: bool,
    /// lwbs issued and not yet written and flushed.
    in_flight: u32,
    /// When the oldest pending record arrived (the open lwb's age).
    open_since: Option<crate::rt::Time>,
    /// Smoothed time from an lwb's write to its flush completing, in nanoseconds.
    lwb_latency_ns: f64,
    /// Changes (writes and zeroes, [`LogWriter::note_change`]) appended since a client last
    /// committed (see [`LogWriter::wants_early`]).
    appended_since_commit: u64,
    /// Smoothed commits per appended change, over client commits: 1 when every write is
    /// followed by a flush, near 0 when writes stream without flushes.
    commit_density: f64,
}

impl State {
    /// Bytes `record` takes in this chain's blocks (more when they are sealed).
    fn record_len(&self, record: &LogRecord) -> usize {
        record.encoded_len_in(self.sealed)
    }

    /// The pending records an lwb may take now: those before the first unfilled one.
    fn ready(&self) -> impl Iterator<Item = &LogRecord> {
        self.pending.iter().take_while(|r| !self.unfilled.contains(&r.sequence()))
    }

    /// `Auto`: an even share of every record outstanding (in groups in flight, plus `ready`
    /// waiting) over `slots` groups.
    fn even_share(&self, ready: usize, slots: usize) -> usize {
        (self.records_in_groups + ready).div_ceil(slots.max(1)).max(1)
    }

    /// Until when the open lwb or group may wait for more records: `pct` percent of the
    /// smoothed lwb latency after its oldest record arrived.
    fn linger_deadline(&self, now: crate::rt::Time, pct: u64) -> crate::rt::Time {
        let timeout =
            std::time::Duration::from_nanos((self.lwb_latency_ns * pct as f64 / 100.0) as u64);
        self.open_since.unwrap_or(now).plus(timeout)
    }

    /// Remembers what a block or group was asked to carry, for sizing the next block.
    fn note_demand(&mut self, bytes: usize) {
        if self.recent_used.len() == SIZE_HISTORY {
            self.recent_used.pop_front();
        }
        self.recent_used.push_back(bytes);
    }
}

/// What a committer does next.
enum Step {
    /// Groups of lwbs, each written and flushed as one (one group unless `Auto`).
    Issue(Vec<Vec<Lwb>>),
    /// Let the writers a finished group woke append first (`Auto`).
    Yield,
    Linger(crate::rt::Time),
    Wait(oneshot::Receiver<()>),
}

/// One volume's log writer.
#[derive(Debug)]
pub struct LogWriter {
    /// The pool's name, for errors.
    pool: Arc<str>,
    policy: CommitPolicy,
    commit_timeout_pct: u64,
    max_block_bytes: u32,
    /// Log blocks are sized to what they must hold in whole 4 KiB units rather than in powers
    /// of two: on RAID-Z, where a block is written whole (its columns depend on its length),
    /// a power of two wrote up to twice the bytes its records needed, across more columns.
    tight_blocks: bool,
    chain: LogVerifier,
    /// The key family whose key seals this chain's records, 0 for none.
    key_family: u64,
    state: Mutex<State>,
    lwbs_written: crate::stats::Counter,
    /// Groups issued (each lwb is its own group unless `Auto` or `Batch`).
    groups_written: crate::stats::Counter,
    /// Records carried by the lwbs written.
    records_written: crate::stats::Counter,
    /// Bytes of the lwbs written, and of the blocks allocated for them.
    block_bytes_written: crate::stats::Counter,
    block_bytes_allocated: crate::stats::Counter,
    /// Set when a block was allocated on a vdev whose log region is nearly taken by log
    /// blocks (`Allocator::log_region_pressed`); the store starts a txg sync for it
    /// ([`LogWriter::take_space_low`]).
    space_low: std::sync::atomic::AtomicBool,
}

/// The records and sequence state a new chain takes over from a failed one.
#[derive(Debug)]
pub struct Handover {
    next_record: u64,
    covered: u64,
    txg_last_record: BTreeMap<u64, u64>,
    carried: VecDeque<LogRecord>,
    /// Carried records still unfilled (any filling of them was for the failed chain).
    unfilled: BTreeSet<u64>,
    data_writes: BTreeMap<u64, DataWrite>,
}

/// The head a synced txg records, and the blocks that txg no longer needs.
#[derive(Debug)]
pub struct Anchor {
    pub head: LogAddress,
    pub head_verifier: LogVerifier,
    pub freed: Vec<LogAddress>,
}

/// How a log chain writes: the pool's settings, with the largest block raised for a volume
/// whose block would not fit a copied record otherwise (`Zil::settings_for`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogSettings {
    pub policy: CommitPolicy,
    /// How long an open lwb may linger for more records, in percent of the smoothed lwb
    /// latency (`intent_log.commit_timeout_pct`).
    pub commit_timeout_pct: u64,
    /// The largest log block, a power of two of at least [`LOG_BLOCK_BYTES_MIN`].
    pub max_block_bytes: u32,
}

/// Whose chain a log writer writes: every block carries both, so a chain never continues
/// into another's blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChainOwner {
    /// Unique and nonzero: draw it from `Env::unique_rng`.
    pub chain_id: u64,
    pub volume_id: u64,
    /// The volume's key family, 0 if it is not encrypted: an encrypted volume's chain seals
    /// its records under that family's key (`LogBlock::encode_sealed_into`).
    pub key_family: u64,
}

impl LogWriter {
    /// Starts a chain: allocates its first block.
    pub fn new(
        pool: &str,
        allocator: &Mutex<Allocator>,
        settings: LogSettings,
        owner: ChainOwner,
    ) -> Result<LogWriter, PoolError> {
        let fresh = Handover {
            next_record: 1,
            covered: 0,
            txg_last_record: BTreeMap::new(),
            carried: VecDeque::new(),
            unfilled: BTreeSet::new(),
            data_writes: BTreeMap::new(),
        };
        LogWriter::continuing(pool, allocator, settings, owner, fresh)
    }

    /// The largest block this chain writes.
    pub fn max_block_bytes(&self) -> u32 {
        self.max_block_bytes
    }

    /// A new chain that takes over from a failed one (see [`LogWriter::hand_over`]).
    pub fn continuing(
        pool: &str,
        allocator: &Mutex<Allocator>,
        settings: LogSettings,
        owner: ChainOwner,
        handover: Handover,
    ) -> Result<LogWriter, PoolError> {
        let LogSettings { policy, commit_timeout_pct, max_block_bytes } = settings;
        let ChainOwner { chain_id, volume_id, key_family } = owner;
        assert!(chain_id != 0, "chain id 0 means no log");
        assert!(
            max_block_bytes.is_power_of_two() && max_block_bytes >= LOG_BLOCK_BYTES_MIN,
            "log block size {max_block_bytes}"
        );
        let head_bytes = LOG_BLOCK_BYTES_MIN.max(max_block_bytes / 8);
        let tight_blocks = allocator.lock().log_blocks_on_raidz();
        let head = allocate(pool, &mut allocator.lock(), head_bytes, None)?;
        let chain = LogVerifier { chain_id, volume_id, sequence: 1 };
        Ok(LogWriter {
            pool: Arc::from(pool),
            policy,
            commit_timeout_pct,
            max_block_bytes,
            tight_blocks,
            chain,
            key_family,
            lwbs_written: crate::stats::Counter::default(),
            groups_written: crate::stats::Counter::default(),
            records_written: crate::stats::Counter::default(),
            block_bytes_written: crate::stats::Counter::default(),
            block_bytes_allocated: crate::stats::Counter::default(),
            space_low: std::sync::atomic::AtomicBool::new(false),
            state: Mutex::new(State {
                sealed: key_family != 0,
                verifier: chain,
                next_address: head,
                open_since: None,
                pending: handover.carried,
                unfilled: handover.unfilled,
                filling: BTreeSet::new(),
                data_writes: handover.data_writes,
                next_record: handover.next_record,
                lwb_last_record: BTreeMap::new(),
                done: BTreeSet::new(),
                durable_lwb: 0,
                // Records before the carried ones that no txg covers yet (they were in failed
                // lwbs) become durable only through the txg map: a commit of them waits for
                // a sync, which the store performs while this chain is not anchored.
                durable_record: handover.covered,
                synced_record: handover.covered,
                txg_last_record: handover.txg_last_record,
                live: VecDeque::new(),
                recent_used: VecDeque::new(),
                batch_in_flight: false,
                groups_on_vdev: Vec::new(),
                records_in_groups: 0,
                gather: false,
                group_demand: 0.0,
                group_records: 0.0,
                tuner: None,
                tuned_for: (0, 0),
                waiters: Vec::new(),
                failed: false,
                anchored: false,
                in_flight: 0,
                lwb_latency_ns: 0.0,
                appended_since_commit: 0,
                commit_density: 0.0,
            }),
        })
    }

    /// The first block and its verifier: what a reader of a chain no sync has trimmed needs.
    pub fn head(&self) -> (LogAddress, LogVerifier) {
        let state = self.state.lock();
        match state.live.front() {
            Some(&(sequence, address, _)) => (address, LogVerifier { sequence, ..self.chain }),
            None => (state.next_address, state.verifier),
        }
    }

    pub fn chain_id(&self) -> u64 {
        self.chain.chain_id
    }

    /// Bytes the blocks this chain holds allocate: issued lwbs still needed, and the next one.
    pub fn held_bytes(&self) -> u64 {
        let state = self.state.lock();
        let live: u64 = state.live.iter().map(|(_, at, _)| at.alloc_bytes).sum();
        live + state.next_address.alloc_bytes
    }

    /// lwbs written so far.
    pub fn lwbs_written(&self) -> u64 {
        self.lwbs_written.get()
    }

    /// What the writer has written so far and what it chose: see [`LogFigures`].
    pub fn figures(&self) -> LogFigures {
        let state = self.state.lock();
        LogFigures {
            policy: self.policy,
            lwbs_written: self.lwbs_written.get(),
            groups_written: self.groups_written.get(),
            records_written: self.records_written.get(),
            block_bytes_written: self.block_bytes_written.get(),
            block_bytes_allocated: self.block_bytes_allocated.get(),
            // Each lwb is its own group when pipelined, and a batch is one group.
            groups_in_flight: match self.policy {
                CommitPolicy::Auto => state.groups_on_vdev.iter().map(|g| g.len() as u32).sum(),
                CommitPolicy::Pipelined => state.in_flight,
                CommitPolicy::Batch => u32::from(state.batch_in_flight),
            },
            lwbs_in_flight: state.in_flight,
            group_cap_per_vdev: state.tuner.as_ref().map(GroupTuner::cap),
            next_block_bytes: state.next_address.len_bytes,
            group_latency_nanos: state.lwb_latency_ns as u64,
        }
    }

    /// Appends a record (its sequence is assigned here) and returns the sequence. Records
    /// must be appended in txg order (the store appends under the lock that assigns txgs).
    pub fn append(&self, now: crate::rt::Time, record: impl FnOnce(u64) -> LogRecord) -> u64 {
        let mut state = self.state.lock();
        let sealed = state.sealed;
        Self::append_locked(&mut state, now, |sequence| {
            let record = record(sequence);
            self.assert_fits(&record, sealed);
            record
        })
    }

    /// A record no block of this chain can hold would never be written: every block sealed
    /// after it would go empty, each allocating its successor, until the log ran out of room.
    fn assert_fits(&self, record: &LogRecord, sealed: bool) {
        let bytes = LOG_HEADER_BYTES + record.encoded_len_in(sealed);
        assert!(
            bytes <= self.max_block_bytes as usize,
            "a log record of {bytes} bytes with its block's header, over the chain's largest \
             block ({} bytes)",
            self.max_block_bytes
        );
    }

    fn append_locked(
        state: &mut State,
        now: crate::rt::Time,
        record: impl FnOnce(u64) -> LogRecord,
    ) -> u64 {
        let sequence = state.next_record;
        state.next_record += 1;
        let record = record(sequence);
        let txg = record.txg();
        debug_assert!(
            state.txg_last_record.last_key_value().is_none_or(|(&t, _)| t <= txg),
            "records are appended in txg order"
        );
        state.txg_last_record.insert(txg, sequence);
        if state.pending.is_empty() {
            state.open_since = Some(now);
        }
        state.pending.push_back(record);
        sequence
    }

    /// Appends an indirect record whose block is not written yet; a committer fills it
    /// ([`LogWriter::claim_unfilled`], [`LogWriter::fill`]).
    pub fn append_unfilled(
        &self,
        now: crate::rt::Time,
        record: impl FnOnce(u64) -> LogRecord,
    ) -> u64 {
        // Marked unfilled under the same lock that makes it pending: between the two, a
        // committer on another core could take it into an lwb with no block pointer (seen
        // serving 1 MiB write+flush jobs from 4 connections on 2 cores).
        let mut state = self.state.lock();
        let sequence = Self::append_locked(&mut state, now, record);
        state.unfilled.insert(sequence);
        sequence
    }

    /// Takes the unfilled records up to `sequence` that no other committer is filling; the
    /// caller must [`LogWriter::fill`] each one.
    pub fn claim_unfilled(&self, sequence: u64) -> Vec<LogRecord> {
        let mut state = self.state.lock();
        let state = &mut *state;
        if state.unfilled.first().is_none_or(|&first| first > sequence) {
            return Vec::new();
        }
        let claimed: Vec<u64> = state
            .unfilled
            .range(..=sequence)
            .filter(|s| !state.filling.contains(s))
            .copied()
            .collect();
        state.filling.extend(claimed.iter().copied());
        // Each found by bisection (pending records are in sequence order), not by a pass over
        // every pending record: a stream's unfilled records are a few at the back of hundreds.
        claimed
            .iter()
            .map(|&sequence| {
                let at = state.pending.binary_search_by_key(&sequence, LogRecord::sequence);
                state.pending[at.expect("an unfilled record is pending")].clone()
            })
            .collect()
    }

    /// Gives claimed records back unfilled (the claimer failed); the next committer fills them.
    pub fn unclaim(&self, records: &[LogRecord]) {
        let waiters = {
            let mut state = self.state.lock();
            for record in records {
                state.filling.remove(&record.sequence());
            }
            std::mem::take(&mut state.waiters)
        };
        for (_, waiter) in waiters {
            let _ = waiter.send(());
        }
    }

    /// Completes a claimed record: `record` replaces it (an indirect record with its block
    /// pointer, or the data copied after all), and an lwb carrying it counts as durable only
    /// once `write` has completed and been flushed
    /// ([`LogWriter::write_with_data`]). Returns false if the record is gone (its txg synced
    /// meanwhile).
    pub fn fill(&self, record: LogRecord, write: Option<DataWrite>) -> bool {
        self.fill_all([(record, write)]) == 1
    }

    /// [`LogWriter::fill`] for many records under one hold of the lock, waking the committers
    /// behind them once: a 1 MiB write logged by pointer fills 64 records (16 KiB blocks), and
    /// one lock and one round of wake-ups per record was a cost per block of every large
    /// write. Returns how many of the records were still present.
    pub fn fill_all(
        &self,
        filled: impl IntoIterator<Item = (LogRecord, Option<DataWrite>)>,
    ) -> usize {
        let (present, waiters) = {
            let mut state = self.state.lock();
            let state = &mut *state;
            let mut present = 0;
            for (record, write) in filled {
                let sequence = record.sequence();
                self.assert_fits(&record, state.sealed);
                state.filling.remove(&sequence);
                if !state.unfilled.remove(&sequence) {
                    continue;
                }
                present += 1;
                // Pending records are in sequence order (appended at the back, taken from the
                // front), so the slot is found by bisection: a linear search was 8% of the
                // serving core while 1 MiB writes left a few hundred records pending (perf,
                // 2026-11-27).
                let at = state.pending.binary_search_by_key(&sequence, LogRecord::sequence);
                let slot = &mut state.pending[at.expect("an unfilled record is pending")];
                debug_assert_eq!(slot.txg(), record.txg(), "a fill keeps the record's txg");
                *slot = record;
                if let Some(write) = write {
                    state.data_writes.insert(sequence, write);
                }
            }
            (present, std::mem::take(&mut state.waiters))
        };
        // Committers waiting behind the records look again.
        for (_, waiter) in waiters {
            let _ = waiter.send(());
        }
        present
    }

    /// Counts one client change (a write or zero, however many records it took: a large
    /// write logged by pointer takes one per block) for [`LogWriter::wants_early`].
    pub fn note_change(&self) {
        self.state.lock().appended_since_commit += 1;
    }

    /// Takes back one [`LogWriter::note_change`]: that change was a part of a larger write
    /// whose payload is still arriving, which counts once, with its last part.
    pub fn note_part(&self) {
        let mut state = self.state.lock();
        state.appended_since_commit = state.appended_since_commit.saturating_sub(1);
    }

    /// Whether a block allocated since the last call found its vdev's log region nearly taken
    /// (clears the flag). Log blocks are held until two txgs after their records' txg has
    /// synced, so a txg that holds more than the region would put log blocks outside it,
    /// where a file leaf's extents may not have been written yet and each durable write
    /// would wait for the filesystem's journal: the store starts a sync instead.
    pub fn take_space_low(&self) -> bool {
        self.space_low.swap(false, std::sync::atomic::Ordering::Relaxed)
    }

    /// Counts a client's commit (a flush or FUA write, not an early one) for
    /// [`LogWriter::wants_early`].
    pub fn note_commit(&self) {
        let mut state = self.state.lock();
        if state.appended_since_commit > 0 {
            let density = 1.0 / state.appended_since_commit as f64;
            state.commit_density = state.commit_density * 0.875 + density * 0.125;
            state.appended_since_commit = 0;
        }
    }

    /// Whether the record just appended should go to the disk now, before any client asks
    /// (an early commit): when the volume's clients have committed after nearly every write
    /// lately (smoothed density at least one commit per two records, and at most two records
    /// since the last commit, so a switch to streaming writes stops it at once) and no lwb is
    /// in flight to group it with. A lone sync writer then finds its lwb already written,
    /// or on its way, when its flush arrives: the flush waits for the rest of one lwb's
    /// latency instead of all of it. Not under `Batch`, the seed's "before"; under `Auto`
    /// only while recent groups carried about one record each (a lone writer): with few
    /// groups in flight per device, an early group of one record would hold a slot while
    /// the other writers' records, arriving just after, wait for it (measured on a file leaf
    /// with one group per file, 8 write+flush clients: 8,663 / 9,481 IOPS with early commits,
    /// 10,367 / 10,914 without).
    /// Records logged by pointer are the exception: their blocks are already being written, so
    /// their committers never wait for a slot (see [`LogWriter::commit`]), and one
    /// large write is many of them (64 for 1 MiB of 16 KiB blocks), which would otherwise read
    /// as many writers. An early group of them does count against its vdev's cap while in
    /// flight, as any group does: a small record arriving meanwhile waits for it.
    pub fn wants_early(&self) -> bool {
        let state = self.state.lock();
        let pattern = self.policy != CommitPolicy::Batch
            && state.commit_density >= 0.5
            && (1..=2).contains(&state.appended_since_commit)
            && state.in_flight == 0
            && state.anchored
            && !state.failed;
        // Checked last: with at most two changes since the last commit, few records pend.
        pattern
            && (self.policy != CommitPolicy::Auto
                || state.group_records < 1.5
                || only_by_pointer(state.pending.iter()))
    }

    /// The last record appended so far (0: none).
    pub fn last_record(&self) -> u64 {
        self.state.lock().next_record - 1
    }

    /// Every record up to here is durable (in the log or through a synced txg).
    pub fn durable_record(&self) -> u64 {
        let state = self.state.lock();
        state.durable_record.max(state.synced_record)
    }

    /// Whether a synced txg recorded this chain, so its records survive a crash.
    pub fn anchored(&self) -> bool {
        self.state.lock().anchored
    }

    /// Whether a log write failed; commits are refused from then on.
    pub fn failed(&self) -> bool {
        self.state.lock().failed
    }

    /// For the directory of txg `txg`, which is being synced: the first block still needed
    /// once it is durable, and the blocks it no longer needs (to be freed in `txg`).
    pub fn anchor(&self, txg: u64) -> Anchor {
        let mut state = self.state.lock();
        let mut freed = Vec::new();
        while let Some(&(_, address, max_txg)) = state.live.front() {
            if max_txg > txg {
                break;
            }
            freed.push(address);
            state.live.pop_front();
        }
        let (head, head_verifier) = match state.live.front() {
            Some(&(sequence, address, _)) => (address, LogVerifier { sequence, ..self.chain }),
            None => (state.next_address, state.verifier),
        };
        Anchor { head, head_verifier, freed }
    }

    /// `txg` is durable, and recorded this chain's head if `anchored`: records of that txg
    /// and earlier need no log write any more, and their committers may return.
    pub fn synced(&self, txg: u64, anchored: bool) {
        let waiters = {
            let mut state = self.state.lock();
            state.anchored |= anchored;
            let mut covered = state.synced_record;
            while let Some((&t, &last)) = state.txg_last_record.first_key_value() {
                if t > txg {
                    break;
                }
                covered = covered.max(last);
                state.txg_last_record.pop_first();
            }
            state.synced_record = covered;
            while state.pending.front().is_some_and(|r| r.txg() <= txg) {
                state.pending.pop_front();
            }
            // Unfilled records dropped with them need no block any more; a committer filling
            // one finds it gone (`fill` returns false), and the sync frees its block.
            let floor = state.pending.front().map_or(u64::MAX, LogRecord::sequence);
            state.unfilled = state.unfilled.split_off(&floor);
            state.filling = state.filling.split_off(&floor);
            state.data_writes = state.data_writes.split_off(&floor);
            if state.pending.is_empty() {
                state.open_since = None;
            }
            std::mem::take(&mut state.waiters)
        };
        for (_, waiter) in waiters {
            let _ = waiter.send(());
        }
    }

    /// Refuses every commit from now on and wakes those waiting: the store was suspended,
    /// so no sync will make the records they wait for durable, nor fill them.
    pub fn fail(&self) {
        let waiters = {
            let mut state = self.state.lock();
            state.failed = true;
            std::mem::take(&mut state.waiters)
        };
        for (_, waiter) in waiters {
            let _ = waiter.send(());
        }
    }

    /// Every block this chain holds (issued and still needed, plus the allocated successor),
    /// for freeing when the chain is retired. The writer must not be used afterwards.
    pub fn retire(&self) -> Vec<LogAddress> {
        let (blocks, waiters) = {
            let mut state = self.state.lock();
            state.failed = true;
            let mut blocks: Vec<LogAddress> = state.live.drain(..).map(|(_, a, _)| a).collect();
            blocks.push(state.next_address);
            (blocks, std::mem::take(&mut state.waiters))
        };
        // Committers waiting on this chain (for records [`LogWriter::hand_over`] carried to
        // its successor) would otherwise wait for ever: woken, they find it failed and fall
        // back to a txg sync, which covers their records.
        for (_, waiter) in waiters {
            let _ = waiter.send(());
        }
        blocks
    }

    /// What a chain taking over from this failed one needs, after txg `txg` synced: records
    /// not yet issued (older ones are covered by the txg), the next sequence, the sequence
    /// every txg-synced record is at or below, and the last record of each later txg.
    pub fn hand_over(&self, txg: u64) -> Handover {
        let mut state = self.state.lock();
        let carried: VecDeque<LogRecord> =
            state.pending.drain(..).filter(|r| r.txg() > txg).collect();
        let kept = |s: &u64| carried.iter().any(|r| r.sequence() == *s);
        let unfilled = std::mem::take(&mut state.unfilled).into_iter().filter(kept).collect();
        state.filling.clear();
        let data_writes =
            std::mem::take(&mut state.data_writes).into_iter().filter(|(s, _)| kept(s)).collect();
        Handover {
            next_record: state.next_record,
            covered: state.synced_record,
            txg_last_record: state.txg_last_record.split_off(&(txg + 1)),
            carried,
            unfilled,
            data_writes,
        }
    }

    /// Returns once every record up to `sequence` is durable.
    pub async fn commit(
        &self,
        pool: &Pool,
        allocator: &Mutex<Allocator>,
        sequence: u64,
    ) -> Result<(), LogError> {
        // An encrypted volume's records are sealed as their lwbs are built: without its key
        // (unloaded since they were appended) nothing can be written, and the commit falls
        // back to a txg sync, which is refused the same way.
        let key = match self.key_family {
            0 => None,
            family => Some(pool.zio().keys().get(family).ok_or_else(|| {
                LogError::Pool(PoolError::KeyUnavailable {
                    pool: self.pool.to_string(),
                    block: format!("the intent log of volume {}", self.chain.volume_id),
                    family,
                })
            })?),
        };
        let mut yielded = false;
        loop {
            // Decide under the lock; wait or write outside it.
            let step = {
                let mut state = self.state.lock();
                if state.durable_record.max(state.synced_record) >= sequence {
                    return Ok(());
                }
                if state.failed {
                    return Err(LogError::Failed { volume_id: self.chain.volume_id });
                }
                // An unfilled record at the front holds the chain until its committer fills it
                // (`fill` wakes the waiters).
                let mine_pending = state.pending.front().is_some_and(|r| {
                    r.sequence() <= sequence && !state.unfilled.contains(&r.sequence())
                });
                let now = pool.env().now();
                let (may_issue, linger_until) = match self.policy {
                    CommitPolicy::Pipelined => {
                        let pending_bytes: usize =
                            state.pending.iter().map(|r| state.record_len(r)).sum();
                        let full = LOG_HEADER_BYTES + pending_bytes
                            >= state.next_address.len_bytes as usize;
                        let deadline = state.linger_deadline(now, self.commit_timeout_pct);
                        let lone = state.in_flight == 0;
                        let issue_now = mine_pending && (lone || full || now >= deadline);
                        (issue_now, (mine_pending && !issue_now).then_some(deadline))
                    }
                    CommitPolicy::Batch => (mine_pending && !state.batch_in_flight, None),
                    CommitPolicy::Auto => {
                        // Measured again when the pool gains a top-level vdev (`pool add`)
                        // or loses a log device (`pool remove`).
                        let shape = {
                            let config = pool.config();
                            (config.top.len(), config.top.iter().filter(|t| t.log).count())
                        };
                        if state.tuner.is_none() || state.tuned_for != shape {
                            state.tuner = Some(GroupTuner::for_pool(pool));
                            state.tuned_for = shape;
                            let vdevs = shape.0.max(state.groups_on_vdev.len());
                            state.groups_on_vdev.resize(vdevs, Vec::new());
                        }
                        let cap = state.tuner.as_ref().map_or(1, GroupTuner::cap);
                        let home = state.next_address.vdev as usize;
                        // Records logged by pointer have their blocks on the way to the disk
                        // already: a group of only those goes at once, with its blocks, rather
                        // than add a slot's wait to writes in flight (measured on a file leaf
                        // when each block write had a flush of its own, 1 MiB write + flush at
                        // 4 clients: 7% behind pipelined with the cap applied to them).
                        let by_pointer = only_by_pointer(state.ready());
                        // Records this commit needs that another committer is filling (a
                        // large write's parts filled early on the other core): a group of
                        // the ready ones alone would cost a device flush of its own and still
                        // leave this commit waiting for the next, so it waits for the fill
                        // (which wakes it) and goes as one group with them.
                        let others_filling =
                            by_pointer && state.filling.range(..=sequence).next().is_some();
                        let free = by_pointer
                            || state
                                .groups_on_vdev
                                .get(home)
                                .is_none_or(|g| (g.len() as u32) < cap);
                        // Near saturation (three quarters of the slots taken) a slot is worth
                        // more than a few microseconds: a group smaller than an even share of
                        // what is outstanding waits for more records, up to the commit
                        // timeout, instead of taking one of the last slots for a flush that
                        // carries one record while the next ones pile up behind it.
                        let slots = state.tuner.as_ref().map_or(1, GroupTuner::slots);
                        let groups: usize = state.groups_on_vdev.iter().map(Vec::len).sum();
                        let ready = state.ready().count();
                        let even = state.even_share(ready, slots);
                        let may = mine_pending && free && !others_filling;
                        let beside = state.groups_on_vdev.get(home).is_some_and(|g| !g.is_empty());
                        if state.tuner.as_ref().is_some_and(GroupTuner::waits_for_share) && beside {
                            // Waits for the group in flight, or for a committer that finds an
                            // even share ready.
                            (may && (by_pointer || ready >= even), None)
                        } else {
                            let busy = groups * 4 >= slots * 3 && groups > 0;
                            let deadline = state.linger_deadline(now, self.commit_timeout_pct);
                            let issue_now = !busy || by_pointer || ready >= even || now >= deadline;
                            (may && issue_now, (may && !issue_now).then_some(deadline))
                        }
                    }
                };
                if let Some(deadline) = linger_until {
                    Step::Linger(deadline)
                } else if may_issue && state.gather && !yielded && state.group_records >= 1.5 {
                    // A group just finished while others waited for a slot: the writers it
                    // woke append their next records first, so the next group carries them
                    // all instead of this committer's record alone. Not for a lone writer
                    // (groups of about one record): nobody else will append, and the yield
                    // only holds its block back behind the reply to its write (measured on a
                    // file leaf, 1 write + flush client: 5% behind pipelined with the yield).
                    yielded = true;
                    Step::Yield
                } else if may_issue {
                    let built = match self.policy {
                        CommitPolicy::Auto => {
                            let tuner = state.tuner.clone().expect("auto's tuner is set above");
                            state.gather = false;
                            self.build_groups(&mut state, allocator, key.as_deref(), &tuner, now)
                        }
                        CommitPolicy::Batch => {
                            state.batch_in_flight = true;
                            self.build_lwbs(&mut state, allocator, key.as_deref())
                                .map(|lwbs| vec![lwbs])
                        }
                        CommitPolicy::Pipelined => self
                            .build_lwbs(&mut state, allocator, key.as_deref())
                            .map(|lwbs| vec![lwbs]),
                    };
                    match built {
                        Ok(groups) => Step::Issue(groups),
                        Err(error) => {
                            state.failed = true;
                            state.batch_in_flight = false;
                            let waiters = std::mem::take(&mut state.waiters);
                            drop(state);
                            for (_, waiter) in waiters {
                                let _ = waiter.send(());
                            }
                            return Err(error.into());
                        }
                    }
                } else {
                    let (tx, rx) = oneshot::channel();
                    state.waiters.push((sequence, tx));
                    Step::Wait(rx)
                }
            };
            match step {
                // Groups formed together are written at once; each advances the frontier as
                // it completes.
                Step::Issue(mut groups) if groups.len() == 1 => {
                    self.issue(pool, groups.pop().unwrap_or_default()).await?
                }
                Step::Issue(groups) => {
                    let issued = join_all(groups.into_iter().map(|lwbs| self.issue(pool, lwbs)));
                    issued.await.into_iter().collect::<Result<(), LogError>>()?
                }
                Step::Yield => crate::rt::yield_now().await,
                // The open lwb waits a little for more records (commit timeout).
                Step::Linger(deadline) => pool.env().sleep_until(deadline).await,
                // Woken when the frontier moves (or a batch ends); then look again.
                Step::Wait(rx) => drop(rx.await),
            }
        }
    }

    /// The size of the next lwb: the largest of the recent ones and of what is waiting,
    /// rounded up to a power of two (to whole 4 KiB units with `tight_blocks`).
    fn next_block_bytes(&self, state: &State) -> u32 {
        let waiting =
            LOG_HEADER_BYTES + state.pending.iter().map(|r| state.record_len(r)).sum::<usize>();
        let recent = state.recent_used.iter().copied().max().unwrap_or(0);
        let want = waiting.max(recent).min(self.max_block_bytes as usize);
        let rounded = if self.tight_blocks {
            want.next_multiple_of(LOG_BLOCK_BYTES_MIN as usize)
        } else {
            want.next_power_of_two()
        };
        (rounded as u32).clamp(LOG_BLOCK_BYTES_MIN, self.max_block_bytes)
    }

    /// Takes pending records into lwbs: one for `Pipelined`, all of them for `Batch`. Each
    /// lwb's successor is allocated here, before the lwb is written.
    fn build_lwbs(
        &self,
        state: &mut State,
        allocator: &Mutex<Allocator>,
        key: Option<&FamilyKey>,
    ) -> Result<Vec<Lwb>, PoolError> {
        let mut lwbs = Vec::new();
        while state.ready().next().is_some() {
            let capacity = state.next_address.len_bytes as usize;
            // What this lwb was asked to carry, not what fit: sizing from what fit would keep
            // a block that holds one record at that size forever.
            let demand =
                LOG_HEADER_BYTES + state.pending.iter().map(|r| state.record_len(r)).sum::<usize>();
            let (records, used) = take_records(state, capacity, usize::MAX);
            let last = records.last().map_or(0, LogRecord::sequence);
            state.note_demand(demand.max(used));
            let successor_bytes = self.next_block_bytes(state);
            lwbs.push(self.seal(state, allocator, key, records, successor_bytes, None)?);
            if self.policy == CommitPolicy::Pipelined && last != 0 {
                break;
            }
        }
        // Records left behind open a new lwb now.
        state.open_since = if state.pending.is_empty() { None } else { state.open_since };
        Ok(lwbs)
    }

    /// Encodes `records` as the next lwb, allocating its successor of `successor_bytes`.
    fn seal(
        &self,
        state: &mut State,
        allocator: &Mutex<Allocator>,
        key: Option<&FamilyKey>,
        records: Vec<LogRecord>,
        successor_bytes: u32,
        near: Option<u32>,
    ) -> Result<Lwb, PoolError> {
        let capacity = state.next_address.len_bytes as usize;
        let last = records.last().map_or(0, LogRecord::sequence);
        let count = records.len() as u32;
        let writes: Vec<DataWrite> =
            records.iter().filter_map(|r| state.data_writes.remove(&r.sequence())).collect();
        let txg = records.iter().map(LogRecord::txg).max().unwrap_or(0);
        // The successor must hold at least the next record waiting, if one is.
        let least = state.pending.front().map_or(0, |r| LOG_HEADER_BYTES + state.record_len(r));
        let (successor, whole) = {
            let mut allocator = allocator.lock();
            let successor =
                allocate_fitting(&self.pool, &mut allocator, successor_bytes, least, near)?;
            if allocator.log_region_pressed(successor.vdev) {
                self.space_low.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            (successor, allocator.log_written_whole(state.next_address.vdev))
        };
        let block = LogBlock {
            verifier: state.verifier,
            next: Some(successor.pointer(txg)),
            records,
            seals: Vec::new(),
        };
        let format_error =
            |source| PoolError::Format { pool: self.pool.to_string(), cause: source };
        let gather =
            |len, pieces: &[(usize, &[u8])]| AlignedBuf::gathered(len, pieces.iter().copied());
        let encoded = match key {
            None => block.encode_into(capacity, gather).map_err(format_error)?,
            // Each record's payload is encrypted where the encoding put it: the copy into the
            // block's buffer is the only one, sealed or not.
            Some(key) => block
                .encode_sealed_into(capacity, gather, |aad, payload| {
                    let sealing = key.seal(payload, aad, false)?;
                    Ok(RecordSeal { salt: sealing.salt, iv: sealing.iv, mac: sealing.mac })
                })
                .map_err(format_error)?
                .map_err(|cause| PoolError::Crypt {
                    pool: self.pool.to_string(),
                    block: format!(
                        "log block {} of volume {}",
                        block.verifier.sequence, self.chain.volume_id
                    ),
                    cause,
                })?,
        };
        // A chain is read a block's full size at a time, and a striped RAID-Z block's columns
        // depend on its length: there it is written whole (OpenZFS does not shrink log writes
        // on RAID-Z either). Elsewhere, log blocks laid out as copies on RAID-Z included, only
        // the sectors that hold something are written.
        let bytes = if whole && encoded.len() < capacity {
            AlignedBuf::gathered(capacity, [(0, &encoded[..])]).into_shared()
        } else {
            encoded.into_shared()
        };
        let here = state.next_address;
        state.lwb_last_record.insert(state.verifier.sequence, last);
        state.live.push_back((state.verifier.sequence, here, txg));
        let lwb = Lwb {
            at: here,
            sequence: state.verifier.sequence,
            records: count,
            bytes,
            writes,
            group_formed: None,
        };
        state.verifier = state.verifier.next();
        state.next_address = successor;
        state.in_flight += 1;
        Ok(lwb)
    }

    /// Writes lwbs that carry indirect records, beside their records' blocks (those writes
    /// started when the records were filled). On a top-level vdev that is a single leaf both
    /// go unflushed, and once every write has completed each leaf written so is flushed, all
    /// at once (ZFS: `zil_lwb_flush_vdevs`): one flush per vdev covers a large write and its
    /// records, where a durable write per block run and one for the lwb took about five device
    /// flushes per MiB on an aged pool (bench/per-op.sh syncwrite-1m). On a mirror or RAID-Z
    /// vdev the blocks and the lwbs are written durably on every present child instead
    /// ([`vdev::Root::plain_leaf`] says why). Which leaves to flush comes from how each
    /// write ended ([`BlockWritten`]), not from the tree now: a leaf that became a mirror
    /// meanwhile (an attach, a replace, a spare) is still flushed as the leaf that took the
    /// write, and an lwb written unflushed on a vdev that is no longer a single leaf fails
    /// the commit (the store falls back to a sync). A crash before the flush may keep an lwb
    /// whose blocks did not reach the disk; no committer was answered, and the claim ends the
    /// chain at the first record whose block does not match its pointer. False if a write or
    /// a flush failed: a failed block write fails the lwb like a failed lwb write, and the
    /// store falls back to a txg sync, which writes the block again.
    async fn write_with_data(&self, pool: &Pool, lwbs: &[&Lwb], one_by_one: bool) -> bool {
        let mut data_writes: Vec<DataWrite> =
            lwbs.iter().flat_map(|lwb| lwb.writes.iter().cloned()).collect();
        // The records of one run of blocks share its write (a record per block), and may end
        // one lwb and begin the next: each write is awaited once.
        data_writes.dedup_by(|a, b| a.ptr_eq(b));
        let data_writes = join_all(data_writes);
        let lwb_writes = join_all(lwbs.iter().map(|&lwb| async move {
            let data = lwb.bytes.clone();
            let dva = vdev::VdevAddress { vdev: lwb.at.vdev, offset_bytes: lwb.at.offset_bytes };
            let leaf = pool.root().plain_leaf(lwb.at.vdev);
            let how = if leaf.is_some() { LOG_WRITE } else { LOG_DURABLE };
            let ok = pool.issue(Writer::LogChain, dva, data, how).await.is_ok();
            BlockWritten::after(pool, lwb.at.vdev, leaf, ok)
        }));
        let (data, written) = futures::future::join(data_writes, lwb_writes).await;
        if !data.iter().chain(&written).all(BlockWritten::ok) {
            return false;
        }
        let mut leaves: Vec<Arc<vdev::Leaf>> = Vec::new();
        for write in data.into_iter().chain(written) {
            if let BlockWritten::Unflushed(leaf) = write {
                if !leaves.iter().any(|l| Arc::ptr_eq(l, &leaf)) {
                    leaves.push(leaf);
                }
            }
        }
        // The leaves that took the writes, however the tree has changed since.
        if one_by_one {
            let mut flushed = true;
            for leaf in &leaves {
                flushed &= leaf.flush().await.is_ok();
            }
            return flushed;
        }
        let flushes = leaves.iter().map(|leaf| leaf.flush());
        join_all(flushes).await.into_iter().all(|r| r.is_ok())
    }

    /// Writes lwbs, flushes what they touched, and advances the durable frontier.
    async fn issue(&self, pool: &Pool, lwbs: Vec<Lwb>) -> Result<(), LogError> {
        let started = pool.env().now();
        self.lwbs_written.add(lwbs.len() as u64);
        self.groups_written.inc();
        for lwb in &lwbs {
            self.records_written.add(u64::from(lwb.records));
            self.block_bytes_written.add(lwb.bytes.len() as u64);
            self.block_bytes_allocated.add(lwb.at.alloc_bytes);
        }
        // A lone lwb (always, when pipelined) is written and flushed by each leaf in one trip
        // (docs/design.md: 1 job +13%). Several (a batch) are all written first, then the
        // top-level vdevs they touched are flushed once. Lwbs carrying indirect records are
        // written beside those records' blocks, and on a single leaf flushed with them
        // ([`LogWriter::write_with_data`]).
        let ok = if let ([lwb], true) = (&lwbs[..], lwbs.iter().all(|lwb| lwb.writes.is_empty())) {
            let dva = vdev::VdevAddress { vdev: lwb.at.vdev, offset_bytes: lwb.at.offset_bytes };
            let data = lwb.bytes.clone();
            pool.issue(Writer::LogChain, dva, data, LOG_DURABLE).await.is_ok()
        } else if self.policy == CommitPolicy::Auto {
            self.write_group(pool, &lwbs).await
        } else {
            // A batch flushes its vdevs one after another (the seed's "before").
            let all: Vec<&Lwb> = lwbs.iter().collect();
            self.write_with_data(pool, &all, self.policy == CommitPolicy::Batch).await
        };
        let waiters = {
            let mut state = self.state.lock();
            if !ok {
                state.failed = true;
            }
            let took = pool.env().now().since(started).as_nanos() as f64;
            state.lwb_latency_ns = if state.lwb_latency_ns == 0.0 {
                took
            } else {
                state.lwb_latency_ns * 0.875 + took * 0.125
            };
            state.in_flight = state.in_flight.saturating_sub(lwbs.len() as u32);
            if ok {
                // A failed lwb never joins the frontier: nothing after it counts as durable.
                for lwb in &lwbs {
                    state.done.insert(lwb.sequence);
                }
            }
            loop {
                let next = state.durable_lwb + 1;
                if !state.done.remove(&next) {
                    break;
                }
                state.durable_lwb = next;
                let last = state.lwb_last_record.remove(&next).unwrap_or(0);
                debug_assert!(
                    last >= state.durable_record || last == 0,
                    "records become durable in order"
                );
                state.durable_record = state.durable_record.max(last);
            }
            state.batch_in_flight = false;
            if self.policy == CommitPolicy::Auto {
                if let Some(first) = lwbs.first() {
                    let formed = first.group_formed.expect("a group's first lwb knows its start");
                    let records: usize = lwbs.iter().map(|l| l.records as usize).sum();
                    state.records_in_groups -= records;
                    let on_vdev = &mut state.groups_on_vdev[first.at.vdev as usize];
                    let at = on_vdev.iter().position(|&(t, _)| t == formed);
                    let at = at.expect("a group ends on the vdev it started on");
                    on_vdev.remove(at);
                }
                // The writers woken below append again; the next group should carry them.
                state.gather |= !state.waiters.is_empty();
            }
            // Everyone looks again: satisfied waiters return, others may issue the next lwb.
            std::mem::take(&mut state.waiters)
        };
        for (_, waiter) in waiters {
            let _ = waiter.send(());
        }
        if ok {
            Ok(())
        } else {
            Err(LogError::Failed { volume_id: self.chain.volume_id })
        }
    }
}

/// Whether `records` are some, and all logged by pointer (indirect records).
fn only_by_pointer<'a>(mut records: impl Iterator<Item = &'a LogRecord>) -> bool {
    let mut any = false;
    records.all(|r| {
        any = true;
        matches!(r, LogRecord::WriteIndirect { .. })
    }) && any
}

/// Takes pending records in order into a block of `capacity` bytes: at most `max` of them,
/// stopping before one that does not fit (it stays for the next block, which is sized to
/// hold it) or is still unfilled. Returns them and the bytes they use, header included.
fn take_records(state: &mut State, capacity: usize, max: usize) -> (Vec<LogRecord>, usize) {
    let mut records = Vec::new();
    let mut used = LOG_HEADER_BYTES;
    while records.len() < max {
        let Some(record) = state.pending.front() else { break };
        let len = state.record_len(record);
        if used + len > capacity || state.unfilled.contains(&record.sequence()) {
            break;
        }
        used += len;
        if let Some(record) = state.pending.pop_front() {
            records.push(record);
        }
    }
    (records, used)
}

fn allocate(
    pool: &str,
    allocator: &mut Allocator,
    block_bytes: u32,
    near: Option<u32>,
) -> Result<LogAddress, PoolError> {
    let (vdev, offset_bytes, alloc_bytes) = allocator
        .allocate_log_near(u64::from(block_bytes), near)
        .map_err(|source| PoolError::NoSpace { pool: pool.to_owned(), cause: source })?;
    Ok(LogAddress { vdev, offset_bytes, len_bytes: block_bytes, alloc_bytes })
}

/// Allocates a log block of `block_bytes`, or, where no free range is that long (a pool
/// whose free space is all in small holes), the largest of its halves that one is, down to
/// what holds `least_bytes` (the next record). A chain whose block cannot be allocated fails,
/// and every commit waiting on it falls back to a txg sync: on an aged 2 GiB pool with 594 MB
/// free, 32 writers met that about once a second for want of one 128 KiB range.
fn allocate_fitting(
    pool: &str,
    allocator: &mut Allocator,
    block_bytes: u32,
    least_bytes: usize,
    near: Option<u32>,
) -> Result<LogAddress, PoolError> {
    let least = (least_bytes.div_ceil(LOG_BLOCK_BYTES_MIN as usize) * LOG_BLOCK_BYTES_MIN as usize)
        .max(LOG_BLOCK_BYTES_MIN as usize) as u32;
    let mut bytes = block_bytes;
    loop {
        let placed = allocator
            .allocate_log_block(u64::from(bytes), near)
            .map(|(vdev, offset_bytes, alloc_bytes)| LogAddress {
                vdev,
                offset_bytes,
                len_bytes: bytes,
                alloc_bytes,
            })
            .map_err(|source| PoolError::NoSpace { pool: pool.to_owned(), cause: source });
        match placed {
            Err(PoolError::NoSpace { .. }) if bytes > least => bytes = (bytes / 2).max(least),
            result => return result,
        }
    }
}

/// A chain as found on disk.
#[derive(Clone, Debug, Default)]
pub struct Chain {
    pub blocks: Vec<LogBlock>,
    /// Where each block of `blocks` is.
    pub addresses: Vec<LogAddress>,
    /// The blocks of the indirect records import claimed (held like log blocks until the
    /// chain is retired).
    pub indirect: Vec<LogAddress>,
    /// The chain ended at a block that claims to be the expected one but fails its checksum
    /// on every copy: a write cut short by the crash (a torn tail).
    pub torn_tail: bool,
}

/// A chain block that could not be read: no copy verified, and at least one present copy
/// failed with an I/O error, so whether the chain continues there is unknown.
#[derive(Debug, thiserror::Error)]
#[error(
    "log block {position} of the chain (sequence {sequence}, {len_bytes} bytes at offset \
     {offset_bytes} of top-level vdev {vdev}) cannot be read: {cause}"
)]
pub struct UnreadableBlock {
    /// 0 for the chain's head.
    pub position: usize,
    pub sequence: u64,
    pub vdev: u32,
    pub offset_bytes: u64,
    pub len_bytes: u32,
    pub cause: vdev::VdevError,
    /// The blocks read before it, which are good.
    pub before: Chain,
}

/// Walks a chain from its head; returns its blocks in order. The chain ends at the first block
/// that is not the expected one on every copy that could be read (a block never written, or a
/// torn one). A copy that fails verification is healed from one that passes. A block that no
/// copy verifies while some copy failed to read is an error, never an end: the records past it
/// were acknowledged as durable, and treating a transient EIO as the end of the log would drop
/// them silently.
pub async fn read_chain(
    pool: &Pool,
    head: LogAddress,
    first: LogVerifier,
) -> Result<Chain, Box<UnreadableBlock>> {
    let mut chain = Chain::default();
    let mut at = Some(head);
    let mut expected = first;
    while let Some(address) = at {
        let verify = |bytes: &[u8]| LogBlock::decode(bytes, expected).is_ok();
        let dva = vdev::VdevAddress { vdev: address.vdev, offset_bytes: address.offset_bytes };
        let read = pool.root().read_log(dva, address.len_bytes, IoClass::SyncRead, &verify).await;
        let block = match read {
            Ok(bytes) => LogBlock::decode(&bytes, expected).ok(),
            Err(error) if error.is_definite_mismatch() => None,
            Err(source) => {
                return Err(Box::new(UnreadableBlock {
                    position: chain.blocks.len(),
                    sequence: expected.sequence,
                    vdev: address.vdev,
                    offset_bytes: address.offset_bytes,
                    len_bytes: address.len_bytes,
                    cause: source,
                    before: chain,
                }));
            }
        };
        let Some(block) = block else {
            // Was the end written at all? Look at any copy's header.
            let any = |_: &[u8]| true;
            if let Ok(bytes) =
                pool.root().read_log(dva, address.len_bytes, IoClass::SyncRead, &any).await
            {
                chain.torn_tail = LogBlock::claimed_verifier(&bytes) == Some(expected);
            }
            break;
        };
        at = block.next.as_ref().map(LogAddress::from_pointer);
        expected = expected.next();
        chain.blocks.push(block);
        chain.addresses.push(address);
    }
    Ok(chain)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where free space is all in holes shorter than the block asked for, a log block is
    /// placed at the largest half that fits, never below what the next record needs.
    #[test]
    fn a_log_block_shrinks_to_the_holes_left() {
        const MIB: u64 = 1 << 20;
        let mut a = Allocator::new(12, &[(MIB, 17 * MIB)]);
        // Fill the vdev with 16 KiB blocks (log region included), then free every other one.
        let mut blocks = Vec::new();
        while let Ok(block) = a.allocate(16384, crate::alloc::AllocClass::Reserved, &[]) {
            blocks.push(block);
        }
        while let Ok((vdev, at, _)) = a.allocate_log(4096) {
            blocks.push((vdev, at, 4096));
        }
        for &(vdev, at, len) in blocks.iter().step_by(2).filter(|b| b.2 == 16384) {
            a.free(1, vdev, at, len);
        }
        for txg in 1..=1 + crate::alloc::FREE_DEFER_TXGS {
            a.synced(txg);
        }
        let got = allocate_fitting("tank", &mut a, 128 << 10, 5000, None).unwrap();
        assert_eq!(got.len_bytes, 16384, "the largest half of 128 KiB that a hole holds");
        let refused = allocate_fitting("tank", &mut a, 128 << 10, 20000, None);
        assert!(matches!(refused, Err(PoolError::NoSpace { .. })), "{refused:?}");
    }
}
