//! Transaction groups and the pool's data (ZFS: `txg.c`, `spa_sync`, `dsl_pool.c`).
//!
//! Writes land in the open txg as dirty blocks in memory; [`Store::sync`] turns the open txg into
//! the syncing one and writes it out in this order:
//! 1. every dirty data block, copy-on-write, into new space;
//! 2. the indirect blocks above them, up to each volume's new root;
//! 3. the pool directory and a space map per top-level vdev, into space allocated before the
//!    maps are encoded, so each map describes the state that includes its own block;
//! 4. the uberblock: flush every leaf, write it to every label ring, flush again
//!    (`Pool::sync_uberblock`).
//!
//! Replaced blocks are freed in the syncing txg and reused only after the deferral
//! (crate::alloc), so a crash at any point imports to the previous txg intact.
//!
//! A txg syncs when `txg.timeout_ms` has passed since the last one, or as soon as its dirty
//! data passes a quarter of `txg.dirty_max` ([`Store::run_syncer`]). Above
//! `txg.delay_min_dirty_pct` of the maximum each write is delayed by
//! `DELAY_SCALE * (dirty - min) / (max - dirty)`, which grows smoothly towards the maximum
//! instead of stalling writers at a cliff (ZFS: `dmu_tx_delay`); at the maximum a writer syncs
//! before it continues. Unlike ZFS, both fall only on volumes that hold at least an equal share
//! of the dirty data: a database's small sync writes are not slowed because another volume
//! streams (landscape.md §2 item 1, measured in docs/design.md). The others go undelayed and
//! may pass the maximum by a reserve of an eighth of it, so dirty memory stays bounded at 9/8
//! of `txg.dirty_max`.
//!
//! While a txg syncs, new writes go to the next open txg and reads look at the open txg, then
//! the syncing one, then the trees on disk. A write covering part of a block keeps only the
//! sectors it wrote, as a patch over the version below (`Block::Patched`); the block is
//! read when it is read or synced, not before the write is answered. Syncs run one at a time. A sync that fails suspends
//! the store: every later operation fails until the pool is imported again, which returns it
//! to the last synced txg.
//!
//! Lock order: `state` -> a volume's log writer -> `allocator`; none is held across an `.await`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use parking_lot::Mutex;
use sluice_format::{
    BlockKind, BlockPointer, DdtHeader, DedupMode, LogHeader, LogRecord, LogVerifier,
    PoolDirectory, SpaceMap, VolumeEntry, LOG_HEADER_BYTES, VOLUME_NAME_BYTES_MAX,
};

mod audit;

pub use audit::AuditReport;

use crate::alloc::{AllocClass, AllocError, Allocator};
use crate::dedup::Ddt;
use crate::device::AlignedBuf;
use crate::intent_log::{self, CommitPolicy, LogAddress, LogError, LogWriter};
use crate::objset::{self, TreeUpdate};
use crate::pool::{Pool, PoolError};
use crate::stats::VolumeStats;
use crate::tunables::{Tunable, Tunables};

/// Largest span of adjacent blocks one read fetches in one I/O.
const READ_SPAN_BYTES_MAX: u64 = 1 << 20;

/// How `Store::read` fetches a block or a run of them.
enum Read {
    /// A block with a version in memory.
    Memory(u64),
    /// A block found in the pool's block cache.
    Cached(u64, Arc<AlignedBuf>),
    /// Adjacent blocks on disk from this index on, with their pointers.
    Span(u64, Vec<BlockPointer>),
}

/// A fetched block's bytes, wherever they are.
enum Fetched {
    Memory(Arc<Vec<u8>>),
    Disk(Arc<AlignedBuf>),
    /// Within a span's buffer, at this offset.
    Span(Arc<AlignedBuf>, usize),
}

impl Fetched {
    fn bytes(&self) -> &[u8] {
        match self {
            Fetched::Memory(data) => data,
            Fetched::Disk(buf) => buf,
            Fetched::Span(buf, at) => &buf[*at..],
        }
    }
}

/// Data blocks a sync completes (patches) or writes (dedup) concurrently.
const SYNC_WRITES_IN_FLIGHT: usize = 64;
/// Spans of data blocks a sync writes concurrently.
const SPANS_IN_FLIGHT: usize = 8;
/// Blocks one read fetches concurrently.
const READ_BLOCKS_IN_FLIGHT: usize = 32;

/// Volume block sizes allowed.
pub const BLOCK_BYTES_MIN: u32 = 4096;
pub const BLOCK_BYTES_MAX: u32 = 128 << 10;
pub const BLOCK_BYTES_DEFAULT: u32 = 16 << 10;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error(transparent)]
    Pool(#[from] PoolError),
    #[error("volume {pool}/{volume} does not exist; `sluice vol list` shows the volumes")]
    NoSuchVolume { pool: String, volume: String },
    #[error("volume {pool}/{volume} already exists")]
    VolumeExists { pool: String, volume: String },
    #[error("volume name {name:?} is invalid: use 1 to 255 letters, digits and _ - . :")]
    InvalidVolumeName { name: String },
    #[error(
        "volume {volume}: block size {block_bytes} is invalid; use a power of two from \
         {BLOCK_BYTES_MIN} to {BLOCK_BYTES_MAX}"
    )]
    InvalidBlockSize { volume: String, block_bytes: u32 },
    #[error("volume {volume}: size {size_bytes} must be a positive multiple of the block size {block_bytes}")]
    InvalidSize { volume: String, size_bytes: u64, block_bytes: u32 },
    #[error("volume {volume}: {len} bytes at offset {offset} are outside its {size_bytes} bytes or not 512-byte aligned")]
    OutOfRange { volume: String, offset: u64, len: u64, size_bytes: u64 },
    #[error("pool {pool}: no space for {requested_bytes} more bytes; trim or delete data, or add a vdev")]
    NoSpace { pool: String, requested_bytes: u64 },
    #[error(
        "pool {pool} is suspended after a failed sync ({cause}); export it and import it again"
    )]
    Suspended { pool: String, cause: String },
}

impl StoreError {
    /// What kind of failure this is (see [`crate::ErrorKind`]).
    pub fn kind(&self) -> crate::ErrorKind {
        use crate::ErrorKind;
        match self {
            StoreError::Pool(error) => error.kind(),
            StoreError::NoSuchVolume { .. } => ErrorKind::NotFound,
            StoreError::VolumeExists { .. } => ErrorKind::Exists,
            StoreError::InvalidVolumeName { .. }
            | StoreError::InvalidBlockSize { .. }
            | StoreError::InvalidSize { .. }
            | StoreError::OutOfRange { .. } => ErrorKind::Invalid,
            StoreError::NoSpace { .. } => ErrorKind::NoSpace,
            StoreError::Suspended { .. } => ErrorKind::Suspended,
        }
    }
}

#[derive(Clone, Debug)]
enum Block {
    Data(Arc<Vec<u8>>),
    Zero,
    /// Sectors written over a version of the block not read yet: the version below (the
    /// syncing txg's block, else the disk's) with the `covered` sectors replaced by `data`'s.
    /// A partial write so costs no read; the read happens when the block is read or synced.
    Patched(Arc<Patch>),
}

#[derive(Clone, Debug)]
struct Patch {
    /// The whole block's bytes; only covered sectors count.
    data: Vec<u8>,
    /// One bit per 512-byte sector.
    covered: Vec<u64>,
}

const SECTOR: u64 = 512;

impl Patch {
    fn new(block_bytes: u64) -> Patch {
        let sectors = block_bytes / SECTOR;
        Patch {
            data: vec![0u8; block_bytes as usize],
            covered: vec![0; sectors.div_ceil(64) as usize],
        }
    }

    /// Writes `bytes` (or zeros) at `at` (sector-aligned) within the block.
    fn write(&mut self, at: usize, len: usize, bytes: Option<&[u8]>) {
        match bytes {
            Some(b) => self.data[at..at + len].copy_from_slice(b),
            None => self.data[at..at + len].fill(0),
        }
        for sector in at as u64 / SECTOR..(at + len) as u64 / SECTOR {
            self.covered[(sector / 64) as usize] |= 1 << (sector % 64);
        }
    }

    fn complete(&self) -> bool {
        let sectors = self.data.len() as u64 / SECTOR;
        (0..sectors).all(|s| self.covered[(s / 64) as usize] & (1 << (s % 64)) != 0)
    }

    /// The block: `base` (None: zeros) with the covered sectors replaced.
    fn apply(&self, base: Option<&[u8]>) -> Vec<u8> {
        self.apply_owned(base.map(|b| b[..self.data.len()].to_vec()))
    }

