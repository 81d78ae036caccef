//! Send streams (ZFS: `dmu_send.c`'s replication stream, `zfs send | zfs receive`): a
//! snapshot of a volume, whole or as the change since an older snapshot, as a sequence of
//! records that `sluice recv` applies on another pool.
//!
//! Every record carries its sequence number and its own checksum, so a receiver refuses a
//! damaged, truncated or reordered stream at the record where it goes wrong, naming it. The
//! first record says what the stream holds (and its version); the last counts the records
//! before it. A block compressed on the sender travels compressed, as it is stored.
//!
//! A raw stream (`sluice send -w`, version 2) carries an encrypted volume as it is stored:
//! each data block's ciphertext with its salt, nonce and tag (raw data records), and in the
//! begin record the volume's wrapped key and the keyed MAC of the snapshot's root, so that a
//! receiver without the key stores it byte for byte, and one with it can check it.
//!
//! ```text
//! record, every kind:
//! offset size field
//!      0    4 magic u32                "SLSR" as little-endian bytes
//!      4    1 kind u8                  1 begin, 2 data, 3 free, 4 end, 5 raw data
//!      5    3 reserved (zero)
//!      8    8 sequence u64             0 for the begin record, then one more each
//!     16    4 payload_len u32
//!     20    4 reserved (zero)
//!     24    n payload
//!   24+n   16 checksum                 XXH3-128 of the 24 + n bytes before it
//!
//! begin payload:
//!      0    8 magic u64                "SLUICESS"
//!      8    2 version u16
//!     10    2 reserved (zero)
//!     12    4 block_bytes u32
//!     16    8 size_bytes u64           the volume's size at the snapshot
//!     24    8 guid u64                 the snapshot's
//!     32    8 txg u64                  the snapshot's, on the sender (informational)
//!     40    8 creation_secs u64
//!     48    8 from_guid u64            the older snapshot of an incremental stream; 0: full
//!     56    2 name_len u16
//!     58    2 source_len u16
//!     60    1 flags u8                 bit 0: resumed (from a token); bit 1: raw (version
//!                                      2); the rest zero
//!     61    3 reserved (zero)
//!     64    8 resume_block u64         a resumed stream holds no block before it (0 if not
//!                                      resumed)
//!     72      name (UTF-8)             the snapshot's name
//!      .      source (UTF-8)           the sender's POOL/VOL (a resume token names it)
//!      .   32 root_mac                 raw only: the keyed MAC of the snapshot's root
//!     +32   2 key_len u16              raw only
//!     +34   6 reserved (zero)
//!     +40     wrapped key              raw only: key_len bytes (crypto_key.rs's record)
//! data payload: block u64, lsize u32, compression u8 (as a block pointer's), reserved 3,
//!               then the block as stored (a compressed block's 4-byte length, its bytes, and
//!               no padding)
//! raw data payload: block u64, lsize u32, compression u8, reserved 3, salt u64, iv [12],
//!               reserved 4, mac [16], then the block as stored (its ciphertext, padded as
//!               it was sealed: the tag covers every byte)
//! free payload: first block u64, count u64 (holes from then on)
//! end payload:  records u64 (before this one), data_bytes u64 (data payload bytes sent)
//! ```

use std::io::{Read, Write};

use crate::codec::{Reader, Writer};
use crate::{BlockCompression, ChecksumAlg, FormatError, FormatVersion, WrappedKey};

const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"SLSR");
const STREAM_MAGIC: u64 = u64::from_le_bytes(*b"SLUICESS");
const HEADER_BYTES: usize = 24;
const CHECKSUM_BYTES: usize = 16;
const BEGIN_FIXED_BYTES: usize = 72;
const WHAT: &str = "send stream record";
/// The version of a stream that is not raw.
pub const STREAM_VERSION: FormatVersion = FormatVersion::V1;
/// The version of a raw stream, and the newest this build reads.
pub const RAW_STREAM_VERSION: FormatVersion = FormatVersion::V2;
const RAW_BEGIN_BYTES: usize = 40;
const RAW_DATA_FIXED_BYTES: usize = 56;
/// Largest payload a record may carry (a 1 MiB block and its header, with room).
pub const STREAM_PAYLOAD_MAX: usize = 2 << 20;

