//! The pool directory (ZFS: the MOS object directory): the one metadata block each uberblock
//! points at. It names every volume with its block-tree root and every top-level vdev's space
//! map. It sits in a block whose parent pointer carries its checksum, so it has a magic and a
//! version but no checksum of its own.
//!
//! ```text
//! offset size field
//!      0    8 magic u64                "SLUICEDR" as little-endian bytes
//!      8    2 version u16
//!     10    2 reserved (zero)
//!     12    4 encoded_len u32          bytes used; the rest of the block is zero
//!     16    8 txg u64
//!     24    8 next_volume_id u64
//!     32    4 vdev_count u32
//!     36    4 volume_count u32
//!     40      space map of each top-level vdev, in order: piece_count u32, then the
//!               block pointer (128) of each piece (0 pieces: none yet). A map is split in
//!               pieces so that no single block must find a large free range in a
//!               fragmented pool; the pieces' ranges, concatenated, are the map.
//!      .      volumes, each:
//!               id u64, size_bytes u64, block_bytes u32, levels u8, properties u8 (bits
//!               0-1 dedup: 0 off, 1 on, 2 verify; bits 2-3 sync: 0 standard, 1 always,
//!               2 disabled; bit 4 logbias: 0 latency, 1 throughput; the rest zero),
//!               name_len u16, name (UTF-8), root block pointer (128;
//!               zeros: empty), log header: chain_id u64 (0: no log), head_sequence u64,
//!               replayed_record u64, claim_txg u64, head block pointer (128);
//!               (V3) compression u8 (0 off, 1 lz4, 2..=20 zstd levels 1..19), reserved 7,
//!               reservation_bytes u64 (0: thin), referenced_bytes u64 (allocated for the
//!               volume's tree), logical_bytes u64 and physical_bytes u64 (its data blocks
//!               before and after compression);
//!               (V4) prev_snap_txg u64 (txg of its newest snapshot, or a clone's origin;
//!               0: none), origin of a clone: snapshot id u64 (0: not a clone), its txg u64
//!               and referenced_bytes u64 (copies: a snapshot never changes), its dead list
//!               (crate::deadlist), snapshot_count u32, then each snapshot, oldest first:
//!                 id u64, guid u64, txg u64, creation_secs u64, size_bytes u64, levels u8,
//!                 reserved 1, name_len u16, name (UTF-8), root block pointer (128; zeros:
//!                 empty), referenced_bytes u64, logical_bytes u64, physical_bytes u64, its
//!                 dead list;
//!               (V5) a receive that can be resumed into it (ZFS: the receive_resume_token's
//!               fields): to_guid u64 (0: none), from_guid u64 (0: a full stream),
//!               next_block u64 (blocks before it are received and synced; u64::MAX: all
//!               of them, and the volume is being put in its target's place), source_len u16,
//!               source (UTF-8: the sender's POOL/VOL);
//!               (V7) key_family u64 (the guid of its key family; 0: not encrypted), root_mac
//!               (32: the keyed MAC of its tree's root, `VolumeEntry::root_mac`), then each
//!               snapshot's root_mac (32), in the order of the snapshots;
//!               (V8) its snapshot schedule (`properties`), and in each snapshot the byte
//!               after `levels` is its flags (bit 0: the schedule took it)
//!      .      dedup table header (crate::ddt), 192 bytes: salt (32), bucket_bits u8,
//!               levels u8, reserved 6, entries u64, references u64, allocated_bytes u64,
//!               root block pointer (128; zeros: empty table)
//!      .      (V2) the vdev tree, leaf records and scan record (see `records`); (V6) the
//!               vdev tree in its V6 layout (crate::label)
//!      .      (V7) key_family_count u32, then each key family's wrapped key
//!               (crate::crypto_key)
//!      .      (V8) the pool's properties, 24 bytes (`properties`)
//! ```
//!
//! A directory without records (a pool made before V2) is written and read as V1; a V2 one
//! (no compression, no space figures), a V3 one (no snapshots) and a V4 one (no receive
//! state) still decode, and are written back as V5. V6 is V5 with the vdev tree in its V6
//! layout, and is written only when the tree needs it (a RAID-Z vdev): any other pool's
//! directory is still written as V5, which older builds read. V7 is V6 with each volume's and
//! snapshot's key family and root MAC and the pool's wrapped keys, written when the config
//! lists the `encryption` feature (the pool has had encrypted volumes), and only then. V8 is
//! V7 (its key family fields zero when nothing is encrypted) with the pool's properties, the
//! volumes' snapshot schedules and the snapshots' flags, written when the config lists the
//! `pool_properties` feature, and only then.
//!
//! The log header (ZFS: `zil_header_t`) names the first intent-log block still needed after
//! this txg: replay walks the chain from `head`, expecting `chain_id` and `head_sequence`, and
//! skips records up to `replayed_record`, which a replay that spans several txgs has already
//! applied. `claim_txg` (0 while the log is live) is the last txg that synced before the crash
//! whose log is being replayed: records of that txg or earlier are already in the pool, and the
//! txgs that replay itself syncs must not move that line.

mod properties;
mod records;

use crate::codec::{Reader, Writer};
use crate::ddt::DDT_HEADER_BYTES;
use crate::{
    BlockPointer, DdtHeader, Deadlist, FormatError, FormatVersion, VdevTreeConfig, WrappedKey,
    BLKPTR_BYTES,
};
pub use properties::{
    check_schedule, PoolProperties, SchedulePeriod, ScheduleRule, SCHEDULE_KEEP_MAX,
    SCRUB_INTERVAL_DEFAULT_SECS,
};
pub use records::{
    DirectoryRecords, LeafRecord, LeafRecordState, ScanBookmark, ScanKind, ScanRecord,
    ScanRecordPhase,
};

