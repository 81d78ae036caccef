//! Every tunable in one table: name, default, allowed range, documentation.
//!
//! Values are set by name from the command line or a config file and validated twice: each on
//! its own against its range or choices, then together (a class's minimum must not exceed its
//! maximum, which must not exceed the queue depth). A refused value names the tunable, the value
//! and what is allowed, so the person who typed it can fix it. Byte sizes accept K/M/G suffixes.

use std::fmt;

/// How a tunable's value is read and bounded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Count {
        min: u64,
        max: u64,
    },
    /// A count, or `auto` (stored as 0): the engine measures and chooses.
    CountOrAuto {
        min: u64,
        max: u64,
    },
    Bytes {
        min: u64,
        max: u64,
    },
    /// A byte count, or `auto` (stored as [`AUTO_BYTES`]): the engine sizes it from the machine.
    BytesOrAuto {
        min: u64,
        max: u64,
    },
    Micros {
        min: u64,
        max: u64,
    },
    Choice(&'static [&'static str]),
}

/// One row of the table.
#[derive(Clone, Copy, Debug)]
pub struct TunableDef {
    pub name: &'static str,
    pub kind: Kind,
    pub default: &'static str,
    pub doc: &'static str,
}

macro_rules! tunable_table {
    ($($variant:ident = $name:literal, $kind:expr, $default:literal, $doc:literal;)*) => {
        /// Names of all tunables, in table order.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Tunable { $($variant),* }

        /// The table, indexed by `Tunable as usize`.
        pub const TABLE: &[TunableDef] = &[
            $(TunableDef { name: $name, kind: $kind, default: $default, doc: $doc }),*
        ];

        const ALL: &[Tunable] = &[$(Tunable::$variant),*];
    };
}

/// The smallest cache `cache.bytes_max=auto` chooses.
pub const CACHE_AUTO_BYTES_MIN: u64 = 64 << 20;
/// `txg.dirty_max=auto`'s bounds. The floor was the fixed default before `auto`; with it a
/// sync started at 64 MiB of dirty data, which at 4 KiB random sync writes into 16 KiB blocks
/// meant a sync every half second rewriting most indirect blocks, 25 KiB written per write
/// against 16 KiB with 2 GiB (8 clients, 2026-11-26). The ceiling is ZFS's.
pub const DIRTY_AUTO_BYTES_MIN: u64 = 256 << 20;
pub const DIRTY_AUTO_BYTES_MAX: u64 = 4 << 30;

/// How an `auto` byte count is stored.
pub const AUTO_BYTES: u64 = u64::MAX;

const READ_POLICIES: &[&str] = &["least-pending", "offset-modulo", "round-robin"];
const LOG_POLICIES: &[&str] = &["auto", "pipelined", "batch"];
const DEDUP_LOCKING: &[&str] = &["entry", "global"];
const EARLY_COMMIT: &[&str] = &["auto", "off"];
const DELAY_SPACING: &[&str] = &["pool", "writer"];
const CACHE_CONTENTS: &[&str] = &["all", "metadata"];
const PLACEMENTS: &[&str] = &["home", "spread"];

