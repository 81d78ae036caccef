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
//!     11    1 flags u8                 bit 0: records sealed (V7)
//!     12    4 reserved (zero)
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
//!            in a sealed block, between the 24-byte header and the kind's fields:
//!               salt u64, iv [12], reserved 4, mac [16]                        (40 bytes)
//! ```

use crate::codec::{Reader, Writer};
use crate::{BlockPointer, Checksum, ChecksumAlg, FormatError, FormatVersion, BLKPTR_BYTES};

/// Bytes of a record's seal in a sealed block.
pub const RECORD_SEAL_BYTES: usize = 40;
/// Bytes of [`LogRecord::seal_aad`] for a record that is not an indirect one (which adds its
/// block pointer).
const SEAL_AAD_BYTES: usize = 72;
const FLAG_SEALED: u8 = 1;

const MAGIC: u64 = u64::from_le_bytes(*b"SLUICELG");
const OFF_VERSION: usize = 8;
const OFF_ALG: usize = 10;
const OFF_FLAGS: usize = 11;
const OFF_RESERVED_A: usize = 12;
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
/// The version an unsealed block is written at.
const VERSION: FormatVersion = FormatVersion::V1;
/// The version a sealed block is written at, and the newest this build reads.
const VERSION_SEALED: FormatVersion = FormatVersion::V7;

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

/// A vector of `len` bytes holding each piece at its offset and zeros elsewhere: the plain
/// `gather` of [`LogBlock::encode_into`].
pub fn gather_vec(len: usize, pieces: &[(usize, &[u8])]) -> Vec<u8> {
    let mut out = vec![0u8; len];
    for (at, bytes) in pieces {
        out[*at..*at + bytes.len()].copy_from_slice(bytes);
    }
    out
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

    /// Bytes this record takes in an unsealed block.
    pub fn encoded_len(&self) -> usize {
        self.encoded_len_in(false)
    }

    /// Bytes this record takes in a block, sealed or not.
    pub fn encoded_len_in(&self, sealed: bool) -> usize {
        self.fields_len_in(sealed)
            + match self {
                LogRecord::Write { data, .. } => data.len().div_ceil(8) * 8,
                LogRecord::WriteIndirect { .. } | LogRecord::Zero { .. } => 0,
            }
    }

    /// Bytes of this record's fixed fields in a block, sealed or not: its header, a seal's
    /// room and its kind's fields, all but a write's data.
    fn fields_len_in(&self, sealed: bool) -> usize {
        RECORD_HEADER_BYTES
            + if sealed { RECORD_SEAL_BYTES } else { 0 }
            + match self {
                LogRecord::Write { .. } | LogRecord::Zero { .. } => 16,
                LogRecord::WriteIndirect { .. } => 16 + BLKPTR_BYTES,
            }
    }
}

/// How a record of a sealed block was encrypted: the key family's salt (which block key),
/// the nonce, and the tag over its payload and [`LogRecord::seal_aad`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordSeal {
    pub salt: u64,
    pub iv: [u8; 12],
    pub mac: [u8; 16],
}

impl LogRecord {
    /// What a sealed record's tag authenticates besides its payload: the chain, volume and
    /// block it was written in and every field the claim reads, so that no record can be
    /// moved to another place, block, chain or volume, or have its txg, sequence, offset,
    /// length or indirect pointer changed, without failing its tag.
    pub fn seal_aad(&self, block: LogVerifier) -> Vec<u8> {
        let (kind, offset, len, pointer) = match self {
            LogRecord::Write { offset, data, .. } => (1u8, *offset, data.len() as u64, None),
            LogRecord::WriteIndirect { offset, len, block, .. } => {
                (2, *offset, u64::from(*len), Some(block))
            }
            LogRecord::Zero { offset, len, .. } => (3, *offset, *len, None),
        };
        let mut aad = Vec::with_capacity(SEAL_AAD_BYTES + BLKPTR_BYTES);
        aad.extend_from_slice(b"sluiceL7");
        for field in [block.chain_id, block.volume_id, block.sequence, u64::from(kind)] {
            aad.extend_from_slice(&field.to_le_bytes());
        }
        for field in [self.txg(), self.sequence(), offset, len] {
            aad.extend_from_slice(&field.to_le_bytes());
        }
        debug_assert_eq!(aad.len(), SEAL_AAD_BYTES);
        if let Some(pointer) = pointer {
            aad.extend_from_slice(&BlockPointer::encode(Some(pointer)));
        }
        aad
    }
}

