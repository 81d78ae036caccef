//! The dedup table on disk (ZFS: `ddt_key_t`, `ddt_univ_phys_t` and the DDT ZAP objects).
//!
//! An entry maps a block's dedup key (keyed BLAKE3 of its contents, 32 bytes) to the one copy
//! of the block on disk and the number of block pointers that share it. Entries live in
//! buckets: bucket `i` of a table with `bucket_bits` bits holds exactly the keys whose top
//! `bucket_bits` bits are `i`, sorted by key, so a lookup reads one bucket. The buckets hang
//! under a block tree like a volume's data blocks (bucket `i` is data block `i`), and the
//! directory's [`DdtHeader`] names its root. A bucket sits in a block whose parent pointer
//! carries its checksum, so it has a magic and a version but no checksum of its own.
//!
//! ```text
//! bucket block
//! offset size field
//!      0    8 magic u64                "SLUICEDT" as little-endian bytes
//!      8    2 version u16
//!     10    2 reserved (zero)
//!     12    4 count u32                entries that follow
//!     16    8 index u64                this bucket's number
//!     24    1 bucket_bits u8           of the table it was written for
//!     25    7 reserved (zero)
//!     32      entries, ascending by key, each 168 bytes:
//!               key (32), refcount u64 (never 0), block pointer (128, dedup key = key)
//! ```

use crate::codec::{Reader, Writer};
use crate::{BlockPointer, FormatError, FormatVersion, BLKPTR_BYTES};

/// Bytes of a dedup key.
pub const DDT_KEY_BYTES: usize = 32;
/// Bytes of one encoded entry.
pub const DDT_ENTRY_BYTES: usize = DDT_KEY_BYTES + 8 + BLKPTR_BYTES;
/// Most bucket bits a table may have (2^32 buckets).
pub const DDT_BUCKET_BITS_MAX: u8 = 32;

const MAGIC: u64 = u64::from_le_bytes(*b"SLUICEDT");
const HEADER_BYTES: usize = 32;
const WHAT: &str = "dedup bucket";
/// The version this structure is written at, and the newest it reads.
const VERSION: FormatVersion = FormatVersion::V1;

/// A dedup key: keyed BLAKE3 of a block's logical contents.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DdtKey(pub [u8; DDT_KEY_BYTES]);

impl DdtKey {
    /// The bucket this key belongs to in a table of `bits` bucket bits: its top bits.
    pub fn bucket(&self, bits: u8) -> u64 {
        assert!(bits <= DDT_BUCKET_BITS_MAX, "bucket bits {bits} beyond the maximum");
        if bits == 0 {
            return 0;
        }
        let mut top = [0u8; 8];
        top.copy_from_slice(&self.0[..8]);
        u64::from_be_bytes(top) >> (64 - u32::from(bits))
    }
}

/// One shared block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DdtEntry {
    pub key: DdtKey,
    /// Block pointers that name this block; an entry at 0 is removed and its block freed.
    pub refcount: u64,
    pub bp: BlockPointer,
}

/// One bucket of entries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DdtBucket {
    pub index: u64,
    pub bucket_bits: u8,
    /// Ascending by key.
    pub entries: Vec<DdtEntry>,
}

impl DdtBucket {
    pub fn encoded_len(&self) -> usize {
        HEADER_BYTES + self.entries.len() * DDT_ENTRY_BYTES
    }

    /// Encodes into a buffer padded with zeros to a multiple of `align` bytes.
    pub fn encode(&self, align: usize) -> Result<Vec<u8>, FormatError> {
        self.check()?;
        let len = self.encoded_len();
        let mut out = vec![0u8; len.div_ceil(align.max(1)) * align.max(1)];
        let mut w = Writer::new(&mut out);
        w.u64(0, MAGIC);
        w.u16(8, VERSION as u16);
        w.u32(12, self.entries.len() as u32);
        w.u64(16, self.index);
        w.u8(24, self.bucket_bits);
        let mut at = HEADER_BYTES;
        for entry in &self.entries {
            w.put(at, &entry.key.0);
            w.u64(at + DDT_KEY_BYTES, entry.refcount);
            w.put(at + DDT_KEY_BYTES + 8, &BlockPointer::encode(Some(&entry.bp)));
            at += DDT_ENTRY_BYTES;
        }
        Ok(out)
    }

    pub fn decode(bytes: &[u8]) -> Result<DdtBucket, FormatError> {
        let r = Reader::new(WHAT, bytes, HEADER_BYTES)?;
        crate::codec::check_magic_version(&r, WHAT, MAGIC, 8, VERSION)?;
        r.zeros(10, 2)?;
        r.zeros(25, 7)?;
        let count = r.u32(12)? as usize;
        if count > (bytes.len() - HEADER_BYTES) / DDT_ENTRY_BYTES {
            return Err(FormatError::Invalid { what: WHAT, field: "count", value: count as u64 });
        }
        let end = HEADER_BYTES + count * DDT_ENTRY_BYTES;
        r.zeros(end, bytes.len() - end)?;
        let mut entries = Vec::with_capacity(count);
        for i in 0..count {
            let at = HEADER_BYTES + i * DDT_ENTRY_BYTES;
            let mut key = [0u8; DDT_KEY_BYTES];
            key.copy_from_slice(r.slice(at, DDT_KEY_BYTES)?);
            let bp = BlockPointer::decode(r.slice(at + DDT_KEY_BYTES + 8, BLKPTR_BYTES)?)?.ok_or(
                FormatError::Invalid { what: WHAT, field: "entry block pointer", value: 0 },
            )?;
            entries.push(DdtEntry { key: DdtKey(key), refcount: r.u64(at + DDT_KEY_BYTES)?, bp });
        }
        let bucket = DdtBucket { index: r.u64(16)?, bucket_bits: r.u8(24)?, entries };
        bucket.check()?;
        Ok(bucket)
    }