tunable_table! {
    VdevQueues = "vdev.queues", Kind::Count { min: 1, max: 256 }, "1",
        "Submission queues per leaf. Each has its own scheduler and its own vdev.max_active, so \
         the device may hold queues x max_active commands. More than 1 reproduces seed 003's \
         many-hardware-queue setup, where a sync write waits behind every queued read.";
    VdevMaxActive = "vdev.max_active", Kind::CountOrAuto { min: 1, max: 65536 }, "auto",
        "I/Os a submission queue keeps in the device at once (queue depth). auto: each queue \
         measures its throughput and gives reads, async writes and scrub the shallowest depth \
         whose last step up still paid in throughput (12 on a 2 ms cloud disk, about 10 on an \
         HDD) while sync or log writes use the device; on a non-rotational leaf where none \
         has come for a second, sync reads (not scrub or the txg sync) may take any depth up \
         to 256 that gains at least 2%; sync and log writes get their own slots on top, so \
         they never wait for one, and class minimums are capped by the measured depth. A \
         number caps all classes together and the per-class maxima below apply, as in ZFS \
         (1000 is ZFS's default).";
    SyncReadMin = "vdev.sync_read_min_active", Kind::Count { min: 0, max: 65536 }, "10", "Minimum active sync reads per submission queue.";
    SyncReadMax = "vdev.sync_read_max_active", Kind::Count { min: 1, max: 65536 }, "10", "Maximum active sync reads per submission queue.";
    SyncWriteMin = "vdev.sync_write_min_active", Kind::Count { min: 0, max: 65536 }, "10", "Minimum active sync writes per submission queue.";
    SyncWriteMax = "vdev.sync_write_max_active", Kind::Count { min: 1, max: 65536 }, "10", "Maximum active sync writes per submission queue.";
    LogWriteMin = "vdev.log_write_min_active", Kind::Count { min: 0, max: 65536 }, "10", "Minimum active intent-log writes per submission queue.";
    LogWriteMax = "vdev.log_write_max_active", Kind::Count { min: 1, max: 65536 }, "10", "Maximum active intent-log writes per submission queue.";
    AsyncReadMin = "vdev.async_read_min_active", Kind::Count { min: 0, max: 65536 }, "1", "Minimum active async (prefetch) reads per submission queue.";
    AsyncReadMax = "vdev.async_read_max_active", Kind::Count { min: 1, max: 65536 }, "3", "Maximum active async (prefetch) reads per submission queue.";
    AsyncWriteMin = "vdev.async_write_min_active", Kind::Count { min: 0, max: 65536 }, "2", "Minimum active async (txg sync) writes per submission queue.";
    AsyncWriteMax = "vdev.async_write_max_active", Kind::Count { min: 1, max: 65536 }, "10", "Maximum active async (txg sync) writes per submission queue.";
    ScrubMin = "vdev.scrub_min_active", Kind::Count { min: 0, max: 65536 }, "1", "Minimum active scrub and resilver I/Os per submission queue.";
    ScrubMax = "vdev.scrub_max_active", Kind::Count { min: 1, max: 65536 }, "3", "Maximum active scrub and resilver I/Os per submission queue.";
    AggregationLimit = "vdev.aggregation_limit", Kind::Bytes { min: 0, max: 16 << 20 }, "1M",
        "Largest span adjacent queued I/Os are merged into on rotational leaves (0: no merging).";
    AggregationLimitNonRotating = "vdev.aggregation_limit_non_rotating", Kind::Bytes { min: 0, max: 16 << 20 }, "32K",
        "Largest merged span on non-rotational leaves. 32K, not ZFS's 128K: on a device with \
         deep internal parallelism and no per-command cost, merging four 32 KiB reads into one \
         command leaves gaps in its transfer pipeline (135 instead of 170 MB/s at the same \
         depth, docs/design.md); small writes still merge.";
    SyncPaceBytes = "vdev.sync_pace_bytes", Kind::BytesOrAuto { min: 0, max: 1 << 30 }, "0",
        "While the intent log flushes a leaf (a flush in flight, or one in the last 10 ms), the \
         txg sync's writes there are held after this many bytes until the next flush \
         completes, or with none in flight until a millisecond has passed. A device's flush \
         writes back all its cache holds, so each log flush then carries about this much of \
         the sync's data instead of a burst of megabytes: with 8 to 32 clients of 4 KiB write \
         + flush, 256K cut the flush p99 2-4x, at 6-13% fewer IOPS and a 3x higher flush p99 \
         for a lone client (docs/bench/peers-notes.md, 2026-12-02). auto: the budget follows the \
         sync, as many bytes as the last sync wrote to the leaf spread over half the txg \
         interval (more where the sync's queue asks for it, twice that past the half), nothing \
         held in the first sync. Either way what a flush's completion lets through waits for \
         the next log write and goes behind it. 0 (the default): no pacing, the sync writes \
         at the device's pace.";
    ReadGapLimit = "vdev.read_gap_limit", Kind::Bytes { min: 0, max: 1 << 20 }, "32K",
        "Largest gap between two queued reads that merging may read through and discard.";
    MirrorReadPolicy = "mirror.read_policy", Kind::Choice(READ_POLICIES), "least-pending",
        "How a mirror picks the child to read: least-pending (fewest pending I/Os plus locality \
         penalties, sticky among ties), offset-modulo (seed 002's before: (offset >> 21) % \
         children) or round-robin.";
    MirrorRotatingInc = "mirror.rotating_inc", Kind::Count { min: 0, max: 1000 }, "0",
        "Load added to a rotational child when the read starts where its last I/O ended.";
    MirrorRotatingSeekInc = "mirror.rotating_seek_inc", Kind::Count { min: 0, max: 1000 }, "16",
        "Load added to a rotational child for a seek; half of it within mirror.rotating_seek_offset \
         or in the child's own slice (zone) of the address range. \
         16, not ZFS's 5: on the default HDD model a seek costs about 14 transfers of a 128 KiB \
         record, and with 5 a 1 MiB read's records split across children (measured in \
         docs/bench/seeds-mirror.md).";
    MirrorRotatingSeekOffset = "mirror.rotating_seek_offset", Kind::Bytes { min: 0, max: 1 << 30 }, "1M",
        "Distance within which a rotational seek counts as short.";
    MirrorNonRotatingInc = "mirror.non_rotating_inc", Kind::Count { min: 0, max: 1000 }, "0",
        "Load added to a non-rotational child for a read that continues its last I/O.";
    MirrorNonRotatingSeekInc = "mirror.non_rotating_seek_inc", Kind::Count { min: 0, max: 1000 }, "1",
        "Load added to a non-rotational child for any other read.";
    TxgTimeoutMs = "txg.timeout_ms", Kind::Count { min: 1, max: 3_600_000 }, "5000",
        "A txg syncs at least this often (milliseconds), so acknowledged writes without a flush \
         reach the disk within about this time.";
    TxgDirtyMax = "txg.dirty_max", Kind::BytesOrAuto { min: 1 << 20, max: 1 << 40 }, "auto",
        "Dirty data the open txg may hold. auto: a tenth of the memory the process may use (the \
         machine's, or its control group's limit), between 256 MiB and 4 GiB (ZFS: \
         zfs_dirty_data_max); a bigger txg rewrites each indirect block and space map once for \
         more writes, and a block written again before its sync once. A sync starts at a \
         quarter of it (or when log blocks take three quarters of a vdev's log region); writers are \
         delayed more and more from txg.delay_min_dirty_pct of it, and at the maximum a writer \
         syncs before it may continue.";
    TxgDelayMinDirtyPct = "txg.delay_min_dirty_pct", Kind::Count { min: 1, max: 99 }, "60",
        "Percent of txg.dirty_max above which writers are delayed (ZFS: zfs_delay_min_dirty_percent).";
    TxgDelaySpacing = "txg.delay_spacing", Kind::Choice(DELAY_SPACING), "pool",
        "How the write throttle's delays add up. pool: each delayed write wakes at least its \
         delay after the one before it, so the delay is the time between writes of the pool \
         and the pool's write rate follows the curve whatever the number of writers (ZFS: \
         dp_last_wakeup); large writes sleep alone, and volumes under their share of the \
         dirty data are not delayed. writer (sluice before): each writer sleeps its delay alone, so 32 \
         writers at queue depth 1 pass 32 times the rate the curve sets.";
    IntentLogCommitTimeoutPct = "intent_log.commit_timeout_pct", Kind::Count { min: 0, max: 100 }, "10",
        "How long an open log block may wait for more records, as a percentage of the smoothed \
         log-block latency (ZFS: zfs_commit_timeout_pct): under pipelined while another block \
         is in flight, under auto only while three quarters of the log's slots are busy. A \
         lone writer never waits.";
    IntentLogPolicy = "intent_log.policy", Kind::Choice(LOG_POLICIES), "auto",
        "How sync writes are grouped into log writes. auto: groups of the waiting records, each \
         on one device and made durable by one flush; up to 1 group in flight per disk, 2 per \
         file (the second only once it carries an even share of what is outstanding) and 8 per \
         other device (intent_log.groups_per_vdev), beyond which only groups of records \
         logged by pointer start (their blocks are written unflushed, so such a group is a \
         write and then one flush whatever it carries, and takes every such record ready); \
         records that arrive together are spread over the free slots in even shares of what is \
         outstanding; blocks sized to what groups carry; near \
         saturation a group waits briefly for more records (intent_log.commit_timeout_pct). \
         pipelined (seed 004's after): many log blocks in flight, each written then flushed, \
         waiters woken block by block. batch (the before): one batch in flight; commits \
         arriving meanwhile wait for the next.";
    IntentLogGroupsPerVdev = "intent_log.groups_per_vdev", Kind::CountOrAuto { min: 1, max: 64 }, "auto",
        "Under the auto commit policy, log groups that may be in flight on each top-level vdev \
         that holds log blocks. auto: 1 when every such vdev has a leaf whose flushes cannot \
         overlap and one is rotational (a disk); 2 when so and none is rotational (files), the \
         second group starting only once it carries an even share of the records \
         outstanding; else 8. A number sets it for every vdev.";
    IntentLogEarlyCommit = "intent_log.early_commit", Kind::Choice(EARLY_COMMIT), "auto",
        "auto: when a volume's clients flush after nearly every write, a lone writer's record \
         is written to the log as soon as it is logged, so its flush finds the log block \
         already on its way (not under the batch policy; under auto only while log groups \
         carry about one record each). off: the log is written only when a client commits, \
         as ZFS does.";
    IntentLogBlockBytesMax = "intent_log.block_bytes_max", Kind::Bytes { min: 4096, max: 1 << 20 }, "128K",
        "Largest log block (a power of two). Blocks are sized from the recent workload between \
         4 KiB and this (ZFS: zil_maxblocksize); larger writes are logged in pieces. A volume \
         whose block would not fit one log block of this size, copied, gets log blocks up to \
         the next power of two that holds one, so its large writes are logged by pointer.";
    IntentLogImmediateWriteBytes = "intent_log.immediate_write_bytes", Kind::Bytes { min: 0, max: 1 << 30 }, "32K",
        "Writes at least this large (with logbias=latency) are written once, in place, and \
         the log records only their block pointers (ZFS: zfs_immediate_write_sz, WR_INDIRECT); \
         smaller ones are copied into the log. The partial blocks at a write's ends are copied \
         too (with logbias=throughput they are logged by pointer). 0 copies every write (sluice \
         before indirect records).";
    VolumeRequestThreads = "volume.request_threads", Kind::Count { min: 0, max: 65536 }, "0",
        "Requests one volume serves at once; 0 means unbounded (the client's queue depth and the \
         dirty-data throttle bound it). A number reproduces seed 000's capped zvol dispatch \
         (old ZFS default: one per CPU; the seed's fix: 32), where committers waiting for the \
         log hold every slot and log blocks stay small.";
    ZfetchMaxDistance = "zfetch.max_distance", Kind::Bytes { min: 0, max: 1 << 30 }, "16M",
        "How far ahead of a volume's sequential reads their blocks are fetched, at most (ZFS: \
         zfetch_max_distance). Each read that continues a stream doubles its distance up to \
         this; blocks fetched ahead are read in address order, near ones in one I/O, and held \
         until read or until the stream has been idle 2 s. 0 turns prefetch off.";
    ZfetchMaxStreams = "zfetch.max_streams", Kind::Count { min: 1, max: 64 }, "8",
        "Sequential read streams followed per volume (ZFS: zfetch_max_streams).";
    ZfetchRewriteRunBytes = "zfetch.rewrite_run_bytes", Kind::Bytes { min: 0, max: 128 << 10 }, "128K",
        "A read that continues a sequential stream and finds its blocks on disk in runs of \
         fewer bytes than this on average (random writes scattered them) hands the blocks it \
         read to the open txg, whose sync writes them side by side, so the next pass over \
         them reads in few large I/Os (WAFL's read reallocation). Blocks a snapshot, a clone's \
         origin or the dedup table shares are left where they are, and blocks are handed over \
         only while the open txg holds under a quarter of txg.dirty_max, the pool's free \
         space leaves twice the room, and its free ranges can take them in runs twice as \
         long as they were found in, or this long (where the free space is all small holes \
         they would lie as scattered as before). At most 128K; 0 turns it off.";
    VolumePlacement = "volume.placement", Kind::Choice(PLACEMENTS), "home",
        "Which serving core runs a volume's NBD connections (sluice serve). home: every \
         connection to one volume moves, once its client has chosen the volume, to that \
         volume's core (the one with the fewest connections when the volume gets its first), \
         so its writes and log commits never cross cores (but for the compression and \
         checksums of a large write, and the early fill of its parts); several volumes \
         spread over the cores, one volume uses one. spread: each connection stays on the \
         core it was accepted onto, round robin, so one volume's connections use every \
         core.";
    CoresIdlePollUs = "cores.idle_poll_us", Kind::Count { min: 0, max: 10_000 }, "200",
        "The longest a serving core polls its sockets and ring before it sleeps, in \
         microseconds (sluice serve). The window adapts between none and this, as Linux's \
         halt-polling governor's does: it widens while events come soon after the core gave \
         up, and shrinks to none while they do not, so a busy device's long waits cost no \
         polling; a core whose recent reads and writes average a quarter MiB or more sleeps \
         at once. On a VM, waking an idle core costs tens of microseconds, two or three times \
         per sync write at queue depth 1. 0: reap the ring and sleep at once.";
    CacheBytesMax = "cache.bytes_max", Kind::BytesOrAuto { min: 0, max: 1 << 40 }, "auto",
        "Memory for verified blocks (indirect and data), read from the pool or written by a \
         sync (ZFS: the ARC). auto: an eighth of the machine's memory, at least 64 MiB. 0 \
         disables caching.";
    CacheContents = "cache.contents", Kind::Choice(CACHE_CONTENTS), "all",
        "What the block cache keeps (ZFS: primarycache). all: data and metadata. metadata: \
         indirect blocks and pool metadata only, so every data read and every partial write's \
         completion goes to the devices (for comparisons with servers that run cache=none).";
    DedupLocking = "dedup.locking", Kind::Choice(DEDUP_LOCKING), "entry",
        "What guards a dedup entry while its block is written. entry (seed 001's after): a \
         per-entry lock covers the write's ready and done stages, so the table-wide lock is \
         taken twice per written block. global (the before): the table-wide lock, four times \
         per block.";
    DedupTableMemMax = "dedup.table_mem_max", Kind::Bytes { min: 1 << 20, max: 1 << 40 }, "64M",
        "Memory for dedup entries kept between txgs; beyond it, entries are dropped after each \
         sync and read back from their on-disk bucket when next needed.";
    VdevIoErrorsMax = "vdev.io_errors_max", Kind::Count { min: 1, max: 1_000_000 }, "10",
        "I/O errors (failed reads, writes and flushes, scrub's excepted) within \
         vdev.errors_window_ms after which a mirror leaf is faulted: taken out of service until \
         `pool clear` or `pool online` (zed's io_n). Never the leaf with the only good copy.";
    VdevChecksumErrorsMax = "vdev.checksum_errors_max", Kind::Count { min: 1, max: 1_000_000 }, "10",
        "Copies failing their checksum on reads (scrub's excepted) within \
         vdev.errors_window_ms after which a mirror leaf is degraded: read only when no \
         healthy copy is left (zed's checksum_n).";
    VdevErrorsWindowMs = "vdev.errors_window_ms", Kind::Count { min: 1, max: 86_400_000 }, "600000",
        "The window, in milliseconds, over which vdev.io_errors_max and \
         vdev.checksum_errors_max count (zed's io_t and checksum_t: 10 minutes).";
    PoolMetadataCopies = "pool.metadata_copies", Kind::Count { min: 1, max: 2 }, "2",
        "Copies of each indirect block and space-map piece (the pool directory gets one \
         more), on different top-level vdevs or, on one, an eighth of it apart: one bad \
         sector in an indirect block then costs nothing, even without a mirror, and reads \
         and scrubs heal one copy from the other (ZFS's ditto blocks, redundant_metadata=all). \
         1 keeps a single copy.";
    ScanChunkBytes = "scan.chunk_bytes", Kind::Bytes { min: 1 << 20, max: 1 << 34 }, "64M",
        "Bytes of blocks a scrub or resilver gathers from the newest tree, sorts by device \
         offset and reads (or copies) before it looks at the tree again. While a chunk is in \
         work, the space of blocks freed since its tree stays allocated, so a repair never \
         lands on reused space; a smaller chunk holds less back, a larger one sorts better.";
    ScanIosInFlight = "scan.ios_in_flight", Kind::Count { min: 1, max: 4096 }, "32",
        "Blocks a scrub or resilver has in flight at once (the leaves' scrub class limits \
         what reaches each device: vdev.scrub_max_active).";
    ScanIdleMs = "scan.idle_ms", Kind::Count { min: 0, max: 60_000 }, "50",
        "A scrub or resilver counts the pool as busy while its clients made a request within \
         this many milliseconds; busy, it issues one block (or run of blocks) at a time, \
         scan.busy_delay_ms apart, so that client writes keep their latency (ZFS's \
         zfs_scan_idle). 0: never busy.";
    ScanBusyDelayMs = "scan.busy_delay_ms", Kind::Count { min: 0, max: 10_000 }, "4",
        "The pause, in milliseconds, before each block (or run) a scrub or resilver issues \
         while clients are busy (see scan.idle_ms; ZFS's scan delay).";
    MirrorSwitchUs = "mirror.switch_us", Kind::Micros { min: 1, max: 10_000_000 }, "10000",
        "Among equally loaded children, one is chosen at random and kept for this long, so a \
         sequential stream stays on one disk and its reads merge (seed 002).";
}

