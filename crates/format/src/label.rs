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
//!      8    2 version u16
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
//! config: top_count u16, then per top-level vdev:
//!   kind u8 (0 leaf, 1 mirror; bit 7 set: a separate log device), guid u64, child_count u16,
//!   per child: guid u64, path_len u16, path (UTF-8, a hint for finding the leaf again)
//! ```

use crate::codec::{check_header, Reader, Writer};
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
const CONFIG_BYTES_MAX: usize = OFF_CHECKSUM - OFF_CONFIG;

const _: () = assert!(OFF_RESERVED_B + 2 == OFF_CONFIG_LEN);
const _: () = assert!(RING_OFFSET >= LABEL_HEADER_BYTES as u64);
const _: () = assert!(DATA_START_BYTES >= 2 * LABEL_BYTES);

const WHAT: &str = "label";
/// The version labels are written at, and the newest this build reads.
pub const LABEL_VERSION: FormatVersion = FormatVersion::V1;
const VERSION: FormatVersion = LABEL_VERSION;

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

/// What a RAID-Z top-level vdev records beyond its children.
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
    /// changes, so a replacing pair sits in its column's slot.
    pub replacing: Vec<(u16, LeafConfig)>,
}

/// The pool's vdev tree as recorded in every label.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VdevTreeConfig {
    pub top: Vec<TopConfig>,
}

impl VdevTreeConfig {
    /// The config's bytes as labels and the pool directory carry them.
    pub fn encode(&self) -> Result<Vec<u8>, FormatError> {
        let too_large =
            |len| FormatError::TooLarge { what: "vdev tree config", len, max: CONFIG_BYTES_MAX };
        let mut out = Vec::new();
        let count = u16::try_from(self.top.len()).map_err(|_| too_large(self.top.len()))?;
        out.extend_from_slice(&count.to_le_bytes());
        for top in &self.top {
            out.push(top.kind as u8 | if top.log { LOG_VDEV_BIT } else { 0 });
            out.extend_from_slice(&top.guid.to_le_bytes());
            let children =
                u16::try_from(top.children.len()).map_err(|_| too_large(top.children.len()))?;
            out.extend_from_slice(&children.to_le_bytes());
            for leaf in &top.children {
                out.extend_from_slice(&leaf.guid.to_le_bytes());
                let len = u16::try_from(leaf.path.len()).map_err(|_| too_large(leaf.path.len()))?;
                out.extend_from_slice(&len.to_le_bytes());
                out.extend_from_slice(leaf.path.as_bytes());
            }
        }
        if out.len() > CONFIG_BYTES_MAX {
            return Err(too_large(out.len()));
        }
        Ok(out)
    }

    pub fn decode(bytes: &[u8]) -> Result<VdevTreeConfig, FormatError> {
        let what = "vdev tree config";
        let mut cursor = Cursor { what, bytes, at: 0 };
        let count = cursor.u16()?;
        let mut top = Vec::new();
        for _ in 0..count {
            let byte = cursor.u8()?;
            let log = byte & LOG_VDEV_BIT != 0;
            let kind = match byte & !LOG_VDEV_BIT {
                0 => TopKind::Leaf,
                1 => TopKind::Mirror,
                value => {
                    return Err(FormatError::Invalid {
                        what,
                        field: "kind",
                        value: u64::from(value),
                    })
                }
            };
            let guid = cursor.u64()?;
            let child_count = cursor.u16()?;
            let mut children = Vec::new();
            for _ in 0..child_count {
                let guid = cursor.u64()?;
                let len = usize::from(cursor.u16()?);
                let path = std::str::from_utf8(cursor.take(len)?)
                    .map_err(|_| FormatError::Invalid { what, field: "path", value: len as u64 })?
                    .to_owned();
                children.push(LeafConfig { guid, path });
            }
            if children.is_empty() || (kind == TopKind::Leaf && children.len() != 1) {
                return Err(FormatError::Invalid {
                    what,
                    field: "child_count",
                    value: u64::from(child_count),
                });
            }
            top.push(TopConfig { kind, log, guid, children, raidz: None });
        }
        if cursor.at != bytes.len() {
            return Err(FormatError::Invalid {
                what,
                field: "trailing bytes",
                value: (bytes.len() - cursor.at) as u64,
            });
        }
        Ok(VdevTreeConfig { top })
    }
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
        w.u16(OFF_VERSION, VERSION as u16);
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
        check_header(&r, WHAT, MAGIC, OFF_VERSION, OFF_ALG, OFF_CHECKSUM, VERSION)?;
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
        let config = VdevTreeConfig::decode(r.slice(OFF_CONFIG, config_len)?)?;
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
