//! Leaf labels (ZFS: `vdev_label.c`): who a leaf is, which pool and vdev tree it belongs to, and
//! its uberblock rings.
//!
//! A leaf carries four labels, two at the start and two at the end, so that overwriting either
//! end of a disk leaves two. Each label is 256 KiB: a 4 KiB header, padding, then a ring of 128
//! uberblock slots of 1 KiB in its last 128 KiB. Data lives between the first 4 MiB (labels plus
//! room for a boot area, as in ZFS) and the two end labels.
//!
//! ```text
//! leaf:   | L0 | L1 | (reserved to 4 MiB) | data ... | L2 | L3 |
//! label:  | header 4 KiB | zero to 128 KiB | uberblock ring: 128 x 1 KiB |
//!
//! header:
//! offset size field
//!      0    8 magic u64                "SLUICELB" as little-endian bytes
//!      8    2 version u16              1, or 6 when the config is in its V6 layout
//!     10    1 checksum_alg u8
//!     11    1 ashift u8                log2 of the smallest allocation (9..=16)
//!     12    4 reserved (zero)
//!     16    8 pool_guid u64
//!     24    8 leaf_guid u64
//!     32    8 top_guid u64             the top-level vdev this leaf belongs to
//!     40    8 config_txg u64           txg in which this configuration was written
//!     48    8 leaf_bytes u64           leaf size when labelled
//!     56    2 pool_name_len u16
//!     58   64 pool_name                UTF-8, zero padded
//!    122    2 reserved (zero)
//!    124    4 config_len u32
//!    128 3952 config                   VdevTreeConfig, then zero padding
//!   4080   16 checksum                 over bytes 0..4080
//!
//! config, V1 layout (in a label of version 1 and a directory of version 2 to 5):
//!   top_count u16, then per top-level vdev:
//!     kind u8 (0 leaf, 1 mirror; bit 7 set: a separate log device), guid u64, child_count u16,
//!     per child: guid u64, path_len u16, path (UTF-8, a hint for finding the leaf again)
//!
//! config, V6 layout (in a label or directory of version 6):
//!   feature_count u8, per feature: name_len u8, name (ASCII)   the features needed to read it
//!   top_count u16, then per top-level vdev:
//!     kind u8 (0 leaf, 1 mirror, 2 raidz, 3 hole; bit 7 set: a separate log device, never
//!       raidz nor a hole),
//!     guid u64,
//!     raidz only: parity u8 (1..=3), flags u8 (bit 0: intent-log blocks laid out as
//!       copies, feature `raidz_log_copies`; other bits zero), child_end_bytes u64 (above
//!       DATA_START_BYTES)
//!     child_count u16 (raidz: parity + 2 to 64, in column order), per child: guid u64,
//!       path_len u16, path
//!     raidz only: replacing_count u8, per entry: column u16 (each column at most once),
//!       guid u64, path_len u16, path
//!     hole (kind 3, feature `hole_vdevs`): guid 0, child_count 0, nothing else; the place of a
//!       removed log device, kept so that the vdevs after it keep their numbers (block
//!       pointers name a vdev by its index)
//!   with feature `spares` only: spare_count u8 (1 to 64), per hot spare: guid u64,
//!     path_len u16, path, stands_in_for u64 (the leaf it replaces while in use, a member of
//!     the same top-level vdev as the spare, which is then a member too: a mirror child or a
//!     RAID-Z column's replacing leaf; 0: available, and a member of no vdev)
//! ```
//!
//! The V6 layout is written only when the tree needs a feature: some top-level vdev is RAID-Z
//! (feature `raidz`, and `raidz_log_copies` when a RAID-Z vdev lays out its log blocks as
//! copies: `sluice_format::raidz`'s module doc), the pool has encrypted volumes
//! (`encryption`), its directory holds pool properties (`pool_properties`, crate
//! `directory`), it has hot spares (`spares`), a removed log device's hole (`hole_vdevs`), or
//! it stores indirect blocks compressed (`lz4_indirect`: every pool made since that feature).
//! Any other tree is written in the V1 layout in a V1 label, and in a V5
//! directory, byte for byte as before V6, so that older builds still read such a pool. The
//! features are derived from the config ([`VdevTreeConfig::features`]), not kept in it: they
//! are there for the reader, which refuses a config naming one it does not know
//! ([`FEATURES_KNOWN`]) before reading the tree, by name
//! ([`FormatError::UnknownFeatures`]), rather than misread what a newer sluice wrote.

use crate::codec::{check_header, Reader, Writer};
use crate::raidz::RaidzError;
use crate::{ChecksumAlg, FormatError, FormatVersion, UBERBLOCK_BYTES};