/// The classes of I/O a leaf schedules, highest priority first (ZFS: `zio_priority_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IoClass {
    SyncRead,
    SyncWrite,
    LogWrite,
    AsyncRead,
    AsyncWrite,
    Scrub,
}

impl IoClass {
    pub const COUNT: usize = 6;
    pub const ALL: [IoClass; IoClass::COUNT] = [
        IoClass::SyncRead,
        IoClass::SyncWrite,
        IoClass::LogWrite,
        IoClass::AsyncRead,
        IoClass::AsyncWrite,
        IoClass::Scrub,
    ];

    pub fn index(self) -> usize {
        self as usize
    }

    pub fn name(self) -> &'static str {
        match self {
            IoClass::SyncRead => "sync_read",
            IoClass::SyncWrite => "sync_write",
            IoClass::LogWrite => "log_write",
            IoClass::AsyncRead => "async_read",
            IoClass::AsyncWrite => "async_write",
            IoClass::Scrub => "scrub",
        }
    }

    fn min_max(self) -> (Tunable, Tunable) {
        match self {
            IoClass::SyncRead => (Tunable::SyncReadMin, Tunable::SyncReadMax),
            IoClass::SyncWrite => (Tunable::SyncWriteMin, Tunable::SyncWriteMax),
            IoClass::LogWrite => (Tunable::LogWriteMin, Tunable::LogWriteMax),
            IoClass::AsyncRead => (Tunable::AsyncReadMin, Tunable::AsyncReadMax),
            IoClass::AsyncWrite => (Tunable::AsyncWriteMin, Tunable::AsyncWriteMax),
            IoClass::Scrub => (Tunable::ScrubMin, Tunable::ScrubMax),
        }
    }
}

