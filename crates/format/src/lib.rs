//! On-disk types only: block pointers, uberblocks, labels, space maps, the pool directory and
//! intent-log blocks (ZFS: `spa.h`, `uberblock_impl.h`,
//! `vdev_impl.h`, `zil.h`, `ddt.h`), and RAID-Z's geometry and parity, which place blocks on
//! disk as surely as any structure here ([`raidz`]; ZFS: `vdev_raidz.c`).
//!
//! Rules every structure here keeps (STYLE.md §7): little-endian integers encoded by hand at
//! fixed offsets given in a byte table at the top of each module; a magic number, a version that
//! decodes through an enum refusing unknown values, a checksum-algorithm byte and a checksum over
//! everything before it; reserved bytes written as zero and checked to be zero. Decoders return
//! [`FormatError`] for any input and never panic; each structure has golden bytes under
//! `tests/golden/` that pin its layout.

mod blkptr;
mod checksum;
mod codec;
mod crypto_key;
mod ddt;
mod deadlist;
mod directory;
mod error;
mod label;
mod log_block;
pub mod raidz;
mod send_stream;
mod space_map;
mod uberblock;

pub use blkptr::{
    BlockCompression, BlockCrypt, BlockKind, BlockPointer, Dva, AUTH_BYTES, BLKPTR_BYTES,
    CHILDREN_MAC_BYTES, COMPRESSED_HEADER_BYTES, DVAS_MAX, ENCRYPTED_DVAS_MAX, IV_BYTES, MAC_BYTES,
};
pub use checksum::{Checksum, ChecksumAlg};
pub use crypto_key::{
    Argon2Params, CryptSuite, KeyFormat, KeyLocation, WrappedKey, KDF_SALT_BYTES,
    KEY_LOCATION_BYTES_MAX, MASTER_KEY_BYTES, WRAPPED_KEY_FIXED_BYTES, WRAP_AAD_BYTES,
};
pub use ddt::{
    DdtBucket, DdtEntry, DdtHeader, DdtKey, DDT_BUCKET_BITS_MAX, DDT_ENTRY_BYTES, DDT_HEADER_BYTES,
    DDT_KEY_BYTES,
};
pub use deadlist::{Deadlist, DeadlistPiece, DEADLIST_PIECE_BYTES, DEADLIST_PIECE_ENTRIES};
pub use directory::{
    check_schedule, Compression, DedupMode, DirectoryRecords, LeafRecord, LeafRecordState, LogBias,
    LogHeader, Origin, PoolDirectory, PoolProperties, ReceiveState, ScanBookmark, ScanKind,
    ScanRecord, ScanRecordPhase, SchedulePeriod, ScheduleRule, SnapshotEntry, SyncMode, TreeRef,
    VolumeEntry, VolumeSpace, ROOT_MAC_BYTES, SCHEDULE_KEEP_MAX, SCRUB_INTERVAL_DEFAULT_SECS,
    VOLUME_NAME_BYTES_MAX,
};
pub use error::FormatError;
pub use label::{
    data_end_bytes, feature_description, label_offsets, uberblock_offset, LabelHeader, LeafConfig,
    RaidzConfig, SpareConfig, TopConfig, TopKind, VdevTreeConfig, CONFIG_BYTES_MAX,
    DATA_START_BYTES, FEATURES_KNOWN, FEATURES_UPGRADABLE, LABEL_BYTES, LABEL_COUNT,
    LABEL_HEADER_BYTES, LABEL_VERSION, POOL_NAME_BYTES_MAX, SPARES_MAX, UBERBLOCK_SLOTS,
};
pub use log_block::{
    gather_vec, LogBlock, LogRecord, LogVerifier, RecordSeal, LOG_HEADER_BYTES,
    LOG_WRITE_UNIT_BYTES, RECORD_SEAL_BYTES,
};
pub use send_stream::{
    RawBegin, ResumeToken, StreamBegin, StreamError, StreamReader, StreamRecord, StreamWriter,
    TokenError, RAW_STREAM_VERSION, STREAM_PAYLOAD_MAX, STREAM_VERSION,
};
pub use space_map::SpaceMap;
pub use uberblock::{Uberblock, UBERBLOCK_BYTES};

/// Every on-disk structure is a whole number of these.
pub const SECTOR_BYTES: u32 = 512;

const _: () = assert!(SECTOR_BYTES.is_power_of_two());

/// On-disk format versions. Unknown versions are refused, never guessed at.
///
/// Each structure carries its own version and is written at the newest one its layout has:
/// V2 changed only the uberblock (each leaf's copy says which txgs that leaf holds) and the
/// pool directory (the trusted vdev tree, each leaf's state and error counts, the scan
/// record); the others are still written, and only read, as V1. A V1 uberblock or directory,
/// from a pool made before V2, still decodes. V3 and V4 changed only the directory: V3 added
/// each volume's compression, reservation and space figures, V4 its snapshots and dead lists,
/// V5 the state of a receive that can be resumed. V6 changed only the vdev tree config that
/// labels and the directory carry: it may hold RAID-Z vdevs and names the features needed to
/// read it. It is written only when the tree needs a feature (a RAID-Z vdev), so a pool
/// without one still writes V1 labels and a V5 directory, which older builds read. V7 changed
/// only the directory: each volume's and snapshot's key family and root MAC, and the pool's
/// wrapped keys, written only when the pool has encrypted volumes (its config then lists the
/// `encryption` feature, so an older build refuses it by that name at the labels). V8 changed
/// only the directory: the pool's properties (scheduled scrubs and the last one's end), each
/// volume's snapshot schedule and which snapshots it took, written only once such a property
/// has been set or a scrub has finished (the config then lists `pool_properties`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FormatVersion {
    V1 = 1,
    V2 = 2,
    V3 = 3,
    V4 = 4,
    V5 = 5,
    V6 = 6,
    V7 = 7,
    V8 = 8,
}

impl FormatVersion {
    /// The newest version any structure is written at, and so the newest this build reads.
    /// Structures are not all written at it: labels reach V6 only when their vdev tree config
    /// needs it ([`VdevTreeConfig::version`]), the directory V6 then and V7 only when the pool
    /// has encrypted volumes, V8 only when it has pool properties.
    pub const CURRENT: FormatVersion = FormatVersion::V8;

    /// Decodes a structure's version field, refusing versions newer than `newest`, the
    /// newest one that structure has.
    pub(crate) fn decode(
        what: &'static str,
        raw: u16,
        newest: FormatVersion,
    ) -> Result<FormatVersion, FormatError> {
        let version = match raw {
            1 => FormatVersion::V1,
            2 => FormatVersion::V2,
            3 => FormatVersion::V3,
            4 => FormatVersion::V4,
            5 => FormatVersion::V5,
            6 => FormatVersion::V6,
            7 => FormatVersion::V7,
            8 => FormatVersion::V8,
            found => return Err(FormatError::UnsupportedVersion { what, found }),
        };
        if version > newest {
            return Err(FormatError::UnsupportedVersion { what, found: raw });
        }
        Ok(version)
    }
}