/// What seals a record in place: `(additional data, payload) -> seal`.
type Sealer<'a, E> = dyn FnMut(&[u8], &mut [u8]) -> Result<RecordSeal, E> + 'a;

/// A decoded log block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogBlock {
    pub verifier: LogVerifier,
    pub next: Option<BlockPointer>,
    /// As read from a sealed block, a write's data is its ciphertext.
    pub records: Vec<LogRecord>,
    /// As read: one seal per record of a sealed block, none for an unsealed one. Encoding
    /// ignores it (a sealed block is encoded by [`LogBlock::encode_sealed_into`]).
    pub seals: Vec<RecordSeal>,
}

impl LogBlock {
    /// Bytes the block uses (header and records) unsealed.
    pub fn used_bytes(&self) -> usize {
        self.used_bytes_in(false)
    }

    /// Bytes the block uses (header and records), sealed or not.
    pub fn used_bytes_in(&self, sealed: bool) -> usize {
        LOG_HEADER_BYTES + self.records.iter().map(|r| r.encoded_len_in(sealed)).sum::<usize>()
    }

    /// Whether the block was read sealed.
    pub fn sealed(&self) -> bool {
        !self.seals.is_empty()
    }

    /// The header's bytes before its checksum, as written.
    fn header_bytes(&self, used: usize, sealed: bool) -> [u8; OFF_CHECKSUM] {
        let mut out = [0u8; OFF_CHECKSUM];
        let mut w = Writer::new(&mut out);
        w.u64(0, MAGIC);
        w.u16(OFF_VERSION, if sealed { VERSION_SEALED } else { VERSION } as u16);
        w.u8(OFF_ALG, ChecksumAlg::Xxh3_128 as u8);
        w.u8(OFF_FLAGS, if sealed { FLAG_SEALED } else { 0 });
        w.u64(OFF_CHAIN, self.verifier.chain_id);
        w.u64(OFF_VOLUME, self.verifier.volume_id);
        w.u64(OFF_SEQUENCE, self.verifier.sequence);
        w.u32(OFF_USED, used as u32);
        w.put(OFF_NEXT, &BlockPointer::encode(self.next.as_ref()));
        out
    }

    /// The additional data record `index` of this sealed block was sealed with: its own
    /// ([`LogRecord::seal_aad`]), linked to the block's header for the first record and to the
    /// tag of the record before it for the others. The links make a block's records one
    /// sequence: none can be dropped, reordered or moved to another block, nor the header
    /// (its successor pointer, its length) changed, without failing a later record's tag.
    pub fn record_aad(&self, index: usize) -> Vec<u8> {
        let mut aad = self.records[index].seal_aad(self.verifier);
        match index {
            0 => aad.extend_from_slice(&self.header_bytes(self.used_bytes_in(true), true)),
            _ => aad.extend_from_slice(&self.seals[index - 1].mac),
        }
        aad
    }

    /// Encodes the block into the bytes to write: the used bytes rounded up to 4 KiB, which
    /// must not exceed `block_bytes`.
    pub fn encode(&self, block_bytes: usize) -> Result<Vec<u8>, FormatError> {
        self.encode_into(block_bytes, gather_vec)
    }