    /// Finds `key` in an encoded bucket by binary search over the fixed-size entries, decoding
    /// only the header and the entry found: a lookup costs O(log n), not a whole decode. The
    /// block has passed its checksum, so its order is the one [`DdtBucket::encode`] checked;
    /// the entry found is still checked on its own.
    pub fn find(bytes: &[u8], key: &DdtKey) -> Result<Option<DdtEntry>, FormatError> {
        let r = Reader::new(WHAT, bytes, HEADER_BYTES)?;
        crate::codec::check_magic_version(&r, WHAT, MAGIC, 8, VERSION)?;
        let count = r.u32(12)? as usize;
        if count > (bytes.len() - HEADER_BYTES) / DDT_ENTRY_BYTES {
            return Err(FormatError::Invalid { what: WHAT, field: "count", value: count as u64 });
        }
        let (mut low, mut high) = (0usize, count);
        while low < high {
            let mid = low + (high - low) / 2;
            let at = HEADER_BYTES + mid * DDT_ENTRY_BYTES;
            match r.slice(at, DDT_KEY_BYTES)?.cmp(&key.0[..]) {
                std::cmp::Ordering::Less => low = mid + 1,
                std::cmp::Ordering::Greater => high = mid,
                std::cmp::Ordering::Equal => {
                    let bp = BlockPointer::decode(r.slice(at + DDT_KEY_BYTES + 8, BLKPTR_BYTES)?)?
                        .filter(|bp| bp.dedup == Some(*key))
                        .ok_or(FormatError::Invalid {
                            what: WHAT,
                            field: "entry block pointer",
                            value: mid as u64,
                        })?;
                    let refcount = r.u64(at + DDT_KEY_BYTES)?;
                    if refcount == 0 {
                        return Err(FormatError::Invalid {
                            what: WHAT,
                            field: "refcount",
                            value: 0,
                        });
                    }
                    return Ok(Some(DdtEntry { key: *key, refcount, bp }));
                }
            }
        }
        Ok(None)
    }

    /// The rules both directions keep: keys ascending and in this bucket, no entry at zero
    /// references, each pointer naming its own key.
    fn check(&self) -> Result<(), FormatError> {
        let invalid = |field, value| Err(FormatError::Invalid { what: WHAT, field, value });
        if self.bucket_bits > DDT_BUCKET_BITS_MAX {
            return invalid("bucket_bits", u64::from(self.bucket_bits));
        }
        if self.bucket_bits < 64 && self.index >> self.bucket_bits != 0 {
            return invalid("index", self.index);
        }
        for (i, entry) in self.entries.iter().enumerate() {
            if i > 0 && self.entries[i - 1].key >= entry.key {
                return invalid("key order", i as u64);
            }
            if entry.key.bucket(self.bucket_bits) != self.index {
                return invalid("key bucket", entry.key.bucket(self.bucket_bits));
            }
            if entry.refcount == 0 {
                return invalid("refcount", 0);
            }
            if entry.bp.dedup != Some(entry.key) {
                return invalid("entry block pointer key", i as u64);
            }
        }
        Ok(())
    }
}

/// The table's root, as the directory records it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DdtHeader {
    /// Key of the keyed hash, drawn at pool creation: nobody outside the pool can construct
    /// two blocks with the same key.
    pub salt: [u8; 32],
    pub bucket_bits: u8,
    /// Levels of indirect blocks above the buckets.
    pub levels: u8,
    /// Entries in the table, and the block pointers they count (sum of refcounts).
    pub entries: u64,
    pub references: u64,
    /// Bytes allocated by the entries' blocks.
    pub allocated_bytes: u64,
    pub root: Option<BlockPointer>,
}

/// Bytes of [`DdtHeader`] in the directory.
pub const DDT_HEADER_BYTES: usize = 32 + 1 + 1 + 6 + 8 + 8 + 8 + BLKPTR_BYTES;

impl DdtHeader {
    pub(crate) fn encode_into(&self, w: &mut Writer<'_>, at: usize) {
        w.put(at, &self.salt);
        w.u8(at + 32, self.bucket_bits);
        w.u8(at + 33, self.levels);
        w.u64(at + 40, self.entries);
        w.u64(at + 48, self.references);
        w.u64(at + 56, self.allocated_bytes);
        w.put(at + 64, &BlockPointer::encode(self.root.as_ref()));
    }

    pub(crate) fn decode_from(r: &Reader<'_>, at: usize) -> Result<DdtHeader, FormatError> {
        const WHAT: &str = "pool directory";
        r.zeros(at + 34, 6)?;
        let mut salt = [0u8; 32];
        salt.copy_from_slice(r.slice(at, 32)?);
        let header = DdtHeader {
            salt,
            bucket_bits: r.u8(at + 32)?,
            levels: r.u8(at + 33)?,
            entries: r.u64(at + 40)?,
            references: r.u64(at + 48)?,
            allocated_bytes: r.u64(at + 56)?,
            root: BlockPointer::decode(r.slice(at + 64, BLKPTR_BYTES)?)?,
        };
        if header.bucket_bits > DDT_BUCKET_BITS_MAX {
            return Err(FormatError::Invalid {
                what: WHAT,
                field: "dedup bucket_bits",
                value: u64::from(header.bucket_bits),
            });
        }
        if header.references < header.entries {
            return Err(FormatError::Invalid {
                what: WHAT,
                field: "dedup references",
                value: header.references,
            });
        }
        Ok(header)
    }
}