/// What a stream holds (its first record).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamBegin {
    pub block_bytes: u32,
    pub size_bytes: u64,
    pub guid: u64,
    pub txg: u64,
    pub creation_secs: u64,
    /// The older snapshot an incremental stream applies to; `None`: a full stream.
    pub from_guid: Option<u64>,
    pub name: String,
    /// The sender's POOL/VOL.
    pub source: String,
    /// A stream resumed from a token holds no block before this one; `None`: the whole
    /// stream.
    pub resume_block: Option<u64>,
    /// A raw stream's key and root MAC; `None`: not raw.
    pub raw: Option<Box<RawBegin>>,
}

/// What a raw stream carries besides its blocks: the volume's key family, wrapped as its
/// pool keeps it (the receiver stores it; only the user's key unwraps it), and the keyed MAC
/// of the snapshot's root, which the receiver's tree of the same blocks must match when the
/// key is loaded there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawBegin {
    pub key: WrappedKey,
    pub root_mac: [u8; 32],
}

/// One record of a stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StreamRecord {
    Begin(StreamBegin),
    /// Data block `block`, as stored: `lsize` logical bytes, compressed as `compression` says.
    Data {
        block: u64,
        lsize: u32,
        compression: BlockCompression,
        bytes: Vec<u8>,
    },
    /// Encrypted data block `block` as stored: its ciphertext, sealed under the stream's key
    /// family with `salt` and `iv`, and its tag (a raw stream's).
    RawData {
        block: u64,
        lsize: u32,
        compression: BlockCompression,
        salt: u64,
        iv: [u8; 12],
        mac: [u8; 16],
        bytes: Vec<u8>,
    },
    /// `count` blocks from `first` on are holes.
    Free {
        first: u64,
        count: u64,
    },
    End {
        records: u64,
        data_bytes: u64,
    },
}

/// Why a stream was refused, with the record where it went wrong.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("send stream, record {record}: {cause}")]
    Record { record: u64, cause: FormatError },
    #[error(
        "send stream version {found} is newer than this sluice reads (up to {newest}); receive \
         it with a newer sluice, or send it from an older one"
    )]
    NewerVersion { found: u16, newest: u16 },
    #[error(
        "send stream: record {found} came where record {expected} was due (records lost or \
         reordered)"
    )]
    OutOfOrder { expected: u64, found: u64 },
    #[error("send stream: record {record} is a {kind} record where {wanted} was due")]
    Unexpected { record: u64, kind: &'static str, wanted: &'static str },
    #[error(
        "send stream ended after record {last} without its end record: it was cut short; \
         nothing of it was kept"
    )]
    Truncated { last: u64 },
    #[error("send stream: {0}")]
    Io(std::io::Error),
}

// Not `#[from]`: that would make the inner error this one's `source()` as well as part of its
// message, and a chain would print it twice.
impl From<std::io::Error> for StreamError {
    fn from(error: std::io::Error) -> Self {
        StreamError::Io(error)
    }
}

impl StreamRecord {
    fn kind(&self) -> u8 {
        match self {
            StreamRecord::Begin(_) => 1,
            StreamRecord::Data { .. } => 2,
            StreamRecord::Free { .. } => 3,
            StreamRecord::End { .. } => 4,
            StreamRecord::RawData { .. } => 5,
        }
    }

    /// The data bytes the record carries (counted by the end record).
    fn data_len(&self) -> u64 {
        match self {
            StreamRecord::Data { bytes, .. } | StreamRecord::RawData { bytes, .. } => {
                bytes.len() as u64
            }
            _ => 0,
        }
    }

