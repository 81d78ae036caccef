//! A served pool's statistics at one moment, as one typed value: the pool, its top-level
//! vdevs, each leaf (I/O counters, what is queued and in the device per I/O class, latency
//! histograms per class), each volume (client requests and their latency per request type),
//! the intent log, txg syncs, the write throttle, where patches were completed and, when the
//! pool uses it, the dedup table.
//!
//! The server builds one from its live [`Store`] ([`PoolSnapshot::capture`]); the control
//! socket carries it as JSON to `sluice pool iostat` (crate::iostat), which diffs two of them,
//! and the metrics endpoint (crate::metrics) renders one per scrape. Everything here is a
//! total since import or a gauge as it is now; rates and differences belong to the readers.
//! This module depends only on the engine, so both sides use it without depending on each
//! other.
//!
//! Per-class and per-request-type figures are vectors indexed by [`IoClass::index`] and
//! [`VolumeOp::index`]; `version` changes whenever a field changes meaning, so a client and a
//! server of different builds say so instead of misreading each other.

use serde::{Deserialize, Serialize};
use sluice_engine::stats::{HistogramSnapshot, VolumeOp};
use sluice_engine::tunables::IoClass;
use sluice_engine::{Store, Writer};

/// The layout of [`PoolSnapshot`] this build reads and writes.
pub const SNAPSHOT_VERSION: u32 = 1;

/// Everything `iostat` and the metrics endpoint show about one served pool.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PoolSnapshot {
    /// [`SNAPSHOT_VERSION`] of the build that captured it.
    pub version: u32,
    pub pool: String,
    /// Time since the store was created or imported: the span every total covers.
    pub uptime_nanos: u64,
    /// The txg of the pool's newest uberblock.
    pub txg: u64,
    /// Txgs synced since import.
    pub txg_syncs: u64,
    /// Top-level vdevs, in the pool's order (leaves name theirs by index).
    pub tops: Vec<TopSnapshot>,
    pub leaves: Vec<LeafSnapshot>,
    pub volumes: Vec<VolumeSnapshot>,
    pub intent_log: LogSnapshot,
    pub throttle: ThrottleSnapshot,
    /// What became of writes into part of a block not in memory. Absent from snapshots of
    /// older builds.
    #[serde(default)]
    pub patches: PatchSnapshot,
    /// The dedup table, when a volume has dedup on or the table holds entries.
    pub dedup: Option<DedupSnapshot>,
    /// The store stopped writing after a failed sync (`pool status` says why).
    #[serde(default)]
    pub suspended: bool,
    /// The pool's size (its data vdevs' allocatable bytes) and what is allocated of it, as
    /// `pool list` shows them.
    #[serde(default)]
    pub size_bytes: u64,
    #[serde(default)]
    pub allocated_bytes: u64,
    /// When the last scrub that ran to its end finished (Unix seconds, UTC); `None` if none
    /// did.
    #[serde(default)]
    pub last_scrub_end_secs: Option<u64>,
    /// The scan running now: `scrub` or `resilver` (a paused scrub counts as running).
    #[serde(default)]
    pub scan_running: Option<String>,
    /// Hot spares: (path, AVAIL, INUSE or UNAVAIL).
    #[serde(default)]
    pub spares: Vec<(String, String)>,
    /// Stored bytes written since import by each kind of block (volume data, indirect, space
    /// map, intent log chain, ...), every copy counted and a vdev's own redundancy (a
    /// mirror's legs, RAID-Z's parity) not: what the disk's bytes per client write are made
    /// of. Absent from snapshots of older builds.
    #[serde(default)]
    pub written_by_kind: Vec<KindBytes>,
}

/// Bytes of one kind of block (a writer of the block pipeline: `sluice_engine::zio::Writer`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KindBytes {
    pub kind: String,
    pub bytes: u64,
}

/// One top-level vdev.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopSnapshot {
    /// A mirror (else a single leaf, or a RAID-Z vdev when `parity` is not 0).
    pub mirror: bool,
    /// Holds only intent-log blocks (a separate log device).
    pub log: bool,
    /// A RAID-Z vdev's parity (1 to 3); 0 for the others.
    #[serde(default)]
    pub parity: u8,
    /// The place of a removed log device: no leaves, kept so the others keep their numbers.
    #[serde(default)]
    pub hole: bool,
}