/// A tunable value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TunableError {
    #[error("unknown tunable {name:?}")]
    Unknown { name: String },
    #[error("tunable {name}: {value:?} is not a number{hint}")]
    NotANumber { name: &'static str, value: String, hint: &'static str },
    #[error("tunable {name}: {value} is out of range; allowed {min}..={max}")]
    OutOfRange { name: &'static str, value: u64, min: u64, max: u64 },
    #[error("tunable {name}: {value:?} is not one of {choices:?}")]
    NotAChoice { name: &'static str, value: String, choices: &'static [&'static str] },
    #[error("tunable {name}={value} must not exceed {other}={other_value}; raise {other} or lower {name}")]
    Inconsistent { name: &'static str, value: u64, other: &'static str, other_value: u64 },
    #[error("tunable {name}: {value} is not a power of two; use 4K, 8K, 16K, ...")]
    NotPowerOfTwo { name: &'static str, value: u64 },
    #[error("{text:?} is not name=value (for example vdev.queues=1)")]
    NotASetting { text: String },
}

/// A full, validated set of tunable values.
#[derive(Clone, PartialEq, Eq)]
pub struct Tunables {
    values: Vec<u64>,
}

impl fmt::Debug for Tunables {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut map = f.debug_map();
        for &tunable in ALL {
            map.entry(&tunable.def().name, &self.display(tunable));
        }
        map.finish()
    }
}

impl Default for Tunables {
    fn default() -> Self {
        let values = TABLE
            .iter()
            .map(|def| match parse(def, def.default) {
                Ok(value) => value,
                Err(error) => panic!("default of tunable {} is invalid: {error}", def.name),
            })
            .collect();
        Tunables { values }
    }
}

impl Tunable {
    pub fn def(self) -> &'static TunableDef {
        &TABLE[self as usize]
    }

    pub fn by_name(name: &str) -> Option<Tunable> {
        ALL.iter().copied().find(|t| t.def().name == name)
    }

    pub fn all() -> &'static [Tunable] {
        ALL
    }
}

