//! The V2 tail of the pool directory: the trusted vdev tree, one record per leaf and the scan
//! record. They sit in the directory, not in the labels, because the directory is written
//! with every txg, copied to every leaf, and read through checksummed block pointers: a leaf
//! attached or detached, a leaf's state and error counts, and how far a scrub or resilver
//! got are all true as of the txg the pool opens, whichever leaves survived a crash
//! (ZFS keeps the same in the MOS: the config, `vdev_stat`, `dsl_scan_phys_t`).
//!
//! ```text
//! offset size field (from the end of the dedup table header)
//!      0    4 config_len u32
//!      4    . config                   VdevTreeConfig, as labels carry it: in its V1 layout
//!                                      up to directory V5, its V6 layout in a V6 directory
//!      .    4 leaf_count u32
//!      .   48 per leaf: guid u64, state u8 (0 online, 1 degraded, 2 faulted, 3 offline),
//!             reserved 7 (zero), replaced_by u64 (the guid of the leaf replacing it; 0:
//!             none), read_errors u64, write_errors u64, checksum_errors u64
//!      .  128 scan record:
//!               0 func u8 (0 none, 1 scrub, 2 resilver)   1 phase u8 (0 scanning,
//!               1 finished, 2 canceled)   2 paused u8   3 bookmark u8 (0 start, 1 dedup
//!               table, 2 volume, 3 done)   4 reserved u32
//!               8 min_birth  16 max_birth  24 bookmark_a (bucket block, or volume id)
//!              32 bookmark_b (volume block)  40 start_secs  48 end_secs (0: running)
//!              56 run_secs (scanning time so far)  64 examined_bytes  72 total_bytes
//!              80 issued_blocks  88 issued_bytes  96 repaired_copies  104 repaired_bytes
//!             112 errors  120 unrecoverable   (all u64)
//!      .    4 target_count u32, then the guid (u64) of each leaf a resilver copies onto
//! ```

use crate::codec::{Reader, Writer};
use crate::{FormatError, FormatVersion, VdevTreeConfig};

const WHAT: &str = "pool directory";
pub(super) const LEAF_RECORD_BYTES: usize = 48;
pub(super) const SCAN_RECORD_BYTES: usize = 128;

/// A leaf's state as the directory keeps it. Only what should outlive the process is kept:
/// a leaf faulted because its device is gone is looked for again at import, so it is
/// recorded `Online`; a temporary offline is recorded `Online` too.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LeafRecordState {
    #[default]
    Online = 0,
    /// Too many checksum errors: read only when no other copy verifies.
    Degraded = 1,
    /// Too many I/O errors: no I/O until `pool clear`, `online` or a replace.
    Faulted = 2,
    /// Taken offline by `pool offline` (without `-t`).
    Offline = 3,
}

/// One leaf's record in the directory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeafRecord {
    pub guid: u64,
    pub state: LeafRecordState,
    /// Being replaced (`pool replace`) by the leaf with this guid (0: not being replaced):
    /// detached once that leaf holds everything.
    pub replaced_by: u64,
    pub read_errors: u64,
    pub write_errors: u64,
    pub checksum_errors: u64,
}

/// What a scan does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScanKind {
    Scrub = 1,
    Resilver = 2,
}

/// Where a scan is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScanRecordPhase {
    Scanning = 0,
    Finished = 1,
    Canceled = 2,
}

/// How far a scan's walk got: everything before it is done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScanBookmark {
    Start,
    DedupTable { block: u64 },
    Volume { id: u64, block: u64 },
    Done,
}