impl TopSnapshot {
    /// The name iostat and the metrics give the top-level vdev at `index`, after `zpool
    /// status`: `mirror-0`, `raidz2-1`, `log-mirror-2`, `disk-3`, `log-4`.
    pub fn name(self, index: usize) -> String {
        match (self.mirror, self.log) {
            _ if self.hole => format!("hole-{index}"),
            _ if self.parity > 0 => format!("raidz{}-{index}", self.parity),
            (true, false) => format!("mirror-{index}"),
            (true, true) => format!("log-mirror-{index}"),
            (false, false) => format!("disk-{index}"),
            (false, true) => format!("log-{index}"),
        }
    }

    /// Whether the vdev has leaves of its own to show under it (a mirror or RAID-Z).
    pub fn grouped(self) -> bool {
        self.mirror || self.parity > 0
    }
}

/// What one leaf did since import, and its queue now.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LeafSnapshot {
    pub path: String,
    /// Its state as `pool status` names it: ONLINE, DEGRADED, FAULTED or OFFLINE.
    #[serde(default)]
    pub state: String,
    /// Index of its top-level vdev in [`PoolSnapshot::tops`].
    pub top: usize,
    pub reads: u64,
    pub writes: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub flushes: u64,
    /// Times the txg sync's writes waited for the intent log's flushes
    /// (`vdev.sync_pace_bytes`).
    #[serde(default)]
    pub sync_paced: u64,
    pub read_errors: u64,
    pub write_errors: u64,
    pub flush_errors: u64,
    pub checksum_errors: u64,
    /// Bad copies rewritten from a good one.
    pub repairs: u64,
    /// I/Os that rode in another's device command.
    pub aggregated: u64,
    /// Device commands that carried async writes (the txg sync's blocks; a resilver's while
    /// one runs), and those writes' bytes.
    #[serde(default)]
    pub async_write_commands: u64,
    #[serde(default)]
    pub async_written_bytes: u64,
    /// I/Os waiting in the submission queues now.
    pub queued: u64,
    /// What is in the device now, per [`IoClass`] (see `Leaf::active_by_class`).
    pub active: Vec<u64>,
    /// The depth the device queue allows now.
    pub queue_depth: u64,
    /// Enqueue to completion, per [`IoClass`].
    pub latency: Vec<HistogramSnapshot>,
}

impl LeafSnapshot {
    /// Errors of every kind.
    pub fn errors(&self) -> u64 {
        self.read_errors + self.write_errors + self.flush_errors + self.checksum_errors
    }

    /// I/Os in the device now, over every class.
    pub fn active_total(&self) -> u64 {
        self.active.iter().sum()
    }
}

/// What one volume's clients asked of it since import.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct VolumeSnapshot {
    pub name: String,
    pub block_bytes: u64,
    /// Requests answered, per [`VolumeOp`].
    pub requests: Vec<u64>,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub errors: u64,
    /// Writes that covered only part of a volume block.
    pub partial_writes: u64,
    /// Arrival to answer, per [`VolumeOp`].
    pub latency: Vec<HistogramSnapshot>,
    /// What its intent log chose, when it has a log chain.
    #[serde(default)]
    pub log: Option<VolumeLogSnapshot>,
    /// What its prefetch of sequential reads did.
    #[serde(default)]
    pub prefetch: PrefetchSnapshot,
    /// What its sequential reads rewrote of the blocks they found scattered.
    #[serde(default)]
    pub rewrite: RewriteSnapshot,
}

/// What a volume's prefetch did since import (counts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrefetchSnapshot {
    /// Reads that continued a sequential stream, and reads that matched none.
    pub hits: u64,
    pub misses: u64,
    /// Blocks fetched ahead, and the I/Os that read them.
    pub blocks_fetched: u64,
    pub ios: u64,
    /// Blocks fetched ahead that a read took, and that none did.
    pub blocks_used: u64,
    pub blocks_unused: u64,
}

/// What a volume's sequential reads rewrote of the blocks they found scattered on disk, since
/// import (counts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RewriteSnapshot {
    /// Reads that continued a stream and found their blocks scattered.
    pub scattered_reads: u64,
    /// Blocks they handed to the open txg to be written side by side.
    pub blocks_rewritten: u64,
    /// Blocks left in place because a snapshot, a clone's origin or the dedup table shares
    /// them.
    pub blocks_shared: u64,
    /// Blocks left in place for now (changed since the read, the txg's share taken, or the
    /// pool's free space short).
    pub blocks_deferred: u64,
}