/// A byte count as people type it: a whole or decimal number, optionally followed by a unit
/// of K, M, G, T, P or E, each with or without `i` and `B` (`4K`, `4KiB`, `4kb`, `1.5G`,
/// `64M`, `512B`), either case, with or without a space before it. Every unit is a binary
/// multiple (K is 1024, as it always was here and is in `zfs`, `qemu-img` and `truncate`).
/// `None` if it is not one, if it is not a whole number of bytes (`1.5B`, `0.3K`), or if it
/// does not fit in 64 bits. Tunables, and the command lines of `sluice` and `sluice-bench`,
/// read sizes with it.
///
/// Written here rather than with the `parse-size` crate: that crate rounds fractional bytes
/// to the nearest integer (`2.5B` is 3) and reads `KB` as 1000, where a size given to a pool
/// must be exact and K has always been 1024; the exact arithmetic below is a few lines.
pub fn parse_bytes(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (number, unit) = (&text[..split], text[split..].trim_start());
    let shift: u32 = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KI" | "KIB" => 10,
        "M" | "MB" | "MI" | "MIB" => 20,
        "G" | "GB" | "GI" | "GIB" => 30,
        "T" | "TB" | "TI" | "TIB" => 40,
        "P" | "PB" | "PI" | "PIB" => 50,
        "E" | "EB" | "EI" | "EIB" => 60,
        _ => return None,
    };
    let (whole, fraction) = match number.split_once('.') {
        Some((whole, fraction)) if !fraction.is_empty() => (whole, fraction),
        Some(_) => return None,
        None => (number, ""),
    };
    if whole.is_empty() || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let bytes = whole.parse::<u64>().ok()?.checked_mul(1u64 << shift)?;
    // The fraction times the unit must be a whole number of bytes: digits / 10^n * 2^shift.
    // Twenty digits after trailing zeros are more than any size needs, and keep the product
    // within 128 bits (10^20 * 2^60 < 2^128).
    let fraction = fraction.trim_end_matches('0');
    if fraction.is_empty() {
        return Some(bytes);
    }
    if fraction.len() > 20 {
        return None;
    }
    let scaled = fraction.parse::<u128>().ok()? << shift;
    let denominator = 10u128.pow(fraction.len() as u32);
    if scaled % denominator != 0 {
        return None;
    }
    bytes.checked_add(u64::try_from(scaled / denominator).ok()?)
}