pub const LABEL_BYTES: u64 = 256 << 10;
pub const LABEL_COUNT: usize = 4;
pub const LABEL_HEADER_BYTES: usize = 4096;
pub const UBERBLOCK_SLOTS: u64 = 128;
pub const DATA_START_BYTES: u64 = 4 << 20;
pub const POOL_NAME_BYTES_MAX: usize = 64;
const RING_OFFSET: u64 = LABEL_BYTES - UBERBLOCK_SLOTS * UBERBLOCK_BYTES as u64;

const MAGIC: u64 = u64::from_le_bytes(*b"SLUICELB");
const OFF_VERSION: usize = 8;
const OFF_ALG: usize = 10;
const OFF_ASHIFT: usize = 11;
const OFF_RESERVED_A: usize = 12;
const OFF_POOL_GUID: usize = 16;
const OFF_LEAF_GUID: usize = 24;
const OFF_TOP_GUID: usize = 32;
const OFF_CONFIG_TXG: usize = 40;
const OFF_LEAF_BYTES: usize = 48;
const OFF_NAME_LEN: usize = 56;
const OFF_NAME: usize = 58;
const OFF_RESERVED_B: usize = OFF_NAME + POOL_NAME_BYTES_MAX;
const OFF_CONFIG_LEN: usize = 124;
const OFF_CONFIG: usize = 128;
const OFF_CHECKSUM: usize = LABEL_HEADER_BYTES - 16;

/// The most bytes a vdev tree config takes (3,952): the room for it in a label header. The
/// directory holds the same config, and refuses a larger one too, so that every label can
/// carry the tree the directory trusts.
///
/// What fits: in the V1 layout, 2 bytes, per top-level vdev 11, per child 10 plus its path.
/// In the V6 layout, 9 bytes (the feature `raidz` and top_count), per leaf or mirror 11, per
/// RAID-Z vdev 22, per child 10 plus its path, per child being replaced 12 plus its path. So
/// one RAID-Z vdev alone, of children with paths of `L` bytes, fits `3,921 / (10 + L)` of
/// them, at most 64: all 64 with paths up to 51 bytes (up to 50 with one child being
/// replaced), 52 with paths of 64 bytes, 35 with paths of 100. Hot spares take 1 byte, the
/// feature's name 7, and 18 per spare plus its path; holes 11 each and the feature's name 11.
pub const CONFIG_BYTES_MAX: usize = OFF_CHECKSUM - OFF_CONFIG;

const _: () = assert!(OFF_RESERVED_B + 2 == OFF_CONFIG_LEN);
const _: () = assert!(RING_OFFSET >= LABEL_HEADER_BYTES as u64);
const _: () = assert!(DATA_START_BYTES >= 2 * LABEL_BYTES);

const WHAT: &str = "label";
/// The newest label version this build reads (a newer one is refused as
/// [`FormatError::UnsupportedVersion`]). A label is written at its config's version
/// ([`VdevTreeConfig::version`]): V1, or V6 when the pool needs a feature (a RAID-Z vdev,
/// encrypted volumes).
pub const LABEL_VERSION: FormatVersion = FormatVersion::V6;
/// Every label version there is: labels had no V2 to V5 (those changed other structures), so
/// a label claiming one is refused as unknown, not guessed at.
const LABEL_VERSIONS: [FormatVersion; 2] = [FormatVersion::V1, FormatVersion::V6];
const CONFIG_WHAT: &str = "vdev tree config";

/// The features this build knows: a config naming any other is refused
/// ([`FormatError::UnknownFeatures`]).
pub const FEATURES_KNOWN: &[&str] = &[
    FEATURE_RAIDZ,
    FEATURE_ENCRYPTION,
    FEATURE_RAIDZ_LOG_COPIES,
    FEATURE_POOL_PROPERTIES,
    FEATURE_SPARES,
    FEATURE_HOLE_VDEVS,
    FEATURE_LZ4_INDIRECT,
];
/// The features `pool upgrade` enables on a pool made without them (by an older build, or by
/// `pool create -d`), as `zpool upgrade` enables ZFS's: each changes only how blocks written
/// from then on are stored, so a pool can take it at any time. Every other feature is listed
/// once the pool uses what it names (a RAID-Z vdev, a key, a property, a spare), or, for
/// `raidz_log_copies`, fixed when the vdev is made: its log chains are laid out one way for
/// their life.
pub const FEATURES_UPGRADABLE: &[&str] = &[FEATURE_LZ4_INDIRECT];

/// What each of [`FEATURES_KNOWN`] means to a user, for `pool upgrade -v`.
pub fn feature_description(name: &str) -> Option<&'static str> {
    Some(match name {
        FEATURE_RAIDZ => "RAID-Z vdevs (listed when the pool has one)",
        FEATURE_ENCRYPTION => "encrypted volumes (listed when the first key is made)",
        FEATURE_RAIDZ_LOG_COPIES => {
            "a RAID-Z vdev writes intent-log blocks as copies, not striped (listed for RAID-Z \
             vdevs made since; a vdev keeps the layout it was made with)"
        }
        FEATURE_POOL_PROPERTIES => {
            "pool properties and snapshot schedules in the pool directory (listed when the \
             first is set)"
        }
        FEATURE_SPARES => "hot spares (listed while the pool has one)",
        FEATURE_HOLE_VDEVS => "the hole a removed log device leaves in the vdev tree",
        FEATURE_LZ4_INDIRECT => {
            "indirect blocks stored lz4-compressed, in about half their space (on for new \
             pools; pool upgrade turns it on for older ones)"
        }
        _ => return None,
    })
}