    /// [`Patch::apply`] over a base the caller already owns (one copy fewer).
    fn apply_owned(&self, base: Option<Vec<u8>>) -> Vec<u8> {
        let mut out = base.unwrap_or_else(|| vec![0u8; self.data.len()]);
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

#[derive(Debug)]
struct Volume {
    /// `entry.log` is the log header of the last synced txg.
    entry: VolumeEntry,
    /// Levels of the tree on disk; below `entry.levels` after a grow until the next sync.
    disk_levels: u8,
    open: BTreeMap<u64, Block>,
    syncing: BTreeMap<u64, Block>,
    /// The volume's intent log; `None` while import replays the old chain (the directory
    /// keeps pointing at it until replay is complete).
    log: Option<Arc<LogWriter>>,
    /// Bounds the requests served at once when `volume.request_threads` is set.
    gate: Option<Arc<async_lock::Semaphore>>,
    /// Requests the volume front is serving now (crate::volume counts them).
    requests: Arc<std::sync::atomic::AtomicUsize>,
    /// What the volume front has answered since import.
    stats: Arc<VolumeStats>,
    /// This volume's part of the open txg's `dirty_bytes`.
    dirty_bytes: u64,
}

impl Volume {
    fn new(entry: VolumeEntry, log: Option<Arc<LogWriter>>, limits: &TxgLimits) -> Volume {
        Volume {
            disk_levels: entry.levels,
            entry,
            open: BTreeMap::new(),
            syncing: BTreeMap::new(),
            log,
            gate: (limits.request_threads > 0)
                .then(|| Arc::new(async_lock::Semaphore::new(limits.request_threads))),
            requests: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            stats: Arc::new(VolumeStats::default()),
            dirty_bytes: 0,
        }
    }

    /// The newest in-memory version of block `index`, if any.
    fn cached(&self, index: u64) -> Option<&Block> {
        self.open.get(&index).or_else(|| self.syncing.get(&index))
    }
}

#[derive(Debug)]
struct State {
    open_txg: u64,
    next_volume_id: u64,
    volumes: BTreeMap<String, Volume>,
    /// Space-map and directory blocks of the last synced txg, freed when replaced.
    space_maps: Vec<Vec<BlockPointer>>,
    directory: Option<BlockPointer>,
    dirty_bytes: u64,
    /// Indirect blocks the open txg will rewrite, estimated: the path to the root for each
    /// group of `INDIRECT_BPS` blocks it dirtied.
    dirty_metadata_bytes: u64,
    /// What the syncing txg will allocate (its dirty data and metadata at quiesce), until its
    /// sync ends: admission counts it, since its blocks are not allocated yet.
    syncing_bytes: u64,
    /// The metadata part of `syncing_bytes`.
    syncing_metadata_bytes: u64,
    /// Trees of destroyed volumes, freed by the next sync: (root, levels).
    destroyed: Vec<(BlockPointer, u8)>,
    /// Log blocks of retired chains (destroyed volumes, replayed or failed logs), freed by the
    /// next sync.
    retired_log: Vec<LogAddress>,
}

/// An open pool with its volumes.
#[derive(Debug)]
pub struct Store {
    pool: Arc<Pool>,
    /// Shared with the tasks a sync spawns to write dedup blocks in parallel.
    allocator: Arc<Mutex<Allocator>>,
    ddt: Arc<Ddt>,
    state: Mutex<State>,
    sync_lock: futures::lock::Mutex<()>,
    suspended: AtomicBool,
    /// Why the store was suspended, for the error every later operation returns.
    suspend_cause: Mutex<Option<String>>,
    limits: TxgLimits,
    /// Wakes the syncer early when dirty data builds up.
    kick: Mutex<Option<futures::channel::mpsc::Sender<()>>>,
    syncs: crate::stats::Counter,
    log_stats: LogStats,
    throttle_stats: ThrottleStats,
    /// When this store was created or imported: what "since import" counts from.
    opened: crate::rt::Time,
}

/// What the write throttle did to writers (zeroes included): the answer to "why are my writes
/// slow" when one writer fills the dirty-data budget for every volume (landscape.md §2 item 1).
#[derive(Debug, Default)]
pub struct ThrottleStats {
    /// Writes delayed because dirty data was above `txg.delay_min_dirty_pct`, and for how long.
    pub delayed: crate::stats::Counter,
    pub delayed_nanos: crate::stats::Counter,
    /// Writes that found `txg.dirty_max` reached and waited for a txg sync, and for how long.
    pub waited_for_sync: crate::stats::Counter,
    pub waited_nanos: crate::stats::Counter,
    /// Writes that would have been delayed, or stopped at the maximum, but were not: their
    /// volume held less than an equal share of the dirty data, so another volume was filling
    /// it.
    pub spared: crate::stats::Counter,
}

/// What the intent logs did: commits, fallbacks to txg syncs, and what import found.
#[derive(Debug, Default)]
pub struct LogStats {
    /// Commits (FUA writes and flushes) that had records to make durable.
    pub commits: crate::stats::Counter,
    /// Commits answered by a txg sync: the chain was not yet anchored, or a log write failed.
    pub commits_via_txg: crate::stats::Counter,
    /// Early commits: a lone sync writer's record sent to the log before its flush arrived.
    pub early_commits: crate::stats::Counter,
    /// Chains walked at import, and the blocks found in them.
    pub chains_claimed: crate::stats::Counter,
    pub blocks_claimed: crate::stats::Counter,
    /// Records applied by replay.
    pub records_replayed: crate::stats::Counter,
    /// Records an interrupted replay had already applied in an earlier import, skipped now.
    pub records_already_replayed: crate::stats::Counter,
    /// Records of txgs that had synced before the crash, skipped.
    pub records_already_synced: crate::stats::Counter,
    /// Chains that ended at a block written only in part.
    pub torn_tails: crate::stats::Counter,
    /// Records that no longer fit the volume (it shrank after they were logged), skipped.
    pub records_out_of_range: crate::stats::Counter,
}

/// How much may be dirty and how often txgs sync.
#[derive(Clone, Copy, Debug)]
struct TxgLimits {
    timeout: std::time::Duration,
    dirty_max: u64,
    delay_min: u64,
    log_policy: CommitPolicy,
    commit_timeout_pct: u64,
    early_commit: bool,
    log_block_bytes_max: u32,
    request_threads: usize,
}

/// Delay of a write when dirty data is halfway between the delay threshold and the maximum
/// (ZFS: zfs_delay_scale).
const DELAY_SCALE: std::time::Duration = std::time::Duration::from_micros(500);
/// No single delay exceeds this; beyond it the writer would rather sync itself.
const DELAY_MAX: std::time::Duration = std::time::Duration::from_millis(100);

impl TxgLimits {
    fn from_tunables(tunables: &Tunables) -> TxgLimits {
        let dirty_max = tunables.get(Tunable::TxgDirtyMax);
        TxgLimits {
            timeout: std::time::Duration::from_millis(tunables.get(Tunable::TxgTimeoutMs)),
            dirty_max,
            delay_min: dirty_max / 100 * tunables.get(Tunable::TxgDelayMinDirtyPct),
            log_policy: CommitPolicy::from_tunables(tunables),
            commit_timeout_pct: tunables.get(Tunable::IntentLogCommitTimeoutPct),
            early_commit: tunables.choice(Tunable::IntentLogEarlyCommit) == "auto",
            log_block_bytes_max: u32::try_from(tunables.get(Tunable::IntentLogBlockBytesMax))
                .unwrap_or(128 << 10),
            request_threads: usize::try_from(tunables.get(Tunable::VolumeRequestThreads))
                .unwrap_or(0),
        }
    }

    /// How long a writer waits with `dirty` bytes dirty.
    fn delay(&self, dirty: u64) -> std::time::Duration {
        if dirty <= self.delay_min || dirty >= self.dirty_max {
            return std::time::Duration::ZERO;
        }
        let over = (dirty - self.delay_min) as f64;
        let room = (self.dirty_max - dirty) as f64;
        DELAY_SCALE.mul_f64(over / room).min(DELAY_MAX)
    }
}

fn check_volume_name(name: &str) -> Result<(), StoreError> {
    let ok = !name.is_empty()
        && name.len() <= VOLUME_NAME_BYTES_MAX
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "_-.:".contains(c));
    if ok {
        Ok(())
    } else {
        Err(StoreError::InvalidVolumeName { name: name.to_owned() })
    }
}

impl Store {
    /// A store on a freshly created pool.
    pub fn create(pool: Pool, tunables: &Tunables) -> Store {
        let allocator = Allocator::new(pool.ashift(), &pool.data_areas());
        let txg = pool.uberblock().txg;
        let vdevs = pool.root().top_level().len();
        let state = State {
            open_txg: txg + 1,
            next_volume_id: 1,
            volumes: BTreeMap::new(),
            space_maps: vec![Vec::new(); vdevs],
            directory: None,
            dirty_bytes: 0,
            dirty_metadata_bytes: 0,
            syncing_bytes: 0,
            syncing_metadata_bytes: 0,
            destroyed: Vec::new(),
            retired_log: Vec::new(),
        };
        // The dedup salt: drawn once per pool, so keys cannot be predicted from outside.
        let mut salt_rng = pool.env().unique_rng("dedup salt");
        let mut salt = [0u8; 32];
        for chunk in salt.chunks_exact_mut(8) {
            chunk.copy_from_slice(&salt_rng.u64().to_le_bytes());
        }
        let ddt = DdtHeader { salt, ..DdtHeader::default() };
        Store::assemble(pool, allocator, state, ddt, tunables)
    }

    fn assemble(
        pool: Pool,
        mut allocator: Allocator,
        state: State,
        ddt: DdtHeader,
        tunables: &Tunables,
    ) -> Store {
        allocator.set_log_vdevs(&pool.log_vdevs());
        let opened = pool.env().now();
        Store {
            allocator: Arc::new(Mutex::new(allocator)),
            ddt: Arc::new(Ddt::new(pool.name(), ddt, tunables)),
            state: Mutex::new(state),
            pool: Arc::new(pool),
            sync_lock: futures::lock::Mutex::new(()),
            suspended: AtomicBool::new(false),
            suspend_cause: Mutex::new(None),
            limits: TxgLimits::from_tunables(tunables),
            kick: Mutex::new(None),
            syncs: crate::stats::Counter::default(),
            log_stats: LogStats::default(),
            throttle_stats: ThrottleStats::default(),
            opened,
        }
    }

    /// A new, not yet anchored log chain for a volume.
    fn new_log(&self, volume_id: u64) -> Result<Arc<LogWriter>, StoreError> {
        Ok(Arc::new(LogWriter::new(
            self.pool.name(),
            &self.allocator,
            self.limits.log_policy,
            self.limits.commit_timeout_pct,
            self.chain_id(),
            volume_id,
            self.limits.log_block_bytes_max,
        )?))
    }

    fn chain_id(&self) -> u64 {
        self.pool.env().unique_rng("intent log chain").u64().max(1)
    }

