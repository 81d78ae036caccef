//! Dead lists (ZFS: `dsl_deadlist.c`, `bpobj.c`): the blocks a dataset no longer references
//! but its previous snapshot still does.
//!
//! When a volume with a snapshot replaces a block born at or before that snapshot's txg, the
//! block cannot be freed: the snapshot still reads it. It goes on the volume's dead list
//! instead. Taking a snapshot hands the volume's list to the new snapshot and starts an empty
//! one; destroying a snapshot frees the entries of the next dataset's list that were born
//! after the snapshot before it, and merges the rest with its own list. Neither walks a tree:
//! the work follows the blocks that changed, not the volume's size.
//!
//! A list is held in the pool directory as its entry count, its bytes split by birth range
//! (ZFS keys its sub-lists the same way, by the txg after each earlier snapshot), and the
//! pointers of its pieces. Each piece is a metadata block holding up to
//! [`DEADLIST_PIECE_ENTRIES`] block pointers:
//!
//! ```text
//! offset size field
//!      0    8 magic u64                "SLUICEDL" as little-endian bytes
//!      8    2 version u16
//!     10    2 reserved (zero)
//!     12    4 count u32                block pointers that follow
//!     16 128n block pointers           each a block the list holds (never a hole)
//! ```
//!
//! The piece's parent pointer (in the directory) carries its checksum, as for the directory
//! itself.

use crate::codec::{Reader, Writer};
use crate::{BlockPointer, FormatError, FormatVersion, BLKPTR_BYTES};

const MAGIC: u64 = u64::from_le_bytes(*b"SLUICEDL");
const HEADER_BYTES: usize = 16;
const WHAT: &str = "dead list piece";
/// The version pieces are written at, and the newest read.
const VERSION: FormatVersion = FormatVersion::V1;
/// Bytes of the largest piece (and the block each full piece takes).
pub const DEADLIST_PIECE_BYTES: usize = 128 << 10;
/// Block pointers one piece holds.
pub const DEADLIST_PIECE_ENTRIES: usize = (DEADLIST_PIECE_BYTES - HEADER_BYTES) / BLKPTR_BYTES;

/// A dead list as the directory records it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Deadlist {
    /// Block pointers in all pieces.
    pub entries: u64,
    /// Allocated bytes of the entries (every copy), by birth range: `(min_birth, bytes)`,
    /// ascending by `min_birth`; each range runs to the next one's start. The starts are 0
    /// and the txg after each snapshot older than the list's owner, so the bytes born
    /// between two snapshots are read off without reading the pieces.
    pub buckets: Vec<(u64, u64)>,
    pub pieces: Vec<BlockPointer>,
}