/// Some top-level vdev is RAID-Z.
const FEATURE_RAIDZ: &str = "raidz";
/// The pool has encrypted volumes: its directory holds key families and encrypted block
/// pointers, which a reader that does not know them would misread.
const FEATURE_ENCRYPTION: &str = "encryption";
/// Some RAID-Z vdev lays out intent-log blocks as copies ([`RaidzConfig::log_copies`]): a
/// build that reads them striped would find no chain and drop acknowledged writes.
const FEATURE_RAIDZ_LOG_COPIES: &str = "raidz_log_copies";
/// The pool's directory is V8: it holds pool properties, snapshot schedules and which
/// snapshots they took ([`VdevTreeConfig::properties`]).
const FEATURE_POOL_PROPERTIES: &str = "pool_properties";
/// Indirect blocks may be stored lz4-compressed ([`VdevTreeConfig::lz4_indirect`]): a build
/// that does not know it refuses their block pointers' compression, or would decode the
/// compressed bytes as block pointers.
const FEATURE_LZ4_INDIRECT: &str = "lz4_indirect";
/// The pool has hot spares ([`VdevTreeConfig::spares`]): a build that does not know them
/// would take an available spare for a stray leaf and an active one for a plain member.
const FEATURE_SPARES: &str = "spares";
/// The tree has a hole where a log device was removed ([`TopKind::Hole`]): a build that does
/// not know holes would number the vdevs after it wrongly.
const FEATURE_HOLE_VDEVS: &str = "hole_vdevs";
/// The most hot spares a pool has.
pub const SPARES_MAX: usize = 64;
/// [`RaidzConfig::log_copies`] in a RAID-Z vdev's flags byte.
const RAIDZ_LOG_COPIES_BIT: u8 = 1;

/// Offsets of the four labels on a leaf of `leaf_bytes` (the end labels aligned down to the
/// label size, so a leaf that grows by less than a label keeps them in place).
pub fn label_offsets(leaf_bytes: u64) -> [u64; LABEL_COUNT] {
    let end = leaf_bytes / LABEL_BYTES * LABEL_BYTES;
    [0, LABEL_BYTES, end.saturating_sub(2 * LABEL_BYTES), end.saturating_sub(LABEL_BYTES)]
}

/// End of the data area of a leaf of `leaf_bytes`.
pub fn data_end_bytes(leaf_bytes: u64) -> u64 {
    label_offsets(leaf_bytes)[2]
}

/// Where the uberblock of `txg` goes in the label at `label_offset`.
pub fn uberblock_offset(label_offset: u64, txg: u64) -> u64 {
    label_offset + RING_OFFSET + (txg % UBERBLOCK_SLOTS) * UBERBLOCK_BYTES as u64
}

/// Set in a top-level vdev's kind byte when it is a separate log device.
const LOG_VDEV_BIT: u8 = 0x80;