/// What a volume's intent log has in flight and chose, now (gauges).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeLogSnapshot {
    /// `intent_log.policy` in force for this chain.
    pub policy: String,
    /// Groups (each written and flushed as one) and log blocks not yet durable.
    pub groups_in_flight: u64,
    pub blocks_in_flight: u64,
    /// Under `auto`: how many groups may be in flight per top-level vdev.
    pub group_cap_per_vdev: Option<u64>,
    /// Size of the block allocated for the next log block.
    pub next_block_bytes: u64,
    /// Smoothed time from a group's issue to its being durable.
    pub group_latency_nanos: u64,
}

impl VolumeSnapshot {
    /// Requests of type `op` answered.
    pub fn requests(&self, op: VolumeOp) -> u64 {
        self.requests.get(op.index()).copied().unwrap_or(0)
    }
}

/// What the intent logs did since import.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogSnapshot {
    /// Commits (FUA writes and flushes) that had records to make durable.
    pub commits: u64,
    /// Lone sync writers' records sent before their flush arrived.
    pub early_commits: u64,
    /// Parts of a lone writer's large write whose blocks were written in place while the rest
    /// of its payload was still arriving.
    #[serde(default)]
    pub early_fills: u64,
    /// Commits answered by a txg sync instead of a log write.
    pub commits_via_txg: u64,
    /// Txg syncs asked for because log blocks held most of a log region.
    #[serde(default)]
    pub syncs_for_log_space: u64,
    /// Log blocks written by the volumes' current chains (a destroyed volume's leave the sum).
    pub blocks_written: u64,
    /// Of those chains: groups written (blocks made durable by one flush), the records the
    /// blocks carried, and the blocks' bytes written and allocated (the rest of a block is
    /// left unwritten).
    #[serde(default)]
    pub groups_written: u64,
    #[serde(default)]
    pub records_written: u64,
    #[serde(default)]
    pub block_bytes_written: u64,
    #[serde(default)]
    pub block_bytes_allocated: u64,
    /// What import found and replayed.
    pub chains_claimed: u64,
    pub blocks_claimed: u64,
    pub records_replayed: u64,
    pub torn_tails: u64,
}

/// What the write throttle did since import.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThrottleSnapshot {
    /// Writes delayed, and their delays added up.
    pub delayed: u64,
    pub delayed_nanos: u64,
    /// Of the delayed writes, those a txg's quiesce woke before their delay's end. Absent
    /// from snapshots of older builds.
    #[serde(default)]
    pub woken_by_sync: u64,
    /// Writes that waited for a txg sync at the dirty-data maximum, and their waits.
    pub waited_for_sync: u64,
    pub waited_nanos: u64,
    /// Writes spared a delay because another volume was filling the dirty data.
    pub spared: u64,
    /// Waits for a txg sync by writes short of free space for the dirty data, and their time.
    #[serde(default)]
    pub waited_for_space: u64,
    #[serde(default)]
    pub waited_for_space_nanos: u64,
    /// Dirty data in the open and quiescing txgs now, and the most they may hold
    /// (`txg.dirty_max`, `auto` resolved): gauges. Absent from snapshots of older builds.
    #[serde(default)]
    pub dirty_bytes: u64,
    #[serde(default)]
    pub dirty_max_bytes: u64,
}

/// What became of patches since import: writes into part of a block whose version below was
/// not in memory, each completed from that version beside its write or by the txg sync.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PatchSnapshot {
    pub completed_beside: u64,
    pub completed_by_sync: u64,
    /// Left to the sync because every completing task was busy and the line full.
    pub left_to_sync: u64,
    /// Waiting for a completing task now: a gauge.
    pub waiting: u64,
}

/// The dedup table: its size as of the last sync and what it did since import.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DedupSnapshot {
    pub entries: u64,
    pub references: u64,
    pub allocated_bytes: u64,
    pub referenced_bytes: u64,
    pub entries_in_memory: u64,
    /// Table-lock acquisitions by stage name.
    pub table_lock: Vec<(String, u64)>,
    pub table_lock_contended: u64,
    pub table_lock_wait_nanos: u64,
    pub blocks_written: u64,
    pub blocks_shared: u64,
    pub blocks_piggybacked: u64,
    pub verify_compares: u64,
    pub verify_mismatches: u64,
    pub blocks_freed: u64,
}