const MAGIC: u64 = u64::from_le_bytes(*b"SLUICEDR");
const HEADER_BYTES: usize = 40;
const VOLUME_FIXED_BYTES: usize = 8 + 8 + 4 + 1 + 1 + 2;
const LOG_HEADER_FIXED_BYTES: usize = 32;
/// What V3 adds to each volume: compression, reserved, the reservation, three space figures.
const VOLUME_V3_BYTES: usize = 1 + 7 + 4 * 8;
/// What V4 adds to each volume besides its dead list and snapshots: prev_snap_txg, origin
/// (id, txg, referenced), snapshot_count.
const VOLUME_V4_FIXED_BYTES: usize = 8 + 3 * 8 + 4;
/// A snapshot's fixed fields, before its name (and after it: root, figures).
const SNAPSHOT_FIXED_BYTES: usize = 5 * 8 + 1 + 1 + 2;
const SNAPSHOT_AFTER_NAME_BYTES: usize = BLKPTR_BYTES + 3 * 8;
/// What V5 adds to each volume before the source name: to_guid, from_guid, next_block,
/// source_len.
const VOLUME_V5_FIXED_BYTES: usize = 3 * 8 + 2;
/// Bytes of a root MAC.
pub const ROOT_MAC_BYTES: usize = 32;
/// What V7 adds to each volume before its snapshots' MACs: key_family, root_mac.
const VOLUME_V7_FIXED_BYTES: usize = 8 + ROOT_MAC_BYTES;
/// Longest volume name.
pub const VOLUME_NAME_BYTES_MAX: usize = 255;
const WHAT: &str = "pool directory";
/// The newest version this structure has (V2 added the records, V3 each volume's compression
/// and space figures, V4 snapshots and dead lists, V5 resumable receive state, V6 the vdev
/// tree's V6 layout, V7 key families, V8 pool properties and schedules), and so the newest
/// this build reads.
const VERSION: FormatVersion = FormatVersion::V8;
/// The version a directory with records is written at when its vdev tree is in the V1 layout
/// (needs no feature): the newest layout of the directory's own fields.
const VERSION_V1_CONFIG: FormatVersion = FormatVersion::V5;

/// One volume as recorded in the directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeEntry {
    pub id: u64,
    pub name: String,
    pub size_bytes: u64,
    pub block_bytes: u32,
    /// Levels of indirect blocks above the data blocks.
    pub levels: u8,
    pub root: Option<BlockPointer>,
    pub log: Option<LogHeader>,
    /// Whether new writes go through the dedup table.
    pub dedup: DedupMode,
    /// When a flush or FUA write is made durable through the intent log.
    pub sync: SyncMode,
    /// Whether large writes are logged as copies or written in place (see [`LogBias`]).
    pub logbias: LogBias,
    /// How data blocks written from now on are compressed.
    pub compression: Compression,
    /// Space set aside for the volume whatever else the pool holds (ZFS: `refreservation`);
    /// 0 for a thin volume.
    pub reservation_bytes: u64,
    /// What the volume's blocks take; `None` in a directory older than V3, until import has
    /// counted it.
    pub space: Option<VolumeSpace>,
    /// The txg of its newest snapshot (ZFS: `ds_prev_snap_txg`), or of the snapshot a clone
    /// was made from; 0 for none. A block born after it belongs to the volume alone: replaced,
    /// it is freed; one born at or before it goes on `deadlist`.
    pub prev_snap_txg: u64,
    /// For a clone, the snapshot it was made from.
    pub origin: Option<Origin>,
    /// Blocks its newest snapshot references that the volume no longer does.
    pub deadlist: Deadlist,
    /// Its snapshots, oldest first.
    pub snapshots: Vec<SnapshotEntry>,
    /// For the hidden volume of an interrupted receive, where it can resume.
    pub receive: Option<ReceiveState>,
    /// The guid of its key family (its encryption root's, shared by the root's snapshots and
    /// clones); 0 for a volume that is not encrypted.
    pub key_family: u64,
    /// For an encrypted volume, a MAC of its tree's root under its family's tree key: what
    /// binds the tree to the volume, so that its root pointer cannot be swapped for another
    /// (or an older one) without failing authentication. Zeros for a volume not encrypted.
    pub root_mac: [u8; ROOT_MAC_BYTES],
    /// Its snapshot schedule (V8): a snapshot each period of a rule, the newest `keep` kept.
    /// Empty: none.
    pub snapshot_schedule: Vec<ScheduleRule>,
}

/// Where an interrupted receive stopped (ZFS: the fields of `receive_resume_token`): the
/// stream it was applying and the first block not yet received and synced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReceiveState {
    /// The guid of the snapshot the stream carries (never 0).
    pub to_guid: u64,
    /// The older snapshot of an incremental stream.
    pub from_guid: Option<u64>,
    /// Blocks before it are in the volume, durable.
    pub next_block: u64,
    /// The sender's POOL/VOL, so a resumed send finds the snapshot.
    pub source: String,
}

impl VolumeEntry {
    /// A new, empty volume's entry with default properties.
    pub fn new(id: u64, name: &str, size_bytes: u64, block_bytes: u32, levels: u8) -> VolumeEntry {
        VolumeEntry {
            id,
            name: name.to_owned(),
            size_bytes,
            block_bytes,
            levels,
            root: None,
            log: None,
            dedup: DedupMode::Off,
            sync: SyncMode::Standard,
            logbias: LogBias::Latency,
            compression: Compression::default(),
            reservation_bytes: 0,
            space: Some(VolumeSpace::default()),
            prev_snap_txg: 0,
            origin: None,
            deadlist: Deadlist::default(),
            snapshots: Vec::new(),
            receive: None,
            key_family: 0,
            root_mac: [0; ROOT_MAC_BYTES],
            snapshot_schedule: Vec::new(),
        }
    }
}