/// The kind of a top-level vdev.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TopKind {
    Leaf = 0,
    Mirror = 1,
    /// RAID-Z: its shape is in [`TopConfig::raidz`].
    Raidz = 2,
    /// The place of a removed log device (ZFS: a hole vdev): no leaves, no space, never
    /// allocated from; it keeps the index, as block pointers name vdevs by index.
    Hole = 3,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeafConfig {
    pub guid: u64,
    pub path: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopConfig {
    pub kind: TopKind,
    /// A separate intent-log device (SLOG): only log blocks are allocated on it.
    pub log: bool,
    pub guid: u64,
    /// The leaves; a RAID-Z vdev's in column order (a child's index is its column).
    pub children: Vec<LeafConfig>,
    /// A RAID-Z vdev's shape (`Some` exactly when `kind` is [`TopKind::Raidz`]).
    pub raidz: Option<RaidzConfig>,
}

impl TopConfig {
    /// A hole: the place of a removed log device.
    pub fn hole() -> TopConfig {
        TopConfig { kind: TopKind::Hole, log: false, guid: 0, children: Vec::new(), raidz: None }
    }

    /// The columns of a RAID-Z vdev for which `has` holds for neither its child nor the leaf
    /// replacing it (leaves by guid); 0 for a leaf or a mirror.
    pub fn columns_lacking(&self, has: impl Fn(u64) -> bool) -> usize {
        let Some(raidz) = &self.raidz else { return 0 };
        let replaced = |column: usize| {
            raidz.replacing.iter().any(|(c, new)| usize::from(*c) == column && has(new.guid))
        };
        (self.children.iter().enumerate())
            .filter(|&(c, child)| !has(child.guid) && !replaced(c))
            .count()
    }

    /// Whether the vdev holds every block with only the leaves for which `has` holds: one of a
    /// leaf's or a mirror's, all but at most `parity` columns of a RAID-Z vdev's.
    pub fn serves_with(&self, has: impl Fn(u64) -> bool) -> bool {
        if self.kind == TopKind::Hole {
            // Holds nothing, so lacks nothing.
            return true;
        }
        match &self.raidz {
            None => self.children.iter().any(|c| has(c.guid)),
            Some(raidz) => self.columns_lacking(has) <= usize::from(raidz.parity),
        }
    }
}

/// What a RAID-Z top-level vdev records beyond its children. How wide a RAID-Z vdev the
/// config has room for, for a given path length, is worked out at [`CONFIG_BYTES_MAX`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RaidzConfig {
    /// Parity columns per block: 1, 2 or 3.
    pub parity: u8,
    /// Where the data area ends on every child (the smallest child's at create): the vdev's
    /// address space is `children * [DATA_START_BYTES, child_end_bytes)`, fixed for its life,
    /// whatever the size of a leaf that replaces a child.
    pub child_end_bytes: u64,
    /// Children being replaced: (column, the new leaf). Writes go to both the column's leaf and
    /// its replacement until the replacement holds every block; a column's index never
    /// changes, so a replacing pair sits in its column's slot. At most one per column.
    pub replacing: Vec<(u16, LeafConfig)>,
    /// Intent-log blocks are laid out as copies (`RaidzLayout::Copies`): set for every RAID-Z
    /// vdev a pool is created with; a pool made before keeps its striped log blocks.
    pub log_copies: bool,
}

/// The pool's vdev tree as recorded in every label.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VdevTreeConfig {
    pub top: Vec<TopConfig>,
    /// The pool has had encrypted volumes (ZFS: a feature in the label's `features_for_read`).
    /// Set when the first key family is made and kept, so that every label names the feature
    /// and a build that does not know it refuses the pool by the feature's name.
    pub encryption: bool,
    /// The pool's directory holds pool properties, snapshot schedules and which snapshots
    /// they took (V8, feature `pool_properties`). Set at the first property set, schedule set
    /// or scrub finished, and kept.
    pub properties: bool,
    /// Hot spares (feature `spares`): leaves that stand in for a faulted or degraded one.
    pub spares: Vec<SpareConfig>,
    /// Indirect blocks are written lz4-compressed (feature `lz4_indirect`), as OpenZFS writes
    /// its metadata. Set for every pool made since the feature; a pool made before keeps
    /// writing them uncompressed, so the builds that made it still read it.
    pub lz4_indirect: bool,
}

/// A hot spare (ZFS: an entry of the config's `spares` list, and a `spare-N` vdev while it is
/// in use).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpareConfig {
    pub guid: u64,
    pub path: String,
    /// The guid of the leaf it stands in for, a member of the same top-level vdev, as the
    /// spare then is; 0 while it is available (a member of no vdev).
    pub stands_in_for: u64,
}