impl Deadlist {
    /// Allocated bytes of every entry.
    pub fn bytes(&self) -> u64 {
        self.buckets.iter().map(|&(_, bytes)| bytes).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    /// Bytes this list takes in the directory.
    pub(crate) fn encoded_len(&self) -> usize {
        8 + 4 + 4 + self.buckets.len() * 16 + self.pieces.len() * BLKPTR_BYTES
    }

    pub(crate) fn encode_into(&self, w: &mut Writer<'_>, mut at: usize) -> usize {
        w.u64(at, self.entries);
        w.u32(at + 8, self.buckets.len() as u32);
        w.u32(at + 12, self.pieces.len() as u32);
        at += 16;
        for &(min_birth, bytes) in &self.buckets {
            w.u64(at, min_birth);
            w.u64(at + 8, bytes);
            at += 16;
        }
        for piece in &self.pieces {
            w.put(at, &BlockPointer::encode(Some(piece)));
            at += BLKPTR_BYTES;
        }
        at
    }

    pub(crate) fn decode_from(
        r: &Reader<'_>,
        what: &'static str,
        mut at: usize,
    ) -> Result<(Deadlist, usize), FormatError> {
        let entries = r.u64(at)?;
        let bucket_count = r.u32(at + 8)? as usize;
        let piece_count = r.u32(at + 12)? as usize;
        at += 16;
        let left = r.len().saturating_sub(at);
        if bucket_count > left / 16 || piece_count > left / BLKPTR_BYTES {
            return Err(FormatError::Invalid {
                what,
                field: "dead list counts",
                value: (bucket_count.max(piece_count)) as u64,
            });
        }
        let mut buckets = Vec::with_capacity(bucket_count);
        for _ in 0..bucket_count {
            let bucket = (r.u64(at)?, r.u64(at + 8)?);
            if buckets.last().is_some_and(|&(start, _)| start >= bucket.0) {
                return Err(FormatError::Invalid {
                    what,
                    field: "dead list birth ranges (not ascending)",
                    value: bucket.0,
                });
            }
            buckets.push(bucket);
            at += 16;
        }
        let mut pieces = Vec::with_capacity(piece_count);
        for _ in 0..piece_count {
            let piece =
                BlockPointer::decode(r.slice(at, BLKPTR_BYTES)?)?.ok_or(FormatError::Invalid {
                    what,
                    field: "dead list piece (a hole)",
                    value: 0,
                })?;
            pieces.push(piece);
            at += BLKPTR_BYTES;
        }
        if entries > pieces.len() as u64 * DEADLIST_PIECE_ENTRIES as u64 {
            return Err(FormatError::Invalid { what, field: "dead list entries", value: entries });
        }
        Ok((Deadlist { entries, buckets, pieces }, at))
    }
}

/// One piece of a dead list: the block pointers it holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeadlistPiece {
    pub entries: Vec<BlockPointer>,
}

impl DeadlistPiece {
    pub fn encoded_len(&self) -> usize {
        HEADER_BYTES + self.entries.len() * BLKPTR_BYTES
    }

    /// Encodes into a buffer padded with zeros to a multiple of `align` bytes.
    pub fn encode(&self, align: usize) -> Result<Vec<u8>, FormatError> {
        if self.entries.len() > DEADLIST_PIECE_ENTRIES {
            return Err(FormatError::TooLarge {
                what: WHAT,
                len: self.entries.len(),
                max: DEADLIST_PIECE_ENTRIES,
            });
        }
        let align = align.max(1);
        let mut out = vec![0u8; self.encoded_len().div_ceil(align) * align];
        let mut w = Writer::new(&mut out);
        w.u64(0, MAGIC);
        w.u16(8, VERSION as u16);
        w.u32(12, self.entries.len() as u32);
        let mut at = HEADER_BYTES;
        for bp in &self.entries {
            w.put(at, &BlockPointer::encode(Some(bp)));
            at += BLKPTR_BYTES;
        }
        Ok(out)
    }

    pub fn decode(bytes: &[u8]) -> Result<DeadlistPiece, FormatError> {
        let r = Reader::new(WHAT, bytes, HEADER_BYTES)?;
        crate::codec::check_magic_version(&r, WHAT, MAGIC, 8, VERSION)?;
        r.zeros(10, 2)?;
        let count = r.u32(12)? as usize;
        if count > DEADLIST_PIECE_ENTRIES {
            return Err(FormatError::Invalid { what: WHAT, field: "count", value: count as u64 });
        }
        let end = HEADER_BYTES + count * BLKPTR_BYTES;
        let r = Reader::new(WHAT, bytes, end)?;
        r.zeros(end, bytes.len() - end)?;
        let mut entries = Vec::with_capacity(count);
        for i in 0..count {
            let at = HEADER_BYTES + i * BLKPTR_BYTES;
            let bp =
                BlockPointer::decode(r.slice(at, BLKPTR_BYTES)?)?.ok_or(FormatError::Invalid {
                    what: WHAT,
                    field: "entry (a hole)",
                    value: i as u64,
                })?;
            entries.push(bp);
        }
        Ok(DeadlistPiece { entries })
    }
}