    /// The record's kind in words, for errors.
    pub fn kind_name(&self) -> &'static str {
        match self {
            StreamRecord::Begin(_) => "begin",
            StreamRecord::Data { .. } => "data",
            StreamRecord::Free { .. } => "free",
            StreamRecord::End { .. } => "end",
            StreamRecord::RawData { .. } => "raw data",
        }
    }

    fn payload(&self) -> Result<Vec<u8>, FormatError> {
        Ok(match self {
            StreamRecord::Begin(begin) => {
                let name_len = begin.name.len();
                if name_len == 0 || name_len > crate::VOLUME_NAME_BYTES_MAX {
                    return Err(FormatError::Invalid {
                        what: WHAT,
                        field: "snapshot name length",
                        value: name_len as u64,
                    });
                }
                let source_len = begin.source.len();
                if source_len > usize::from(u16::MAX) {
                    return Err(FormatError::Invalid {
                        what: WHAT,
                        field: "source name length",
                        value: source_len as u64,
                    });
                }
                let key = match &begin.raw {
                    Some(raw) => raw.key.encode()?,
                    None => Vec::new(),
                };
                let raw_len = if begin.raw.is_some() { RAW_BEGIN_BYTES + key.len() } else { 0 };
                let mut out = vec![0u8; BEGIN_FIXED_BYTES + name_len + source_len + raw_len];
                let mut w = Writer::new(&mut out);
                w.u64(0, STREAM_MAGIC);
                let version = if begin.raw.is_some() { RAW_STREAM_VERSION } else { STREAM_VERSION };
                w.u16(8, version as u16);
                w.u32(12, begin.block_bytes);
                w.u64(16, begin.size_bytes);
                w.u64(24, begin.guid);
                w.u64(32, begin.txg);
                w.u64(40, begin.creation_secs);
                w.u64(48, begin.from_guid.unwrap_or(0));
                w.u16(56, name_len as u16);
                w.u16(58, source_len as u16);
                let flags =
                    u8::from(begin.resume_block.is_some()) | (u8::from(begin.raw.is_some()) << 1);
                w.u8(60, flags);
                w.u64(64, begin.resume_block.unwrap_or(0));
                w.put(BEGIN_FIXED_BYTES, begin.name.as_bytes());
                w.put(BEGIN_FIXED_BYTES + name_len, begin.source.as_bytes());
                if let Some(raw) = &begin.raw {
                    let at = BEGIN_FIXED_BYTES + name_len + source_len;
                    w.put(at, &raw.root_mac);
                    w.u16(at + 32, key.len() as u16);
                    w.put(at + RAW_BEGIN_BYTES, &key);
                }
                out
            }
            StreamRecord::Data { block, lsize, compression, bytes } => {
                let mut out = vec![0u8; 16 + bytes.len()];
                let mut w = Writer::new(&mut out);
                w.u64(0, *block);
                w.u32(8, *lsize);
                w.u8(12, *compression as u8);
                w.put(16, bytes);
                out
            }
            StreamRecord::RawData { block, lsize, compression, salt, iv, mac, bytes } => {
                let mut out = vec![0u8; RAW_DATA_FIXED_BYTES + bytes.len()];
                let mut w = Writer::new(&mut out);
                w.u64(0, *block);
                w.u32(8, *lsize);
                w.u8(12, *compression as u8);
                w.u64(16, *salt);
                w.put(24, iv);
                w.put(40, mac);
                w.put(RAW_DATA_FIXED_BYTES, bytes);
                out
            }
            StreamRecord::Free { first, count } => {
                let mut out = vec![0u8; 16];
                let mut w = Writer::new(&mut out);
                w.u64(0, *first);
                w.u64(8, *count);
                out
            }
            StreamRecord::End { records, data_bytes } => {
                let mut out = vec![0u8; 16];
                let mut w = Writer::new(&mut out);
                w.u64(0, *records);
                w.u64(8, *data_bytes);
                out
            }
        })
    }

    /// The record as it travels, numbered `sequence`.
    pub fn encode(&self, sequence: u64) -> Result<Vec<u8>, FormatError> {
        let payload = self.payload()?;
        if payload.len() > STREAM_PAYLOAD_MAX {
            return Err(FormatError::TooLarge {
                what: WHAT,
                len: payload.len(),
                max: STREAM_PAYLOAD_MAX,
            });
        }
        let mut out = vec![0u8; HEADER_BYTES + payload.len() + CHECKSUM_BYTES];
        let sum_at = HEADER_BYTES + payload.len();
        {
            let mut w = Writer::new(&mut out);
            w.u32(0, RECORD_MAGIC);
            w.u8(4, self.kind());
            w.u64(8, sequence);
            w.u32(16, payload.len() as u32);
            w.put(HEADER_BYTES, &payload);
        }
        let sum = ChecksumAlg::Xxh3_128.compute(&out[..sum_at]);
        out[sum_at..].copy_from_slice(&sum.0);
        Ok(out)
    }

    fn decode(kind: u8, payload: &[u8]) -> Result<StreamRecord, StreamError> {
        let err = |source| StreamError::Record { record: 0, cause: source };
        let r = Reader::new(WHAT, payload, 0).map_err(err)?;
        let fixed = |need: usize| {
            if payload.len() < need {
                Err(err(FormatError::Truncated { what: WHAT, need, have: payload.len() }))
            } else {
                Ok(())
            }
        };
        Ok(match kind {
            1 => {
                fixed(BEGIN_FIXED_BYTES)?;
                let magic = r.u64(0).map_err(err)?;
                if magic != STREAM_MAGIC {
                    return Err(err(FormatError::BadMagic { what: "send stream", found: magic }));
                }
                let version = r.u16(8).map_err(err)?;
                if version > RAW_STREAM_VERSION as u16 {
                    return Err(StreamError::NewerVersion {
                        found: version,
                        newest: RAW_STREAM_VERSION as u16,
                    });
                }
                if version == 0 {
                    return Err(err(FormatError::UnsupportedVersion { what: WHAT, found: 0 }));
                }
                r.zeros(10, 2).map_err(err)?;
                r.zeros(61, 3).map_err(err)?;
                let flags = r.u8(60).map_err(err)?;
                // Raw came with version 2; no other bit is defined.
                let raw_allowed = version >= RAW_STREAM_VERSION as u16;
                if flags & !0b11 != 0 || (flags & 0b10 != 0 && !raw_allowed) {
                    return Err(err(FormatError::Invalid {
                        what: WHAT,
                        field: "begin flags",
                        value: u64::from(flags),
                    }));
                }
                let (resumed, raw) = (flags & 1 != 0, flags & 0b10 != 0);
                let name_len = usize::from(r.u16(56).map_err(err)?);
                let source_len = usize::from(r.u16(58).map_err(err)?);
                fixed(BEGIN_FIXED_BYTES + name_len + source_len)?;
                let text = |at: usize, len: usize, field: &'static str| {
                    let bytes = r.slice(at, len).map_err(err)?;
                    std::str::from_utf8(bytes).map(str::to_owned).map_err(|_| {
                        err(FormatError::Invalid { what: WHAT, field, value: len as u64 })
                    })
                };
                let name = text(BEGIN_FIXED_BYTES, name_len, "snapshot name")?;
                let source = text(BEGIN_FIXED_BYTES + name_len, source_len, "source name")?;
                let from = r.u64(48).map_err(err)?;
                let raw = if raw {
                    let at = BEGIN_FIXED_BYTES + name_len + source_len;
                    fixed(at + RAW_BEGIN_BYTES)?;
                    let mut root_mac = [0u8; 32];
                    root_mac.copy_from_slice(r.slice(at, 32).map_err(err)?);
                    let key_len = usize::from(r.u16(at + 32).map_err(err)?);
                    r.zeros(at + 34, 6).map_err(err)?;
                    fixed(at + RAW_BEGIN_BYTES + key_len)?;
                    let bytes = r.slice(at + RAW_BEGIN_BYTES, key_len).map_err(err)?;
                    let (key, used) = WrappedKey::decode(bytes).map_err(err)?;
                    if used != key_len {
                        return Err(err(FormatError::Invalid {
                            what: WHAT,
                            field: "wrapped key length",
                            value: key_len as u64,
                        }));
                    }
                    Some(Box::new(RawBegin { key, root_mac }))
                } else {
                    None
                };
                StreamRecord::Begin(StreamBegin {
                    block_bytes: r.u32(12).map_err(err)?,
                    size_bytes: r.u64(16).map_err(err)?,
                    guid: r.u64(24).map_err(err)?,
                    txg: r.u64(32).map_err(err)?,
                    creation_secs: r.u64(40).map_err(err)?,
                    from_guid: (from != 0).then_some(from),
                    name,
                    source,
                    resume_block: if resumed { Some(r.u64(64).map_err(err)?) } else { None },
                    raw,
                })
            }
            2 => {
                fixed(16)?;
                r.zeros(13, 3).map_err(err)?;
                let compression = compression_of(r.u8(12).map_err(err)?).map_err(err)?;
                StreamRecord::Data {
                    block: r.u64(0).map_err(err)?,
                    lsize: r.u32(8).map_err(err)?,
                    compression,
                    bytes: payload[16..].to_vec(),
                }
            }
            5 => {
                fixed(RAW_DATA_FIXED_BYTES)?;
                r.zeros(13, 3).map_err(err)?;
                r.zeros(36, 4).map_err(err)?;
                let mut iv = [0u8; 12];
                iv.copy_from_slice(r.slice(24, 12).map_err(err)?);
                StreamRecord::RawData {
                    block: r.u64(0).map_err(err)?,
                    lsize: r.u32(8).map_err(err)?,
                    compression: compression_of(r.u8(12).map_err(err)?).map_err(err)?,
                    salt: r.u64(16).map_err(err)?,
                    iv,
                    mac: r.bytes16(40).map_err(err)?,
                    bytes: payload[RAW_DATA_FIXED_BYTES..].to_vec(),
                }
            }
            3 => {
                fixed(16)?;
                StreamRecord::Free { first: r.u64(0).map_err(err)?, count: r.u64(8).map_err(err)? }
            }
            4 => {
                fixed(16)?;
                StreamRecord::End {
                    records: r.u64(0).map_err(err)?,
                    data_bytes: r.u64(8).map_err(err)?,
                }
            }
            value => {
                return Err(err(FormatError::Invalid {
                    what: WHAT,
                    field: "kind",
                    value: u64::from(value),
                }))
            }
        })
    }
}