impl VdevTreeConfig {
    /// The features a reader must know to read this pool: `raidz` when some top-level vdev is
    /// RAID-Z, `encryption` when [`VdevTreeConfig::encryption`], `raidz_log_copies`,
    /// `pool_properties` when [`VdevTreeConfig::properties`], `spares` when it has hot spares,
    /// `hole_vdevs` when a log device was removed, and `lz4_indirect` when
    /// [`VdevTreeConfig::lz4_indirect`].
    /// Empty for any other pool.
    pub fn features(&self) -> Vec<&'static str> {
        let mut features = Vec::new();
        if self.top.iter().any(|top| top.kind == TopKind::Raidz) {
            features.push(FEATURE_RAIDZ);
        }
        if self.encryption {
            features.push(FEATURE_ENCRYPTION);
        }
        if self.top.iter().any(|top| top.raidz.as_ref().is_some_and(|r| r.log_copies)) {
            features.push(FEATURE_RAIDZ_LOG_COPIES);
        }
        if self.properties {
            features.push(FEATURE_POOL_PROPERTIES);
        }
        if !self.spares.is_empty() {
            features.push(FEATURE_SPARES);
        }
        if self.top.iter().any(|top| top.kind == TopKind::Hole) {
            features.push(FEATURE_HOLE_VDEVS);
        }
        if self.lz4_indirect {
            features.push(FEATURE_LZ4_INDIRECT);
        }
        features
    }

    /// The [`FEATURES_UPGRADABLE`] this config does not list: what `pool upgrade` would
    /// enable.
    pub fn features_disabled(&self) -> Vec<&'static str> {
        let listed = self.features();
        FEATURES_UPGRADABLE.iter().copied().filter(|f| !listed.contains(f)).collect()
    }

    /// This config with every [`FEATURES_UPGRADABLE`] enabled.
    pub fn upgraded(&self) -> VdevTreeConfig {
        VdevTreeConfig { lz4_indirect: true, ..self.clone() }
    }

    /// The layout [`encode`](Self::encode) writes, and so the version of a label carrying it:
    /// V1 for a tree that needs no feature, V6 for one that does. (A directory carrying a V1
    /// config is written at V5, its own fields' newest version; one carrying a V6 config at
    /// V6.)
    pub fn version(&self) -> FormatVersion {
        if self.features().is_empty() {
            FormatVersion::V1
        } else {
            FormatVersion::V6
        }
    }

    /// The config's bytes as labels and the pool directory carry them, in the layout of
    /// [`version`](Self::version). A RAID-Z vdev that [`decode`](Self::decode) would refuse
    /// (its `raidz` missing or out of range, a log device) is refused here as
    /// [`FormatError::Invalid`], as is a `raidz` on a vdev that is not RAID-Z: nothing is
    /// written that cannot be read back.
    pub fn encode(&self) -> Result<Vec<u8>, FormatError> {
        let too_large =
            |len| FormatError::TooLarge { what: CONFIG_WHAT, len, max: CONFIG_BYTES_MAX };
        let mut out = Vec::new();
        if self.version() == FormatVersion::V6 {
            let features = self.features();
            // This build's features: a handful of short names.
            out.push(features.len() as u8);
            for name in features {
                out.push(name.len() as u8);
                out.extend_from_slice(name.as_bytes());
            }
        }
        let count = u16::try_from(self.top.len()).map_err(|_| too_large(self.top.len()))?;
        out.extend_from_slice(&count.to_le_bytes());
        for top in &self.top {
            let raidz = match (top.kind, &top.raidz) {
                (TopKind::Raidz, Some(raidz)) => {
                    check_raidz(top.log, raidz.parity, top.children.len(), raidz.child_end_bytes)?;
                    check_replacing(
                        top.children.len(),
                        raidz.replacing.iter().map(|&(column, _)| column),
                    )?;
                    Some(raidz)
                }
                (TopKind::Raidz, None) => {
                    return Err(invalid("raidz (missing on a RAID-Z vdev)", top.guid))
                }
                (_, Some(_)) => return Err(invalid("raidz (on a vdev not RAID-Z)", top.guid)),
                (_, None) => None,
            };
            check_children(top.kind, top.log, top.guid, top.children.len())?;
            out.push(top.kind as u8 | if top.log { LOG_VDEV_BIT } else { 0 });
            out.extend_from_slice(&top.guid.to_le_bytes());
            if let Some(raidz) = raidz {
                out.push(raidz.parity);
                out.push(if raidz.log_copies { RAIDZ_LOG_COPIES_BIT } else { 0 });
                out.extend_from_slice(&raidz.child_end_bytes.to_le_bytes());
            }
            let children =
                u16::try_from(top.children.len()).map_err(|_| too_large(top.children.len()))?;
            out.extend_from_slice(&children.to_le_bytes());
            for leaf in &top.children {
                put_leaf(&mut out, leaf)?;
            }
            if let Some(raidz) = raidz {
                // At most one per column (checked above), and a RAID-Z vdev has at most 64.
                out.push(raidz.replacing.len() as u8);
                for (column, leaf) in &raidz.replacing {
                    out.extend_from_slice(&column.to_le_bytes());
                    put_leaf(&mut out, leaf)?;
                }
            }
        }
        if !self.spares.is_empty() {
            self.check_spares()?;
            // At most SPARES_MAX (checked above).
            out.push(self.spares.len() as u8);
            for spare in &self.spares {
                put_leaf(&mut out, &LeafConfig { guid: spare.guid, path: spare.path.clone() })?;
                out.extend_from_slice(&spare.stands_in_for.to_le_bytes());
            }
        }
        if out.len() > CONFIG_BYTES_MAX {
            return Err(too_large(out.len()));
        }
        Ok(out)
    }

    /// Every leaf guid a top-level vdev names: the children and the leaves replacing them.
    fn member_guids(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        self.top.iter().enumerate().flat_map(|(t, top)| {
            let replacing = top.raidz.iter().flat_map(|r| r.replacing.iter().map(|(_, l)| l));
            top.children.iter().chain(replacing).map(move |l| (t, l.guid))
        })
    }

    /// What the spares must be, checked alike by encode and decode: at most [`SPARES_MAX`],
    /// none listed twice or with guid 0; an available one a member of no vdev; one in use a
    /// member of the vdev of the leaf it stands in for, which is another member; no leaf
    /// stood in for twice.
    fn check_spares(&self) -> Result<(), FormatError> {
        if self.spares.len() > SPARES_MAX {
            return Err(invalid("spare_count", self.spares.len() as u64));
        }
        let top_of = |guid: u64| self.member_guids().find(|&(_, g)| g == guid).map(|(t, _)| t);
        for (i, spare) in self.spares.iter().enumerate() {
            if spare.guid == 0 || self.spares[..i].iter().any(|s| s.guid == spare.guid) {
                return Err(invalid("spare guid (zero or listed twice)", spare.guid));
            }
            if spare.stands_in_for == 0 {
                if top_of(spare.guid).is_some() {
                    return Err(invalid("spare (available, yet a member of a vdev)", spare.guid));
                }
                continue;
            }
            let (Some(top), Some(for_top)) = (top_of(spare.guid), top_of(spare.stands_in_for))
            else {
                return Err(invalid("spare in use (it or its leaf not a member)", spare.guid));
            };
            let twice = self.spares[..i].iter().any(|s| s.stands_in_for == spare.stands_in_for);
            if top != for_top || spare.stands_in_for == spare.guid || twice {
                return Err(invalid("spare stands_in_for", spare.stands_in_for));
            }
        }
        Ok(())
    }

    /// Decodes a config from a label or directory of `version` (the version read from its
    /// header): the V1 layout below V6, the V6 layout at V6. Features this build does not know
    /// are refused ([`FormatError::UnknownFeatures`]) before the tree is read.
    pub fn decode(bytes: &[u8], version: FormatVersion) -> Result<VdevTreeConfig, FormatError> {
        let what = CONFIG_WHAT;
        let mut cursor = Cursor { what, bytes, at: 0 };
        let v6 = version >= FormatVersion::V6;
        let mut features = Vec::new();
        if v6 {
            let count = cursor.u8()?;
            for _ in 0..count {
                let len = cursor.u8()?;
                let name = cursor.take(usize::from(len))?;
                if name.is_empty() || !name.is_ascii() {
                    return Err(invalid("feature name", u64::from(len)));
                }
                let name = String::from_utf8_lossy(name).into_owned();
                if features.contains(&name) {
                    return Err(invalid("feature name (listed twice)", u64::from(len)));
                }
                features.push(name);
            }
            let unknown: Vec<String> = features
                .iter()
                .filter(|name| !FEATURES_KNOWN.contains(&name.as_str()))
                .cloned()
                .collect();
            if !unknown.is_empty() {
                return Err(FormatError::UnknownFeatures { what, names: unknown });
            }
        }
        let count = cursor.u16()?;
        let mut top = Vec::new();
        for _ in 0..count {
            let byte = cursor.u8()?;
            let log = byte & LOG_VDEV_BIT != 0;
            let kind = match byte & !LOG_VDEV_BIT {
                0 => TopKind::Leaf,
                1 => TopKind::Mirror,
                // A V1 config has no RAID-Z nor holes: its readers would take them for
                // something else.
                2 if v6 => TopKind::Raidz,
                3 if v6 => TopKind::Hole,
                value => return Err(invalid("kind", u64::from(value))),
            };
            let guid = cursor.u64()?;
            let shape = if kind == TopKind::Raidz {
                let parity = cursor.u8()?;
                let flags = cursor.u8()?;
                if flags & !RAIDZ_LOG_COPIES_BIT != 0 {
                    return Err(invalid("raidz flags", u64::from(flags)));
                }
                Some((parity, flags & RAIDZ_LOG_COPIES_BIT != 0, cursor.u64()?))
            } else {
                None
            };
            let child_count = cursor.u16()?;
            // Checked before the children are read: a wrong width is named as such.
            if let Some((parity, _, child_end_bytes)) = shape {
                check_raidz(log, parity, usize::from(child_count), child_end_bytes)?;
            }
            let mut children = Vec::new();
            for _ in 0..child_count {
                children.push(cursor.leaf()?);
            }
            check_children(kind, log, guid, children.len())?;
            let raidz = match shape {
                Some((parity, log_copies, child_end_bytes)) => {
                    let mut replacing = Vec::new();
                    for _ in 0..cursor.u8()? {
                        let column = cursor.u16()?;
                        replacing.push((column, cursor.leaf()?));
                    }
                    check_replacing(children.len(), replacing.iter().map(|&(column, _)| column))?;
                    Some(RaidzConfig { parity, child_end_bytes, replacing, log_copies })
                }
                None => None,
            };
            top.push(TopConfig { kind, log, guid, children, raidz });
        }
        let mut spares = Vec::new();
        if features.iter().any(|f| f == FEATURE_SPARES) {
            let count = cursor.u8()?;
            if count == 0 {
                return Err(invalid("spare_count (the feature without spares)", 0));
            }
            for _ in 0..count {
                let leaf = cursor.leaf()?;
                let stands_in_for = cursor.u64()?;
                spares.push(SpareConfig { guid: leaf.guid, path: leaf.path, stands_in_for });
            }
        }
        if cursor.at != bytes.len() {
            return Err(invalid("trailing bytes", (bytes.len() - cursor.at) as u64));
        }
        let encryption = features.iter().any(|f| f == FEATURE_ENCRYPTION);
        let properties = features.iter().any(|f| f == FEATURE_POOL_PROPERTIES);
        let lz4_indirect = features.iter().any(|f| f == FEATURE_LZ4_INDIRECT);
        let config = VdevTreeConfig { top, encryption, properties, spares, lz4_indirect };
        config.check_spares()?;
        // A writer that left out a feature its tree needs would have an older build misread
        // the tree rather than refuse it.
        if config.features().iter().any(|needed| !features.iter().any(|f| f == needed)) {
            return Err(invalid("features (a tree without the features it uses)", 0));
        }
        Ok(config)
    }
}