    /// [`LogBlock::encode`] into a buffer of the caller's: `gather(n, pieces)` must return `n`
    /// bytes holding each piece's bytes at its offset and zeros everywhere else (the pieces
    /// come in ascending order of offset and do not overlap; [`gather_vec`] is one such
    /// function). The intent log gathers straight into the aligned buffer it writes from
    /// (`AlignedBuf::gathered`, a kept buffer of its pool), so no byte is zeroed and then
    /// overwritten (a sealed block's seals and checksum excepted). Encoding into a freshly
    /// zeroed buffer instead, which missed the pool, cost one client's durable 4 KiB writes
    /// about a tenth of their rate and a twentieth more server CPU each, and eight clients'
    /// mixed writes more (docs/bench/peers-notes.md, 2026-12-07 02:48Z).
    pub fn encode_into<B: AsMut<[u8]>>(
        &self,
        block_bytes: usize,
        gather: impl FnOnce(usize, &[(usize, &[u8])]) -> B,
    ) -> Result<B, FormatError> {
        let unsealed: Option<&mut Sealer<'_, ()>> = None;
        match self.encode_impl(block_bytes, gather, unsealed)? {
            Ok(buf) => Ok(buf),
            Err(()) => unreachable!("an unsealed block calls no sealer"),
        }
    }

    /// [`LogBlock::encode_into`] sealed: each record's payload is encrypted in place in the
    /// buffer by `seal(aad, payload)`, which returns its seal (an error from it is returned
    /// as the inner one). Written at V7.
    pub fn encode_sealed_into<B: AsMut<[u8]>, E>(
        &self,
        block_bytes: usize,
        gather: impl FnOnce(usize, &[(usize, &[u8])]) -> B,
        mut seal: impl FnMut(&[u8], &mut [u8]) -> Result<RecordSeal, E>,
    ) -> Result<Result<B, E>, FormatError> {
        self.encode_impl(block_bytes, gather, Some(&mut seal))
    }

