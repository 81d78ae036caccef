//! Intent-log blocks and records (ZFS: `zil_chain_t`, `lr_t`, `lr_write_t`).
//!
//! A volume's intent log is a chain of blocks. Each block names its pre-allocated successor,
//! so a block can be written, and made durable, before the next one exists. The header holds the
//! chain id, volume id and block sequence; the reader passes the values it expects (from the
//! previous block), and a block carrying other values fails even if its bytes are intact. A
//! successor that was allocated but never written holds some older block, or nothing: either
//! way it does not verify, and that is how the end of the log is found. Blocks are written short:
//! only the used bytes, rounded up to 4 KiB, are covered by the checksum and need be written.
//!
//! ```text
//! block:
//! offset size field
//!      0    8 magic u64                "SLUICELG" as little-endian bytes
//!      8    2 version u16
//!     10    1 checksum_alg u8
//!     11    5 reserved (zero)
//!     16    8 chain_id u64             random per chain
//!     24    8 volume_id u64
//!     32    8 sequence u64             1 for the first block of a chain
//!     40    4 used_bytes u32           header + records
//!     44    4 reserved (zero)
//!     48  128 next                     block pointer of the successor (zeros: none)
//!    176   16 checksum                 over bytes 0..round_up(used, 4096), this field as zero
//!    192      records, each 8-byte aligned:
//!               kind u8, reserved 3, record_len u32, txg u64, sequence u64   (24 bytes)
//!               kind 1 (write, data copied):   offset u64, len u32, reserved 4, data (padded to 8)
//!               kind 2 (write, indirect):      offset u64, len u32, reserved 4, block pointer (128)
//!               kind 3 (zero: trim or write-zeroes): offset u64, len u64
//! ```

use crate::codec::{Reader, Writer};
use crate::{BlockPointer, Checksum, ChecksumAlg, FormatError, FormatVersion, BLKPTR_BYTES};

const MAGIC: u64 = u64::from_le_bytes(*b"SLUICELG");
const OFF_VERSION: usize = 8;
const OFF_ALG: usize = 10;
const OFF_RESERVED_A: usize = 11;
const OFF_CHAIN: usize = 16;
const OFF_VOLUME: usize = 24;
const OFF_SEQUENCE: usize = 32;
const OFF_USED: usize = 40;
const OFF_RESERVED_B: usize = 44;
const OFF_NEXT: usize = 48;
const OFF_CHECKSUM: usize = OFF_NEXT + BLKPTR_BYTES;
/// Bytes before the first record.
pub const LOG_HEADER_BYTES: usize = OFF_CHECKSUM + 16;
const RECORD_HEADER_BYTES: usize = 24;
/// Granularity of what is checksummed and written.
pub const LOG_WRITE_UNIT_BYTES: usize = 4096;

const _: () = assert!(LOG_HEADER_BYTES == 192);
const WHAT: &str = "log block";
/// The version this structure is written at, and the newest it reads.
const VERSION: FormatVersion = FormatVersion::V1;

/// What the reader expects a block to be: its place in a particular chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogVerifier {
    pub chain_id: u64,
    pub volume_id: u64,
    pub sequence: u64,
}

impl LogVerifier {
    /// The verifier of the block after this one.
    pub fn next(self) -> LogVerifier {
        LogVerifier { sequence: self.sequence + 1, ..self }
    }
}

/// One logged change to a volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogRecord {
    /// A write whose data is in the record.
    Write { txg: u64, sequence: u64, offset: u64, data: Vec<u8> },
    /// A large write whose data was written in place; the record points at it.
    WriteIndirect { txg: u64, sequence: u64, offset: u64, len: u32, block: BlockPointer },
    /// A range that reads as zeros from now on (trim or write-zeroes).
    Zero { txg: u64, sequence: u64, offset: u64, len: u64 },
}

impl LogRecord {
    pub fn txg(&self) -> u64 {
        match self {
            LogRecord::Write { txg, .. }
            | LogRecord::WriteIndirect { txg, .. }
            | LogRecord::Zero { txg, .. } => *txg,
        }
    }

    pub fn sequence(&self) -> u64 {
        match self {
            LogRecord::Write { sequence, .. }
            | LogRecord::WriteIndirect { sequence, .. }
            | LogRecord::Zero { sequence, .. } => *sequence,
        }
    }