/// Splits `name=value` settings as given on a command line (`--set`), each side trimmed.
pub fn parse_settings(settings: &[String]) -> Result<Vec<(String, String)>, TunableError> {
    settings
        .iter()
        .map(|text| {
            let (name, value) = text
                .split_once('=')
                .ok_or_else(|| TunableError::NotASetting { text: text.clone() })?;
            Ok((name.trim().to_owned(), value.trim().to_owned()))
        })
        .collect()
}

fn parse(def: &TunableDef, text: &str) -> Result<u64, TunableError> {
    let number = |multiplier_ok: bool| -> Result<u64, TunableError> {
        let text = text.trim();
        let hint = if multiplier_ok { " (a byte count, optionally with K, M or G)" } else { "" };
        let not_a_number =
            || TunableError::NotANumber { name: def.name, value: text.to_owned(), hint };
        let parsed = if multiplier_ok { parse_bytes(text) } else { text.parse::<u64>().ok() };
        parsed.ok_or_else(not_a_number)
    };
    let (value, min, max) = match def.kind {
        Kind::CountOrAuto { .. } if text.trim() == "auto" => return Ok(0),
        Kind::Count { min, max } | Kind::CountOrAuto { min, max } | Kind::Micros { min, max } => {
            (number(false)?, min, max)
        }
        Kind::BytesOrAuto { .. } if text.trim() == "auto" => return Ok(AUTO_BYTES),
        Kind::Bytes { min, max } | Kind::BytesOrAuto { min, max } => (number(true)?, min, max),
        Kind::Choice(choices) => {
            return choices.iter().position(|c| *c == text.trim()).map(|i| i as u64).ok_or_else(
                || TunableError::NotAChoice { name: def.name, value: text.to_owned(), choices },
            );
        }
    };
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(TunableError::OutOfRange { name: def.name, value, min, max })
    }
}

impl Tunables {
    /// Defaults with `name=value` settings applied in order, then validated together.
    pub fn with<'a>(
        settings: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Tunables, TunableError> {
        let mut tunables = Tunables::default();
        for (name, value) in settings {
            tunables.set(name, value)?;
        }
        tunables.validate()?;
        Ok(tunables)
    }

    /// Sets one tunable by name, checking its own range. Call [`Tunables::validate`] after a
    /// batch of changes to check how they fit together.
    pub fn set(&mut self, name: &str, value: &str) -> Result<(), TunableError> {
        let tunable = Tunable::by_name(name)
            .ok_or_else(|| TunableError::Unknown { name: name.to_owned() })?;
        self.values[tunable as usize] = parse(tunable.def(), value)?;
        Ok(())
    }