impl PoolSnapshot {
    /// The served store's counters now. Each counter is read once, without a lock across
    /// them, so figures of one snapshot may be a few I/Os apart; every one only grows.
    pub fn capture(store: &Store) -> PoolSnapshot {
        let pool = store.pool();
        let tops = pool
            .config()
            .top
            .iter()
            .map(|t| TopSnapshot {
                mirror: t.kind == sluice_format::TopKind::Mirror,
                log: t.log,
                parity: t.raidz.as_ref().map_or(0, |r| r.parity),
                hole: t.kind == sluice_format::TopKind::Hole,
            })
            .collect();
        let leaves = pool
            .leaves()
            .iter()
            .map(|l| {
                let s = l.leaf.stats();
                LeafSnapshot {
                    path: l.path.clone(),
                    state: l.leaf.state().name().to_owned(),
                    top: l.top,
                    reads: s.reads.get(),
                    writes: s.writes.get(),
                    read_bytes: s.read_bytes.get(),
                    write_bytes: s.write_bytes.get(),
                    flushes: s.flushes.get(),
                    sync_paced: s.sync_paced.get(),
                    read_errors: s.read_errors.get(),
                    write_errors: s.write_errors.get(),
                    flush_errors: s.flush_errors.get(),
                    checksum_errors: s.checksum_errors.get(),
                    repairs: s.repairs.get(),
                    aggregated: s.aggregated.get(),
                    async_write_commands: s.async_write_commands.get(),
                    async_written_bytes: s.async_written.get(),
                    queued: u64::try_from(l.leaf.queued()).unwrap_or(u64::MAX),
                    active: l.leaf.active_by_class().iter().map(|&n| u64::from(n)).collect(),
                    queue_depth: u64::from(l.leaf.queue_depth()),
                    latency: s.latency.iter().map(|h| h.snapshot()).collect(),
                }
            })
            .collect();
        let entries = store.volumes();
        let mut log_totals = LogSnapshot::default();
        let volumes = entries
            .iter()
            .filter_map(|entry| {
                // A volume destroyed since `volumes()` has no statistics left to show.
                let s = store.volume_stats(&entry.name).ok()?;
                let log = store.log_figures(&entry.name);
                if let Some(f) = &log {
                    log_totals.groups_written += f.groups_written;
                    log_totals.records_written += f.records_written;
                    log_totals.block_bytes_written += f.block_bytes_written;
                    log_totals.block_bytes_allocated += f.block_bytes_allocated;
                }
                Some(VolumeSnapshot {
                    name: entry.name.clone(),
                    block_bytes: u64::from(entry.block_bytes),
                    requests: s.requests.iter().map(|c| c.get()).collect(),
                    read_bytes: s.read_bytes.get(),
                    write_bytes: s.write_bytes.get(),
                    errors: s.errors.get(),
                    partial_writes: s.partial_writes.get(),
                    latency: s.latency.iter().map(|h| h.snapshot()).collect(),
                    prefetch: PrefetchSnapshot {
                        hits: s.prefetch.hits.get(),
                        misses: s.prefetch.misses.get(),
                        blocks_fetched: s.prefetch.blocks_fetched.get(),
                        ios: s.prefetch.ios.get(),
                        blocks_used: s.prefetch.blocks_used.get(),
                        blocks_unused: s.prefetch.blocks_unused.get(),
                    },
                    rewrite: RewriteSnapshot {
                        scattered_reads: s.rewrite.scattered_reads.get(),
                        blocks_rewritten: s.rewrite.blocks_rewritten.get(),
                        blocks_shared: s.rewrite.blocks_shared.get(),
                        blocks_deferred: s.rewrite.blocks_deferred.get(),
                    },
                    log: log.map(|f| VolumeLogSnapshot {
                        policy: f.policy.name().to_owned(),
                        groups_in_flight: u64::from(f.groups_in_flight),
                        blocks_in_flight: u64::from(f.lwbs_in_flight),
                        group_cap_per_vdev: f.group_cap_per_vdev.map(u64::from),
                        next_block_bytes: u64::from(f.next_block_bytes),
                        group_latency_nanos: f.group_latency_nanos,
                    }),
                })
            })
            .collect();
        let log = store.log_stats();
        let throttle = store.throttle_stats();
        let patches = store.patch_stats();
        let ddt = store.dedup_table();
        let summary = ddt.summary();
        let dedup_used =
            summary.entries > 0 || entries.iter().any(|e| e.dedup != sluice_format::DedupMode::Off);
        let dedup = dedup_used.then(|| {
            let stats = ddt.stats();
            DedupSnapshot {
                entries: summary.entries,
                references: summary.references,
                allocated_bytes: summary.allocated_bytes,
                referenced_bytes: summary.referenced_bytes,
                entries_in_memory: summary.in_memory,
                table_lock: stats
                    .by_stage()
                    .into_iter()
                    .map(|(stage, n)| (stage.to_owned(), n))
                    .collect(),
                table_lock_contended: stats.table_lock_contended.get(),
                table_lock_wait_nanos: stats.table_lock_wait_nanos.get(),
                blocks_written: stats.blocks_written.get(),
                blocks_shared: stats.blocks_shared.get(),
                blocks_piggybacked: stats.blocks_piggybacked.get(),
                verify_compares: stats.verify_compares.get(),
                verify_mismatches: stats.verify_mismatches.get(),
                blocks_freed: stats.blocks_freed.get(),
            }
        });
        let size_bytes = pool.data_capacity_bytes();
        let scan = store.scan_status();
        let scan_running = (scan.as_ref())
            .filter(|s| s.phase == sluice_engine::ScanPhase::Scanning)
            .map(|s| s.func.name().to_owned());
        PoolSnapshot {
            version: SNAPSHOT_VERSION,
            size_bytes,
            allocated_bytes: size_bytes.saturating_sub(store.free_bytes()),
            last_scrub_end_secs: store.last_scrub_end_unix_secs(),
            scan_running,
            spares: (pool.spares().into_iter()).map(|s| (s.path, s.state.to_owned())).collect(),
            pool: pool.name().to_owned(),
            uptime_nanos: u64::try_from(pool.env().now().since(store.opened()).as_nanos())
                .unwrap_or(u64::MAX),
            txg: pool.uberblock().txg,
            txg_syncs: store.syncs(),
            tops,
            leaves,
            volumes,
            intent_log: LogSnapshot {
                commits: log.commits.get(),
                early_commits: log.early_commits.get(),
                early_fills: log.early_fills.get(),
                commits_via_txg: log.commits_via_txg.get(),
                syncs_for_log_space: log.syncs_for_log_space.get(),
                blocks_written: store.log_blocks_written(),
                groups_written: log_totals.groups_written,
                records_written: log_totals.records_written,
                block_bytes_written: log_totals.block_bytes_written,
                block_bytes_allocated: log_totals.block_bytes_allocated,
                chains_claimed: log.chains_claimed.get(),
                blocks_claimed: log.blocks_claimed.get(),
                records_replayed: log.records_replayed.get(),
                torn_tails: log.torn_tails.get(),
            },
            throttle: ThrottleSnapshot {
                delayed: throttle.delayed.get(),
                delayed_nanos: throttle.delayed_nanos.get(),
                woken_by_sync: throttle.woken_by_sync.get(),
                waited_for_sync: throttle.waited_for_sync.get(),
                waited_nanos: throttle.waited_nanos.get(),
                spared: throttle.spared.get(),
                waited_for_space: throttle.waited_for_space.get(),
                waited_for_space_nanos: throttle.waited_for_space_nanos.get(),
                dirty_bytes: store.dirty_bytes(),
                dirty_max_bytes: store.dirty_max_bytes(),
            },
            patches: PatchSnapshot {
                completed_beside: patches.completed_beside.get(),
                completed_by_sync: patches.completed_by_sync.get(),
                left_to_sync: patches.left_to_sync.get(),
                waiting: store.patches_waiting(),
            },
            dedup,
            suspended: store.suspended_cause().is_some(),
            written_by_kind: (Writer::ALL.iter())
                .map(|&w| KindBytes { kind: w.name().to_owned(), bytes: pool.written_bytes(w) })
                .collect(),
        }
    }