/// A data record's compression byte.
fn compression_of(value: u8) -> Result<BlockCompression, FormatError> {
    match value {
        0 => Ok(BlockCompression::None),
        1 => Ok(BlockCompression::Lz4),
        2 => Ok(BlockCompression::Zstd),
        value => Err(FormatError::Invalid {
            what: WHAT,
            field: "data compression",
            value: u64::from(value),
        }),
    }
}

/// Writes records in order, numbering them.
#[derive(Debug)]
pub struct StreamWriter<W: Write> {
    out: W,
    sequence: u64,
    data_bytes: u64,
}

impl<W: Write> StreamWriter<W> {
    pub fn new(out: W) -> Self {
        StreamWriter { out, sequence: 0, data_bytes: 0 }
    }

    /// Writes one record (the begin record first; the end record is written by `finish`).
    pub fn write(&mut self, record: &StreamRecord) -> Result<(), StreamError> {
        let bytes = record
            .encode(self.sequence)
            .map_err(|source| StreamError::Record { record: self.sequence, cause: source })?;
        self.data_bytes += record.data_len();
        self.out.write_all(&bytes)?;
        self.sequence += 1;
        Ok(())
    }

    /// Writes the end record and flushes; returns the records written before it and the data
    /// bytes they carried.
    pub fn finish(mut self) -> Result<(u64, u64), StreamError> {
        let (records, data_bytes) = (self.sequence, self.data_bytes);
        self.write(&StreamRecord::End { records, data_bytes })?;
        self.out.flush()?;
        Ok((records, data_bytes))
    }
}