    /// Checks the relations between tunables.
    pub fn validate(&self) -> Result<(), TunableError> {
        let log_block = self.get(Tunable::IntentLogBlockBytesMax);
        if !log_block.is_power_of_two() {
            return Err(TunableError::NotPowerOfTwo {
                name: Tunable::IntentLogBlockBytesMax.def().name,
                value: log_block,
            });
        }
        let max_active = self.get(Tunable::VdevMaxActive);
        for class in IoClass::ALL {
            let (min, max) = class.min_max();
            let (min_value, max_value) = (self.get(min), self.get(max));
            if min_value > max_value {
                return Err(TunableError::Inconsistent {
                    name: min.def().name,
                    value: min_value,
                    other: max.def().name,
                    other_value: max_value,
                });
            }
            // A minimum the queue depth cannot hold would never be honoured; refusing it keeps
            // the configuration honest. (A maximum above the depth is fine: the depth caps it.)
            if !self.is_auto(Tunable::VdevMaxActive) && min_value > max_active {
                return Err(TunableError::Inconsistent {
                    name: min.def().name,
                    value: min_value,
                    other: Tunable::VdevMaxActive.def().name,
                    other_value: max_active,
                });
            }
        }
        Ok(())
    }

    /// True when a `CountOrAuto` or `BytesOrAuto` tunable is set to `auto`.
    pub fn is_auto(&self, tunable: Tunable) -> bool {
        match tunable.def().kind {
            Kind::CountOrAuto { .. } => self.get(tunable) == 0,
            Kind::BytesOrAuto { .. } => self.get(tunable) == AUTO_BYTES,
            _ => false,
        }
    }

    /// The dirty data a txg may hold: `txg.dirty_max`, with `auto` resolved from the machine's
    /// memory (`memory_bytes`; `None` in the simulator, whose runs must not depend on the
    /// machine, and where the OS will not say: then the floor).
    pub fn dirty_max_bytes(&self, memory_bytes: Option<u64>) -> u64 {
        if self.is_auto(Tunable::TxgDirtyMax) {
            memory_bytes.map_or(DIRTY_AUTO_BYTES_MIN, |m| {
                (m / 10).clamp(DIRTY_AUTO_BYTES_MIN, DIRTY_AUTO_BYTES_MAX)
            })
        } else {
            self.get(Tunable::TxgDirtyMax)
        }
    }

    /// The block cache's size: `cache.bytes_max`, with `auto` resolved from the machine's
    /// memory (`memory_bytes`; `None` when it cannot be learned).
    pub fn cache_bytes(&self, memory_bytes: Option<u64>) -> u64 {
        if self.is_auto(Tunable::CacheBytesMax) {
            (memory_bytes.unwrap_or(0) / 8).max(CACHE_AUTO_BYTES_MIN)
        } else {
            self.get(Tunable::CacheBytesMax)
        }
    }

    pub fn get(&self, tunable: Tunable) -> u64 {
        self.values[tunable as usize]
    }