    /// Bytes this record takes in a block.
    pub fn encoded_len(&self) -> usize {
        RECORD_HEADER_BYTES
            + match self {
                LogRecord::Write { data, .. } => 16 + data.len().div_ceil(8) * 8,
                LogRecord::WriteIndirect { .. } => 16 + BLKPTR_BYTES,
                LogRecord::Zero { .. } => 16,
            }
    }
}

/// A decoded log block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogBlock {
    pub verifier: LogVerifier,
    pub next: Option<BlockPointer>,
    pub records: Vec<LogRecord>,
}

impl LogBlock {
    /// Bytes the block uses (header and records).
    pub fn used_bytes(&self) -> usize {
        LOG_HEADER_BYTES + self.records.iter().map(LogRecord::encoded_len).sum::<usize>()
    }

    /// Encodes the block into the bytes to write: the used bytes rounded up to 4 KiB, which
    /// must not exceed `block_bytes`.
    pub fn encode(&self, block_bytes: usize) -> Result<Vec<u8>, FormatError> {
        self.encode_into(block_bytes, |written| vec![0u8; written])
    }

    /// [`LogBlock::encode`] into a buffer of the caller's: `zeroed(n)` must return `n` zero
    /// bytes. The intent log encodes straight into the aligned buffer it writes from, rather
    /// than into a vector it would then copy.
    pub fn encode_into<B: AsMut<[u8]>>(
        &self,
        block_bytes: usize,
        zeroed: impl FnOnce(usize) -> B,
    ) -> Result<B, FormatError> {
        let used = self.used_bytes();
        let written = used.div_ceil(LOG_WRITE_UNIT_BYTES) * LOG_WRITE_UNIT_BYTES;
        if written > block_bytes {
            return Err(FormatError::TooLarge { what: WHAT, len: used, max: block_bytes });
        }
        let mut buf = zeroed(written);
        let out = buf.as_mut();
        assert_eq!(out.len(), written, "a log block is encoded into exactly its written bytes");
        let mut w = Writer::new(out);
        w.u64(0, MAGIC);
        w.u16(OFF_VERSION, VERSION as u16);
        w.u8(OFF_ALG, ChecksumAlg::Xxh3_128 as u8);
        w.u64(OFF_CHAIN, self.verifier.chain_id);
        w.u64(OFF_VOLUME, self.verifier.volume_id);
        w.u64(OFF_SEQUENCE, self.verifier.sequence);
        w.u32(OFF_USED, used as u32);
        w.put(OFF_NEXT, &BlockPointer::encode(self.next.as_ref()));
        let mut at = LOG_HEADER_BYTES;
        for record in &self.records {
            let (kind, txg, sequence) = match record {
                LogRecord::Write { txg, sequence, .. } => (1u8, *txg, *sequence),
                LogRecord::WriteIndirect { txg, sequence, .. } => (2, *txg, *sequence),
                LogRecord::Zero { txg, sequence, .. } => (3, *txg, *sequence),
            };
            w.u8(at, kind);
            w.u32(at + 4, record.encoded_len() as u32);
            w.u64(at + 8, txg);
            w.u64(at + 16, sequence);
            let body = at + RECORD_HEADER_BYTES;
            match record {
                LogRecord::Write { offset, data, .. } => {
                    w.u64(body, *offset);
                    w.u32(body + 8, data.len() as u32);
                    w.put(body + 16, data);
                }
                LogRecord::WriteIndirect { offset, len, block, .. } => {
                    w.u64(body, *offset);
                    w.u32(body + 8, *len);
                    w.put(body + 16, &BlockPointer::encode(Some(block)));
                }
                LogRecord::Zero { offset, len, .. } => {
                    w.u64(body, *offset);
                    w.u64(body + 8, *len);
                }
            }
            at += record.encoded_len();
        }
        let sum = ChecksumAlg::Xxh3_128.compute(out);
        out[OFF_CHECKSUM..OFF_CHECKSUM + 16].copy_from_slice(&sum.0);
        Ok(buf)
    }

    /// The verifier a block's header claims, without checking its checksum: lets a reader tell
    /// a block that was started but not completed (torn) from one that was never written.
    pub fn claimed_verifier(bytes: &[u8]) -> Option<LogVerifier> {
        let r = Reader::new(WHAT, bytes, LOG_HEADER_BYTES).ok()?;
        (r.u64(0).ok()? == MAGIC).then_some(())?;
        Some(LogVerifier {
            chain_id: r.u64(OFF_CHAIN).ok()?,
            volume_id: r.u64(OFF_VOLUME).ok()?,
            sequence: r.u64(OFF_SEQUENCE).ok()?,
        })
    }