/// The snapshot a clone was made from (ZFS: `dd_origin_obj`), with the figures of it the
/// clone's own need (copied: a snapshot never changes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Origin {
    /// The snapshot's id (unique in the pool; it may have moved to another volume since, by a
    /// promote).
    pub snapshot: u64,
    pub txg: u64,
    pub referenced_bytes: u64,
}

/// One tree of a volume, as walkers (scrub, resilver, verify, audit) visit it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TreeRef {
    /// The volume's id, or the snapshot's.
    pub id: u64,
    pub root: Option<BlockPointer>,
    pub levels: u8,
    pub size_bytes: u64,
    pub block_bytes: u32,
    /// Its blocks born at or before this txg are the previous tree's too (copy-on-write keeps
    /// a block where it was), so a walk that has visited that tree skips them, and every
    /// subtree born so early: each block of the volume is then visited once.
    pub shared_through: u64,
}

impl VolumeEntry {
    /// Its snapshots' trees, oldest first, then its own: together they reach every block a
    /// snapshot or the volume holds.
    pub fn trees(&self) -> Vec<TreeRef> {
        let mut shared_through = self.origin.map_or(0, |o| o.txg);
        let mut trees = Vec::with_capacity(self.snapshots.len() + 1);
        for snapshot in &self.snapshots {
            trees.push(TreeRef {
                id: snapshot.id,
                root: snapshot.root,
                levels: snapshot.levels,
                size_bytes: snapshot.size_bytes,
                block_bytes: self.block_bytes,
                shared_through,
            });
            shared_through = snapshot.txg;
        }
        trees.push(TreeRef {
            id: self.id,
            root: self.root,
            levels: self.levels,
            size_bytes: self.size_bytes,
            block_bytes: self.block_bytes,
            shared_through: self.prev_snap_txg,
        });
        trees
    }

    /// The pieces of its dead lists and its snapshots'.
    pub fn deadlist_pieces(&self) -> impl Iterator<Item = &BlockPointer> {
        std::iter::once(&self.deadlist)
            .chain(self.snapshots.iter().map(|s| &s.deadlist))
            .flat_map(|list| list.pieces.iter())
    }
}

/// A snapshot of a volume (ZFS: a snapshot's `dsl_dataset_phys_t`): the tree as it was synced
/// in `txg`, read-only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotEntry {
    /// Unique in the pool, drawn from the same counter as volume ids.
    pub id: u64,
    /// Random, for telling snapshots apart across pools (send and receive).
    pub guid: u64,
    pub name: String,
    /// The txg whose sync took it: it holds every block born then or earlier that the volume
    /// held at the end of that txg.
    pub txg: u64,
    /// Seconds since the Unix epoch when it was taken.
    pub creation_secs: u64,
    pub size_bytes: u64,
    pub levels: u8,
    pub root: Option<BlockPointer>,
    /// The volume's figures when it was taken (what the snapshot references).
    pub space: VolumeSpace,
    /// Blocks the snapshot before it references that this one does not.
    pub deadlist: Deadlist,
    /// As its volume's [`VolumeEntry::root_mac`], for the snapshot's tree.
    pub root_mac: [u8; ROOT_MAC_BYTES],
    /// Taken by the volume's snapshot schedule, which also prunes it (V8).
    pub automatic: bool,
}

impl SnapshotEntry {
    fn encoded_len(&self) -> usize {
        SNAPSHOT_FIXED_BYTES
            + self.name.len()
            + SNAPSHOT_AFTER_NAME_BYTES
            + self.deadlist.encoded_len()
    }
}

/// A volume's space figures (ZFS: `ds_referenced_bytes`, `ds_uncompressed_bytes`,
/// `ds_compressed_bytes`), kept up to date by each sync.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct VolumeSpace {
    /// Allocated for every block of the volume's tree (data and indirect, every copy).
    pub referenced_bytes: u64,
    /// Logical size of its data blocks.
    pub logical_bytes: u64,
    /// Stored size of its data blocks (after compression, in whole allocation units, as
    /// their `psize`).
    pub physical_bytes: u64,
}

/// A volume's compression property (ZFS: `compression=off|lz4|zstd|zstd-N`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Compression {
    Off,
    /// The default for new volumes, as in OpenZFS: fast enough that it usually saves time.
    #[default]
    Lz4,
    /// zstd at a level from 1 to 19.
    Zstd(u8),
}

impl Compression {
    /// The level plain `zstd` means (OpenZFS's default).
    pub const ZSTD_DEFAULT_LEVEL: u8 = 3;
    /// The highest zstd level accepted.
    pub const ZSTD_LEVEL_MAX: u8 = 19;

    /// The property's value as `vol set` takes it.
    pub fn name(self) -> String {
        match self {
            Compression::Off => "off".to_owned(),
            Compression::Lz4 => "lz4".to_owned(),
            Compression::Zstd(level) => format!("zstd-{level}"),
        }
    }

    /// Parses `off`, `on` (lz4), `lz4`, `zstd` or `zstd-1`..`zstd-19`.
    pub fn parse(text: &str) -> Option<Compression> {
        match text {
            "off" => Some(Compression::Off),
            "on" | "lz4" => Some(Compression::Lz4),
            "zstd" => Some(Compression::Zstd(Compression::ZSTD_DEFAULT_LEVEL)),
            _ => {
                let level: u8 = text.strip_prefix("zstd-")?.parse().ok()?;
                (1..=Compression::ZSTD_LEVEL_MAX)
                    .contains(&level)
                    .then_some(Compression::Zstd(level))
            }
        }
    }

    /// Whether the value can be stored (a zstd level from 1 to 19).
    pub fn is_valid(self) -> bool {
        match self {
            Compression::Zstd(level) => (1..=Compression::ZSTD_LEVEL_MAX).contains(&level),
            _ => true,
        }
    }