    /// The chosen word of a `Choice` tunable.
    pub fn choice(&self, tunable: Tunable) -> &'static str {
        match tunable.def().kind {
            Kind::Choice(choices) => choices.get(self.get(tunable) as usize).copied().unwrap_or(""),
            _ => "",
        }
    }

    /// The value as a person would type it.
    pub fn display(&self, tunable: Tunable) -> String {
        match tunable.def().kind {
            Kind::Choice(_) => self.choice(tunable).to_owned(),
            Kind::CountOrAuto { .. } | Kind::BytesOrAuto { .. } if self.is_auto(tunable) => {
                "auto".to_owned()
            }
            _ => self.get(tunable).to_string(),
        }
    }

    pub fn class_min_active(&self, class: IoClass) -> u64 {
        self.get(class.min_max().0)
    }

    pub fn class_max_active(&self, class: IoClass) -> u64 {
        self.get(class.min_max().1)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Kind::Count { min, max } => write!(f, "{min}..={max}"),
            Kind::CountOrAuto { min, max } => write!(f, "auto or {min}..={max}"),
            Kind::Bytes { min, max } => write!(f, "{min}..={max} bytes"),
            Kind::BytesOrAuto { min, max } => write!(f, "auto or {min}..={max} bytes"),
            Kind::Micros { min, max } => write!(f, "{min}..={max} us"),
            Kind::Choice(choices) => write!(f, "{}", choices.join("|")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sizes as people type them, and what is not one; settings split at the first `=`.
    #[test]
    fn sizes_and_settings_parse() {
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes(" 64M "), Some(64 << 20));
        assert_eq!(parse_bytes("16k"), Some(16 << 10));
        assert_eq!(parse_bytes("2T"), Some(2 << 40));
        assert_eq!(parse_bytes("1.5G"), Some(3 << 29));
        assert_eq!(parse_bytes("4KiB"), Some(4096));
        assert_eq!(parse_bytes("4K"), Some(4096));
        assert_eq!(parse_bytes("4kb"), Some(4096));
        assert_eq!(parse_bytes("1 GiB"), Some(1 << 30));
        assert_eq!(parse_bytes("512B"), Some(512));
        assert_eq!(parse_bytes("0.5K"), Some(512));
        assert_eq!(parse_bytes("2.50M"), Some(5 << 19));
        assert_eq!(parse_bytes("16E"), None, "2^64 does not fit");
        assert_eq!(parse_bytes("15E"), Some(15 << 60));
        assert_eq!(parse_bytes("18446744073709551615"), Some(u64::MAX));
        for bad in [
            "",
            "M",
            "12X",
            "-1",
            "99999999999T",
            "18446744073709551616",
            "1.5B",
            "1.5",
            "0.3K",
            "1.",
            ".5K",
            "1.2.3K",
            "4 K B",
            "4KiBB",
            "1e3",
            "0x10",
            "1_000",
        ] {
            assert_eq!(parse_bytes(bad), None, "{bad:?}");
        }
        let given = ["txg.dirty_max = 1G".to_owned(), "a=b=c".to_owned()];
        let parsed = parse_settings(&given).unwrap();
        assert_eq!(parsed[0], ("txg.dirty_max".to_owned(), "1G".to_owned()));
        assert_eq!(parsed[1], ("a".to_owned(), "b=c".to_owned()));
        let refused = parse_settings(&["nothing".to_owned()]).unwrap_err().to_string();
        assert!(refused.contains("name=value"), "{refused}");
    }

    #[test]
    fn table_is_in_enum_order_and_defaults_validate() {
        for (index, tunable) in ALL.iter().enumerate() {
            assert_eq!(*tunable as usize, index);
        }
        Tunables::default().validate().unwrap();
    }

    /// Out-of-range values are refused with the tunable, the value and the range named.
    #[test]
    fn out_of_range_names_everything() {
        let error = Tunables::with([("vdev.queues", "0")]).unwrap_err();
        assert_eq!(
            error,
            TunableError::OutOfRange { name: "vdev.queues", value: 0, min: 1, max: 256 }
        );
        let message = error.to_string();
        assert!(message.contains("vdev.queues") && message.contains("1..=256"), "{message}");
    }

    #[test]
    fn bad_words_are_refused() {
        assert!(matches!(Tunables::with([("no.such", "1")]), Err(TunableError::Unknown { .. })));
        assert!(matches!(
            Tunables::with([("vdev.max_active", "ten")]),
            Err(TunableError::NotANumber { .. })
        ));
        assert!(matches!(
            Tunables::with([("mirror.read_policy", "fastest")]),
            Err(TunableError::NotAChoice { .. })
        ));
        assert!(matches!(
            Tunables::with([("vdev.aggregation_limit", "1X")]),
            Err(TunableError::NotANumber { .. })
        ));
    }

    #[test]
    fn auto_parses_and_displays() {
        let t = Tunables::default();
        assert!(t.is_auto(Tunable::VdevMaxActive));
        assert_eq!(t.display(Tunable::VdevMaxActive), "auto");
        let t = Tunables::with([("vdev.max_active", "32")]).unwrap();
        assert!(!t.is_auto(Tunable::VdevMaxActive));
        assert_eq!(t.get(Tunable::VdevMaxActive), 32);
        assert!(matches!(
            Tunables::with([("vdev.max_active", "0")]),
            Err(TunableError::OutOfRange { .. })
        ));
    }

    /// `cache.bytes_max=auto` is an eighth of memory with a floor; a number is taken as given,
    /// and 0 (caching off) stays 0.
    #[test]
    fn cache_size_resolves_auto() {
        let t = Tunables::default();
        assert!(t.is_auto(Tunable::CacheBytesMax));
        assert_eq!(t.display(Tunable::CacheBytesMax), "auto");
        assert_eq!(t.cache_bytes(Some(24 << 30)), 3 << 30);
        assert_eq!(t.cache_bytes(Some(128 << 20)), CACHE_AUTO_BYTES_MIN);
        assert_eq!(t.cache_bytes(None), CACHE_AUTO_BYTES_MIN);
        let t = Tunables::with([("cache.bytes_max", "1G")]).unwrap();
        assert_eq!(t.cache_bytes(Some(24 << 30)), 1 << 30);
        assert_eq!(t.display(Tunable::CacheBytesMax), (1u64 << 30).to_string());
        let t = Tunables::with([("cache.bytes_max", "0")]).unwrap();
        assert_eq!(t.cache_bytes(Some(24 << 30)), 0);
    }

    #[test]
    fn sizes_and_choices_parse() {
        let t = Tunables::with([
            ("vdev.aggregation_limit", "256K"),
            ("mirror.read_policy", "round-robin"),
        ])
        .unwrap();
        assert_eq!(t.get(Tunable::AggregationLimit), 256 << 10);
        assert_eq!(t.choice(Tunable::MirrorReadPolicy), "round-robin");
    }

    /// A class minimum above its maximum, or a maximum above a lowered queue depth, is refused.
    #[test]
    fn relations_are_checked() {
        let error = Tunables::with([("vdev.sync_read_min_active", "20")]).unwrap_err();
        assert!(matches!(
            error,
            TunableError::Inconsistent { name: "vdev.sync_read_min_active", .. }
        ));
        let error = Tunables::with([
            ("vdev.max_active", "4"),
            ("vdev.sync_read_max_active", "4"),
            ("vdev.sync_read_min_active", "4"),
            ("vdev.sync_write_min_active", "5"),
        ])
        .unwrap_err();
        assert!(
            matches!(error, TunableError::Inconsistent { other: "vdev.max_active", .. }),
            "{error}"
        );
        assert!(error.to_string().contains("vdev.sync_write_min_active=5"), "{error}");
        Tunables::with([
            ("vdev.max_active", "13"),
            ("vdev.sync_read_max_active", "12"),
            ("vdev.sync_read_min_active", "1"),
            ("vdev.sync_write_min_active", "1"),
            ("vdev.sync_write_max_active", "1"),
            ("vdev.log_write_min_active", "1"),
            ("vdev.log_write_max_active", "1"),
        ])
        .unwrap();
    }
}