/// The last or current scrub or resilver (ZFS: `dsl_scan_phys_t`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScanRecord {
    pub kind: ScanKind,
    pub phase: ScanRecordPhase,
    pub paused: bool,
    pub bookmark: ScanBookmark,
    pub min_birth: u64,
    pub max_birth: u64,
    /// Wall-clock seconds when the scan began and ended (0 while it runs).
    pub start_secs: u64,
    pub end_secs: u64,
    /// Seconds spent scanning so far, across imports.
    pub run_secs: u64,
    pub examined_bytes: u64,
    pub total_bytes: u64,
    pub issued_blocks: u64,
    pub issued_bytes: u64,
    pub repaired_copies: u64,
    pub repaired_bytes: u64,
    pub errors: u64,
    pub unrecoverable: u64,
    /// The leaves a resilver copies onto, by guid (a resumed resilver copies onto these only:
    /// another leaf missed the copies before the bookmark).
    pub targets: Vec<u64>,
}

/// The V2 records of a directory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DirectoryRecords {
    /// The vdev tree as of this txg: which leaves are members is decided here, not by the
    /// labels (a crash between a config change's sync and its label rewrite leaves labels
    /// behind or ahead).
    pub config: VdevTreeConfig,
    pub leaves: Vec<LeafRecord>,
    pub scan: Option<ScanRecord>,
}

impl DirectoryRecords {
    pub(super) fn encoded_len(&self) -> Result<usize, FormatError> {
        let targets = self.scan.as_ref().map_or(0, |s| s.targets.len());
        Ok(4 + self.config.encode()?.len()
            + 4
            + self.leaves.len() * LEAF_RECORD_BYTES
            + SCAN_RECORD_BYTES
            + 4
            + targets * 8)
    }

    pub(super) fn encode_into(
        &self,
        w: &mut Writer<'_>,
        mut at: usize,
    ) -> Result<usize, FormatError> {
        let config = self.config.encode()?;
        w.u32(at, config.len() as u32);
        w.put(at + 4, &config);
        at += 4 + config.len();
        let count = u32::try_from(self.leaves.len()).map_err(|_| FormatError::TooLarge {
            what: "leaf records",
            len: self.leaves.len(),
            max: u32::MAX as usize,
        })?;
        w.u32(at, count);
        at += 4;
        for leaf in &self.leaves {
            w.u64(at, leaf.guid);
            w.u8(at + 8, leaf.state as u8);
            w.u64(at + 16, leaf.replaced_by);
            w.u64(at + 24, leaf.read_errors);
            w.u64(at + 32, leaf.write_errors);
            w.u64(at + 40, leaf.checksum_errors);
            at += LEAF_RECORD_BYTES;
        }
        if let Some(scan) = &self.scan {
            let (mark, a, b) = match scan.bookmark {
                ScanBookmark::Start => (0, 0, 0),
                ScanBookmark::DedupTable { block } => (1, block, 0),
                ScanBookmark::Volume { id, block } => (2, id, block),
                ScanBookmark::Done => (3, 0, 0),
            };
            w.u8(at, scan.kind as u8);
            w.u8(at + 1, scan.phase as u8);
            w.u8(at + 2, u8::from(scan.paused));
            w.u8(at + 3, mark);
            let fields = [
                scan.min_birth,
                scan.max_birth,
                a,
                b,
                scan.start_secs,
                scan.end_secs,
                scan.run_secs,
                scan.examined_bytes,
                scan.total_bytes,
                scan.issued_blocks,
                scan.issued_bytes,
                scan.repaired_copies,
                scan.repaired_bytes,
                scan.errors,
                scan.unrecoverable,
            ];
            for (i, value) in fields.into_iter().enumerate() {
                w.u64(at + 8 + 8 * i, value);
            }
        }
        at += SCAN_RECORD_BYTES;
        let targets = self.scan.as_ref().map_or(&[][..], |s| &s.targets[..]);
        w.u32(at, targets.len() as u32);
        at += 4;
        for &guid in targets {
            w.u64(at, guid);
            at += 8;
        }
        Ok(at)
    }