    fn encode(self) -> Result<u8, FormatError> {
        match self {
            Compression::Off => Ok(0),
            Compression::Lz4 => Ok(1),
            Compression::Zstd(level) if self.is_valid() => Ok(1 + level),
            Compression::Zstd(level) => Err(FormatError::Invalid {
                what: WHAT,
                field: "volume compression zstd level",
                value: u64::from(level),
            }),
        }
    }

    fn decode(raw: u8) -> Result<Compression, FormatError> {
        match raw {
            0 => Ok(Compression::Off),
            1 => Ok(Compression::Lz4),
            2..=20 => Ok(Compression::Zstd(raw - 1)),
            value => Err(FormatError::Invalid {
                what: WHAT,
                field: "volume compression",
                value: u64::from(value),
            }),
        }
    }
}

/// A volume's sync property (ZFS: `sync=standard|always|disabled`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SyncMode {
    /// Flushes and FUA writes are durable when answered; other writes at the next txg sync.
    #[default]
    Standard = 0,
    /// Every write is durable when answered, as if it carried FUA.
    Always = 1,
    /// Nothing is logged: flushes and FUA writes are answered at once, and writes become
    /// durable with the txg sync (within `txg.timeout_ms`). A crash loses up to that much.
    Disabled = 2,
}

impl SyncMode {
    pub fn decode(raw: u8) -> Result<SyncMode, FormatError> {
        match raw {
            0 => Ok(SyncMode::Standard),
            1 => Ok(SyncMode::Always),
            2 => Ok(SyncMode::Disabled),
            value => {
                Err(FormatError::Invalid { what: WHAT, field: "sync", value: u64::from(value) })
            }
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SyncMode::Standard => "standard",
            SyncMode::Always => "always",
            SyncMode::Disabled => "disabled",
        }
    }
}

/// A volume's logbias property (ZFS: `logbias=latency|throughput`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum LogBias {
    /// Writes below the immediate-write size are copied into the log; larger whole blocks are
    /// written in place and logged as pointers.
    #[default]
    Latency = 0,
    /// Every block a write touches, whole or in part, is written in place and logged as a
    /// pointer: each block is written once, at the cost of a block write per commit.
    Throughput = 1,
}

impl LogBias {
    pub fn name(self) -> &'static str {
        match self {
            LogBias::Latency => "latency",
            LogBias::Throughput => "throughput",
        }
    }
}

/// The properties byte of a volume entry.
fn encode_properties(volume: &VolumeEntry) -> u8 {
    volume.dedup as u8 | (volume.sync as u8) << 2 | (volume.logbias as u8) << 4
}

fn decode_properties(raw: u8) -> Result<(DedupMode, SyncMode, LogBias), FormatError> {
    if raw >> 5 != 0 {
        return Err(FormatError::Invalid {
            what: WHAT,
            field: "volume properties",
            value: u64::from(raw),
        });
    }
    let logbias = if raw & 0x10 != 0 { LogBias::Throughput } else { LogBias::Latency };
    Ok((DedupMode::decode(raw & 3)?, SyncMode::decode((raw >> 2) & 3)?, logbias))
}

/// A volume's dedup property (ZFS: `dedup=off|on|verify`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum DedupMode {
    /// Every block is written on its own.
    #[default]
    Off = 0,
    /// A block whose key is in the table shares the stored copy.
    On = 1,
    /// As `On`, after comparing the bytes with the stored copy (a block that differs is
    /// written on its own).
    Verify = 2,
}

impl DedupMode {
    pub fn decode(raw: u8) -> Result<DedupMode, FormatError> {
        match raw {
            0 => Ok(DedupMode::Off),
            1 => Ok(DedupMode::On),
            2 => Ok(DedupMode::Verify),
            value => {
                Err(FormatError::Invalid { what: WHAT, field: "dedup", value: u64::from(value) })
            }
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DedupMode::Off => "off",
            DedupMode::On => "on",
            DedupMode::Verify => "verify",
        }
    }
}

/// Where a volume's intent log starts (ZFS: `zil_header_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogHeader {
    /// Never 0 (0 encodes "no log").
    pub chain_id: u64,
    pub head_sequence: u64,
    /// Records up to this sequence were replayed already.
    pub replayed_record: u64,
    /// Nonzero while a replay is in progress: records of this txg or earlier were in the pool
    /// before the crash (ZFS: `zh_claim_txg`).
    pub claim_txg: u64,
    pub head: BlockPointer,
}

/// The decoded directory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolDirectory {
    pub txg: u64,
    pub next_volume_id: u64,
    /// Per top-level vdev, the blocks of its space map's pieces, in order.
    pub space_maps: Vec<Vec<BlockPointer>>,
    pub volumes: Vec<VolumeEntry>,
    pub ddt: DdtHeader,
    /// The vdev tree, leaf records and scan record (V2); `None` in a V1 directory.
    pub records: Option<DirectoryRecords>,
    /// The wrapped keys of the pool's key families (V7), by guid order of creation.
    pub key_families: Vec<WrappedKey>,
    /// The pool's properties (V8): `Some` exactly when the config lists `pool_properties`.
    pub properties: Option<PoolProperties>,
}

impl PoolDirectory {
    /// Whether it carries key families (V7 and V8): its config lists the `encryption` or the
    /// `pool_properties` feature.
    fn has_key_families(&self) -> bool {
        self.records.as_ref().is_some_and(|r| r.config.encryption || r.config.properties)
    }

    /// Whether it is written at V8: its config lists the `pool_properties` feature.
    fn has_properties(&self) -> bool {
        self.records.as_ref().is_some_and(|r| r.config.properties)
    }