    /// The snapshot as one line of JSON (what the hidden `pool stats` prints).
    pub fn to_json(&self) -> String {
        // Integers, strings and string-keyed structs only: serializing cannot fail. Were it
        // to, the reader is told why instead of getting half a document.
        serde_json::to_string(self).unwrap_or_else(|e| {
            serde_json::json!({ "error": format!("serializing the statistics: {e}") }).to_string()
        })
    }

    /// Reads what [`PoolSnapshot::to_json`] wrote, refusing another build's layout.
    #[cfg(test)]
    pub fn from_json(text: &str) -> Result<PoolSnapshot, SnapshotError> {
        let value =
            serde_json::from_str(text).map_err(|source| SnapshotError::Malformed { source })?;
        PoolSnapshot::from_value(value)
    }

    /// A snapshot in its serde form, refusing another build's layout.
    pub fn from_value(value: serde_json::Value) -> Result<PoolSnapshot, SnapshotError> {
        // The version first, so a different layout is named as such rather than as a
        // missing field.
        #[derive(Deserialize)]
        struct Header {
            version: Option<u32>,
            error: Option<String>,
        }
        let header =
            Header::deserialize(&value).map_err(|source| SnapshotError::Malformed { source })?;
        if let Some(message) = header.error {
            return Err(SnapshotError::Server { message });
        }
        let version = header.version;
        if version != Some(SNAPSHOT_VERSION) {
            return Err(SnapshotError::Version { found: version, expected: SNAPSHOT_VERSION });
        }
        serde_json::from_value(value).map_err(|source| SnapshotError::Malformed { source })
    }