/// Reads and checks records in order: the begin record first, the end record last.
#[derive(Debug)]
pub struct StreamReader<R: Read> {
    input: R,
    sequence: u64,
    data_bytes: u64,
    ended: bool,
}

impl<R: Read> StreamReader<R> {
    pub fn new(input: R) -> Self {
        StreamReader { input, sequence: 0, data_bytes: 0, ended: false }
    }

    /// Records read so far.
    pub fn records(&self) -> u64 {
        self.sequence
    }

    /// The input, positioned after the last record read.
    pub fn into_inner(self) -> R {
        self.input
    }

    /// The next record; `None` after the end record (which is checked against what came
    /// before it).
    pub fn next_record(&mut self) -> Result<Option<StreamRecord>, StreamError> {
        if self.ended {
            return Ok(None);
        }
        let record = self.sequence;
        let at = |source| StreamError::Record { record, cause: source };
        let mut header = [0u8; HEADER_BYTES];
        if !read_full(&mut self.input, &mut header)? {
            return Err(StreamError::Truncated { last: record.saturating_sub(1) });
        }
        let r = Reader::new(WHAT, &header, HEADER_BYTES).map_err(at)?;
        let magic = r.u32(0).map_err(at)?;
        if magic != RECORD_MAGIC {
            return Err(at(FormatError::BadMagic { what: WHAT, found: u64::from(magic) }));
        }
        r.zeros(5, 3).map_err(at)?;
        r.zeros(20, 4).map_err(at)?;
        let kind = r.u8(4).map_err(at)?;
        let found = r.u64(8).map_err(at)?;
        let len = r.u32(16).map_err(at)? as usize;
        if len > STREAM_PAYLOAD_MAX {
            return Err(at(FormatError::TooLarge { what: WHAT, len, max: STREAM_PAYLOAD_MAX }));
        }
        let mut rest = vec![0u8; len + CHECKSUM_BYTES];
        if !read_full(&mut self.input, &mut rest)? {
            return Err(StreamError::Truncated { last: record.saturating_sub(1) });
        }
        let mut whole = header.to_vec();
        whole.extend_from_slice(&rest[..len]);
        if ChecksumAlg::Xxh3_128.compute(&whole).0[..] != rest[len..] {
            return Err(at(FormatError::ChecksumMismatch { what: WHAT }));
        }
        if found != record {
            return Err(StreamError::OutOfOrder { expected: record, found });
        }
        let decoded = StreamRecord::decode(kind, &rest[..len]).map_err(|e| match e {
            StreamError::Record { cause: source, .. } => {
                StreamError::Record { record, cause: source }
            }
            other => other,
        })?;
        let first = record == 0;
        let wanted = if first { "begin" } else { "data, raw data, free or end" };
        if first != matches!(decoded, StreamRecord::Begin(_)) {
            return Err(StreamError::Unexpected { record, kind: decoded.kind_name(), wanted });
        }
        self.data_bytes += decoded.data_len();
        if let StreamRecord::End { records, data_bytes } = &decoded {
            if (*records, *data_bytes) != (record, self.data_bytes) {
                return Err(at(FormatError::Invalid {
                    what: WHAT,
                    field: "end record counts (records or bytes went missing)",
                    value: *records,
                }));
            }
            self.ended = true;
        }
        self.sequence += 1;
        Ok(Some(decoded))
    }
}

