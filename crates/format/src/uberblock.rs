//! Uberblocks (ZFS: `uberblock_impl.h`): the root of a transaction group's tree.
//!
//! Every txg sync writes a new uberblock into the next slot of each leaf's rings; import picks
//! the newest one whose checksum verifies. A torn or stale uberblock fails its checksum and the
//! previous one is used.
//!
//! ```text
//! offset size field
//!      0    8 magic u64                "SLUICEUB" as little-endian bytes
//!      8    2 version u16
//!     10    1 checksum_alg u8
//!     11    5 reserved (zero)
//!     16    8 txg u64
//!     24    8 pool_guid u64
//!     32    8 guid_sum u64             wrapping sum of every leaf guid: a missing leaf shows
//!     40    8 timestamp_secs u64       wall-clock seconds at sync
//!     48  128 root                     block pointer of the pool's metadata root
//!    176    8 complete_txg u64         (V2) the newest txg the leaf holding this copy has
//!                                      every block of, at most txg
//!    184  824 reserved (zero)
//!   1008   16 checksum                 over bytes 0..1008
//! ```

use crate::codec::{check_header, Reader, Writer};
use crate::{BlockPointer, ChecksumAlg, FormatError, FormatVersion, BLKPTR_BYTES};

pub const UBERBLOCK_BYTES: usize = 1024;
const MAGIC: u64 = u64::from_le_bytes(*b"SLUICEUB");
const OFF_VERSION: usize = 8;
const OFF_ALG: usize = 10;
const OFF_RESERVED_A: usize = 11;
const OFF_TXG: usize = 16;
const OFF_POOL_GUID: usize = 24;
const OFF_GUID_SUM: usize = 32;
const OFF_TIMESTAMP: usize = 40;
const OFF_ROOT: usize = 48;
const OFF_COMPLETE_TXG: usize = OFF_ROOT + BLKPTR_BYTES;
const OFF_RESERVED_B: usize = OFF_COMPLETE_TXG + 8;
const OFF_CHECKSUM: usize = UBERBLOCK_BYTES - 16;

const _: () = assert!(OFF_COMPLETE_TXG == 176);
const _: () = assert!(UBERBLOCK_BYTES % crate::SECTOR_BYTES as usize == 0);

const WHAT: &str = "uberblock";
/// The version this structure is written at, and the newest it reads.
const VERSION: FormatVersion = FormatVersion::V2;

/// A decoded uberblock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Uberblock {
    pub txg: u64,
    pub pool_guid: u64,
    pub guid_sum: u64,
    pub timestamp_secs: u64,
    /// `None` only for a pool with nothing synced yet.
    pub root: Option<BlockPointer>,
    /// The newest txg the leaf holding this copy has every block of (at most `txg`; a V1
    /// uberblock, which has no such field, decodes with `txg`).
    pub complete_txg: u64,
}

impl Uberblock {
    pub fn encode(&self) -> [u8; UBERBLOCK_BYTES] {
        let mut out = [0u8; UBERBLOCK_BYTES];
        let mut w = Writer::new(&mut out);
        w.u64(0, MAGIC);
        debug_assert!(self.complete_txg <= self.txg, "a leaf cannot hold a txg not synced yet");
        w.u16(OFF_VERSION, VERSION as u16);
        w.u8(OFF_ALG, ChecksumAlg::Xxh3_128 as u8);
        w.u64(OFF_TXG, self.txg);
        w.u64(OFF_POOL_GUID, self.pool_guid);
        w.u64(OFF_GUID_SUM, self.guid_sum);
        w.u64(OFF_TIMESTAMP, self.timestamp_secs);
        w.put(OFF_ROOT, &BlockPointer::encode(self.root.as_ref()));
        w.u64(OFF_COMPLETE_TXG, self.complete_txg);
        let sum = ChecksumAlg::Xxh3_128.compute(&out[..OFF_CHECKSUM]);
        out[OFF_CHECKSUM..].copy_from_slice(&sum.0);
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Uberblock, FormatError> {
        let r = Reader::new(WHAT, bytes, UBERBLOCK_BYTES)?;
        let version = check_header(&r, WHAT, MAGIC, OFF_VERSION, OFF_ALG, OFF_CHECKSUM, VERSION)?;
        r.zeros(OFF_RESERVED_A, OFF_TXG - OFF_RESERVED_A)?;
        let txg = r.u64(OFF_TXG)?;
        let complete_txg = if version >= FormatVersion::V2 {
            r.zeros(OFF_RESERVED_B, OFF_CHECKSUM - OFF_RESERVED_B)?;
            let complete = r.u64(OFF_COMPLETE_TXG)?;
            if complete > txg {
                return Err(FormatError::Invalid {
                    what: WHAT,
                    field: "complete_txg",
                    value: complete,
                });
            }
            complete
        } else {
            r.zeros(OFF_COMPLETE_TXG, OFF_CHECKSUM - OFF_COMPLETE_TXG)?;
            txg
        };
        Ok(Uberblock {
            txg,
            pool_guid: r.u64(OFF_POOL_GUID)?,
            guid_sum: r.u64(OFF_GUID_SUM)?,
            timestamp_secs: r.u64(OFF_TIMESTAMP)?,
            root: BlockPointer::decode(r.slice(OFF_ROOT, BLKPTR_BYTES)?)?,
            complete_txg,
        })
    }
}