    /// serde's `deserialize_with` for a snapshot that crossed the control socket: the layout
    /// is checked first ([`PoolSnapshot::from_value`]).
    pub fn deserialize_checked<'de, D: serde::Deserializer<'de>>(
        from: D,
    ) -> Result<Box<PoolSnapshot>, D::Error> {
        let value = serde_json::Value::deserialize(from)?;
        PoolSnapshot::from_value(value).map(Box::new).map_err(serde::de::Error::custom)
    }
}

/// Why a snapshot could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    #[error(
        "the statistics have layout {found:?}, this sluice reads layout {expected}: run \
         `sluice pool iostat` from the same build as the server"
    )]
    Version { found: Option<u32>, expected: u32 },
    #[error("the server could not send its statistics: {message}")]
    Server { message: String },
    #[error("the statistics are not a valid snapshot")]
    Malformed {
        #[source]
        source: serde_json::Error,
    },
}

/// The names of the I/O classes, in [`IoClass::index`] order.
pub fn class_names() -> [&'static str; IoClass::COUNT] {
    IoClass::ALL.map(IoClass::name)
}

/// The names of the request types, in [`VolumeOp::index`] order.
pub fn op_names() -> [&'static str; VolumeOp::COUNT] {
    VolumeOp::ALL.map(VolumeOp::name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A snapshot survives the JSON the control socket carries, and one from a build with
    /// another layout is refused by name rather than misread.
    #[test]
    fn round_trips_and_refuses_other_layouts() {
        let histogram = sluice_engine::stats::Histogram::default();
        histogram.record(std::time::Duration::from_micros(250));
        let snapshot = PoolSnapshot {
            version: SNAPSHOT_VERSION,
            pool: "tank".into(),
            uptime_nanos: 5,
            tops: vec![TopSnapshot { mirror: true, log: false, parity: 0, hole: false }],
            leaves: vec![LeafSnapshot {
                path: "/d/a".into(),
                writes: 3,
                active: vec![0; IoClass::COUNT],
                latency: vec![histogram.snapshot(); IoClass::COUNT],
                ..LeafSnapshot::default()
            }],
            dedup: Some(DedupSnapshot { entries: 2, ..DedupSnapshot::default() }),
            ..PoolSnapshot::default()
        };
        let back = PoolSnapshot::from_json(&snapshot.to_json()).expect("round trip");
        assert_eq!(back, snapshot);
        let other = snapshot.to_json().replace("\"version\":1", "\"version\":99");
        let error = PoolSnapshot::from_json(&other).expect_err("another layout");
        assert!(matches!(error, SnapshotError::Version { found: Some(99), .. }), "{error}");
        let old = r#"{"pool":"tank","uptime_ns":1}"#;
        assert!(matches!(
            PoolSnapshot::from_json(old),
            Err(SnapshotError::Version { found: None, .. })
        ));
        assert!(matches!(
            PoolSnapshot::from_json("nonsense"),
            Err(SnapshotError::Malformed { .. })
        ));
        assert_eq!(
            TopSnapshot { mirror: true, log: true, parity: 0, hole: false }.name(2),
            "log-mirror-2"
        );
        assert_eq!(
            TopSnapshot { mirror: false, log: false, parity: 2, hole: false }.name(1),
            "raidz2-1"
        );
    }
}