    /// Opens the data of an imported pool as of its newest uberblock. Leaves that are behind
    /// (a mirror child that was missing and is back) are resilvered first. Then every
    /// volume's intent log is claimed and replayed (records of txgs after the last synced
    /// one, each exactly once), a txg makes the result durable, and new chains start.
    pub async fn open(pool: Pool, tunables: &Tunables) -> Result<Store, StoreError> {
        pool.resilver().await?;
        let uberblock = pool.uberblock();
        let Some(root) = uberblock.root else { return Ok(Store::create(pool, tunables)) };
        let format = |source| PoolError::Format { pool: pool.name().to_owned(), source };
        let bytes = pool.read_block(&root, crate::tunables::IoClass::SyncRead).await?;
        let directory = PoolDirectory::decode(&bytes).map_err(format)?;
        let areas = pool.data_areas();
        let mut maps = Vec::new();
        for (index, pieces) in directory.space_maps.iter().enumerate() {
            let area = areas.get(index).copied().unwrap_or((0, 0));
            let mut map = SpaceMap {
                ashift: pool.ashift(),
                synced_txg: 0,
                free: vec![(area.0, area.1 - area.0)],
                deferred: vec![],
            };
            if !pieces.is_empty() {
                map.free.clear();
            }
            // The pieces' ranges, in order, are the map (the allocator checks they are sane).
            for bp in pieces {
                let bytes = pool.read_block(bp, crate::tunables::IoClass::SyncRead).await?;
                let piece = SpaceMap::decode(&bytes).map_err(format)?;
                map.ashift = piece.ashift;
                map.synced_txg = piece.synced_txg;
                map.free.extend(piece.free);
                map.deferred.extend(piece.deferred);
            }
            maps.push((map, area));
        }
        let no_space = |e| PoolError::NoSpace { pool: pool.name().to_owned(), source: e };
        let mut allocator = Allocator::load(pool.ashift(), &maps).map_err(no_space)?;
        allocator.synced(uberblock.txg);
        // Claim every chain before anything allocates, so no log block is handed out again.
        let mut chains = Vec::new();
        let log_stats = LogStats::default();
        for entry in &directory.volumes {
            let Some(mut header) = entry.log else { continue };
            if header.claim_txg == 0 {
                // First import since the crash: what synced before it is the line.
                header.claim_txg = uberblock.txg;
            }
            let head = LogAddress::from_pointer(&header.head);
            let verifier = LogVerifier {
                chain_id: header.chain_id,
                volume_id: entry.id,
                sequence: header.head_sequence,
            };
            let chain = intent_log::read_chain(&pool, head, verifier).await;
            for at in &chain.addresses {
                allocator
                    .claim_log(at.vdev, at.offset_bytes, u64::from(at.len_bytes))
                    .map_err(no_space)?;
            }
            log_stats.chains_claimed.inc();
            log_stats.blocks_claimed.add(chain.addresses.len() as u64);
            if chain.torn_tail {
                log_stats.torn_tails.inc();
            }
            chains.push((entry.name.clone(), header, chain));
        }
        let limits = TxgLimits::from_tunables(tunables);
        let volumes = directory
            .volumes
            .iter()
            .map(|entry| {
                let mut entry = entry.clone();
                if let Some((_, header, _)) = chains.iter().find(|(name, _, _)| *name == entry.name)
                {
                    entry.log = Some(*header);
                }
                (entry.name.clone(), Volume::new(entry, None, &limits))
            })
            .collect();
        let state = State {
            open_txg: uberblock.txg + 1,
            next_volume_id: directory.next_volume_id,
            volumes,
            space_maps: directory.space_maps.clone(),
            directory: Some(root),
            dirty_bytes: 0,
            dirty_metadata_bytes: 0,
            syncing_bytes: 0,
            syncing_metadata_bytes: 0,
            destroyed: Vec::new(),
            retired_log: Vec::new(),
        };
        let mut store = Store::assemble(pool, allocator, state, directory.ddt, tunables);
        store.log_stats = log_stats;
        store.replay(chains).await?;
        Ok(store)
    }

    /// Applies each claimed chain's records that are newer than its claim txg (the last txg
    /// synced before the crash) and than what an interrupted replay already applied, then retires the chains and starts new ones. Syncs
    /// that happen during replay (dirty data) record the progress in the old header, so an
    /// import interrupted here replays every record exactly once in the end.
    async fn replay(
        &self,
        chains: Vec<(String, LogHeader, intent_log::Chain)>,
    ) -> Result<(), StoreError> {
        let stats = &self.log_stats;
        for (name, header, chain) in &chains {
            for record in chain.blocks.iter().flat_map(|b| b.records.iter()) {
                if record.txg() <= header.claim_txg {
                    stats.records_already_synced.inc();
                    continue;
                }
                if record.sequence() <= header.replayed_record {
                    stats.records_already_replayed.inc();
                    continue;
                }
                let (offset, len, data) = match record {
                    LogRecord::Write { offset, data, .. } => {
                        (*offset, data.len() as u64, Some(&data[..]))
                    }
                    LogRecord::Zero { offset, len, .. } => (*offset, *len, None),
                    LogRecord::WriteIndirect { .. } => {
                        return Err(StoreError::Pool(PoolError::Format {
                            pool: self.pool.name().to_owned(),
                            source: sluice_format::FormatError::Invalid {
                                what: "log record",
                                field: "kind (indirect writes are not written by this version)",
                                value: 2,
                            },
                        }));
                    }
                };
                let entry = self.volume_entry(name)?;
                if Self::check_range(&entry, offset, len).is_err() {
                    stats.records_out_of_range.inc();
                    continue;
                }
                self.modify(name, offset, len, data, Apply::Replay(record.sequence())).await?;
                stats.records_replayed.inc();
            }
        }
        // Retire the old chains and start new ones; one sync makes it all durable.
        {
            let mut state = self.state.lock();
            for (_, _, chain) in &chains {
                state.retired_log.extend(chain.addresses.iter().copied());
            }
        }
        let names: Vec<(String, u64)> = self
            .state
            .lock()
            .volumes
            .values()
            .map(|v| (v.entry.name.clone(), v.entry.id))
            .collect();
        for (name, id) in names {
            let log = self.new_log(id)?;
            if let Some(volume) = self.state.lock().volumes.get_mut(&name) {
                volume.log = Some(log);
            }
        }
        self.sync().await?;
        Ok(())
    }

    /// Where `volume`'s log chain starts now (its oldest block still needed), if it has one.
    pub fn log_head(&self, volume: &str) -> Option<(LogAddress, LogVerifier)> {
        let log = self.state.lock().volumes.get(volume).and_then(|v| v.log.clone())?;
        Some(log.head())
    }

    /// Log blocks written by the volumes' current chains.
    pub fn log_blocks_written(&self) -> u64 {
        self.state
            .lock()
            .volumes
            .values()
            .filter_map(|v| v.log.as_ref())
            .map(|l| l.lwbs_written())
            .sum()
    }

    /// What the intent logs did.
    pub fn log_stats(&self) -> &LogStats {
        &self.log_stats
    }

    /// Txgs synced by this store so far.
    pub fn syncs(&self) -> u64 {
        self.syncs.get()
    }

    /// What the write throttle did.
    pub fn throttle_stats(&self) -> &ThrottleStats {
        &self.throttle_stats
    }

    /// When the store was created or imported (the counters start there).
    pub fn opened(&self) -> crate::rt::Time {
        self.opened
    }

    /// What `volume`'s clients have asked of it since import, shared by every handle on it.
    pub fn volume_stats(&self, volume: &str) -> Result<Arc<VolumeStats>, StoreError> {
        self.state
            .lock()
            .volumes
            .get(volume)
            .map(|v| Arc::clone(&v.stats))
            .ok_or_else(|| self.no_such_volume(volume))
    }

    /// Dirty bytes in the open txg.
    pub fn dirty_bytes(&self) -> u64 {
        self.state.lock().dirty_bytes
    }