/// Fills `buf`; `false` if the input ended first (at any point: a record cut in two is as
/// truncated as a missing one).
fn read_full<R: Read>(input: &mut R, buf: &mut [u8]) -> Result<bool, std::io::Error> {
    let mut got = 0;
    while got < buf.len() {
        match input.read(&mut buf[got..]) {
            Ok(0) => return Ok(false),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Where an interrupted receive can resume (ZFS: `receive_resume_token`), as the text
/// `sluice vol list` shows and `sluice send -t` takes: `1-` and the hex of to_guid u64,
/// from_guid u64 (0: full), next_block u64, source_len u16, source (UTF-8), then the first 8
/// bytes of the XXH3-128 of all that, so a token pasted wrong is refused, not misread.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResumeToken {
    pub to_guid: u64,
    pub from_guid: Option<u64>,
    /// The first block the resumed stream sends.
    pub next_block: u64,
    /// The sender's POOL/VOL.
    pub source: String,
}

/// Why a resume token could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenError {
    #[error(
        "resume token is not one sluice wrote (it starts with `1-`, then hex digits): copy it \
         whole from `sluice vol list -o name,resume` on the receiving pool"
    )]
    Malformed,
    #[error("resume token is damaged (its checksum does not match): copy it again, whole")]
    Damaged,
}