    pub fn encoded_len(&self) -> Result<usize, FormatError> {
        let records = match &self.records {
            Some(records) => records.encoded_len()?,
            None => 0,
        };
        let v7 = self.has_key_families();
        let v8 = self.has_properties();
        let families = if v7 {
            4 + self.key_families.iter().map(WrappedKey::encoded_len).sum::<usize>()
        } else {
            0
        };
        let properties = if v8 { properties::PROPERTIES_BYTES } else { 0 };
        Ok(HEADER_BYTES
            + self.space_maps.iter().map(|p| 4 + p.len() * BLKPTR_BYTES).sum::<usize>()
            + self
                .volumes
                .iter()
                .map(|v| {
                    VOLUME_FIXED_BYTES
                        + v.name.len()
                        + BLKPTR_BYTES
                        + LOG_HEADER_FIXED_BYTES
                        + BLKPTR_BYTES
                        + if self.records.is_some() {
                            VOLUME_V3_BYTES
                                + VOLUME_V4_FIXED_BYTES
                                + v.deadlist.encoded_len()
                                + v.snapshots.iter().map(SnapshotEntry::encoded_len).sum::<usize>()
                                + VOLUME_V5_FIXED_BYTES
                                + v.receive.as_ref().map_or(0, |r| r.source.len())
                                + if v7 {
                                    VOLUME_V7_FIXED_BYTES + v.snapshots.len() * ROOT_MAC_BYTES
                                } else {
                                    0
                                }
                                + if v8 {
                                    properties::schedule_len(&v.snapshot_schedule)
                                } else {
                                    0
                                }
                        } else {
                            0
                        }
                })
                .sum::<usize>()
            + DDT_HEADER_BYTES
            + records
            + families
            + properties)
    }