    /// Starts the task that syncs every `txg.timeout_ms`, or early when dirty data builds up.
    /// It holds only a weak reference: it ends when the store is dropped, and after a failed
    /// sync (the store is then suspended).
    pub fn run_syncer(self: &Arc<Self>) {
        use futures::StreamExt;
        let (sender, mut kicks) = futures::channel::mpsc::channel::<()>(1);
        *self.kick.lock() = Some(sender);
        let weak = Arc::downgrade(self);
        let env = self.pool.env().clone();
        let timeout = self.limits.timeout;
        env.clone().spawn("txg_sync", async move {
            loop {
                let sleep = env.sleep(timeout);
                let kicked = kicks.next();
                futures::pin_mut!(kicked);
                if let futures::future::Either::Right((None, _)) =
                    futures::future::select(sleep, kicked).await
                {
                    return;
                }
                let Some(store) = weak.upgrade() else { return };
                if store.sync().await.is_err() {
                    return;
                }
            }
        });
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The txg that writes go into now.
    pub fn open_txg(&self) -> u64 {
        self.state.lock().open_txg
    }

    pub fn free_bytes(&self) -> u64 {
        self.allocator.lock().free_bytes()
    }

    fn no_such_volume(&self, volume: &str) -> StoreError {
        StoreError::NoSuchVolume { pool: self.pool.name().to_owned(), volume: volume.to_owned() }
    }

    fn check_live(&self) -> Result<(), StoreError> {
        if self.suspended.load(Ordering::Relaxed) {
            let cause = self.suspend_cause.lock().clone().unwrap_or_default();
            Err(StoreError::Suspended { pool: self.pool.name().to_owned(), cause })
        } else {
            Ok(())
        }
    }

    /// Creates a volume; it is durable once the next sync completes.
    pub fn create_volume(
        &self,
        name: &str,
        size_bytes: u64,
        block_bytes: u32,
    ) -> Result<(), StoreError> {
        self.check_live()?;
        check_volume_name(name)?;
        if !block_bytes.is_power_of_two()
            || !(BLOCK_BYTES_MIN..=BLOCK_BYTES_MAX).contains(&block_bytes)
        {
            return Err(StoreError::InvalidBlockSize { volume: name.to_owned(), block_bytes });
        }
        if size_bytes == 0 || size_bytes % u64::from(block_bytes) != 0 {
            return Err(StoreError::InvalidSize {
                volume: name.to_owned(),
                size_bytes,
                block_bytes,
            });
        }
        let mut state = self.state.lock();
        if state.volumes.contains_key(name) {
            return Err(StoreError::VolumeExists {
                pool: self.pool.name().to_owned(),
                volume: name.to_owned(),
            });
        }
        let id = state.next_volume_id;
        let log = self.new_log(id)?;
        state.next_volume_id += 1;
        let levels = objset::levels_for(size_bytes / u64::from(block_bytes));
        let entry = VolumeEntry {
            id,
            name: name.to_owned(),
            size_bytes,
            block_bytes,
            levels,
            root: None,
            log: None,
            dedup: DedupMode::Off,
        };
        state.volumes.insert(name.to_owned(), Volume::new(entry, Some(log), &self.limits));
        Ok(())
    }

    /// Sets a volume's dedup property; blocks written from the next sync on follow it (blocks
    /// already stored stay as they are). Durable with the next sync.
    pub fn set_dedup(&self, name: &str, mode: DedupMode) -> Result<(), StoreError> {
        self.check_live()?;
        let mut state = self.state.lock();
        let volume = state.volumes.get_mut(name).ok_or_else(|| self.no_such_volume(name))?;
        volume.entry.dedup = mode;
        Ok(())
    }

    /// The dedup table: its totals as of the last sync and what it did since the pool opened.
    pub fn dedup_table(&self) -> &Ddt {
        &self.ddt
    }

    /// Destroys a volume; its blocks are freed by the next sync.
    pub fn destroy_volume(&self, name: &str) -> Result<(), StoreError> {
        self.check_live()?;
        let mut state = self.state.lock();
        let volume = state.volumes.remove(name).ok_or_else(|| self.no_such_volume(name))?;
        if let Some(log) = &volume.log {
            state.retired_log.extend(log.retire());
        }
        if let Some(root) = volume.entry.root {
            state.destroyed.push((root, volume.disk_levels));
        }
        Ok(())
    }

    /// Changes a volume's size. Growing keeps every block; shrinking discards the blocks past
    /// the new end (their space is freed by the next sync).
    pub async fn resize_volume(&self, name: &str, size_bytes: u64) -> Result<(), StoreError> {
        self.check_live()?;
        let entry = self.volume_entry(name)?;
        let bs = u64::from(entry.block_bytes);
        if size_bytes == 0 || size_bytes % bs != 0 {
            return Err(StoreError::InvalidSize {
                volume: name.to_owned(),
                size_bytes,
                block_bytes: entry.block_bytes,
            });
        }
        let new_blocks = size_bytes / bs;
        let missing = || self.no_such_volume(name);
        if size_bytes < entry.size_bytes {
            // Find the stored blocks past the end, then drop them (and any dirty ones).
            let disk_levels =
                self.state.lock().volumes.get(name).map_or(entry.levels, |v| v.disk_levels);
            let stored = objset::walk(&self.pool, entry.root, disk_levels).await?;
            let mut state = self.state.lock();
            let volume = state.volumes.get_mut(name).ok_or_else(missing)?;
            volume.open.retain(|&index, _| index < new_blocks);
            for (level, index, _) in stored {
                if level == 0 && index >= new_blocks {
                    volume.open.insert(index, Block::Zero);
                }
            }
            volume.entry.size_bytes = size_bytes;
        } else {
            let mut state = self.state.lock();
            let volume = state.volumes.get_mut(name).ok_or_else(missing)?;
            volume.entry.size_bytes = size_bytes;
            volume.entry.levels = volume.entry.levels.max(objset::levels_for(new_blocks));
        }
        Ok(())
    }

    /// One volume's entry (name, size, block size), if it exists.
    pub fn volume_info(&self, name: &str) -> Option<VolumeEntry> {
        self.state.lock().volumes.get(name).map(|v| v.entry.clone())
    }

    /// Names and sizes of the volumes.
    pub fn volumes(&self) -> Vec<VolumeEntry> {
        self.state.lock().volumes.values().map(|v| v.entry.clone()).collect()
    }

    fn volume_entry(&self, name: &str) -> Result<VolumeEntry, StoreError> {
        self.state
            .lock()
            .volumes
            .get(name)
            .map(|v| v.entry.clone())
            .ok_or_else(|| self.no_such_volume(name))
    }

    fn check_range(entry: &VolumeEntry, offset: u64, len: u64) -> Result<(), StoreError> {
        let inside = offset.checked_add(len).is_some_and(|end| end <= entry.size_bytes);
        if inside && offset % 512 == 0 && len % 512 == 0 {
            Ok(())
        } else {
            Err(StoreError::OutOfRange {
                volume: entry.name.clone(),
                offset,
                len,
                size_bytes: entry.size_bytes,
            })
        }
    }

    /// The current contents of block `index`: open txg, then syncing txg, then disk, with
    /// patches applied over the version below them.
    async fn block(
        &self,
        entry: &VolumeEntry,
        index: u64,
    ) -> Result<Option<Arc<Vec<u8>>>, StoreError> {
        // One snapshot: the versions in memory and the root they lie on. Freed blocks stay
        // intact through the deferral, so that root can be read even if a sync moves it.
        let (open, syncing, root, levels) = {
            let state = self.state.lock();
            let v = state.volumes.get(&entry.name);
            (
                v.and_then(|v| v.open.get(&index).cloned()),
                v.and_then(|v| v.syncing.get(&index).cloned()),
                v.and_then(|v| v.entry.root),
                v.map_or(entry.levels, |v| v.disk_levels),
            )
        };
        let mut layers: Vec<Block> = open.into_iter().collect();
        if !matches!(layers.last(), Some(Block::Data(_) | Block::Zero)) {
            layers.extend(syncing);
        }
        let mut below = match layers.last() {
            Some(Block::Data(data)) => Some(Arc::clone(data)),
            Some(Block::Zero) => None,
            Some(Block::Patched(_)) | None => {
                objset::read_data_block(&self.pool, root, levels, index)
                    .await?
                    .map(|d| Arc::new(d[..entry.block_bytes as usize].to_vec()))
            }
        };
        for layer in layers.iter().rev() {
            if let Block::Patched(patch) = layer {
                below = Some(Arc::new(patch.apply(below.as_deref().map(Vec::as_slice))));
            }
        }
        Ok(below)
    }

    /// Reads `len` bytes at `offset`.
    pub async fn read(&self, volume: &str, offset: u64, len: u64) -> Result<Vec<u8>, StoreError> {
        Ok(self.read_with_status(volume, offset, len).await?.0)
    }

    /// Reads `len` bytes at `offset`, and says which parts are allocated as
    /// [`Store::block_status`] would: runs of (bytes, allocated) in order. The read looks up
    /// every block's pointer anyway, so an NBD read that sends holes as hole chunks gets the
    /// map without a second walk of the tree (that walk was 6% of the server's CPU on uncached
    /// random reads).
    pub async fn read_with_status(
        &self,
        volume: &str,
        offset: u64,
        len: u64,
    ) -> Result<(Vec<u8>, Vec<(u64, bool)>), StoreError> {
        self.check_live()?;
        let entry = self.volume_entry(volume)?;
        Self::check_range(&entry, offset, len)?;
        if len == 0 {
            return Ok((Vec::new(), Vec::new()));
        }
        let bs = u64::from(entry.block_bytes);
        let mut out = vec![0u8; len as usize];
        let first = offset / bs;
        let last = (offset + len - 1) / bs;
        // Whether each block `first..=last` holds data; holes and zeroed blocks do not.
        let mut allocated = vec![true; (last - first + 1) as usize];
        // Blocks with a version in memory go through `block`; the others are read from the
        // root of the same snapshot, adjacent ones in spans of one I/O each.
        let (in_memory, root, levels) = {
            let state = self.state.lock();
            let v = state.volumes.get(&entry.name);
            let in_memory: Vec<u64> =
                (first..=last).filter(|i| v.is_some_and(|v| v.cached(*i).is_some())).collect();
            (in_memory, v.and_then(|v| v.entry.root), v.map_or(entry.levels, |v| v.disk_levels))
        };
        let mut reads: Vec<Read> = Vec::new();
        for index in first..=last {
            if in_memory.binary_search(&index).is_ok() {
                reads.push(Read::Memory(index));
                continue;
            }
            let Some(bp) = objset::data_block_pointer(&self.pool, root, levels, index).await?
            else {
                allocated[(index - first) as usize] = false;
                continue;
            };
            if let Some(hit) = self.pool.cache().get(&bp) {
                reads.push(Read::Cached(index, hit));
                continue;
            }
            if let Some(Read::Span(start, bps)) = reads.last_mut() {
                let joins = *start + bps.len() as u64 == index
                    && crate::pool::follows(&bps[bps.len() - 1], &bp)
                    && (bps.len() as u64 + 1) * bs <= READ_SPAN_BYTES_MAX;
                if joins {
                    bps.push(bp);
                    continue;
                }
            }
            reads.push(Read::Span(index, vec![bp]));
        }
        // Fetched concurrently (in order), then copied into place.
        let entry_ref = &entry;
        let mut fetched = futures::stream::iter(reads)
            .map(|read| async move {
                match read {
                    Read::Memory(index) => {
                        let block = self.block(entry_ref, index).await?;
                        Ok::<_, StoreError>(vec![(index, block.map(Fetched::Memory))])
                    }
                    Read::Cached(index, hit) => Ok(vec![(index, Some(Fetched::Disk(hit)))]),
                    Read::Span(start, bps) => self.read_blocks(start, &bps).await,
                }
            })
            .buffered(READ_BLOCKS_IN_FLIGHT);
        while let Some(result) = fetched.next().await {
            for (index, block) in result? {
                let block_start = index * bs;
                let from = offset.max(block_start);
                let to = (offset + len).min(block_start + bs);
                if let Some(block) = block {
                    let dst = (from - offset) as usize..(to - offset) as usize;
                    out[dst].copy_from_slice(
                        &block.bytes()[(from - block_start) as usize..(to - block_start) as usize],
                    );
                } else {
                    allocated[(index - first) as usize] = false;
                }
            }
        }
        let mut runs: Vec<(u64, bool)> = Vec::new();
        for (i, &data) in allocated.iter().enumerate() {
            let block_start = (first + i as u64) * bs;
            let n = (offset + len).min(block_start + bs) - offset.max(block_start);
            match runs.last_mut() {
                Some((run, kind)) if *kind == data => *run += n,
                _ => runs.push((n, data)),
            }
        }
        debug_assert_eq!(runs.iter().map(|&(n, _)| n).sum::<u64>(), len);
        Ok((out, runs))
    }

    /// Data blocks `start..` with pointers `bps`: in one I/O when there are several, else (or
    /// when the span fails) one by one through the cache, which heals bad copies.
    async fn read_blocks(
        &self,
        start: u64,
        bps: &[BlockPointer],
    ) -> Result<Vec<(u64, Option<Fetched>)>, StoreError> {
        if bps.len() > 1 {
            if let Ok(span) = self.pool.read_span(bps).await {
                let span = Arc::new(span);
                let mut at = 0usize;
                let mut out = Vec::with_capacity(bps.len());
                for (i, bp) in bps.iter().enumerate() {
                    let len = bp.psize_bytes() as usize;
                    out.push((start + i as u64, Some(Fetched::Span(Arc::clone(&span), at))));
                    at += len;
                }
                return Ok(out);
            }
        }
        let mut out = Vec::with_capacity(bps.len());
        for (i, bp) in bps.iter().enumerate() {
            let block = self.pool.read_block_cached(bp, crate::tunables::IoClass::SyncRead).await?;
            out.push((start + i as u64, Some(Fetched::Disk(block))));
        }
        Ok(out)
    }

    /// Writes `data` at `offset` into the open txg. `None` writes zeros (trim, write-zeroes):
    /// whole blocks become holes. Live writes are appended to the volume's intent log in the
    /// same critical section that puts their blocks in the open txg, so the log's order is
    /// the order in which the blocks changed; returns the record's sequence. Replayed writes
    /// are not logged again; they advance the volume's replayed sequence instead, which the
    /// sync that writes their blocks records.
    async fn modify(
        &self,
        volume: &str,
        offset: u64,
        len: u64,
        data: Option<&[u8]>,
        apply: Apply,
    ) -> Result<u64, StoreError> {
        self.check_live()?;
        let entry = self.volume_entry(volume)?;
        Self::check_range(&entry, offset, len)?;
        if len == 0 {
            // Nothing changes, so nothing is logged; the last record still covers the caller.
            return Ok(self.volume_log(volume)?.map_or(0, |log| log.last_record()));
        }
        let bs = u64::from(entry.block_bytes);
        // Refuse what could not be synced: new dirty data beyond the free space above the slop,
        // after what the open and syncing txgs will allocate (their data and an estimate of
        // their indirect blocks; counting data alone let random 4 KiB overwrites of a nearly
        // full pool spend the slop on indirect blocks and fail a sync). Space that is only in
        // flight (dirty data about to replace old blocks, frees waiting out their deferral)
        // comes back as txgs sync: wait for it, as ZFS does, before saying no. After the
        // deferral window has passed, what is still missing is missing. The indirect blocks
        // need whole free ranges of their size, which a pool full of 4 KiB holes lacks even
        // with bytes to spare, so their estimate is also checked against the free space in
        // ranges that can hold them, less part of the slop (space maps, the directory).
        if apply == Apply::Live && data.is_some() {
            let mut waited = 0;
            loop {
                // One lock at a time: the lock order is state -> allocator.
                let (dirty, metadata) = {
                    let state = self.state.lock();
                    let metadata = state.dirty_metadata_bytes + state.syncing_metadata_bytes;
                    (state.dirty_bytes + state.dirty_metadata_bytes + state.syncing_bytes, metadata)
                };
                let (usable, room, deferred) = {
                    let allocator = self.allocator.lock();
                    let slop = allocator.slop_bytes();
                    let usable = allocator.free_bytes().saturating_sub(slop);
                    let room = allocator.metadata_room_bytes().saturating_sub(slop / 4);
                    (usable, room, allocator.deferred_bytes())
                };
                if dirty.saturating_add(len) <= usable && metadata <= room {
                    break;
                }
                if waited > crate::alloc::FREE_DEFER_TXGS || (dirty == 0 && deferred == 0) {
                    return Err(StoreError::NoSpace {
                        pool: self.pool.name().to_owned(),
                        requested_bytes: len,
                    });
                }
                self.sync().await?;
                waited += 1;
            }
        }
        self.throttle(volume).await?;
        let end = offset + len;
        let (first, last) = (offset / bs, (end - 1) / bs);
        // Whole blocks are built outside the lock.
        let mut whole: Vec<(u64, Block)> = Vec::new();
        for index in first..=last {
            let (from, to) = ((index * bs).max(offset), ((index + 1) * bs).min(end));
            if to - from == bs {
                let block = match data {
                    Some(d) => Block::Data(Arc::new(
                        d[(from - offset) as usize..(to - offset) as usize].to_vec(),
                    )),
                    None => Block::Zero,
                };
                whole.push((index, block));
            }
        }
        let partial: Vec<u64> = [first, last]
            .into_iter()
            .filter(|&i| {
                let (from, to) = ((i * bs).max(offset), ((i + 1) * bs).min(end));
                to - from != bs
            })
            .collect::<std::collections::BTreeSet<u64>>()
            .into_iter()
            .collect();
        let (sequence, resolve_now) = {
            let mut state_guard = self.state.lock();
            let state = &mut *state_guard;
            let open_txg = state.open_txg;
            let v = state.volumes.get_mut(volume).ok_or_else(|| self.no_such_volume(volume))?;
            let mut added = 0u64;
            // Groups of blocks under one level-1 indirect block that had nothing dirty yet:
            // each will rewrite its path to the root.
            let metadata_per_group = u64::from(v.entry.levels) * objset::INDIRECT_BYTES as u64;
            let group = objset::INDIRECT_BPS;
            let new_groups = (first / group..=last / group)
                .filter(|g| v.open.range(g * group..(g + 1) * group).next().is_none())
                .count() as u64;
            // A lone request keeps its patches for later: it is answered without a read, and
            // the sync reads the blocks. With other requests in flight, or under write
            // pressure, the writer completes its own patches now (below), as before patches
            // existed: measured with 8 and 32 sync writers, a sync that must read a txg's worth
            // of blocks at once delays the log flushes every writer waits for
            // (docs/bench/peers-notes.md).
            let pressure = v.requests.load(Ordering::Relaxed) > 1
                || state.dirty_bytes >= self.limits.delay_min / 2;
            let mut resolve_now = Vec::new();
            for &index in &partial {
                let (from, to) = ((index * bs).max(offset), ((index + 1) * bs).min(end));
                let (at, n) = ((from - index * bs) as usize, (to - from) as usize);
                let bytes = data.map(|d| &d[(from - offset) as usize..(to - offset) as usize]);
                // A version in memory is patched in place; none means the version below is on
                // disk, and this write becomes a patch over it, read only when needed.
                let base = match v.open.get(&index).or_else(|| v.syncing.get(&index)) {
                    Some(Block::Data(current)) => Ok(current.as_ref().clone()),
                    Some(Block::Zero) => Ok(vec![0u8; bs as usize]),
                    Some(Block::Patched(patch)) if v.open.contains_key(&index) => {
                        Err(patch.as_ref().clone())
                    }
                    Some(Block::Patched(_)) | None => Err(Patch::new(bs)),
                };
                let block = match base {
                    Ok(mut whole) => {
                        match bytes {
                            Some(b) => whole[at..at + n].copy_from_slice(b),
                            None => whole[at..at + n].fill(0),
                        }
                        Block::Data(Arc::new(whole))
                    }
                    Err(mut patch) => {
                        patch.write(at, n, bytes);
                        if patch.complete() {
                            Block::Data(Arc::new(patch.data))
                        } else {
                            if pressure {
                                resolve_now.push(index);
                            }
                            Block::Patched(Arc::new(patch))
                        }
                    }
                };
                v.open.insert(index, block);
                added += bs;
            }
            for (index, block) in whole.drain(..) {
                if let Block::Data(_) = &block {
                    added += bs;
                }
                v.open.insert(index, block);
            }
            let sequence = match apply {
                Apply::Live => match &v.log {
                    Some(log) => append_records(
                        log,
                        self.pool.env().now(),
                        open_txg,
                        offset,
                        len,
                        data,
                        self.limits.log_block_bytes_max,
                    ),
                    None => 0,
                },
                Apply::Replay(sequence) => {
                    if let Some(header) = v.entry.log.as_mut() {
                        header.replayed_record = sequence;
                    }
                    0
                }
            };
            state.dirty_bytes += added;
            v.dirty_bytes += added;
            state.dirty_metadata_bytes += new_groups * metadata_per_group;
            (sequence, resolve_now)
        };
        for index in resolve_now {
            self.resolve_patch(volume, &entry, index).await?;
        }
        Ok(sequence)
    }

    /// Completes block `index`'s patch in the open txg from the version below it, unless a
    /// quiesce moved the layers meanwhile (then the sync completes it).
    async fn resolve_patch(
        &self,
        volume: &str,
        entry: &VolumeEntry,
        index: u64,
    ) -> Result<(), StoreError> {
        let (open_txg, syncing, root, levels) = {
            let state = self.state.lock();
            let Some(v) = state.volumes.get(volume) else { return Ok(()) };
            if !matches!(v.open.get(&index), Some(Block::Patched(_))) {
                return Ok(());
            }
            (state.open_txg, v.syncing.get(&index).cloned(), v.entry.root, v.disk_levels)
        };
        let bs = entry.block_bytes as usize;
        let disk = || async {
            Ok::<_, StoreError>(
                objset::read_data_block(&self.pool, root, levels, index)
                    .await?
                    .map(|d| d[..bs].to_vec()),
            )
        };
        let base: Option<Vec<u8>> = match syncing {
            Some(Block::Data(data)) => Some(data.as_ref().clone()),
            Some(Block::Zero) => None,
            Some(Block::Patched(patch)) => Some(patch.apply_owned(disk().await?)),
            None => disk().await?,
        };
        let mut state = self.state.lock();
        if state.open_txg != open_txg {
            return Ok(());
        }
        if let Some(v) = state.volumes.get_mut(volume) {
            if let Some(Block::Patched(patch)) = v.open.get(&index) {
                let whole = patch.apply_owned(base);
                v.open.insert(index, Block::Data(Arc::new(whole)));
            }
        }
        Ok(())
    }

    /// Which parts of `[offset, offset+len)` hold data and which are holes (never written,
    /// trimmed or zeroed), as runs of (length, allocated), at block granularity. Holes read
    /// as zeros; a block written with zeros counts as allocated.
    pub async fn block_status(
        &self,
        volume: &str,
        offset: u64,
        len: u64,
    ) -> Result<Vec<(u64, bool)>, StoreError> {
        self.check_live()?;
        let entry = self.volume_entry(volume)?;
        Self::check_range(&entry, offset, len)?;
        let bs = u64::from(entry.block_bytes);
        let mut runs: Vec<(u64, bool)> = Vec::new();
        let mut at = offset;
        while at < offset + len {
            let index = at / bs;
            let n = (bs - at % bs).min(offset + len - at);
            let cached = {
                let state = self.state.lock();
                let volume = state.volumes.get(&entry.name);
                volume.and_then(|v| v.cached(index).cloned())
            };
            let allocated = match cached {
                Some(Block::Data(_) | Block::Patched(_)) => true,
                Some(Block::Zero) => false,
                None => {
                    let (root, levels) = {
                        let state = self.state.lock();
                        let v = state.volumes.get(&entry.name);
                        (v.and_then(|v| v.entry.root), v.map_or(entry.levels, |v| v.disk_levels))
                    };
                    objset::is_allocated(&self.pool, root, levels, index).await?
                }
            };
            match runs.last_mut() {
                Some((run, kind)) if *kind == allocated => *run += n,
                _ => runs.push((n, allocated)),
            }
            at += n;
        }
        Ok(runs)
    }

    /// Applies backpressure before a write to `volume`: wake the syncer early, delay smoothly
    /// above the threshold, and at the maximum sync before continuing. Volumes holding less
    /// than an equal share of the dirty data skip the delay and may use a reserve past the
    /// maximum (an eighth of it); past that they wait too.
    async fn throttle(&self, volume: &str) -> Result<(), StoreError> {
        let (dirty, under_share) = {
            let state = self.state.lock();
            let mine = state.volumes.get(volume).map_or(0, |v| v.dirty_bytes);
            // The writer's volume counts even before its first dirty block.
            let dirtying = state
                .volumes
                .iter()
                .filter(|(name, v)| v.dirty_bytes > 0 || name.as_str() == volume)
                .count() as u64;
            (state.dirty_bytes, dirtying > 1 && mine.saturating_mul(dirtying) < state.dirty_bytes)
        };
        if dirty >= self.limits.dirty_max / 4 {
            if let Some(kick) = self.kick.lock().as_mut() {
                // A full channel means a kick is already pending; that is enough.
                let _ = kick.try_send(());
            }
        }
        let stats = &self.throttle_stats;
        let since = |start: crate::rt::Time| {
            u64::try_from(self.pool.env().now().since(start).as_nanos()).unwrap_or(u64::MAX)
        };
        // A volume that is not filling the budget may go into a reserve past the maximum (an
        // eighth of it), so another volume's stream does not stall it behind a whole sync.
        let limit = if under_share {
            self.limits.dirty_max + self.limits.dirty_max / 8
        } else {
            self.limits.dirty_max
        };
        if under_share && dirty >= self.limits.dirty_max && dirty < limit {
            stats.spared.inc();
            return Ok(());
        }
        if dirty >= limit {
            // Every writer that finds the maximum waits for a sync, but one sync is enough for
            // all of them: whoever gets the lock after it finds the dirty data gone and goes
            // on. (Each syncing in turn made a storm of empty syncs that serialized writers.)
            let start = self.pool.env().now();
            let one_at_a_time = self.sync_lock.lock().await;
            let result = if self.state.lock().dirty_bytes >= limit {
                self.sync_holding_lock(one_at_a_time).await.map(drop)
            } else {
                Ok(())
            };
            stats.waited_for_sync.inc();
            stats.waited_nanos.add(since(start));
            return result;
        }
        let delay = self.limits.delay(dirty);
        if under_share && !delay.is_zero() {
            stats.spared.inc();
        } else if !delay.is_zero() {
            let start = self.pool.env().now();
            self.pool.env().sleep(delay).await;
            stats.delayed.inc();
            stats.delayed_nanos.add(since(start));
        }
        Ok(())
    }

    /// Writes `data` at `offset`. The write is visible at once and durable after the next
    /// txg sync or a [`Store::commit`] of the returned record sequence (FUA, flush).
    pub async fn write(&self, volume: &str, offset: u64, data: &[u8]) -> Result<u64, StoreError> {
        self.modify(volume, offset, data.len() as u64, Some(data), Apply::Live).await
    }

    /// Zeroes a range; whole blocks become holes and their space is freed at the next sync.
    /// Logged like a write; returns the record sequence.
    pub async fn zero(&self, volume: &str, offset: u64, len: u64) -> Result<u64, StoreError> {
        self.modify(volume, offset, len, None, Apply::Live).await
    }

    /// A write that is durable when this returns (NBD's FUA): commits up to its own record.
    pub async fn write_durable(
        &self,
        volume: &str,
        offset: u64,
        data: &[u8],
    ) -> Result<(), StoreError> {
        let sequence = self.write(volume, offset, data).await?;
        self.commit(volume, sequence).await
    }

    /// Makes every write and zero on `volume` that returned before this call durable (NBD's
    /// FLUSH; it covers every connection to the volume).
    pub async fn flush(&self, volume: &str) -> Result<(), StoreError> {
        let log = self.volume_log(volume)?;
        let last = log.as_ref().map_or(0, |log| log.last_record());
        self.commit(volume, last).await
    }

    /// The volume's request limit, shared by every handle on it (`volume.request_threads`).
    pub fn request_gate(
        &self,
        volume: &str,
    ) -> Result<Option<Arc<async_lock::Semaphore>>, StoreError> {
        self.state
            .lock()
            .volumes
            .get(volume)
            .map(|v| v.gate.clone())
            .ok_or_else(|| self.no_such_volume(volume))
    }

    /// The counter of requests in flight on `volume`, shared by every handle on it.
    pub fn request_counter(
        &self,
        volume: &str,
    ) -> Result<Arc<std::sync::atomic::AtomicUsize>, StoreError> {
        self.state
            .lock()
            .volumes
            .get(volume)
            .map(|v| Arc::clone(&v.requests))
            .ok_or_else(|| self.no_such_volume(volume))
    }

    fn volume_log(&self, volume: &str) -> Result<Option<Arc<LogWriter>>, StoreError> {
        self.state
            .lock()
            .volumes
            .get(volume)
            .map(|v| v.log.clone())
            .ok_or_else(|| self.no_such_volume(volume))
    }

    /// Returns once record `sequence` of `volume`'s log and every earlier one are durable:
    /// through the log when its chain is anchored and healthy, else through a txg sync.
    pub async fn commit(&self, volume: &str, sequence: u64) -> Result<(), StoreError> {
        self.check_live()?;
        let Some(log) = self.volume_log(volume)? else {
            // Replay is still running: only a sync makes anything durable.
            self.sync().await?;
            return Ok(());
        };
        log.note_commit();
        if log.durable_record() >= sequence {
            return Ok(());
        }
        self.log_stats.commits.inc();
        if log.anchored() {
            match log.commit(&self.pool, &self.allocator, sequence).await {
                Ok(()) => return Ok(()),
                // The sync below covers the record, and replaces the failed chain.
                Err(LogError::Failed { .. } | LogError::Pool(_)) => {}
            }
        }
        self.log_stats.commits_via_txg.inc();
        // The record's txg is at most the open one, which this sync makes durable.
        self.sync().await?;
        Ok(())
    }

    /// Starts writing record `sequence` to `volume`'s log now, without waiting, when the log
    /// asks for it (`intent_log.early_commit`, [`LogWriter::wants_early`]); the caller is a
    /// write that was the only request in flight on the volume. A failure is left to the
    /// client's own commit, which falls back to a txg sync.
    pub fn commit_early(self: &Arc<Self>, volume: &str, sequence: u64) {
        if !self.limits.early_commit {
            return;
        }
        let Ok(Some(log)) = self.volume_log(volume) else { return };
        if !log.wants_early() {
            return;
        }
        self.log_stats.early_commits.inc();
        let store = Arc::clone(self);
        self.pool.env().spawn("early log commit", async move {
            let _ = log.commit(&store.pool, &store.allocator, sequence).await;
        });
    }

    /// Writes the open txg out and makes it durable. Returns the synced txg.
    pub async fn sync(&self) -> Result<u64, StoreError> {
        let one_at_a_time = self.sync_lock.lock().await;
        self.sync_holding_lock(one_at_a_time).await
    }

    async fn sync_holding_lock(
        &self,
        _one_at_a_time: futures::lock::MutexGuard<'_, ()>,
    ) -> Result<u64, StoreError> {
        self.check_live()?;
        let result = self.sync_locked().await;
        // Synced, the txg's blocks are allocated (and counted as such); failed, the store is
        // suspended.
        {
            let mut state = self.state.lock();
            state.syncing_bytes = 0;
            state.syncing_metadata_bytes = 0;
        }
        if let Err(error) = &result {
            *self.suspend_cause.lock() = Some(error.to_string());
            self.suspended.store(true, Ordering::Relaxed);
        }
        result
    }

    async fn sync_locked(&self) -> Result<u64, StoreError> {
        let name = self.pool.name().to_owned();
        let no_space = |source: AllocError| PoolError::NoSpace { pool: name.clone(), source };
        // Quiesce: the open txg becomes the syncing one.
        let (txg, work, destroyed) = {
            let mut state = self.state.lock();
            let txg = state.open_txg;
            state.open_txg += 1;
            state.syncing_bytes = state.dirty_bytes + state.dirty_metadata_bytes;
            state.syncing_metadata_bytes = state.dirty_metadata_bytes;
            state.dirty_bytes = 0;
            state.dirty_metadata_bytes = 0;
            let mut work = Vec::new();
            for volume in state.volumes.values_mut() {
                volume.dirty_bytes = 0;
                volume.syncing = std::mem::take(&mut volume.open);
                work.push((volume.entry.clone(), volume.disk_levels, volume.syncing.clone()));
            }
            let destroyed = std::mem::take(&mut state.destroyed);
            (txg, work, destroyed)
        };
        // A volume still replaying records its progress as of this quiesce: records applied
        // after it belong to the next txg.
        let replay_progress: BTreeMap<String, Option<LogHeader>> =
            work.iter().map(|(entry, _, _)| (entry.name.clone(), entry.log)).collect();
        let mut ctx =
            TreeUpdate { pool: &self.pool, allocator: &self.allocator, txg, replaced: Vec::new() };
        let mut roots = BTreeMap::new();
        for (root, levels) in destroyed {
            for (_, _, bp) in objset::walk(&self.pool, Some(root), levels).await? {
                ctx.replaced.push(bp);
            }
        }
        for (entry, disk_levels, blocks) in work {
            // Patched blocks are completed first, up to SYNC_WRITES_IN_FLIGHT at once, in
            // block order. Blocks of ordinary volumes are then allocated in that order and
            // written in spans (objset::write_blocks). Blocks of dedup volumes are hashed and
            // looked up in tasks of their own, so that work spreads over the runtime's
            // threads, as ZFS's write-issue taskq spreads it over CPUs.
            let dedup = entry.dedup;
            let (root, block_bytes) = (entry.root, entry.block_bytes as usize);
            let completed = futures::stream::iter(blocks.into_iter().map(|(index, block)| {
                self.complete_block(root, disk_levels, block_bytes, index, block)
            }))
            .buffered(SYNC_WRITES_IN_FLIGHT);
            let updates: BTreeMap<u64, Option<BlockPointer>> = if dedup == DedupMode::Off {
                let per_span = (objset::WRITE_SPAN_BYTES_MAX as usize / block_bytes).max(1);
                let ctx = &ctx;
                let written: Vec<Vec<(u64, Option<BlockPointer>)>> = completed
                    .try_chunks(per_span)
                    .map_err(|futures::stream::TryChunksError(_, e)| e)
                    .map_ok(|chunk| async move {
                        let mut data = Vec::with_capacity(chunk.len());
                        for (_, block) in &chunk {
                            match block {
                                Block::Data(bytes) => data.push(objset::NewBlock {
                                    bytes: Arc::clone(bytes),
                                    kind: BlockKind::Data,
                                    level: 0,
                                    fill: 1,
                                }),
                                Block::Zero => {}
                                Block::Patched(_) => unreachable!("patches are completed above"),
                            }
                        }
                        let mut bps = objset::write_blocks(ctx, data, AllocClass::Reserved)
                            .await?
                            .into_iter();
                        Ok::<_, PoolError>(
                            chunk
                                .into_iter()
                                .map(|(index, block)| match block {
                                    Block::Data(_) => (index, bps.next()),
                                    _ => (index, None),
                                })
                                .collect(),
                        )
                    })
                    .try_buffer_unordered(SPANS_IN_FLIGHT)
                    .try_collect()
                    .await?;
                written.into_iter().flatten().collect()
            } else {
                let verify = dedup == DedupMode::Verify;
                completed
                    .map_ok(|(index, block)| async move {
                        let bp = match block {
                            Block::Data(data) => {
                                Some(self.spawn_dedup_write(txg, data, verify).await?)
                            }
                            Block::Zero => None,
                            Block::Patched(_) => unreachable!("patches are completed above"),
                        };
                        Ok::<_, PoolError>((index, bp))
                    })
                    .try_buffer_unordered(SYNC_WRITES_IN_FLIGHT)
                    .try_collect()
                    .await?
            };
            let grown = objset::grow_levels(&ctx, entry.root, disk_levels, entry.levels).await?;
            let root = if updates.is_empty() {
                grown
            } else {
                objset::update_tree(&mut ctx, grown, entry.levels, &updates).await?
            };
            roots.insert(entry.name.clone(), root);
        }
        // Replaced dedup blocks drop a reference; then the table is written, which hands back
        // the blocks left without references along with its own replaced blocks.
        let (shared, mut replaced): (Vec<BlockPointer>, Vec<BlockPointer>) =
            std::mem::take(&mut ctx.replaced).into_iter().partition(|bp| bp.dedup.is_some());
        let (ddt, pool) = (&*self.ddt, &*self.pool);
        futures::stream::iter(
            shared.into_iter().map(|bp| async move { ddt.free(pool, &bp).await }),
        )
        .buffer_unordered(SYNC_WRITES_IN_FLIGHT)
        .try_collect::<Vec<()>>()
        .await?;
        let ddt_header = self.ddt.flush(&mut ctx).await?;
        replaced.append(&mut ctx.replaced);
        // Free what this txg replaced, and the previous directory and space maps.
        let (old_maps, old_directory, vdevs) = {
            let state = self.state.lock();
            (state.space_maps.clone(), state.directory, state.space_maps.len())
        };
        {
            let mut allocator = self.allocator.lock();
            for bp in replaced.iter().chain(old_maps.iter().flatten()).chain(old_directory.iter()) {
                self.pool.cache().remove(bp);
                for dva in bp.copies() {
                    allocator.free(txg, dva.vdev, dva.offset_bytes(), dva.asize_bytes());
                }
            }
        }
        // Each log's head as of this txg; blocks holding only records of this txg or earlier
        // are freed in it, as are retired chains.
        let mut anchored = Vec::new();
        let mut headers = BTreeMap::new();
        let mut directory = {
            let mut state = self.state.lock();
            let mut freed_log = std::mem::take(&mut state.retired_log);
            for v in state.volumes.values() {
                let header = match &v.log {
                    Some(log) => {
                        let anchor = log.anchor(txg);
                        freed_log.extend(anchor.freed);
                        anchored.push(Arc::clone(log));
                        Some(LogHeader {
                            chain_id: log.chain_id(),
                            head_sequence: anchor.head_verifier.sequence,
                            replayed_record: 0,
                            claim_txg: 0,
                            head: anchor.head.pointer(txg),
                        })
                    }
                    None => replay_progress.get(&v.entry.name).copied().unwrap_or(v.entry.log),
                };
                headers.insert(v.entry.name.clone(), header);
            }
            let mut allocator = self.allocator.lock();
            for at in freed_log {
                allocator.free_log(txg, at.vdev, at.offset_bytes, u64::from(at.len_bytes));
            }
            drop(allocator);
            PoolDirectory {
                txg,
                next_volume_id: state.next_volume_id,
                space_maps: vec![Vec::new(); vdevs],
                volumes: state
                    .volumes
                    .values()
                    .map(|v| VolumeEntry {
                        root: roots.get(&v.entry.name).copied().flatten(),
                        log: headers.get(&v.entry.name).copied().flatten(),
                        ..v.entry.clone()
                    })
                    .collect(),
                ddt: ddt_header,
            }
        };
        // Allocate the space-map pieces before encoding any map, so every map includes them.
        // One piece more than the map needs now leaves room for the entries that these
        // allocations and the directory's add.
        let (map_blocks, directory_block, maps) = {
            let mut allocator = self.allocator.lock();
            let mut blocks = Vec::new();
            for vdev in 0..vdevs as u32 {
                let need = split_space_map(&allocator.space_map(vdev)).len() + 1;
                let mut pieces = Vec::with_capacity(need);
                for _ in 0..need {
                    pieces.push(
                        allocator
                            .allocate(SPACE_MAP_PIECE_BYTES, AllocClass::Reserved, &[])
                            .map_err(no_space)?,
                    );
                }
                blocks.push(pieces);
            }
            let pieces: usize = blocks.iter().map(Vec::len).sum();
            let directory_bytes = allocator
                .asize((directory.encoded_len() + pieces * sluice_format::BLKPTR_BYTES) as u64);
            let directory_block =
                allocator.allocate(directory_bytes, AllocClass::Reserved, &[]).map_err(no_space)?;
            let maps: Vec<SpaceMap> = (0..vdevs as u32).map(|v| allocator.space_map(v)).collect();
            (blocks, directory_block, maps)
        };
        for (vdev, (map, blocks)) in maps.iter().zip(&map_blocks).enumerate() {
            let mut pieces = split_space_map(map);
            assert!(
                pieces.len() <= blocks.len(),
                "space map of vdev {vdev} outgrew its pieces ({} > {})",
                pieces.len(),
                blocks.len()
            );
            // Unused pieces are written empty: every allocated block is part of the map.
            while pieces.len() < blocks.len() {
                pieces.push(SpaceMap {
                    ashift: map.ashift,
                    synced_txg: map.synced_txg,
                    free: Vec::new(),
                    deferred: Vec::new(),
                });
            }
            let writes = pieces.iter().zip(blocks).map(|(piece, &(at_vdev, offset, asize))| {
                let name = name.clone();
                async move {
                    let bytes = piece
                        .encode()
                        .map_err(|source| PoolError::Format { pool: name.clone(), source })?;
                    debug_assert!(bytes.len() as u64 <= asize, "a piece fits its block");
                    let mut padded = AlignedBuf::zeroed(asize as usize);
                    padded[..bytes.len()].copy_from_slice(&bytes);
                    self.pool
                        .write_block_at(
                            at_vdev,
                            offset,
                            padded.into_shared(),
                            bytes.len() as u64,
                            BlockKind::Metadata,
                            0,
                            1,
                            txg,
                        )
                        .await
                }
            });
            directory.space_maps[vdev] = futures::future::try_join_all(writes).await?;
        }
        let (at_vdev, offset, asize) = directory_block;
        let bytes = directory
            .encode(asize as usize)
            .map_err(|source| PoolError::Format { pool: name.clone(), source })?;
        let directory_bp = self
            .pool
            .write_block_at(
                at_vdev,
                offset,
                AlignedBuf::copy_from(&bytes).into_shared(),
                asize,
                BlockKind::Metadata,
                0,
                1,
                txg,
            )
            .await?;
        let synced = self.pool.sync_uberblock(Some(directory_bp)).await?;
        self.syncs.inc();
        debug_assert_eq!(synced, txg, "the uberblock txg follows the store's txgs");
        self.allocator.lock().synced(txg);
        let mut state = self.state.lock();
        for volume in state.volumes.values_mut() {
            if let Some(root) = roots.get(&volume.entry.name) {
                volume.entry.root = *root;
                volume.disk_levels = volume.entry.levels;
            }
            if let Some(header) = headers.get(&volume.entry.name) {
                volume.entry.log = *header;
            }
            volume.syncing.clear();
        }
        state.space_maps = directory.space_maps;
        state.directory = Some(directory_bp);
        // Records of this txg need no log any more. A chain with a failed write is replaced:
        // records not yet issued move to a new chain, which the next sync anchors.
        let mut replaced = Vec::new();
        for volume in state.volumes.values_mut() {
            let Some(log) = &volume.log else { continue };
            log.synced(txg, anchored.iter().any(|a| Arc::ptr_eq(a, log)));
            if log.failed() {
                let fresh = LogWriter::continuing(
                    self.pool.name(),
                    &self.allocator,
                    self.limits.log_policy,
                    self.limits.commit_timeout_pct,
                    self.chain_id(),
                    volume.entry.id,
                    self.limits.log_block_bytes_max,
                    log.hand_over(txg),
                )?;
                replaced.extend(log.retire());
                volume.log = Some(Arc::new(fresh));
            }
        }
        state.retired_log.extend(replaced);
        Ok(txg)
    }

    /// A syncing block ready to write: a patch is completed from the version on disk, which
    /// is the one it was written over (syncs run one at a time). Read at async priority and
    /// not cached: the sync must not crowd out the log writes and reads clients wait for, and
    /// the old block is going away.
    async fn complete_block(
        &self,
        root: Option<BlockPointer>,
        disk_levels: u8,
        block_bytes: usize,
        index: u64,
        block: Block,
    ) -> Result<(u64, Block), PoolError> {
        let Block::Patched(patch) = block else { return Ok((index, block)) };
        // The version below is about to be replaced: taken from the cache when there, but a
        // miss is read past it (caching a block this sync frees would only evict live ones).
        let base = match objset::data_block_pointer(&self.pool, root, disk_levels, index).await? {
            Some(bp) => Some(match self.pool.cache().get(&bp) {
                Some(hit) => hit,
                None => {
                    Arc::new(self.pool.read_block(&bp, crate::tunables::IoClass::AsyncRead).await?)
                }
            }),
            None => None,
        };
        let base = base.as_ref().map(|b| &b[..block_bytes]);
        Ok((index, Block::Data(Arc::new(patch.apply(base)))))
    }

    /// Writes one block of a dedup volume through the table, in a task of its own.
    async fn spawn_dedup_write(
        &self,
        txg: u64,
        data: Arc<Vec<u8>>,
        verify: bool,
    ) -> Result<BlockPointer, PoolError> {
        let (tx, rx) = futures::channel::oneshot::channel();
        let (ddt, pool, allocator) =
            (Arc::clone(&self.ddt), Arc::clone(&self.pool), Arc::clone(&self.allocator));
        self.pool.env().spawn("dedup write", async move {
            let written = ddt.write(&pool, &allocator, txg, data, verify).await;
            // Dropped before answering, so that no task still holds the pool when the sync
            // that waits for this answer returns (export unwraps it).
            drop((ddt, pool, allocator));
            let _ = tx.send(written);
        });
        rx.await.unwrap_or_else(|_| {
            Err(PoolError::Format {
                pool: self.pool.name().to_owned(),
                source: sluice_format::FormatError::Invalid {
                    what: "dedup write task",
                    field: "ended without an answer in txg",
                    value: txg,
                },
            })
        })
    }

    /// Syncs and closes.
    pub async fn export(self) -> Result<(), StoreError> {
        self.sync().await?;
        let name = self.pool.name().to_owned();
        let pool = Arc::try_unwrap(self.pool).map_err(|_| {
            StoreError::Pool(PoolError::Format {
                pool: name,
                source: sluice_format::FormatError::Invalid {
                    what: "pool",
                    field: "still in use by a task at export",
                    value: 0,
                },
            })
        })?;
        Ok(pool.export().await?)
    }
}

/// Bytes of one space-map piece: small enough to fit the holes of a fragmented pool.
const SPACE_MAP_PIECE_BYTES: u64 = 16 << 10;

/// Splits a space map into pieces that each encode within `SPACE_MAP_PIECE_BYTES`, keeping the
/// order of its ranges (concatenated, the pieces are the map).
fn split_space_map(map: &SpaceMap) -> Vec<SpaceMap> {
    let empty = || SpaceMap {
        ashift: map.ashift,
        synced_txg: map.synced_txg,
        free: Vec::new(),
        deferred: Vec::new(),
    };
    let limit = SPACE_MAP_PIECE_BYTES as usize;
    let mut pieces = vec![empty()];
    // Entry sizes: 16 bytes per free range, 24 per deferred free (space_map.rs).
    let mut used = empty().encoded_len();
    for &range in &map.free {
        if used + 16 > limit {
            pieces.push(empty());
            used = empty().encoded_len();
        }
        if let Some(piece) = pieces.last_mut() {
            piece.free.push(range);
        }
        used += 16;
    }
    for &deferred in &map.deferred {
        if used + 24 > limit {
            pieces.push(empty());
            used = empty().encoded_len();
        }
        if let Some(piece) = pieces.last_mut() {
            piece.deferred.push(deferred);
        }
        used += 24;
    }
    pieces
}

/// Whether a change comes from a client (and is logged) or from replaying the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Apply {
    Live,
    /// Replaying the record with this sequence.
    Replay(u64),
}

/// Appends the records of one change: a zero as one record, a write in pieces that each fit
/// the largest log block. Returns the last sequence.
fn append_records(
    log: &LogWriter,
    now: crate::rt::Time,
    txg: u64,
    offset: u64,
    len: u64,
    data: Option<&[u8]>,
    block_bytes_max: u32,
) -> u64 {
    let Some(data) = data else {
        return log.append(now, |sequence| LogRecord::Zero { txg, sequence, offset, len });
    };
    // Header, record header and write fields, rounded down to whole 4 KiB pieces.
    let piece = (block_bytes_max as usize - LOG_HEADER_BYTES - 40) / 4096 * 4096;
    let mut sequence = 0;
    for (i, chunk) in data.chunks(piece.max(512)).enumerate() {
        let at = offset + (i * piece.max(512)) as u64;
        sequence = log.append(now, |sequence| LogRecord::Write {
            txg,
            sequence,
            offset: at,
            data: chunk.to_vec(),
        });
    }
    sequence
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A space map split in pieces: each piece encodes within the piece size, and the pieces'
    /// ranges, in order, are the map's.
    #[test]
    fn space_maps_split_into_pieces() {
        let map = SpaceMap {
            ashift: 12,
            synced_txg: 9,
            free: (0..5000u64).map(|i| (i * 8192, 4096)).collect(),
            deferred: (0..3000u64).map(|i| (7, (1 << 40) | (i * 8192), 4096)).collect(),
        };
        let pieces = split_space_map(&map);
        assert!(pieces.len() > 5, "{} pieces", pieces.len());
        for piece in &pieces {
            assert!(piece.encode().unwrap().len() as u64 <= SPACE_MAP_PIECE_BYTES);
        }
        let free: Vec<_> = pieces.iter().flat_map(|p| p.free.iter().copied()).collect();
        let deferred: Vec<_> = pieces.iter().flat_map(|p| p.deferred.iter().copied()).collect();
        assert_eq!((free, deferred), (map.free.clone(), map.deferred.clone()));
        let small = SpaceMap { free: vec![(0, 4096)], deferred: vec![], ..map };
        assert_eq!(split_space_map(&small).len(), 1);
    }

    /// The write delay is zero below the threshold, grows monotonically towards the maximum,
    /// and is capped.
    #[test]
    fn delay_curve() {
        let limits =
            TxgLimits::from_tunables(&Tunables::with([("txg.dirty_max", "100M")]).unwrap());
        assert_eq!(limits.delay(limits.delay_min), std::time::Duration::ZERO);
        let mut last = std::time::Duration::ZERO;
        for step in 1..100u64 {
            let dirty = limits.delay_min + (limits.dirty_max - limits.delay_min) * step / 100;
            let delay = limits.delay(dirty);
            assert!(delay >= last && delay <= DELAY_MAX, "delay at {dirty}: {delay:?}");
            last = delay;
        }
        assert!(last > DELAY_SCALE);
    }
}