impl ResumeToken {
    const PREFIX: &'static str = "1-";

    /// The token as text.
    pub fn encode(&self) -> String {
        let mut bytes = Vec::with_capacity(26 + self.source.len() + 8);
        bytes.extend_from_slice(&self.to_guid.to_le_bytes());
        bytes.extend_from_slice(&self.from_guid.unwrap_or(0).to_le_bytes());
        bytes.extend_from_slice(&self.next_block.to_le_bytes());
        // Source names are volume names (at most 255 bytes) after a pool name.
        bytes.extend_from_slice(
            &(self.source.len().min(usize::from(u16::MAX)) as u16).to_le_bytes(),
        );
        bytes.extend_from_slice(self.source.as_bytes());
        let sum = ChecksumAlg::Xxh3_128.compute(&bytes);
        bytes.extend_from_slice(&sum.0[..8]);
        let mut text = String::with_capacity(Self::PREFIX.len() + bytes.len() * 2);
        text.push_str(Self::PREFIX);
        for byte in bytes {
            text.push_str(&format!("{byte:02x}"));
        }
        text
    }

    /// Reads a token written by [`ResumeToken::encode`].
    pub fn decode(text: &str) -> Result<ResumeToken, TokenError> {
        let hex = text.trim().strip_prefix(Self::PREFIX).ok_or(TokenError::Malformed)?;
        if hex.len() % 2 != 0 || !hex.is_ascii() {
            return Err(TokenError::Malformed);
        }
        let bytes = (0..hex.len() / 2)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16))
            .collect::<Result<Vec<u8>, _>>()
            .map_err(|_| TokenError::Malformed)?;
        if bytes.len() < 26 + 8 {
            return Err(TokenError::Malformed);
        }
        let (body, sum) = bytes.split_at(bytes.len() - 8);
        if ChecksumAlg::Xxh3_128.compute(body).0[..8] != *sum {
            return Err(TokenError::Damaged);
        }
        let u64_at = |at: usize| {
            let mut raw = [0u8; 8];
            raw.copy_from_slice(&body[at..at + 8]);
            u64::from_le_bytes(raw)
        };
        let source_len = usize::from(u16::from_le_bytes([body[24], body[25]]));
        if body.len() != 26 + source_len {
            return Err(TokenError::Malformed);
        }
        let source =
            std::str::from_utf8(&body[26..]).map_err(|_| TokenError::Malformed)?.to_owned();
        let to_guid = u64_at(0);
        if to_guid == 0 {
            return Err(TokenError::Malformed);
        }
        let from = u64_at(8);
        Ok(ResumeToken {
            to_guid,
            from_guid: (from != 0).then_some(from),
            next_block: u64_at(16),
            source,
        })
    }
}