    /// Encodes into a buffer padded with zeros to a multiple of `align` bytes.
    pub fn encode(&self, align: usize) -> Result<Vec<u8>, FormatError> {
        let len = self.encoded_len()?;
        let len32 = u32::try_from(len).map_err(|_| FormatError::TooLarge {
            what: WHAT,
            len,
            max: u32::MAX as usize,
        })?;
        for volume in &self.volumes {
            if volume.name.is_empty() || volume.name.len() > VOLUME_NAME_BYTES_MAX {
                return Err(FormatError::Invalid {
                    what: WHAT,
                    field: "volume name length",
                    value: volume.name.len() as u64,
                });
            }
        }
        let v7 = self.has_key_families();
        let encrypted = self.volumes.iter().any(|v| {
            v.key_family != 0
                || v.root_mac != [0; ROOT_MAC_BYTES]
                || v.snapshots.iter().any(|s| s.root_mac != [0; ROOT_MAC_BYTES])
        });
        if !v7 && (encrypted || !self.key_families.is_empty()) {
            // Only a V7 directory has room for them, and only a config listing the feature
            // makes older builds refuse what they would misread.
            return Err(FormatError::Invalid {
                what: WHAT,
                field: "key families without the encryption feature",
                value: self.key_families.len() as u64,
            });
        }
        let v8 = self.has_properties();
        let scheduled = self
            .volumes
            .iter()
            .any(|v| !v.snapshot_schedule.is_empty() || v.snapshots.iter().any(|s| s.automatic));
        if v8 != self.properties.is_some() || (!v8 && scheduled) {
            // Only a V8 directory has room for them, and only a config listing the feature
            // makes older builds refuse what they would misread.
            return Err(FormatError::Invalid {
                what: WHAT,
                field: "pool properties or schedules without the pool_properties feature",
                value: u64::from(self.properties.is_some()),
            });
        }
        let mut out = vec![0u8; len.div_ceil(align.max(1)) * align.max(1)];
        let mut w = Writer::new(&mut out);
        w.u64(0, MAGIC);
        // The config's layout is the directory's version's: V6 only for a tree that needs it.
        let version = match &self.records {
            None => FormatVersion::V1,
            Some(_) if v8 => FormatVersion::V8,
            Some(_) if v7 => FormatVersion::V7,
            Some(records) if records.config.version() == FormatVersion::V6 => FormatVersion::V6,
            Some(_) => VERSION_V1_CONFIG,
        };
        w.u16(8, version as u16);
        w.u32(12, len32);
        w.u64(16, self.txg);
        w.u64(24, self.next_volume_id);
        w.u32(32, self.space_maps.len() as u32);
        w.u32(36, self.volumes.len() as u32);
        let mut at = HEADER_BYTES;
        for pieces in &self.space_maps {
            w.u32(at, pieces.len() as u32);
            at += 4;
            for piece in pieces {
                w.put(at, &BlockPointer::encode(Some(piece)));
                at += BLKPTR_BYTES;
            }
        }
        for volume in &self.volumes {
            w.u64(at, volume.id);
            w.u64(at + 8, volume.size_bytes);
            w.u32(at + 16, volume.block_bytes);
            w.u8(at + 20, volume.levels);
            w.u8(at + 21, encode_properties(volume));
            w.u16(at + 22, volume.name.len() as u16);
            w.put(at + 24, volume.name.as_bytes());
            at += VOLUME_FIXED_BYTES + volume.name.len();
            w.put(at, &BlockPointer::encode(volume.root.as_ref()));
            at += BLKPTR_BYTES;
            if let Some(log) = &volume.log {
                if log.chain_id == 0 {
                    return Err(FormatError::Invalid {
                        what: WHAT,
                        field: "log chain_id",
                        value: 0,
                    });
                }
                w.u64(at, log.chain_id);
                w.u64(at + 8, log.head_sequence);
                w.u64(at + 16, log.replayed_record);
                w.u64(at + 24, log.claim_txg);
                w.put(at + 32, &BlockPointer::encode(Some(&log.head)));
            }
            at += LOG_HEADER_FIXED_BYTES + BLKPTR_BYTES;
            if self.records.is_some() {
                // Zeros would read back as an empty volume: the figures must be counted first.
                let space = volume.space.ok_or(FormatError::Invalid {
                    what: WHAT,
                    field: "volume space figures (not counted)",
                    value: volume.id,
                })?;
                w.u8(at, volume.compression.encode()?);
                w.u64(at + 8, volume.reservation_bytes);
                w.u64(at + 16, space.referenced_bytes);
                w.u64(at + 24, space.logical_bytes);
                w.u64(at + 32, space.physical_bytes);
                at += VOLUME_V3_BYTES;
                w.u64(at, volume.prev_snap_txg);
                if let Some(origin) = volume.origin {
                    if origin.snapshot == 0 {
                        return Err(FormatError::Invalid {
                            what: WHAT,
                            field: "origin snapshot id",
                            value: 0,
                        });
                    }
                    w.u64(at + 8, origin.snapshot);
                    w.u64(at + 16, origin.txg);
                    w.u64(at + 24, origin.referenced_bytes);
                }
                at = volume.deadlist.encode_into(&mut w, at + 32);
                w.u32(at, volume.snapshots.len() as u32);
                at += 4;
                for snapshot in &volume.snapshots {
                    if snapshot.name.is_empty() || snapshot.name.len() > VOLUME_NAME_BYTES_MAX {
                        return Err(FormatError::Invalid {
                            what: WHAT,
                            field: "snapshot name length",
                            value: snapshot.name.len() as u64,
                        });
                    }
                    w.u64(at, snapshot.id);
                    w.u64(at + 8, snapshot.guid);
                    w.u64(at + 16, snapshot.txg);
                    w.u64(at + 24, snapshot.creation_secs);
                    w.u64(at + 32, snapshot.size_bytes);
                    w.u8(at + 40, snapshot.levels);
                    if snapshot.automatic {
                        w.u8(at + 41, properties::SNAPSHOT_AUTOMATIC_BIT);
                    }
                    w.u16(at + 42, snapshot.name.len() as u16);
                    w.put(at + 44, snapshot.name.as_bytes());
                    at += SNAPSHOT_FIXED_BYTES + snapshot.name.len();
                    w.put(at, &BlockPointer::encode(snapshot.root.as_ref()));
                    w.u64(at + BLKPTR_BYTES, snapshot.space.referenced_bytes);
                    w.u64(at + BLKPTR_BYTES + 8, snapshot.space.logical_bytes);
                    w.u64(at + BLKPTR_BYTES + 16, snapshot.space.physical_bytes);
                    at += SNAPSHOT_AFTER_NAME_BYTES;
                    at = snapshot.deadlist.encode_into(&mut w, at);
                }
                if let Some(receive) = &volume.receive {
                    if receive.to_guid == 0 || receive.source.len() > usize::from(u16::MAX) {
                        return Err(FormatError::Invalid {
                            what: WHAT,
                            field: "receive state (guid 0 or source name too long)",
                            value: volume.id,
                        });
                    }
                    w.u64(at, receive.to_guid);
                    w.u64(at + 8, receive.from_guid.unwrap_or(0));
                    w.u64(at + 16, receive.next_block);
                    w.u16(at + 24, receive.source.len() as u16);
                    w.put(at + 26, receive.source.as_bytes());
                    at += VOLUME_V5_FIXED_BYTES + receive.source.len();
                } else {
                    at += VOLUME_V5_FIXED_BYTES;
                }
                if v7 {
                    w.u64(at, volume.key_family);
                    w.put(at + 8, &volume.root_mac);
                    at += VOLUME_V7_FIXED_BYTES;
                    for snapshot in &volume.snapshots {
                        w.put(at, &snapshot.root_mac);
                        at += ROOT_MAC_BYTES;
                    }
                }
                if v8 {
                    at = properties::encode_schedule(&volume.snapshot_schedule, &mut w, at)?;
                }
            } else if volume.compression != Compression::Off
                || volume.space.is_some()
                || volume.reservation_bytes != 0
                || volume.prev_snap_txg != 0
                || volume.origin.is_some()
                || !volume.deadlist.is_empty()
                || !volume.snapshots.is_empty()
                || volume.receive.is_some()
            {
                // A V1 directory has no place for them: a pool written as V1 has no records.
                return Err(FormatError::Invalid {
                    what: WHAT,
                    field: "V1 volume compression, reservation, space figures or snapshots",
                    value: volume.id,
                });
            }
        }
        self.ddt.encode_into(&mut w, at);
        at += DDT_HEADER_BYTES;
        if let Some(records) = &self.records {
            at = records.encode_into(&mut w, at)?;
        }
        if v7 {
            w.u32(at, self.key_families.len() as u32);
            at += 4;
            for family in &self.key_families {
                let bytes = family.encode()?;
                w.put(at, &bytes);
                at += bytes.len();
            }
        }
        if let Some(properties) = &self.properties {
            at = properties.encode_into(&mut w, at);
        }
        debug_assert_eq!(at, len);
        Ok(out)
    }