    /// Decodes a block read from disk, which must be the block `expected` describes.
    pub fn decode(bytes: &[u8], expected: LogVerifier) -> Result<LogBlock, FormatError> {
        let r = Reader::new(WHAT, bytes, LOG_HEADER_BYTES)?;
        crate::codec::check_magic_version(&r, WHAT, MAGIC, OFF_VERSION, VERSION)?;
        let alg = ChecksumAlg::decode(WHAT, r.u8(OFF_ALG)?)?;
        let used = r.u32(OFF_USED)? as usize;
        if used < LOG_HEADER_BYTES {
            return Err(FormatError::Invalid {
                what: WHAT,
                field: "used_bytes",
                value: used as u64,
            });
        }
        let covered = used.div_ceil(LOG_WRITE_UNIT_BYTES) * LOG_WRITE_UNIT_BYTES;
        let r = Reader::new(WHAT, bytes, covered)?;
        let mut body = r.slice(0, covered)?.to_vec();
        body[OFF_CHECKSUM..OFF_CHECKSUM + 16].fill(0);
        if alg.compute(&body) != Checksum(r.bytes16(OFF_CHECKSUM)?) {
            return Err(FormatError::ChecksumMismatch { what: WHAT });
        }
        let found = LogVerifier {
            chain_id: r.u64(OFF_CHAIN)?,
            volume_id: r.u64(OFF_VOLUME)?,
            sequence: r.u64(OFF_SEQUENCE)?,
        };
        if found != expected {
            // An intact block of another chain or position: the end of this log.
            return Err(FormatError::Invalid {
                what: WHAT,
                field: "verifier",
                value: found.sequence,
            });
        }
        r.zeros(OFF_RESERVED_A, OFF_CHAIN - OFF_RESERVED_A)?;
        r.zeros(OFF_RESERVED_B, OFF_NEXT - OFF_RESERVED_B)?;
        r.zeros(used, covered - used)?;
        let next = BlockPointer::decode(r.slice(OFF_NEXT, BLKPTR_BYTES)?)?;
        let mut records = Vec::new();
        let mut at = LOG_HEADER_BYTES;
        while at < used {
            let invalid =
                |field: &'static str, value: u64| FormatError::Invalid { what: WHAT, field, value };
            let kind = r.u8(at)?;
            r.zeros(at + 1, 3)?;
            let record_len = r.u32(at + 4)? as usize;
            if record_len < RECORD_HEADER_BYTES + 16
                || record_len % 8 != 0
                || at + record_len > used
            {
                return Err(invalid("record_len", record_len as u64));
            }
            let (txg, sequence) = (r.u64(at + 8)?, r.u64(at + 16)?);
            let body = at + RECORD_HEADER_BYTES;
            let record = match kind {
                1 => {
                    let len = r.u32(body + 8)? as usize;
                    r.zeros(body + 12, 4)?;
                    if 16 + len.div_ceil(8) * 8 + RECORD_HEADER_BYTES != record_len {
                        return Err(invalid("write length", len as u64));
                    }
                    r.zeros(body + 16 + len, len.div_ceil(8) * 8 - len)?;
                    LogRecord::Write {
                        txg,
                        sequence,
                        offset: r.u64(body)?,
                        data: r.slice(body + 16, len)?.to_vec(),
                    }
                }
                2 => {
                    r.zeros(body + 12, 4)?;
                    if record_len != RECORD_HEADER_BYTES + 16 + BLKPTR_BYTES {
                        return Err(invalid("indirect record length", record_len as u64));
                    }
                    let block = BlockPointer::decode(r.slice(body + 16, BLKPTR_BYTES)?)?
                        .ok_or(invalid("indirect block", 0))?;
                    LogRecord::WriteIndirect {
                        txg,
                        sequence,
                        offset: r.u64(body)?,
                        len: r.u32(body + 8)?,
                        block,
                    }
                }
                3 => {
                    if record_len != RECORD_HEADER_BYTES + 16 {
                        return Err(invalid("zero record length", record_len as u64));
                    }
                    LogRecord::Zero { txg, sequence, offset: r.u64(body)?, len: r.u64(body + 8)? }
                }
                other => return Err(invalid("record kind", u64::from(other))),
            };
            records.push(record);
            at += record_len;
        }
        Ok(LogBlock { verifier: found, next, records })
    }
}