    /// Decodes the records of a directory of `version` (which says the config's layout).
    pub(super) fn decode_from(
        r: &Reader<'_>,
        mut at: usize,
        version: FormatVersion,
    ) -> Result<(Self, usize), FormatError> {
        let invalid = |field, value| FormatError::Invalid { what: WHAT, field, value };
        let config_len = r.u32(at)? as usize;
        let config = VdevTreeConfig::decode(r.slice(at + 4, config_len)?, version)?;
        at += 4 + config_len;
        let count = r.u32(at)? as usize;
        at += 4;
        // Bounded by the bytes present before anything is allocated.
        r.slice(at, count.saturating_mul(LEAF_RECORD_BYTES))?;
        let mut leaves = Vec::with_capacity(count);
        for _ in 0..count {
            let state = match r.u8(at + 8)? {
                0 => LeafRecordState::Online,
                1 => LeafRecordState::Degraded,
                2 => LeafRecordState::Faulted,
                3 => LeafRecordState::Offline,
                value => return Err(invalid("leaf state", u64::from(value))),
            };
            r.zeros(at + 9, 7)?;
            leaves.push(LeafRecord {
                guid: r.u64(at)?,
                state,
                replaced_by: r.u64(at + 16)?,
                read_errors: r.u64(at + 24)?,
                write_errors: r.u64(at + 32)?,
                checksum_errors: r.u64(at + 40)?,
            });
            at += LEAF_RECORD_BYTES;
        }
        let scan = match r.u8(at)? {
            0 => {
                r.zeros(at, SCAN_RECORD_BYTES)?;
                None
            }
            kind => {
                let kind = match kind {
                    1 => ScanKind::Scrub,
                    2 => ScanKind::Resilver,
                    value => return Err(invalid("scan func", u64::from(value))),
                };
                let phase = match r.u8(at + 1)? {
                    0 => ScanRecordPhase::Scanning,
                    1 => ScanRecordPhase::Finished,
                    2 => ScanRecordPhase::Canceled,
                    value => return Err(invalid("scan phase", u64::from(value))),
                };
                let paused = match r.u8(at + 2)? {
                    0 => false,
                    1 => true,
                    value => return Err(invalid("scan paused", u64::from(value))),
                };
                r.zeros(at + 4, 4)?;
                let field = |i: usize| r.u64(at + 8 + 8 * i);
                let bookmark = match (r.u8(at + 3)?, field(2)?, field(3)?) {
                    (0, 0, 0) => ScanBookmark::Start,
                    (1, block, 0) => ScanBookmark::DedupTable { block },
                    (2, id, block) => ScanBookmark::Volume { id, block },
                    (3, 0, 0) => ScanBookmark::Done,
                    (value, _, _) => return Err(invalid("scan bookmark", u64::from(value))),
                };
                Some(ScanRecord {
                    kind,
                    phase,
                    paused,
                    bookmark,
                    min_birth: field(0)?,
                    max_birth: field(1)?,
                    start_secs: field(4)?,
                    end_secs: field(5)?,
                    run_secs: field(6)?,
                    examined_bytes: field(7)?,
                    total_bytes: field(8)?,
                    issued_blocks: field(9)?,
                    issued_bytes: field(10)?,
                    repaired_copies: field(11)?,
                    repaired_bytes: field(12)?,
                    errors: field(13)?,
                    unrecoverable: field(14)?,
                    targets: Vec::new(),
                })
            }
        };
        at += SCAN_RECORD_BYTES;
        let count = r.u32(at)? as usize;
        at += 4;
        r.slice(at, count.saturating_mul(8))?;
        let mut targets = Vec::with_capacity(count);
        for _ in 0..count {
            targets.push(r.u64(at)?);
            at += 8;
        }
        let scan = match scan {
            Some(mut scan) => {
                scan.targets = targets;
                Some(scan)
            }
            None if targets.is_empty() => None,
            None => return Err(invalid("scan targets", count as u64)),
        };
        Ok((DirectoryRecords { config, leaves, scan }, at))
    }
}