    pub fn decode(bytes: &[u8]) -> Result<PoolDirectory, FormatError> {
        let r = Reader::new(WHAT, bytes, HEADER_BYTES)?;
        let version = crate::codec::check_magic_version(&r, WHAT, MAGIC, 8, VERSION)?;
        r.zeros(10, 2)?;
        let len = r.u32(12)? as usize;
        let r = Reader::new(WHAT, bytes, len.max(HEADER_BYTES))?;
        r.zeros(len, bytes.len() - len)?;
        let vdev_count = r.u32(32)? as usize;
        let volume_count = r.u32(36)? as usize;
        let mut at = HEADER_BYTES;
        let mut space_maps = Vec::new();
        for _ in 0..vdev_count {
            let count = r.u32(at)? as usize;
            at += 4;
            // Bounded by the bytes present: each piece takes its 128 bytes.
            if count > len.saturating_sub(at) / BLKPTR_BYTES {
                return Err(FormatError::Invalid {
                    what: WHAT,
                    field: "space map piece count",
                    value: count as u64,
                });
            }
            let mut pieces = Vec::with_capacity(count);
            for _ in 0..count {
                let piece = BlockPointer::decode(r.slice(at, BLKPTR_BYTES)?)?.ok_or(
                    FormatError::Invalid { what: WHAT, field: "space map piece", value: 0 },
                )?;
                pieces.push(piece);
                at += BLKPTR_BYTES;
            }
            space_maps.push(pieces);
        }
        let mut volumes = Vec::new();
        for _ in 0..volume_count {
            let name_len = usize::from(r.u16(at + 22)?);
            let (dedup, sync, logbias) = decode_properties(r.u8(at + 21)?)?;
            let name = std::str::from_utf8(r.slice(at + 24, name_len)?)
                .map_err(|_| FormatError::Invalid {
                    what: WHAT,
                    field: "volume name",
                    value: name_len as u64,
                })?
                .to_owned();
            let block_bytes = r.u32(at + 16)?;
            if !block_bytes.is_power_of_two() || !(512..=(1 << 20)).contains(&block_bytes) {
                return Err(FormatError::Invalid {
                    what: WHAT,
                    field: "block_bytes",
                    value: u64::from(block_bytes),
                });
            }
            let entry_at = at;
            at += VOLUME_FIXED_BYTES + name_len;
            volumes.push(VolumeEntry {
                id: r.u64(entry_at)?,
                size_bytes: r.u64(entry_at + 8)?,
                block_bytes,
                levels: r.u8(entry_at + 20)?,
                name,
                root: BlockPointer::decode(r.slice(at, BLKPTR_BYTES)?)?,
                log: None,
                dedup,
                sync,
                logbias,
                compression: Compression::Off,
                reservation_bytes: 0,
                space: None,
                prev_snap_txg: 0,
                origin: None,
                deadlist: Deadlist::default(),
                snapshots: Vec::new(),
                receive: None,
                key_family: 0,
                root_mac: [0; ROOT_MAC_BYTES],
                snapshot_schedule: Vec::new(),
            });
            at += BLKPTR_BYTES;
            let chain_id = r.u64(at)?;
            let head = BlockPointer::decode(r.slice(at + 32, BLKPTR_BYTES)?)?;
            let log = match (chain_id, head) {
                (0, None) => {
                    r.zeros(at, LOG_HEADER_FIXED_BYTES)?;
                    None
                }
                (0, Some(_)) | (_, None) => {
                    return Err(FormatError::Invalid {
                        what: WHAT,
                        field: "log header",
                        value: chain_id,
                    })
                }
                (chain_id, Some(head)) => Some(LogHeader {
                    chain_id,
                    head_sequence: r.u64(at + 8)?,
                    replayed_record: r.u64(at + 16)?,
                    claim_txg: r.u64(at + 24)?,
                    head,
                }),
            };
            at += LOG_HEADER_FIXED_BYTES + BLKPTR_BYTES;
            let (compression, reservation, space) = if version >= FormatVersion::V3 {
                let compression = Compression::decode(r.u8(at)?)?;
                r.zeros(at + 1, 7)?;
                let space = VolumeSpace {
                    referenced_bytes: r.u64(at + 16)?,
                    logical_bytes: r.u64(at + 24)?,
                    physical_bytes: r.u64(at + 32)?,
                };
                let reservation = r.u64(at + 8)?;
                at += VOLUME_V3_BYTES;
                (compression, reservation, Some(space))
            } else {
                (Compression::Off, 0, None)
            };
            let mut snapshots = Vec::new();
            let (mut prev_snap_txg, mut origin, mut deadlist) = (0, None, Deadlist::default());
            if version >= FormatVersion::V4 {
                prev_snap_txg = r.u64(at)?;
                origin = match r.u64(at + 8)? {
                    0 => {
                        r.zeros(at + 16, 16)?;
                        None
                    }
                    snapshot => Some(Origin {
                        snapshot,
                        txg: r.u64(at + 16)?,
                        referenced_bytes: r.u64(at + 24)?,
                    }),
                };
                let (list, end) = Deadlist::decode_from(&r, WHAT, at + 32)?;
                deadlist = list;
                let count = r.u32(end)? as usize;
                at = end + 4;
                if count > len.saturating_sub(at) / SNAPSHOT_FIXED_BYTES {
                    return Err(FormatError::Invalid {
                        what: WHAT,
                        field: "snapshot count",
                        value: count as u64,
                    });
                }
                for _ in 0..count {
                    let name_len = usize::from(r.u16(at + 42)?);
                    let flags = r.u8(at + 41)?;
                    let known = if version >= FormatVersion::V8 {
                        properties::SNAPSHOT_AUTOMATIC_BIT
                    } else {
                        0
                    };
                    if flags & !known != 0 {
                        return Err(FormatError::Invalid {
                            what: WHAT,
                            field: "snapshot flags",
                            value: u64::from(flags),
                        });
                    }
                    let name = std::str::from_utf8(r.slice(at + 44, name_len)?)
                        .map_err(|_| FormatError::Invalid {
                            what: WHAT,
                            field: "snapshot name",
                            value: name_len as u64,
                        })?
                        .to_owned();
                    let fixed = at;
                    at += SNAPSHOT_FIXED_BYTES + name_len;
                    let root = BlockPointer::decode(r.slice(at, BLKPTR_BYTES)?)?;
                    let space = VolumeSpace {
                        referenced_bytes: r.u64(at + BLKPTR_BYTES)?,
                        logical_bytes: r.u64(at + BLKPTR_BYTES + 8)?,
                        physical_bytes: r.u64(at + BLKPTR_BYTES + 16)?,
                    };
                    let (deadlist, end) =
                        Deadlist::decode_from(&r, WHAT, at + SNAPSHOT_AFTER_NAME_BYTES)?;
                    at = end;
                    let txg = r.u64(fixed + 16)?;
                    if snapshots.last().is_some_and(|s: &SnapshotEntry| s.txg >= txg)
                        || txg > prev_snap_txg
                    {
                        return Err(FormatError::Invalid {
                            what: WHAT,
                            field: "snapshot txg (out of order)",
                            value: txg,
                        });
                    }
                    snapshots.push(SnapshotEntry {
                        id: r.u64(fixed)?,
                        guid: r.u64(fixed + 8)?,
                        name,
                        txg,
                        creation_secs: r.u64(fixed + 24)?,
                        size_bytes: r.u64(fixed + 32)?,
                        levels: r.u8(fixed + 40)?,
                        root,
                        space,
                        deadlist,
                        root_mac: [0; ROOT_MAC_BYTES],
                        automatic: flags & properties::SNAPSHOT_AUTOMATIC_BIT != 0,
                    });
                }
            }
            let mut receive = None;
            if version >= FormatVersion::V5 {
                let to_guid = r.u64(at)?;
                let source_len = usize::from(r.u16(at + 24)?);
                let source = std::str::from_utf8(r.slice(at + 26, source_len)?)
                    .map_err(|_| FormatError::Invalid {
                        what: WHAT,
                        field: "receive source name",
                        value: source_len as u64,
                    })?
                    .to_owned();
                if to_guid != 0 {
                    receive = Some(ReceiveState {
                        to_guid,
                        from_guid: Some(r.u64(at + 8)?).filter(|&g| g != 0),
                        next_block: r.u64(at + 16)?,
                        source,
                    });
                } else if source_len != 0 {
                    return Err(FormatError::Invalid {
                        what: WHAT,
                        field: "receive source without a receive",
                        value: source_len as u64,
                    });
                } else {
                    r.zeros(at + 8, 16)?;
                }
                at += VOLUME_V5_FIXED_BYTES + source_len;
            }
            let (mut key_family, mut root_mac) = (0, [0; ROOT_MAC_BYTES]);
            if version >= FormatVersion::V7 {
                key_family = r.u64(at)?;
                root_mac.copy_from_slice(r.slice(at + 8, ROOT_MAC_BYTES)?);
                at += VOLUME_V7_FIXED_BYTES;
                for snapshot in &mut snapshots {
                    snapshot.root_mac.copy_from_slice(r.slice(at, ROOT_MAC_BYTES)?);
                    at += ROOT_MAC_BYTES;
                }
            }
            let mut snapshot_schedule = Vec::new();
            if version >= FormatVersion::V8 {
                let (rules, end) = properties::decode_schedule(&r, at)?;
                snapshot_schedule = rules;
                at = end;
            }
            if let Some(volume) = volumes.last_mut() {
                volume.snapshot_schedule = snapshot_schedule;
                volume.key_family = key_family;
                volume.root_mac = root_mac;
                volume.receive = receive;
                volume.prev_snap_txg = prev_snap_txg;
                volume.origin = origin;
                volume.deadlist = deadlist;
                volume.snapshots = snapshots;
                volume.log = log;
                volume.compression = compression;
                volume.reservation_bytes = reservation;
                volume.space = space;
            }
        }
        let ddt = DdtHeader::decode_from(&r, at)?;
        at += DDT_HEADER_BYTES;
        let records = if version >= FormatVersion::V2 {
            let (records, end) = DirectoryRecords::decode_from(&r, at, version)?;
            at = end;
            Some(records)
        } else {
            None
        };
        let mut key_families = Vec::new();
        if version < FormatVersion::V7 && records.as_ref().is_some_and(|r| r.config.encryption) {
            // Its writer would have written V7: the volumes' key families are missing.
            return Err(FormatError::Invalid {
                what: WHAT,
                field: "encryption feature in a directory before V7",
                value: version as u64,
            });
        }
        let listed = |feature: fn(&VdevTreeConfig) -> bool| {
            records.as_ref().is_some_and(|r| feature(&r.config))
        };
        // Each version is written exactly when its feature is listed.
        if (version >= FormatVersion::V8) != listed(|c| c.properties) {
            return Err(FormatError::Invalid {
                what: WHAT,
                field: "pool_properties feature in a directory of another version than V8",
                value: version as u64,
            });
        }
        if version >= FormatVersion::V7 {
            if version == FormatVersion::V7 && !listed(|c| c.encryption) {
                return Err(FormatError::Invalid {
                    what: WHAT,
                    field: "V7 directory without the encryption feature",
                    value: 7,
                });
            }
            let count = r.u32(at)? as usize;
            at += 4;
            if count > len.saturating_sub(at) / crate::WRAPPED_KEY_FIXED_BYTES {
                return Err(FormatError::Invalid {
                    what: WHAT,
                    field: "key family count",
                    value: count as u64,
                });
            }
            for _ in 0..count {
                let (family, used) = WrappedKey::decode(r.slice(at, len.saturating_sub(at))?)?;
                if key_families.iter().any(|k: &WrappedKey| k.guid == family.guid) {
                    return Err(FormatError::Invalid {
                        what: WHAT,
                        field: "key family (listed twice)",
                        value: family.guid,
                    });
                }
                key_families.push(family);
                at += used;
            }
        }
        if let Some(v) = volumes
            .iter()
            .find(|v| v.key_family != 0 && !key_families.iter().any(|k| k.guid == v.key_family))
        {
            return Err(FormatError::Invalid {
                what: WHAT,
                field: "volume key family (not in the directory)",
                value: v.key_family,
            });
        }
        let properties = if version >= FormatVersion::V8 {
            let properties = PoolProperties::decode_from(&r, at)?;
            at += properties::PROPERTIES_BYTES;
            Some(properties)
        } else {
            None
        };
        if at != len {
            return Err(FormatError::Invalid {
                what: WHAT,
                field: "encoded_len",
                value: len as u64,
            });
        }
        Ok(PoolDirectory {
            properties,
            txg: r.u64(16)?,
            next_volume_id: r.u64(24)?,
            space_maps,
            volumes,
            ddt,
            records,
            key_families,
        })
    }
}
