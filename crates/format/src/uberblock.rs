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
//!    176  832 reserved (zero)
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
const OFF_RESERVED_B: usize = OFF_ROOT + BLKPTR_BYTES;
const OFF_CHECKSUM: usize = UBERBLOCK_BYTES - 16;

const _: () = assert!(OFF_RESERVED_B == 176);
const _: () = assert!(UBERBLOCK_BYTES % crate::SECTOR_BYTES as usize == 0);

const WHAT: &str = "uberblock";

/// A decoded uberblock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Uberblock {
    pub txg: u64,
    pub pool_guid: u64,
    pub guid_sum: u64,
    pub timestamp_secs: u64,
    /// `None` only for a pool with nothing synced yet.
    pub root: Option<BlockPointer>,
}

impl Uberblock {
    pub fn encode(&self) -> [u8; UBERBLOCK_BYTES] {
        let mut out = [0u8; UBERBLOCK_BYTES];
        let mut w = Writer::new(&mut out);
        w.u64(0, MAGIC);
        w.u16(OFF_VERSION, FormatVersion::CURRENT as u16);
        w.u8(OFF_ALG, ChecksumAlg::Xxh3_128 as u8);
        w.u64(OFF_TXG, self.txg);
        w.u64(OFF_POOL_GUID, self.pool_guid);
        w.u64(OFF_GUID_SUM, self.guid_sum);
        w.u64(OFF_TIMESTAMP, self.timestamp_secs);
        w.put(OFF_ROOT, &BlockPointer::encode(self.root.as_ref()));
        let sum = ChecksumAlg::Xxh3_128.compute(&out[..OFF_CHECKSUM]);
        out[OFF_CHECKSUM..].copy_from_slice(&sum.0);
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Uberblock, FormatError> {
        let r = Reader::new(WHAT, bytes, UBERBLOCK_BYTES)?;
        check_header(&r, WHAT, MAGIC, OFF_VERSION, OFF_ALG, OFF_CHECKSUM)?;
        r.zeros(OFF_RESERVED_A, OFF_TXG - OFF_RESERVED_A)?;
        r.zeros(OFF_RESERVED_B, OFF_CHECKSUM - OFF_RESERVED_B)?;
        Ok(Uberblock {
            txg: r.u64(OFF_TXG)?,
            pool_guid: r.u64(OFF_POOL_GUID)?,
            guid_sum: r.u64(OFF_GUID_SUM)?,
            timestamp_secs: r.u64(OFF_TIMESTAMP)?,
            root: BlockPointer::decode(r.slice(OFF_ROOT, BLKPTR_BYTES)?)?,
        })
    }
}
