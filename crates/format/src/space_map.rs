//! Space maps (ZFS: `space_map.c`): the persisted allocation state of one top-level vdev.
//!
//! Written with every txg sync as a metadata block and read at import. It lists the free
//! ranges and the frees still in their deferral window (a block freed in txg T may be reused
//! only once T is durable and a few more txgs have passed, so that a crash importing an older
//! uberblock never finds its blocks overwritten).
//!
//! ```text
//! offset size field
//!      0    8 magic u64                "SLUICESM" as little-endian bytes
//!      8    2 version u16
//!     10    1 checksum_alg u8
//!     11    1 ashift u8
//!     12    4 reserved (zero)
//!     16    8 synced_txg u64           txg this map describes
//!     24    4 free_count u32
//!     28    4 deferred_count u32
//!     32  16n free ranges              start u64, len u64 (bytes, ascending, disjoint)
//!      .  24m deferred frees           txg u64, start u64, len u64
//!      .   16 checksum                 over everything before it
//! ```

use crate::codec::{Reader, Writer};
use crate::{Checksum, ChecksumAlg, FormatError, FormatVersion};

const MAGIC: u64 = u64::from_le_bytes(*b"SLUICESM");
const OFF_VERSION: usize = 8;
const OFF_ALG: usize = 10;
const OFF_ASHIFT: usize = 11;
const OFF_RESERVED: usize = 12;
const OFF_TXG: usize = 16;
const OFF_FREE_COUNT: usize = 24;
const OFF_DEFERRED_COUNT: usize = 28;
const HEADER_BYTES: usize = 32;
const FREE_ENTRY_BYTES: usize = 16;
const DEFERRED_ENTRY_BYTES: usize = 24;
const WHAT: &str = "space map";
/// The version this structure is written at, and the newest it reads.
const VERSION: FormatVersion = FormatVersion::V1;

/// A decoded space map.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpaceMap {
    pub ashift: u8,
    pub synced_txg: u64,
    /// Free ranges as (start, len) in bytes, ascending and disjoint.
    pub free: Vec<(u64, u64)>,
    /// Frees in their deferral window, as (txg, start, len).
    pub deferred: Vec<(u64, u64, u64)>,
}

impl SpaceMap {
    /// Bytes of a map with no entries: its header and its trailing checksum.
    pub const EMPTY_BYTES: usize = HEADER_BYTES + 16;
    /// Bytes each free range adds.
    pub const FREE_ENTRY_BYTES: usize = FREE_ENTRY_BYTES;
    /// Bytes each deferred free adds.
    pub const DEFERRED_ENTRY_BYTES: usize = DEFERRED_ENTRY_BYTES;

    pub fn encoded_len(&self) -> usize {
        Self::EMPTY_BYTES
            + self.free.len() * FREE_ENTRY_BYTES
            + self.deferred.len() * DEFERRED_ENTRY_BYTES
    }

    pub fn encode(&self) -> Result<Vec<u8>, FormatError> {
        let too_many = |len| FormatError::TooLarge { what: WHAT, len, max: u32::MAX as usize };
        let free_count = u32::try_from(self.free.len()).map_err(|_| too_many(self.free.len()))?;
        let deferred_count =
            u32::try_from(self.deferred.len()).map_err(|_| too_many(self.deferred.len()))?;
        let mut out = vec![0u8; self.encoded_len()];
        let body_end = out.len() - 16;
        {
            let mut w = Writer::new(&mut out);
            w.u64(0, MAGIC);
            w.u16(OFF_VERSION, VERSION as u16);
            w.u8(OFF_ALG, ChecksumAlg::Xxh3_128 as u8);
            w.u8(OFF_ASHIFT, self.ashift);
            w.u64(OFF_TXG, self.synced_txg);
            w.u32(OFF_FREE_COUNT, free_count);
            w.u32(OFF_DEFERRED_COUNT, deferred_count);
            let mut at = HEADER_BYTES;
            for &(start, len) in &self.free {
                w.u64(at, start);
                w.u64(at + 8, len);
                at += FREE_ENTRY_BYTES;
            }
            for &(txg, start, len) in &self.deferred {
                w.u64(at, txg);
                w.u64(at + 8, start);
                w.u64(at + 16, len);
                at += DEFERRED_ENTRY_BYTES;
            }
        }
        let sum = ChecksumAlg::Xxh3_128.compute(&out[..body_end]);
        out[body_end..].copy_from_slice(&sum.0);
        Ok(out)
    }

    /// Decodes and validates: ranges must be non-empty, ascending and disjoint.
    pub fn decode(bytes: &[u8]) -> Result<SpaceMap, FormatError> {
        let r = Reader::new(WHAT, bytes, HEADER_BYTES + 16)?;
        crate::codec::check_magic_version(&r, WHAT, MAGIC, OFF_VERSION, VERSION)?;
        let alg = ChecksumAlg::decode(WHAT, r.u8(OFF_ALG)?)?;
        let free_count = r.u32(OFF_FREE_COUNT)? as usize;
        let deferred_count = r.u32(OFF_DEFERRED_COUNT)? as usize;
        let need = free_count
            .checked_mul(FREE_ENTRY_BYTES)
            .and_then(|f| deferred_count.checked_mul(DEFERRED_ENTRY_BYTES).map(|d| (f, d)))
            .and_then(|(f, d)| f.checked_add(d))
            .and_then(|n| n.checked_add(HEADER_BYTES + 16))
            .ok_or(FormatError::Invalid {
                what: WHAT,
                field: "counts",
                value: free_count as u64,
            })?;
        let r = Reader::new(WHAT, bytes, need)?;
        let body_end = need - 16;
        if alg.compute(r.slice(0, body_end)?) != Checksum(r.bytes16(body_end)?) {
            return Err(FormatError::ChecksumMismatch { what: WHAT });
        }
        r.zeros(OFF_RESERVED, OFF_TXG - OFF_RESERVED)?;
        let mut free = Vec::with_capacity(free_count);
        let mut at = HEADER_BYTES;
        let mut previous_end = 0u64;
        for index in 0..free_count {
            let (start, len) = (r.u64(at)?, r.u64(at + 8)?);
            let end = start.checked_add(len);
            let ordered = index == 0 || start > previous_end;
            match end {
                Some(end) if len > 0 && ordered => previous_end = end,
                _ => {
                    return Err(FormatError::Invalid {
                        what: WHAT,
                        field: "free range",
                        value: start,
                    })
                }
            }
            free.push((start, len));
            at += FREE_ENTRY_BYTES;
        }
        let mut deferred = Vec::with_capacity(deferred_count);
        for _ in 0..deferred_count {
            let (txg, start, len) = (r.u64(at)?, r.u64(at + 8)?, r.u64(at + 16)?);
            if len == 0 || start.checked_add(len).is_none() {
                return Err(FormatError::Invalid {
                    what: WHAT,
                    field: "deferred range",
                    value: start,
                });
            }
            deferred.push((txg, start, len));
            at += DEFERRED_ENTRY_BYTES;
        }
        Ok(SpaceMap { ashift: r.u8(OFF_ASHIFT)?, synced_txg: r.u64(OFF_TXG)?, free, deferred })
    }
}