fn invalid(field: &'static str, value: u64) -> FormatError {
    FormatError::Invalid { what: CONFIG_WHAT, field, value }
}

/// How many children a top-level vdev of `kind` has: a leaf one, a mirror or RAID-Z vdev some
/// (RAID-Z's width is checked apart), a hole none; and a hole is no log device and has guid 0.
fn check_children(kind: TopKind, log: bool, guid: u64, children: usize) -> Result<(), FormatError> {
    let fits = match kind {
        TopKind::Leaf => children == 1,
        TopKind::Mirror | TopKind::Raidz => children > 0,
        TopKind::Hole => children == 0,
    };
    if !fits {
        return Err(invalid("child_count", children as u64));
    }
    if kind == TopKind::Hole && (log || guid != 0) {
        return Err(invalid("hole (a log device, or a guid)", guid));
    }
    Ok(())
}

/// What a RAID-Z vdev's record must be, checked alike by encode and decode: not a log device
/// (ZFS refuses RAID-Z log devices too), a parity and width [`RaidzGeometry`] accepts, and a
/// data area that ends after it starts.
///
/// [`RaidzGeometry`]: crate::raidz::RaidzGeometry
fn check_raidz(
    log: bool,
    parity: u8,
    width: usize,
    child_end_bytes: u64,
) -> Result<(), FormatError> {
    if log {
        return Err(invalid("log (a RAID-Z vdev cannot be a log device)", 1));
    }
    let width32 = u32::try_from(width).unwrap_or(u32::MAX);
    match crate::raidz::check_shape(width32, u32::from(parity)) {
        Ok(()) => {}
        Err(RaidzError::Parity { .. }) => return Err(invalid("raidz parity", u64::from(parity))),
        Err(_) => return Err(invalid("raidz child_count", width as u64)),
    }
    if child_end_bytes <= DATA_START_BYTES {
        return Err(invalid("raidz child_end_bytes", child_end_bytes));
    }
    Ok(())
}