    fn encode_impl<B: AsMut<[u8]>, E>(
        &self,
        block_bytes: usize,
        gather: impl FnOnce(usize, &[(usize, &[u8])]) -> B,
        mut seal: Option<&mut Sealer<'_, E>>,
    ) -> Result<Result<B, E>, FormatError> {
        let sealed = seal.is_some();
        let used = self.used_bytes_in(sealed);
        let written = used.div_ceil(LOG_WRITE_UNIT_BYTES) * LOG_WRITE_UNIT_BYTES;
        if written > block_bytes {
            return Err(FormatError::TooLarge { what: WHAT, len: used, max: block_bytes });
        }
        let header = self.header_bytes(used, sealed);
        // Each record's fixed fields (its header, a seal's room, zero until sealed, and its
        // kind's fields) are encoded one after another into `fields`; the pieces then name
        // those and each write's data where it already lies, so the data is copied once, into
        // the block. Padding, the checksum and the tail are the gather's zeros.
        let fields_len = self.records.iter().map(|r| r.fields_len_in(sealed)).sum();
        let mut fields = vec![0u8; fields_len];
        let mut places = Vec::with_capacity(self.records.len());
        let (mut at, mut from) = (LOG_HEADER_BYTES, 0);
        for record in &self.records {
            let (kind, txg, sequence) = match record {
                LogRecord::Write { txg, sequence, .. } => (1u8, *txg, *sequence),
                LogRecord::WriteIndirect { txg, sequence, .. } => (2, *txg, *sequence),
                LogRecord::Zero { txg, sequence, .. } => (3, *txg, *sequence),
            };
            let record_len = record.encoded_len_in(sealed);
            let own = from..from + record.fields_len_in(sealed);
            let mut w = Writer::new(&mut fields[own.clone()]);
            w.u8(0, kind);
            w.u32(4, record_len as u32);
            w.u64(8, txg);
            w.u64(16, sequence);
            let body = RECORD_HEADER_BYTES + if sealed { RECORD_SEAL_BYTES } else { 0 };
            let data = match record {
                LogRecord::Write { offset, data, .. } => {
                    w.u64(body, *offset);
                    w.u32(body + 8, data.len() as u32);
                    Some(&data[..])
                }
                LogRecord::WriteIndirect { offset, len, block, .. } => {
                    w.u64(body, *offset);
                    w.u32(body + 8, *len);
                    w.put(body + 16, &BlockPointer::encode(Some(block)));
                    None
                }
                LogRecord::Zero { offset, len, .. } => {
                    w.u64(body, *offset);
                    w.u64(body + 8, *len);
                    None
                }
            };
            from = own.end;
            places.push((at, own, data));
            at += record_len;
        }
        assert_eq!(at, used, "a log block's records fill exactly its used bytes");
        let mut pieces: Vec<(usize, &[u8])> = Vec::with_capacity(1 + 2 * places.len());
        pieces.push((0, &header[..]));
        for (at, own, data) in &places {
            pieces.push((*at, &fields[own.clone()]));
            if let Some(data) = data {
                pieces.push((*at + own.len(), data));
            }
        }
        let mut buf = gather(written, &pieces);
        let out = buf.as_mut();
        assert_eq!(out.len(), written, "a log block is encoded into exactly its written bytes");
        if let Some(seal) = seal.as_mut() {
            let mut link = header.to_vec();
            for (record, (at, own, data)) in self.records.iter().zip(&places) {
                let seal_at = at + RECORD_HEADER_BYTES;
                let payload_at = at + own.len();
                let payload = payload_at..payload_at + data.map_or(0, <[u8]>::len);
                let mut aad = record.seal_aad(self.verifier);
                aad.extend_from_slice(&link);
                let done = match seal(&aad, &mut out[payload]) {
                    Ok(done) => done,
                    Err(e) => return Ok(Err(e)),
                };
                let mut w = Writer::new(out);
                w.u64(seal_at, done.salt);
                w.put(seal_at + 8, &done.iv);
                w.put(seal_at + 24, &done.mac);
                link = done.mac.to_vec();
            }
        }
        let sum = ChecksumAlg::Xxh3_128.compute(out);
        out[OFF_CHECKSUM..OFF_CHECKSUM + 16].copy_from_slice(&sum.0);
        Ok(Ok(buf))
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
        let version =
            crate::codec::check_magic_version(&r, WHAT, MAGIC, OFF_VERSION, VERSION_SEALED)?;
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
        let flags = r.u8(OFF_FLAGS)?;
        // Sealing came with V7; an older block has the byte reserved, as zero.
        let sealed = match flags {
            0 => false,
            FLAG_SEALED if version >= VERSION_SEALED => true,
            other => {
                return Err(FormatError::Invalid {
                    what: WHAT,
                    field: "flags",
                    value: u64::from(other),
                })
            }
        };
        r.zeros(OFF_RESERVED_A, OFF_CHAIN - OFF_RESERVED_A)?;
        r.zeros(OFF_RESERVED_B, OFF_NEXT - OFF_RESERVED_B)?;
        r.zeros(used, covered - used)?;
        let next = BlockPointer::decode(r.slice(OFF_NEXT, BLKPTR_BYTES)?)?;
        let mut records = Vec::new();
        let mut seals = Vec::new();
        let seal_bytes = if sealed { RECORD_SEAL_BYTES } else { 0 };
        let mut at = LOG_HEADER_BYTES;
        while at < used {
            let invalid =
                |field: &'static str, value: u64| FormatError::Invalid { what: WHAT, field, value };
            let kind = r.u8(at)?;
            r.zeros(at + 1, 3)?;
            let record_len = r.u32(at + 4)? as usize;
            if record_len < RECORD_HEADER_BYTES + seal_bytes + 16
                || record_len % 8 != 0
                || at + record_len > used
            {
                return Err(invalid("record_len", record_len as u64));
            }
            let (txg, sequence) = (r.u64(at + 8)?, r.u64(at + 16)?);
            if sealed {
                let seal_at = at + RECORD_HEADER_BYTES;
                r.zeros(seal_at + 20, 4)?;
                let mut iv = [0u8; 12];
                iv.copy_from_slice(r.slice(seal_at + 8, 12)?);
                seals.push(RecordSeal { salt: r.u64(seal_at)?, iv, mac: r.bytes16(seal_at + 24)? });
            }
            // The record's length less its seal: the kinds' checks below are the unsealed ones.
            let record_len = record_len - seal_bytes;
            let body = at + RECORD_HEADER_BYTES + seal_bytes;
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
            at += record_len + seal_bytes;
        }
        Ok(LogBlock { verifier: found, next, records, seals })
    }
}