/// The replacing entries of a RAID-Z vdev of `width` (at most 64) children: each names a
/// column of the vdev, and none twice (a column has one leaf and at most one replacement).
fn check_replacing(width: usize, columns: impl Iterator<Item = u16>) -> Result<(), FormatError> {
    let mut seen = 0u64;
    for column in columns {
        // Past 63 it would not fit `seen`, whatever the width (checked first: at most 64).
        if usize::from(column) >= width || column >= 64 {
            return Err(invalid("raidz replacing column", u64::from(column)));
        }
        let bit = 1u64 << column;
        if seen & bit != 0 {
            return Err(invalid("raidz replacing column (listed twice)", u64::from(column)));
        }
        seen |= bit;
    }
    Ok(())
}

/// A leaf's guid, path_len and path.
fn put_leaf(out: &mut Vec<u8>, leaf: &LeafConfig) -> Result<(), FormatError> {
    let len = u16::try_from(leaf.path.len()).map_err(|_| FormatError::TooLarge {
        what: CONFIG_WHAT,
        len: leaf.path.len(),
        max: CONFIG_BYTES_MAX,
    })?;
    out.extend_from_slice(&leaf.guid.to_le_bytes());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(leaf.path.as_bytes());
    Ok(())
}

struct Cursor<'a> {
    what: &'static str,
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, len: usize) -> Result<&'a [u8], FormatError> {
        let end = self.at.checked_add(len).filter(|&e| e <= self.bytes.len()).ok_or(
            FormatError::Truncated {
                what: self.what,
                need: self.at.saturating_add(len),
                have: self.bytes.len(),
            },
        )?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, FormatError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, FormatError> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u64(&mut self) -> Result<u64, FormatError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }

    /// A leaf's guid, path_len and path.
    fn leaf(&mut self) -> Result<LeafConfig, FormatError> {
        let guid = self.u64()?;
        let len = usize::from(self.u16()?);
        let path = std::str::from_utf8(self.take(len)?)
            .map_err(|_| FormatError::Invalid {
                what: self.what,
                field: "path",
                value: len as u64,
            })?
            .to_owned();
        Ok(LeafConfig { guid, path })
    }
}

/// A decoded label header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabelHeader {
    pub ashift: u8,
    pub pool_guid: u64,
    pub leaf_guid: u64,
    pub top_guid: u64,
    pub config_txg: u64,
    pub leaf_bytes: u64,
    pub pool_name: String,
    pub config: VdevTreeConfig,
}

impl LabelHeader {
    pub fn encode(&self) -> Result<[u8; LABEL_HEADER_BYTES], FormatError> {
        let name = self.pool_name.as_bytes();
        if name.len() > POOL_NAME_BYTES_MAX {
            return Err(FormatError::TooLarge {
                what: "pool name",
                len: name.len(),
                max: POOL_NAME_BYTES_MAX,
            });
        }
        if !(9..=16).contains(&self.ashift) {
            return Err(FormatError::Invalid {
                what: WHAT,
                field: "ashift",
                value: u64::from(self.ashift),
            });
        }
        let config = self.config.encode()?;
        let mut out = [0u8; LABEL_HEADER_BYTES];
        let mut w = Writer::new(&mut out);
        w.u64(0, MAGIC);
        // The config's layout decides: a tree without RAID-Z keeps V1 labels, which older
        // builds read.
        w.u16(OFF_VERSION, self.config.version() as u16);
        w.u8(OFF_ALG, ChecksumAlg::Xxh3_128 as u8);
        w.u8(OFF_ASHIFT, self.ashift);
        w.u64(OFF_POOL_GUID, self.pool_guid);
        w.u64(OFF_LEAF_GUID, self.leaf_guid);
        w.u64(OFF_TOP_GUID, self.top_guid);
        w.u64(OFF_CONFIG_TXG, self.config_txg);
        w.u64(OFF_LEAF_BYTES, self.leaf_bytes);
        // Lengths were bounded above (name <= 64, config <= CONFIG_BYTES_MAX).
        w.u16(OFF_NAME_LEN, name.len() as u16);
        w.put(OFF_NAME, name);
        w.u32(OFF_CONFIG_LEN, config.len() as u32);
        w.put(OFF_CONFIG, &config);
        let sum = ChecksumAlg::Xxh3_128.compute(&out[..OFF_CHECKSUM]);
        out[OFF_CHECKSUM..].copy_from_slice(&sum.0);
        Ok(out)
    }

    pub fn decode(bytes: &[u8]) -> Result<LabelHeader, FormatError> {
        let r = Reader::new(WHAT, bytes, LABEL_HEADER_BYTES)?;
        let version =
            check_header(&r, WHAT, MAGIC, OFF_VERSION, OFF_ALG, OFF_CHECKSUM, LABEL_VERSION)?;
        if !LABEL_VERSIONS.contains(&version) {
            return Err(FormatError::UnsupportedVersion { what: WHAT, found: version as u16 });
        }
        r.zeros(OFF_RESERVED_A, OFF_POOL_GUID - OFF_RESERVED_A)?;
        r.zeros(OFF_RESERVED_B, OFF_CONFIG_LEN - OFF_RESERVED_B)?;
        let ashift = r.u8(OFF_ASHIFT)?;
        if !(9..=16).contains(&ashift) {
            return Err(FormatError::Invalid {
                what: WHAT,
                field: "ashift",
                value: u64::from(ashift),
            });
        }
        let name_len = usize::from(r.u16(OFF_NAME_LEN)?);
        if name_len > POOL_NAME_BYTES_MAX {
            return Err(FormatError::Invalid {
                what: WHAT,
                field: "pool_name_len",
                value: name_len as u64,
            });
        }
        r.zeros(OFF_NAME + name_len, POOL_NAME_BYTES_MAX - name_len)?;
        let pool_name = std::str::from_utf8(r.slice(OFF_NAME, name_len)?)
            .map_err(|_| FormatError::Invalid {
                what: WHAT,
                field: "pool_name",
                value: name_len as u64,
            })?
            .to_owned();
        let config_len = r.u32(OFF_CONFIG_LEN)? as usize;
        if config_len > CONFIG_BYTES_MAX {
            return Err(FormatError::Invalid {
                what: WHAT,
                field: "config_len",
                value: config_len as u64,
            });
        }
        r.zeros(OFF_CONFIG + config_len, CONFIG_BYTES_MAX - config_len)?;
        let config = VdevTreeConfig::decode(r.slice(OFF_CONFIG, config_len)?, version)?;
        Ok(LabelHeader {
            ashift,
            pool_guid: r.u64(OFF_POOL_GUID)?,
            leaf_guid: r.u64(OFF_LEAF_GUID)?,
            top_guid: r.u64(OFF_TOP_GUID)?,
            config_txg: r.u64(OFF_CONFIG_TXG)?,
            leaf_bytes: r.u64(OFF_LEAF_BYTES)?,
            pool_name,
            config,
        })
    }
}
